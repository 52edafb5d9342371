//! Qwen 2 / 2.5: the Llama block with biases on the query, key and value projections (none
//! on the output projection), `head_dim` = hidden / heads, RoPE base 1e6 by default.

use super::layers::StackShape;
use super::ModelConfig;
use crate::error::Result;

pub fn shape(cfg: &ModelConfig) -> Result<StackShape> {
    let mut s = StackShape::from_llama_config(cfg, 1_000_000.0)?;
    s.attention.head_dim = s.attention.hidden / s.attention.heads;
    s.attention.qkv_bias = true;
    s.attention.out_bias = false;
    s.mlp_bias = false;
    Ok(s)
}
