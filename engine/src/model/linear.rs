//! Linear layers, dense or MLX affine-quantized (with an optional LoRA pair on top), and token
//! embeddings, which double as the output head when tied.

use mlx_rs::ops::{self, concatenate};
use mlx_rs::{Array, Dtype};

use std::sync::Arc;

use super::host_matrix::HostMatrix;
use super::weights::Weights;

/// Output heads smaller than this stay in MLX.
const HOST_HEAD_MIN_ELEMENTS: usize = 16 << 20;
use super::ModelConfig;
use crate::error::{EngineError, Result};

/// MLX affine quantization parameters of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
}

pub enum Linear {
    /// `host`: the 8-bit copy every product but training's reads on the CPU backend
    /// (`host_matrix`); `weight`, loaded lazily by MLX, is then never read.
    Dense {
        weight: Array,
        bias: Option<Array>,
        host: Option<Arc<HostMatrix>>,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        bias: Option<Array>,
        spec: QuantSpec,
    },
}

impl Linear {
    /// Load `{prefix}.weight` (and `.scales`/`.biases` when quantized) for an `in -> out` map.
    pub fn load(
        w: &mut Weights,
        cfg: &ModelConfig,
        prefix: &str,
        inp: i32,
        out: i32,
        bias: bool,
    ) -> Result<Linear> {
        let bias = if bias { Some(w.take(&format!("{prefix}.bias"), &[out])?) } else { None };
        if let Some(spec) = quant_of(w, cfg, prefix)? {
            let (weight, scales, biases) = load_quantized(w, prefix, inp, out, spec)?;
            return Ok(Linear::Quantized { weight, scales, biases, bias, spec });
        }
        let weight = w.take(&format!("{prefix}.weight"), &[out, inp])?;
        Ok(Linear::Dense { weight, bias, host: None })
    }

    /// With the host copy of its weight when one is exact (CPU backend, dense weights only).
    pub fn with_host(self, w: &mut Weights) -> Result<Linear> {
        Ok(match self {
            Linear::Dense { weight, bias, host: None } => {
                let host = w.host_copy(&weight)?;
                Linear::Dense { weight, bias, host }
            }
            other => other,
        })
    }

    /// The host copy, when this layer has one and no bias (the whole product is the copy's).
    pub fn host_only(&self) -> Option<&HostMatrix> {
        match self {
            Linear::Dense { host: Some(h), bias: None, .. } => Some(h),
            _ => None,
        }
    }

