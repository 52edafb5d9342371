//! Training while serving (docs/training.md): LoRA adapters trained in windows between user turns,
//! paced by a share of the time or a slowdown bound, with a per-turn slowdown receipt.
//!
//! `Training` is the engine's hub: serving reports every turn to it (start, end, decode
//! steps, one clock), windows report their spans, and `/train` reads its status. Its one lock
//! guards the receipt and the pacer and is only ever held for a few arithmetic steps.

pub mod data;
pub mod pacing;
pub mod receipt;
pub mod request;
pub mod run;
pub mod trainer;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::runtime::observe::{DecodeMode, TurnFinish, TurnMark, TurnObserver};
use crate::sync::LockExt;
pub use pacing::{Pacer, Pacing};
pub use receipt::{Receipt, ReceiptSummary, TurnOutcome};
pub use run::{Run, RunState, RunStatus};

#[derive(Default)]
struct Ledger {
    /// Turns generating now: id → start. A run that starts mid-turn learns of them.
    open: BTreeMap<u64, f64>,
    /// The current run's receipt and pacer (kept after it ends, for its status).
    receipt: Option<Receipt>,
    pacer: Pacer,
    /// Whether a window is running now.
    in_window: bool,
}

pub struct Training {
    clock: Instant,
    ledger: Mutex<Ledger>,
    run: Mutex<Option<Arc<Run>>>,
    /// A run being prepared (its data tokenized) before it is installed: one at a time.
    preparing: std::sync::atomic::AtomicBool,
    next_turn: AtomicU64,
    /// Fault injection for tests: the next window's work panics on the MLX thread.
    panic_next_window: std::sync::atomic::AtomicBool,
}

impl Default for Training {
    fn default() -> Self {
        Training {
            clock: Instant::now(),
            ledger: Mutex::default(),
            run: Mutex::default(),
            preparing: std::sync::atomic::AtomicBool::new(false),
            next_turn: AtomicU64::new(0),
            panic_next_window: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Training {
    pub fn new() -> Arc<Training> {
        Arc::new(Training::default())
    }

    /// Seconds on the one clock turns and windows share.
    pub fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.locked()
    }

    /// A user turn starts generating. Finish it with its decode steps; dropping it unfinished
    /// (an error) reports zero steps, which the receipt skips but still prunes on.
    pub fn turn_begin(self: &Arc<Self>) -> Turn {
        let id = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let start = self.now();
        let mut l = self.ledger();
        l.open.insert(id, start);
        if let Some(r) = l.receipt.as_mut() {
            r.turn_started(id, start);
        }
        drop(l);
        Turn { training: self.clone(), id, start, done: false }
    }

    /// A turn ended at `at` (now, if it failed) after `steps` decode steps in `mode`,
    /// `prefill` s of its time spent on its prompt.
    fn turn_end(
        &self,
        id: u64,
        start: f64,
        (steps, prefill, slot): (usize, f64, usize),
        at: Option<Instant>,
    ) -> Option<TurnOutcome> {
        let end = at
            .map_or_else(|| self.now(), |t| t.saturating_duration_since(self.clock).as_secs_f64());
        let mut l = self.ledger();
        l.open.remove(&id);
        let outcome =
            l.receipt.as_mut().map(|r| r.turn_finished(id, slot, (start, end), prefill, steps))?;
        match outcome {
            TurnOutcome::Clean { tps } => l.pacer.clean_turn(tps, end),
            TurnOutcome::Slowed { overlap_s, .. } | TurnOutcome::Unmeasured { overlap_s } => {
                l.pacer.overlapped_turn(steps, end - start - prefill, overlap_s, end)
            }
            TurnOutcome::Skipped => {}
        }
        // Logging is I/O: never under the lock every turn and window takes.
        drop(l);
        tracing::debug!(id, start, end, steps, ?outcome, "turn");
        Some(outcome)
    }

    /// A new run's receipt and pacer; turns already generating are in flight for it.
    fn begin_receipt(&self, pacing: Pacing) {
        let mut l = self.ledger();
        let mut r = Receipt::new();
        for (id, start) in &l.open {
            r.turn_started(*id, *start);
        }
        l.receipt = Some(r);
        l.pacer = Pacer::new(pacing);
        l.in_window = false;
    }

    /// Called on the MLX thread as a window's work begins and ends; the run's end closes the
    /// last window. Each returns the time it stamped.
    fn window_started(&self) -> f64 {
        self.mark(true, Receipt::window_started)
    }

    /// Tests only: make the next window panic after it has started, as a bug in a trainer
    /// would, so that what closes an abandoned window can be checked.
    #[doc(hidden)]
    pub fn panic_next_window(&self) {
        self.panic_next_window.store(true, Ordering::SeqCst);
    }

    fn take_window_panic(&self) -> bool {
        self.panic_next_window.swap(false, Ordering::SeqCst)
    }

    fn window_ended(&self) -> f64 {
        self.mark(false, Receipt::window_ended)
    }

    fn run_ended(&self) -> f64 {
        self.mark(false, Receipt::run_ended)
    }

    fn mark(&self, in_window: bool, on_receipt: fn(&mut Receipt, f64)) -> f64 {
        let t = self.now();
        let mut l = self.ledger();
        l.in_window = in_window;
        if let Some(r) = l.receipt.as_mut() {
            on_receipt(r, t);
        }
        t
    }

    /// Receipt summary, pacer, and whether a window runs now, in one short lock.
    fn snapshot(&self) -> (ReceiptSummary, Pacer, bool) {
        let l = self.ledger();
        (l.receipt.as_ref().map(Receipt::summary).unwrap_or_default(), l.pacer.clone(), l.in_window)
    }

    /// The current run, or the last one.
    pub fn current(&self) -> Option<Arc<Run>> {
        self.run.locked().clone()
    }

    /// The right to prepare a run, unless one is being prepared or is active. Dropping the
    /// claim (the request ended, or its client left) releases it and cancels the preparing.
    fn claim(self: &Arc<Self>) -> Option<Claim> {
        if self.current().is_some_and(|r| r.is_active()) {
            return None;
        }
        if self.preparing.swap(true, Ordering::SeqCst) {
            return None;
        }
        Some(Claim { training: self.clone(), cancel: Arc::default() })
    }

    /// Install `run` unless one is still active; returns the active one otherwise.
    fn install(&self, run: Arc<Run>) -> Result<(), Arc<Run>> {
        let mut slot = self.run.locked();
        if let Some(active) = slot.as_ref().filter(|r| r.is_active()) {
            return Err(active.clone());
        }
        *slot = Some(run);
        Ok(())
    }

    /// Stop a run on `model` (it is being unloaded), or any run with `None` (shutdown).
    pub fn stop(&self, model: Option<&str>, why: &str) {
        if let Some(run) = self.current().filter(|r| model.is_none_or(|m| r.model == m)) {
            run.stop(why);
        }
    }
}

/// The right to prepare one run (see `Training::claim`).
struct Claim {
    training: Arc<Training>,
    /// Set when the claim is dropped: stops the tokenizing of a request that went away.
    cancel: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.training.preparing.store(false, Ordering::SeqCst);
    }
}

/// A user turn in flight (see `Training::turn_begin`).
pub struct Turn {
    training: Arc<Training>,
    id: u64,
    start: f64,
    done: bool,
}

impl Turn {
    /// The generation produced its last token at `at` after `steps` decode steps and a
    /// prefill of `prefill`. `at` is stamped on the MLX thread: a window queued behind this
    /// turn starts after it, while the serving thread may only see the turn end a moment later.
    pub fn finish(mut self, f: TurnFinish) -> Option<TurnOutcome> {
        self.done = true;
        let measured = (f.tokens_after_first, f.prefill.as_secs_f64(), f.slot());
        self.training.turn_end(self.id, self.start, measured, Some(f.at))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.done {
            self.training.turn_end(self.id, self.start, (0, 0.0, DecodeMode::Plain.slot()), None);
        }
    }
}

/// Serving tells training of every user turn and of unloads through the runtime's observer.
impl TurnObserver for Arc<Training> {
    fn turn_begin(&self) -> Box<dyn TurnMark> {
        Box::new(Training::turn_begin(self))
    }

