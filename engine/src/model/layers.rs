//! Small pieces every architecture shares: RMS norm, rotary embeddings, attention, the SwiGLU
//! MLP, the pre-norm block and the decoder stack (linear layers and embeddings are in
//! `linear`).

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

use super::host_attention;
use super::host_matrix::{self, HostMatrix};
use super::host_step;
use super::linear::{Embedding, Linear};
use super::weights::Weights;
use super::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::kv_cache::{AttentionMask, KvCache};
use crate::model::lora::{layer_of, LayerLora, Lora, ProjectionDims, Target};

pub struct RmsNorm {
    weight: Array,
    eps: f32,
    /// The weight's values, read at a host step's first use of the norm.
    host: std::sync::OnceLock<Vec<f32>>,
}

impl RmsNorm {
    pub fn load(w: &mut Weights, name: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.take(&format!("{name}.weight"), &[dim])?,
            eps,
            host: <_>::default(),
        })
    }

    /// Gemma's norm scales by (1 + weight); folding the 1 in at load keeps the forward fused.
    pub fn load_plus_one(w: &mut Weights, name: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        let weight = w.take(&format!("{name}.weight"), &[dim])?;
        Ok(RmsNorm { weight: weight.add(Array::from_f32(1.0))?, eps, host: <_>::default() })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }

    /// The norm of one vector on the host (`host_step`).
    pub fn host(&self, x: &[f32]) -> Result<Vec<f32>> {
        let weight = match self.host.get() {
            Some(w) => w,
            None => {
                let w = host_step::values(&self.weight)?;
                self.host.get_or_init(|| w)
            }
        };
        // Row by row (a batch's decode step has one per sequence), each normed alone.
        Ok(x.chunks(weight.len())
            .flat_map(|row| host_step::rms_norm(row, weight, self.eps))
            .collect())
    }
}

/// Rotary position embedding, with the scalings Llama-family configs use. `inverse` holds
/// the inverse frequencies as MLX's kernel computes them, for the host's decode steps
/// (`host_decode_attention`).
pub enum Rope {
    Base {
        dims: i32,
        base: f32,
        scale: f32,
        traditional: bool,
        inverse: Vec<f32>,
    },
    /// Explicit per-dimension periods (Llama 3 scaling), passed to MLX's fused kernel.
    Freqs {
        dims: i32,
        freqs: Array,
        traditional: bool,
        inverse: Vec<f32>,
    },
}

impl Rope {
    /// RoPE with inverse frequencies `base^(-i / (dims / 2))`, angles scaled by `scale`.
    pub fn base(dims: i32, base: f32, scale: f32, traditional: bool) -> Result<Rope> {
        // As MLX's kernel on the CPU: exp(-i · (log(base) / (dims / 2))) in f32, through MLX's
        // own exp and log (a libm exp differs by an ulp, which position 4k turns into 1e-4).
        let half = dims / 2;
        let step = Array::from_f32(base).log()?.divide(Array::from_f32(half as f32))?;
        let inverse =
            mlx_rs::ops::arange::<_, f32>(0.0, -(half as f64), -1.0)?.multiply(&step)?.exp()?;
        let inverse = host_step::values(&inverse)?;
        Ok(Rope::Base { dims, base, scale, traditional, inverse })
    }

    /// RoPE with explicit periods (one per rotated pair).
    pub fn periods(dims: i32, periods: &[f32], traditional: bool) -> Rope {
        Rope::Freqs {
            dims,
            freqs: Array::from_slice(periods, &[periods.len() as i32]),
            traditional,
            inverse: periods.iter().map(|p| 1.0 / p).collect(),
        }
    }

