//! Continuous batching's runtime side (docs/runtime.md §2): the batch on the MLX thread. A
//! turn past the gate hands its sequence in (`join`); one tick steps every sequence of the
//! batch, grouped by model and adapter (`decode::batch::step`: one forward pass per group),
//! hands each finished one back with what its caches leave for the prefix cache, and leaves
//! the MLX thread between steps whenever another job waits (a join, a training window, a
//! load), coming back behind it. The gate bounds how many sequences there are.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::worker::Worker;
use crate::decode::batch::{step, OnPiece, Sequence, StepRows};
use crate::decode::{AdapterRef, GenerateParams, Generation};
use crate::error::{EngineError, Result};
use crate::model::kv_cache::KvState;
use crate::prefix_cache::CacheKey;
use crate::sync::LockExt;

/// Tokens one step feeds at most while some sequence is decoding: a prompt joining is
/// prefilled this many tokens per step between the running streams' tokens, so no stream
/// waits longer than one such step between two tokens (`perch bench --scenario concurrent`
/// measures the gap). With nothing decoding, a step prefills one chunk (512 tokens).
pub const STEP_TOKENS: usize = 64;

/// A finished sequence, as the turn that joined it gets it back.
pub struct Finished {
    pub generation: Generation,
    pub key: CacheKey,
    /// States to copy out to the prefix cache's disk tier (a job of their own).
    pub to_disk: Vec<KvState>,
}

type Done = std::sync::mpsc::Sender<Result<Finished>>;

struct Slot {
    model: String,
    adapter: Option<AdapterRef>,
    key: CacheKey,
    seq: Sequence,
    joined: Instant,
    done: Done,
}

/// The sequences on the MLX thread, and whether a tick is queued or running for them.
#[derive(Default)]
pub struct Batch {
    slots: Vec<Slot>,
    ticking: bool,
    step_tokens: usize,
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

    fn count_step(&self, rows: StepRows) {
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

    /// Sequences in the batch now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn publish(&self) {
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

/// What a turn hands the batch.
pub struct Joining {
    pub model: String,
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub cancel: Arc<AtomicBool>,
    pub on_piece: OnPiece,
}

/// Join the batch (on the MLX thread): the sequence starts from the prefix cache's best state
/// for it, and `done` hears its end. Starts the tick when none is queued or running.
pub(crate) fn join(w: &mut Worker, j: Joining, done: Done) {
    let seq = (|| {
        let key =
            CacheKey::of(w.model(&j.model)?, j.params.adapter.as_ref().map(|a| a.dir.as_path()));
        let from = w.prefix.lookup(&key, &j.prompt, false);
        let adapter = j.params.adapter.clone();
        let model = w.model(&j.model)?;
        let seq = Sequence::new(model, j.prompt, j.params, from, j.cancel, j.on_piece)?;
        Ok::<_, EngineError>((key, adapter, seq))
    })();
    match seq {
        Ok((key, adapter, seq)) => {
            let slot = Slot { model: j.model, adapter, key, seq, joined: Instant::now(), done };
            w.batch.slots.push(slot);
            w.batch.publish();
            if !w.batch.ticking {
                w.batch.ticking = true;
                tick(w);
            }
        }
        Err(e) => drop(done.send(Err(e))),
    }
}

/// Step until the batch is empty, or until another job waits: then queue the tick behind it.
fn tick(w: &mut Worker) {
    loop {
        if w.batch.slots.is_empty() {
            w.batch.ticking = false;
            w.batch.publish();
            return;
        }
        // A panic in a step fails the sequences of that step, not the batch's later ones.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step_all(w))).is_err() {
            tracing::error!("a batch step panicked; its sequences fail");
            w.batch.slots.clear();
        }
        w.batch.publish();
        if w.mlx_pending() > 0 && !w.batch.slots.is_empty() {
            let queued = w.resubmit(Box::new(tick));
            if queued.is_err() {
                // The engine is shutting down: the sequences end with the thread's error.
                w.batch.slots.clear();
                w.batch.ticking = false;
            }
            return;
        }
    }
}

/// One step of every group (model, adapter), then the finished sequences handed back.
fn step_all(w: &mut Worker) {
    let mut slots = std::mem::take(&mut w.batch.slots);
    let decoding = slots.iter().any(|s| !s.seq.prefilling() && !s.seq.ended());
    // With nothing decoding, one prefill chunk's worth a step (not one chunk per prompt:
    // eight joining prompts in one pass would hold every join and cancellation for its
    // whole length).
    let idle = GenerateParams::default().prefill_chunk;
    let budget = if decoding { w.batch.step_tokens } else { idle.max(w.batch.step_tokens) };
    let mut groups: Vec<(String, Option<AdapterRef>)> = vec![];
    for s in &slots {
        let g = (s.model.clone(), s.adapter.clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let mut failed: Vec<(usize, EngineError)> = vec![];
    let mut rows = StepRows::default();
    for (model, adapter) in &groups {
        let members: Vec<usize> = (0..slots.len())
            .filter(|&i| slots[i].model == *model && slots[i].adapter == *adapter)
            .collect();
        let result = w.attach(model, adapter.as_ref()).and_then(|m| {
            let mut seqs: Vec<&mut Sequence> = slots
                .iter_mut()
                .filter(|s| s.model == *model && s.adapter == *adapter)
                .map(|s| &mut s.seq)
                .collect();
            let r = step(m, &mut seqs, budget);
            m.adapter = None;
            r
        });
        match result {
            Ok(r) => {
                rows.decoded += r.decoded;
                rows.prefilled += r.prefilled;
            }
            Err(e) => {
                let msg = e.to_string();
                failed.extend(members.iter().map(|&i| (i, EngineError::Internal(msg.clone()))));
            }
        }
    }
    w.batch.stats.count_step(rows);
    let mut kept = Vec::with_capacity(slots.len());
    for (i, slot) in slots.into_iter().enumerate() {
        if let Some(pos) = failed.iter().position(|(f, _)| *f == i) {
            let (_, e) = failed.swap_remove(pos);
            let _ = slot.done.send(Err(e));
        } else if slot.seq.ended() {
            let Slot { key, seq, done, .. } = slot;
            let (g, state, marks) = seq.finish();
            let _ = done.send(g.map(|generation| {
                let to_disk = w.prefix.keep_turn(&key, state, marks, generation.cached_tokens);
                Finished { generation, key, to_disk }
            }));
        } else {
            kept.push(slot);
        }
    }
    w.batch.slots = kept;
}
