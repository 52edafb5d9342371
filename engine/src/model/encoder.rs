//! Sentence encoders, the second kind of model Perch serves (the first: decoders that chat):
//! a folder in the sentence-transformers layout, whose `modules.json` names the network
//! (a BERT-family transformer), its pooling (`1_Pooling/config.json`) and whether vectors are
//! L2-normalised. Turns token ids into one vector per input, in padded batches.

use std::path::{Path, PathBuf};

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};
use serde_json::Value;

use super::bert::Bert;
use super::weights::Weights;
use super::ModelConfig;
use crate::error::{EngineError, Result};
use crate::platform::ComputeDtype;

/// Encoder architectures (`model_type`) Perch runs.
pub const ENCODER_ARCHITECTURES: &str = "bert";

/// Whether `model_type` names an encoder (an embedding model, never a chat model).
pub fn is_encoder(model_type: &str) -> bool {
    ENCODER_ARCHITECTURES.split(", ").any(|a| a == model_type)
}

/// How token vectors become one sentence vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the sequence's tokens (specials included, padding not).
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
    /// The element-wise maximum over the tokens.
    Max,
    /// The sum over the tokens divided by the square root of their count.
    MeanSqrtLen,
}

/// What an encoder folder says about its vectors, read without its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec {
    /// The vector's length.
    pub dims: usize,
    /// Tokens per input, special tokens included (`max_seq_length`; longer inputs are
    /// truncated or refused, as the protocol says).
    pub max_tokens: usize,
    pub pooling: Pooling,
    pub normalize: bool,
}

fn read_json(file: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(file).map_err(EngineError::io(file))?;
    serde_json::from_str(&text).map_err(|e| EngineError::Config {
        file: file.to_path_buf(),
        msg: format!("not valid JSON: {e}"),
    })
}

impl EncoderSpec {
    pub fn read(dir: &Path, cfg: &ModelConfig) -> Result<EncoderSpec> {
        let modules_file = dir.join("modules.json");
        let bad = |file: &PathBuf, msg: String| EngineError::Config { file: file.clone(), msg };
        if !modules_file.is_file() {
            return Err(bad(
                &modules_file,
                "missing: without the sentence-transformers modules the pooling is unknown".into(),
            ));
        }
        let modules = read_json(&modules_file)?;
        let Some(modules) = modules.as_array() else {
            return Err(bad(&modules_file, "expected a list of modules".into()));
        };
        let (mut pooling, mut normalize, mut transformer) = (None, false, false);
        for m in modules {
            let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
            match kind.rsplit('.').next().unwrap_or("") {
                "Transformer" => transformer = true,
                "Normalize" => normalize = true,
                "Pooling" => {
                    let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
                    // A module's folder is a plain name inside the model's folder.
                    if sub.is_empty()
                        || sub.contains("..")
                        || sub.starts_with('/')
                        || sub.contains('\\')
                    {
                        return Err(bad(
                            &modules_file,
                            format!("module path `{sub}` is not a folder name"),
                        ));
                    }
                    pooling = Some(read_pooling(&dir.join(sub).join("config.json"))?);
                }
                _ => {
                    return Err(bad(
                        &modules_file,
                        format!(
                        "module `{kind}` is not supported (Transformer, Pooling and Normalize are)"
                    ),
                    ))
                }
            }
        }
        let (Some(pooling), true) = (pooling, transformer) else {
            return Err(bad(&modules_file, "needs a Transformer and a Pooling module".into()));
        };
        let positions = cfg.int_or("max_position_embeddings", 512)?.max(1) as usize;
        let st = dir.join("sentence_bert_config.json");
        let max_seq = if st.is_file() {
            read_json(&st)?.get("max_seq_length").and_then(Value::as_u64).map(|n| n as usize)
        } else {
            None
        };
        Ok(EncoderSpec {
            dims: cfg.int("hidden_size")?.max(0) as usize,
            max_tokens: max_seq.unwrap_or(positions).clamp(1, positions),
            pooling,
            normalize,
        })
    }
}

