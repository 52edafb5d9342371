//! The official `anthropic` Python client, unchanged, against `perch serve`'s engine on the
//! default instruct model (Qwen2.5-Coder-0.5B-Instruct imported from its real GGUF): plain and
//! streamed messages, count_tokens, stop sequences, a tool loop, tool_choice, structured
//! output and errors, with requests naming a Claude model (tests/api/anthropic_client.py).
//! Needs `.deps/venv` (scripts/setup-peers) and the Qwen GGUF (scripts/fetch-qwen-gguf);
//! skipped without them except under CI.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use perch_engine::gguf::import::{import, ImportOptions, Quantize, StoreDtype};
use perch_engine::server::ServeConfig;

const ID: &str = "qwen2.5-coder-0.5b-instruct";

fn python() -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install anthropic (scripts/setup-peers)"
        );
        eprintln!("SKIPPED: the anthropic client is not installed in .deps/venv");
        return None;
    }
    Some(python)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_client_works_unchanged() {
    let (Some(python), Some(gguf)) = (python(), qwen_gguf()) else { return };
    let models = tempfile::tempdir().unwrap();
    let dir = models.path().to_path_buf();
    let opts = ImportOptions {
        name: Some(ID.into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: true,
    };
    tokio::task::spawn_blocking(move || import(&gguf, &dir, &opts).unwrap()).await.unwrap();
    let config = ServeConfig { api_key: Some("test-key".into()), ..ServeConfig::default() };
    let s = serve(engine_config(models.path(), ID), config).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/api/anthropic_client.py");
    let args = vec![script.display().to_string(), s.url(), ID.to_string(), "test-key".to_string()];
    let started = std::time::Instant::now();
    let out =
        tokio::task::spawn_blocking(move || Command::new(python).args(args).output().unwrap())
            .await
            .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}\n({:.0} s)", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "the anthropic client script failed:\n{text}");
    s.shutdown().await;
}
