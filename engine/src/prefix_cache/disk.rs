//! The prefix cache's disk tier: one file per state in the platform cache directory, so a
//! restarted Perch still skips the prefill of the system prompts and conversations it saw.
//!
//! A file is a `checked_file` with magic `PERCHKV1`: its header holds the key digest, the
//! tokens, and each layer's shapes, offset, ring and dtype; its data, every buffer as f32 LE. Files are written to a temporary name and renamed, by a
//! writer thread (the MLX thread only copies the arrays out). Anything in the directory
//! that is not such a file with a matching checksum (truncated, corrupt, foreign, another
//! version) is removed when found, never trusted and never fatal.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{common_prefix, CacheKey, PrefixStats};
use crate::checked_file::{Format, ReadError};
use crate::model::kv_cache::{KvCache, KvState, SLIDING_SLACK};
use crate::sync::LockExt;

/// A header longer than 64 MiB is not ours (a million tokens of JSON stay well under it).
const FORMAT: Format = Format { magic: b"PERCHKV1", max_header: 64 << 20 };

#[derive(Serialize, Deserialize)]
struct LayerHeader {
    keys: Vec<i32>,
    values: Vec<i32>,
    offset: i32,
    ring: Option<(i32, i32)>,
    dtype: String,
    /// A linear-attention layer: `keys` holds its convolution's inputs ([B, 1, kernel - 1,
    /// channels]), `values` its recurrent state (always f32).
    #[serde(default)]
    recurrent: bool,
}

#[derive(Serialize, Deserialize)]
struct Header {
    digest: String,
    tokens: Vec<u32>,
    layers: Vec<LayerHeader>,
    mtp: Option<LayerHeader>,
    /// The shortest prefix the state can be cut back to (0: any; more with sliding-window
    /// rings). Files from before this field read as 0: a lookup may then load one it cannot
    /// use, and falls back to prefilling.
    #[serde(default)]
    shortest: usize,
}

struct DiskEntry {
    path: PathBuf,
    digest: String,
    tokens: Vec<u32>,
    /// See `Header::shortest`.
    shortest: usize,
    bytes: u64,
    /// Last use, in nanoseconds since the epoch (the file's modification time at start).
    used: u128,
}

impl DiskEntry {
    /// How much of `prompt` (all but its last token, which the generation feeds itself) this
    /// file's state can start: the shared prefix, if the state can be cut back to it.
    fn serves(&self, prompt: &[u32]) -> usize {
        let n = common_prefix(&self.tokens, prompt).min(prompt.len().saturating_sub(1));
        if n >= self.shortest.max(1) {
            n
        } else {
            0
        }
    }
}

type Index = Arc<Mutex<Vec<DiskEntry>>>;

struct Job {
    path: PathBuf,
    digest: String,
    tokens: Vec<u32>,
    shortest: usize,
    header: Header,
    /// Flat, evaluated f32 arrays (the writer thread only reads them).
    arrays: Vec<Array>,
    /// Every layer can be cut back to any prefix (no sliding-window ring), so an older file
    /// holding a prefix of this one is redundant.
    covers_prefixes: bool,
}

/// States copied out and waiting for the writer, at most: one turn's kept marks and its final
/// state. Each is a whole f32 copy of a state: an unbounded queue let a long cold prompt's
/// marks pile up in memory faster than the disk took them.
const WRITER_QUEUE: usize = crate::decode::request::MAX_PREFILL_STATES + 1;

pub(super) struct DiskTier {
    dir: PathBuf,
    index: Index,
    jobs: mpsc::SyncSender<Job>,
    stats: Arc<PrefixStats>,
    budget: u64,
}

fn now_nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Float16 => "float16",
        _ => "float32",
    }
}

fn dtype_of(name: &str) -> Option<Dtype> {
    match name {
        "bfloat16" => Some(Dtype::Bfloat16),
        "float16" => Some(Dtype::Float16),
        "float32" => Some(Dtype::Float32),
        _ => None,
    }
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a prefix-cache file");
        }
    }
}

