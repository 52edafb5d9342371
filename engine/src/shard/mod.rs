//! Pipeline sharding: one model split by layers over several processes (one per machine),
//! joined by MLX's distributed backend. Rank 0 serves the API and runs the embeddings, its
//! first layers, the head and sampling (`link`); every other rank runs its layers for it
//! (`worker`). Activations go round the ring 0 → 1 → … → 0 (`wire`). docs/sharding.md.

pub mod group;
pub mod link;
pub mod plan;
pub mod wire;
pub mod worker;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use link::Link;
pub use plan::Plan;

/// How this process takes part in a sharded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardConfig {
    /// MLX's ring hostfile: a JSON list with one list of "ip:port" per rank.
    pub hostfile: PathBuf,
    pub rank: usize,
    /// How long forming the group may wait for every rank.
    pub join_timeout: Duration,
}

/// What went wrong with the group, rendered at the edges.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShardError {
    /// The group could not be formed or a rank refused its part (bad hostfile, a rank that
    /// never joined, another model on a rank).
    #[error("shard group: {0}")]
    Setup(String),
    /// A rank is gone (its connection closed) or answered out of step: the group serves no
    /// more requests until it is restarted.
    #[error("shard group lost: {0}")]
    Lost(String),
}

/// A hostfile in MLX's ring format, checked before MLX reads it.
pub struct Hostfile {
    /// Each rank's addresses ("ip:port").
    pub ranks: Vec<Vec<String>>,
}

/// Most ranks a hostfile may name (a bound on what a hostile file can ask for).
pub const MAX_RANKS: usize = 64;

impl Hostfile {
    pub fn read(path: &Path) -> Result<Hostfile, ShardError> {
        let bad = |why: String| ShardError::Setup(format!("hostfile {}: {why}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.len() > 1 << 20 {
            return Err(bad("larger than 1 MiB".into()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let ranks: Vec<Vec<String>> = serde_json::from_str(&text).map_err(|e| {
            bad(format!("not MLX's ring format (a list of lists of \"ip:port\"): {e}"))
        })?;
        if !(2..=MAX_RANKS).contains(&ranks.len()) {
            return Err(bad(format!("names {} ranks; 2 to {MAX_RANKS} are needed", ranks.len())));
        }
        for (r, addrs) in ranks.iter().enumerate() {
            if addrs.is_empty() {
                return Err(bad(format!("rank {r} has no address")));
            }
            for a in addrs {
                if a.parse::<std::net::SocketAddr>().is_err() {
                    return Err(bad(format!("rank {r}: `{a}` is not an ip:port")));
                }
            }
        }
        Ok(Hostfile { ranks })
    }
}

/// The group as /health shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardHealth {
    /// `ready`, or `lost` once a rank is gone.
    pub state: &'static str,
    pub ranks: usize,
    /// First layer of each rank, then the layer count.
    pub layer_starts: Vec<usize>,
    /// Weight bytes each rank holds (rank 0's embeddings and head included).
    pub weight_bytes: Vec<u64>,
    /// Why the group stopped, once it has.
    pub reason: Option<String>,
    pub traffic: link::Traffic,
}

#[cfg(test)]
mod tests;
