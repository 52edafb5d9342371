//! Restarts give the old engine's memory back: the default model (Gemma 3 270M, ~1.3 GB
//! resident in f32) restarted in-process several times must not grow the process. Before the
//! fix, each restart kept the old model's pages (MLX's buffer cache and the old MLX thread's
//! malloc arena): +250 MB per restart. Its own binary, so no other test shares the process.

mod common;

use std::time::{Duration, Instant};

use common::*;
use perch_engine::config::Settings;
use perch_engine::decode::DraftSetting;
use perch_engine::supervisor::{Phase, Supervisor};
use serde_json::json;

#[cfg(target_os = "linux")]
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    kb / 1024.0
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_engine_does_not_grow_memory() {
    let Some(gguf) = gemma_gguf() else { return };
    let tmp = tempfile::tempdir().unwrap();
    import_gemma(&gguf, tmp.path(), perch_engine::gguf::import::StoreDtype::F32);
    let config = tmp.path().join("perch.toml");
    let mut settings = Settings {
        models_dir: tmp.path().display().to_string(),
        default_model: "gemma-3-270m".into(),
        port: 0,
        warmup_profile: perch_engine::runtime::WarmupProfile::Off,
        draft: perch_engine::decode::DraftSetting::None,
        scan_hf_cache: false,
        ..Settings::default()
    };
    settings.save(&config).unwrap();
    let sup = Supervisor::start(&config, None).await.unwrap();
    let wait = |sup: &Supervisor, restarts: u64| {
        let st = sup.status();
        st.phase == Phase::Running && st.restarts == restarts
    };
    let t = Instant::now();
    while !wait(&sup, 0) {
        assert!(t.elapsed() < Duration::from_secs(120));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = sup.url();
    let chat = json!({"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4});
    assert_eq!(post(&url, "/v1/chat/completions", chat.clone()).await.0, 200);
    let start = rss_mb();
    let mut after = vec![];
    for i in 1..=4u64 {
        settings.draft = if i % 2 == 1 { DraftSetting::Lookup } else { DraftSetting::None };
        assert!(sup.save(settings.clone()).await.unwrap(), "a draft change restarts");
        assert!(wait(&sup, i), "{:?}", sup.status());
        assert_eq!(post(&url, "/v1/chat/completions", chat.clone()).await.0, 200);
        after.push(rss_mb());
    }
    println!("RSS after start: {start:.0} MB; after each of 4 restarts: {after:.0?} MB");
    let growth = after.last().unwrap() - start;
    assert!(
        growth < 150.0,
        "the process grew {growth:.0} MB over 4 restarts ({start:.0} → {after:.0?} MB)"
    );
    sup.shutdown().await;
}
