//! Continuous batching on the MLX thread (docs/runtime.md §2): a turn past the gate hands its
//! sequence in (`join`); one tick steps every sequence of the batch, grouped by model and
//! adapter (`decode::batch::step`: one forward pass per group), hands each finished one back
//! with what its caches leave for the prefix cache, and leaves the MLX thread between steps
//! whenever another job waits (a join, a training window, a load), coming back behind it.
//! The gate bounds how many sequences there are.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::batch::{Done, Finished, Slot};
use super::worker::Worker;
use crate::decode::batch::{step, OnPiece, Sequence, StepRows};
use crate::decode::{AdapterRef, GenerateParams};
use crate::error::EngineError;
use crate::prefix_cache::CacheKey;

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
            let lost = std::mem::take(&mut w.batch.slots);
            w.batch.publish();
            drop(lost);
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
    // Beside decoding sequences, prompts that fit one step go in whole (short prompts keep
    // their first token one step away); longer ones as the pace allows.
    let longest = slots.iter().filter(|s| s.seq.prefilling()).map(|s| s.seq.prefill_left()).max();
    let paced = decoding && longest.unwrap_or(0) > w.batch.step_tokens;
    let budget = match (decoding, paced) {
        (true, true) => w.batch.pace.budget(w.batch.step_tokens),
        (true, false) => w.batch.step_tokens,
        (false, _) => idle.max(w.batch.step_tokens),
    };
    let started = Instant::now();
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
                // Each member gets the step's error; a lost shard rank stays itself (a 503
                // the client may retry later), anything else is the engine's fault.
                let each = |e: &EngineError| match e {
                    EngineError::ShardLost(why) => EngineError::ShardLost(why.clone()),
                    other => EngineError::Internal(other.to_string()),
                };
                failed.extend(members.iter().map(|&i| (i, each(&e))));
            }
        }
    }
    // Only steps beside decoding ones teach the pace (an idle prompt's chunk is no one's gap).
    if decoding && failed.is_empty() {
        let paced = paced && rows.prefilled >= budget;
        let seconds = started.elapsed().as_secs_f64();
        w.batch.pace.observe(rows.decoded, rows.prefilled, seconds, paced, w.batch.step_tokens);
    }
    w.batch.stats.count_step(rows);
    let mut kept = Vec::with_capacity(slots.len());
    let mut ended = vec![];
    for (i, slot) in slots.into_iter().enumerate() {
        if let Some(pos) = failed.iter().position(|(f, _)| *f == i) {
            let (_, e) = failed.swap_remove(pos);
            ended.push((slot.done, Err(e)));
        } else if slot.seq.ended() {
            let Slot { key, seq, done, .. } = slot;
            let (g, state, marks) = seq.finish();
            ended.push((
                done,
                g.map(|generation| {
                    let to_disk = w.prefix.keep_turn(&key, state, marks, generation.cached_tokens);
                    Finished { generation, key, to_disk }
                }),
            ));
        } else {
            kept.push(slot);
        }
    }
    // The slots are shown without the ended ones before their turns hear of the end: a
    // client that sees its answer end never sees its slot still taken.
    w.batch.slots = kept;
    w.batch.publish();
    for (done, result) in ended {
        let _ = done.send(result);
    }
}
