//! Model directories in the Hugging Face / MLX layout, and the architectures Perch runs.
//!
//! One file per architecture; `layers` holds the pieces they share.

pub mod bert;
pub mod encoder;
pub mod gated_delta;
pub mod gemma3_text;
pub mod host_attention;
mod host_decode_attention;
pub mod host_delta;
pub mod host_gelu;
pub mod host_matrix;
pub mod host_step;
pub mod kv_cache;
pub mod layers;
pub mod linear;
pub mod llama;
pub mod lora;
pub mod mtp;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod recurrent_state;
pub mod remote;
pub mod weights;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::model::kv_cache::KvCache;
use crate::model::lora::{Lora, ProjectionDims};
use crate::platform::ComputeDtype;
use crate::tokenizer::Tokenizer;
use linear::QuantSpec;
use weights::Weights;

pub const SUPPORTED_ARCHITECTURES: &str = "llama, qwen2, qwen3, qwen3_5, gemma3_text";

/// The two kinds of model Perch serves: decoders that chat (and complete), and sentence
/// encoders that embed (`encoder`). A request of one kind to a model of the other is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelKind {
    Chat,
    Embedding(encoder::EncoderSpec),
}

impl ModelKind {
    /// What the model lists as, everywhere models are listed.
    pub fn name(&self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Embedding(_) => "embedding",
        }
    }
}

/// A decoder-only language model.
pub trait Architecture: Send {
    /// `tokens`: [B, L] int32 → final hidden states [B, L, hidden] (after the last norm, as
    /// the output head and an MTP head read them); appends to `caches` (one per layer).
    /// `lora` adds an adapter to the projections it targets.
    fn hidden_with(
        &self,
        tokens: &Array,
        caches: &mut [KvCache],
        lora: Option<&Lora>,
    ) -> Result<Array> {
        let l = tokens.shape()[1];
        self.hidden_rows(tokens, &mut [caches], &[l], lora)
    }
    /// A batched step: `tokens` [1, T] int32, sequence i owning the next `lens[i]` of them
    /// and its own caches `seqs[i]` (one per layer), each at its own position → hidden
    /// states [1, T, hidden]. The projections read each weight once for all T rows.
    fn hidden_rows(
        &self,
        tokens: &Array,
        seqs: &mut [&mut [KvCache]],
        lens: &[i32],
        lora: Option<&Lora>,
    ) -> Result<Array>;
    fn hidden(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.hidden_with(tokens, caches, None)
    }
    /// The output head: hidden states [B, L, hidden] → logits [B, L, vocab].
    fn logits(&self, hidden: &Array) -> Result<Array>;
    /// The output head through MLX operations only (never the host-side copy), so autodiff
    /// sees it: training's loss goes through here.
    fn graph_logits(&self, hidden: &Array) -> Result<Array>;
    /// Widths of each layer's projections (what a LoRA adapter must fit).
    fn projection_dims(&self) -> ProjectionDims;
    /// Token embeddings as the first layer sees them.
    fn embed(&self, tokens: &Array) -> Result<Array>;
    /// `tokens`: [B, L] int32 → logits [B, L, vocab].
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.logits(&self.hidden(tokens, caches)?)
    }
    fn num_layers(&self) -> usize;
    fn new_caches(&self) -> Vec<KvCache> {
        (0..self.num_layers()).map(|_| KvCache::new()).collect()
    }
}

/// `config.json`, kept raw so each architecture reads its own keys, with typed accessors that
/// name the file when a key is missing or mistyped.
pub struct ModelConfig {
    pub file: PathBuf,
    pub raw: Value,
    quant_default: Option<QuantSpec>,
    quant_overrides: HashMap<String, Option<QuantSpec>>,
}

