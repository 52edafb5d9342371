//! The output head of a big-vocabulary model, computed on the host from an int8 copy, for the
//! CPU backend's decode steps.
//!
//! On the Linux CPU backend the tied head of Gemma 3 270M (262144 x 640) is 671 MB of f32 per
//! token, and OpenBLAS's M=1 sgemm reads it at ~11 GB/s: 60 ms, more than the 18 layers
//! together (see the Gemma issue's profile). MLX's CPU quantized matmul is slower still. An
//! int8 copy with one f32 scale per 32 values (llama.cpp's Q8_0 layout) is 4x fewer bytes, and
//! a plain two-thread dot-product loop reads it near memory speed.
//!
//! It is only used when it is exact: when every value of the table is recovered from the int8
//! copy (weights that came from a Q8_0 GGUF tensor and were stored in f32, like the default
//! model's `token_embd`). Then the logits equal the f32 head's up to summation order. Any other
//! table keeps MLX's head, so no model's output changes because of this shortcut.

use mlx_rs::Array;

use crate::error::Result;

const BLOCK: usize = 32;

/// Heads smaller than this stay in MLX (the fixtures, small vocabularies).
pub const MIN_ELEMENTS: usize = 16 << 20;

pub struct HostHead {
    rows: usize,
    cols: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
}

impl HostHead {
    /// Quantize `table` ([rows, cols] floating point, cols a multiple of 32).
    pub fn new(table: &Array) -> Result<Option<HostHead>> {
        let (rows, cols) = (table.shape()[0] as usize, table.shape()[1] as usize);
        if cfg!(target_os = "macos") || rows * cols < MIN_ELEMENTS || cols % BLOCK != 0 {
            return Ok(None);
        }
        let f32s = table.as_dtype(mlx_rs::Dtype::Float32)?;
        f32s.eval()?;
        let data = f32s.as_slice::<f32>();
        let mut quants = vec![0i8; rows * cols];
        let mut scales = vec![0f32; rows * cols / BLOCK];
        for (b, (block, q)) in
            data.chunks_exact(BLOCK).zip(quants.chunks_exact_mut(BLOCK)).enumerate()
        {
            let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = amax / 127.0;
            scales[b] = d;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (qi, x) in q.iter_mut().zip(block) {
                *qi = (x * inv).round().clamp(-127.0, 127.0) as i8;
                // Exact up to the rounding of the recomputed scale, or not used at all.
                if (d * *qi as f32 - x).abs() > amax * 1e-6 {
                    return Ok(None);
                }
            }
        }
        Ok(Some(HostHead { rows, cols, quants, scales }))
    }

    /// Logits [1, L, rows] for hidden states `h` ([1, L, cols]). Each table row is read once
    /// for all L states, so verifying a few drafted tokens costs about as much as one step.
    pub fn forward(&self, h: &Array) -> Result<Array> {
        let l = h.shape()[1] as usize;
        let h = h.as_dtype(mlx_rs::Dtype::Float32)?;
        h.eval()?;
        let x = h.as_slice::<f32>();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 8);
        let per = self.rows.div_ceil(threads);
        // Each thread fills [its rows, L]; transposed to [L, rows] below.
        let mut parts = vec![Vec::new(); self.rows.div_ceil(per)];
        std::thread::scope(|s| {
            for (t, part) in parts.iter_mut().enumerate() {
                let first = t * per;
                let n = per.min(self.rows - first);
                s.spawn(move || {
                    *part = vec![0f32; n * l];
                    self.rows_into(first, part, x, l);
                });
            }
        });
        let mut out = vec![0f32; self.rows * l];
        for (t, part) in parts.iter().enumerate() {
            for (i, values) in part.chunks_exact(l).enumerate() {
                for (j, v) in values.iter().enumerate() {
                    out[j * self.rows + t * per + i] = *v;
                }
            }
        }
        Ok(Array::from_slice(&out, &[1, l as i32, self.rows as i32]))
    }

    fn rows_into(&self, first: usize, out: &mut [f32], x: &[f32], l: usize) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected on this CPU.
            unsafe { self.rows_into_avx2(first, out, x, l) };
            return;
        }
        self.rows_into_plain(first, out, x, l);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_into_avx2(&self, first: usize, out: &mut [f32], x: &[f32], l: usize) {
        self.rows_into_plain(first, out, x, l);
    }

    /// Written so the compiler vectorizes the 32-wide block into 8-lane FMAs (with AVX2 when
    /// called from above): fixed-size arrays, no bounds checks in the inner loops.
    #[inline(always)]
    fn rows_into_plain(&self, first: usize, out: &mut [f32], x: &[f32], l: usize) {
        let blocks = self.cols / BLOCK;
        let xs: Vec<&[f32; BLOCK]> = x.chunks_exact(BLOCK).map(|c| c.try_into().unwrap()).collect();
        for (i, o) in out.chunks_exact_mut(l).enumerate() {
            let row = first + i;
            let q = &self.quants[row * self.cols..(row + 1) * self.cols];
            let d = &self.scales[row * blocks..(row + 1) * blocks];
            for (j, o) in o.iter_mut().enumerate() {
                let xs = &xs[j * blocks..(j + 1) * blocks];
                let mut acc = [0f32; 8];
                for ((qb, xb), &scale) in q.chunks_exact(BLOCK).zip(xs).zip(d) {
                    let qb: &[i8; BLOCK] = qb.try_into().unwrap();
                    let mut sum = [0f32; 8];
                    for k in 0..BLOCK / 8 {
                        for l in 0..8 {
                            sum[l] += qb[k * 8 + l] as f32 * xb[k * 8 + l];
                        }
                    }
                    for l in 0..8 {
                        acc[l] += scale * sum[l];
                    }
                }
                *o = acc.iter().sum();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_f32_matvec_and_recovers_q8_values_exactly() {
        // A table whose rows are already Q8_0 values (scale * int), as a Q8_0 GGUF yields.
        let (rows, cols) = (4096usize, 4096usize); // 16M elements: just at the threshold
        let mut data = vec![0f32; rows * cols];
        let mut seed = 12345u64;
        for (b, block) in data.chunks_mut(BLOCK).enumerate() {
            let d = 0.001 + (b % 97) as f32 * 1e-4;
            for (j, v) in block.iter_mut().enumerate() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let q = ((seed >> 33) % 255) as i32 - 127;
                *v = d * if j == 0 { 127.0 } else { q as f32 };
            }
        }
        let table = Array::from_slice(&data, &[rows as i32, cols as i32]);
        let head = HostHead::new(&table).unwrap().expect("large enough for the host head");
        // Three hidden states at once, as when verifying drafted tokens.
        let x: Vec<f32> = (0..3 * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
        let h = Array::from_slice(&x, &[1, 3, cols as i32]);
        let got = head.forward(&h).unwrap();
        let want = h.matmul(table.t()).unwrap();
        let (got, want) = (got.as_slice::<f32>(), want.as_slice::<f32>());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(err < 1e-5, "host head differs from the f32 matvec by {err:.2e} relative");
    }

    #[test]
    fn a_table_that_is_not_int8_exact_keeps_the_mlx_head() {
        let (rows, cols) = (4096usize, 4096usize);
        let data: Vec<f32> =
            (0..rows * cols).map(|i| ((i * 2654435761) % 1000) as f32 / 997.0 - 0.5).collect();
        let table = Array::from_slice(&data, &[rows as i32, cols as i32]);
        assert!(HostHead::new(&table).unwrap().is_none());
    }
}
