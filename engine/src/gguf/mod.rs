//! GGUF files: reading the header (metadata and tensor table) and dequantizing tensors, for
//! `perch import`. Block formats are decoded by candle's ggml kernels; what we read here is the
//! container, so errors can name the tensor and the type.

pub mod import;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{EngineError, Result};

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian

pub struct TensorInfo {
    pub name: String,
    /// Hugging Face order (outermost first): GGUF's `ne` reversed.
    pub shape: Vec<usize>,
    pub ggml_type: u32,
    /// From the start of the data section.
    pub offset: u64,
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    data_start: u64,
}

/// Name of a ggml type id, for messages.
pub fn type_name(t: u32) -> String {
    let name = match t {
        0 => "F32", 1 => "F16", 2 => "Q4_0", 3 => "Q4_1", 6 => "Q5_0", 7 => "Q5_1", 8 => "Q8_0",
        9 => "Q8_1", 10 => "Q2_K", 11 => "Q3_K", 12 => "Q4_K", 13 => "Q5_K", 14 => "Q6_K",
        15 => "Q8_K", 16 => "IQ2_XXS", 17 => "IQ2_XS", 18 => "IQ3_XXS", 19 => "IQ1_S",
        20 => "IQ4_NL", 21 => "IQ3_S", 22 => "IQ2_S", 23 => "IQ4_XS", 24 => "I8", 25 => "I16",
        26 => "I32", 27 => "I64", 28 => "F64", 29 => "IQ1_M", 30 => "BF16", 34 => "TQ1_0",
        35 => "TQ2_0", 39 => "MXFP4",
        _ => return format!("type {t}"),
    };
    name.to_string()
}

fn candle_type(t: u32) -> Option<candle_core::quantized::GgmlDType> {
    use candle_core::quantized::GgmlDType as G;
    Some(match t {
        0 => G::F32, 1 => G::F16, 2 => G::Q4_0, 3 => G::Q4_1, 6 => G::Q5_0, 7 => G::Q5_1,
        8 => G::Q8_0, 10 => G::Q2K, 11 => G::Q3K, 12 => G::Q4K, 13 => G::Q5K, 14 => G::Q6K,
        30 => G::BF16,
        _ => return None,
    })
}

struct Header<R> {
    r: R,
    path: PathBuf,
}

impl<R: Read> Header<R> {
    fn bad(&self, msg: impl Into<String>) -> EngineError {
        EngineError::BadWeights { file: self.path.clone(), msg: msg.into() }
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|_| self.bad("truncated GGUF header"))?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        if len > 1 << 30 {
            return Err(self.bad(format!("implausible string length {len}")));
        }
        let mut b = vec![0u8; len as usize];
        self.r.read_exact(&mut b).map_err(|_| self.bad("truncated GGUF header"))?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    fn value(&mut self, ty: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::from(self.bytes::<1>()?[0]),
            1 => Value::from(self.bytes::<1>()?[0] as i8),
            2 => Value::from(u16::from_le_bytes(self.bytes()?)),
            3 => Value::from(i16::from_le_bytes(self.bytes()?)),
            4 => Value::from(self.u32()?),
            5 => Value::from(i32::from_le_bytes(self.bytes()?)),
            6 => Value::from(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::from(self.bytes::<1>()?[0] != 0),
            8 => Value::from(self.string()?),
            9 => {
                let item = self.u32()?;
                let n = self.u64()?;
                if n > 1 << 28 {
                    return Err(self.bad(format!("implausible array length {n}")));
                }
                Value::Array((0..n).map(|_| self.value(item)).collect::<Result<_>>()?)
            }
            10 => Value::from(self.u64()?),
            11 => Value::from(i64::from_le_bytes(self.bytes()?)),
            12 => Value::from(f64::from_le_bytes(self.bytes()?)),
            t => return Err(self.bad(format!("unknown metadata value type {t}"))),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(EngineError::io(path))?;
        let size = file.metadata().map_err(EngineError::io(path))?.len();
        let mut h = Header { r: BufReader::new(file), path: path.to_path_buf() };
        if h.u32()? != MAGIC {
            return Err(h.bad("not a GGUF file (bad magic)"));
        }
        let version = h.u32()?;
        if !(2..=3).contains(&version) {
            return Err(h.bad(format!("GGUF version {version} is not supported (2 and 3 are)")));
        }
        let n_tensors = h.u64()?;
        let n_kv = h.u64()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = h.string()?;
            let ty = h.u32()?;
            metadata.insert(key, h.value(ty)?);
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = h.string()?;
            let n_dims = h.u32()?;
            let mut shape: Vec<usize> = (0..n_dims).map(|_| h.u64().map(|d| d as usize)).collect::<Result<_>>()?;
            shape.reverse();
            let ggml_type = h.u32()?;
            let offset = h.u64()?;
            tensors.push(TensorInfo { name, shape, ggml_type, offset });
        }
        let alignment = metadata.get("general.alignment").and_then(|v| v.as_u64()).unwrap_or(32);
        let pos = h.r.stream_position().map_err(EngineError::io(path))?;
        let data_start = pos.div_ceil(alignment) * alignment;
        let gguf = GgufFile { path: path.to_path_buf(), version, metadata, tensors, data_start };
        for t in &gguf.tensors {
            if let Some(n) = gguf.byte_len(t) {
                if gguf.data_start + t.offset + n as u64 > size {
                    return Err(EngineError::BadWeights {
                        file: path.to_path_buf(),
                        msg: format!("truncated: tensor `{}` runs past the end of the file", t.name),
                    });
                }
            }
        }
        Ok(gguf)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(|v| v.as_str())
    }

    pub fn u64(&self, key: &str) -> Option<u64> {
        self.metadata.get(key).and_then(|v| v.as_u64())
    }

    pub fn f64(&self, key: &str) -> Option<f64> {
        self.metadata.get(key).and_then(|v| v.as_f64())
    }

    pub fn architecture(&self) -> Result<&str> {
        self.str("general.architecture").ok_or_else(|| EngineError::BadWeights {
            file: self.path.clone(),
            msg: "no general.architecture in the GGUF metadata".into(),
        })
    }

    fn byte_len(&self, t: &TensorInfo) -> Option<usize> {
        let ty = candle_type(t.ggml_type)?;
        let n: usize = t.shape.iter().product();
        Some(n / ty.block_size() * ty.type_size())
    }

    /// Dequantize one tensor to f32 (row-major, `info.shape`).
    pub fn read_f32(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let unsupported = || EngineError::BadWeights {
            file: self.path.clone(),
            msg: format!(
                "tensor `{}` has type {}, which Perch cannot dequantize (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)",
                info.name,
                type_name(info.ggml_type)
            ),
        };
        let ty = candle_type(info.ggml_type).ok_or_else(unsupported)?;
        let len = self.byte_len(info).ok_or_else(unsupported)?;
        let mut raw = vec![0u8; len];
        let mut f = File::open(&self.path).map_err(EngineError::io(&self.path))?;
        f.seek(SeekFrom::Start(self.data_start + info.offset)).map_err(EngineError::io(&self.path))?;
        f.read_exact(&mut raw).map_err(EngineError::io(&self.path))?;
        let bad = |e: candle_core::Error| EngineError::BadWeights {
            file: self.path.clone(),
            msg: format!("tensor `{}` ({}): {e}", info.name, type_name(info.ggml_type)),
        };
        let dev = candle_core::Device::Cpu;
        let q = candle_core::quantized::ggml_file::qtensor_from_ggml(ty, &raw, info.shape.clone(), &dev).map_err(bad)?;
        q.dequantize(&dev).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>()).map_err(bad)
    }
}