    pub fn from_config(cfg: &ModelConfig, dims: i32, base: f32) -> Result<Rope> {
        let traditional = cfg.bool_or("rope_traditional", false);
        let Some(scaling) = cfg.raw.get("rope_scaling").filter(|v| !v.is_null()) else {
            return Rope::base(dims, base, 1.0, traditional);
        };
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let num =
            |key: &str, default: f64| scaling.get(key).and_then(|v| v.as_f64()).unwrap_or(default);
        match kind {
            "default" => Rope::base(dims, base, 1.0, traditional),
            "linear" => Rope::base(dims, base, 1.0 / num("factor", 1.0) as f32, traditional),
            "llama3" => {
                let freqs = llama3_periods(
                    dims,
                    base as f64,
                    num("factor", 8.0),
                    num("low_freq_factor", 1.0),
                    num("high_freq_factor", 4.0),
                    num("original_max_position_embeddings", 8192.0),
                );
                Ok(Rope::periods(dims, &freqs, traditional))
            }
            other => Err(EngineError::Config {
                file: cfg.file.clone(),
                msg: format!(
                    "rope_scaling type `{other}` is not supported (default, linear, llama3 are)"
                ),
            }),
        }
    }

    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(match self {
            Rope::Base { dims, base, scale, traditional, .. } => {
                fast::rope(x, *dims, *traditional, *base, *scale, offset, None)?
            }
            Rope::Freqs { dims, freqs, traditional, .. } => {
                fast::rope(x, *dims, *traditional, None, 1.0, offset, freqs)?
            }
        })
    }
}

/// Llama 3's frequency-dependent stretch: long wavelengths are slowed by `factor`, short ones
/// kept, and the band between is interpolated. Returns periods (base^(2i/d)), as MLX expects.
fn llama3_periods(
    dims: i32,
    base: f64,
    factor: f64,
    low: f64,
    high: f64,
    old_ctx: f64,
) -> Vec<f32> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    (0..dims / 2)
        .map(|i| {
            let period = base.powf(2.0 * i as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI * period;
            let p = if wavelen > low_wavelen { period * factor } else { period };
            if wavelen > high_wavelen && wavelen < low_wavelen {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (p / ((1.0 - smooth) / factor + smooth)) as f32
            } else {
                p as f32
            }
        })
        .collect()
}

/// Shape of one attention layer.
pub struct AttentionShape {
    pub hidden: i32,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub qkv_bias: bool,
    pub out_bias: bool,
    /// Per-head RMS norm on queries and keys (Qwen 3, Gemma 3), with this epsilon.
    pub qk_norm_eps: Option<f32>,
    /// Gemma's q/k norms scale by (1 + weight).
    pub qk_norm_plus_one: bool,
    /// Softmax scale; default 1/sqrt(head_dim).
    pub scale: Option<f32>,
}

/// Several projections of the same input, stacked into one matmul when possible.
pub struct Projections {
    fused: Option<Linear>,
    separate: Vec<Linear>,
    /// Output width of each part.
    widths: Vec<i32>,
}

impl Projections {
    pub fn new(w: &mut Weights, parts: Vec<Linear>, widths: Vec<i32>) -> Result<Projections> {
        match Linear::stack(parts) {
            Ok(fused) => {
                Ok(Projections { fused: Some(fused.with_host(w)?), separate: vec![], widths })
            }
            Err(parts) => {
                let separate = parts.into_iter().map(|p| p.with_host(w)).collect::<Result<_>>()?;
                Ok(Projections { fused: None, separate, widths })
            }
        }
    }

    /// The fused layer's host copy, when it has one and no bias.
    fn host_only(&self) -> Option<&HostMatrix> {
        self.fused.as_ref().and_then(Linear::host_only)
    }

    /// Every part's output for rows `x` on the host, side by side (`Linear::host_values`);
    /// `None` unless the parts are fused into one layer with a host copy.
    pub fn host_values(&self, x: &[f32]) -> Option<Vec<f32>> {
        self.fused.as_ref()?.host_values(x)
    }

    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        let Some(fused) = &self.fused else {
            return self.separate.iter().map(|p| p.forward(x)).collect();
        };
        let y = fused.forward(x)?;
        let mut start = 0;
        Ok(self
            .widths
            .iter()
            .map(|w| {
                let part = y.index((.., .., start..start + w));
                start += w;
                part
            })
            .collect())
    }
}

