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
