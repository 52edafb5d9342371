//! The UI in a real browser: the engine serves `ui/` from a settings file with fixture models,
//! and `tests/ui/browser.mjs` drives Debian's chromium through playwright-core (chat,
//! streaming, stop, reload, settings restart, invalid settings, models page). Screenshots go
//! to `target/test-artifacts/ui/`. Needs `scripts/setup-ui` (run by `scripts/test`).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use perch_engine::supervisor::{Phase, Supervisor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ui_chats_stops_remembers_and_restarts_the_engine_in_chromium() {
    std::env::set_var("PERCH_DTYPE", "f32");
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let (_t, dir) = copy_fixture(MTP_FIXTURE, "chat");
    std::fs::rename(&dir, models.join("chat")).or_else(|_| {
        // Across filesystems: copy instead.
        std::fs::create_dir(models.join("chat"))?;
        for f in std::fs::read_dir(&dir)? {
            let f = f?.path();
            std::fs::copy(&f, models.join("chat").join(f.file_name().unwrap()))?;
        }
        std::io::Result::Ok(())
    }).unwrap();
    let config = tmp.path().join("perch.toml");
    std::fs::write(
        &config,
        format!("models_dir = \"{}\"\ndefault_model = \"chat\"\nport = 0\nwarmup_profile = \"off\"\nload_warmup = false\nscan_hf_cache = false\ndraft = \"none\"\n", models.display()),
    )
    .unwrap();
    let sup = Supervisor::start(&config, None).await.unwrap();
    sup.watch().unwrap();
    let t = Instant::now();
    while sup.status().phase != Phase::Running {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", sup.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let artifacts = root().join("target/test-artifacts/ui");
    let url = sup.url();
    let script = root().join("tests/ui/browser.mjs");
    let out = tokio::task::spawn_blocking(move || Command::new("node").arg(script).arg(url).arg(&config).arg(&artifacts).output()).await.unwrap().expect("node (scripts/setup-ui installs it)");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser checks failed (screenshot: target/test-artifacts/ui/failure.png)");
    sup.shutdown().await;
}