impl DiskTier {
    /// Open (creating) `dir`, index the files in it and remove what is not a cache file.
    /// `None` (and a warning) when the directory cannot be used.
    pub fn open(dir: PathBuf, budget: u64, stats: Arc<PrefixStats>) -> Option<DiskTier> {
        if let Err(e) = crate::private_files::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "prefix cache: no disk tier");
            return None;
        }
        let mut entries = vec![];
        for item in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = item.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if !meta.is_file() {
                continue; // never follow or remove anything but our own plain files
            }
            // Another process's file being written (`*.tmp<pid>`, two Perch sharing the
            // folder): left alone while it is recent; an old one is debris and goes.
            let writing =
                path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.starts_with("tmp"));
            let recent = meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() < 3600);
            if writing && recent {
                continue;
            }
            let ours = path.extension().is_some_and(|e| e == "kv");
            match ours.then(|| FORMAT.header::<Header>(&path)).flatten() {
                Some((h, bytes)) => entries.push(DiskEntry {
                    path,
                    digest: h.digest,
                    tokens: h.tokens,
                    shortest: h.shortest,
                    bytes,
                    used: meta
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_nanos()),
                }),
                None => {
                    tracing::warn!(path = %path.display(), "prefix cache: removing a file that is not a cache file");
                    stats.disk_rejected.fetch_add(1, Ordering::Relaxed);
                    remove(&path);
                }
            }
        }
        let index: Index = Arc::new(Mutex::new(entries));
        let (tx, rx) = mpsc::sync_channel::<Job>(WRITER_QUEUE);
        let (writer_index, writer_stats) = (index.clone(), stats.clone());
        std::thread::Builder::new()
            .name("perch-prefix-writer".into())
            .spawn(move || {
                for job in rx {
                    write_job(job, &writer_index, budget, &writer_stats);
                }
            })
            .ok()?;
        let tier = DiskTier { dir, index, jobs: tx, stats, budget };
        enforce_budget(&mut tier.index.locked(), budget, &tier.stats);
        Some(tier)
    }

    /// The longest prefix of `prompt` a file for `key` can serve.
    pub fn best_prefix(&self, key: &CacheKey, prompt: &[u32]) -> usize {
        let index = self.index.locked();
        index
            .iter()
            .filter(|e| e.digest == key.digest())
            .map(|e| e.serves(prompt))
            .max()
            .unwrap_or(0)
    }

    /// Read the file serving the longest prefix of `prompt` back; a bad file is removed.
    pub fn load(&mut self, key: &CacheKey, prompt: &[u32]) -> Option<KvState> {
        let path = {
            let index = self.index.locked();
            let best = index
                .iter()
                .filter(|e| e.digest == key.digest() && e.serves(prompt) > 0)
                .max_by_key(|e| e.serves(prompt))?;
            (best.path.clone(), best.bytes)
        };
        let (path, indexed) = path;
        match read_state(&path, key, indexed) {
            Ok(state) => {
                self.stats.disk_loads.fetch_add(1, Ordering::Relaxed);
                let now = now_nanos();
                if let Some(e) = self.index.locked().iter_mut().find(|e| e.path == path) {
                    e.used = now;
                }
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(state)
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), why, "prefix cache: removing a bad file");
                self.stats.disk_rejected.fetch_add(1, Ordering::Relaxed);
                self.index.locked().retain(|e| e.path != path);
                remove(&path);
                None
            }
        }
    }

    /// Copy `state` into flat arrays and hand them to the writer thread, which checksums and
    /// writes them.
    /// A state larger than the whole budget is never copied (it would evict every file, then
    /// itself), and one that finds the writer's queue full is dropped (counted in
    /// `disk_skipped`): the answer's path never waits on the disk.
    pub fn store(&mut self, key: &CacheKey, state: &KvState) {
        // A sharded model's other ranks hold most of its layers: there is nothing here to
        // write that would restore them.
        if state.layers.iter().any(|c| c.is_remote()) {
            return;
        }
        let f32_bytes: u64 = state
            .layers
            .iter()
            .chain(state.mtp.iter())
            .flat_map(|c| c.state())
            .map(|a| a.size() as u64 * 4)
            .sum();
        if f32_bytes > self.budget {
            tracing::info!(
                f32_bytes,
                budget = self.budget,
                "prefix cache: a state larger than the disk budget is not written"
            );
            self.stats.disk_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let (mut header, arrays) = match snapshot(key, state) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "prefix cache: cannot save a state");
                return;
            }
        };
        header.shortest = super::shortest_cut(state);
        let name = format!("{}-{:016x}.kv", key.digest(), token_hash(&state.tokens));
        let sent = self.jobs.try_send(Job {
            path: self.dir.join(name),
            digest: key.digest().to_string(),
            tokens: state.tokens.clone(),
            shortest: header.shortest,
            header,
            arrays,
            covers_prefixes: state.layers.iter().all(|c| c.cuts_back_anywhere()),
        });
        if let Err(mpsc::TrySendError::Full(_)) = sent {
            self.stats.disk_skipped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn token_hash(tokens: &[u32]) -> u64 {
    let d = Sha256::digest(tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>());
    u64::from_le_bytes(d[..8].try_into().unwrap_or_default())
}

/// One layer's header and its buffers as flat f32 arrays, only the positions it holds (rings
/// whole); the arrays are evaluated by the caller.
fn layer_out(c: &KvCache, out: &mut Vec<Array>) -> mlx_rs::error::Result<Option<LayerHeader>> {
    use mlx_rs::ops::indexing::IndexOp;
    if let Some(r) = c.recurrent() {
        let conv = r.conv.expand_dims(1)?;
        let header = LayerHeader {
            keys: conv.shape().to_vec(),
            values: r.ssm.shape().to_vec(),
            offset: c.offset(),
            ring: None,
            dtype: dtype_name(conv.dtype()).into(),
            recurrent: true,
        };
        for a in [&conv, &r.ssm] {
            out.push(a.as_dtype(Dtype::Float32)?.reshape(&[-1])?);
        }
        return Ok(Some(header));
    }
    let (Some(k), Some(v), offset) = c.parts() else { return Ok(None) };
    let ring = c.ring();
    let (k, v) = match ring {
        Some(_) => (k.clone(), v.clone()),
        None => (k.index((.., .., ..offset, ..)), v.index((.., .., ..offset, ..))),
    };
    let header = LayerHeader {
        keys: k.shape().to_vec(),
        values: v.shape().to_vec(),
        offset,
        ring,
        dtype: dtype_name(k.dtype()).into(),
        recurrent: false,
    };
    for a in [k, v] {
        out.push(a.as_dtype(Dtype::Float32)?.reshape(&[-1])?);
    }
    Ok(Some(header))
}

/// The header and the evaluated f32 arrays of a state (on the MLX thread: one copy).
fn snapshot(key: &CacheKey, state: &KvState) -> mlx_rs::error::Result<(Header, Vec<Array>)> {
    let mut arrays = vec![];
    let mut layers = vec![];
    for c in &state.layers {
        match layer_out(c, &mut arrays)? {
            Some(h) => layers.push(h),
            None => return Err(mlx_rs::error::Exception::custom("an empty layer")),
        }
    }
    let mtp = match &state.mtp {
        Some(m) => layer_out(m, &mut arrays)?,
        None => None,
    };
    mlx_rs::transforms::eval(arrays.iter())?;
    let tokens = state.tokens.clone();
    let header = Header { digest: key.digest().into(), tokens, layers, mtp, shortest: 0 };
    Ok((header, arrays))
}

/// `f` over the data's bytes (f32 little-endian), in pieces.
fn data_bytes(
    arrays: &[Array],
    mut f: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    for a in arrays {
        for chunk in a.as_slice::<f32>().chunks(1 << 14) {
            buf.clear();
            for x in chunk {
                buf.extend_from_slice(&x.to_le_bytes());
            }
            f(&buf)?;
        }
    }
    Ok(())
}

/// Write a job's file.
fn write_file(path: &Path, job: &Job) -> std::io::Result<()> {
    let data_len: usize = job.arrays.iter().map(|a| a.size() * 4).sum();
    FORMAT.write(path, &job.header, data_len as u64, |put| data_bytes(&job.arrays, put))
}

fn write_job(job: Job, index: &Index, budget: u64, stats: &PrefixStats) {
    let tmp = job.path.with_extension(format!("tmp{}", std::process::id()));
    let written = write_file(&tmp, &job).and_then(|_| std::fs::rename(&tmp, &job.path));
    if let Err(e) = written {
        tracing::warn!(path = %job.path.display(), error = %e, "prefix cache: cannot write a state");
        remove(&tmp);
        return;
    }
    let bytes = std::fs::metadata(&job.path).map_or(0, |m| m.len());
    let mut index = index.locked();
    index.retain(|e| {
        let redundant = e.path == job.path
            || (job.covers_prefixes
                && e.digest == job.digest
                && e.tokens.len() <= job.tokens.len()
                && job.tokens[..e.tokens.len()] == e.tokens[..]);
        if redundant && e.path != job.path {
            remove(&e.path);
        }
        !redundant
    });
    index.push(DiskEntry {
        path: job.path,
        digest: job.digest,
        tokens: job.tokens,
        shortest: job.shortest,
        bytes,
        used: now_nanos(),
    });
    enforce_budget(&mut index, budget, stats);
}

/// Remove the least recently used files until the tier fits its budget.
fn enforce_budget(index: &mut Vec<DiskEntry>, budget: u64, stats: &PrefixStats) {
    while index.iter().map(|e| e.bytes).sum::<u64>() > budget {
        let Some(i) = index.iter().enumerate().min_by_key(|(_, e)| e.used).map(|x| x.0) else {
            break;
        };
        remove(&index.remove(i).path);
    }
    stats.disk_bytes.store(index.iter().map(|e| e.bytes).sum(), Ordering::Relaxed);
    stats.disk_entries.store(index.len() as u64, Ordering::Relaxed);
}

/// Read and check a whole file; every way it can be wrong is an error, never a panic.
fn read_state(path: &Path, key: &CacheKey, indexed: u64) -> Result<KvState, &'static str> {
    let mut r = FORMAT.open(path).map_err(|e| match e {
        ReadError::Missing => "unreadable",
        ReadError::Bad(why) => why,
    })?;
    // A file swapped for another since it was indexed is not read into memory at all.
    if r.size != indexed {
        return Err("changed since it was indexed");
    }
    let h: Header = r.header()?;
    if h.digest != key.digest() {
        return Err("another model's file");
    }
    let mut layer = |l: &LayerHeader| -> Result<KvCache, &'static str> {
        let dtype = dtype_of(&l.dtype).ok_or("unknown dtype")?;
        let mut arrays = vec![];
        for (i, shape) in [&l.keys, &l.values].into_iter().enumerate() {
            if shape.len() != 4 || shape.iter().any(|&d| d <= 0) {
                return Err("bad shape");
            }
            let n = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d as usize))
                .ok_or("bad shape")?;
            let raw = r.take(n.checked_mul(4).ok_or("bad shape")?)?;
            let floats: Vec<f32> =
                raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            // A recurrent state stays f32 whatever the model computes in.
            let dtype = if l.recurrent && i == 1 { Dtype::Float32 } else { dtype };
            let a = Array::from_slice(&floats, shape).as_dtype(dtype).map_err(|_| "bad data")?;
            arrays.push(a);
        }
        if l.recurrent {
            let v = arrays.pop().ok_or("bad data")?;
            let k = arrays.pop().ok_or("bad data")?;
            let conv = k.reshape(&[l.keys[0], l.keys[2], l.keys[3]]).map_err(|_| "bad shape")?;
            return match l.offset >= 0 && l.ring.is_none() && l.keys[1] == 1 {
                true => Ok(KvCache::from_recurrent(conv, v, l.offset)),
                false => Err("bad offsets"),
            };
        }
        let cap = l.keys[2];
        let ok = l.offset >= 0
            && l.values[2] == cap
            && match l.ring {
                None => l.offset == cap,
                Some((w, stored)) => {
                    w > 0 && cap == w + SLIDING_SLACK && stored >= 0 && stored <= cap.min(l.offset)
                }
            };
        if !ok {
            return Err("bad offsets");
        }
        let v = arrays.pop().ok_or("bad data")?;
        let k = arrays.pop().ok_or("bad data")?;
        Ok(KvCache::from_parts(k, v, l.offset, l.ring))
    };
    let layers = h.layers.iter().map(&mut layer).collect::<Result<Vec<_>, _>>()?;
    let mtp = h.mtp.as_ref().map(&mut layer).transpose()?;
    r.finish()?;
    if layers.iter().any(|c| c.offset() as usize != h.tokens.len()) {
        return Err("layers and tokens disagree");
    }
    Ok(KvState { tokens: h.tokens, layers, mtp })
}
