//! Qwen3.5 (text): a hybrid of gated DeltaNet linear-attention layers (`gated_delta`) and
//! gated full-attention layers (every `full_attention_interval`-th, or as `layer_types`
//! says): queries carry an output gate (q_proj is twice as wide, the second half gating the
//! attention's output through a sigmoid), q/k RMS norms, RoPE on the first
//! `partial_rotary_factor` of each head; dense SwiGLU MLPs. Reads the Hugging Face layout
//! (`model.language_model.*`, norms stored as offsets from 1, conv [C, 1, K]) and mlx-lm's
//! (`language_model.model.*`, norms whole, conv [C, K, 1]). The native MTP head (`mtp.*`,
//! a gated-attention block) drafts for speculative decoding; the vision tower is dropped at
//! load, with a log line.

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde_json::Value;

use super::gated_delta::{DeltaShape, GatedDeltaNet};
use super::layers::{layer_caches, Mlp, Projections, RmsNorm, Rope};
use super::linear::{Embedding, Linear};
use super::mtp::{MtpBlock, MtpHead};
use super::weights::Weights;
use super::{Architecture, ModelConfig};
use crate::error::{EngineError, Result};
use crate::model::kv_cache::{AttentionMask, KvCache};
use crate::model::lora::{Lora, ProjectionDims};

/// Attention with an output gate and partial rotary embeddings.
struct GatedAttention {
    qkv: Projections,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
}

impl GatedAttention {
    fn forward_rows(&self, x: &Array, caches: &mut [&mut KvCache], lens: &[i32]) -> Result<Array> {
        let mut parts = self.qkv.forward(x)?.into_iter();
        let mut next = || parts.next().ok_or_else(|| EngineError::Internal("projection".into()));
        let (q, k, v) = (next()?, next()?, next()?);
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let (h, d) = (self.heads, self.head_dim);
        // Per head: the query, then its gate.
        let q = q.reshape(&[b, l, h, 2 * d])?;
        let gate = q.index((.., .., .., d..)).reshape(&[b, l, h * d])?;
        let q = q.index((.., .., .., ..d));
        let out = match caches {
            [cache] => self.attend(&q, &k, &v, cache)?,
            _ => {
                let mut outs = Vec::with_capacity(caches.len());
                let mut s = 0;
                for (cache, &n) in caches.iter_mut().zip(lens) {
                    let rows = |a: &Array| a.index((.., s..s + n));
                    outs.push(self.attend(&rows(&q), &rows(&k), &rows(&v), cache)?);
                    s += n;
                }
                concatenate(&outs, 1)?
            }
        };
        self.o.forward(&out.multiply(mlx_rs::nn::sigmoid(&gate)?)?)
    }

    /// One sequence: q [B, L, heads, dim], k and v [B, L, kv_heads * dim] → [B, L, heads * dim].
    fn attend(&self, q: &Array, k: &Array, v: &Array, cache: &mut KvCache) -> Result<Array> {
        let (b, l, d) = (q.shape()[0], q.shape()[1], self.head_dim);
        let heads = |t: &Array, h: i32| t.reshape(&[b, l, h, d]);
        let q = self.q_norm.forward(q)?.transpose_axes(&[0, 2, 1, 3])?;
        let k = self.k_norm.forward(&heads(k, self.kv_heads)?)?.transpose_axes(&[0, 2, 1, 3])?;
        let v = heads(v, self.kv_heads)?.transpose_axes(&[0, 2, 1, 3])?;
        let offset = cache.offset();
        let (q, k) = (self.rope.forward(&q, offset)?, self.rope.forward(&k, offset)?);
        let (k, v, mask) = cache.update(&k, &v)?;
        let mask = match &mask {
            AttentionMask::None => None,
            AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            AttentionMask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
        };
        let scale = (d as f32).powf(-0.5);
        let out = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, None)?;
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, self.heads * d])?)
    }
}

enum Mixer {
    Linear(GatedDeltaNet),
    Attention(GatedAttention),
}

struct Block {
    input_norm: RmsNorm,
    mixer: Mixer,
    post_attention_norm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    /// `x`: [1, T, hidden], sequence i owning the next `lens[i]` rows and `caches[i]`.
    fn forward(&self, x: &Array, caches: &mut [&mut KvCache], lens: &[i32]) -> Result<Array> {
        let n = self.input_norm.forward(x)?;
        let r = match &self.mixer {
            Mixer::Linear(m) => m.forward_rows(&n, caches, lens)?,
            Mixer::Attention(a) => a.forward_rows(&n, caches, lens)?,
        };
        let h = x.add(r)?;
        Ok(h.add(self.mlp.forward(&self.post_attention_norm.forward(&h)?, None)?)?)
    }
}

impl MtpBlock for Block {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let l = x.shape()[1];
        Block::forward(self, x, &mut [cache], &[l])
    }
}

pub struct Qwen35 {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    dims: ProjectionDims,
}

