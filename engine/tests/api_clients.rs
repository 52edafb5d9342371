//! The API's real users against a real server on loopback: the official `openai` Python
//! client, a 16-client streaming load test, and schemathesis driven by `/openapi.json`.
//! Needs `.deps/venv` from scripts/setup-peers (openai, httpx, schemathesis); skipped without
//! it except under CI.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use perch_engine::runtime::EngineConfig;
use perch_engine::server::{ServeConfig, Server};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn venv() -> Option<PathBuf> {
    let python = root().join(".deps/venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import openai, httpx, schemathesis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the API clients (scripts/setup-peers)"
        );
        eprintln!("SKIPPED: openai / httpx / schemathesis not installed in .deps/venv (run scripts/setup-peers)");
        return None;
    }
    Some(python)
}

/// The fixture `qwen3` served with drafts on (prompt lookup for this model) by the solo
/// engine, one request at a time: the clients must not be able to tell.
async fn start(config: ServeConfig, max_queue: usize, cap: Option<usize>) -> Server {
    let engine = EngineConfig {
        draft: perch_engine::decode::DraftSetting::Auto,
        max_batch: 1,
        max_queue,
        max_tokens_cap: cap,
        ..engine_config(&fixtures_models(), "qwen3")
    };
    serve(engine, config).await
}

async fn run(program: PathBuf, args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let out =
            Command::new(&program).args(&args).current_dir(std::env::temp_dir()).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_works_unchanged() {
    let Some(python) = venv() else { return };
    let s = start(ServeConfig::default(), 8, None).await;
    let script = root().join("tests/api/openai_client.py").display().to_string();
    let (ok, out) = run(python, vec![script, format!("{}/v1", s.url()), "qwen3".into()]).await;
    println!("{out}");
    assert!(ok, "the openai client script failed:\n{out}");
    s.shutdown().await;
}

/// `perch serve` as its own process (so its memory is its own), on a free port.
struct ServeProcess {
    child: std::process::Child,
    url: String,
}

impl ServeProcess {
    fn start(args: &[&str]) -> ServeProcess {
        use std::io::{BufRead, BufReader};
        let models = fixture_dir("qwen3").parent().unwrap().to_path_buf();
        let mut child = Command::new(env!("CARGO_BIN_EXE_perch"))
            .arg("--models-dir")
            .arg(&models)
            .args([
                "serve",
                "--model",
                "qwen3",
                "--port",
                "0",
                "--log-dir",
                "none",
                "--ladder",
                "off",
            ])
            .args(args)
            .env("PERCH_DTYPE", "f32")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("perch serve exited before serving").unwrap();
            if let Some(at) = line.split(" at ").nth(1) {
                break at.trim().trim_end_matches("/v1").to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        ServeProcess { child, url }
    }

    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_streaming_clients_complete_or_get_429() {
    let Some(python) = venv() else { return };
    // A queue shorter than the client count, so the bound is exercised. The prefix cache is
    // off: it keeps earlier prompts' state on purpose (within its budget, tested in
    // prefix_cache.rs), and this test looks for memory that requests leave behind otherwise.
    let server = ServeProcess::start(&[
        "--max-queue",
        "6",
        "--draft",
        "auto",
        "--prefix-cache-mb",
        "0",
        "--prefix-cache-disk-mb",
        "0",
    ]);
    let url = format!("{}/v1", server.url);
    let script = root().join("tests/api/load_test.py").display().to_string();
    // Warm up with the same load, then take the idle figure.
    let (ok, out) = run(
        python.clone(),
        vec![script.clone(), url.clone(), "qwen3".into(), "16".into(), "1".into()],
    )
    .await;
    assert!(ok, "{out}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let idle = server.rss_bytes();
    let (ok, out) = run(python, vec![script, url, "qwen3".into(), "16".into(), "3".into()]).await;
    println!("{out}");
    assert!(ok, "load test failed:\n{out}");
    let counts: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert!(
        counts["completed"].as_u64().unwrap() > 0 && counts["busy"].as_u64().unwrap() > 0,
        "expected both completions and 429s: {counts}"
    );
    // Memory returns to its idle figure once the clients are gone.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let after = server.rss_bytes();
    let growth = after as f64 / idle as f64 - 1.0;
    println!(
        "server RSS idle {:.1} MB, after load {:.1} MB ({:+.1} %)",
        idle as f64 / 1e6,
        after as f64 / 1e6,
        growth * 100.0
    );
    assert!(idle > 0 && growth < 0.10, "memory grew {:.1} % over the load", growth * 100.0);
    let h: serde_json::Value =
        reqwest::get(format!("{}/health", server.url)).await.unwrap().json().await.unwrap();
    assert_eq!(
        (h["foreground_active"].as_u64(), h["foreground_queued"].as_u64()),
        (Some(0), Some(0)),
        "{h}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_errors_and_no_schema_violations() {
    let Some(python) = venv() else { return };
    let s = start(ServeConfig::default(), 8, Some(16)).await;
    let schemathesis = python.with_file_name("schemathesis");
    let args = [
        "run",
        &format!("{}/openapi.json", s.url()),
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance",
        "--max-examples",
        "30",
        "--seed",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--continue-on-failure",
    ];
    let (ok, out) = run(schemathesis, args.iter().map(|a| a.to_string()).collect()).await;
    let summary: Vec<&str> = out
        .lines()
        .filter(|l| {
            l.contains("generated")
                || l.contains("passed")
                || l.contains("failed")
                || l.contains("error")
        })
        .collect();
    println!("{}", summary.join("\n"));
    assert!(ok, "schemathesis reported problems:\n{out}");
    s.shutdown().await;
}
