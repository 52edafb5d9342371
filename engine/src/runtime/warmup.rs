//! Load-time MTP warmup (docs/runtime.md §4): after a model with an MTP head is published, a hidden
//! bootstrap and a short MTP pass pay its cold first-use costs before a user does, racing a
//! deadline, never queueing behind a user's generation, and pinned by a lease throughout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::oneshot;

use super::{Gate, Lease};
use crate::error::Result;
use crate::model::LoadedModel;

/// A fixed English passage, tokenized and repeated to the lengths warmups and benchmarks need,
/// so runs and peers (scripts/bench-vs-mlx-lm reads the same file) see the same token ids.
pub const PASSAGE: &str = include_str!("passage.txt");

pub fn prompt_of_length(model: &LoadedModel, n: usize) -> Result<Vec<u32>> {
    let unit = model.tokenizer.encode(PASSAGE, false)?;
    Ok(unit.iter().copied().cycle().take(n).collect())
}

/// The model work of a warmup, so policies can be tested with fakes.
pub trait WarmupWork: Send + Sync {
    /// Start the hidden 2-token bootstrap and MTP pass on `model`; the receiver resolves when
    /// it ends. Setting `cancel` stops it within one step.
    fn start(&self, model: &str, cancel: Arc<AtomicBool>) -> oneshot::Receiver<Result<()>>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmupOutcome {
    /// Not run yet, or the model has no MTP head.
    NotApplicable,
    Disabled,
    Warm,
    /// The deadline passed; the warmup was cancelled and the model stays cold.
    TimedOut,
    /// Another generation held the gate: skipped, warm flag untouched (the first real MTP
    /// request warms the model as it would have without this feature).
    SkippedBusy,
    Failed,
}

/// Run the warmup for `model`. `lease` pins the model for the whole call and is released on
/// every path. Never fails and never waits past `deadline` (plus one second for a cancelled
/// warmup to stop).
pub async fn warm_at_load(
    work: &dyn WarmupWork,
    model: &str,
    gate: &Gate,
    lease: Lease,
    deadline: Duration,
    warm: &AtomicBool,
) -> WarmupOutcome {
    let _lease = lease;
    // Skip if busy (the gate's probe), before touching anything else (docs/runtime.md §2, §4.3).
    let Some(permit) = gate.try_acquire() else {
        tracing::info!(model, "load-time warmup skipped: the gate is busy");
        return WarmupOutcome::SkippedBusy;
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let mut done = work.start(model, cancel.clone());
    let outcome = match tokio::time::timeout(deadline, &mut done).await {
        Ok(Ok(Ok(()))) => {
            warm.store(true, Ordering::SeqCst);
            WarmupOutcome::Warm
        }
        Ok(_) => {
            warm.store(false, Ordering::SeqCst);
            tracing::warn!(model, "load-time warmup failed; the model stays cold");
            WarmupOutcome::Failed
        }
        Err(_) => {
            cancel.store(true, Ordering::SeqCst);
            warm.store(false, Ordering::SeqCst);
            tracing::warn!(
                model,
                deadline_s = deadline.as_secs_f64(),
                "load-time warmup timed out; cancelled, the model stays cold"
            );
            // A cancelled warmup stops within a step; do not wait on one that does not.
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut done).await;
            WarmupOutcome::TimedOut
        }
    };
    drop(permit);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Leases;
    use std::sync::Mutex;

    /// Bounded: a broken guard fails the test instead of hanging it.
    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), f).await.expect("timed out")
    }

    /// A warmup that finishes at once, or never (until cancelled, or not even then).
    struct Fake {
        mode: &'static str,
        started: Mutex<usize>,
        pending: Mutex<Vec<oneshot::Sender<Result<()>>>>,
    }

    impl Fake {
        fn new(mode: &'static str) -> Fake {
            Fake { mode, started: Mutex::new(0), pending: Mutex::new(vec![]) }
        }
    }

    impl WarmupWork for Fake {
        fn start(&self, _model: &str, cancel: Arc<AtomicBool>) -> oneshot::Receiver<Result<()>> {
            *self.started.lock().unwrap() += 1;
            let (tx, rx) = oneshot::channel();
            match self.mode {
                "finishes" => {
                    let _ = tx.send(Ok(()));
                }
                "endless" => {
                    // Ends only when cancelled, within a "step".
                    std::thread::spawn(move || {
                        while !cancel.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        let _ = tx.send(Ok(()));
                    });
                }
                _ => self.pending.lock().unwrap().push(tx),
            }
            rx
        }
    }

    #[tokio::test]
    async fn completes_on_a_finished_stream() {
        let (gate, leases, warm) = (Gate::new(4, 1), Leases::new(), AtomicBool::new(false));
        let out = warm_at_load(
            &Fake::new("finishes"),
            "m",
            &gate,
            leases.acquire("m"),
            Duration::from_secs(5),
            &warm,
        )
        .await;
        assert_eq!(out, WarmupOutcome::Warm);
        assert!(warm.load(Ordering::SeqCst));
        assert_eq!(leases.count("m"), 0, "the warmup's lease is released");
        assert!(gate.try_acquire().is_some(), "the gate is released");
    }

    #[tokio::test]
    async fn times_out_on_a_stream_that_never_ends_and_lets_the_load_finish() {
        let (gate, leases) = (Gate::new(4, 1), Leases::new());
        let warm = AtomicBool::new(true); // e.g. warm from an earlier load: must be reset
        let fake = Fake::new("endless");
        let t = std::time::Instant::now();
        let out = within(warm_at_load(
            &fake,
            "m",
            &gate,
            leases.acquire("m"),
            Duration::from_millis(100),
            &warm,
        ))
        .await;
        assert_eq!(out, WarmupOutcome::TimedOut);
        assert!(t.elapsed() < Duration::from_millis(600), "the load waited {:?}", t.elapsed());
        assert!(!warm.load(Ordering::SeqCst), "the warm flag was not reset");
        assert_eq!(leases.count("m"), 0);
        // Even a warmup that ignores cancellation cannot hold the load past deadline + 1 s.
        let t = std::time::Instant::now();
        let out = within(warm_at_load(
            &Fake::new("ignores-cancel"),
            "m",
            &gate,
            leases.acquire("m"),
            Duration::from_millis(100),
            &warm,
        ))
        .await;
        assert_eq!(out, WarmupOutcome::TimedOut);
        assert!(t.elapsed() < Duration::from_millis(1500));
    }

    #[tokio::test]
    async fn a_busy_gate_skips_without_consuming_the_warm_flag_or_disturbing_waiters() {
        let gate = Arc::new(Gate::new(4, 1));
        let leases = Leases::new();
        let warm = AtomicBool::new(false);
        let user = gate.enter().unwrap().wait().await;
        // A user request is queued behind the running one.
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { drop(gate.enter().unwrap().wait().await) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fake = Fake::new("finishes");
        let out = within(warm_at_load(
            &fake,
            "m",
            &gate,
            leases.acquire("m"),
            Duration::from_secs(5),
            &warm,
        ))
        .await;
        assert_eq!(out, WarmupOutcome::SkippedBusy);
        assert_eq!(*fake.started.lock().unwrap(), 0, "no warmup work may start");
        assert!(!warm.load(Ordering::SeqCst));
        assert_eq!(gate.snapshot().waiting, 1, "the queued user request is untouched");
        drop(user);
        within(waiter).await.unwrap(); // the queued request got its turn
    }

    #[tokio::test]
    async fn an_unload_during_warmup_waits_for_its_lease() {
        let leases = Leases::new();
        let warm = Arc::new(AtomicBool::new(false));
        let fake = Arc::new(Fake::new("held"));
        let warmup = tokio::spawn({
            let (fake, leases, warm) = (fake.clone(), leases.clone(), warm.clone());
            async move {
                let gate = Gate::new(4, 1);
                warm_at_load(
                    fake.as_ref(),
                    "m",
                    &gate,
                    leases.acquire("m"),
                    Duration::from_secs(5),
                    &warm,
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The unload waits while the warmup runs...
        let unload = tokio::spawn({
            let leases = leases.clone();
            async move { leases.released(Some("m")).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!unload.is_finished(), "unload went ahead under a running warmup");
        // ...and goes ahead once it finishes.
        fake.pending.lock().unwrap().pop().unwrap().send(Ok(())).unwrap();
        assert_eq!(within(warmup).await.unwrap(), WarmupOutcome::Warm);
        within(unload).await.unwrap();
    }
}
