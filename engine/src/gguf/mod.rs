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
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("type {t}"),
    };
    name.to_string()
}

fn candle_type(t: u32) -> Option<candle_core::quantized::GgmlDType> {
    use candle_core::quantized::GgmlDType as G;
    Some(match t {
        0 => G::F32,
        1 => G::F16,
        2 => G::Q4_0,
        3 => G::Q4_1,
        6 => G::Q5_0,
        7 => G::Q5_1,
        8 => G::Q8_0,
        10 => G::Q2K,
        11 => G::Q3K,
        12 => G::Q4K,
        13 => G::Q5K,
        14 => G::Q6K,
        30 => G::BF16,
        _ => return None,
    })
}

/// Most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;
/// Most items a metadata array may hold: real vocabularies and merge lists stay under a few
/// million, and each item costs tens of bytes in memory however small it is on disk.
const MAX_ARRAY: u64 = 1 << 24;
/// Largest `general.alignment` accepted (llama.cpp writes 32).
const MAX_ALIGNMENT: u64 = 1 << 16;

/// The header reader. Every count read from the file is checked against the bytes left
/// before anything is allocated for it: the file is untrusted, its size is not.
struct Header<R> {
    r: R,
    path: PathBuf,
    /// Bytes read so far, and the file's size.
    pos: u64,
    size: u64,
}

impl<R: Read> Header<R> {
    fn bad(&self, msg: impl Into<String>) -> EngineError {
        EngineError::BadWeights { file: self.path.clone(), msg: msg.into() }
    }
    fn left(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }
    /// A count of items of at least `min_bytes` each, which must fit in what is left of the file.
    fn count(&self, n: u64, min_bytes: u64, what: &str) -> Result<usize> {
        if n.saturating_mul(min_bytes) > self.left() {
            return Err(self.bad(format!(
                "{what}: {n} entries cannot fit in the {} bytes left of the file",
                self.left()
            )));
        }
        usize::try_from(n).map_err(|_| self.bad(format!("{what}: {n} entries")))
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|_| self.bad("truncated GGUF header"))?;
        self.pos += N as u64;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64()?;
        let len = self.count(len, 1, what)?;
        let mut b = vec![0u8; len];
        self.r.read_exact(&mut b).map_err(|_| self.bad("truncated GGUF header"))?;
        self.pos += len as u64;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    /// One metadata value of type `ty`, for key `key`. Arrays of arrays are refused (llama.cpp
    /// writes none), so this never recurses more than once.
    fn value(&mut self, ty: u32, key: &str) -> Result<Value> {
        Ok(match ty {
            9 => {
                let item = self.u32()?;
                if item == 9 {
                    return Err(
                        self.bad(format!("metadata `{key}`: arrays of arrays are not supported"))
                    );
                }
                let n = self.u64()?;
                if n > MAX_ARRAY {
                    return Err(self.bad(format!(
                        "metadata `{key}`: an array of {n} items (at most {MAX_ARRAY})"
                    )));
                }
                let n =
                    self.count(n, scalar_size(item).unwrap_or(1), &format!("metadata `{key}`"))?;
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.scalar(item, key)?);
                }
                Value::Array(out)
            }
            t => self.scalar(t, key)?,
        })
    }
    fn scalar(&mut self, ty: u32, key: &str) -> Result<Value> {
        Ok(match ty {
            0 => Value::from(self.bytes::<1>()?[0]),
            1 => Value::from(self.bytes::<1>()?[0] as i8),
            2 => Value::from(u16::from_le_bytes(self.bytes()?)),
            3 => Value::from(i16::from_le_bytes(self.bytes()?)),
            4 => Value::from(self.u32()?),
            5 => Value::from(i32::from_le_bytes(self.bytes()?)),
            6 => Value::from(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::from(self.bytes::<1>()?[0] != 0),
            8 => Value::from(self.string(&format!("metadata `{key}`"))?),
            10 => Value::from(self.u64()?),
            11 => Value::from(i64::from_le_bytes(self.bytes()?)),
            12 => Value::from(f64::from_le_bytes(self.bytes()?)),
            t => return Err(self.bad(format!("metadata `{key}`: unknown value type {t}"))),
        })
    }
}

