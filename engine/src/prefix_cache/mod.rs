//! The prefix cache: KV states of earlier generations, keyed by the exact tokens they hold, so
//! a request prefills only what follows the longest prefix it shares with any of them (the
//! next turn of a conversation, another conversation with the same system prompt and tools).
//!
//! Two tiers: RAM (a byte budget, least recently used out first) and files in the platform
//! cache directory that survive restarts (`disk`). States are keyed by a fingerprint of the
//! weights, the compute dtype and the adapter, so a re-imported model or a changed adapter
//! never reuses another's keys and values. It lives on the MLX thread (`runtime::worker`).

mod disk;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::kv_cache::KvState;
use crate::model::LoadedModel;
use disk::DiskTier;

/// Sizes of the two tiers (0 turns a tier off).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixCacheConfig {
    pub ram_bytes: usize,
    pub disk_bytes: u64,
    /// Where the disk tier keeps its files (`None`: no disk tier).
    pub disk_dir: Option<PathBuf>,
    /// Prefixes are reused, and reported as `cached_tokens`, in whole blocks of this many
    /// tokens (1: any length). Reuse exact to the token is a prefix oracle across clients:
    /// one guessing another's prompt word by word would see how far each guess matches,
    /// in the count and in the time to the first token.
    pub block: usize,
}

/// The block where clients are told apart by a key (`docs/prefix-cache.md`): OpenAI's
/// prompt caching reports in the same steps.
pub const SHARED_BLOCK: usize = 128;

impl PrefixCacheConfig {
    /// The block for a server with or without an API key: without one every local program
    /// is equally trusted (each can read the cache's files as well), with one the cache
    /// reveals whole blocks only.
    pub fn block_for(api_key_set: bool) -> usize {
        if api_key_set {
            SHARED_BLOCK
        } else {
            1
        }
    }
}

impl Default for PrefixCacheConfig {
    /// RAM only: tests and embedders never write to the user's cache directory unasked.
    fn default() -> Self {
        PrefixCacheConfig { ram_bytes: 1 << 30, disk_bytes: 0, disk_dir: None, block: 1 }
    }
}

/// Shorter states are not written to disk: prefilling them again costs little.
const DISK_MIN_TOKENS: usize = 256;
/// A disk state is read only when it reuses this many more tokens than the best in RAM.
const DISK_MIN_GAIN: usize = 64;

/// What the cache did, for `/metrics` and `/health` (read from any thread).
#[derive(Debug, Default)]
pub struct PrefixStats {
    pub hit_tokens: AtomicU64,
    pub miss_tokens: AtomicU64,
    pub ram_bytes: AtomicU64,
    pub ram_entries: AtomicU64,
    pub disk_bytes: AtomicU64,
    pub disk_entries: AtomicU64,
    /// States read back from disk, and files found bad and removed.
    pub disk_loads: AtomicU64,
    pub disk_rejected: AtomicU64,
    /// States not written: larger than the disk budget, or the writer still busy with the
    /// ones before (its queue is bounded).
    pub disk_skipped: AtomicU64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PrefixSnapshot {
    pub hit_tokens: u64,
    pub miss_tokens: u64,
    pub ram_bytes: u64,
    pub ram_entries: u64,
    pub disk_bytes: u64,
    pub disk_entries: u64,
    pub disk_loads: u64,
    pub disk_rejected: u64,
    pub disk_skipped: u64,
}

impl PrefixStats {
    pub fn snapshot(&self) -> PrefixSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PrefixSnapshot {
            hit_tokens: g(&self.hit_tokens),
            miss_tokens: g(&self.miss_tokens),
            ram_bytes: g(&self.ram_bytes),
            ram_entries: g(&self.ram_entries),
            disk_bytes: g(&self.disk_bytes),
            disk_entries: g(&self.disk_entries),
            disk_loads: g(&self.disk_loads),
            disk_rejected: g(&self.disk_rejected),
            disk_skipped: g(&self.disk_skipped),
        }
    }
}

/// Which weights (and adapter, and dtype) a state was computed with: the model's id and the
/// hex of a SHA-256 over the model directory's files (name, size, modification time), the
/// compute dtype and the adapter file's. Cheap (no file is read), and it changes when any of
/// them does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    model: String,
    digest: String,
}

