//! Where every prompt is made ready (`prepare.rs`'s work, for turns and `count_tokens` alike):
//! a bounded pool on the blocking threads, a bounded wait, one deadline.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::error::{EngineError, Result};

/// How long rendering and tokenizing one prompt may take, its wait for a place included,
/// before the turn fails (the work is bounded anyway, by the template's fuel and the body cap).
pub const PREPARE_DEADLINE: Duration = Duration::from_secs(30);

/// Preparations that run at once. Tokenizing a large body briefly takes far more memory than
/// the body (3 MiB of text peaked near 520 MB), so a burst of large requests must queue here
/// rather than all tokenize together before the gate's queue limit can apply.
pub const PREPARE_AT_ONCE: usize = 2;

/// The bounded pool every prompt preparation goes through (turns and `count_tokens` alike):
/// `PREPARE_AT_ONCE` at a time on the blocking threads, at most `max_waiting` waiting (more
/// are told the server is busy), each within `PREPARE_DEADLINE`.
pub struct Preparing {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
    deadline: Duration,
}

impl Preparing {
    pub fn new(at_once: usize, max_waiting: usize) -> Preparing {
        Preparing::with_deadline(at_once, max_waiting, PREPARE_DEADLINE)
    }

    fn with_deadline(at_once: usize, max_waiting: usize, deadline: Duration) -> Preparing {
        Preparing {
            slots: Arc::new(Semaphore::new(at_once.max(1))),
            waiting: AtomicUsize::new(0),
            max_waiting,
            deadline,
        }
    }

    /// Run `work` off the async threads once a place is free.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        // Counted as waiting until it has a place, however the wait ends: with the place, the
        // deadline, or the request's future dropped (its client left).
        let waiting = Waiting::new(&self.waiting);
        let done = async {
            if waiting.ahead >= self.max_waiting {
                return Err(EngineError::Busy(waiting.ahead));
            }
            let permit = self.slots.clone().acquire_owned().await;
            drop(waiting);
            let permit = permit.map_err(|e| EngineError::Internal(e.to_string()))?;
            // The place is held until the work itself ends, even past the deadline: a render
            // that overran still uses its memory.
            let work = tokio::task::spawn_blocking(move || {
                let r = work();
                drop(permit);
                r
            });
            match work.await {
                Ok(r) => r,
                Err(e) => Err(EngineError::Internal(format!("preparing failed: {e}"))),
            }
        };
        match tokio::time::timeout(self.deadline, done).await {
            Ok(r) => r,
            Err(_) => Err(EngineError::PrepareDeadline(self.deadline.as_secs())),
        }
    }
}

/// One waiter's count in `Preparing::waiting`, given back on drop.
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// How many were waiting before this one.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Waiting<'a> {
        Waiting { count, ahead: count.fetch_add(1, Ordering::SeqCst) }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Until `f` holds (bounded: a broken pool fails, it does not hang).
    async fn until(f: impl Fn() -> bool) {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "timed out");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn preparations_run_two_at_a_time_and_a_full_wait_is_busy() {
        let pool = Arc::new(Preparing::new(2, 3));
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut runs = vec![];
        for _ in 0..5 {
            let (pool, now, peak, hold) = (pool.clone(), now.clone(), peak.clone(), hold.clone());
            runs.push(tokio::spawn(async move {
                pool.run(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    while hold.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                })
                .await
            }));
        }
        // Two run, three wait: a sixth finds no room.
        until(|| now.load(Ordering::SeqCst) == 2 && pool.waiting.load(Ordering::SeqCst) == 3).await;
        let sixth = pool.run(|| Ok(())).await;
        assert!(matches!(sixth, Err(EngineError::Busy(_))), "{sixth:?}");
        hold.store(false, Ordering::SeqCst);
        for r in runs {
            r.await.unwrap().unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2, "more than two preparations ran at once");
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_deadline_counts_the_wait() {
        let pool = Arc::new(Preparing::with_deadline(1, 4, Duration::from_millis(100)));
        let busy = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(|| {
                    std::thread::sleep(Duration::from_millis(400));
                    Ok(())
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let late = pool.run(|| Ok(())).await;
        assert!(matches!(late, Err(EngineError::PrepareDeadline(_))), "{late:?}");
        assert!(matches!(busy.await.unwrap(), Err(EngineError::PrepareDeadline(_))));
        // A wait that ran out gave its place in the queue back.
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0, "a timed-out wait is still counted");
        tokio::time::sleep(Duration::from_millis(400)).await; // the overrun render ends
        assert!(pool.run(|| Ok(())).await.is_ok());
    }
}
