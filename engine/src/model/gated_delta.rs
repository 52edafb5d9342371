//! Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5: a short causal
//! depthwise convolution over the projected queries, keys and values, then per value head a
//! state [value_dim, key_dim] that decays by a learned gate each token and is corrected
//! towards the token's value by the delta rule; the output is read from the state with the
//! query, normed per head and gated by SiLU(z). The layer's cache is a `RecurrentState`.
//!
//! The recurrence runs token by token: on the CPU backend on the host (`host_delta`),
//! elsewhere in MLX operations, as mlx-lm's own fallback does (its Metal kernel fuses the
//! same loop).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{self, concatenate, zeros_dtype};
use mlx_rs::{fast, nn, Array, Dtype};

use super::host_delta::{self, DeltaInputs};
use super::host_matrix;
use super::kv_cache::KvCache;
use super::layers::Projections;
use super::linear::Linear;
use super::recurrent_state::ROLLBACK_TOKENS;
use super::weights::Weights;
use super::ModelConfig;
use crate::error::{EngineError, Result};

/// The layer's widths, from `linear_*` keys of the config.
#[derive(Clone, Copy)]
pub struct DeltaShape {
    pub hidden: i32,
    pub k_heads: i32,
    pub v_heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
    pub kernel: i32,
    pub eps: f32,
}

impl DeltaShape {
    pub fn from_config(cfg: &ModelConfig) -> Result<DeltaShape> {
        let s = DeltaShape {
            hidden: cfg.int("hidden_size")?,
            k_heads: cfg.int_or("linear_num_key_heads", 16)?,
            v_heads: cfg.int_or("linear_num_value_heads", 32)?,
            k_dim: cfg.int_or("linear_key_head_dim", 128)?,
            v_dim: cfg.int_or("linear_value_head_dim", 128)?,
            kernel: cfg.int_or("linear_conv_kernel_dim", 4)?,
            eps: cfg.float_or("rms_norm_eps", 1e-6)? as f32,
        };
        let positive = [s.k_heads, s.v_heads, s.k_dim, s.v_dim, s.kernel].iter().all(|&d| d > 0);
        if !positive || s.v_heads % s.k_heads != 0 || s.kernel < 2 {
            return Err(cfg.err(format!(
                "linear attention needs positive widths, value heads ({}) a multiple of key \
                 heads ({}) and a convolution of at least 2 ({})",
                s.v_heads, s.k_heads, s.kernel
            )));
        }
        Ok(s)
    }

    fn key_width(&self) -> i32 {
        self.k_heads * self.k_dim
    }

    fn value_width(&self) -> i32 {
        self.v_heads * self.v_dim
    }

    /// Channels of the convolution: queries, keys and values side by side.
    fn channels(&self) -> i32 {
        2 * self.key_width() + self.value_width()
    }
}

pub struct GatedDeltaNet {
    /// qkv, z, b (the update strength β before its sigmoid), a (the decay's input).
    proj: Projections,
    /// [channels, kernel, 1], as MLX's depthwise conv1d wants it.
    conv: Array,
    dt_bias: Array,
    /// exp(A_log), f32.
    decay_rate: Array,
    norm: Array,
    out: Linear,
    s: DeltaShape,
}

