//! Model leases (docs/runtime.md §3): a lease pins a loaded model. Unload, eviction and restart wait
//! until a model's count is zero; quit waits a bounded time, then cancels what still runs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync::LockExt;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Leases {
    counts: Mutex<HashMap<String, usize>>,
    changed: Notify,
}

/// Held by every generation, warmup and training window on `model`; released on drop.
pub struct Lease {
    leases: Arc<Leases>,
    model: String,
}

impl Lease {
    pub fn model(&self) -> &str {
        &self.model
    }
}

impl Leases {
    pub fn new() -> Arc<Leases> {
        Arc::new(Leases::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.counts.locked()
    }

    pub fn acquire(self: &Arc<Self>, model: &str) -> Lease {
        *self.lock().entry(model.to_string()).or_default() += 1;
        Lease { leases: self.clone(), model: model.to_string() }
    }

    pub fn count(&self, model: &str) -> usize {
        self.lock().get(model).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.lock().values().sum()
    }

    pub fn snapshot(&self) -> BTreeMap<String, usize> {
        self.lock().iter().filter(|(_, n)| **n > 0).map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Until `model` (or, with `None`, every model) has no lease.
    pub async fn released(&self, model: Option<&str>) {
        loop {
            // Registered before the check, so a release between the check and the await is
            // not missed.
            let notified = self.changed.notified();
            let held = match model {
                Some(m) => self.count(m),
                None => self.total(),
            };
            if held == 0 {
                return;
            }
            notified.await;
        }
    }

    /// `released` with a deadline: true if released in time.
    pub async fn drain(&self, model: Option<&str>, within: Duration) -> bool {
        tokio::time::timeout(within, self.released(model)).await.is_ok()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut counts = self.leases.lock();
            if let Some(n) = counts.get_mut(&self.model) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&self.model);
                }
            }
        }
        self.leases.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn release_waits_for_every_lease() {
        let leases = Leases::new();
        let a = leases.acquire("m");
        let b = leases.acquire("m");
        let other = leases.acquire("n");
        assert_eq!(leases.snapshot(), BTreeMap::from([("m".into(), 2), ("n".into(), 1)]));
        let waiter = tokio::spawn({
            let leases = leases.clone();
            async move { leases.released(Some("m")).await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "released with a lease still held");
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), waiter).await.unwrap().unwrap();
        assert!(!leases.drain(None, Duration::from_millis(20)).await, "`n` is still leased");
        drop(other);
        assert!(leases.drain(None, Duration::from_millis(20)).await);
    }
}
