//! The key/value cache: one per layer, grown in steps so decoding does not reallocate per token.
//! Sliding-window layers (Gemma 3) keep only the last `window` positions in a ring buffer, so
//! their memory stays bounded however long the chat gets.

use mlx_rs::ops::indexing::{IndexMutOp, IndexOp};
use mlx_rs::ops::{self, concatenate, zeros_dtype};
use mlx_rs::Array;

use crate::error::Result;

/// Positions added per growth step (as mlx-lm's KVCache).
const STEP: i32 = 256;

/// Which keys each query may see, as the attention kernel wants it.
pub enum AttentionMask {
    /// A single query sees every cached key.
    None,
    /// Causal, aligned to the bottom right (the cache holds a prefix).
    Causal,
    /// Explicit boolean [L, keys] mask (true = attend).
    Array(Array),
}

/// Keys and values of shape [B, kv_heads, capacity, head_dim]; `offset` positions are valid.
#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    /// Sliding-window attention: position p sees keys in (p - window, p]. The buffer then holds
    /// position p at slot p % window.
    window: Option<i32>,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    pub fn sliding(window: i32) -> KvCache {
        KvCache { window: Some(window), ..KvCache::default() }
    }

    /// Append `k`/`v` and return the keys, values and mask this step's queries attend with.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array, AttentionMask)> {
        let l = k.shape()[2];
        match self.window {
            None => {
                let (k, v) = self.update_and_fetch(k, v)?;
                Ok((k, v, if l > 1 { AttentionMask::Causal } else { AttentionMask::None }))
            }
            Some(w) => self.update_sliding(k, v, w),
        }
    }

    fn update_sliding(&mut self, k: &Array, v: &Array, w: i32) -> Result<(Array, Array, AttentionMask)> {
        let (b, h, l, dk) = (k.shape()[0], k.shape()[1], k.shape()[2], k.shape()[3]);
        let dv = v.shape()[3];
        let o = self.offset;
        if self.keys.is_none() {
            self.keys = Some(zeros_dtype(&[b, h, w, dk], k.dtype())?);
            self.values = Some(zeros_dtype(&[b, h, w, dv], v.dtype())?);
        }
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        if l == 1 {
            // Decode: overwrite the slot of position o - w; the buffer then holds exactly the
            // window. Key order does not matter to a single query (RoPE is already applied).
            let slot = o % w;
            keys.index_mut((.., .., slot..slot + 1, ..), k);
            values.index_mut((.., .., slot..slot + 1, ..), v);
            self.offset += 1;
            let n = self.offset.min(w);
            return Ok((keys.index((.., .., ..n, ..)), values.index((.., .., ..n, ..)), AttentionMask::None));
        }
        // Prefill chunk: the cached window in position order, then the new keys.
        let ordered = |a: &Array| -> Result<Array> {
            if o <= w {
                Ok(a.index((.., .., ..o, ..)))
            } else {
                let s = o % w;
                Ok(concatenate(&[a.index((.., .., s.., ..)), a.index((.., .., ..s, ..))], 2)?)
            }
        };
        let full_k = concatenate(&[ordered(keys)?, k.clone()], 2)?;
        let full_v = concatenate(&[ordered(values)?, v.clone()], 2)?;
        let first = o - o.min(w); // position of full_k's first key
        let n = full_k.shape()[2];
        let q_pos = ops::arange::<_, i32>(o, o + l, None)?.reshape(&[l, 1])?;
        let k_pos = ops::arange::<_, i32>(first, first + n, None)?.reshape(&[1, n])?;
        let mask = k_pos.le(&q_pos)?.logical_and(&q_pos.subtract(&k_pos)?.lt(&Array::from_int(w))?)?;
        // Keep the last w positions in slot order (position p at p % w).
        let end = o + l;
        if end <= w {
            keys.index_mut((.., .., ..end, ..), &full_k);
            values.index_mut((.., .., ..end, ..), &full_v);
        } else {
            let s = end - w; // first kept position
            let split = w - s % w; // last_w[split] holds a position ≡ 0 (mod w)
            let rotate = |a: &Array| -> Result<Array> {
                let last = a.index((.., .., (n - w).., ..));
                Ok(concatenate(&[last.index((.., .., split.., ..)), last.index((.., .., ..split, ..))], 2)?)
            };
            *keys = rotate(&full_k)?;
            *values = rotate(&full_v)?;
        }
        self.offset = end;
        Ok((full_k, full_v, AttentionMask::Array(mask)))
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
    /// A sliding-window cache cannot roll back (its ring has overwritten older positions) and
    /// trims nothing.
    pub fn trim(&mut self, n: i32) -> i32 {
        if self.window.is_some() {
            return 0;
        }
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
