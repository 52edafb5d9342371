//! A weight matrix read from an 8-bit copy on the host, for the CPU backend's decode steps
//!: every projection and the output head of a one-token step.
//!
//! On the Linux CPU backend MLX computes in f32 over OpenBLAS, so a decode step reads four
//! bytes per weight; its M=1 sgemm streams them at ~11 GB/s. Weights imported from a GGUF's
//! quantized blocks hold few distinct values per block: Q4_K and Q5_K blocks of 32 are
//! `scale * q - offset` with q < 16 or 32, Q8_0 and Q5_0 blocks of 32 and Q6_K's sub-blocks of
//! 16 are `scale * q`. Such a block is stored here as bytes `q` (0..=255) with an f32 scale and
//! offset: 1.25 bytes per weight with blocks of 32, 1.5 with blocks of 16, read by a
//! two-thread dot-product loop (AVX2/FMA intrinsics when the CPU has them, with a software
//! prefetch: on a 2-core EPYC the hardware's alone left the loop at ~16 of 36 GB/s).
//!
//! It is only used when it is exact: every value of the matrix is recovered from its block's
//! bytes up to f32 rounding (checked at load), so the outputs equal the f32 matmul's up to
//! summation order. Any other matrix (fixtures' random weights, a model saved in f32 or bf16
//! from training) keeps MLX's matmul, so no model's output changes because of this shortcut.
//! `PERCH_NO_HOST_HEAD` set in the environment turns the whole host path off.

use mlx_rs::Array;

use crate::error::{EngineError, Result};

mod gemm;
mod store;
pub(crate) use gemm::{available as sgemm_available, sgemm_rows, Rows, FEW};
pub use store::HostStore;

/// Whether the host path may be used at all in this process (CPU backend, not switched off).
pub fn enabled() -> bool {
    !cfg!(target_os = "macos") && std::env::var_os("PERCH_NO_HOST_HEAD").is_none()
}

thread_local! {
    static IN_GRAPH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While the returned guard lives, this thread's forward passes build MLX graphs only, as
/// training's gradients need: a host product's output has no edge back to its input.
pub fn graph_only() -> GraphOnly {
    GraphOnly(IN_GRAPH.with(|g| g.replace(true)))
}

/// See `graph_only`; restores the previous state when dropped.
pub struct GraphOnly(bool);

impl Drop for GraphOnly {
    fn drop(&mut self) {
        IN_GRAPH.with(|g| g.set(self.0));
    }
}

/// Whether a `graph_only` guard is alive on this thread.
pub(crate) fn building_graph() -> bool {
    IN_GRAPH.with(|g| g.get())
}

/// The threads products run on: one per core, up to 8.
pub(crate) fn pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 8);
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("perch-host-{i}"))
            .build()
            .expect("a thread pool for host products")
    })
}

/// Products of fewer weights than this run on the calling thread.
const SMALL: usize = 1 << 18;

pub struct HostMatrix {
    rows: usize,
    cols: usize,
    block: usize,
    quants: Vec<u8>,
    /// Per block: the step between levels and the value of level 0.
    scales: Vec<f32>,
    offsets: Vec<f32>,
}

impl HostMatrix {
    /// The 8-bit copy of `weight` ([rows, cols] floating point), with blocks of 32 or else 16
    /// along each row; `None` when no such copy reproduces every value or the path is off.
    pub fn new(weight: &Array) -> Result<Option<HostMatrix>> {
        if !enabled() || weight.ndim() != 2 {
            return Ok(None);
        }
        let (rows, cols) = (weight.shape()[0] as usize, weight.shape()[1] as usize);
        let f32s = weight.as_dtype(mlx_rs::Dtype::Float32)?;
        f32s.eval()?;
        let data = f32s.as_slice::<f32>();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 8);
        let found = [32, 16].into_iter().filter(|b| cols % b == 0).find_map(|block| {
            let n = rows * cols / block;
            let (mut quants, mut scales, mut offsets) =
                (vec![0u8; rows * cols], vec![0f32; n], vec![0f32; n]);
            // Blocks split between threads; any block without an exact copy fails the size.
            let per = n.div_ceil(threads);
            let ok = std::thread::scope(|s| {
                let parts = data
                    .chunks(per * block)
                    .zip(quants.chunks_mut(per * block))
                    .zip(scales.chunks_mut(per).zip(offsets.chunks_mut(per)))
                    .map(|((values, q), (sc, off))| {
                        s.spawn(move || {
                            let mut hint = 255.0;
                            for (((v, q), sc), off) in values
                                .chunks_exact(block)
                                .zip(q.chunks_exact_mut(block))
                                .zip(sc.iter_mut())
                                .zip(off.iter_mut())
                            {
                                let Some((a, b)) = levels(v, q, &mut hint) else { return false };
                                (*sc, *off) = (a, b);
                            }
                            true
                        })
                    })
                    .collect::<Vec<_>>();
                parts.into_iter().all(|p| p.join().unwrap_or(false))
            });
            ok.then_some(HostMatrix { rows, cols, block, quants, scales, offsets })
        });
        match &found {
            Some(m) => {
                tracing::debug!("host copy of a {rows}x{cols} matrix, blocks of {}", m.block)
            }
            None => tracing::debug!("no exact host copy of a {rows}x{cols} matrix: MLX keeps it"),
        }
        Ok(found)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Whether this copy can compute `x @ W.T` here: `x` ends in `cols` values, no gradient
    /// is being built (`graph_only`), and a product of many vectors has an sgemm to run on.
    pub fn takes(&self, x: &Array) -> bool {
        let vectors = x.size() / self.cols;
        x.shape().last() == Some(&(self.cols as i32))
            && !building_graph()
            && (vectors <= gemm::FEW || gemm::available())
    }

