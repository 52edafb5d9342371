//! Perch's chat template rendering (minijinja) against Python's jinja2 rendered the way
//! Hugging Face transformers renders (scripts/render_templates.py), over llama.cpp's 70 real
//! templates (`.deps/chat-templates`, unpacked from the llama-cpp-python sdist by
//! scripts/setup-peers) and a corpus of conversations (tests/chat-corpus/corpus.json: plain,
//! system, multi-turn, non-ASCII, tools, tool results, parallel calls, template kwargs).
//! Agreement is byte-identical text, or both refusing the conversation. Prints every
//! difference; fails if agreement drops below what was measured.

use std::path::PathBuf;
use std::process::Command;

mod common;

use perch_engine::chat::{ChatOptions, ChatTemplate};
use serde_json::Value;

/// Pairs (template, conversation) that agree, of 560: 505 byte-identical and 28 refused by
/// both. Both sides render a turn that only calls tools with content None and, where a
/// template fails on that, again with "" (as Perch and llama.cpp do): 18 pairs of tool
/// conversations (Qwen3, QwQ, gpt-oss, Granite 3.3, Phi-3.5, Devstral, Ministral, DeepSeek R1
/// Distill…) that both refused before, and 2 (LFM2.5) that only jinja2 refused, render
/// identically since. The 27 that differ, each named:
/// - 18 render here where jinja2 raises: templates that iterate `tools` without checking it
///   (None without tools: Hermes 2 Pro and 3, Command R+; 15), or `tojson` a generator
///   (llama.cpp's DeepSeek R1; 3): minijinja iterates none as empty and serializes the
///   sequence.
/// - 6 print a tool dict with `{{ tool }}` (Apriel): jinja2 writes Python's repr
///   (`{'type': …}`), minijinja JSON. Unsupported: Python's repr.
/// - 3 (functionary v3.1) concatenate `"…"|safe + text`: markupsafe HTML-escapes the text
///   (`&#34;`); minijinja has no Markup type and writes the text as is.
const AGREEING_AT_LEAST: usize = 533;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn templates_render_as_jinja2_renders_them() {
    let templates = root().join(".deps/chat-templates");
    let python = root().join(".deps/venv/bin/python");
    if !templates.join(".complete").exists() || !python.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must unpack the chat templates and install the venv (scripts/setup-peers)"
        );
        eprintln!("SKIPPED: .deps/chat-templates or .deps/venv missing (run scripts/setup-peers)");
        return;
    }
    let corpus_path = root().join("tests/chat-corpus/corpus.json");
    let out = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new(&python)
        .arg(root().join("scripts/render_templates.py"))
        .args([&templates, &corpus_path, &out.path().to_path_buf()])
        .status()
        .unwrap();
    assert!(status.success(), "the jinja2 reference failed");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path()).unwrap()).unwrap();
    let corpus: Value =
        serde_json::from_str(&std::fs::read_to_string(&corpus_path).unwrap()).unwrap();
    let (bos, eos) = (corpus["bos_token"].as_str().unwrap(), corpus["eos_token"].as_str().unwrap());

    let (mut same, mut both_refuse, mut differ) = (0, 0, Vec::new());
    for (file, convs) in reference.as_object().unwrap() {
        let source = std::fs::read_to_string(templates.join(file)).unwrap();
        let template = ChatTemplate { source, bos_token: bos.into(), eos_token: eos.into() };
        for (name, conv) in corpus["conversations"].as_object().unwrap() {
            let options = ChatOptions {
                tools: conv["tools"].as_array().cloned().unwrap_or_default(),
                kwargs: conv["kwargs"].as_object().cloned().unwrap_or_default(),
            };
            let ours = template.render(&common::chat_messages(&conv["messages"]), true, &options);
            let theirs = convs.get(name).or_else(|| convs.get("__compile__")).unwrap();
            match (&ours, theirs.get("text").and_then(Value::as_str)) {
                (Ok(a), Some(b)) if a == b => same += 1,
                (Err(_), None) => both_refuse += 1,
                (Ok(a), Some(b)) => {
                    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
                    let show = |s: &str| {
                        let from = s.floor_char_boundary(at.saturating_sub(20));
                        let to = s.ceil_char_boundary((at + 40).min(s.len()));
                        format!("{:?}", &s[from..to])
                    };
                    differ.push(format!(
                        "{file} / {name}: from byte {at}: ours {} jinja2 {}",
                        show(a),
                        show(b)
                    ));
                }
                (Ok(_), None) => differ.push(format!(
                    "{file} / {name}: ours renders, jinja2 refuses ({})",
                    theirs["error"].as_str().unwrap_or("")
                )),
                (Err(e), Some(_)) => {
                    differ.push(format!("{file} / {name}: ours refuses ({e}), jinja2 renders"))
                }
            }
        }
    }
    for d in &differ {
        println!("DIFF {d}");
    }
    let total = same + both_refuse + differ.len();
    println!(
        "templates vs jinja2: {same} of {total} pairs byte-identical, {both_refuse} refused by both, {} differ",
        differ.len()
    );
    assert!(
        same + both_refuse >= AGREEING_AT_LEAST,
        "agreement fell to {} of {total} (was at least {AGREEING_AT_LEAST})",
        same + both_refuse
    );
}