pub struct Attention {
    pub(super) qkv: Projections,
    pub(super) o: Linear,
    pub(super) q_norm: Option<RmsNorm>,
    pub(super) k_norm: Option<RmsNorm>,
    pub(super) rope: Rope,
    pub(super) heads: i32,
    pub(super) kv_heads: i32,
    pub(super) head_dim: i32,
    pub(super) scale: f32,
}

impl Attention {
    pub fn load(
        w: &mut Weights,
        cfg: &ModelConfig,
        prefix: &str,
        s: &AttentionShape,
        rope: Rope,
    ) -> Result<Attention> {
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let norm = |w: &mut Weights, n: &str| -> Result<Option<RmsNorm>> {
            let name = format!("{prefix}.{n}");
            s.qk_norm_eps
                .map(|eps| match s.qk_norm_plus_one {
                    true => RmsNorm::load_plus_one(w, &name, s.head_dim, eps),
                    false => RmsNorm::load(w, &name, s.head_dim, eps),
                })
                .transpose()
        };
        let q = Linear::load(w, cfg, &format!("{prefix}.q_proj"), s.hidden, q_out, s.qkv_bias)?;
        let k = Linear::load(w, cfg, &format!("{prefix}.k_proj"), s.hidden, kv_out, s.qkv_bias)?;
        let v = Linear::load(w, cfg, &format!("{prefix}.v_proj"), s.hidden, kv_out, s.qkv_bias)?;
        Ok(Attention {
            qkv: Projections::new(w, vec![q, k, v], vec![q_out, kv_out, kv_out])?,
            o: Linear::load(w, cfg, &format!("{prefix}.o_proj"), q_out, s.hidden, s.out_bias)?
                .with_host(w)?,
            q_norm: norm(w, "q_norm")?,
            k_norm: norm(w, "k_norm")?,
            rope,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            scale: s.scale.unwrap_or((s.head_dim as f32).powf(-0.5)),
        })
    }

    /// `x`: [B, L, hidden]. Appends this step's keys/values to `cache`; `lora` adds an
    /// adapter's updates to the projections it targets.
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut KvCache,
        lora: Option<&LayerLora>,
    ) -> Result<Array> {
        let l = x.shape()[1];
        self.forward_rows(x, &mut [cache], &[l], lora)
    }

    /// A batched step (`x`: [1, T, hidden]): sequence i owns the next `lens[i]` rows and
    /// `caches[i]`. The projections read their weights once for all rows; each sequence
    /// attends over its own cache, at its own position.
    pub fn forward_rows(
        &self,
        x: &Array,
        caches: &mut [&mut KvCache],
        lens: &[i32],
        lora: Option<&LayerLora>,
    ) -> Result<Array> {
        if let Some(out) = self.host_rows(x, caches, lens, lora)? {
            return Ok(out);
        }
        let mut qkv = self.qkv.forward(x)?.into_iter();
        let (mut q, mut k, mut v) = (qkv.next().unwrap(), qkv.next().unwrap(), qkv.next().unwrap());
        if let Some(l) = lora {
            q = l.apply(Target::Q, x, q)?;
            k = l.apply(Target::K, x, k)?;
            v = l.apply(Target::V, x, v)?;
        }
        let out = match caches {
            [cache] => self.attend(&q, &k, &v, cache)?,
            _ => {
                let mut outs = Vec::with_capacity(caches.len());
                let mut s = 0;
                for (cache, &l) in caches.iter_mut().zip(lens) {
                    let rows = |a: &Array| a.index((.., s..s + l, ..));
                    outs.push(self.attend(&rows(&q), &rows(&k), &rows(&v), cache)?);
                    s += l;
                }
                mlx_rs::ops::concatenate(&outs, 1)?
            }
        };
        match lora {
            Some(l) => l.apply(Target::O, &out, self.o.forward(&out)?),
            None => self.o.forward(&out),
        }
    }

    /// One sequence's projected rows ([B, L, ..]) through RoPE at its cache's position, the
    /// cache, and attention: [B, L, heads * head_dim].
    fn attend(&self, q: &Array, k: &Array, v: &Array, cache: &mut KvCache) -> Result<Array> {
        let (b, l) = (q.shape()[0], q.shape()[1]);
        let split = |y: &Array, heads: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let y = y.reshape(&[b, l, heads, self.head_dim])?;
            let y = match norm {
                Some(n) => n.forward(&y)?,
                None => y,
            };
            Ok(y.transpose_axes(&[0, 2, 1, 3])?)
        };
        let q = split(q, self.heads, &self.q_norm)?;
        let k = split(k, self.kv_heads, &self.k_norm)?;
        let v = split(v, self.kv_heads, &None)?;
        let offset = cache.offset();
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        let (k, v, mask) = cache.update(&k, &v)?;
        // On the CPU backend the host computes it (see host_attention); MLX's causal mode
        // aligns the mask to the bottom right, which is what a prefix in the cache needs.
        if let Some(out) = host_attention::try_attend(&q, &k, &v, &mask, cache, self.scale)? {
            return Ok(out);
        }
        let mask = match &mask {
            AttentionMask::None => None,
            AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            AttentionMask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
        };
        let out = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask, None)?;
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, self.heads * self.head_dim])?)
    }
}