    /// Rows `x` (each the layer's input width) through the host copy, the bias added as
    /// `forward` adds it: `None` without a copy, or with a bias that is not f32.
    pub fn host_values(&self, x: &[f32]) -> Option<Vec<f32>> {
        let Linear::Dense { host: Some(h), bias, .. } = self else { return None };
        let bias = match bias {
            Some(b) => Some(b.try_as_slice::<f32>().ok()?),
            None => None,
        };
        let mut y = h.product(x);
        if let Some(b) = bias {
            for row in y.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
        Some(y)
    }

    /// One layer computing all of `parts` (same input, outputs side by side): one matmul
    /// instead of several. Per-operation overhead, not bandwidth, dominates small layers on
    /// the CPU backend. Returns the parts unchanged when they cannot be stacked.
    pub fn stack(parts: Vec<Linear>) -> std::result::Result<Linear, Vec<Linear>> {
        let cat = |xs: Vec<&Array>| concatenate(&xs, 0);
        let all_dense = parts.iter().all(|p| matches!(p, Linear::Dense { .. }));
        let biases: Vec<Option<&Array>> = parts
            .iter()
            .map(|p| match p {
                Linear::Dense { bias, .. } | Linear::Quantized { bias, .. } => bias.as_ref(),
            })
            .collect();
        let bias_all = biases.iter().all(|b| b.is_some());
        if !bias_all && biases.iter().any(|b| b.is_some()) {
            return Err(parts);
        }
        let bias = if bias_all { cat(biases.into_iter().flatten().collect()).ok() } else { None };
        if all_dense {
            let ws: Vec<&Array> = parts
                .iter()
                .map(|p| match p {
                    Linear::Dense { weight, .. } => weight,
                    _ => unreachable!(),
                })
                .collect();
            return match cat(ws) {
                Ok(weight) => Ok(Linear::Dense { weight, bias, host: None }),
                Err(_) => Err(parts),
            };
        }
        let specs: Vec<Option<QuantSpec>> = parts
            .iter()
            .map(|p| match p {
                Linear::Quantized { spec, .. } => Some(*spec),
                _ => None,
            })
            .collect();
        match specs[0] {
            Some(spec) if specs.iter().all(|s| *s == Some(spec)) => {
                let pick = |f: fn(&Linear) -> &Array| cat(parts.iter().map(f).collect());
                let w = pick(|p| match p {
                    Linear::Quantized { weight, .. } => weight,
                    _ => unreachable!(),
                });
                let sc = pick(|p| match p {
                    Linear::Quantized { scales, .. } => scales,
                    _ => unreachable!(),
                });
                let bi = pick(|p| match p {
                    Linear::Quantized { biases, .. } => biases,
                    _ => unreachable!(),
                });
                match (w, sc, bi) {
                    (Ok(weight), Ok(scales), Ok(biases)) => {
                        Ok(Linear::Quantized { weight, scales, biases, bias, spec })
                    }
                    _ => Err(parts),
                }
            }
            _ => Err(parts),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = match self {
            // The host copy, where it can serve this product (see `HostMatrix::takes`).
            Linear::Dense { host: Some(h), bias, .. } if h.takes(x) => match bias {
                Some(b) => h.forward(x)?.add(b)?,
                None => h.forward(x)?,
            },
            Linear::Dense { weight, bias: Some(b), .. } => {
                ops::addmm(b, x, weight.t(), None, None)?
            }
            Linear::Dense { weight, bias: None, .. } => x.matmul(weight.t())?,
            Linear::Quantized { weight, scales, biases, bias, spec } => {
                let y = ops::quantized_matmul(
                    x,
                    weight,
                    scales,
                    biases,
                    true,
                    spec.group_size,
                    spec.bits,
                )?;
                match bias {
                    Some(b) => y.add(b)?,
                    None => y,
                }
            }
        };
        Ok(y)
    }
}

/// Token embeddings; also serves as the output projection when embeddings are tied.
pub enum Embedding {
    /// `host`: the 8-bit copy of a large table (CPU backend, `host_matrix`). Lookups and
    /// tied heads read it, so the f32 table, loaded lazily by MLX, is only read by what needs
    /// it as an array (training's graph).
    Dense {
        table: Array,
        host: Option<Arc<HostMatrix>>,
    },
    Quantized {
        weight: Array,
        scales: Array,
        biases: Array,
        spec: QuantSpec,
    },
}

impl Embedding {
    pub fn load(
        w: &mut Weights,
        cfg: &ModelConfig,
        prefix: &str,
        vocab: i32,
        hidden: i32,
    ) -> Result<Embedding> {
        if let Some(spec) = quant_of(w, cfg, prefix)? {
            let (weight, scales, biases) = load_quantized(w, prefix, hidden, vocab, spec)?;
            return Ok(Embedding::Quantized { weight, scales, biases, spec });
        }
        let table = w.take(&format!("{prefix}.weight"), &[vocab, hidden])?;
        // Small tables (the fixtures') stay in MLX: its matmul is the better choice there.
        let host = match table.size() >= HOST_HEAD_MIN_ELEMENTS {
            true => w.host_copy(&table)?,
            false => None,
        };
        Ok(Embedding::Dense { table, host })
    }

    pub fn forward(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { host: Some(host), .. } => host.gather(ids)?,
            Embedding::Dense { table, host: None } => table.take_axis(ids, 0)?,
            Embedding::Quantized { weight, scales, biases, spec } => ops::dequantize(
                weight.take_axis(ids, 0)?,
                scales.take_axis(ids, 0)?,
                &biases.take_axis(ids, 0)?,
                spec.group_size,
                spec.bits,
            )?,
        })
    }

    /// The host copy of the table, when it has one.
    pub fn host(&self) -> Option<&HostMatrix> {
        match self {
            Embedding::Dense { host, .. } => host.as_deref(),
            Embedding::Quantized { .. } => None,
        }
    }

    /// `x @ table.T`: the tied language-model head, through MLX.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Embedding::Dense { table, .. } => x.matmul(table.t())?,
            Embedding::Quantized { weight, scales, biases, spec } => {
                ops::quantized_matmul(x, weight, scales, biases, true, spec.group_size, spec.bits)?
            }
        })
    }
}

fn quant_of(w: &Weights, cfg: &ModelConfig, prefix: &str) -> Result<Option<QuantSpec>> {
    if !w.contains(&format!("{prefix}.scales")) {
        return Ok(None);
    }
    cfg.quant_for(prefix).map(Some).ok_or_else(|| EngineError::BadWeights {
        file: w.file_of(&format!("{prefix}.scales")),
        msg: format!("`{prefix}` is quantized but config.json has no `quantization` section"),
    })
}

fn load_quantized(
    w: &mut Weights,
    prefix: &str,
    inp: i32,
    out: i32,
    spec: QuantSpec,
) -> Result<(Array, Array, Array)> {
    let packed = inp * spec.bits / 32;
    let groups = inp / spec.group_size;
    let name = format!("{prefix}.weight");
    let file = w.file_of(&name);
    let weight = w.take_raw(&name)?;
    if weight.shape() != [out, packed] || weight.dtype() != Dtype::Uint32 {
        return Err(EngineError::ShapeMismatch {
            file,
            tensor: name,
            found: weight.shape().to_vec(),
            expected: vec![out, packed],
        });
    }
    // Scales stay in the compute dtype: bf16 scales are ~8x slower on the CPU backend.
    let scales = w.take(&format!("{prefix}.scales"), &[out, groups])?;
    let biases = w.take(&format!("{prefix}.biases"), &[out, groups])?;
    Ok((weight, scales, biases))
}