fn read_pooling(file: &Path) -> Result<Pooling> {
    let v = read_json(file)?;
    let on = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    let named = v.get("pooling_mode").and_then(Value::as_str);
    let modes: Vec<Pooling> = [
        (on("pooling_mode_mean_tokens") || named == Some("mean"), Pooling::Mean),
        (on("pooling_mode_cls_token") || named == Some("cls"), Pooling::Cls),
        (on("pooling_mode_max_tokens") || named == Some("max"), Pooling::Max),
        (
            on("pooling_mode_mean_sqrt_len_tokens") || named == Some("mean_sqrt_len_tokens"),
            Pooling::MeanSqrtLen,
        ),
    ]
    .into_iter()
    .filter_map(|(set, p)| set.then_some(p))
    .collect();
    let unsupported = ["pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"];
    if let Some(k) = unsupported.iter().find(|k| on(k)) {
        return Err(EngineError::Config {
            file: file.to_path_buf(),
            msg: format!("`{k}` is not supported"),
        });
    }
    match modes[..] {
        [one] => Ok(one),
        _ => Err(EngineError::Config {
            file: file.to_path_buf(),
            msg: "exactly one pooling mode must be set (mean, cls, max or mean_sqrt_len_tokens)"
                .into(),
        }),
    }
}

/// A loaded encoder.
pub struct Encoder {
    pub id: String,
    pub dir: PathBuf,
    net: Bert,
    pub spec: EncoderSpec,
}

/// Sequences per forward pass, and padded tokens per pass: inputs are sorted by length, so a
/// pass pads little, and its attention scores stay a few megabytes.
const BATCH_SEQUENCES: usize = 32;
const BATCH_TOKENS: usize = 8192;

impl Encoder {
    pub fn load(dir: &Path, dtype: ComputeDtype) -> Result<Encoder> {
        let cfg = ModelConfig::read(dir)?;
        let arch = cfg.str("model_type")?;
        if !is_encoder(arch) {
            return Err(EngineError::UnknownArchitecture(arch.to_string(), ENCODER_ARCHITECTURES));
        }
        let spec = EncoderSpec::read(dir, &cfg)?;
        let mut weights = Weights::load(dir, dtype)?;
        let net = Bert::load(&cfg, &mut weights)?;
        let leftover = weights.leftover();
        if let Some(first) = leftover.first() {
            return Err(EngineError::BadWeights {
                file: weights.file_of(first),
                msg: format!(
                    "{} tensor(s) not used by the `{arch}` encoder, e.g. `{first}`",
                    leftover.len()
                ),
            });
        }
        if spec.dims != net.hidden_size() {
            return Err(cfg.err(format!(
                "hidden_size {} is not the network's {}",
                spec.dims,
                net.hidden_size()
            )));
        }
        let id = dir.file_name().and_then(|n| n.to_str()).unwrap_or("encoder").to_string();
        Ok(Encoder { id, dir: dir.to_path_buf(), net, spec })
    }