impl CacheKey {
    pub fn of(model: &LoadedModel, adapter_dir: Option<&Path>) -> CacheKey {
        let mut h = Sha256::new();
        let mut stamp = |path: &Path| {
            h.update(path.to_string_lossy().as_bytes());
            if let Ok(m) = std::fs::metadata(path) {
                h.update(m.len().to_le_bytes());
                let t =
                    m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                h.update(t.map_or(0, |t| t.as_nanos()).to_le_bytes());
            }
            h.update([0]);
        };
        let dir = std::fs::canonicalize(&model.dir).unwrap_or_else(|_| model.dir.clone());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect())
            .unwrap_or_default();
        files.sort();
        for f in &files {
            stamp(f);
        }
        if let Some(a) = adapter_dir {
            stamp(&a.join("adapters.safetensors"));
        }
        h.update(format!("{:?}", model.compute_dtype).as_bytes());
        let digest = h.finalize();
        CacheKey {
            model: model.id.clone(),
            digest: digest[..16].iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// The digest alone (what the disk tier's file names and headers carry).
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

struct Entry {
    key: CacheKey,
    state: KvState,
    bytes: usize,
    used: u64,
}

/// The two tiers, on the MLX thread.
pub struct PrefixCache {
    ram_budget: usize,
    block: usize,
    entries: Vec<Entry>,
    clock: u64,
    disk: Option<DiskTier>,
    stats: Arc<PrefixStats>,
}

/// Longest common prefix of two token lists.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many of `prompt`'s tokens `state` can supply: a proper prefix (the last prompt token
/// is always run, for its logits), every layer able to cut back to it, and with MTP drafting
/// the head's pair for each reused position (pair p needs token p + 1 to match as well),
/// in whole blocks.
fn usable(state: &KvState, prompt: &[u32], mtp: bool, block: usize) -> usize {
    let shared = common_prefix(&state.tokens, prompt);
    let mut n = shared.min(prompt.len().saturating_sub(1));
    if mtp {
        let pairs = state.mtp.as_ref().map_or(0, |m| m.offset().max(0) as usize);
        n = n.min(shared.saturating_sub(1)).min(pairs);
    }
    let n = whole_blocks(n, block);
    if n > 0 && state.can_truncate(n) {
        n
    } else {
        0
    }
}

/// `n` rounded down to a multiple of `block`.
fn whole_blocks(n: usize, block: usize) -> usize {
    n - n % block.max(1)
}

/// The shortest prefix `state` can be cut back to (0 when it has no sliding-window ring).
/// A state that can be cut back to n can be cut back to any longer prefix, so this bisects.
fn shortest_cut(state: &KvState) -> usize {
    let (mut lo, mut hi) = (0, state.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        match state.can_truncate(mid) {
            true => hi = mid,
            false => lo = mid + 1,
        }
    }
    lo
}

impl PrefixCache {
    pub fn new(config: &PrefixCacheConfig, stats: Arc<PrefixStats>) -> PrefixCache {
        let disk = match &config.disk_dir {
            Some(dir) if config.disk_bytes > 0 => {
                DiskTier::open(dir.clone(), config.disk_bytes, stats.clone())
            }
            _ => None,
        };
        PrefixCache {
            ram_budget: config.ram_bytes,
            block: config.block.max(1),
            entries: vec![],
            clock: 0,
            disk,
            stats,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The state to start `prompt` from: the longest usable prefix in RAM, or on disk when
    /// that is clearly longer. Counts the hit and miss tokens.
    pub fn lookup(&mut self, key: &CacheKey, prompt: &[u32], mtp: bool) -> Option<KvState> {
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| &e.key == key)
            .map(|(i, e)| (usable(&e.state, prompt, mtp, self.block), i))
            .max();
        let mut best = best.filter(|(n, _)| *n > 0);
        let in_ram = best.map_or(0, |b| b.0);
        if let Some(disk) = &mut self.disk {
            // Whole blocks here too: reading a file is as visible in the time as a match.
            if whole_blocks(disk.best_prefix(key, prompt), self.block) >= in_ram + DISK_MIN_GAIN {
                if let Some(state) = disk.load(key, prompt) {
                    let n = usable(&state, prompt, mtp, self.block);
                    if n > in_ram {
                        self.insert_ram(key.clone(), state);
                        best = Some((n, self.entries.len() - 1));
                    }
                }
            }
        }
        let hit = best.and_then(|(n, i)| {
            let used = self.tick();
            let e = &mut self.entries[i];
            e.used = used;
            let mut s = e.state.clone();
            s.truncate(n).then_some(s)
        });
        let n = hit.as_ref().map_or(0, |s| s.len());
        self.stats.hit_tokens.fetch_add(n as u64, Ordering::Relaxed);
        self.stats.miss_tokens.fetch_add((prompt.len() - n) as u64, Ordering::Relaxed);
        hit
    }

    /// Keep what a generation left behind, in RAM and on disk (`keep` then `persist`).
    pub fn store(&mut self, key: CacheKey, state: KvState) {
        self.keep(key.clone(), state.clone());
        self.persist(&key, &state);
    }

    /// Keep a state in RAM (cheap: the arrays are shared, not copied). States it makes
    /// redundant (a prefix it can be cut back to) are dropped.
    pub fn keep(&mut self, key: CacheKey, state: KvState) {
        if !state.is_empty() {
            self.insert_ram(key, state);
        }
    }

    /// Keep what a server turn left: the generation's final state and the prefill's marks
    /// (`decode::generate_marked`), in RAM. Returns those the disk tier wants, for `persist`
    /// once the answer has gone. A turn that started cold (`reused` 0: a new conversation)
    /// sends its marks there too, so that after a restart another conversation sharing its
    /// long system prompt still finds it on a sliding-window model; later turns' marks lie
    /// past the shared part and would only churn the tier.
    pub fn keep_turn(
        &mut self,
        key: &CacheKey,
        state: Option<KvState>,
        marks: Vec<KvState>,
        reused: usize,
    ) -> Vec<KvState> {
        let mut to_disk = vec![];
        let marks = marks.into_iter().map(|m| (m, reused == 0));
        for (s, disk) in marks.chain(state.map(|s| (s, true))) {
            if disk && self.wants_on_disk(&s) {
                to_disk.push(s.clone());
            }
            self.keep(key.clone(), s);
        }
        to_disk
    }

    /// Whether `persist` would write `state` (a disk tier, and a state long enough).
    pub fn wants_on_disk(&self, state: &KvState) -> bool {
        self.disk.is_some() && state.len() >= DISK_MIN_TOKENS
    }

    /// Write a state to the disk tier: copied out of MLX here, written by the tier's thread.
    /// Costs a copy of the state, so the engine runs it after the turn's answer has gone.
    pub fn persist(&mut self, key: &CacheKey, state: &KvState) {
        if self.wants_on_disk(state) {
            if let Some(disk) = &mut self.disk {
                disk.store(key, state);
            }
        }
    }

    fn insert_ram(&mut self, key: CacheKey, state: KvState) {
        let bytes = state.nbytes();
        if bytes > self.ram_budget {
            return;
        }
        // The new state stands in for an old one only if it reaches every prefix the old one
        // could serve: with sliding-window rings, cutting back to the old one's length is not
        // enough (a chain of such replacements would lose the oldest prefixes).
        let covers = |old: &KvState| {
            old.len() <= state.len()
                && state.tokens[..old.len()] == old.tokens[..]
                && state.can_truncate(shortest_cut(old))
                && old
                    .mtp
                    .as_ref()
                    .is_none_or(|m| state.mtp.as_ref().is_some_and(|n| n.offset() >= m.offset()))
        };
        self.entries.retain(|e| e.key != key || !covers(&e.state));
        let used = self.tick();
        self.entries.push(Entry { key, state, bytes, used });
        while self.entries.iter().map(|e| e.bytes).sum::<usize>() > self.ram_budget {
            let oldest = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|x| x.0);
            match oldest {
                Some(i) => drop(self.entries.remove(i)),
                None => break,
            }
        }
        self.publish();
    }

    /// Forget the RAM states of model `id` (it was unloaded); its disk states stay.
    pub fn forget(&mut self, id: &str) {
        self.entries.retain(|e| e.key.model != id);
        self.publish();
    }

    /// Give all RAM back (memory is needed elsewhere); the disk tier stays.
    pub fn clear_ram(&mut self) {
        self.entries.clear();
        self.publish();
    }

    fn publish(&self) {
        let bytes: usize = self.entries.iter().map(|e| e.bytes).sum();
        self.stats.ram_bytes.store(bytes as u64, Ordering::Relaxed);
        self.stats.ram_entries.store(self.entries.len() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
