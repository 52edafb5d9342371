//! The key/value cache: one per layer, grown in steps so decoding does not reallocate per token.
//! Sliding-window layers (Gemma 3) keep only the last `window` positions (plus a little slack
//! for rolling back draft tokens) in a ring buffer, so their memory stays bounded however long
//! the chat gets.

use std::sync::atomic::{AtomicBool, Ordering};

use mlx_rs::ops::indexing::{IndexMutOp, IndexOp};
use mlx_rs::ops::{self, concatenate, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::recurrent_state::RecurrentState;
use super::remote::RemoteSlot;
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
/// Cloning shares the buffers: MLX copies a shared buffer on its next write, and the host's
/// in-place writes (`host_append`) first copy any buffer they do not own, so a clone never
/// sees the other's later positions.
#[derive(Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    /// Sliding-window attention: position p sees keys in (p - window, p]. The buffer then holds
    /// position p at slot p % (window + SLIDING_SLACK).
    window: Option<i32>,
    /// Sliding window: how many of the latest positions the ring holds intact.
    stored: i32,
    /// Whether the buffers are evaluated, row-contiguous f32 that nothing else holds: set
    /// only by `host_append`'s own copy, cleared by anything that may share them (a clone,
    /// handing them out to save or evaluate, an MLX write, whose views may outlive it).
    own: AtomicBool,
    /// A linear-attention layer's state, which it holds instead of keys and values.
    recurrent: Option<Box<RecurrentState>>,
    /// A layer another rank runs: its keys and values live there, under this slot
    /// (`model::remote`); here only `offset` is kept.
    remote: Option<RemoteSlot>,
}

impl Clone for KvCache {
    fn clone(&self) -> KvCache {
        self.own.store(false, Ordering::Relaxed);
        KvCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            offset: self.offset,
            window: self.window,
            stored: self.stored,
            own: AtomicBool::new(false),
            recurrent: self.recurrent.clone(),
            remote: self.remote.clone(),
        }
    }
}

/// One step's keys and values as `host_append` left them, for attention on the host: the
/// buffers ([kv_heads, capacity, dim] each), how many slots from the start hold positions,
/// and, for a ring past its window, which of those slots the new query sees.
pub struct HostView<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub capacity: usize,
    pub len: usize,
    pub visible: Option<Vec<bool>>,
}

/// The data of an evaluated f32 array, for writing in place. Only the CPU backend's host
/// path calls this (never on macOS, where MLX's buffers live on the GPU's side).
#[cfg(not(target_os = "macos"))]
fn data_ptr(a: &Array) -> *mut f32 {
    // SAFETY: `a` is evaluated and f32 (checked by the callers); the C API hands out its data
    // pointer, which stays valid while `a` lives.
    unsafe { mlx_sys::mlx_array_data_float32(a.as_ptr()) as *mut f32 }
}

#[cfg(target_os = "macos")]
fn data_ptr(_: &Array) -> *mut f32 {
    std::ptr::null_mut()
}

/// Positions a sliding-window cache keeps beyond its window, so that speculative decoding can
/// roll back up to this many rejected draft tokens.
pub const SLIDING_SLACK: i32 = 32;

// A recurrent state rolls back over any draft a sliding window can.
const _: () = assert!(super::recurrent_state::ROLLBACK_TOKENS > SLIDING_SLACK);

/// Write `src` ([B, H, n, D], n <= cap) as positions first.. into a ring of `cap` slots.
fn write_ring(buf: &mut Array, src: &Array, first: i32, cap: i32) {
    let n = src.shape()[2];
    let s = first % cap;
    if s + n <= cap {
        buf.index_mut((.., .., s..s + n, ..), src);
    } else {
        let a = cap - s;
        buf.index_mut((.., .., s..cap, ..), &src.index((.., .., ..a, ..)));
        buf.index_mut((.., .., ..n - a, ..), &src.index((.., .., a.., ..)));
    }
}

