//! Qwen 2 / 2.5: the Llama block with biases on the query, key and value projections.

use mlx_rs::Array;

use super::layers::{AttentionShape, DecoderStack, StackShape};
use super::weights::Weights;
use super::{Architecture, ModelConfig};
use crate::error::Result;
use crate::kv_cache::KvCache;

pub struct Qwen2 {
    stack: DecoderStack,
}

impl Qwen2 {
    pub fn load(cfg: &ModelConfig, w: &mut Weights) -> Result<Qwen2> {
        let hidden = cfg.int("hidden_size")?;
        let heads = cfg.int("num_attention_heads")?;
        let shape = StackShape {
            attention: AttentionShape {
                hidden,
                heads,
                kv_heads: cfg.int_or("num_key_value_heads", heads)?,
                head_dim: hidden / heads,
                qkv_bias: true,
                out_bias: false,
                qk_norm_eps: None,
            },
            layers: cfg.int("num_hidden_layers")?,
            intermediate: cfg.int("intermediate_size")?,
            vocab: cfg.int("vocab_size")?,
            norm_eps: cfg.float_or("rms_norm_eps", 1e-6)? as f32,
            rope_base: cfg.float_or("rope_theta", 1_000_000.0)? as f32,
            mlp_bias: false,
        };
        Ok(Qwen2 { stack: DecoderStack::load(cfg, w, &shape)? })
    }
}

impl Architecture for Qwen2 {
    fn forward(&self, tokens: &Array, caches: &mut [KvCache]) -> Result<Array> {
        self.stack.forward(tokens, caches)
    }

    fn num_layers(&self) -> usize {
        self.stack.blocks.len()
    }
}
