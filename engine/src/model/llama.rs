//! Llama (2, 3, 3.1, 3.2): pre-norm blocks, grouped-query attention, SwiGLU, RoPE with the
//! Llama 3 frequency scaling (`Rope::from_config`).

use super::layers::{DecoderStack, StackShape};
use super::weights::Weights;
use super::ModelConfig;
use crate::error::Result;

pub fn shape(cfg: &ModelConfig) -> Result<StackShape> {
    StackShape::from_llama_config(cfg, 10_000.0)
}

pub fn load(cfg: &ModelConfig, w: &mut Weights) -> Result<DecoderStack> {
    DecoderStack::load(cfg, w, &shape(cfg)?)
}