/// Positions first..first+n of a ring of `cap` slots, in position order.
fn ring_range(buf: &Array, first: i32, n: i32, cap: i32) -> Result<Array> {
    let s = first % cap;
    if s + n <= cap {
        return Ok(buf.index((.., .., s..s + n, ..)));
    }
    Ok(concatenate(&[buf.index((.., .., s.., ..)), buf.index((.., .., ..s + n - cap, ..))], 2)?)
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
        *self.own.get_mut() = false;
        let l = k.shape()[2];
        match self.window {
            None => {
                let (k, v) = self.update_and_fetch(k, v)?;
                Ok((k, v, if l > 1 { AttentionMask::Causal } else { AttentionMask::None }))
            }
            Some(w) => self.update_sliding(k, v, w),
        }
    }

    fn update_sliding(
        &mut self,
        k: &Array,
        v: &Array,
        w: i32,
    ) -> Result<(Array, Array, AttentionMask)> {
        let (b, h, l, dk) = (k.shape()[0], k.shape()[1], k.shape()[2], k.shape()[3]);
        let dv = v.shape()[3];
        let cap = w + SLIDING_SLACK;
        let o = self.offset;
        if self.keys.is_none() {
            self.keys = Some(zeros_dtype(&[b, h, cap, dk], k.dtype())?);
            self.values = Some(zeros_dtype(&[b, h, cap, dv], v.dtype())?);
        }
        let (keys, values) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        let end = o + l;
        if l == 1 {
            // Decode: position o goes to slot o % cap. Key order does not matter to a single
            // query (RoPE is already applied); slots outside the window are masked.
            write_ring(keys, k, o, cap);
            write_ring(values, v, o, cap);
            self.offset = end;
            self.stored = (self.stored + 1).min(cap);
            let n = end.min(cap);
            let mask = if end <= w {
                AttentionMask::None
            } else {
                let valid: Vec<bool> = (0..n).map(|slot| (o - slot).rem_euclid(cap) < w).collect();
                AttentionMask::Array(Array::from_slice(&valid, &[1, n]))
            };
            return Ok((keys.index((.., .., ..n, ..)), values.index((.., .., ..n, ..)), mask));
        }
        // Several queries (prefill chunk, draft verification): the cached window in position
        // order, then the new keys, with an explicit causal sliding mask.
        let kept = o.min(w);
        let full_k = concatenate(&[ring_range(keys, o - kept, kept, cap)?, k.clone()], 2)?;
        let full_v = concatenate(&[ring_range(values, o - kept, kept, cap)?, v.clone()], 2)?;
        let first = o - kept; // position of full_k's first key
        let n = full_k.shape()[2];
        let q_pos = ops::arange::<_, i32>(o, end, None)?.reshape(&[l, 1])?;
        let k_pos = ops::arange::<_, i32>(first, first + n, None)?.reshape(&[1, n])?;
        let mask =
            k_pos.le(&q_pos)?.logical_and(&q_pos.subtract(&k_pos)?.lt(Array::from_int(w))?)?;
        // Store the new positions (at most the last `cap`) in their slots.
        let from = o.max(end - cap);
        write_ring(keys, &k.index((.., .., (from - o).., ..)), from, cap);
        write_ring(values, &v.index((.., .., (from - o).., ..)), from, cap);
        self.offset = end;
        self.stored = (self.stored + l).min(cap);
        Ok((full_k, full_v, AttentionMask::Array(mask)))
    }

    /// A full-attention cache's key and value buffers ([B, H, capacity, D]; the first
    /// `offset` positions valid), for attention computed on the host. `None` for a sliding
    /// window's ring, whose slots are not in position order.
    pub fn buffers(&self) -> Option<(&Array, &Array)> {
        self.own.store(false, Ordering::Relaxed);
        match (self.window, &self.keys, &self.values) {
            (None, Some(k), Some(v)) => Some((k, v)),
            _ => None,
        }
    }

    /// Whether `host_append` takes this cache's next position, for `kv_heads` heads of
    /// `dk`-wide keys and `dv`-wide values: buffers of f32 [1, kv_heads, _, d] that MLX has
    /// written (a prefill comes first). Anything else keeps `update`.
    pub fn host_ready(&self, kv_heads: usize, dk: usize, dv: usize) -> bool {
        let fits = |a: &Option<Array>, d: usize| {
            a.as_ref().is_some_and(|a| {
                let s = a.shape();
                a.dtype() == Dtype::Float32
                    && s.len() == 4
                    && s[0] == 1
                    && s[1] as usize == kv_heads
                    && s[3] as usize == d
            })
        };
        !cfg!(target_os = "macos") && fits(&self.keys, dk) && fits(&self.values, dv)
    }

    /// Append one position's key and value (`kv_heads` rows of their width, head by head) on
    /// the host, writing the buffers in place: a decode step without an MLX operation. The
    /// first write after MLX's (or after the buffers were shared) copies them into buffers of
    /// this cache's own first, with room to grow. The caller checked `host_ready`.
    pub fn host_append(&mut self, k: &[f32], v: &[f32]) -> Result<HostView<'_>> {
        let (Some(keys), Some(values)) = (&self.keys, &self.values) else {
            return Err(crate::error::EngineError::Internal(
                "host_append on an empty cache".into(),
            ));
        };
        let (h, cap) = (keys.shape()[1] as usize, keys.shape()[2] as usize);
        let (dk, dv) = (k.len() / h, v.len() / h);
        let o = self.offset as usize;
        let slot = match self.window {
            Some(_) => o % cap,
            None => o,
        };
        if !*self.own.get_mut() || slot >= cap {
            // Full attention grows by STEP past what it holds; a ring keeps its size.
            let room = match self.window {
                Some(_) => cap,
                None => (o + 1).div_ceil(STEP as usize) * STEP as usize + STEP as usize,
            };
            let own = |a: &Array, held: usize, d: usize| -> Result<Array> {
                let fresh = concatenate(
                    &[
                        a.index((.., .., ..held as i32, ..)),
                        zeros_dtype(
                            &[1, h as i32, (room - held) as i32, d as i32],
                            Dtype::Float32,
                        )?,
                    ],
                    2,
                )?;
                fresh.eval()?;
                Ok(fresh)
            };
            let held = if self.window.is_some() { cap } else { o };
            let (nk, nv) = (own(keys, held, dk)?, own(values, held, dv)?);
            self.keys = Some(nk);
            self.values = Some(nv);
            *self.own.get_mut() = true;
        }
        let (keys, values) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        let cap = keys.shape()[2] as usize;
        let (kp, vp) = (data_ptr(keys), data_ptr(values));
        // SAFETY: both buffers are this cache's alone (`own`), evaluated, row-contiguous f32
        // [1, h, cap, d], and `slot < cap`; nothing else reads or writes them meanwhile.
        let (kd, vd) = unsafe {
            for (g, (kr, vr)) in k.chunks_exact(dk).zip(v.chunks_exact(dv)).enumerate() {
                std::ptr::copy_nonoverlapping(kr.as_ptr(), kp.add((g * cap + slot) * dk), dk);
                std::ptr::copy_nonoverlapping(vr.as_ptr(), vp.add((g * cap + slot) * dv), dv);
            }
            (
                std::slice::from_raw_parts(kp.cast_const(), h * cap * dk),
                std::slice::from_raw_parts(vp.cast_const(), h * cap * dv),
            )
        };
        let end = o + 1;
        self.offset = end as i32;
        let (len, visible) = match self.window {
            None => (end, None),
            Some(w) => {
                self.stored = (self.stored + 1).min(cap as i32);
                let n = end.min(cap);
                let visible = (end > w as usize).then(|| {
                    (0..n)
                        .map(|s| (o as i64 - s as i64).rem_euclid(cap as i64) < w as i64)
                        .collect()
                });
                (n, visible)
            }
        };
        Ok(HostView { keys: kd, values: vd, capacity: cap, len, visible })
    }

    /// Number of positions already cached (the next token's position).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Append `k`/`v` ([B, H, L, D]) and return views of everything cached so far.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        *self.own.get_mut() = false;
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
    /// the buffer is kept and later writes overwrite the stale tail). Returns how many were
    /// forgotten: a sliding-window cache keeps `SLIDING_SLACK` positions beyond its window for
    /// this and can roll back no further than they reach.
    pub fn trim(&mut self, n: i32) -> i32 {
        let mut n = n.clamp(0, self.offset);
        if let Some(r) = &self.remote {
            r.trimmed(n);
            self.offset -= n;
            return n;
        }
        if let Some(r) = &mut self.recurrent {
            n = r.trim(n);
            self.offset -= n;
            return n;
        }
        if let Some(w) = self.window {
            // What stays stored must still cover the window of the new last position.
            while n > 0 && self.stored - n < (self.offset - n).min(w) {
                n -= 1;
            }
            self.stored -= n;
        }
        self.offset -= n;
        n
    }

    /// Whether `trim(n)` would forget all `n` positions.
    pub fn can_trim(&self, n: i32) -> bool {
        if n < 0 || n > self.offset {
            return false;
        }
        if let Some(r) = &self.recurrent {
            return r.can_trim(n);
        }
        match self.window {
            Some(w) => self.stored - n >= (self.offset - n).min(w),
            None => true,
        }
    }

    /// Sliding window, if this is a ring (its size, slack included, and what it holds), for
    /// saving and restoring a cache exactly.
    pub fn ring(&self) -> Option<(i32, i32)> {
        self.window.map(|w| (w, self.stored))
    }

    /// The buffers and counters, for saving (`None` buffers: nothing was ever written).
    pub fn parts(&self) -> (Option<&Array>, Option<&Array>, i32) {
        self.own.store(false, Ordering::Relaxed);
        (self.keys.as_ref(), self.values.as_ref(), self.offset)
    }

    /// A cache from saved parts (see `parts` and `ring`); the caller checked the shapes.
    pub fn from_parts(
        keys: Array,
        values: Array,
        offset: i32,
        ring: Option<(i32, i32)>,
    ) -> KvCache {
        KvCache {
            keys: Some(keys),
            values: Some(values),
            offset,
            window: ring.map(|r| r.0),
            stored: ring.map_or(0, |r| r.1),
            own: AtomicBool::new(false),
            recurrent: None,
            remote: None,
        }
    }

    /// This remote layer's slot, given one (from `book`, for `layer`, holding
    /// `bytes_per_position` there) at its first use.
    pub fn remote_slot(
        &mut self,
        layer: u32,
        bytes_per_position: usize,
        book: &std::sync::Arc<super::remote::SlotBook>,
    ) -> u32 {
        self.remote.get_or_insert_with(|| RemoteSlot::new(layer, bytes_per_position, book)).slot
    }

    /// A remote layer took `n` more positions.
    pub fn advance_remote(&mut self, n: i32) {
        self.offset += n;
    }

    /// Whether another rank holds this layer's keys and values (nothing here to save).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Arrays to evaluate so the cache holds computed data (used between prefill chunks).
    pub fn state(&self) -> Vec<&Array> {
        self.own.store(false, Ordering::Relaxed);
        let recurrent = self.recurrent.iter().flat_map(|r| r.arrays());
        self.keys.iter().chain(self.values.iter()).chain(recurrent).collect()
    }

    /// Whether this cache can be cut back to any earlier position (not a sliding-window
    /// ring, nor a recurrent state).
    pub fn cuts_back_anywhere(&self) -> bool {
        self.window.is_none() && self.recurrent.is_none()
    }

    /// A linear-attention layer's state (`None` before its first token, and for attention).
    pub fn recurrent(&self) -> Option<&RecurrentState> {
        self.recurrent.as_deref()
    }

    /// Store a linear-attention layer's state after a call of `steps` tokens (`history`:
    /// see `RecurrentState`).
    pub fn advance_recurrent(
        &mut self,
        conv: Array,
        ssm: Array,
        steps: i32,
        history: Vec<(Array, Array)>,
    ) {
        match &mut self.recurrent {
            Some(r) => r.advance(conv, ssm, steps, history),
            None => {
                let mut r = RecurrentState::new(conv.clone(), ssm.clone());
                r.advance(conv, ssm, steps, history);
                self.recurrent = Some(Box::new(r));
            }
        }
        self.offset += steps;
    }

    /// A linear-attention layer's cache from a saved state (see `recurrent`).
    pub fn from_recurrent(conv: Array, ssm: Array, offset: i32) -> KvCache {
        KvCache {
            offset,
            recurrent: Some(Box::new(RecurrentState::new(conv, ssm))),
            ..KvCache::default()
        }
    }

    /// Bytes held by the buffers (a remote layer's: those its rank holds, grown in steps as
    /// here).
    pub fn nbytes(&self) -> usize {
        if let Some(r) = &self.remote {
            let positions = (self.offset + STEP - 1) / STEP * STEP;
            return positions as usize * r.bytes_per_position;
        }
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}

