//! BERT (`model_type: bert`), the encoder behind sentence-transformers models such as
//! all-MiniLM-L6-v2: word + position + token-type embeddings and a LayerNorm, then post-norm
//! blocks (bidirectional attention with biases, exact-erf GELU MLP). Padded batches: a mask
//! keeps every sequence from seeing its padding, so a sentence's vectors do not depend on
//! what it was batched with beyond float rounding.

use mlx_rs::fast::{layer_norm, scaled_dot_product_attention};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

use super::linear::Linear;
use super::weights::Weights;
use super::ModelConfig;
use crate::error::Result;

struct Norm {
    weight: Array,
    bias: Array,
}

impl Norm {
    fn load(w: &mut Weights, prefix: &str, hidden: i32) -> Result<Norm> {
        Ok(Norm {
            weight: w.take(&format!("{prefix}.weight"), &[hidden])?,
            bias: w.take(&format!("{prefix}.bias"), &[hidden])?,
        })
    }

    fn forward(&self, x: &Array, eps: f32) -> Result<Array> {
        Ok(layer_norm(x, &self.weight, &self.bias, eps)?)
    }
}

struct Block {
    /// Query, key and value as one product (their outputs side by side).
    qkv: Linear,
    out: Linear,
    attention_norm: Norm,
    up: Linear,
    down: Linear,
    output_norm: Norm,
}

pub struct Bert {
    words: Array,
    positions: Array,
    token_type: Array,
    embed_norm: Norm,
    blocks: Vec<Block>,
    heads: i32,
    hidden: i32,
    eps: f32,
    pub max_positions: usize,
}

impl Bert {
    pub fn load(cfg: &ModelConfig, w: &mut Weights) -> Result<Bert> {
        let hidden = cfg.int("hidden_size")?;
        let heads = cfg.int("num_attention_heads")?;
        let inter = cfg.int("intermediate_size")?;
        let vocab = cfg.int("vocab_size")?;
        let max_positions = cfg.int_or("max_position_embeddings", 512)?;
        let types = cfg.int_or("type_vocab_size", 2)?;
        if hidden <= 0 || heads <= 0 || hidden % heads != 0 || inter <= 0 || max_positions <= 0 {
            return Err(cfg.err(format!(
                "hidden_size {hidden} must be a positive multiple of num_attention_heads {heads}, \
                 with positive intermediate_size and max_position_embeddings"
            )));
        }
        match cfg.raw.get("hidden_act").and_then(|v| v.as_str()).unwrap_or("gelu") {
            "gelu" => {}
            other => {
                return Err(cfg.err(format!("hidden_act `{other}` is not supported (gelu is)")))
            }
        }
        match cfg.raw.get("position_embedding_type").and_then(|v| v.as_str()).unwrap_or("absolute")
        {
            "absolute" => {}
            other => {
                return Err(cfg.err(format!(
                    "position_embedding_type `{other}` is not supported (absolute is)"
                )))
            }
        }
        // Checkpoints saved by some versions carry these buffers; nothing reads them.
        w.remove_unused("embeddings.position_ids");
        // The pooler (a dense layer over [CLS]) is BertModel's, not the sentence embedding's:
        // sentence-transformers pools the last hidden states.
        w.remove_unused("pooler.dense.weight");
        w.remove_unused("pooler.dense.bias");
        let p = "embeddings";
        let words = w.take(&format!("{p}.word_embeddings.weight"), &[vocab, hidden])?;
        let positions =
            w.take(&format!("{p}.position_embeddings.weight"), &[max_positions, hidden])?;
        let token_type = w
            .take(&format!("{p}.token_type_embeddings.weight"), &[types, hidden])?
            .index((0..1, ..));
        let embed_norm = Norm::load(w, &format!("{p}.LayerNorm"), hidden)?;
        let mut blocks = vec![];
        for i in 0..cfg.int("num_hidden_layers")? {
            let b = format!("encoder.layer.{i}");
            let linear = |w: &mut Weights, name: &str, inp, out| {
                Linear::load(w, cfg, &format!("{b}.{name}"), inp, out, true)
            };
            let q = linear(w, "attention.self.query", hidden, hidden)?;
            let k = linear(w, "attention.self.key", hidden, hidden)?;
            let v = linear(w, "attention.self.value", hidden, hidden)?;
            let qkv = Linear::stack(vec![q, k, v]).map_err(|_| {
                cfg.err(format!("{b}: query, key and value must share one format to be read"))
            })?;
            blocks.push(Block {
                qkv,
                out: linear(w, "attention.output.dense", hidden, hidden)?,
                attention_norm: Norm::load(w, &format!("{b}.attention.output.LayerNorm"), hidden)?,
                up: linear(w, "intermediate.dense", hidden, inter)?,
                down: linear(w, "output.dense", inter, hidden)?,
                output_norm: Norm::load(w, &format!("{b}.output.LayerNorm"), hidden)?,
            });
        }
        let eps = cfg.float_or("layer_norm_eps", 1e-12)? as f32;
        Ok(Bert {
            words,
            positions,
            token_type,
            embed_norm,
            blocks,
            heads,
            hidden,
            eps,
            max_positions: max_positions as usize,
        })
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden as usize
    }

    /// Whether this encoder runs packed (`forward_packed`): on the host path (CPU backend,
    /// f32), where attention runs sequence by sequence and no step needs a padded shape.
    pub fn packs(&self) -> bool {
        super::host_matrix::enabled()
            && super::host_matrix::sgemm_available()
            && self.dtype() == Dtype::Float32
    }