/// SwiGLU feed-forward: down(silu(gate(x)) * up(x)).
pub struct Mlp {
    gate_up: Projections,
    down: Linear,
    /// SiLU (SwiGLU) or tanh-approximated GELU (GeGLU, Gemma).
    gelu: bool,
}

impl Mlp {
    pub fn load(
        w: &mut Weights,
        cfg: &ModelConfig,
        prefix: &str,
        hidden: i32,
        inter: i32,
        bias: bool,
    ) -> Result<Mlp> {
        let gate = Linear::load(w, cfg, &format!("{prefix}.gate_proj"), hidden, inter, bias)?;
        let up = Linear::load(w, cfg, &format!("{prefix}.up_proj"), hidden, inter, bias)?;
        Ok(Mlp {
            gate_up: Projections::new(w, vec![gate, up], vec![inter, inter])?,
            down: Linear::load(w, cfg, &format!("{prefix}.down_proj"), inter, hidden, bias)?
                .with_host(w)?,
            gelu: false,
        })
    }

    pub fn load_geglu(
        w: &mut Weights,
        cfg: &ModelConfig,
        prefix: &str,
        hidden: i32,
        inter: i32,
    ) -> Result<Mlp> {
        Ok(Mlp { gelu: true, ..Mlp::load(w, cfg, prefix, hidden, inter, false)? })
    }

    /// The MLP's host copies, when it has them and no adapter changes it.
    fn host_pair(&self, lora: Option<&LayerLora>) -> Option<(&HostMatrix, &HostMatrix)> {
        match lora {
            None => self.gate_up.host_only().zip(self.down.host_only()),
            Some(_) => None,
        }
    }

    /// The host copies, when `x` is as many vectors as they take directly (a decode step's,
    /// one per sequence of the batch).
    fn host_for(&self, x: &Array, lora: Option<&LayerLora>) -> Option<(&HostMatrix, &HostMatrix)> {
        self.host_pair(lora).filter(|(gate_up, _)| {
            let cols = gate_up.cols();
            x.size().is_multiple_of(cols) && x.size() / cols <= host_matrix::FEW && gate_up.takes(x)
        })
    }

    /// Whether `x` is one vector this MLP takes on the host: the block around it may then
    /// keep its whole step there (`host_step`). f32 only, so no rounding to another dtype
    /// between the pieces is skipped.
    pub fn steps_on_host(&self, x: &Array, lora: Option<&LayerLora>) -> bool {
        x.dtype() == Dtype::Float32 && self.host_for(x, lora).is_some()
    }

