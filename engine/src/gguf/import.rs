//! `perch import`: a GGUF file becomes a model directory in the MLX layout (config.json,
//! safetensors, tokenizer files, provenance), written to a temporary directory and renamed
//! into place, so a failed or interrupted import leaves nothing half-written.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};
use serde_json::{json, Value};

use super::{tokenizer, type_name, GgufFile};
use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantize {
    /// Dequantized, stored in `StoreDtype`.
    None,
    /// MLX affine quantization, group size 64.
    Bits(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreDtype {
    Bf16,
    F32,
}

pub struct ImportOptions {
    pub name: Option<String>,
    pub quantize: Quantize,
    pub dtype: StoreDtype,
    /// Replace an existing model of the same name.
    pub overwrite: bool,
}

/// Import `gguf_path` into `models_dir`; returns the new model directory.
pub fn import(gguf_path: &Path, models_dir: &Path, opts: &ImportOptions) -> Result<PathBuf> {
    let g = GgufFile::open(gguf_path)?;
    let arch = g.architecture()?.to_string();
    let name = opts.name.clone().unwrap_or_else(|| default_name(gguf_path));
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(EngineError::InvalidRequest(format!("`{name}` is not a usable model name")));
    }
    let target = models_dir.join(&name);
    if target.exists() && !opts.overwrite {
        return Err(EngineError::InvalidRequest(format!(
            "{} already exists (use --overwrite)",
            target.display()
        )));
    }
    std::fs::create_dir_all(models_dir).map_err(EngineError::io(models_dir))?;
    // A hidden sibling of its own (two imports of one name never share it), so the rename is
    // atomic and `perch models` never lists it; removed on every path, a panic included.
    remove_stale_temp_dirs(models_dir);
    let tmp = TempDir::new(models_dir, &name)?;
    write_model(&g, &arch, &tmp.0, opts)?;
    crate::catalog::mark_installed(&tmp.0).map_err(EngineError::io(&tmp.0))?;
    // Another import of this name may finish meanwhile: replace it only when asked to (a
    // rename never replaces a folder that has files, so a lost race is seen, not clobbered).
    let exists = || {
        EngineError::InvalidRequest(format!(
            "{} already exists (use --overwrite)",
            target.display()
        ))
    };
    // Concurrent imports of one name race here; each lost round is retried, a bounded number
    // of times.
    const ROUNDS: usize = 32;
    for attempt in 0..ROUNDS {
        let last = attempt + 1 == ROUNDS;
        if target.exists() {
            if !opts.overwrite {
                return Err(exists());
            }
            match std::fs::remove_dir_all(&target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Another import renamed its folder in while this one removed the old one
                // ("Directory not empty"; what was removed was the old folder, by its
                // handle): go round again.
                Err(_) if !last => continue,
                Err(e) => return Err(EngineError::io(&target)(e)),
            }
        }
        match std::fs::rename(&tmp.0, &target) {
            Ok(()) => return Ok(target),
            // The target was filled meanwhile (it may be gone again by now): go round again;
            // the next round sees what is there.
            Err(_) if !last => continue,
            Err(e) => return Err(EngineError::io(&target)(e)),
        }
    }
    Err(exists())
}

/// Temp folders of imports whose process is gone (killed, or the machine lost power): their
/// names carry the importing process's id.
fn remove_stale_temp_dirs(models_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(models_dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".import-") else { continue };
        // `.import-{name}-{pid}-{n}`: the pid is the second field from the end.
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !crate::platform::process_alive(p)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A unique hidden folder beside the target, removed when dropped unless renamed away.
struct TempDir(PathBuf);

impl TempDir {
    fn new(models_dir: &Path, name: &str) -> Result<TempDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = models_dir.join(format!(".import-{name}-{}-{n}", std::process::id()));
        // `create_dir` (not `_all`) fails on a folder that is already there: never shared.
        std::fs::create_dir(&dir).map_err(EngineError::io(&dir))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn default_name(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_lowercase()
        .replace(['_', ' '], "-")
}

fn write_model(g: &GgufFile, arch: &str, dir: &Path, opts: &ImportOptions) -> Result<()> {
    let tok = tokenizer::convert(g)?;
    let vocab =
        g.metadata.get("tokenizer.ggml.tokens").and_then(|t| t.as_array()).map_or(0, |t| t.len());
    let mut config = translate_config(g, arch, vocab)?;
    // The tokenizer first, then dropped: a 262k-token vocabulary is hundreds of MB as JSON
    // values, memory the tensors need more.
    write_json(&dir.join("tokenizer.json"), &tok.tokenizer_json)?;
    let mut tc = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token, "eos_token": tok.eos_token, "add_bos_token": tok.add_bos_token,
        "model_max_length": config["max_position_embeddings"],
    });
    if let Some(t) = &tok.chat_template {
        tc["chat_template"] = json!(t);
    }
    write_json(&dir.join("tokenizer_config.json"), &tc)?;
    drop(tok);

    let heads = config["num_attention_heads"].as_i64().unwrap_or(1) as usize;
    let kv_heads = config["num_key_value_heads"].as_i64().unwrap_or(heads as i64) as usize;
    let store = match opts.dtype {
        StoreDtype::Bf16 => Dtype::Bfloat16,
        StoreDtype::F32 => Dtype::Float32,
    };
    // Tensor by tensor: each is dequantized, converted and evaluated before the next is read,
    // and shards are written as they fill, so the peak is about one f32 tensor plus one shard
    // (not the whole model in f32, which a 7B import could not afford).
    let mut shards = ShardWriter::new(dir);
    for info in &g.tensors {
        let Some(hf) = hf_name(arch, &info.name) else {
            if info.name.starts_with("rope_freqs") {
                continue; // derived from the config
            }
            return Err(EngineError::BadWeights {
                file: g.path.clone(),
                msg: format!(
                    "tensor `{}` ({}) has no place in the `{arch}` layout",
                    info.name,
                    type_name(info.ggml_type)
                ),
            });
        };
        let mut data = g.read_f32(info)?;
        if arch == "gemma3" && hf.ends_with("norm.weight") {
            // llama.cpp stores Gemma's (1 + w) norms with the 1 folded in.
            data.iter_mut().for_each(|x| *x -= 1.0);
        }
        if arch == "llama" && (hf.ends_with("q_proj.weight") || hf.ends_with("k_proj.weight")) {
            let n = if hf.ends_with("q_proj.weight") { heads } else { kv_heads };
            if info.shape[0] % (2 * n) != 0 {
                return Err(EngineError::BadWeights {
                    file: g.path.clone(),
                    msg: format!(
                        "tensor `{}` has {} rows, not a whole number of {n} heads' rotary pairs",
                        info.name, info.shape[0]
                    ),
                });
            }
            data = unpermute_rows(&data, &info.shape, n);
        }
        let shape: Vec<i32> = info.shape.iter().map(|&d| d as i32).collect();
        let a = Array::from_slice(&data, &shape);
        drop(data);
        let quantizable = hf.ends_with(".weight") && a.ndim() == 2 && a.shape()[1] % 64 == 0;
        match opts.quantize {
            Quantize::Bits(bits) if quantizable => {
                let (w, scales, biases) = mlx_rs::ops::quantize(&a, 64, bits)?;
                let base = hf.trim_end_matches(".weight");
                shards.add(format!("{base}.scales"), scales.as_dtype(store)?)?;
                shards.add(format!("{base}.biases"), biases.as_dtype(store)?)?;
                shards.add(hf, w)?;
            }
            // A cast to the dtype it has would still allocate a copy.
            _ if a.dtype() == store => shards.add(hf, a)?,
            _ => shards.add(hf, a.as_dtype(store)?)?,
        }
    }
    shards.finish()?;
    if let Quantize::Bits(bits) = opts.quantize {
        config["quantization"] = json!({"group_size": 64, "bits": bits, "mode": "affine"});
    }
    config["torch_dtype"] = json!(if store == Dtype::Bfloat16 { "bfloat16" } else { "float32" });

    let eos_ids = config["eos_token_id"].clone();
    write_json(&dir.join("config.json"), &config)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"eos_token_id": eos_ids, "bos_token_id": config["bos_token_id"]}),
    )?;

    write_json(
        &dir.join("perch-import.json"),
        &json!({
            "source_file": g.path.file_name().and_then(|n| n.to_str()),
            "source_sha256": sha256_file(&g.path)?,
            "gguf_version": g.version,
            "architecture": arch,
            "quantize": match opts.quantize { Quantize::None => json!("none"), Quantize::Bits(b) => json!(b) },
            "dtype": config["torch_dtype"],
            "perch_version": env!("CARGO_PKG_VERSION"),
        }),
    )
}

