//! Llama (2, 3, 3.1, 3.2): pre-norm blocks, grouped-query attention, SwiGLU, RoPE with the
//! Llama 3 frequency scaling (`Rope::from_config`).

use super::layers::StackShape;
use super::ModelConfig;
use crate::error::Result;

pub fn shape(cfg: &ModelConfig) -> Result<StackShape> {
    StackShape::from_llama_config(cfg, 10_000.0)
}
