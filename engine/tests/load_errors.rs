//! A broken model directory gets an error that names the file and, where it applies, the
//! tensor; nothing panics.

mod common;

use std::path::Path;

use common::*;
use perch_engine::load_model;

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&p, cfg.to_string()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match load_model(dir) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_architecture() {
    let (_t, dir) = copy_fixture("llama", "llama");
    edit_config(&dir, |c| c["model_type"] = "mamba9".into());
    let e = load_err(&dir);
    assert!(
        e.contains("unsupported architecture `mamba9`")
            && e.contains("llama, qwen2, qwen3, qwen3_5, gemma3_text"),
        "{e}"
    );
}

#[test]
fn hybrid_variants_not_run_are_refused_by_name() {
    let (_t, dir) = copy_fixture(HYBRID_FIXTURE, "hybrid");
    edit_config(&dir, |c| c["num_experts"] = 8.into());
    let e = load_err(&dir);
    assert!(e.contains("mixture-of-experts") && e.contains("qwen3_5"), "{e}");
    let (_t, dir) = copy_fixture(HYBRID_FIXTURE, "hybrid");
    edit_config(&dir, |c| c["linear_num_value_heads"] = 3.into());
    let e = load_err(&dir);
    assert!(e.contains("value heads (3) a multiple of key heads (2)"), "{e}");
}

#[test]
fn missing_files() {
    let (_t, dir) = copy_fixture("llama", "llama");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("tokenizer.json") && e.contains("missing"), "{e}");

    let (_t, dir) = copy_fixture("llama", "llama");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("no model*.safetensors"), "{e}");

    let (_t, dir) = copy_fixture("llama", "llama");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn truncated_weights_name_file_and_tensor() {
    let (_t, dir) = copy_fixture("qwen2", "qwen2");
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("truncated") && e.contains("tensor `"),
        "{e}"
    );

    std::fs::write(&file, &bytes[..5]).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
}

#[test]
fn shape_mismatch_names_the_tensor() {
    let (_t, dir) = copy_fixture("qwen3", "qwen3");
    edit_config(&dir, |c| c["intermediate_size"] = 96.into());
    let e = load_err(&dir);
    assert!(
        e.contains("model.safetensors")
            && e.contains("mlp.gate_proj.weight")
            && e.contains("[128, 64]")
            && e.contains("[96, 64]"),
        "{e}"
    );
}

#[test]
fn missing_tensor_and_bad_config_values() {
    let (_t, dir) = copy_fixture("llama", "llama");
    edit_config(&dir, |c| c["num_hidden_layers"] = 3.into());
    let e = load_err(&dir);
    assert!(e.contains("model.layers.2.") && e.contains("missing"), "{e}");

    let (_t, dir) = copy_fixture("llama", "llama");
    edit_config(&dir, |c| c["hidden_size"] = "wide".into());
    let e = load_err(&dir);
    assert!(e.contains("config.json") && e.contains("hidden_size"), "{e}");

    let (_t, dir) = copy_fixture("llama", "llama");
    edit_config(&dir, |c| c["rope_scaling"] = serde_json::json!({"rope_type": "su-mystery"}));
    let e = load_err(&dir);
    assert!(e.contains("su-mystery"), "{e}");
}

#[test]
fn extra_tensors_are_reported() {
    // A qwen2 file (with q/k/v biases) labelled as llama: the biases are not llama's.
    let (_t, dir) = copy_fixture("qwen2", "qwen2");
    edit_config(&dir, |c| c["model_type"] = "llama".into());
    let e = load_err(&dir);
    assert!(e.contains("not used by the `llama` architecture") && e.contains("_proj.bias"), "{e}");
}

#[test]
fn quantized_weights_without_config_section() {
    let (_t, dir) = copy_fixture("qwen3-4bit", "qwen3-4bit");
    edit_config(&dir, |c| {
        c.as_object_mut().unwrap().remove("quantization");
    });
    let e = load_err(&dir);
    assert!(e.contains("quantized") && e.contains("quantization"), "{e}");
}