    /// Rows `ids` (of shape S) as values: [S.., cols] f32, each `offset + step * q`, the value
    /// the copy was checked to reproduce. A tied embedding table is read this way, so its f32
    /// tensor is never loaded.
    pub fn gather(&self, ids: &Array) -> Result<Array> {
        let ids = ids.as_dtype(mlx_rs::Dtype::Int64)?;
        ids.eval()?;
        let blocks = self.cols / self.block;
        let mut out = Vec::with_capacity(ids.size() * self.cols);
        for &id in ids.as_slice::<i64>() {
            let row = usize::try_from(id).ok().filter(|&r| r < self.rows).ok_or_else(|| {
                EngineError::Internal(format!("token id {id} outside the {} rows", self.rows))
            })?;
            let q = &self.quants[row * self.cols..(row + 1) * self.cols];
            for (b, q) in q.chunks_exact(self.block).enumerate() {
                let (d, m) = (self.scales[row * blocks + b], self.offsets[row * blocks + b]);
                out.extend(q.iter().map(|&q| m + d * q as f32));
            }
        }
        let mut shape = ids.shape().to_vec();
        shape.push(self.cols as i32);
        Ok(Array::from_slice(&out, &shape))
    }

    /// `h @ W.T` for `h` of shape [.., L, cols]: [.., L, rows] in `h`'s dtype. A few vectors
    /// read the copy directly, each row once for all of them; more go through sgemm (`gemm`).
    /// Callers check `takes` first.
    pub fn forward(&self, h: &Array) -> Result<Array> {
        let mut shape = h.shape().to_vec();
        let x = h.as_dtype(mlx_rs::Dtype::Float32)?.contiguous()?;
        x.eval()?;
        let x = x.as_slice::<f32>();
        let vectors = x.len() / self.cols;
        let out = match vectors <= gemm::FEW {
            true => self.product(x),
            false => self.gemm(x, vectors).ok_or_else(|| {
                EngineError::Internal("a product of many vectors without sgemm".into())
            })?,
        };
        *shape.last_mut().unwrap() = self.rows as i32;
        Ok(Array::from_slice(&out, &shape).as_dtype(h.dtype())?)
    }

    /// `x @ W.T` for L vectors of `cols` values side by side: L vectors of `rows` values.
    pub fn product(&self, x: &[f32]) -> Vec<f32> {
        // Several vectors (a batch's step) are read at a 64-byte boundary, so the loop's loads
        // never straddle two cache lines: four sequences' step 62 -> 60 ms, eight 115 -> 110
        // (Qwen 0.5B, `perch bench --scenario batch`). One vector's loop waits on memory.
        let mut aligned = vec![];
        let x = match x.len() / self.cols {
            1 => x,
            _ => {
                aligned.resize(x.len() + 16, 0f32);
                let at = aligned.as_ptr().align_offset(64).min(16);
                aligned[at..at + x.len()].copy_from_slice(x);
                &aligned[at..at + x.len()]
            }
        };
        let l = x.len() / self.cols;
        // Per vector and block: the sum of its values (the offsets' share of each dot).
        let sums: Vec<f32> = x.chunks_exact(self.block).map(|c| c.iter().sum()).collect();
        // Handing work to the pool costs more than a small product saves.
        let threads = match self.rows * self.cols * l {
            n if n < SMALL => 1,
            _ => pool().current_num_threads(),
        };
        // [rows, L]: each worker fills whole rows; transposed to [L, rows] below when L > 1.
        let mut out = vec![0f32; self.rows * l];
        if threads == 1 {
            self.rows_into(0, &mut out, x, &sums, l);
        } else {
            let per = self.rows.div_ceil(threads);
            let sums = &sums;
            // The pool's threads stay up between products: starting threads for each one
            // cost more than the small products take.
            pool().scope(|s| {
                for (t, part) in out.chunks_mut(per * l).enumerate() {
                    s.spawn(move |_| self.rows_into(t * per, part, x, sums, l));
                }
            });
        }
        if l == 1 {
            return out;
        }
        let mut t = vec![0f32; self.rows * l];
        for (i, values) in out.chunks_exact(l).enumerate() {
            for (j, v) in values.iter().enumerate() {
                t[j * self.rows + i] = *v;
            }
        }
        t
    }

