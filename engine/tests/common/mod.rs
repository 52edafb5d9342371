//! Helpers shared by the engine's integration tests: the fixture models and their goldens,
//! and (`serve`) the one way to run a server and speak HTTP to it.
#![allow(dead_code, unused_imports)]

pub mod batch;
pub mod hub;
pub mod peers;
pub mod serve;

pub use peers::*;
pub use serve::*;

use std::path::PathBuf;

use mlx_rs::Array;
use perch_engine::platform::ComputeDtype;
use perch_engine::{load_model_as, LoadedModel};

pub const FIXTURES: &[&str] = &[
    "llama",
    "qwen2",
    "qwen3",
    "llama-bf16",
    "qwen2-f16",
    "qwen3-4bit",
    "llama-8bit",
    "gemma3",
    MTP_FIXTURE,
    HYBRID_FIXTURE,
    "qwen3_5-4bit",
    "qwen3_5-8bit",
];

/// The Qwen3.5-style hybrid (gated DeltaNet and gated attention layers;
/// scripts/make-hybrid-fixture.py, goldens from mlx-lm's own class).
pub const HYBRID_FIXTURE: &str = "qwen3_5";

/// The trained fixture with an MTP head (scripts/make-mtp-fixture.py); its goldens come from
/// the training script, not mlx-lm, which does not load MTP weights.
pub const MTP_FIXTURE: &str = "qwen3-mtp";

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// Load a fixture computing in f32, as the goldens were computed (macOS would otherwise keep
/// the bf16/f16 fixtures in their file dtype).
pub fn load_fixture(name: &str) -> LoadedModel {
    load_model_as(&fixture_dir(name), ComputeDtype::F32)
        .unwrap_or_else(|e| panic!("loading fixture {name}: {e}"))
}

/// Copy fixture `name` into `dir` (created).
pub fn install_fixture(name: &str, dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
}

/// A copy of fixture `name` in a fresh temporary directory, as `<tmp>/<dir_name>`, for tests
/// that edit or break it.
pub fn copy_fixture(name: &str, dir_name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(dir_name);
    install_fixture(name, &dir);
    (tmp, dir)
}

pub struct Golden {
    pub prompt_ids: Vec<u32>,
    pub greedy_tokens: Vec<u32>,
    /// [L, V] logits of every prompt position, row-major.
    pub logits: Vec<f32>,
    pub vocab: usize,
}

pub fn golden(name: &str) -> Golden {
    let dir = fixture_dir(name);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let ids = |k: &str| {
        json[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>()
    };
    let arrays = Array::load_safetensors(dir.join("golden.safetensors")).unwrap();
    let logits = &arrays["logits"];
    let vocab = logits.shape()[1] as usize;
    Golden {
        prompt_ids: ids("prompt_ids"),
        greedy_tokens: ids("greedy_tokens"),
        logits: logits.as_slice::<f32>().to_vec(),
        vocab,
    }
}

/// Logits of every prompt position from one forward pass, as [L * V] f32.
pub fn forward_logits(model: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let mut caches = model.net.new_caches();
    let tokens = Array::from_slice(ids, &[1, ids.len() as i32]);
    let logits =
        model.net.forward(&tokens, &mut caches).unwrap().as_dtype(mlx_rs::Dtype::Float32).unwrap();
    logits.eval().unwrap();
    logits.as_slice::<f32>().to_vec()
}

/// max |a - b| / max |b|.
pub fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit counts differ");
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    // A NaN on either side is an infinite error (f32::max would skip it); equal infinities
    // are no error.
    let diff = |x: f32, y: f32| match x == y {
        true => 0.0,
        false if (x - y).is_nan() => f32::INFINITY,
        false => (x - y).abs(),
    };
    a.iter().zip(b).fold(0f32, |m, (&x, &y)| m.max(diff(x, y))) / scale
}

/// Where scripts/fetch-gemma-gguf puts the default model's GGUF (or `$PERCH_GEMMA_GGUF`).
pub fn gemma_gguf_path() -> PathBuf {
    std::env::var_os("PERCH_GEMMA_GGUF").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/gemma/gemma-3-270m-q4_k_m.gguf")
    })
}

/// The default model's GGUF, or `None` with a notice; CI must have it.
pub fn gemma_gguf() -> Option<PathBuf> {
    let gguf = gemma_gguf_path();
    if gguf.exists() {
        return Some(gguf);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must fetch the Gemma GGUF (scripts/fetch-gemma-gguf)"
    );
    eprintln!("SKIPPED: Gemma GGUF missing (run scripts/fetch-gemma-gguf)");
    None
}

/// Where scripts/fetch-qwen-gguf puts the default model's GGUF (or `$PERCH_QWEN_GGUF`), if it
/// is there; CI must have it.
pub fn qwen_gguf() -> Option<PathBuf> {
    let gguf = std::env::var_os("PERCH_QWEN_GGUF").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../.deps/qwen/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    });
    if gguf.exists() {
        return Some(gguf);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must fetch the Qwen GGUF (scripts/fetch-qwen-gguf)"
    );
    eprintln!("SKIPPED: Qwen GGUF missing (run scripts/fetch-qwen-gguf)");
    None
}

