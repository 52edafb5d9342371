//! The batch (docs/runtime.md §2): the user turns generating together on the MLX thread, what
//! it reports to /health and /metrics, and its bounds. `scheduler` steps it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use crate::decode::batch::{Sequence, StepRows};
use crate::decode::{AdapterRef, Generation};
use crate::error::Result;
use crate::model::kv_cache::KvState;
use crate::prefix_cache::CacheKey;
use crate::sync::LockExt;

/// Prompt tokens one step feeds at most while some sequence is decoding (the `step_tokens`
/// setting's default): a prompt joining is prefilled between the running streams' tokens,
/// as many per step as keep the step within ~2.5 decode-only steps (`pace.rs`) up to this.
/// `scripts/bench-concurrent` measures the streams' longest gap. With nothing decoding, a
/// step prefills one chunk (512 tokens).
pub const STEP_TOKENS: usize = 64;

/// The most requests one batch may hold: each holds its own caches, and past this a step's
/// per-sequence attention costs more than the shared weight reads save.
pub const MAX_BATCH: usize = 64;

/// A finished sequence, as the turn that joined it gets it back.
pub struct Finished {
    pub generation: Generation,
    pub key: CacheKey,
    /// States to copy out to the prefix cache's disk tier (a job of their own).
    pub to_disk: Vec<KvState>,
}

pub(super) type Done = std::sync::mpsc::Sender<Result<Finished>>;

pub(super) struct Slot {
    pub model: String,
    pub adapter: Option<AdapterRef>,
    pub key: CacheKey,
    pub seq: Sequence,
    pub joined: Instant,
    pub done: Done,
}

/// The sequences on the MLX thread, and whether a tick is queued or running for them.
#[derive(Default)]
pub struct Batch {
    pub(super) slots: Vec<Slot>,
    pub(super) ticking: bool,
    pub(super) step_tokens: usize,
    /// What a step costs, for how much of a joining prompt the next may take.
    pub(super) pace: super::pace::Pace,
    pub(crate) stats: Arc<BatchStats>,
}

/// What the batch does, for /health and /metrics (read off the MLX thread).
#[derive(Default)]
pub struct BatchStats {
    /// Forward passes run, and sequences summed over them (their ratio: the mean batch).
    pub steps: AtomicU64,
    pub step_sequences: AtomicU64,
    /// Sequences that sampled a token in the last step.
    pub last_batch: AtomicU64,
    pub prefill_tokens: AtomicU64,
    /// Steps by how many sequences sampled in them (index: the batch size, the last entry
    /// counting every larger one).
    by_size: [AtomicU64; SIZES],
    slots: Mutex<Vec<SlotView>>,
}

/// Batch sizes counted apart in `BatchStats::by_size` (0 to 16, then 17 and above).
const SIZES: usize = 18;

/// One sequence of the batch as /health lists it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SlotView {
    pub model: String,
    /// `prefill` or `decode`.
    pub state: &'static str,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub age_s: f64,
}

impl BatchStats {
    pub fn slots(&self) -> Vec<SlotView> {
        self.slots.locked().clone()
    }

    /// Steps run at each batch size: (size, steps), the last size meaning "this or more".
    pub fn steps_by_size(&self) -> Vec<(usize, u64)> {
        self.by_size.iter().enumerate().map(|(n, c)| (n, c.load(Ordering::Relaxed))).collect()
    }

    pub(super) fn count_step(&self, rows: StepRows) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences.fetch_add(rows.decoded as u64, Ordering::Relaxed);
        self.last_batch.store(rows.decoded as u64, Ordering::Relaxed);
        self.prefill_tokens.fetch_add(rows.prefilled as u64, Ordering::Relaxed);
        self.by_size[rows.decoded.min(SIZES - 1)].fetch_add(1, Ordering::Relaxed);
    }
}

impl Batch {
    /// `stats`: where the batch reports (shared with /health and /metrics).
    pub fn new(step_tokens: usize, stats: Arc<BatchStats>) -> Batch {
        Batch { step_tokens: step_tokens.max(1), stats, ..Batch::default() }
    }

    pub(super) fn publish(&self) {
        let views = self
            .slots
            .iter()
            .map(|s| {
                let (prompt_tokens, generated_tokens) = s.seq.progress();
                SlotView {
                    model: s.model.clone(),
                    state: if s.seq.prefilling() { "prefill" } else { "decode" },
                    prompt_tokens,
                    generated_tokens,
                    age_s: s.joined.elapsed().as_secs_f64(),
                }
            })
            .collect();
        *self.stats.slots.locked() = views;
    }
}