/// Bytes one metadata scalar of type `ty` takes at least (a string: its 8-byte length).
fn scalar_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => return None,
    })
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(EngineError::io(path))?;
        let size = file.metadata().map_err(EngineError::io(path))?.len();
        let mut h = Header { r: BufReader::new(file), path: path.to_path_buf(), pos: 0, size };
        if h.u32()? != MAGIC {
            return Err(h.bad("not a GGUF file (bad magic)"));
        }
        let version = h.u32()?;
        if !(2..=3).contains(&version) {
            return Err(h.bad(format!("GGUF version {version} is not supported (2 and 3 are)")));
        }
        let n_tensors = h.u64()?;
        let n_kv = h.u64()?;
        // A key-value pair takes at least 13 bytes (key length, type, one byte); a tensor
        // entry at least 24 (name length, dimension count, type, offset).
        let n_kv = h.count(n_kv, 13, "metadata count")?;
        let n_tensors = h.count(n_tensors, 24, "tensor count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = h.string("metadata key")?;
            let ty = h.u32()?;
            let value = h.value(ty, &key)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = h.string("tensor name")?;
            // llama.cpp caps names at 64 bytes; control characters would reach file formats
            // (safetensors refuses NUL) and messages.
            if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
                return Err(
                    h.bad(format!("tensor {} has an unusable name {name:?}", tensors.len()))
                );
            }
            let n_dims = h.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(
                    h.bad(format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS})"))
                );
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = h.u64()?;
                // MLX shapes are i32; an empty dimension is no tensor worth importing.
                if d == 0 || d > i32::MAX as u64 {
                    return Err(h.bad(format!("tensor `{name}` has a dimension of {d}")));
                }
                shape.push(d as usize);
            }
            shape.reverse();
            let ggml_type = h.u32()?;
            let offset = h.u64()?;
            tensors.push(TensorInfo { name, shape, ggml_type, offset });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
                _ => return Err(h.bad(format!("metadata `general.alignment` is {v}; it must be a power of two up to {MAX_ALIGNMENT}"))),
            },
        };
        let data_start = h.pos.div_ceil(alignment) * alignment;
        let gguf = GgufFile { path: path.to_path_buf(), version, metadata, tensors, data_start };
        for t in &gguf.tensors {
            let Some(n) = gguf.byte_len(t)? else { continue };
            let end = t.offset.checked_add(n).and_then(|e| e.checked_add(gguf.data_start));
            if end.is_none_or(|e| e > size) {
                return Err(EngineError::BadWeights {
                    file: path.to_path_buf(),
                    msg: format!("truncated: tensor `{}` runs past the end of the file", t.name),
                });
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

    /// Bytes of tensor `t`'s data; `None` for a type Perch cannot read (refused when read).
    fn byte_len(&self, t: &TensorInfo) -> Result<Option<u64>> {
        let Some(ty) = candle_type(t.ggml_type) else { return Ok(None) };
        let bad = |msg: &str| EngineError::BadWeights {
            file: self.path.clone(),
            msg: format!("tensor `{}`: {msg}", t.name),
        };
        let n = t
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .ok_or_else(|| bad("its shape overflows"))?;
        let block = ty.block_size() as u64;
        if n % block != 0 {
            return Err(bad(&format!(
                "{n} elements are not whole {}-element blocks of {}",
                block,
                type_name(t.ggml_type)
            )));
        }
        (n / block)
            .checked_mul(ty.type_size() as u64)
            .map(Some)
            .ok_or_else(|| bad("its size overflows"))
    }

    /// Dequantize one tensor to f32 (row-major, `info.shape`).
    pub fn read_f32(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let unsupported = || {
            EngineError::BadWeights {
            file: self.path.clone(),
            msg: format!(
                "tensor `{}` has type {}, which Perch cannot dequantize (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)",
                info.name,
                type_name(info.ggml_type)
            ),
        }
        };
        let ty = candle_type(info.ggml_type).ok_or_else(unsupported)?;
        let len = self.byte_len(info)?.ok_or_else(unsupported)?;
        let len = usize::try_from(len).map_err(|_| unsupported())?;
        let mut f = File::open(&self.path).map_err(EngineError::io(&self.path))?;
        f.seek(SeekFrom::Start(self.data_start + info.offset))
            .map_err(EngineError::io(&self.path))?;
        let bad = |e: candle_core::Error| EngineError::BadWeights {
            file: self.path.clone(),
            msg: format!("tensor `{}` ({}): {e}", info.name, type_name(info.ggml_type)),
        };
        // Dequantized a band of rows at a time into the one output buffer, so a large tensor
        // (an embedding table) costs its f32 size once, not three times over.
        let rows = info.shape.first().copied().unwrap_or(1).max(1);
        let total: usize = info.shape.iter().product();
        let row_elems = total / rows;
        let block = ty.block_size();
        let (band, band_bytes) = if row_elems.is_multiple_of(block) && len.is_multiple_of(rows) {
            let band = (CHUNK_ELEMS / row_elems.max(1)).clamp(1, rows);
            (band, band * (len / rows))
        } else {
            (rows, len)
        };
        let mut out = Vec::with_capacity(total);
        let mut raw = vec![0u8; band_bytes];
        let dev = candle_core::Device::Cpu;
        let mut row = 0;
        while row < rows {
            let n = band.min(rows - row);
            let bytes = if band == rows { len } else { n * (len / rows) };
            f.read_exact(&mut raw[..bytes]).map_err(EngineError::io(&self.path))?;
            let mut shape = info.shape.clone();
            if let Some(first) = shape.first_mut() {
                *first = n;
            }
            let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                ty,
                &raw[..bytes],
                shape,
                &dev,
            )
            .map_err(bad)?;
            let part = q
                .dequantize(&dev)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(bad)?;
            out.extend_from_slice(&part);
            row += n;
        }
        Ok(out)
    }
}

/// Elements dequantized per band in `read_f32`.
const CHUNK_ELEMS: usize = 1 << 22;