/// Writes evaluated tensors into `model-NNNNN.safetensors` files of about `SHARD_BYTES` each,
/// plus the `model.safetensors.index.json` that maps every tensor to its file.
struct ShardWriter<'a> {
    dir: &'a Path,
    pending: Vec<(String, Array)>,
    pending_bytes: usize,
    weight_map: serde_json::Map<String, Value>,
    shards: usize,
    total_bytes: u64,
}

/// Small enough that a shard beside one f32 tensor stays well under the model's size; large
/// enough that a 7B model is a few dozen files.
const SHARD_BYTES: usize = 512 << 20;

impl<'a> ShardWriter<'a> {
    fn new(dir: &'a Path) -> Self {
        ShardWriter {
            dir,
            pending: Vec::new(),
            pending_bytes: 0,
            weight_map: Default::default(),
            shards: 0,
            total_bytes: 0,
        }
    }

    fn add(&mut self, name: String, a: Array) -> Result<()> {
        // Evaluate now, so the array holds its stored bytes and not a graph that keeps the
        // f32 source alive until the shard is saved.
        a.eval()?;
        self.pending_bytes += a.nbytes();
        self.total_bytes += a.nbytes() as u64;
        self.pending.push((name, a));
        if self.pending_bytes >= SHARD_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.shards += 1;
        let file = format!("model-{:05}.safetensors", self.shards);
        let path = self.dir.join(&file);
        let meta = HashMap::from([("format".to_string(), "mlx".to_string())]);
        Array::save_safetensors(self.pending.iter().map(|(k, v)| (k.as_str(), v)), &meta, &path)
            .map_err(|e| EngineError::BadWeights { file: path.clone(), msg: e.to_string() })?;
        for (name, _) in self.pending.drain(..) {
            self.weight_map.insert(name, json!(file));
        }
        self.pending_bytes = 0;
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.flush()?;
        write_json(
            &self.dir.join("model.safetensors.index.json"),
            &json!({"metadata": {"format": "mlx", "total_size": self.total_bytes}, "weight_map": self.weight_map}),
        )
    }
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).expect("JSON values serialize");
    std::fs::write(path, text).map_err(EngineError::io(path))
}

fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path).map_err(EngineError::io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(EngineError::io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// llama.cpp's converter interleaves the two rotary halves of each head's q/k rows; undo it.
fn unpermute_rows(data: &[f32], shape: &[usize], heads: usize) -> Vec<f32> {
    let (rows, cols) = (shape[0], shape.get(1).copied().unwrap_or(1));
    let half = rows / heads / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                // GGUF row (h, i, j) holds HF row (h, j, i).
                let src = (h * half + i) * 2 + j;
                let dst = (h * 2 + j) * half + i;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn hf_name(arch: &str, gguf: &str) -> Option<String> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (part, kind) = tail.rsplit_once('.')?;
    let gemma = arch == "gemma3";
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "post_attention_norm" if gemma => "post_attention_layernorm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_ffw_norm" if gemma => "post_feedforward_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// config.json in the Hugging Face layout mlx-lm loads, from the GGUF metadata.
fn translate_config(g: &GgufFile, arch: &str, vocab: usize) -> Result<Value> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| {
        g.u64(&key(k)).ok_or_else(|| EngineError::BadWeights {
            file: g.path.clone(),
            msg: format!("GGUF metadata lacks `{}`", key(k)),
        })
    };
    // Zero or mismatched sizes would divide by zero here or in the weight reshapes.
    let bad = |k: &str, msg: String| EngineError::BadWeights {
        file: g.path.clone(),
        msg: format!("GGUF metadata `{}` {msg}", key(k)),
    };
    let positive = |k: &str, v: u64| if v == 0 { Err(bad(k, "is 0".into())) } else { Ok(v) };
    let hidden = positive("embedding_length", need("embedding_length")?)?;
    let heads = positive("attention.head_count", need("attention.head_count")?)?;
    let kv_heads = positive(
        "attention.head_count_kv",
        g.u64(&key("attention.head_count_kv")).unwrap_or(heads),
    )?;
    if heads % kv_heads != 0 {
        return Err(bad(
            "attention.head_count_kv",
            format!("({kv_heads}) does not divide the head count ({heads})"),
        ));
    }
    let head_dim = positive(
        "attention.key_length",
        g.u64(&key("attention.key_length")).unwrap_or(hidden / heads),
    )?;
    let layers = positive("block_count", need("block_count")?)?;
    let ctx = g.u64(&key("context_length")).unwrap_or(4096);
    let eps = g.f64(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6);
    let rope_base = g.f64(&key("rope.freq_base"));
    let tokens = g.metadata.get("tokenizer.ggml.tokens").and_then(|t| t.as_array());
    let token_id = |t: &str| tokens.and_then(|ts| ts.iter().position(|x| x.as_str() == Some(t)));
    let bos = g.u64("tokenizer.ggml.bos_token_id");
    let mut eos: Vec<u64> = g.u64("tokenizer.ggml.eos_token_id").into_iter().collect();
    let mut cfg = json!({
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "rms_norm_eps": eps,
        "vocab_size": vocab, "max_position_embeddings": ctx,
        "intermediate_size": need("feed_forward_length")?, "bos_token_id": bos,
    });
    let has_output = g.tensors.iter().any(|t| t.name == "output.weight");
    match arch {
        "gemma3" => {
            let window = g.u64(&key("attention.sliding_window")).unwrap_or(512);
            // Gemma 3 text models put a global layer after every five sliding ones.
            let pattern = 6;
            let layer_types: Vec<&str> = (0..layers)
                .map(
                    |i| if (i + 1) % pattern == 0 { "full_attention" } else { "sliding_attention" },
                )
                .collect();
            if let Some(id) = token_id("<end_of_turn>") {
                eos.push(id as u64);
            }
            cfg.as_object_mut().unwrap().extend(json!({
                "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
                "rope_theta": rope_base.unwrap_or(1_000_000.0), "rope_local_base_freq": 10_000.0,
                "sliding_window": window, "sliding_window_pattern": pattern, "layer_types": layer_types,
                "query_pre_attn_scalar": head_dim, "hidden_activation": "gelu_pytorch_tanh",
                "tie_word_embeddings": true, "rope_scaling": null,
            }).as_object().unwrap().clone());
        }
        "llama" | "qwen2" | "qwen3" => {
            let default_base = if arch == "llama" { 10_000.0 } else { 1_000_000.0 };
            let model_type = arch;
            cfg.as_object_mut().unwrap().extend(
                json!({
                    "model_type": model_type,
                    "rope_theta": rope_base.unwrap_or(default_base),
                    "tie_word_embeddings": !has_output,
                })
                .as_object()
                .unwrap()
                .clone(),
            );
            if arch == "llama" {
                if let Some(scale) = g.f64(&key("rope.scaling.factor")) {
                    cfg["rope_scaling"] = json!({"rope_type": "linear", "factor": scale});
                }
            }
        }
        other => {
            return Err(EngineError::UnknownArchitecture(
                other.to_string(),
                "gemma3, llama, qwen2, qwen3 (GGUF import)",
            ))
        }
    }
    cfg["eos_token_id"] = json!(eos);
    Ok(cfg)
}
