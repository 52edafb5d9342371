//! Perch against mlx-lm, run live on the same fixture directories: logits within 1e-3
//! relative (f32) and 32 identical greedy tokens, for every architecture and weight format;
//! chat templates rendered identically (minijinja vs transformers' jinja2).
//!
//! Needs mlx-lm: `$PERCH_PEER_PYTHON`, else `.deps/venv/bin/python` (scripts/setup-peers).
//! Skipped with a notice when absent, except under CI, where it must run.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use perch_engine::chat::ChatMessage;
use perch_engine::{generate, GenerateParams};

const PEER: &str = r#"
import json, sys
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model, load_tokenizer
from pathlib import Path
req = json.loads(sys.stdin.read())
out = {}
for name, path in req["models"].items():
    model, _ = load_model(Path(path))
    model.set_dtype(mx.float32)
    ids = req["prompt_ids"][name]
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    toks = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=32, sampler=lambda x: mx.argmax(x, axis=-1))]
    entry = {"logits": logits.reshape(-1).tolist(), "greedy": toks}
    tok = load_tokenizer(Path(path))
    if getattr(tok, "chat_template", None):
        entry["chat"] = tok.apply_chat_template(req["messages"], tokenize=False, add_generation_prompt=True)
    out[name] = entry
print(json.dumps(out))
"#;

fn peer_python() -> Option<PathBuf> {
    let candidate = std::env::var_os("PERCH_PEER_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/venv/bin/python")
    });
    let ok = Command::new(&candidate)
        .args(["-c", "import mlx_lm"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(candidate)
}

#[test]
fn perch_matches_mlx_lm_live() {
    let Some(python) = peer_python() else {
        assert!(std::env::var_os("CI").is_none(), "CI must install mlx-lm (scripts/setup-peers)");
        eprintln!("SKIPPED: mlx-lm not installed (run scripts/setup-peers)");
        return;
    };
    let messages = vec![
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Name a bird."),
    ];
    // mlx-lm does not load MTP weights; that fixture's goldens come from its training script.
    let fixtures: Vec<&str> = FIXTURES.iter().copied().filter(|n| *n != MTP_FIXTURE).collect();
    let goldens: Vec<_> = fixtures.iter().map(|n| (n, golden(n))).collect();
    let req = serde_json::json!({
        "models": fixtures.iter().map(|n| (n.to_string(), fixture_dir(n))).collect::<std::collections::BTreeMap<_, _>>(),
        "prompt_ids": goldens.iter().map(|(n, g)| (n.to_string(), g.prompt_ids.clone())).collect::<std::collections::BTreeMap<_, _>>(),
        "messages": messages,
    });
    let mut child = Command::new(python)
        .args(["-c", PEER])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(req.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "mlx-lm failed");
    let peer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    for (name, g) in &goldens {
        let p = &peer[**name];
        let model = load_fixture(name);
        let theirs: Vec<f32> =
            p["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let err = relative_error(&forward_logits(&model, &g.prompt_ids), &theirs);
        println!("{name}: relative logit error vs live mlx-lm {err:.2e}");
        assert!(err <= 1e-3, "{name}: {err:.2e}");
        let their_tokens: Vec<u32> =
            p["greedy"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let params = GenerateParams { max_tokens: 32, ignore_eos: true, ..Default::default() };
        let ours = generate(&model, &g.prompt_ids, &params, None, |_| {}).unwrap().tokens;
        assert_eq!(ours, their_tokens, "{name}: greedy tokens differ from live mlx-lm");
        if let Some(chat) = p.get("chat").and_then(|c| c.as_str()) {
            assert_eq!(
                model.tokenizer.apply_chat_template(&messages, true).unwrap(),
                chat,
                "{name}: chat template"
            );
        }
    }
}