/// OpenAI-style messages as the API's parser hands them to a template: a null content (an
/// assistant turn that only calls tools) is the empty string.
pub fn chat_messages(v: &serde_json::Value) -> Vec<perch_engine::chat::ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if m["content"].is_null() {
                m["content"] = "".into();
            }
            serde_json::from_value(m).unwrap()
        })
        .collect()
}

/// The default model's GGUF imported dequantized into `dir` (f32 storage is what
/// `scripts/setup-default-model` installs on Linux), computing in f32.
pub fn import_gemma(
    gguf: &std::path::Path,
    dir: &std::path::Path,
    dtype: perch_engine::gguf::import::StoreDtype,
) -> LoadedModel {
    import_as(gguf, dir, "gemma-3-270m", dtype)
}

/// `gguf` imported dequantized into `dir` as `name`, then loaded computing in f32.
pub fn import_as(
    gguf: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    dtype: perch_engine::gguf::import::StoreDtype,
) -> LoadedModel {
    use perch_engine::gguf::import::{import, ImportOptions, Quantize};
    let opts =
        ImportOptions { name: Some(name.into()), quantize: Quantize::None, dtype, overwrite: true };
    load_model_as(&import(gguf, dir, &opts).unwrap(), ComputeDtype::F32).unwrap()
}

/// One place where Perch's greedy continuation left a reference continuation.
#[derive(Debug, Clone, Copy)]
pub struct Departure {
    /// Index into the reference continuation.
    pub at: usize,
    pub ours: u32,
    pub theirs: u32,
}

/// Perch's greedy continuation of `prompt`, compared with `reference` under teacher forcing:
/// wherever Perch picks another token, the departure is recorded and generation restarts from
/// `prompt + reference[..=at]`, so every later position is still compared on the reference's
/// own context. Exact agreement between two implementations is a property of the CPU only at
/// near-ties (a different summation order flips them); deciding which departures are near-ties
/// is the caller's, from the reference's or Perch's own logits.
pub fn greedy_departures(model: &LoadedModel, prompt: &[u32], reference: &[u32]) -> Vec<Departure> {
    use perch_engine::{generate, GenerateParams};
    let mut departures = Vec::new();
    let mut from = 0;
    while from < reference.len() {
        let mut context = prompt.to_vec();
        context.extend_from_slice(&reference[..from]);
        let p = GenerateParams {
            max_tokens: reference.len() - from,
            ignore_eos: true,
            ..Default::default()
        };
        let ours = generate(model, &context, &p, None, |_| {}).unwrap().tokens;
        match ours.iter().zip(&reference[from..]).position(|(a, b)| a != b) {
            None => break,
            Some(k) => {
                departures.push(Departure {
                    at: from + k,
                    ours: ours[k],
                    theirs: reference[from + k],
                });
                from += k + 1;
            }
        }
    }
    departures
}

/// A reference's top tokens at one step, best first, with their logits (or log-probabilities:
/// the gaps are the same).
pub type TopTokens = Vec<(u32, f64)>;

/// How far below its best the reference ranks `token`: `None` when it is outside the
/// reference's top list (then the gap is at least the list's spread, far from a near-tie).
pub fn reference_gap(top: &[(u32, f64)], token: u32) -> Option<f64> {
    let best = top.first()?.1;
    top.iter().find(|(t, _)| *t == token).map(|(_, l)| best - l)
}

/// Perch's own margin at the position after `context`: its logit for its greedy choice minus its
/// logit for `other` (0 when they are the same token).
pub fn own_gap(model: &LoadedModel, context: &[u32], other: u32) -> f32 {
    let logits = forward_logits(model, context);
    let vocab = logits.len() / context.len();
    let last = &logits[logits.len() - vocab..];
    let best = last.iter().fold(f32::MIN, |m, &x| m.max(x));
    best - last[other as usize]
}

/// Copy fixture `name` with every 2-D projection weight whose rows are whole 32-blocks snapped to
/// `lo + k * (hi - lo) / 255` per block.
pub fn rounded_fixture_copy(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let (tmp, dir) = copy_fixture(name, name);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let weights = path.file_name().is_some_and(|f| f.to_string_lossy().starts_with("model"));
        if !weights || path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let tensors = Array::load_safetensors(&path).unwrap();
        let mut rounded: std::collections::HashMap<String, Array> =
            std::collections::HashMap::new();
        let mut snapped = 0;
        for (key, a) in tensors {
            let shape = a.shape().to_vec();
            let eligible = key.ends_with("proj.weight")
                && shape.len() == 2
                && shape[1] % 32 == 0
                && a.dtype() == mlx_rs::Dtype::Float32;
            if !eligible {
                rounded.insert(key, a);
                continue;
            }
            let mut v = a.as_slice::<f32>().to_vec();
            for block in v.chunks_mut(32) {
                let lo = block.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let step = (hi - lo) / 255.0;
                for x in block.iter_mut() {
                    *x = lo + ((*x - lo) / step).round() * step;
                }
            }
            snapped += 1;
            rounded.insert(key, Array::from_slice(&v, &shape));
        }
        assert!(snapped > 0, "{name}: no projection to round in {}", path.display());
        // The untouched tensors are read lazily from the file being replaced: read them first.
        for a in rounded.values() {
            a.eval().unwrap();
        }
        let tmp_file = path.with_extension("tmp.safetensors");
        Array::save_safetensors(rounded, None, &tmp_file).unwrap();
        std::fs::rename(&tmp_file, &path).unwrap();
    }
    (tmp, dir)
}
