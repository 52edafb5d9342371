//! LoRA adapters: a low-rank update `scale · (x @ A) @ B` added to a frozen projection. The
//! base weights are never touched, so serving shares them with training and an adapter is
//! applied (or not) per request.
//!
//! Files follow mlx-lm's layout (`adapters.safetensors` with `…q_proj.lora_a` [in, r] and
//! `…lora_b` [r, out], plus `adapter_config.json`), so an adapter trained here loads there.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::ops::zeros_dtype;
use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{EngineError, Result};

/// The projections an adapter may target, in the order a layer stores them.
pub const TARGETS: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Q = 0,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] =
        [Target::Q, Target::K, Target::V, Target::O, Target::Gate, Target::Up, Target::Down];

    pub fn parse(name: &str) -> Option<Target> {
        TARGETS.iter().position(|t| *t == name).map(|i| Target::ALL[i])
    }

    pub fn name(self) -> &'static str {
        TARGETS[self as usize]
    }

    fn module(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            _ => "mlp",
        }
    }
}

/// Input and output widths of every projection of one decoder layer (the same in each layer
/// of the architectures Perch runs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProjectionDims {
    pub layers: usize,
    pub hidden: i32,
    pub q_out: i32,
    pub kv_out: i32,
    pub intermediate: i32,
}

impl ProjectionDims {
    pub fn of(&self, t: Target) -> (i32, i32) {
        match t {
            Target::Q => (self.hidden, self.q_out),
            Target::K | Target::V => (self.hidden, self.kv_out),
            Target::O => (self.q_out, self.hidden),
            Target::Gate | Target::Up => (self.hidden, self.intermediate),
            Target::Down => (self.intermediate, self.hidden),
        }
    }
}

/// One adapted projection.
#[derive(Clone)]
pub struct LoraPair {
    /// [in, rank]
    pub a: Array,
    /// [rank, out]
    pub b: Array,
}

/// The adapted projections of one layer, and the update's scale (alpha / rank).
#[derive(Clone, Default)]
pub struct LayerLora {
    pub scale: f32,
    pub pairs: [Option<LoraPair>; 7],
}

impl LayerLora {
    /// `base + scale · (x @ A) @ B` for target `t`, or `base` when `t` is not adapted.
    pub fn apply(&self, t: Target, x: &Array, base: Array) -> Result<Array> {
        let Some(p) = &self.pairs[t as usize] else { return Ok(base) };
        let x = if x.dtype() == p.a.dtype() { x.clone() } else { x.as_dtype(p.a.dtype())? };
        let delta = x.matmul(&p.a)?.matmul(&p.b)?.multiply(Array::from_f32(self.scale))?;
        let delta =
            if delta.dtype() == base.dtype() { delta } else { delta.as_dtype(base.dtype())? };
        Ok(base.add(delta)?)
    }
}

/// `layer` is `Some` when the adapter touches that layer.
pub fn layer_of(lora: Option<&Lora>, layer: usize) -> Option<&LayerLora> {
    lora.and_then(|l| l.layers.get(layer)).filter(|l| l.pairs.iter().any(Option::is_some))
}

/// What an adapter is: its rank, scale, targets and layers. Saved as `adapter_config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraSpec {
    pub rank: i32,
    pub alpha: f32,
    pub targets: Vec<String>,
    /// Adapt only the last `layers` layers (all when `None`).
    pub layers: Option<usize>,
}

impl LoraSpec {
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }

    fn targets(&self) -> Result<Vec<Target>> {
        self.targets
            .iter()
            .map(|t| {
                Target::parse(t).ok_or_else(|| {
                    EngineError::InvalidRequest(format!(
                        "unknown LoRA target `{t}` (one of {})",
                        TARGETS.join(", ")
                    ))
                })
            })
            .collect()
    }

    /// The adapted (layer, target) slots, in the order parameters are kept.
    pub fn slots(&self, dims: &ProjectionDims) -> Result<Vec<(usize, Target)>> {
        let targets = self.targets()?;
        let first = dims.layers.saturating_sub(self.layers.unwrap_or(dims.layers));
        Ok((first..dims.layers).flat_map(|l| targets.iter().map(move |t| (l, *t))).collect())
    }
}

/// A whole adapter, ready to apply.
#[derive(Clone)]
pub struct Lora {
    pub layers: Vec<LayerLora>,
}

