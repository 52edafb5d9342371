//! Gemma 3 (text): sliding-window and global attention layers interleaved (every
//! `sliding_window_pattern`-th layer is global), local RoPE base 10 000 and global 1 000 000,
//! q/k RMS norms, RMS norms that scale by (1 + weight), four norms per block, GeGLU with the
//! tanh GELU, embeddings scaled by sqrt(hidden), `query_pre_attn_scalar`, tied embeddings.

use mlx_rs::Array;

use super::host_step;
use super::layers::{layer_caches, Attention, AttentionShape, Mlp, RmsNorm, Rope};
use super::linear::Embedding;
use super::weights::Weights;
use super::{Architecture, ModelConfig};
use crate::error::Result;
use crate::model::kv_cache::KvCache;
use crate::model::lora::{layer_of, LayerLora, Lora, ProjectionDims};

struct Block {
    input_norm: RmsNorm,
    attention: Attention,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    mlp: Mlp,
    post_feedforward_norm: RmsNorm,
}

impl Block {
    fn forward(
        &self,
        x: &Array,
        caches: &mut [&mut KvCache],
        lens: &[i32],
        lora: Option<&LayerLora>,
    ) -> Result<Array> {
        if self.mlp.steps_on_host(x, lora) {
            let xs = host_step::values(x)?;
            let n = host_step::array(&self.input_norm.host(&xs)?, x)?;
            let r = host_step::values(&self.attention.forward_rows(&n, caches, lens, None)?)?;
            let h = host_step::add(&xs, &self.post_attention_norm.host(&r)?);
            let m = self.mlp.host(&self.pre_feedforward_norm.host(&h)?);
            return host_step::array(&host_step::add(&h, &self.post_feedforward_norm.host(&m)?), x);
        }
        let r = self.attention.forward_rows(&self.input_norm.forward(x)?, caches, lens, lora)?;
        let h = x.add(self.post_attention_norm.forward(&r)?)?;
        let r = self.mlp.forward(&self.pre_feedforward_norm.forward(&h)?, lora)?;
        Ok(h.add(self.post_feedforward_norm.forward(&r)?)?)
    }
}

pub struct Gemma3Text {
    embed: Embedding,
    embed_scale: f32,
    blocks: Vec<Block>,
    norm: RmsNorm,
    /// Per layer: `Some(window)` for sliding-window layers.
    windows: Vec<Option<i32>>,
    dims: ProjectionDims,
}

/// Whether layer `i` uses sliding-window attention: from `layer_types` when the config has it,
/// else every `sliding_window_pattern`-th layer (1-based) is global.
fn is_sliding(cfg: &ModelConfig, i: usize) -> Result<bool> {
    if let Some(types) = cfg.raw.get("layer_types").and_then(|t| t.as_array()) {
        return Ok(types.get(i).and_then(|t| t.as_str()) == Some("sliding_attention"));
    }
    let pattern = cfg.int_or("sliding_window_pattern", 6)?.max(1) as usize;
    Ok(!(i + 1).is_multiple_of(pattern))
}

pub fn load(cfg: &ModelConfig, w: &mut Weights) -> Result<Gemma3Text> {
    let hidden = cfg.int("hidden_size")?;
    let heads = cfg.int_or("num_attention_heads", 4)?;
    let head_dim = cfg.int_or("head_dim", 256)?;
    let eps = cfg.float_or("rms_norm_eps", 1e-6)? as f32;
    let inter = cfg.int("intermediate_size")?;
    let vocab = cfg.int("vocab_size")?;
    let window = cfg.int_or("sliding_window", 512)?;
    let shape = AttentionShape {
        hidden,
        heads,
        kv_heads: cfg.int_or("num_key_value_heads", 1)?,
        head_dim,
        qkv_bias: false,
        out_bias: false,
        qk_norm_eps: Some(eps),
        qk_norm_plus_one: true,
        scale: Some((cfg.float_or("query_pre_attn_scalar", head_dim as f64)? as f32).powf(-0.5)),
    };
    let global_base = cfg.float_or("rope_theta", 1_000_000.0)? as f32;
    let local_base = cfg.float_or("rope_local_base_freq", 10_000.0)? as f32;
    let mut blocks = Vec::new();
    let mut windows = Vec::new();
    for i in 0..cfg.int("num_hidden_layers")? as usize {
        let p = format!("model.layers.{i}");
        let sliding = is_sliding(cfg, i)?;
        // Sliding layers never use the long-context rope scaling.
        let rope = if sliding {
            Rope::base(head_dim, local_base, 1.0, false)?
        } else {
            Rope::from_config(cfg, head_dim, global_base)?
        };
        let norm =
            |w: &mut Weights, n: &str| RmsNorm::load_plus_one(w, &format!("{p}.{n}"), hidden, eps);
        blocks.push(Block {
            input_norm: norm(w, "input_layernorm")?,
            attention: Attention::load(w, cfg, &format!("{p}.self_attn"), &shape, rope)?,
            post_attention_norm: norm(w, "post_attention_layernorm")?,
            pre_feedforward_norm: norm(w, "pre_feedforward_layernorm")?,
            mlp: Mlp::load_geglu(w, cfg, &format!("{p}.mlp"), hidden, inter)?,
            post_feedforward_norm: norm(w, "post_feedforward_layernorm")?,
        });
        windows.push(sliding.then_some(window));
    }
    w.remove_unused("lm_head.weight"); // always tied
                                       // The reference implementations multiply by sqrt(hidden) rounded to bf16.
    let embed_scale = half::bf16::from_f32((hidden as f32).sqrt()).to_f32();
    let embed = Embedding::load(w, cfg, "model.embed_tokens", vocab, hidden)?;
    let dims = ProjectionDims {
        layers: blocks.len(),
        hidden,
        q_out: heads * head_dim,
        kv_out: shape.kv_heads * head_dim,
        intermediate: inter,
    };
    Ok(Gemma3Text {
        dims,
        embed,
        embed_scale,
        blocks,
        norm: RmsNorm::load_plus_one(w, "model.norm", hidden, eps)?,
        windows,
    })
}

impl Architecture for Gemma3Text {
    fn hidden_rows(
        &self,
        tokens: &Array,
        seqs: &mut [&mut [KvCache]],
        lens: &[i32],
        lora: Option<&Lora>,
    ) -> Result<Array> {
        let mut h = self.embed(tokens)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let mut layer = layer_caches(seqs, i);
            h = block.forward(&h, &mut layer, lens, layer_of(lora, i))?;
        }
        self.norm.forward(&h)
    }

    fn logits(&self, h: &Array) -> Result<Array> {
        match self.embed.host() {
            Some(host) if host.takes(h) => host.forward(h),
            _ => self.embed.as_linear(h),
        }
    }

    fn graph_logits(&self, h: &Array) -> Result<Array> {
        self.embed.as_linear(h)
    }

    fn projection_dims(&self) -> ProjectionDims {
        self.dims
    }

    fn embed(&self, tokens: &Array) -> Result<Array> {
        let h = self.embed.forward(tokens)?;
        Ok(h.multiply(Array::from_f32(self.embed_scale).as_dtype(h.dtype())?)?)
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    fn new_caches(&self) -> Vec<KvCache> {
        self.windows.iter().map(|w| w.map_or_else(KvCache::new, KvCache::sliding)).collect()
    }
}