    /// One vector per input; each input is whole (special tokens in place) and at most
    /// `spec.max_tokens` long, which the caller has seen to.
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        if let Some(long) = inputs.iter().find(|i| i.len() > self.spec.max_tokens || i.is_empty()) {
            return Err(EngineError::Internal(format!(
                "an input of {} tokens reached the encoder (1 to {} fit)",
                long.len(),
                self.spec.max_tokens
            )));
        }
        let mut order: Vec<usize> = (0..inputs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(inputs[i].len()));
        let mut out = vec![vec![]; inputs.len()];
        let mut at = 0;
        while at < order.len() {
            let longest = inputs[order[at]].len();
            let fit = (BATCH_TOKENS / longest).clamp(1, BATCH_SEQUENCES);
            let group = &order[at..(at + fit).min(order.len())];
            let vectors = self.pass(group.iter().map(|&i| inputs[i].as_slice()), longest)?;
            for (&i, v) in group.iter().zip(vectors) {
                out[i] = v;
            }
            at += group.len();
        }
        Ok(out)
    }

    /// One padded forward pass and its pooling.
    fn pass<'a>(
        &self,
        seqs: impl Iterator<Item = &'a [u32]>,
        width: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let (mut ids, mut mask, mut n, mut lens) = (vec![], vec![], 0, vec![]);
        for s in seqs {
            lens.push(s.len());
            ids.extend(s.iter().map(|&t| t as i32));
            ids.extend(std::iter::repeat_n(0, width - s.len()));
            mask.extend(std::iter::repeat_n(1f32, s.len()));
            mask.extend(std::iter::repeat_n(0f32, width - s.len()));
            n += 1;
        }
        let shape = [n, width as i32];
        let ids = Array::from_slice(&ids, &shape);
        let mask = Array::from_slice(&mask, &shape);
        let h = self.net.forward(&ids, &mask, &lens)?.as_dtype(Dtype::Float32)?;
        let m = mask.reshape(&[n, width as i32, 1])?;
        let count = mask.sum_axis(1, true)?;
        let pooled = match self.spec.pooling {
            Pooling::Cls => h.index((.., 0, ..)),
            Pooling::Mean => h.multiply(&m)?.sum_axis(1, false)?.divide(&count)?,
            Pooling::MeanSqrtLen => h.multiply(&m)?.sum_axis(1, false)?.divide(count.sqrt()?)?,
            Pooling::Max => {
                let floor = Array::from_f32(f32::MIN);
                mlx_rs::ops::select(&m.gt(Array::from_f32(0.5))?, &h, &floor)?.max_axis(1, false)?
            }
        };
        let pooled = if self.spec.normalize {
            let norm = pooled.square()?.sum_axis(1, true)?.sqrt()?;
            pooled.divide(mlx_rs::ops::maximum(&norm, Array::from_f32(1e-12))?)?
        } else {
            pooled
        };
        eval([&pooled])?;
        let flat: &[f32] = pooled.as_slice();
        let dims = self.spec.dims;
        Ok(flat.chunks(dims).map(<[f32]>::to_vec).collect())
    }

    pub fn dtype(&self) -> Dtype {
        self.net.dtype()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with `config.json`, `modules.json` and the pooling config given.
    fn folder(modules: &str, pooling: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(
            p.join("config.json"),
            r#"{"model_type":"bert","hidden_size":8,"max_position_embeddings":16}"#,
        )
        .unwrap();
        std::fs::write(p.join("modules.json"), modules).unwrap();
        std::fs::create_dir_all(p.join("1_Pooling")).unwrap();
        std::fs::write(p.join("1_Pooling/config.json"), pooling).unwrap();
        dir
    }

    const ST: &str = r#"[{"type":"sentence_transformers.models.Transformer","path":""},
        {"type":"sentence_transformers.models.Pooling","path":"1_Pooling"},
        {"type":"sentence_transformers.models.Normalize","path":"2_Normalize"}]"#;

    fn spec(dir: &tempfile::TempDir) -> Result<EncoderSpec> {
        EncoderSpec::read(dir.path(), &ModelConfig::read(dir.path()).unwrap())
    }

    #[test]
    fn the_modules_say_how_vectors_are_pooled_and_anything_else_is_refused_by_name() {
        let ok = folder(ST, r#"{"pooling_mode_mean_tokens": true}"#);
        let s = spec(&ok).unwrap();
        assert_eq!((s.pooling, s.normalize, s.dims, s.max_tokens), (Pooling::Mean, true, 8, 16));
        std::fs::write(ok.path().join("sentence_bert_config.json"), r#"{"max_seq_length": 999}"#)
            .unwrap();
        assert_eq!(spec(&ok).unwrap().max_tokens, 16, "no longer than the position table");
        let cls = folder(ST, r#"{"pooling_mode_cls_token": true}"#);
        assert_eq!(spec(&cls).unwrap().pooling, Pooling::Cls);
        for (modules, pooling, says) in [
            (
                ST,
                r#"{"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#,
                "exactly one",
            ),
            (ST, r#"{}"#, "exactly one"),
            (ST, r#"{"pooling_mode_lasttoken": true}"#, "pooling_mode_lasttoken"),
            (ST, "not json", "not valid JSON"),
            (
                r#"[{"type":"sentence_transformers.models.Transformer"},{"type":"sentence_transformers.models.Dense","path":"2"}]"#,
                "{}",
                "Dense",
            ),
            (
                r#"[{"type":"x.Transformer"},{"type":"x.Pooling","path":"../../etc"}]"#,
                "{}",
                "not a folder name",
            ),
            (r#"[{"type":"x.Transformer"}]"#, "{}", "Pooling"),
            (r#"{"a": 1}"#, "{}", "a list"),
        ] {
            let e = spec(&folder(modules, pooling)).unwrap_err().to_string();
            assert!(e.contains(says), "{modules} / {pooling}: {e}");
        }
        let none = folder(ST, "{}");
        std::fs::remove_file(none.path().join("modules.json")).unwrap();
        assert!(spec(&none).unwrap_err().to_string().contains("modules.json"));
    }
}