impl Lora {
    /// Assemble from parameters laid out as `slots` (A then B for each slot).
    pub fn from_params(
        spec: &LoraSpec,
        dims: &ProjectionDims,
        slots: &[(usize, Target)],
        params: &[Array],
    ) -> Lora {
        let mut layers = vec![LayerLora { scale: spec.scale(), ..Default::default() }; dims.layers];
        for (i, (layer, t)) in slots.iter().enumerate() {
            layers[*layer].pairs[*t as usize] =
                Some(LoraPair { a: params[2 * i].clone(), b: params[2 * i + 1].clone() });
        }
        Lora { layers }
    }

    /// Fresh parameters: A uniform in ±1/sqrt(in) and B zero, so training starts from the
    /// base model exactly.
    pub fn init_params(
        spec: &LoraSpec,
        dims: &ProjectionDims,
        slots: &[(usize, Target)],
        seed: u64,
    ) -> Result<Vec<Array>> {
        let mut params = Vec::with_capacity(slots.len() * 2);
        for (i, (_, t)) in slots.iter().enumerate() {
            let (inp, out) = dims.of(*t);
            let bound = 1.0 / (inp as f32).sqrt();
            let k = mlx_rs::random::key(seed.wrapping_mul(1_000_003).wrapping_add(i as u64))?;
            params.push(mlx_rs::random::uniform::<_, f32>(
                -bound,
                bound,
                &[inp, spec.rank][..],
                &k,
            )?);
            params.push(zeros_dtype(&[spec.rank, out], Dtype::Float32)?);
        }
        Ok(params)
    }

    /// Save `adapters.safetensors` and `adapter_config.json` into `dir` (written beside, then
    /// renamed, so a reader never sees half a file).
    pub fn save(
        dir: &Path,
        spec: &LoraSpec,
        dims: &ProjectionDims,
        slots: &[(usize, Target)],
        params: &[Array],
        meta: serde_json::Value,
    ) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(EngineError::io(dir))?;
        let mut tensors: Vec<(String, &Array)> = Vec::new();
        for (i, (layer, t)) in slots.iter().enumerate() {
            let p = format!("model.layers.{layer}.{}.{}", t.module(), t.name());
            tensors.push((format!("{p}.lora_a"), &params[2 * i]));
            tensors.push((format!("{p}.lora_b"), &params[2 * i + 1]));
        }
        let tmp = dir.join("adapters.tmp.safetensors");
        Array::save_safetensors(tensors, None, &tmp)
            .map_err(|e| EngineError::Internal(format!("cannot write {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, dir.join("adapters.safetensors")).map_err(EngineError::io(dir))?;
        let config = json!({
            "fine_tune_type": "lora",
            "num_layers": spec.layers.unwrap_or(dims.layers),
            "lora_parameters": {"rank": spec.rank, "scale": spec.scale(), "alpha": spec.alpha, "dropout": 0.0, "keys": spec.targets.iter().map(|t| format!("{}.{t}", Target::parse(t).map_or("", |t| t.module()))).collect::<Vec<_>>()},
            "perch": meta,
        });
        let text = serde_json::to_string_pretty(&config)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let tmp = dir.join("adapter_config.json.tmp");
        std::fs::write(&tmp, text).map_err(EngineError::io(&tmp))?;
        std::fs::rename(&tmp, dir.join("adapter_config.json")).map_err(EngineError::io(dir))?;
        Ok(())
    }

    /// Load a saved adapter for a model shaped `dims`, checking every tensor's shape.
    pub fn load(dir: &Path, dims: &ProjectionDims) -> Result<Lora> {
        let cfg_file = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_file).map_err(EngineError::io(&cfg_file))?;
        let cfg: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::Config { file: cfg_file.clone(), msg: e.to_string() })?;
        let scale = cfg["lora_parameters"]["scale"].as_f64().ok_or_else(|| EngineError::Config {
            file: cfg_file.clone(),
            msg: "missing lora_parameters.scale".into(),
        })? as f32;
        let file = dir.join("adapters.safetensors");
        let tensors: HashMap<String, Array> = Array::load_safetensors(&file)
            .map_err(|e| EngineError::BadWeights { file: file.clone(), msg: e.to_string() })?;
        let mut layers = vec![LayerLora { scale, ..Default::default() }; dims.layers];
        let bad = |msg: String| EngineError::BadWeights { file: file.clone(), msg };
        for (name, a) in &tensors {
            let Some(prefix) = name.strip_suffix(".lora_a") else { continue };
            let parts: Vec<&str> = prefix.split('.').collect();
            let (Some(layer), Some(t)) = (
                parts.get(2).and_then(|l| l.parse::<usize>().ok()),
                parts.last().and_then(|t| Target::parse(t)),
            ) else {
                return Err(bad(format!("unexpected tensor `{name}`")));
            };
            let b = tensors
                .get(&format!("{prefix}.lora_b"))
                .ok_or_else(|| bad(format!("`{prefix}.lora_b` is missing")))?;
            let (inp, out) = dims.of(t);
            let rank = a.shape().get(1).copied().unwrap_or(0);
            if layer >= dims.layers || a.shape() != [inp, rank] || b.shape() != [rank, out] {
                return Err(bad(format!("`{prefix}` does not fit this model (layer {layer}, A {:?}, B {:?}; expected [{inp}, r] and [r, {out}])", a.shape(), b.shape())));
            }
            layers[layer].pairs[t as usize] = Some(LoraPair { a: a.clone(), b: b.clone() });
        }
        if layers.iter().all(|l| l.pairs.iter().all(Option::is_none)) {
            return Err(bad("no LoRA tensors".into()));
        }
        Ok(Lora { layers })
    }
}