    pub fn forward(&self, x: &Array, lora: Option<&LayerLora>) -> Result<Array> {
        if let Some((gate_up, down)) = self.host_for(x, lora) {
            let y = Self::host_values(self.gelu, gate_up, down, &host_step::values(x)?);
            return host_step::array(&y, x);
        }
        let mut gu = self.gate_up.forward(x)?.into_iter();
        let (mut gate, mut up) = (gu.next().unwrap(), gu.next().unwrap());
        if let Some(l) = lora {
            gate = l.apply(Target::Gate, x, gate)?;
            up = l.apply(Target::Up, x, up)?;
        }
        let g =
            if self.gelu { mlx_rs::nn::gelu_approximate(gate)? } else { mlx_rs::nn::silu(gate)? };
        let h = g.multiply(up)?;
        match lora {
            Some(l) => l.apply(Target::Down, &h, self.down.forward(&h)?),
            None => self.down.forward(&h),
        }
    }

    /// One vector through the whole MLP on the host (`steps_on_host` said yes).
    pub fn host(&self, x: &[f32]) -> Vec<f32> {
        let (gate_up, down) = self.host_pair(None).expect("steps_on_host checked the copies");
        Self::host_values(self.gelu, gate_up, down, x)
    }

    /// A few vectors through the whole MLP on the host (CPU backend, decode steps): one
    /// hand-over from MLX and back instead of two, and no MLX operations between the products.
    fn host_values(gelu: bool, gate_up: &HostMatrix, down: &HostMatrix, x: &[f32]) -> Vec<f32> {
        let gu = gate_up.product(x);
        // Each vector's gate then up (the fused matrix's rows), vector after vector.
        let mid: Vec<f32> = gu
            .chunks(gate_up.rows())
            .flat_map(|v| {
                let (gate, up) = v.split_at(v.len() / 2);
                host_step::gated(gelu, gate, up)
            })
            .collect();
        down.product(&mid)
    }
}

/// The pre-norm decoder block of the Llama family:
/// h = x + attn(norm1(x)); out = h + mlp(norm2(h)).
pub struct PreNormBlock {
    pub input_norm: RmsNorm,
    pub attention: Attention,
    pub post_attention_norm: RmsNorm,
    pub mlp: Mlp,
}

impl PreNormBlock {
    /// Load `{p}.input_layernorm`, `{p}.self_attn.*`, `{p}.post_attention_layernorm`, `{p}.mlp.*`.
    pub fn load(
        cfg: &ModelConfig,
        w: &mut Weights,
        p: &str,
        s: &StackShape,
    ) -> Result<PreNormBlock> {
        let hidden = s.attention.hidden;
        // Some exports carry precomputed rotary tables; they are derived from the config.
        w.remove_unused(&format!("{p}.self_attn.rotary_emb.inv_freq"));
        let rope = Rope::from_config(cfg, s.attention.head_dim, s.rope_base)?;
        Ok(PreNormBlock {
            input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), hidden, s.norm_eps)?,
            attention: Attention::load(w, cfg, &format!("{p}.self_attn"), &s.attention, rope)?,
            post_attention_norm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                hidden,
                s.norm_eps,
            )?,
            mlp: Mlp::load(w, cfg, &format!("{p}.mlp"), hidden, s.intermediate, s.mlp_bias)?,
        })
    }

    /// `x`: [1, T, hidden], sequence i owning the next `lens[i]` rows and `caches[i]` (one
    /// sequence: every row).
    pub fn forward(
        &self,
        x: &Array,
        caches: &mut [&mut KvCache],
        lens: &[i32],
        lora: Option<&LayerLora>,
    ) -> Result<Array> {
        if self.mlp.steps_on_host(x, lora) {
            let xs = host_step::values(x)?;
            let n = host_step::array(&self.input_norm.host(&xs)?, x)?;
            let a = self.attention.forward_rows(&n, caches, lens, None)?;
            let h = host_step::add(&xs, &host_step::values(&a)?);
            let m = self.mlp.host(&self.post_attention_norm.host(&h)?);
            return host_step::array(&host_step::add(&h, &m), x);
        }
        let n = self.input_norm.forward(x)?;
        let h = x.add(self.attention.forward_rows(&n, caches, lens, lora)?)?;
        Ok(h.add(self.mlp.forward(&self.post_attention_norm.forward(&h)?, lora)?)?)
    }
}

