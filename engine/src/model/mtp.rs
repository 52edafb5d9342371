//! Multi-token prediction (MTP) heads: a small block that predicts the token after next from
//! the main model's last hidden state and the next token's embedding, used as a draft model for
//! speculative decoding (see `speculative`).
//!
//! Input at position t: `h_t` (the main model's final hidden state, after its last norm) and
//! the embedding of token t+1. Both are normed, concatenated `[embedding, hidden]`, projected
//! back to the hidden size, run through one decoder block with its own KV cache and a final
//! norm; the main model's output head turns the result into logits for token t+2. Chaining
//! feeds that result back in as the hidden state, with the drafted token's embedding.
//!
//! Two namings are read:
//! - Qwen3-Next / Qwen3.5: `mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`,
//!   `mtp.layers.0.*`, `mtp.norm`.
//! - DeepSeek-V3 style, as the layer after the last: `model.layers.{N}.enorm`, `.hnorm`,
//!   `.eh_proj`, the block's own weights under the same prefix, `.shared_head.norm` (its copies
//!   of the embeddings and head are the main model's and are not loaded twice).
//!
//! The block has the main stack's shape and norm convention: a pre-norm block for the Llama
//! family, the hybrid's gated-attention block for Qwen3.5 (`qwen3_5.rs` builds that head
//! with `MtpHead::new`).

use mlx_rs::ops::concatenate;
use mlx_rs::Array;

use super::layers::{PreNormBlock, RmsNorm, StackShape};
use super::linear::Linear;
use super::weights::Weights;
use super::{Architecture, ModelConfig};
use crate::error::Result;
use crate::model::kv_cache::KvCache;

/// The decoder block inside a head: `x` [1, L, hidden] through it, appending to `cache`.
pub trait MtpBlock: Send {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array>;
}

impl MtpBlock for PreNormBlock {
    fn forward(&self, x: &Array, cache: &mut KvCache) -> Result<Array> {
        let l = x.shape()[1];
        PreNormBlock::forward(self, x, &mut [cache], &[l], None)
    }
}

pub struct MtpHead {
    embed_norm: RmsNorm,
    hidden_norm: RmsNorm,
    fc: Linear,
    block: Box<dyn MtpBlock>,
    norm: RmsNorm,
    /// Which naming the weights used, for `/health` and logs.
    pub naming: &'static str,
}

impl MtpHead {
    /// A head from its parts (an architecture whose block is not a pre-norm block).
    pub fn new(
        embed_norm: RmsNorm,
        hidden_norm: RmsNorm,
        fc: Linear,
        block: Box<dyn MtpBlock>,
        norm: RmsNorm,
        naming: &'static str,
    ) -> MtpHead {
        MtpHead { embed_norm, hidden_norm, fc, block, norm, naming }
    }

    /// The MTP head in `w`, if the weights carry one.
    pub fn load(cfg: &ModelConfig, w: &mut Weights, s: &StackShape) -> Result<Option<MtpHead>> {
        let hidden = s.attention.hidden;
        let eps = s.norm_eps;
        if w.contains("mtp.fc.weight") {
            return Ok(Some(MtpHead {
                embed_norm: RmsNorm::load(w, "mtp.pre_fc_norm_embedding", hidden, eps)?,
                hidden_norm: RmsNorm::load(w, "mtp.pre_fc_norm_hidden", hidden, eps)?,
                fc: Linear::load(w, cfg, "mtp.fc", 2 * hidden, hidden, false)?,
                block: Box::new(PreNormBlock::load(cfg, w, "mtp.layers.0", s)?),
                norm: RmsNorm::load(w, "mtp.norm", hidden, eps)?,
                naming: "qwen3-next",
            }));
        }
        let p = format!("model.layers.{}", s.layers);
        if w.contains(&format!("{p}.eh_proj.weight")) {
            for copy in ["embed_tokens.weight", "shared_head.head.weight"] {
                w.remove_unused(&format!("{p}.{copy}"));
            }
            return Ok(Some(MtpHead {
                embed_norm: RmsNorm::load(w, &format!("{p}.enorm"), hidden, eps)?,
                hidden_norm: RmsNorm::load(w, &format!("{p}.hnorm"), hidden, eps)?,
                fc: Linear::load(w, cfg, &format!("{p}.eh_proj"), 2 * hidden, hidden, false)?,
                block: Box::new(PreNormBlock::load(cfg, w, &p, s)?),
                norm: RmsNorm::load(w, &format!("{p}.shared_head.norm"), hidden, eps)?,
                naming: "deepseek",
            }));
        }
        Ok(None)
    }

    /// `hidden`: [1, L, H] main (or previous MTP) hidden states at positions t..t+L;
    /// `tokens`: [1, L] the tokens at t+1..t+L+1. Returns the MTP hidden states [1, L, H], which
    /// `main.logits` turns into predictions for t+2..t+L+2.
    pub fn forward(
        &self,
        main: &dyn Architecture,
        hidden: &Array,
        tokens: &Array,
        cache: &mut KvCache,
    ) -> Result<Array> {
        let e = self.embed_norm.forward(&main.embed(tokens)?)?;
        let h = self.hidden_norm.forward(hidden)?;
        let x = self.fc.forward(&concatenate(&[e, h], -1)?)?;
        let x = self.block.forward(&x, cache)?;
        self.norm.forward(&x)
    }
}