/// Adapter names are directory names: letters, digits, `-`, `_`, `.`, not starting with `.`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Where adapters of model `base` live: `<models>/.adapters/<base with / as -->/<name>`.
pub fn adapter_dir(models_dir: &Path, base: &str, name: &str) -> std::path::PathBuf {
    models_dir.join(".adapters").join(base.replace('/', "--")).join(name)
}

/// Names of the saved adapters of model `base`, sorted.
pub fn list_adapters(models_dir: &Path, base: &str) -> Vec<String> {
    let dir = models_dir.join(".adapters").join(base.replace('/', "--"));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("adapters.safetensors").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| valid_name(n))
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> ProjectionDims {
        ProjectionDims { layers: 3, hidden: 8, q_out: 8, kv_out: 4, intermediate: 16 }
    }

    #[test]
    fn slots_follow_layers_and_targets() {
        let spec = LoraSpec {
            rank: 2,
            alpha: 4.0,
            targets: vec!["q_proj".into(), "down_proj".into()],
            layers: Some(2),
        };
        let slots = spec.slots(&dims()).unwrap();
        assert_eq!(
            slots,
            vec![(1, Target::Q), (1, Target::Down), (2, Target::Q), (2, Target::Down)]
        );
        let bad = LoraSpec { targets: vec!["qkv".into()], ..spec };
        assert!(bad.slots(&dims()).is_err());
    }

    #[test]
    fn fresh_adapter_changes_nothing_and_round_trips() {
        let spec = LoraSpec {
            rank: 2,
            alpha: 4.0,
            targets: vec!["q_proj".into(), "v_proj".into()],
            layers: None,
        };
        let d = dims();
        let slots = spec.slots(&d).unwrap();
        let params = Lora::init_params(&spec, &d, &slots, 7).unwrap();
        let lora = Lora::from_params(&spec, &d, &slots, &params);
        let x = mlx_rs::random::normal::<f32>(&[1, 3, 8][..], None, None, None).unwrap();
        let base = mlx_rs::ops::ones::<f32>(&[1, 3, 8]).unwrap();
        // B starts at zero: the adapted projection equals the base one.
        let y = lora.layers[0].apply(Target::Q, &x, base.clone()).unwrap();
        assert!(y.all_close(&base, 0.0, 0.0, None).unwrap());
        // A nonzero B is applied with scale alpha / rank, and survives a save and load.
        let mut params = params;
        params[1] = mlx_rs::ops::ones::<f32>(&[2, 8]).unwrap();
        let lora = Lora::from_params(&spec, &d, &slots, &params);
        let want = base
            .add(
                x.matmul(&params[0])
                    .unwrap()
                    .matmul(&params[1])
                    .unwrap()
                    .multiply(Array::from_f32(2.0))
                    .unwrap(),
            )
            .unwrap();
        let y = lora.layers[0].apply(Target::Q, &x, base.clone()).unwrap();
        assert!(y.all_close(&want, 1e-5, 1e-5, None).unwrap());
        let dir = tempfile::tempdir().unwrap();
        Lora::save(dir.path(), &spec, &d, &slots, &params, json!({})).unwrap();
        let loaded = Lora::load(dir.path(), &d).unwrap();
        let y2 = loaded.layers[0].apply(Target::Q, &x, base.clone()).unwrap();
        assert!(y2.all_close(&want, 1e-5, 1e-5, None).unwrap());
        assert!(loaded.layers[0].pairs[Target::K as usize].is_none());
        // A model of another shape refuses it.
        let other = ProjectionDims { hidden: 16, ..d };
        assert!(Lora::load(dir.path(), &other).is_err());
    }

    #[test]
    fn names_are_safe_directory_names() {
        assert!(valid_name("my-notes_v2.1"));
        for bad in ["", ".hidden", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
