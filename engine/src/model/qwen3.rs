//! Qwen 3 (dense): the Llama block without projection biases, an explicit `head_dim`, and a
//! per-head RMS norm on queries and keys before RoPE.

use super::layers::StackShape;
use super::ModelConfig;
use crate::error::Result;

pub fn shape(cfg: &ModelConfig) -> Result<StackShape> {
    let mut s = StackShape::from_llama_config(cfg, 1_000_000.0)?;
    s.attention.qk_norm_eps = Some(s.norm_eps);
    s.mlp_bias = false;
    Ok(s)
}
