//! Sentence encoders, the second kind of model Perch serves (the first: decoders that chat):
//! a folder in the sentence-transformers layout, whose `modules.json` names the network
//! (a BERT-family transformer), its pooling (`1_Pooling/config.json`) and whether vectors are
//! L2-normalised. Turns token ids into one vector per input, in packed or padded batches.

use std::path::{Path, PathBuf};

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

/// Sequences per padded forward pass, and padded tokens per pass: inputs are sorted by
/// length, so a pass pads little, and its attention scores stay a few megabytes.
const BATCH_SEQUENCES: usize = 32;
const BATCH_TOKENS: usize = 8192;
/// Tokens per packed pass (`Bert::forward_packed`). Its largest buffer, the MLP's middle, is
/// then 4096 × intermediate floats: 24 MiB for MiniLM, under the 32 MiB above which glibc
/// maps (and on freeing unmaps) each buffer anew (`platform::tune_allocator`). Passes of 2048
/// took as long: a batch of 256 sentences in 753–787 ms against 749–768 (2-core AMD EPYC,
/// avx512f, OpenBLAS on its Haswell kernels).
const PACKED_TOKENS: usize = 4096;

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
        if self.net.packs() {
            self.embed_packed(inputs, PACKED_TOKENS)
        } else {
            self.embed_padded(inputs)
        }
    }

    /// `embed` in padded passes of inputs of about one length.
    fn embed_padded(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
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

    /// `embed` without padding: inputs in their order, as many per pass as fit `limit`
    /// tokens (one alone when it is longer).
    fn embed_packed(&self, inputs: &[Vec<u32>], limit: usize) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut at = 0;
        while at < inputs.len() {
            let (mut end, mut tokens) = (at, 0);
            while end < inputs.len() && (end == at || tokens + inputs[end].len() <= limit) {
                tokens += inputs[end].len();
                end += 1;
            }
            let group = &inputs[at..end];
            let ids: Vec<i32> = group.iter().flatten().map(|&t| t as i32).collect();
            let lens: Vec<usize> = group.iter().map(Vec::len).collect();
            let h = self.net.forward_packed(&ids, &lens)?;
            let h = super::host_step::values(&h)?;
            let mut first = 0;
            for &n in &lens {
                out.push(self.pool(&h, first, n));
                first += n;
            }
            at = end;
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
        let h = self.net.forward(&ids, &mask)?;
        let h = super::host_step::values(&h)?;
        Ok(lens.iter().enumerate().map(|(s, &len)| self.pool(&h, s * width, len)).collect())
    }

    /// Sentence vector of the `n` token rows from row `first` of `h` (rows of `dims` floats):
    /// pooled as the spec says, then L2-normalised if it says so.
    fn pool(&self, h: &[f32], first: usize, n: usize) -> Vec<f32> {
        let dims = self.spec.dims;
        let rows = h[first * dims..][..n * dims].chunks(dims);
        let mut v = match self.spec.pooling {
            Pooling::Cls => h[first * dims..][..dims].to_vec(),
            Pooling::Max => rows.fold(vec![f32::MIN; dims], |mut m, r| {
                m.iter_mut().zip(r).for_each(|(m, &x)| *m = m.max(x));
                m
            }),
            Pooling::Mean | Pooling::MeanSqrtLen => {
                let mut sum = vec![0f32; dims];
                rows.for_each(|r| sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x));
                let by = match self.spec.pooling {
                    Pooling::Mean => n as f32,
                    _ => (n as f32).sqrt(),
                };
                sum.iter_mut().for_each(|s| *s /= by);
                sum
            }
        };
        if self.spec.normalize {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v
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

    /// all-MiniLM-L6-v2 (scripts/fetch-minilm) and sentence-transformers' goldens for it.
    fn minilm() -> Option<(Encoder, Value)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = root.join(".deps/minilm/all-minilm-l6-v2");
        if !dir.join("model.safetensors").is_file() {
            assert!(std::env::var_os("CI").is_none(), "CI must fetch the encoder");
            eprintln!("SKIPPED: all-MiniLM-L6-v2 missing (run scripts/fetch-minilm)");
            return None;
        }
        let golden = root.join("tests/fixtures/embeddings/minilm-golden.json");
        let golden = serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
        Some((Encoder::load(&dir, ComputeDtype::F32).unwrap(), golden))
    }

    #[test]
    fn packed_and_padded_passes_both_give_sentence_transformers_vectors() {
        let Some((encoder, g)) = minilm() else { return };
        let list = |k: &str| g[k].as_array().unwrap().clone();
        let ids: Vec<Vec<u32>> = list("corpus_ids")
            .iter()
            .map(|l| l.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect())
            .collect();
        let want: Vec<Vec<f32>> = list("corpus_vectors")
            .iter()
            .map(|v| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .collect();
        let cos = |a: &[f32], b: &[f32]| -> f32 {
            let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (n(a) * n(b))
        };
        // Inputs of many lengths in one call: padded (MLX's attention, as on Metal), packed in
        // one pass, and packed in passes of at most 64 tokens (the 256-token input alone).
        let mut runs = vec![("padded", encoder.embed_padded(&ids).unwrap())];
        if encoder.net.packs() {
            runs.push(("packed", encoder.embed_packed(&ids, PACKED_TOKENS).unwrap()));
            runs.push(("packed by 64", encoder.embed_packed(&ids, 64).unwrap()));
        }
        for (how, got) in runs {
            for (i, (v, w)) in got.iter().zip(&want).enumerate() {
                let c = cos(v, w);
                assert!(c >= 0.9999, "{how}: input {i} ({} tokens): cosine {c}", ids[i].len());
            }
        }
    }
}