    fn rows_into(&self, first: usize, out: &mut [f32], x: &[f32], sums: &[f32], l: usize) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected on this CPU.
            unsafe { self.rows_into_avx2(first, out, x, sums, l) };
            return;
        }
        self.rows_into_plain(first, out, x, sums, l);
    }

    /// One row at a time, for up to four vectors at once: each eight weights are widened
    /// once and multiplied into every vector's accumulators (a batch's decode step: widening
    /// once per vector made four vectors cost four times one). One vector keeps `row_avx2`;
    /// the sums are accumulated in the same order, so a vector's result does not depend on
    /// the others beside it. Measured on Qwen 0.5B's 9728x896 gate/up (2-core EPYC, AVX2,
    /// `many_vector_speed`): one vector 7.4 ms, two 11.9 ms, four 14.2 ms. (Two or four rows
    /// at a time, sharing the vector's loads, ran the 152k-row head 1.7 to 2.2x slower from
    /// memory.)
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_into_avx2(
        &self,
        first: usize,
        out: &mut [f32],
        x: &[f32],
        sums: &[f32],
        l: usize,
    ) {
        let blocks = self.cols / self.block;
        for (i, o) in out.chunks_exact_mut(l).enumerate() {
            let row = first + i;
            let mut j = 0;
            while j < l {
                let n = (l - j).min(4);
                let xs = &x[j * self.cols..(j + n) * self.cols];
                let ss = &sums[j * blocks..(j + n) * blocks];
                let o = &mut o[j..j + n];
                // SAFETY: `row` is a row of this matrix; `xs` holds `n` vectors of `cols`.
                match (self.block, n) {
                    (32, 1) => o[0] = self.row_avx2::<32>(row, xs, ss),
                    (_, 1) => o[0] = self.row_avx2::<16>(row, xs, ss),
                    (32, 2) => self.rows_avx2_many::<32, 2>(row, xs, ss, o),
                    (_, 2) => self.rows_avx2_many::<16, 2>(row, xs, ss, o),
                    (32, 3) => self.rows_avx2_many::<32, 3>(row, xs, ss, o),
                    (_, 3) => self.rows_avx2_many::<16, 3>(row, xs, ss, o),
                    (32, _) => self.rows_avx2_many::<32, 4>(row, xs, ss, o),
                    (_, _) => self.rows_avx2_many::<16, 4>(row, xs, ss, o),
                }
                j += n;
            }
        }
    }

    /// `row_avx2` for `N` vectors side by side (`x`: N vectors of `cols`, `sums`: their block
    /// sums), each with its own two accumulators, summed as `row_avx2` sums one.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2_many<const B: usize, const N: usize>(
        &self,
        row: usize,
        x: &[f32],
        sums: &[f32],
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let (blocks, cols) = (self.cols / B, self.cols);
        let q = self.quants.as_ptr().add(row * cols);
        let d = &self.scales[row * blocks..(row + 1) * blocks];
        let mut total = [_mm256_setzero_ps(); N];
        for (blk, step) in d.iter().enumerate() {
            let mut acc = [[_mm256_setzero_ps(); 2]; N];
            if (blk * B).is_multiple_of(64) {
                _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(blk * B + 2048).cast());
            }
            for k in 0..B / 8 {
                let at = blk * B + k * 8;
                // SAFETY: `at + 8 <= cols` for the row and for each of the N vectors.
                let w = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(at).cast())));
                for (v, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.as_ptr().add(v * cols + at));
                    acc[k % 2] = _mm256_fmadd_ps(w, xv, acc[k % 2]);
                }
            }
            let step = _mm256_set1_ps(*step);
            for (t, acc) in total.iter_mut().zip(&acc) {
                *t = _mm256_fmadd_ps(step, _mm256_add_ps(acc[0], acc[1]), *t);
            }
        }
        let m = &self.offsets[row * blocks..(row + 1) * blocks];
        for (v, (o, t)) in out.iter_mut().zip(&total).enumerate() {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *t);
            let s = &sums[v * blocks..(v + 1) * blocks];
            let shift: f32 = m.iter().zip(s).map(|(m, s)| m * s).sum();
            *o = lanes.iter().sum::<f32>() + shift;
        }
    }

    /// A row's dot with `x`, eight lanes: bytes widened to f32 and multiplied by the vector
    /// into two accumulators, folded into the total by the block's step at the block's end
    /// (one multiply per eight weights, where scaling each product cost two); the offsets'
    /// share is the dot of the row's offsets with the vector's block sums.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_avx2<const B: usize>(&self, row: usize, x: &[f32], sums: &[f32]) -> f32 {
        use std::arch::x86_64::*;
        let (blocks, cols) = (self.cols / B, self.cols);
        let q = self.quants.as_ptr().add(row * cols);
        let d = &self.scales[row * blocks..(row + 1) * blocks];
        let mut total = _mm256_setzero_ps();
        for (blk, step) in d.iter().enumerate() {
            let mut acc = [_mm256_setzero_ps(); 2];
            // 2 KiB ahead, once per cache line: a 152k-row head went 10.5 -> 6 ms.
            if (blk * B).is_multiple_of(64) {
                _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(blk * B + 2048).cast());
            }
            for k in 0..B / 8 {
                let at = blk * B + k * 8;
                // SAFETY: `at + 8 <= cols` for the row and `x` (cols is a multiple of B).
                let qi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(at).cast()));
                let xv = _mm256_loadu_ps(x.as_ptr().add(at));
                acc[k % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi), xv, acc[k % 2]);
            }
            total = _mm256_fmadd_ps(_mm256_set1_ps(*step), _mm256_add_ps(acc[0], acc[1]), total);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), total);
        let m = &self.offsets[row * blocks..(row + 1) * blocks];
        let shift: f32 = m.iter().zip(sums).map(|(m, s)| m * s).sum();
        lanes.iter().sum::<f32>() + shift
    }

    /// The same sums without SIMD intrinsics (other CPUs; the compiler vectorizes what it can).
    fn rows_into_plain(&self, first: usize, out: &mut [f32], x: &[f32], sums: &[f32], l: usize) {
        let (b, blocks) = (self.block, self.cols / self.block);
        for (i, o) in out.chunks_exact_mut(l).enumerate() {
            let row = first + i;
            let q = &self.quants[row * self.cols..(row + 1) * self.cols];
            for (j, o) in o.iter_mut().enumerate() {
                let xv = &x[j * self.cols..(j + 1) * self.cols];
                let mut total = 0f32;
                for blk in 0..blocks {
                    let at = blk * b;
                    let dot: f32 = q[at..at + b]
                        .iter()
                        .zip(&xv[at..at + b])
                        .map(|(&q, &x)| q as f32 * x)
                        .sum();
                    total += self.scales[row * blocks + blk] * dot
                        + self.offsets[row * blocks + blk] * sums[j * blocks + blk];
                }
                *o = total;
            }
        }
    }
}

