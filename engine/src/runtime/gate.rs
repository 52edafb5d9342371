//! The generation gate (docs/runtime.md §2): admission to the batch. Up to `slots` user
//! generations at once (continuous batching; one slot is the solo engine), waiters served
//! first in first out, a bounded queue, and a non-queuing probe (skip if busy) that takes
//! every slot, so background work runs only alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why the gate refused a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("too many requests are waiting ({0} queued)")]
    QueueFull(usize),
}

/// Held while generating (one slot for a user, every slot for background work); dropping it
/// lets the next waiter in.
pub struct GatePermit {
    _permit: OwnedSemaphorePermit,
}

/// A place in the gate's queue, taken by `Gate::enter` (counted as waiting from then on);
/// `wait` turns it into the permit. Dropping it leaves the queue.
pub struct Ticket {
    sem: Arc<Semaphore>,
    _waiting: Waiting,
}

pub struct Gate {
    // tokio's semaphore queues acquirers fairly (FIFO), and dropping a pending acquire
    // removes that waiter: cancellation while waiting comes for free.
    sem: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
    slots: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateSnapshot {
    pub busy: bool,
    /// Slots taken (user generations running; every slot while background work runs).
    pub running: usize,
    pub slots: usize,
    pub waiting: usize,
    pub max_waiting: usize,
}

struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The gate has one way in for each policy of docs/runtime.md §2: users `enter` and wait
/// their turn; background work (load-time warmup, the ladder) skips if busy with
/// `try_acquire`.
impl Gate {
    /// `slots`: user generations at once (at least one).
    pub fn new(max_waiting: usize, slots: usize) -> Gate {
        let slots = slots.max(1);
        Gate {
            sem: Arc::new(Semaphore::new(slots)),
            waiting: Arc::new(AtomicUsize::new(0)),
            max_waiting,
            slots,
        }
    }

    /// Skip if busy: every slot now if no generation runs and nobody waits; never queues,
    /// never disturbs waiters. Background work holds the whole gate, so no user turn runs
    /// beside it (users queue and it yields to them, docs/runtime.md §4).
    pub fn try_acquire(&self) -> Option<GatePermit> {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let all = self.slots as u32;
        self.sem.clone().try_acquire_many_owned(all).ok().map(|p| GatePermit { _permit: p })
    }

    /// Wait for turn, first step: a place in the queue, or `QueueFull` at once when
    /// `max_waiting` already wait (refused before it ever counts as queued).
    pub fn enter(&self) -> Result<Ticket, GateError> {
        let n = self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(self.waiting.clone());
        if n >= self.max_waiting {
            return Err(GateError::QueueFull(n));
        }
        Ok(Ticket { sem: self.sem.clone(), _waiting: waiting })
    }

    pub fn snapshot(&self) -> GateSnapshot {
        let running = self.slots - self.sem.available_permits().min(self.slots);
        GateSnapshot {
            busy: running > 0,
            running,
            slots: self.slots,
            waiting: self.waiting.load(Ordering::SeqCst),
            max_waiting: self.max_waiting,
        }
    }
}

impl Ticket {
    /// Wait for turn, second step: the permit, once everyone ahead has had theirs.
    pub async fn wait(self) -> GatePermit {
        let permit = self.sem.acquire_owned().await.expect("the gate's semaphore is never closed");
        GatePermit { _permit: permit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::time::Duration;

    #[tokio::test]
    async fn fifo_bounded_and_probes_leave_waiters_alone() {
        let gate = Arc::new(Gate::new(2, 1));
        let held = gate.enter().unwrap().wait().await;
        assert!(gate.try_acquire().is_none(), "skip if busy");
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..2 {
            let (g, o) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _p = g.enter().unwrap().wait().await;
                o.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(gate.snapshot().waiting, 2);
        assert_eq!(gate.enter().err(), Some(GateError::QueueFull(2)));
        assert!(gate.try_acquire().is_none(), "a probe must not jump the queue");
        assert_eq!(gate.snapshot().waiting, 2, "failed attempts leave the queue as it was");
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1]);
        assert!(gate.try_acquire().is_some());
    }

    #[test]
    fn a_probe_yields_to_a_user_counted_but_not_yet_queued() {
        // Between a user's count and its place in the semaphore's queue the gate can be free
        // for an instant; background work probing then must not take the turn. (Once the
        // user is queued, the semaphore's own FIFO hands a released permit to it.)
        let gate = Gate::new(4, 1);
        gate.waiting.fetch_add(1, Ordering::SeqCst);
        assert!(gate.try_acquire().is_none(), "a probe took the gate from a waiting user");
        gate.waiting.fetch_sub(1, Ordering::SeqCst);
        assert!(gate.try_acquire().is_some());
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let gate = Gate::new(4, 1);
        let held = gate.enter().unwrap().wait().await;
        let timed_out =
            tokio::time::timeout(Duration::from_millis(20), gate.enter().unwrap().wait()).await;
        assert!(timed_out.is_err());
        assert_eq!(gate.snapshot().waiting, 0);
        drop(held);
        assert!(gate.try_acquire().is_some());
    }

    #[tokio::test]
    async fn slots_admit_that_many_at_once_in_order_and_probes_need_them_all() {
        let gate = Arc::new(Gate::new(4, 2));
        let a = gate.enter().unwrap().wait().await;
        assert!(gate.try_acquire().is_none(), "a probe ran beside a user (1 of 2 slots taken)");
        let b = gate.enter().unwrap().wait().await;
        assert_eq!((gate.snapshot().running, gate.snapshot().slots), (2, 2));
        // A third waits for a slot; the fourth behind it, in order.
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..2 {
            let (g, o) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _p = g.enter().unwrap().wait().await;
                o.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(gate.snapshot().waiting, 2);
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*order.lock().unwrap(), vec![0], "one slot freed, one waiter in");
        drop(b);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1]);
        // Background work holds every slot: a user waits for it.
        let all = gate.try_acquire().expect("an idle gate");
        assert_eq!(gate.snapshot().running, 2);
        let user = tokio::time::timeout(Duration::from_millis(20), gate.enter().unwrap().wait());
        assert!(user.await.is_err(), "a user ran beside background work");
        drop(all);
        assert!(gate.enter().unwrap().wait().now_or_never().is_some());
    }
}