    fn stop(&self, model: Option<&str>, why: &str) {
        Training::stop(self, model, why)
    }
}

impl TurnMark for Turn {
    fn finish(self: Box<Self>, f: TurnFinish) {
        Turn::finish(*self, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn finish(steps: usize, secs: f64, mode: DecodeMode, t: &Training) -> TurnFinish {
        let at = t.clock + Duration::from_secs_f64(t.now() + secs);
        TurnFinish { tokens_after_first: steps, prefill: Duration::ZERO, at, mode, batch: 1 }
    }

    #[test]
    fn baselines_are_kept_per_batch_size() {
        let t = Training::new();
        t.begin_receipt(Pacing::default());
        // Alone, a clean plain turn: 100 tok/s.
        let alone = t.turn_begin();
        assert!(matches!(
            alone.finish(finish(100, 1.0, DecodeMode::Plain, &t)),
            Some(TurnOutcome::Clean { .. })
        ));
        // In a batch of four, 50 tok/s each while a window runs: no baseline at that size
        // yet, so unmeasured, not a 50% slowdown the window never caused.
        let batched = t.turn_begin();
        t.window_started();
        std::thread::sleep(Duration::from_millis(2));
        t.window_ended();
        let f = TurnFinish { batch: 4, ..finish(50, 1.0, DecodeMode::Plain, &t) };
        assert!(
            matches!(batched.finish(f), Some(TurnOutcome::Unmeasured { .. })),
            "a batched turn was measured against a solo baseline"
        );
    }

    #[test]
    fn a_failed_turn_leaves_the_open_list_and_spans_prune_again() {
        let t = Training::new();
        t.begin_receipt(Pacing::default());
        let failed = t.turn_begin();
        t.window_started();
        std::thread::sleep(Duration::from_millis(2));
        t.window_ended();
        drop(failed); // the generation failed: no finish
        let l = t.ledger();
        assert!(l.open.is_empty(), "a failed turn stayed open in the ledger");
        let r = l.receipt.as_ref().unwrap();
        assert_eq!(r.open_turns(), 0, "a failed turn stayed open in the receipt");
        assert_eq!(r.spans_kept(), 0, "spans no open turn needs were kept");
    }

    #[test]
    fn baselines_are_kept_per_decode_mode() {
        let t = Training::new();
        t.begin_receipt(Pacing::default());
        // Clean MTP turns run at ~3 tokens a step: 300 tokens in a second.
        let mtp = t.turn_begin();
        assert!(matches!(
            mtp.finish(finish(300, 1.0, DecodeMode::Mtp, &t)),
            Some(TurnOutcome::Clean { .. })
        ));
        // A guided (grammar) turn overlapping a window at 100 tok/s has no baseline of its own
        // yet: it is not measured against MTP's 300 (that would read as a 67 % slowdown).
        let guided = t.turn_begin();
        t.window_started();
        std::thread::sleep(Duration::from_millis(2));
        t.window_ended();
        let got = guided.finish(finish(100, 1.0, DecodeMode::Guided, &t));
        assert!(matches!(got, Some(TurnOutcome::Unmeasured { .. })), "{got:?}");
    }
}