impl ModelConfig {
    pub fn read(dir: &Path) -> Result<ModelConfig> {
        let file = dir.join("config.json");
        let text = std::fs::read_to_string(&file).map_err(EngineError::io(&file))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| EngineError::Config {
            file: file.clone(),
            msg: format!("not valid JSON: {e}"),
        })?;
        if !raw.is_object() {
            return Err(EngineError::Config { file, msg: "expected a JSON object".into() });
        }
        let raw = lift_text_config(raw);
        let mut cfg =
            ModelConfig { file, raw, quant_default: None, quant_overrides: HashMap::new() };
        cfg.read_quantization()?;
        Ok(cfg)
    }

    fn read_quantization(&mut self) -> Result<()> {
        let Some(q) =
            self.raw.get("quantization").or_else(|| self.raw.get("quantization_config")).cloned()
        else {
            return Ok(());
        };
        let spec = |v: &Value| -> Option<QuantSpec> {
            Some(QuantSpec {
                group_size: v.get("group_size")?.as_i64()? as i32,
                bits: v.get("bits")?.as_i64()? as i32,
            })
        };
        if let Some(mode) = q.get("mode").and_then(|m| m.as_str()) {
            if mode != "affine" {
                return Err(
                    self.err(format!("quantization mode `{mode}` is not supported (affine is)"))
                );
            }
        }
        self.quant_default = Some(
            spec(&q).ok_or_else(|| self.err("`quantization` needs group_size and bits".into()))?,
        );
        for (key, value) in q.as_object().into_iter().flatten() {
            if value.is_object() {
                self.quant_overrides.insert(key.clone(), spec(value));
            } else if value == &Value::Bool(false) {
                self.quant_overrides.insert(key.clone(), None);
            }
        }
        Ok(())
    }

    pub fn quant_for(&self, prefix: &str) -> Option<QuantSpec> {
        match self.quant_overrides.get(prefix) {
            Some(spec) => *spec,
            None => self.quant_default,
        }
    }

    pub fn err(&self, msg: String) -> EngineError {
        EngineError::Config { file: self.file.clone(), msg }
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.raw
            .get(key)
            .and_then(|v| v.as_str())
            .ok_or_else(|| self.err(format!("missing string `{key}`")))
    }

    pub fn int(&self, key: &str) -> Result<i32> {
        self.raw
            .get(key)
            .and_then(|v| v.as_i64())
            .map(|v| v as i32)
            .ok_or_else(|| self.err(format!("missing integer `{key}`")))
    }

    pub fn int_or(&self, key: &str, default: i32) -> Result<i32> {
        match self.raw.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.int(key),
        }
    }

    pub fn float_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.raw.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.err(format!("`{key}` must be a number"))),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> bool {
        self.raw.get(key).and_then(|v| v.as_bool()).unwrap_or(default)
    }

    /// Token ids listed under `key` (an integer or a list of integers).
    pub fn token_ids(&self, key: &str) -> Vec<u32> {
        match self.raw.get(key) {
            Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(Value::Array(list)) => {
                list.iter().filter_map(|v| v.as_u64()).map(|n| n as u32).collect()
            }
            _ => vec![],
        }
    }
}

/// A multimodal checkpoint's config keeps the language model's keys under `text_config`:
/// those the top level lacks are read as its own (its `model_type` and quantization stay).
fn lift_text_config(mut raw: Value) -> Value {
    let Some(Value::Object(text)) = raw.get("text_config").cloned() else { return raw };
    if let Some(top) = raw.as_object_mut() {
        for (key, value) in text {
            top.entry(key).or_insert(value);
        }
    }
    raw
}

/// A model ready to generate: weights, tokenizer and what the rest of the engine needs to know.
pub struct LoadedModel {
    pub id: String,
    pub dir: PathBuf,
    pub architecture: String,
    pub net: Box<dyn Architecture>,
    /// The multi-token prediction head, when the weights carry one (a draft model for
    /// speculative decoding).
    pub mtp: Option<mtp::MtpHead>,
    pub tokenizer: std::sync::Arc<Tokenizer>,
    pub vocab_size: usize,
    pub context_length: usize,
    pub compute_dtype: Dtype,
    /// The LoRA adapter the current generation applies (set per request by its task on the
    /// MLX thread, `None` for the base model).
    pub adapter: Option<Lora>,
    /// Host copies this load recovered from f32 weights and read from the store (CPU backend;
    /// `model/host_matrix/store.rs`).
    pub host_copies: HostCopyCounts,
}

/// How a load came by its host copies.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostCopyCounts {
    pub recovered: usize,
    pub reused: usize,
}

impl LoadedModel {
    /// `net.forward` with the current adapter.
    pub fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.net.logits(&self.hidden(tokens, caches)?)
    }

    /// The logits of the last position only, [B, 1, vocab]: the head is not run over the
    /// others (on the CPU backend a host head computes what it is asked for at once).
    pub fn last_logits(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        let h = self.hidden(tokens, caches)?;
        self.net.logits(&h.index((.., -1.., ..)))
    }

    /// `net.hidden` with the current adapter.
    pub fn hidden(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.net.hidden_with(tokens, caches, self.adapter.as_ref())
    }
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("id", &self.id)
            .field("architecture", &self.architecture)
            .finish()
    }
}

/// Find a model by installed id (a directory name under `models_dir`) or by path.
pub fn resolve(spec: &str, models_dir: &Path) -> Result<PathBuf> {
    let as_path = PathBuf::from(spec);
    if as_path.join("config.json").exists() {
        return Ok(as_path);
    }
    let installed = models_dir.join(spec);
    if installed.join("config.json").exists() {
        return Ok(installed);
    }
    Err(EngineError::ModelNotFound(spec.to_string()))
}

/// Load a model directory: config, weights (checked against the architecture) and tokenizer,
/// computing in the platform's dtype.
pub fn load_model(dir: &Path) -> Result<LoadedModel> {
    load_model_as(dir, ComputeDtype::Auto)
}

/// Which part of a model this process holds (pipeline sharding, `crate::shard`).
#[derive(Clone)]
pub enum ModelPart {
    Whole,
    /// Embeddings, the layers before `remote.first()`, the final norm, the head and any MTP
    /// head; `remote` runs the other layers.
    Ends(std::sync::Arc<dyn layers::RemoteLayers>),
}

