//! A decode step's attention with no MLX operation in it (CPU backend): for
//! sequences feeding one token each, the fused q/k/v product from its host copy, the q/k
//! norms, RoPE, the cache written in place (`KvCache::host_append`), attention over it
//! (`host_attention::attend`) and the output projection, all on the host.
//!
//! Through MLX, each sequence's attention in a step was some fifteen small operations (row
//! slices, reshapes, transposes, two RoPEs, two cache writes, views, an evaluation) at 25-30
//! µs each: about 10 ms of a Qwen2.5-0.5B step per sequence, a fifth of one sequence's step
//! and most of what four sequences added beyond their products.

use mlx_rs::{Array, Dtype};

use super::host_attention::{attend, Cached, Mask};
use super::host_matrix::{self, FEW};
use super::host_step;
use super::kv_cache::KvCache;
use super::layers::{Attention, Rope};
use super::lora::LayerLora;
use crate::error::Result;

impl Attention {
    /// `forward_rows` on the host when every sequence feeds one row, the layer has host
    /// copies of its fused projections and no adapter, and every cache takes host writes;
    /// `None` otherwise (the MLX path then runs).
    pub(super) fn host_rows(
        &self,
        x: &Array,
        caches: &mut [&mut KvCache],
        lens: &[i32],
        lora: Option<&LayerLora>,
    ) -> Result<Option<Array>> {
        let (heads, kv_heads, hd) =
            (self.heads as usize, self.kv_heads as usize, self.head_dim as usize);
        if lora.is_some()
            || x.dtype() != Dtype::Float32
            || !host_matrix::enabled()
            || host_matrix::building_graph()
            || lens.len() > FEW
            || lens.iter().any(|&l| l != 1)
            || heads % kv_heads.max(1) != 0
            || !caches.iter().all(|c| c.host_ready(kv_heads, hd, hd))
        {
            return Ok(None);
        }
        let xs = host_step::values(x)?;
        let Some(qkv) = self.qkv.host_values(&xs) else { return Ok(None) };
        let (q_out, kv_out) = (heads * hd, kv_heads * hd);
        let mut out = Vec::with_capacity(lens.len() * q_out);
        for (row, cache) in qkv.chunks_exact(q_out + 2 * kv_out).zip(caches.iter_mut()) {
            let (q, rest) = row.split_at(q_out);
            let (k, v) = rest.split_at(kv_out);
            let mut q = match &self.q_norm {
                Some(n) => n.host(q)?,
                None => q.to_vec(),
            };
            let mut k = match &self.k_norm {
                Some(n) => n.host(k)?,
                None => k.to_vec(),
            };
            let position = cache.offset();
            self.rope.host(&mut q, hd, position);
            self.rope.host(&mut k, hd, position);
            let view = cache.host_append(&k, v)?;
            let cached = Cached {
                keys: view.keys,
                values: view.values,
                kv_heads,
                capacity: view.capacity,
                len: view.len,
                key_dim: hd,
                value_dim: hd,
            };
            let mask = match &view.visible {
                Some(rows) => Mask::Allowed { rows, stride: 0 },
                None => Mask::None,
            };
            out.extend(attend(&q, heads, 1, &cached, self.scale, &mask));
        }
        let shape = [1, lens.len() as i32, q_out as i32];
        let y = match self.o.host_values(&out) {
            Some(y) => {
                Array::from_slice(&y, &[1, lens.len() as i32, (y.len() / lens.len()) as i32])
            }
            None => self.o.forward(&Array::from_slice(&out, &shape))?,
        };
        Ok(Some(y))
    }
}

impl Rope {
    /// RoPE on the host for one position: `x` holds heads of `head_dim` values, each
    /// rotated in place as MLX's kernel rotates it (its first `dims` values; angles
    /// `position · scale · inverse frequency` in f32, the halves or the pairs rotated with
    /// the products rounded before they are summed).
    pub fn host(&self, x: &mut [f32], head_dim: usize, position: i32) {
        let (dims, traditional, scale, inverse) = match self {
            Rope::Base { dims, traditional, scale, inverse, .. } => {
                (*dims as usize, *traditional, *scale, inverse)
            }
            Rope::Freqs { dims, traditional, inverse, .. } => {
                (*dims as usize, *traditional, 1.0, inverse)
            }
        };
        let half = dims / 2;
        let at = position as f32 * scale;
        let angles: Vec<(f32, f32)> = inverse
            .iter()
            .map(|inv| {
                let theta = at * inv;
                (theta.cos(), theta.sin())
            })
            .collect();
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in angles.iter().enumerate() {
                let (a, b) = if traditional { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (x1, x2) = (head[a], head[b]);
                head[a] = x1 * c - x2 * s;
                head[b] = x1 * s + x2 * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_rope_is_mlx_s() {
        // Half-split and paired rotations, a scaled base, a partial rotary width and explicit
        // periods, at positions from 0 to past 4k (where an angle's f32 rounding shows).
        let periods: Vec<f32> = (0..16).map(|i| 500_000f32.powf(i as f32 / 16.0) * 1.5).collect();
        let ropes = [
            Rope::base(64, 10_000.0, 1.0, false).unwrap(),
            Rope::base(64, 1_000_000.0, 0.25, true).unwrap(),
            Rope::base(32, 10_000.0, 1.0, false).unwrap(),
            Rope::periods(32, &periods, false),
        ];
        let (heads, hd) = (3usize, 64usize);
        let x: Vec<f32> = (0..heads * hd).map(|i| ((i * 7919) % 211) as f32 / 50.0 - 2.0).collect();
        for (r, rope) in ropes.iter().enumerate() {
            for position in [0, 1, 37, 4099] {
                let want = rope
                    .forward(&Array::from_slice(&x, &[1, heads as i32, 1, hd as i32]), position)
                    .unwrap();
                let want = host_step::values(&want).unwrap();
                let mut got = x.clone();
                rope.host(&mut got, hd, position);
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-6, "rope {r} at {position}: differs from MLX's by {worst:e}");
            }
        }
    }
}
