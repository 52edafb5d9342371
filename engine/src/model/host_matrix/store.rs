//! A model's host copies kept on disk, so that later loads read them instead of
//! recovering them from the f32 weights (seconds per load) and never read the f32 weights
//! that only decode steps use (the tied embedding table, served from its copy).
//!
//! One file per model directory in `paths::host_copy_dir()`, named by a digest of the
//! directory's path and one of what the copies were made from (each weight file's path, size
//! and modification time, the compute dtype, this format's version): a re-import gets a new
//! file and the old one is removed when the new one is written. A file is a `checked_file`
//! with magic `PERCHHC1`: its header holds that key and each matrix the load asked about, in
//! load order, with its shape and block or none; its data, per copy, the bytes, steps and
//! offsets (f32 LE). Written under a temporary name
//! and renamed. A file that is not such a file, holds another key, fails its checksum or does
//! not match the matrices the load asks for is ignored and replaced: never trusted, never
//! fatal, never read past its own length.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::HostMatrix;
use crate::checked_file::{Format, ReadError};
use crate::error::Result;

const FORMAT: Format = Format { magic: b"PERCHHC1", max_header: 16 << 20 };

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Debug)]
struct Shape {
    rows: usize,
    cols: usize,
    /// The copy's block width; `None` for a matrix with no exact copy.
    block: Option<usize>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    key: String,
    /// The model directory, so files of directories since removed can be found and removed.
    dir: PathBuf,
    matrices: Vec<Shape>,
}

/// What one load asked for and where each answer came from.
pub struct HostStore {
    /// The file for this model; `None` when the host path is off.
    path: Option<PathBuf>,
    dir: PathBuf,
    key: String,
    /// The file's copies not yet handed out, in load order; `None` once the file is found
    /// not to match (or there was none).
    cached: Option<std::vec::IntoIter<(Shape, Option<Arc<HostMatrix>>)>>,
    used: Vec<(Shape, Option<Arc<HostMatrix>>)>,
    /// How many answers were recovered from f32 weights in this load.
    pub built: usize,
    /// How many came from the file.
    pub reused: usize,
}

