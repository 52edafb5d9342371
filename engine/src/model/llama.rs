//! Llama (2, 3, 3.1, 3.2): pre-norm blocks, grouped-query attention, SwiGLU, RoPE with the
//! Llama 3 frequency scaling.

use mlx_rs::Array;

use super::layers::{AttentionShape, DecoderStack, StackShape};
use super::weights::Weights;
use super::{Architecture, ModelConfig};
use crate::error::Result;
use crate::kv_cache::KvCache;

pub struct Llama {
    stack: DecoderStack,
}

impl Llama {
    pub fn load(cfg: &ModelConfig, w: &mut Weights) -> Result<Llama> {
        let hidden = cfg.int("hidden_size")?;
        let heads = cfg.int("num_attention_heads")?;
        let attention_bias = cfg.bool_or("attention_bias", false);
        let shape = StackShape {
            attention: AttentionShape {
                hidden,
                heads,
                kv_heads: cfg.int_or("num_key_value_heads", heads)?,
                head_dim: cfg.int_or("head_dim", hidden / heads)?,
                qkv_bias: attention_bias,
                out_bias: attention_bias,
                qk_norm_eps: None,
            },
            layers: cfg.int("num_hidden_layers")?,
            intermediate: cfg.int("intermediate_size")?,
            vocab: cfg.int("vocab_size")?,
            norm_eps: cfg.float_or("rms_norm_eps", 1e-6)? as f32,
            rope_base: cfg.float_or("rope_theta", 10_000.0)? as f32,
            mlp_bias: cfg.bool_or("mlp_bias", false),
        };
        Ok(Llama { stack: DecoderStack::load(cfg, w, &shape)? })
    }
}

impl Architecture for Llama {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.stack.forward(tokens, caches)
    }

    fn num_layers(&self) -> usize {
        self.stack.blocks.len()
    }
}
