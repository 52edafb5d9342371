//! The key/value cache: one per layer, grown in steps so decoding does not reallocate per token.

use mlx_rs::ops::indexing::{IndexMutOp, IndexOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use crate::error::Result;

/// Positions added per growth step (as mlx-lm's KVCache).
const STEP: i32 = 256;

/// Keys and values of shape [B, kv_heads, capacity, head_dim]; `offset` positions are valid.
#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Number of positions already cached (the next token's position).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Append `k`/`v` ([B, H, L, D]) and return views of everything cached so far.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let (b, h, l, dk) = (k.shape()[0], k.shape()[1], k.shape()[2], k.shape()[3]);
        let dv = v.shape()[3];
        let prev = self.offset;
        let capacity = self.keys.as_ref().map_or(0, |a| a.shape()[2]);
        if prev + l > capacity {
            let grow = (l + STEP - 1) / STEP * STEP;
            let new_k = zeros_dtype(&[b, h, grow, dk], k.dtype())?;
            let new_v = zeros_dtype(&[b, h, grow, dv], v.dtype())?;
            let (keys, values) = match (self.keys.take(), self.values.take()) {
                (Some(keys), Some(values)) => {
                    // Drop the unused tail first so repeated growth does not accumulate gaps.
                    let keys = keys.index((.., .., ..prev, ..));
                    let values = values.index((.., .., ..prev, ..));
                    (concatenate(&[keys, new_k], 2)?, concatenate(&[values, new_v], 2)?)
                }
                _ => (new_k, new_v),
            };
            self.keys = Some(keys);
            self.values = Some(values);
        }
        self.offset = prev + l;
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        keys.index_mut((.., .., prev..self.offset, ..), k);
        values.index_mut((.., .., prev..self.offset, ..), v);
        let end = self.offset;
        Ok((keys.index((.., .., ..end, ..)), values.index((.., .., ..end, ..))))
    }

    /// Forget the last `n` positions (speculative decoding rolls back rejected drafts this way;
    /// the buffer is kept and later writes overwrite the stale tail).
    pub fn trim(&mut self, n: i32) -> i32 {
        let n = n.min(self.offset);
        self.offset -= n;
        n
    }

    /// Arrays to evaluate so the cache holds computed data (used between prefill chunks).
    pub fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    /// Bytes held by the buffers.
    pub fn nbytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}