/// Where the text model's tensors live: mlx-lm's names, Hugging Face's multimodal ones, or a
/// text-only export's.
fn text_prefix(w: &Weights) -> Result<(&'static str, &'static str)> {
    for (model, head) in [
        ("language_model.model.", "language_model.lm_head"),
        ("model.language_model.", "lm_head"),
        ("model.", "lm_head"),
    ] {
        if w.contains(&format!("{model}embed_tokens.weight")) {
            return Ok((model, head));
        }
    }
    Err(EngineError::MissingTensor {
        file: w.file_of("embed_tokens"),
        tensor: "model.language_model.embed_tokens.weight".into(),
    })
}

/// Whether layer `i` is a linear-attention layer.
fn is_linear(cfg: &ModelConfig, i: usize) -> Result<bool> {
    if let Some(types) = cfg.raw.get("layer_types").and_then(Value::as_array) {
        return match types.get(i).and_then(Value::as_str) {
            Some("linear_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            other => Err(cfg.err(format!("layer_types[{i}] is {other:?}, not a known kind"))),
        };
    }
    let interval = cfg.int_or("full_attention_interval", 4)?.max(1) as usize;
    Ok(!(i + 1).is_multiple_of(interval))
}

/// RoPE's base and rotated share of each head, and its scaling, from `rope_parameters`
/// (or the older top-level keys).
fn rope(cfg: &ModelConfig, head_dim: i32) -> Result<Rope> {
    let params = cfg.raw.get("rope_parameters").or_else(|| cfg.raw.get("rope_scaling"));
    let num = |key: &str, default: f64| -> f64 {
        params
            .and_then(|p| p.get(key))
            .or_else(|| cfg.raw.get(key))
            .and_then(Value::as_f64)
            .unwrap_or(default)
    };
    let dims = (head_dim as f64 * num("partial_rotary_factor", 0.25)) as i32;
    let base = num("rope_theta", 100_000.0) as f32;
    let kind = params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        // Multimodal position sections only matter with images; text positions are plain.
        "default" | "mrope" => Rope::base(dims, base, 1.0, false),
        "linear" => Rope::base(dims, base, 1.0 / num("factor", 1.0) as f32, false),
        other => Err(cfg.err(format!(
            "rope type `{other}` is not supported for qwen3_5 (default, linear are)"
        ))),
    }
}

/// The widths every block shares, and the layout's norm convention.
struct Shape {
    hidden: i32,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    eps: f32,
    inter: i32,
    bias: bool,
    delta: DeltaShape,
    /// Norms stored as offsets from 1 (Hugging Face's layout).
    plus_one: bool,
}

impl Shape {
    fn norm(&self, w: &mut Weights, name: &str, dim: i32) -> Result<RmsNorm> {
        match self.plus_one {
            true => RmsNorm::load_plus_one(w, name, dim, self.eps),
            false => RmsNorm::load(w, name, dim, self.eps),
        }
    }
}

/// The block under `l` (`{l}.input_layernorm`, `{l}.linear_attn.*` or `{l}.self_attn.*`,
/// `{l}.post_attention_layernorm`, `{l}.mlp.*`).
fn load_block(
    cfg: &ModelConfig,
    w: &mut Weights,
    l: &str,
    linear: bool,
    s: &Shape,
) -> Result<Block> {
    let (hidden, heads, head_dim) = (s.hidden, s.heads, s.head_dim);
    let mixer = if linear {
        Mixer::Linear(GatedDeltaNet::load(w, cfg, &format!("{l}.linear_attn"), s.delta)?)
    } else {
        let a = format!("{l}.self_attn");
        let lin = |w: &mut Weights, n: &str, i, o| {
            Linear::load(w, cfg, &format!("{a}.{n}"), i, o, s.bias)
        };
        let (q_out, kv_out) = (2 * heads * head_dim, s.kv_heads * head_dim);
        let parts = vec![
            lin(w, "q_proj", hidden, q_out)?,
            lin(w, "k_proj", hidden, kv_out)?,
            lin(w, "v_proj", hidden, kv_out)?,
        ];
        Mixer::Attention(GatedAttention {
            qkv: Projections::new(w, parts, vec![q_out, kv_out, kv_out])?,
            o: lin(w, "o_proj", heads * head_dim, hidden)?.with_host(w)?,
            q_norm: s.norm(w, &format!("{a}.q_norm"), head_dim)?,
            k_norm: s.norm(w, &format!("{a}.k_norm"), head_dim)?,
            rope: rope(cfg, head_dim)?,
            heads,
            kv_heads: s.kv_heads,
            head_dim,
        })
    };
    Ok(Block {
        input_norm: s.norm(w, &format!("{l}.input_layernorm"), hidden)?,
        mixer,
        post_attention_norm: s.norm(w, &format!("{l}.post_attention_layernorm"), hidden)?,
        mlp: Mlp::load(w, cfg, &format!("{l}.mlp"), hidden, s.inter, false)?,
    })
}

