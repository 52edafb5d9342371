//! Which layers each rank runs: contiguous runs chosen so every rank holds about the same
//! weight bytes (rank 0 also holds the embeddings, the head and any MTP head, so it takes
//! fewer layers), and a fingerprint that tells two ranks they read the same model.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::ShardError;

/// Layer runs: rank r runs layers `starts[r]..starts[r + 1]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub starts: Vec<usize>,
}

impl Plan {
    /// Split `layer_bytes.len()` layers over `ranks`, rank 0 also holding `rank0_extra`
    /// bytes: each boundary is the layer edge nearest its share of the total. Every rank but
    /// 0 gets at least one layer (rank 0 may get none, when its extra weighs a share).
    pub fn balance(
        layer_bytes: &[u64],
        rank0_extra: u64,
        ranks: usize,
    ) -> Result<Plan, ShardError> {
        let n = layer_bytes.len();
        if ranks < 2 || n < ranks - 1 {
            return Err(ShardError::Setup(format!(
                "{n} layers cannot be split over {ranks} ranks (each rank after 0 needs one)"
            )));
        }
        let total: u64 = rank0_extra + layer_bytes.iter().sum::<u64>();
        // cum[i]: bytes held by rank 0's extra plus layers 0..i.
        let mut cum = vec![rank0_extra; n + 1];
        for i in 0..n {
            cum[i + 1] = cum[i] + layer_bytes[i];
        }
        let mut starts = vec![0];
        for r in 1..ranks {
            let target = total as f64 * r as f64 / ranks as f64;
            let lo = if r == 1 { 0 } else { starts[r - 1] + 1 };
            let hi = n - (ranks - r);
            let best = (lo..=hi)
                .min_by(|&a, &b| {
                    let da = (cum[a] as f64 - target).abs();
                    let db = (cum[b] as f64 - target).abs();
                    da.total_cmp(&db)
                })
                .unwrap_or(lo);
            starts.push(best);
        }
        starts.push(n);
        Ok(Plan { starts })
    }

    pub fn ranks(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn layers(&self) -> usize {
        self.starts[self.ranks()]
    }

    pub fn range(&self, rank: usize) -> std::ops::Range<usize> {
        self.starts[rank]..self.starts[rank + 1]
    }

    /// The plan as words on the wire, and back (checked: increasing, every rank after 0
    /// with a layer).
    pub fn words(&self) -> Vec<i32> {
        self.starts.iter().map(|&s| s as i32).collect()
    }

    pub fn from_words(words: &[i32]) -> Option<Plan> {
        let starts: Vec<usize> =
            words.iter().map(|&w| usize::try_from(w).ok()).collect::<Option<_>>()?;
        let ok = starts.len() >= 3
            && starts[0] == 0
            && starts.windows(2).enumerate().all(|(r, w)| w[0] < w[1] || (r == 0 && w[0] == w[1]));
        ok.then_some(Plan { starts })
    }
}

/// Words naming a model directory's contents: its config.json and the names and sizes of its
/// weight files. Ranks on other machines hold their own copy; the same words mean the same
/// model.
pub fn fingerprint(dir: &Path) -> Result<[i32; 8], ShardError> {
    let bad = |why: String| ShardError::Setup(format!("{}: {why}", dir.display()));
    let mut hash = Sha256::new();
    hash.update(std::fs::read(dir.join("config.json")).map_err(|e| bad(e.to_string()))?);
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map_err(|e| bad(e.to_string()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let size = e.metadata().ok()?.len();
            name.ends_with(".safetensors").then_some((name, size))
        })
        .collect();
    files.sort();
    for (name, size) in files {
        hash.update(format!("\n{name} {size}"));
    }
    let d = hash.finalize();
    let mut words = [0i32; 8];
    for (i, w) in words.iter_mut().enumerate() {
        *w = i32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]]);
    }
    Ok(words)
}
