//! The UI in a real browser: the engine serves `ui/` from a settings file with fixture models,
//! and `tests/ui/browser.mjs` drives Debian's chromium through playwright-core (chat,
//! streaming, stop, reload, settings restart, invalid settings, models page, a Hugging Face
//! cache model, downloads from a loopback hub with progress and cancel; conversations kept by
//! the engine with versions, attachments, export and import); then `tests/ui/hostile.mjs`
//! opens a corpus of hostile answers and fails if anything runs, and `tests/ui/keyboard.mjs`
//! chats by keyboard alone and checks every control's accessible name. Screenshots go to
//! `target/test-artifacts/ui/`. Needs `scripts/setup-ui` (run by `scripts/test`).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use perch_engine::supervisor::{Phase, Supervisor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ui_chats_stops_remembers_and_restarts_the_engine_in_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    install_fixture(MTP_FIXTURE, &models.join("chat"));
    // A model whose template opens a `<think>` block for it: all it writes is reasoning.
    install_fixture("qwen3", &models.join("thinker"));
    let cfg = models.join("thinker/tokenizer_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n".into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    // A model with a real template that writes tool calls (Qwen 2.5's), for MCP tools: its
    // weights are random, so the calls the tests see are forced by `tool_choice`.
    install_fixture("qwen3", &models.join("tooler"));
    let cfg = models.join("tooler/tokenizer_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    let template = root().join(".deps/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    v["chat_template"] = std::fs::read_to_string(&template)
        .expect("scripts/setup-peers fetches the chat templates")
        .into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    // A Hugging Face cache holding one MLX model, offered in place.
    let cache = tmp.path().join("hf-hub");
    let repo = cache.join("models--perch-test--cached-qwen3");
    let snapshot = repo.join("snapshots/abc");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc").unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        let blob = repo.join("blobs").join(f);
        std::fs::copy(fixture_dir("qwen3").join(f), &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(f)).unwrap();
    }
    std::env::set_var("HF_HUB_CACHE", &cache);
    // The hub, on loopback and slowed down so a download can be cancelled from the page.
    let (hub, hub_url) = hub::hub().await;
    hub.slow_ms.store(25, std::sync::atomic::Ordering::Relaxed);
    // The chat's MCP tools: server-filesystem from npm (scripts/setup-ui installs it) on a
    // folder of its own, offering the one tool without arguments: the fixture's random
    // weights fill a string argument with one letter forever, so a forced call completes
    // only where there is none to fill.
    let mcp = tmp.path().join("mcp.json");
    let shared = tmp.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let fs_server = root().join("tests/ui/node_modules/.bin/mcp-server-filesystem");
    std::fs::write(
        &mcp,
        serde_json::json!({"mcpServers": {"files": {
            "command": fs_server.display().to_string(),
            "args": [shared.display().to_string()],
            "tools": ["list_allowed_directories"]}}})
        .to_string(),
    )
    .unwrap();
    let config = tmp.path().join("perch.toml");
    std::fs::write(
        &config,
        format!(
            "models_dir = \"{}\"\nconversations_dir = \"{}\"\nmcp_file = \"{}\"\ndefault_model = \"chat\"\nport = 0\nwarmup_profile = \"off\"\nload_warmup = false\nscan_hf_cache = true\ndraft = \"none\"\nhub_endpoint = \"{hub_url}\"\n",
            models.display(),
            tmp.path().join("conversations").display(),
            mcp.display()
        ),
    )
    .unwrap();
    let sup = Supervisor::start(&config, None).await.unwrap();
    sup.watch().unwrap();
    let t = Instant::now();
    while sup.status().phase != Phase::Running {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", sup.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let artifacts = root().join("target/test-artifacts/ui").display().to_string();
    let config = config.display().to_string();
    node(
        "browser.mjs",
        &[&sup.url(), &config, &artifacts],
        "the browser checks failed (screenshot: target/test-artifacts/ui/failure.png)",
    )
    .await;
    // Hostile model output, through the chat's own rendering (the page moved ports above).
    node("hostile.mjs", &[&sup.url(), &artifacts], "hostile output ran or froze the page (screenshot: target/test-artifacts/ui/hostile-failure.png)").await;
    // The keyboard alone, and the names a screen reader is given.
    node("keyboard.mjs", &[&sup.url(), &artifacts], "the keyboard or accessibility checks failed (screenshot: target/test-artifacts/ui/keyboard-failure.png)").await;
    sup.shutdown().await;
}

/// Run `tests/ui/<script>` with node, show its output, and fail with `why` if it fails.
async fn node(script: &str, args: &[&str], why: &str) {
    let script = root().join("tests/ui").join(script);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out =
        tokio::task::spawn_blocking(move || Command::new("node").arg(script).args(args).output())
            .await
            .unwrap()
            .expect("node (scripts/setup-ui installs it)");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{why}");
}