impl HostStore {
    /// A store that neither reads nor keeps copies (no file is opened).
    pub fn off(dir: &Path) -> HostStore {
        HostStore {
            path: None,
            dir: dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()),
            key: String::new(),
            cached: None,
            used: vec![],
            built: 0,
            reused: 0,
        }
    }

    /// The store for a model made of `files` computing in `dtype`, with its file read and
    /// checked when there is one.
    /// `part`: the part of the model this process holds, when not the whole (a shard).
    pub fn open(dir: &Path, files: &[PathBuf], dtype: Dtype, part: Option<&str>) -> HostStore {
        let mut store = HostStore::off(dir);
        if !super::enabled() {
            return store;
        }
        let mut id = Sha256::new();
        id.update(format!("{:?} {dtype:?}", FORMAT.magic));
        for f in files {
            let meta = std::fs::metadata(f).ok();
            let mtime = meta
                .as_ref()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            let canonical = f.canonicalize().unwrap_or_else(|_| f.clone());
            id.update(format!("\n{} {} {mtime}", canonical.display(), meta.map_or(0, |m| m.len())));
        }
        store.key = hex(&id.finalize()[..16]);
        let path = crate::paths::host_copy_dir().join(format!(
            "{}-{}.bin",
            dir_tag(&store.dir, part),
            store.key
        ));
        match read(&path, &store.key) {
            Ok(entries) => store.cached = Some(entries.into_iter()),
            Err(ReadError::Missing) => {}
            Err(ReadError::Bad(why)) => {
                tracing::warn!(path = %path.display(), why, "host copies: ignoring a bad file");
                let _ = std::fs::remove_file(&path);
            }
        }
        store.path = Some(path);
        store
    }

    /// The host copy of `weight` ([rows, cols]): the file's when it has the one this load
    /// asks for next, else recovered from the weight (`HostMatrix::new`).
    pub fn copy_of(&mut self, weight: &Array) -> Result<Option<Arc<HostMatrix>>> {
        if self.path.is_none() || weight.ndim() != 2 {
            return Ok(None);
        }
        let (rows, cols) = (weight.shape()[0] as usize, weight.shape()[1] as usize);
        if let Some(cached) = &mut self.cached {
            match cached.next() {
                Some((shape, copy)) if (shape.rows, shape.cols) == (rows, cols) => {
                    self.reused += 1;
                    self.used.push((shape, copy.clone()));
                    return Ok(copy);
                }
                _ => {
                    tracing::warn!("host copies: the file does not match this model's matrices");
                    self.cached = None;
                }
            }
        }
        let copy = HostMatrix::new(weight)?.map(Arc::new);
        self.built += 1;
        let block = copy.as_ref().map(|m| m.block);
        self.used.push((Shape { rows, cols, block }, copy.clone()));
        Ok(copy)
    }

    /// Write this load's copies when any were recovered here (or the file had more than
    /// the load asked for) and at least one exists; a failed write is logged, not fatal.
    /// Returns whether a file was written.
    pub fn save(mut self) -> bool {
        let Some(path) = self.path.take() else { return false };
        let stale = self.cached.as_mut().is_some_and(|c| c.next().is_some());
        if (self.built == 0 && !stale) || self.used.iter().all(|(_, c)| c.is_none()) {
            return false;
        }
        // Unique per save: two loads of one model in one process may save at once.
        static SAVES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
        let written = crate::private_files::create_dir_all(path.parent().unwrap_or(Path::new(".")))
            .and_then(|_| write(&tmp, &self.key, &self.dir, &self.used))
            .and_then(|_| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => {
                prune(&path);
                true
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "host copies: cannot write");
                let _ = std::fs::remove_file(&tmp);
                false
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The part of a file's name that says which model directory it belongs to.
fn dir_tag(dir: &Path, part: Option<&str>) -> String {
    // A shard's copies are a file of their own: another part of the same directory neither
    // reads nor prunes them.
    let named = match part {
        None => dir.to_string_lossy().to_string(),
        Some(p) => format!("{}\0{p}", dir.to_string_lossy()),
    };
    hex(&Sha256::digest(named.as_bytes())[..8])
}

/// After writing `path`: remove the files of the same model directory made from other
/// weights, those of model directories that no longer exist (a re-import elsewhere, a
/// test's temporary copy), and anything that is not a host-copy file. Temporary files are
/// left to their writers for an hour.
fn prune(path: &Path) {
    let (Some(store), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return;
    };
    let tag = name.split('-').next().unwrap_or(name);
    for entry in std::fs::read_dir(store).into_iter().flatten().flatten() {
        let other = entry.file_name().to_string_lossy().to_string();
        let recent = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() < 3600));
        let remove = if other == name {
            false
        } else if other.starts_with(&format!("{tag}-")) {
            true
        } else if other.contains(".tmp") {
            !recent
        } else {
            FORMAT.header::<Header>(&entry.path()).is_none_or(|(h, _)| !h.dir.exists())
        };
        if remove {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn write(
    path: &Path,
    key: &str,
    dir: &Path,
    used: &[(Shape, Option<Arc<HostMatrix>>)],
) -> std::io::Result<()> {
    let matrices = used.iter().map(|(s, _)| *s).collect();
    let header = Header { key: key.to_string(), dir: dir.to_path_buf(), matrices };
    let data_len: usize = used.iter().flat_map(|(_, c)| c).map(|m| data_bytes(m)).sum();
    FORMAT.write(path, &header, data_len as u64, |put| {
        for m in used.iter().flat_map(|(_, c)| c) {
            put(&m.quants)?;
            for floats in [&m.scales, &m.offsets] {
                for chunk in floats.chunks(1 << 14) {
                    put(&chunk.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
                }
            }
        }
        Ok(())
    })
}

/// A copy's bytes in the file: one per weight, then two f32 per block.
fn data_bytes(m: &HostMatrix) -> usize {
    m.quants.len() + 8 * m.scales.len()
}

type Entries = Vec<(Shape, Option<Arc<HostMatrix>>)>;

/// Read and check a whole file; every way it can be wrong is an error, never a panic, and
/// nothing larger than the file itself is allocated.
fn read(path: &Path, key: &str) -> std::result::Result<Entries, ReadError> {
    let mut r = FORMAT.open(path)?;
    let bad = ReadError::Bad;
    let header: Header = r.header().map_err(bad)?;
    if header.key != key {
        return Err(bad("made from other weights"));
    }
    // Every size checked against the data's length before anything is allocated.
    let mut expected = 0u64;
    for s in &header.matrices {
        let Some(block) = s.block else { continue };
        let n = s.rows.checked_mul(s.cols).ok_or(bad("bad shape"))?;
        if !matches!(block, 16 | 32) || s.cols % block != 0 || n == 0 {
            return Err(bad("bad shape"));
        }
        expected = expected.saturating_add(n as u64 + 8 * (n / block) as u64);
    }
    if expected != r.data_len() {
        return Err(bad("data length does not match the header"));
    }
    let mut entries = Vec::with_capacity(header.matrices.len());
    for s in header.matrices {
        let Some(block) = s.block else {
            entries.push((s, None));
            continue;
        };
        let n = s.rows * s.cols;
        let quants = r.take(n).map_err(bad)?;
        let mut floats = || -> std::result::Result<Vec<f32>, ReadError> {
            let raw = r.take(4 * (n / block)).map_err(bad)?;
            let v: Vec<f32> =
                raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            match v.iter().all(|x| x.is_finite()) {
                true => Ok(v),
                false => Err(bad("non-finite scale")),
            }
        };
        let (scales, offsets) = (floats()?, floats()?);
        let m = HostMatrix { rows: s.rows, cols: s.cols, block, quants, scales, offsets };
        entries.push((s, Some(Arc::new(m))));
    }
    r.finish().map_err(bad)?;
    Ok(entries)
}