/// The native MTP head (`mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`,
/// `mtp.layers.0.*` a gated full-attention block, `mtp.norm`), when the weights carry it.
fn load_mtp(cfg: &ModelConfig, w: &mut Weights, s: &Shape) -> Result<Option<MtpHead>> {
    if !w.contains("mtp.fc.weight") {
        return Ok(None);
    }
    let h = s.hidden;
    Ok(Some(MtpHead::new(
        s.norm(w, "mtp.pre_fc_norm_embedding", h)?,
        s.norm(w, "mtp.pre_fc_norm_hidden", h)?,
        Linear::load(w, cfg, "mtp.fc", 2 * h, h, false)?,
        Box::new(load_block(cfg, w, "mtp.layers.0", false, s)?),
        s.norm(w, "mtp.norm", h)?,
        "qwen3.5",
    )))
}

pub fn load(cfg: &ModelConfig, w: &mut Weights) -> Result<(Qwen35, Option<MtpHead>)> {
    if cfg.int_or("num_experts", 0)? > 0 {
        return Err(cfg.err(
            "the mixture-of-experts variant of qwen3_5 is not supported yet (the dense one is)"
                .into(),
        ));
    }
    let hidden = cfg.int("hidden_size")?;
    let heads = cfg.int("num_attention_heads")?;
    let vocab = cfg.int("vocab_size")?;
    let layers = cfg.int("num_hidden_layers")? as usize;
    let (p, head_name) = text_prefix(w)?;
    let dropped: usize = ["model.visual.", "visual.", "vision_tower."]
        .iter()
        .map(|prefix| w.remove_prefixed(prefix))
        .sum();
    if dropped > 0 {
        tracing::info!(dropped, "qwen3_5: the vision tower is not run; dropped");
    }
    // Hugging Face's checkpoints store the norms as offsets from 1 (and the convolution as
    // [C, 1, K]); mlx-lm's conversion folds the 1 in.
    let first_linear = (0..layers)
        .find(|&i| is_linear(cfg, i).unwrap_or(false))
        .map(|i| format!("{p}layers.{i}.linear_attn.conv1d.weight"));
    let plus_one = first_linear
        .and_then(|n| w.shape_of(&n))
        .is_some_and(|s| s.last().is_some_and(|&k| k != 1));
    let s = Shape {
        hidden,
        heads,
        kv_heads: cfg.int_or("num_key_value_heads", heads)?,
        head_dim: cfg.int_or("head_dim", hidden / heads.max(1))?,
        eps: cfg.float_or("rms_norm_eps", 1e-6)? as f32,
        inter: cfg.int("intermediate_size")?,
        bias: cfg.bool_or("attention_bias", false),
        delta: DeltaShape::from_config(cfg)?,
        plus_one,
    };
    let mut blocks = Vec::with_capacity(layers);
    for i in 0..layers {
        blocks.push(load_block(cfg, w, &format!("{p}layers.{i}"), is_linear(cfg, i)?, &s)?);
    }
    let embed = Embedding::load(w, cfg, &format!("{p}embed_tokens"), vocab, hidden)?;
    let final_norm = s.norm(w, &format!("{p}norm"), hidden)?;
    let tied = cfg.bool_or("tie_word_embeddings", !w.contains(&format!("{head_name}.weight")));
    let lm_head = match tied {
        true => {
            w.remove_unused(&format!("{head_name}.weight"));
            None
        }
        false => Some(Linear::load(w, cfg, head_name, hidden, vocab, false)?.with_host(w)?),
    };
    let mtp = load_mtp(cfg, w, &s)?;
    let dims = ProjectionDims {
        layers: blocks.len(),
        hidden,
        q_out: heads * s.head_dim,
        kv_out: s.kv_heads * s.head_dim,
        intermediate: s.inter,
    };
    Ok((Qwen35 { embed, blocks, norm: final_norm, lm_head, dims }, mtp))
}

impl Architecture for Qwen35 {
    fn hidden_rows(
        &self,
        tokens: &Array,
        seqs: &mut [&mut [KvCache]],
        lens: &[i32],
        lora: Option<&Lora>,
    ) -> Result<Array> {
        if lora.is_some() {
            return Err(EngineError::InvalidRequest(
                "LoRA adapters are not supported on qwen3_5 models yet".into(),
            ));
        }
        let mut h = self.embed.forward(tokens)?;
        for (i, block) in self.blocks.iter().enumerate() {
            h = block.forward(&h, &mut layer_caches(seqs, i), lens)?;
        }
        self.norm.forward(&h)
    }

    fn logits(&self, h: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => match self.embed.host() {
                Some(host) if host.takes(h) => host.forward(h),
                _ => self.embed.as_linear(h),
            },
        }
    }

    fn graph_logits(&self, h: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => self.embed.as_linear(h),
        }
    }

    fn projection_dims(&self) -> ProjectionDims {
        self.dims
    }

    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed.forward(tokens)
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }
}