impl ModelPart {
    /// Names this part in the host-copy store, so each part keeps a file of its own.
    fn store_tag(&self) -> Option<String> {
        match self {
            ModelPart::Whole => None,
            ModelPart::Ends(r) => Some(format!("ends {} +{}", r.first(), r.count())),
        }
    }
}

/// The shape of a Llama-family stack (`None` for the architectures shaped otherwise).
pub fn stack_shape(cfg: &ModelConfig, architecture: &str) -> Result<Option<layers::StackShape>> {
    Ok(match architecture {
        "llama" => Some(llama::shape(cfg)?),
        "qwen2" => Some(qwen2::shape(cfg)?),
        "qwen3" => Some(qwen3::shape(cfg)?),
        _ => None,
    })
}

/// `load_model`, computing in `dtype`.
pub fn load_model_as(dir: &Path, dtype: ComputeDtype) -> Result<LoadedModel> {
    load_model_part(dir, dtype, &ModelPart::Whole)
}

/// `load_model_as`, holding only `part` of the model.
pub fn load_model_part(dir: &Path, dtype: ComputeDtype, part: &ModelPart) -> Result<LoadedModel> {
    let (model, recovered_and_saved) = load_once(dir, dtype, part)?;
    if !recovered_and_saved {
        return Ok(model);
    }
    // Recovering host copies read (and so holds) the f32 weights they came from, which the
    // copies make unnecessary; a second load reads the copies from the file just written and
    // leaves the f32 weights unread (MLX loads lazily), so this process does not keep both.
    tracing::info!(model = %model.id, "host copies recovered and saved; loading again from them");
    let counts = model.host_copies;
    drop(model);
    // Hand the freed f32 buffers back to the system now, not at the allocators' leisure.
    let _ = mlx_rs::memory::clear_cache();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
    let (again, _) = load_once(dir, dtype, part)?;
    Ok(LoadedModel { host_copies: counts, ..again })
}

/// One load; also says whether it recovered host copies and wrote them to disk.
fn load_once(dir: &Path, dtype: ComputeDtype, part: &ModelPart) -> Result<(LoadedModel, bool)> {
    let cfg = ModelConfig::read(dir)?;
    let architecture = cfg.str("model_type")?.to_string();
    // The tokenizer first: parsing a large tokenizer.json (Gemma's 262k vocabulary) briefly
    // takes more memory than it keeps, and that peak should not sit on top of the weights.
    let tokenizer = std::sync::Arc::new(Tokenizer::load(dir, &cfg.token_ids("eos_token_id"))?);
    let mut weights = Weights::load_part(dir, dtype, part.store_tag())?;
    let stack_shape = stack_shape(&cfg, &architecture)?;
    if let (ModelPart::Ends(_), None) = (part, &stack_shape) {
        return Err(EngineError::InvalidRequest(format!(
            "a `{architecture}` model runs in one process: sharding runs llama, qwen2 and qwen3"
        )));
    }
    let remote = match part {
        ModelPart::Whole => None,
        ModelPart::Ends(r) => Some(r.clone()),
    };
    let (net, mtp): (Box<dyn Architecture>, Option<mtp::MtpHead>) =
        match (architecture.as_str(), &stack_shape) {
            (_, Some(shape)) => {
                let stack = layers::DecoderStack::load_ends(&cfg, &mut weights, shape, remote)?;
                (Box::new(stack), mtp::MtpHead::load(&cfg, &mut weights, shape)?)
            }
            ("gemma3_text", None) => (Box::new(gemma3_text::load(&cfg, &mut weights)?), None),
            ("qwen3_5", None) => {
                let (net, mtp) = qwen3_5::load(&cfg, &mut weights)?;
                (Box::new(net), mtp)
            }
            (other, None) if encoder::is_encoder(other) => {
                return Err(EngineError::InvalidRequest(format!(
                    "`{other}` is an encoder: an embedding model, served by /v1/embeddings and \
                     /api/embed, never as a chat model"
                )))
            }
            (other, None) => {
                return Err(EngineError::UnknownArchitecture(
                    other.to_string(),
                    SUPPORTED_ARCHITECTURES,
                ))
            }
        };
    let leftover = weights.leftover();
    if !leftover.is_empty() {
        return Err(EngineError::BadWeights {
            file: weights.file_of(&leftover[0]),
            msg: format!(
                "{} tensor(s) not used by the `{architecture}` architecture, e.g. `{}`",
                leftover.len(),
                leftover[0]
            ),
        });
    }
    let compute_dtype = weights.compute_dtype();
    let (recovered, reused, saved) = weights.save_host_copies();
    let id = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
    let model = LoadedModel {
        id,
        dir: dir.to_path_buf(),
        architecture,
        vocab_size: cfg.int("vocab_size")? as usize,
        context_length: cfg.int_or("max_position_embeddings", 4096)? as usize,
        compute_dtype,
        net,
        mtp,
        tokenizer,
        adapter: None,
        host_copies: HostCopyCounts { recovered, reused },
    };
    Ok((model, recovered > 0 && saved))
}