/// Embeddings, a stack of pre-norm blocks, a final norm and the output head: the whole of a
/// Llama-family decoder. The architecture files decide how each piece is shaped.
pub struct DecoderStack {
    pub embed: Embedding,
    pub blocks: Vec<PreNormBlock>,
    pub norm: RmsNorm,
    /// `None` when the head is tied to the embeddings.
    pub lm_head: Option<Linear>,
    pub dims: ProjectionDims,
    /// The layers after `blocks`, when other ranks run them (pipeline sharding).
    pub remote: Option<std::sync::Arc<dyn RemoteLayers>>,
}

impl DecoderStack {
    /// `tokens`: [1, T], sequence i owning the next `lens[i]` of them and `seqs[i]`.
    pub fn hidden_rows(
        &self,
        tokens: &Array,
        seqs: &mut [&mut [KvCache]],
        lens: &[i32],
        lora: Option<&Lora>,
    ) -> Result<Array> {
        let mut h = self.embed.forward(tokens)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let mut layer = layer_caches(seqs, i);
            h = block.forward(&h, &mut layer, lens, layer_of(lora, i))?;
        }
        if let Some(remote) = &self.remote {
            if lora.is_some() {
                return Err(EngineError::InvalidRequest(
                    "adapters do not run on a model sharded over several processes".into(),
                ));
            }
            h = remote.forward(&h, seqs, lens)?;
        }
        self.norm.forward(&h)
    }

    pub fn logits(&self, h: &Array) -> Result<Array> {
        match (&self.lm_head, self.embed.host()) {
            (Some(head), _) => head.forward(h),
            (None, Some(host)) if host.takes(h) => host.forward(h),
            (None, _) => self.embed.as_linear(h),
        }
    }
}

/// Layer `i`'s cache of each sequence in a batched step.
pub fn layer_caches<'c>(seqs: &'c mut [&mut [KvCache]], i: usize) -> Vec<&'c mut KvCache> {
    seqs.iter_mut().map(|c| &mut c[i]).collect()
}

/// How a Llama-family stack is shaped; the architecture files fill this in from config.json.
pub struct StackShape {
    pub attention: AttentionShape,
    pub layers: i32,
    pub intermediate: i32,
    pub vocab: i32,
    pub norm_eps: f32,
    pub rope_base: f32,
    pub mlp_bias: bool,
}

impl StackShape {
    /// The keys every Llama-family config.json shares; architectures adjust the result.
    pub fn from_llama_config(cfg: &ModelConfig, default_rope_base: f64) -> Result<StackShape> {
        let hidden = cfg.int("hidden_size")?;
        let heads = cfg.int("num_attention_heads")?;
        let attention_bias = cfg.bool_or("attention_bias", false);
        Ok(StackShape {
            attention: AttentionShape {
                hidden,
                heads,
                kv_heads: cfg.int_or("num_key_value_heads", heads)?,
                head_dim: cfg.int_or("head_dim", hidden / heads)?,
                qkv_bias: attention_bias,
                out_bias: attention_bias,
                qk_norm_eps: None,
                qk_norm_plus_one: false,
                scale: None,
            },
            layers: cfg.int("num_hidden_layers")?,
            intermediate: cfg.int("intermediate_size")?,
            vocab: cfg.int("vocab_size")?,
            norm_eps: cfg.float_or("rms_norm_eps", 1e-6)? as f32,
            rope_base: cfg.float_or("rope_theta", default_rope_base)? as f32,
            mlp_bias: cfg.bool_or("mlp_bias", false),
        })
    }
}