    /// `ids` [B, L] int32 (padded), `mask` [B, L] float (1 for tokens, 0 for padding) → the
    /// last hidden states [B, L, hidden], attention through MLX (the Metal path; the CPU
    /// backend runs `forward_packed`).
    pub fn forward(&self, ids: &Array, mask: &Array) -> Result<Array> {
        let (b, l) = (ids.shape()[0], ids.shape()[1]);
        let x = self.words.take_axis(ids, 0)?;
        let x = x.add(self.positions.index((0..l, ..)))?.add(&self.token_type)?;
        let x = self.embed_norm.forward(&x, self.eps)?;
        // Padding gets a large negative score in every row (not -inf: a row of padding only,
        // which no real sequence has, must not turn into NaN).
        let bias = mask.subtract(Array::from_f32(1.0))?.multiply(Array::from_f32(1e9))?;
        let bias = bias.reshape(&[b, 1, 1, l])?.as_dtype(x.dtype())?;
        let d = self.hidden / self.heads;
        let scale = (d as f32).powf(-0.5);
        self.blocks(x, |qkv| {
            let heads = |i: i32| -> Result<Array> {
                let part = qkv.index((.., .., i * self.hidden..(i + 1) * self.hidden));
                Ok(part.reshape(&[b, l, self.heads, d])?.transpose_axes(&[0, 2, 1, 3])?)
            };
            let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
            let a = scaled_dot_product_attention(&q, &k, &v, scale, &bias, None)?;
            Ok(a.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, self.hidden])?)
        })
    }

    /// `ids` [N]: B sequences' tokens one after another, `lens` their lengths → the last
    /// hidden states [N, hidden]. No padding is computed: every step but attention treats
    /// rows alone, and attention runs per sequence on the host. Only where `packs()`.
    pub fn forward_packed(&self, ids: &[i32], lens: &[usize]) -> Result<Array> {
        let n = ids.len() as i32;
        let positions: Vec<i32> = lens.iter().flat_map(|&l| 0..l as i32).collect();
        let x = self.words.take_axis(Array::from_slice(ids, &[n]), 0)?;
        let x = x
            .add(self.positions.take_axis(Array::from_slice(&positions, &[n]), 0)?)?
            .add(&self.token_type)?;
        let x = self.embed_norm.forward(&x, self.eps)?;
        let mut spans = Vec::with_capacity(lens.len());
        let mut at = 0;
        for &len in lens {
            spans.push((at, len));
            at += len;
        }
        self.blocks(x, |qkv| self.host_attention(qkv, &spans))
    }

    /// The post-norm blocks over `x` (any leading shape), attention by `attend`: [.., 3 ·
    /// hidden] of query, key and value → [.., hidden].
    fn blocks(&self, mut x: Array, attend: impl Fn(&Array) -> Result<Array>) -> Result<Array> {
        for block in &self.blocks {
            let a = attend(&block.qkv.forward(&x)?)?;
            x = block.attention_norm.forward(&x.add(block.out.forward(&a)?)?, self.eps)?;
            let up = block.up.forward(&x)?;
            // MLX's CPU erf is a scalar loop on one core (host_gelu.rs); Metal's is not.
            let h = if super::host_matrix::enabled() {
                super::host_gelu::gelu_array(&up)?
            } else {
                mlx_rs::nn::gelu(up)?
            };
            x = block.output_norm.forward(&x.add(block.down.forward(&h)?)?, self.eps)?;
        }
        Ok(x)
    }

    /// Attention on the host (CPU backend): each sequence over its own tokens only, so no
    /// padding is multiplied. MLX's CPU softmax runs its `exp` on one core, scalar: for 32
    /// sequences of 32 tokens it cost as much as a layer's largest product
    /// (`host_attention.rs` has the figures). `qkv` [N, 3 · hidden] → [N, hidden]; sequence
    /// `s` is rows `spans[s].0..spans[s].0 + spans[s].1`, and rows in no span are zero.
    fn host_attention(&self, qkv: &Array, spans: &[(usize, usize)]) -> Result<Array> {
        use super::host_attention::{attend, Cached, Mask};
        let rows = qkv.shape()[0];
        let qkv = super::host_step::values(qkv)?;
        let (hidden, heads) = (self.hidden as usize, self.heads as usize);
        let d = hidden / heads;
        let scale = (d as f32).powf(-0.5);
        let mut out = vec![0f32; rows as usize * hidden];
        for &(first, n) in spans {
            // [heads, n, d] for each of q, k and v, from rows [q | k | v].
            let split = |part: usize| {
                let mut v = vec![0f32; heads * n * d];
                for t in 0..n {
                    let row = &qkv[(first + t) * 3 * hidden + part * hidden..][..hidden];
                    for h in 0..heads {
                        v[(h * n + t) * d..][..d].copy_from_slice(&row[h * d..][..d]);
                    }
                }
                v
            };
            let (q, k, v) = (split(0), split(1), split(2));
            let cached = Cached {
                keys: &k,
                values: &v,
                kv_heads: heads,
                capacity: n,
                len: n,
                key_dim: d,
                value_dim: d,
            };
            let a = attend(&q, heads, n, &cached, scale, &Mask::None);
            out[first * hidden..][..n * hidden].copy_from_slice(&a);
        }
        Ok(Array::from_slice(&out, &[rows, self.hidden]))
    }

    /// The dtype its weights compute in.
    pub fn dtype(&self) -> Dtype {
        self.words.dtype()
    }
}
