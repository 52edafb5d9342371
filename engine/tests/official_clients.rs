//! The official `anthropic`, `ollama` and `openai` (its Responses API) Python clients,
//! unchanged, against Perch's engine on the default instruct model (Qwen2.5-Coder-0.5B-Instruct
//! imported from its real GGUF): plain and streamed answers, token counts, stop sequences,
//! tool calls and results, tool_choice, structured output, keep-alive unloading, stored
//! responses and errors (tests/api/*_client.py, tests/api/openai_responses.py; the Anthropic
//! one names a Claude model). Needs `.deps/venv` (scripts/setup-peers) and the Qwen GGUF
//! (scripts/fetch-qwen-gguf); skipped without them except under CI.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};

use common::*;
use perch_engine::gguf::import::{import, ImportOptions, Quantize, StoreDtype};
use perch_engine::server::ServeConfig;

const ID: &str = "qwen2.5-coder-0.5b-instruct";

fn python(client: &str) -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", &format!("import {client}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "CI must install {client} (scripts/setup-peers)");
        eprintln!("SKIPPED: the {client} client is not installed in .deps/venv");
        return None;
    }
    Some(python)
}

/// The Qwen GGUF imported once for the clients that run at the same time (each serves it
/// from its own engine); the folder goes when the last of them is done with it.
fn imported(gguf: PathBuf) -> Arc<tempfile::TempDir> {
    static SHARED: Mutex<Option<Weak<tempfile::TempDir>>> = Mutex::new(None);
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dir) = shared.as_ref().and_then(Weak::upgrade) {
        return dir;
    }
    let models = tempfile::tempdir().unwrap();
    let opts = ImportOptions {
        name: Some(ID.into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: true,
    };
    import(&gguf, models.path(), &opts).unwrap();
    let dir = Arc::new(models);
    *shared = Some(Arc::downgrade(&dir));
    dir
}

/// Serve the imported Qwen model (with `key` as the API key) and run `script` with the
/// server's URL, the model id and the key.
async fn run_client(client: &str, script: &str, key: Option<&str>) {
    let (Some(python), Some(gguf)) = (python(client), qwen_gguf()) else { return };
    let models = tokio::task::spawn_blocking(move || imported(gguf)).await.unwrap();
    let config = ServeConfig { api_key: key.map(String::from), ..ServeConfig::default() };
    let s = serve(engine_config(models.path(), ID), config).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/api").join(script);
    let mut args = vec![script.display().to_string(), s.url(), ID.to_string()];
    args.extend(key.map(String::from));
    let started = std::time::Instant::now();
    let out =
        tokio::task::spawn_blocking(move || Command::new(python).args(args).output().unwrap())
            .await
            .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}\n({:.0} s)", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "the {client} client script failed:\n{text}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_client_works_unchanged() {
    run_client("anthropic", "anthropic_client.py", Some("test-key")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_ollama_client_works_unchanged() {
    run_client("ollama", "ollama_client.py", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_speaks_responses_unchanged() {
    run_client("openai", "openai_responses.py", None).await;
}
