//! The `perch` binary, run as a user would.

mod common;

use std::process::Command;

use common::*;

fn perch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_perch"));
    c.env("PERCH_DTYPE", "f32");
    c
}

#[test]
fn run_prints_the_greedy_continuation_mlx_lm_produced() {
    for name in ["llama", "qwen2", "qwen3-4bit"] {
        let g = golden(name);
        let model = load_fixture(name);
        let out = perch()
            .args(["run", "--raw", "--max-tokens", &g.greedy_tokens.len().to_string(), "--model"])
            .arg(fixture_dir(name))
            .arg("The quick brown fox jumps over the lazy dog, and then it rests in the sun.")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let eos = g
            .greedy_tokens
            .iter()
            .position(|t| model.tokenizer.is_eos(*t))
            .unwrap_or(g.greedy_tokens.len());
        let expected = model.tokenizer.decode(&g.greedy_tokens[..eos]).unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{expected}\n"), "{name}");
    }
}

#[test]
fn models_lists_what_is_installed() {
    let (tmp, _dst) = copy_fixture("qwen3", "tiny-qwen3");
    let out =
        perch().args(["models", "--json"]).env("PERCH_MODELS_DIR", tmp.path()).output().unwrap();
    assert!(out.status.success());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["id"], "tiny-qwen3");
    assert_eq!(list[0]["architecture"], "qwen3");

    // And `run` finds it by id, through the chat template.
    let out = perch()
        .args(["run", "--model", "tiny-qwen3", "--max-tokens", "4", "hello"])
        .env("PERCH_MODELS_DIR", tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn unknown_model_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = perch()
        .args(["run", "--model", "no-such-model", "hi"])
        .env("PERCH_MODELS_DIR", tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model `no-such-model` not found") && err.contains("--model PATH"),
        "{err}"
    );
}

#[test]
fn bench_reports_every_figure() {
    let out = perch()
        .args(["bench", "--json", "--decode-tokens", "16", "--model"])
        .arg(fixture_dir("qwen2"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "prefill_128_tok_s",
        "prefill_1024_tok_s",
        "decode_tok_s",
        "ttft_128_s",
        "peak_rss_bytes",
        "peak_mlx_memory_bytes",
    ] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} missing or zero in {r}");
    }
}

#[test]
fn serve_refuses_an_origin_that_is_not_one() {
    // `null` is every sandboxed frame's and file: page's origin: allowing it allows them all.
    for bad in ["null", "localhost:3000", "http://a/b"] {
        // A model that is not there: should the origin pass, the command still ends.
        let args = ["serve", "--model", "/no/such/model", "--allow-origin", bad];
        let out = perch().args(args).output().unwrap();
        assert!(!out.status.success(), "`--allow-origin {bad}` was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is not an origin"), "{bad}: {err}");
    }
}

/// A `perch serve` over the models in `models`, answering on a port of its own.
struct Serving {
    child: std::process::Child,
    url: String,
}

impl Serving {
    fn start(models: &std::path::Path, model: &str) -> Serving {
        use std::io::{BufRead, BufReader};
        let mut child = perch()
            .arg("--models-dir")
            .arg(models)
            .args([
                "serve",
                "--model",
                model,
                "--port",
                "0",
                "--log-dir",
                "none",
                "--ladder",
                "off",
            ])
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
        std::thread::spawn(move || lines.for_each(drop));
        Serving { child, url }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_that_would_exhaust_memory_or_the_stack_fails_alone() {
    // minijinja's fuel counts steps, not bytes: forty doublings ask for a terabyte; a list
    // nested 100,000 deep overflows any stack when printed. Either, rendered in the server's
    // own process, aborts it.
    let hostile = [
        (
            "doubling",
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}\
             {% endfor %}{{ ns.s | length }}",
            "memory",
        ),
        (
            "nesting",
            "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% for j in range(100) %}\
             {% set ns.x = [ns.x] %}{% endfor %}{% endfor %}{{ ns.x }}",
            "stack",
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    install_fixture("qwen3", &tmp.path().join("good"));
    for (name, template, _) in hostile {
        let dir = tmp.path().join(name);
        install_fixture("qwen3", &dir);
        let cfg = dir.join("tokenizer_config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v["chat_template"] = serde_json::json!(template);
        std::fs::write(&cfg, v.to_string()).unwrap();
    }
    let server = Serving::start(tmp.path(), "good");
    let http = reqwest::Client::new();
    let chat = |model: &str| {
        let body = serde_json::json!({
            "model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        });
        http.post(format!("{}/v1/chat/completions", server.url)).json(&body).send()
    };
    for (name, _, bound) in hostile {
        let started = std::time::Instant::now();
        let r = chat(name).await.unwrap();
        let status = r.status().as_u16();
        let e: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, 500, "{name}: {e}");
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("chat template") && msg.contains(bound), "{name}: {msg}");
        assert!(started.elapsed().as_secs() < 60, "{name} took {:?}", started.elapsed());
        // The server is still there and still renders a template that behaves.
        let r = chat("good").await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "after {name}: {}", r.text().await.unwrap());
    }
}