impl GatedDeltaNet {
    pub fn load(
        w: &mut Weights,
        cfg: &ModelConfig,
        prefix: &str,
        s: DeltaShape,
    ) -> Result<GatedDeltaNet> {
        let (h, c, vw) = (s.hidden, s.channels(), s.value_width());
        let lin = |w: &mut Weights, n: &str, out| {
            Linear::load(w, cfg, &format!("{prefix}.{n}"), h, out, false)
        };
        let parts = vec![
            lin(w, "in_proj_qkv", c)?,
            lin(w, "in_proj_z", vw)?,
            lin(w, "in_proj_b", s.v_heads)?,
            lin(w, "in_proj_a", s.v_heads)?,
        ];
        let proj = Projections::new(w, parts, vec![c, vw, s.v_heads, s.v_heads])?;
        // MLX's layout is [channels, kernel, 1]; Hugging Face's [channels, 1, kernel].
        let name = format!("{prefix}.conv1d.weight");
        let conv = match w.contains(&name) {
            true => {
                let raw = w.take_raw(&name)?;
                let conv = match raw.shape() {
                    [ch, 1, k] if *ch == c && *k == s.kernel => raw.swap_axes(1, 2)?,
                    [ch, k, 1] if *ch == c && *k == s.kernel => raw,
                    other => {
                        return Err(EngineError::ShapeMismatch {
                            file: w.file_of(&name),
                            tensor: name,
                            found: other.to_vec(),
                            expected: vec![c, s.kernel, 1],
                        })
                    }
                };
                w.to_compute(conv)?
            }
            false => w.take(&name, &[c, s.kernel, 1])?,
        };
        let a_log = w.take_raw(&format!("{prefix}.A_log"))?;
        if a_log.shape() != [s.v_heads] {
            return Err(EngineError::ShapeMismatch {
                file: w.file_of(prefix),
                tensor: format!("{prefix}.A_log"),
                found: a_log.shape().to_vec(),
                expected: vec![s.v_heads],
            });
        }
        Ok(GatedDeltaNet {
            proj,
            conv,
            dt_bias: w.take(&format!("{prefix}.dt_bias"), &[s.v_heads])?,
            decay_rate: a_log.as_dtype(Dtype::Float32)?.exp()?,
            norm: w.take(&format!("{prefix}.norm.weight"), &[s.v_dim])?,
            out: Linear::load(w, cfg, &format!("{prefix}.out_proj"), vw, h, false)?.with_host(w)?,
            s,
        })
    }

    /// A batched step (`x`: [1, T, hidden]; sequence i owns the next `lens[i]` rows and
    /// `caches[i]`), or one sequence ([B, L, hidden] with one cache). The projections read
    /// their weights once for all rows; each sequence runs its own recurrence.
    pub fn forward_rows(
        &self,
        x: &Array,
        caches: &mut [&mut KvCache],
        lens: &[i32],
    ) -> Result<Array> {
        let mut parts = self.proj.forward(x)?.into_iter();
        let mut next = || parts.next().ok_or_else(|| EngineError::Internal("projection".into()));
        let (qkv, z, b, a) = (next()?, next()?, next()?, next()?);
        let y = match caches {
            [cache] => self.mix(&qkv, &b, &a, cache)?,
            _ => {
                let mut outs = Vec::with_capacity(caches.len());
                let mut start = 0;
                for (cache, &l) in caches.iter_mut().zip(lens) {
                    let rows = |t: &Array| t.index((.., start..start + l, ..));
                    outs.push(self.mix(&rows(&qkv), &rows(&b), &rows(&a), cache)?);
                    start += l;
                }
                concatenate(&outs, 1)?
            }
        };
        let (bs, l) = (x.shape()[0], x.shape()[1]);
        // The gated norm: RMS norm per head, times SiLU(z), in f32.
        let z = z.reshape(&[bs, l, self.s.v_heads, self.s.v_dim])?;
        let normed = fast::rms_norm(&y, Some(&self.norm), self.s.eps)?.as_dtype(Dtype::Float32)?;
        let gated =
            nn::silu(z.as_dtype(Dtype::Float32)?)?.multiply(&normed)?.as_dtype(x.dtype())?;
        self.out.forward(&gated.reshape(&[bs, l, self.s.value_width()])?)
    }