/// A model's caches and the tokens they hold, position by position: what a generation may
/// start from, and what it leaves behind for the next (the prefix cache keeps these).
#[derive(Clone, Default)]
pub struct KvState {
    pub tokens: Vec<u32>,
    /// One per layer, each holding exactly `tokens.len()` positions.
    pub layers: Vec<KvCache>,
    /// The MTP head's cache, when the generation drafted with it. Its position p pairs the
    /// main model's hidden state at p with token p + 1, so it holds at most
    /// `tokens.len() - 1` positions: `mtp.offset()` of them are valid.
    pub mtp: Option<KvCache>,
}

impl KvState {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether every layer can be cut back to its first `n` positions.
    pub fn can_truncate(&self, n: usize) -> bool {
        let cut = self.tokens.len().saturating_sub(n) as i32;
        n <= self.tokens.len() && self.layers.iter().all(|c| c.can_trim(cut))
    }

    /// Cut back to the first `n` tokens (the MTP cache to at most `n` pairs); false, and
    /// nothing changed, if a layer cannot.
    pub fn truncate(&mut self, n: usize) -> bool {
        if !self.can_truncate(n) {
            return false;
        }
        let cut = (self.tokens.len() - n) as i32;
        for c in &mut self.layers {
            c.trim(cut);
        }
        self.tokens.truncate(n);
        if let Some(m) = &mut self.mtp {
            let extra = m.offset() - n as i32;
            if extra > 0 && m.trim(extra) != extra {
                self.mtp = None;
            }
        }
        true
    }

    /// Bytes held by the buffers (shared with clones).
    pub fn nbytes(&self) -> usize {
        self.layers.iter().chain(self.mtp.iter()).map(|c| c.nbytes()).sum()
    }
}

#[cfg(test)]
#[path = "kv_cache_tests.rs"]
mod tests;