impl super::Architecture for DecoderStack {
    fn hidden_rows(
        &self,
        tokens: &Array,
        seqs: &mut [&mut [KvCache]],
        lens: &[i32],
        lora: Option<&Lora>,
    ) -> Result<Array> {
        DecoderStack::hidden_rows(self, tokens, seqs, lens, lora)
    }

    fn logits(&self, hidden: &Array) -> Result<Array> {
        DecoderStack::logits(self, hidden)
    }

    fn graph_logits(&self, hidden: &Array) -> Result<Array> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed.as_linear(hidden),
        }
    }

    fn projection_dims(&self) -> ProjectionDims {
        self.dims
    }

    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed.forward(tokens)
    }

    fn num_layers(&self) -> usize {
        self.blocks.len() + self.remote.as_ref().map_or(0, |r| r.count())
    }
}

impl DecoderStack {
    /// Load `model.embed_tokens`, `model.layers.N.*`, `model.norm` and `lm_head` (absent when
    /// the embeddings are tied).
    pub fn load(cfg: &ModelConfig, w: &mut Weights, s: &StackShape) -> Result<DecoderStack> {
        DecoderStack::load_ends(cfg, w, s, None)
    }

    /// `load`, holding only the layers before `remote.first()` when other ranks run the rest
    /// (their weights are dropped unread).
    pub fn load_ends(
        cfg: &ModelConfig,
        w: &mut Weights,
        s: &StackShape,
        remote: Option<std::sync::Arc<dyn RemoteLayers>>,
    ) -> Result<DecoderStack> {
        let hidden = s.attention.hidden;
        let embed = Embedding::load(w, cfg, "model.embed_tokens", s.vocab, hidden)?;
        let local = remote.as_ref().map_or(s.layers as usize, |r| r.first());
        if let Some(r) = &remote {
            if local + r.count() != s.layers as usize {
                return Err(cfg.err(format!(
                    "the shard plan covers {} layers, the model has {}",
                    local + r.count(),
                    s.layers
                )));
            }
            for i in local..s.layers as usize {
                w.remove_prefixed(&format!("model.layers.{i}."));
            }
        }
        let blocks = load_blocks(cfg, w, s, 0..local)?;
        let norm = RmsNorm::load(w, "model.norm", hidden, s.norm_eps)?;
        let tied = match cfg.raw.get("tie_word_embeddings").and_then(|v| v.as_bool()) {
            Some(tied) => tied,
            None => !w.contains("lm_head.weight"),
        };
        if tied {
            w.remove_unused("lm_head.weight");
        }
        let lm_head = if tied {
            None
        } else {
            Some(Linear::load(w, cfg, "lm_head", hidden, s.vocab, false)?.with_host(w)?)
        };
        let a = &s.attention;
        let dims = ProjectionDims {
            layers: s.layers as usize,
            hidden,
            q_out: a.heads * a.head_dim,
            kv_out: a.kv_heads * a.head_dim,
            intermediate: s.intermediate,
        };
        Ok(DecoderStack { embed, blocks, norm, lm_head, dims, remote })
    }
}

/// Layers `range` of a Llama-family stack (a rank of a sharded model holds only its own).
pub fn load_blocks(
    cfg: &ModelConfig,
    w: &mut Weights,
    s: &StackShape,
    range: std::ops::Range<usize>,
) -> Result<Vec<PreNormBlock>> {
    range.map(|i| PreNormBlock::load(cfg, w, &format!("model.layers.{i}"), s)).collect()
}

/// The layers `first..first + count` of a stack, run by other ranks.
pub trait RemoteLayers: Send + Sync {
    fn first(&self) -> usize;
    fn count(&self) -> usize;
    /// `h` [1, T, hidden] after layer `first - 1` → after the last remote layer. `seqs[i]`
    /// holds sequence i's caches of every layer (the remote ones are slots, given one at
    /// their first use and advanced by `lens[i]` here).
    fn forward(&self, h: &Array, seqs: &mut [&mut [KvCache]], lens: &[i32]) -> Result<Array>;
}