    /// One sequence: convolution and recurrence over its rows ([B, L, ..]) from its cache's
    /// state, which it then advances. Returns [B, L, v_heads, v_dim].
    fn mix(&self, qkv: &Array, b: &Array, a: &Array, cache: &mut KvCache) -> Result<Array> {
        let s = &self.s;
        let (bs, l) = (qkv.shape()[0], qkv.shape()[1]);
        let keep = s.kernel - 1;
        let (conv_state, mut state) = match cache.recurrent() {
            Some(r) => (r.conv.clone(), r.ssm.clone()),
            None => (
                zeros_dtype(&[bs, keep, s.channels()], qkv.dtype())?,
                zeros_dtype(&[bs, s.v_heads, s.v_dim, s.k_dim], Dtype::Float32)?,
            ),
        };
        let input = concatenate(&[&conv_state, qkv], 1)?;
        let mixed = nn::silu(ops::conv1d(&input, &self.conv, 1, 0, 1, s.channels())?)?;
        let (kw, rep) = (s.key_width(), s.v_heads / s.k_heads);
        let heads = |t: Array, h: i32, d: i32| t.reshape(&[bs, l, h, d]);
        let q = heads(mixed.index((.., .., ..kw)), s.k_heads, s.k_dim)?;
        let k = heads(mixed.index((.., .., kw..2 * kw)), s.k_heads, s.k_dim)?;
        let v = heads(mixed.index((.., .., 2 * kw..)), s.v_heads, s.v_dim)?;
        // L2-normed queries and keys, the readout scale 1/sqrt(key_dim) folded into q: RMS
        // norm is the L2 norm times sqrt(d), its epsilon scaled to match the reference's.
        let inv = (s.k_dim as f32).powf(-0.5);
        let eps = 1e-6 * inv * inv;
        let q = fast::rms_norm(&q, None, eps)?.multiply(Array::from_f32(inv * inv))?;
        let k = fast::rms_norm(&k, None, eps)?.multiply(Array::from_f32(inv))?;
        let (q, k) = match rep {
            1 => (q, k),
            _ => (Array::repeat_axis::<f32>(q, rep, 2)?, Array::repeat_axis::<f32>(k, rep, 2)?),
        };
        let beta = nn::sigmoid(b)?;
        let soft = nn::softplus(a.add(&self.dt_bias)?.as_dtype(Dtype::Float32)?)?;
        let decay = self.decay_rate.negative()?.multiply(&soft)?.exp()?;
        let short = l <= ROLLBACK_TOKENS;
        let conv_before = |t: i32| input.index((.., t..t + keep, ..));
        if host_matrix::enabled() {
            let x = DeltaInputs { q: &q, k: &k, v: &v, beta: &beta, decay: &decay, state: &state };
            let (y, state, before) = host_delta::run(x, short)?;
            let history = before.into_iter().enumerate();
            let history = history.map(|(t, s)| (conv_before(t as i32), s)).collect();
            cache.advance_recurrent(input.index((.., l.., ..)), state, l, history);
            return Ok(y.as_dtype(qkv.dtype())?);
        }
        let mut history = Vec::new();
        let mut ys = Vec::with_capacity(l as usize);
        for t in 0..l {
            if short {
                history.push((conv_before(t), state.clone()));
            }
            let at = |x: &Array| x.index((.., t, ..));
            let (qt, kt, vt) = (at(&q), at(&k).expand_dims(2)?, at(&v));
            let g = at(&decay).expand_dims_axes(&[2, 3])?;
            state = state.multiply(&g)?;
            let remembered = state.multiply(&kt)?.sum_axis(-1, None)?;
            let delta = vt.subtract(&remembered)?.multiply(at(&beta).expand_dims(2)?)?;
            state = state.add(kt.multiply(delta.expand_dims(3)?)?)?;
            let y = state.multiply(qt.expand_dims(2)?)?.sum_axis(-1, None)?;
            ys.push(y.as_dtype(qkv.dtype())?);
        }
        let conv_next = input.index((.., l.., ..));
        cache.advance_recurrent(conv_next, state, l, history);
        Ok(ops::stack(&ys, 1)?)
    }
}
