//! Reading `model*.safetensors` into MLX arrays, with errors that name the file and tensor.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs::{Array, Dtype};

use super::host_matrix::{HostMatrix, HostStore};
use crate::error::{EngineError, Result};
use crate::platform::ComputeDtype;

/// All tensors of a model directory, each remembered with the file it came from.
pub struct Weights {
    tensors: HashMap<String, (Array, PathBuf)>,
    dir: PathBuf,
    /// Dtype to widen floating-point tensors to (see `platform::ComputeDtype`).
    compute_dtype: Dtype,
    /// The 8-bit host copies this load reads or makes (CPU backend).
    host: HostStore,
}

impl Weights {
    /// Load every safetensors file of `dir` (following `model.safetensors.index.json` when present).
    pub fn load(dir: &Path, dtype: ComputeDtype) -> Result<Weights> {
        Weights::load_part(dir, dtype, None)
    }

    /// `load` for a process that holds only part of the model (`part` names it, so its host
    /// copies are stored apart from the whole model's); MLX reads a tensor only when it is
    /// used, so the parts left alone cost no memory.
    pub fn load_part(dir: &Path, dtype: ComputeDtype, part: Option<String>) -> Result<Weights> {
        let files = weight_files(dir)?;
        let mut w = Weights::tensors_in(dir, &files, dtype)?;
        w.host = HostStore::open(dir, &files, w.compute_dtype, part.as_deref());
        Ok(w)
    }

    /// The tensors, lazily (shapes and dtypes, for planning), without host copies: the
    /// store's file is not read.
    pub fn tensors_of(dir: &Path, dtype: ComputeDtype) -> Result<Weights> {
        Weights::tensors_in(dir, &weight_files(dir)?, dtype)
    }

    fn tensors_in(dir: &Path, files: &[PathBuf], dtype: ComputeDtype) -> Result<Weights> {
        let mut tensors = HashMap::new();
        for file in files {
            check_header(file)?;
            let arrays = Array::load_safetensors(file)
                .map_err(|e| EngineError::BadWeights { file: file.clone(), msg: e.to_string() })?;
            for (name, array) in arrays {
                tensors.insert(name, (array, file.clone()));
            }
        }
        let file_dtype = tensors
            .values()
            .map(|(a, _)| a.dtype())
            .find(|d| matches!(d, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32))
            .unwrap_or(Dtype::Float32);
        let compute_dtype = dtype.resolve(file_dtype);
        Ok(Weights { tensors, dir: dir.to_path_buf(), compute_dtype, host: HostStore::off(dir) })
    }

    /// The host copy of a loaded weight, from the store's file or recovered now.
    pub fn host_copy(&mut self, weight: &Array) -> Result<Option<Arc<HostMatrix>>> {
        self.host.copy_of(weight)
    }

    /// Keep this load's host copies on disk for the next; returns (recovered, reused, whether
    /// a file was written).
    pub fn save_host_copies(self) -> (usize, usize, bool) {
        let counts = (self.host.built, self.host.reused);
        (counts.0, counts.1, self.host.save())
    }

    pub fn compute_dtype(&self) -> Dtype {
        self.compute_dtype
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn remove_unused(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    /// Drop every tensor whose name starts with `prefix` (parts of a checkpoint a model does
    /// not run, such as a vision tower); returns how many.
    pub fn remove_prefixed(&mut self, prefix: &str) -> usize {
        let before = self.tensors.len();
        self.tensors.retain(|name, _| !name.starts_with(prefix));
        before - self.tensors.len()
    }

    /// Bytes of the tensors as stored whose names pass `keep` (read from their shapes).
    pub fn stored_bytes(&self, keep: impl Fn(&str) -> bool) -> u64 {
        self.tensors.iter().filter(|(n, _)| keep(n)).map(|(_, (a, _))| a.nbytes() as u64).sum()
    }

    /// A tensor's shape as stored, without taking it.
    pub fn shape_of(&self, name: &str) -> Option<Vec<i32>> {
        self.tensors.get(name).map(|(a, _)| a.shape().to_vec())
    }

    /// Take a tensor as stored (quantized `uint32` weights stay as they are).
    pub fn take_raw(&mut self, name: &str) -> Result<Array> {
        self.tensors.remove(name).map(|(a, _)| a).ok_or_else(|| EngineError::MissingTensor {
            file: self.dir.clone(),
            tensor: name.to_string(),
        })
    }

    /// Take a floating-point tensor, check its shape and widen it to the compute dtype.
    pub fn take(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let file = self.file_of(name);
        let array = self.take_raw(name)?;
        if array.shape() != shape {
            return Err(EngineError::ShapeMismatch {
                file,
                tensor: name.to_string(),
                found: array.shape().to_vec(),
                expected: shape.to_vec(),
            });
        }
        self.to_compute(array)
    }

    pub fn to_compute(&self, array: Array) -> Result<Array> {
        if array.dtype() == self.compute_dtype {
            Ok(array)
        } else {
            Ok(array.as_dtype(self.compute_dtype)?)
        }
    }

    pub fn file_of(&self, name: &str) -> PathBuf {
        self.tensors.get(name).map(|(_, f)| f.clone()).unwrap_or_else(|| self.dir.clone())
    }

    /// Names left over after a model took what it needs; anything here is a sign the file
    /// does not match the architecture.
    pub fn leftover(&self) -> Vec<String> {
        let mut names: Vec<_> = self.tensors.keys().cloned().collect();
        names.sort();
        names
    }
}

fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(EngineError::io(&index))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| EngineError::Config { file: index.clone(), msg: e.to_string() })?;
        let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
            EngineError::Config { file: index.clone(), msg: "no `weight_map` object".into() }
        })?;
        let mut files: Vec<PathBuf> =
            map.values().filter_map(|v| v.as_str()).map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        for f in &files {
            if !f.exists() {
                return Err(EngineError::BadWeights {
                    file: f.clone(),
                    msg: "listed in model.safetensors.index.json but missing".into(),
                });
            }
        }
        return Ok(files);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(EngineError::io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("model") && name.ends_with(".safetensors")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::BadWeights {
            file: dir.to_path_buf(),
            msg: "no model*.safetensors file".into(),
        });
    }
    Ok(files)
}

/// Validate a safetensors header before MLX maps the file, so a truncated download is
/// reported with the file and the first tensor that runs past its end.
fn check_header(file: &Path) -> Result<()> {
    let bad = |msg: String| EngineError::BadWeights { file: file.to_path_buf(), msg };
    let mut f = File::open(file).map_err(EngineError::io(file))?;
    let size = f.metadata().map_err(EngineError::io(file))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| bad("truncated: shorter than a safetensors header".into()))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > 100 << 20 || 8 + header_len > size {
        return Err(bad(format!("truncated or not safetensors: header of {header_len} bytes")));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(EngineError::io(file))?;
    let metadata: safetensors::tensor::Metadata =
        serde_json::from_slice(&header).map_err(|e| bad(format!("bad header: {e}")))?;
    let data_len = size - 8 - header_len;
    for (name, info) in metadata.tensors() {
        if info.data_offsets.1 as u64 > data_len {
            return Err(bad(format!(
                "truncated: tensor `{name}` needs bytes up to {} but the file holds {data_len}",
                info.data_offsets.1
            )));
        }
    }
    Ok(())
}