/// A block as `offset + scale * q` with q in 0..=255, written into `q`; `None` when that does
/// not give back every value (up to f32 rounding: 1e-6 of the block's largest magnitude).
/// `hint`: the number of steps that fitted the block before (neighbouring blocks of one tensor
/// come from the same format), tried first.
fn levels(values: &[f32], q: &mut [u8], hint: &mut f32) -> Option<(f32, f32)> {
    let (lo, hi) = values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() || !hi.is_finite() {
        return None;
    }
    if hi == lo {
        q.fill(0);
        return Some((0.0, lo));
    }
    let span = hi - lo;
    let near_whole = |r: f32| (r - r.round()).abs() < 1e-3;
    let fits = |n: f32| values.iter().all(|v| near_whole((v - lo) / span * n));
    // The previous block's count first; 255 steps hold any span of 1, 3, 5, 15, 17, 51 or 85
    // steps (Q4_K's 0..15 among them); then every count in turn (a wrong one fails on its
    // first or second value).
    let steps = [*hint, 255.0].into_iter().chain((1..=255).map(|n| n as f32)).find(|&n| fits(n))?;
    *hint = steps;
    let scale = span / steps;
    let tol = lo.abs().max(hi.abs()) * 1e-6;
    for (v, q) in values.iter().zip(q.iter_mut()) {
        let level = ((v - lo) / scale).round();
        if !(0.0..=255.0).contains(&level) || (lo + scale * level - v).abs() > tol {
            return None;
        }
        *q = level as u8;
    }
    Some((scale, lo))
}

// The host path is off on macOS (Metal runs MLX's own ops), so its tests are too.
#[cfg(all(test, not(target_os = "macos")))]
mod tests;
