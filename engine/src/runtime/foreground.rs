//! Foreground accounting (docs/runtime.md §1): what users are doing right now, kept by RAII guards so a
//! begin without its end cannot happen on any path (success, error, cancel, panic).

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::sync::LockExt;
use serde::Serialize;

#[derive(Default)]
struct State {
    active: usize,
    queued: usize,
    /// Arrived (stamped) but neither queued, running nor finished yet: being parsed/tokenized.
    arriving: usize,
    requests_completed: u64,
    /// Requests that ever reached the gate's queue (real turns, not bodies that failed).
    requests_queued: u64,
    last_request_at: Option<Instant>,
    last_arrival_at: Option<Instant>,
}

/// The process-wide foreground counters.
#[derive(Default)]
pub struct Foreground {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ForegroundSnapshot {
    pub foreground_active: usize,
    pub foreground_queued: usize,
    pub foreground_arriving: usize,
    pub requests_completed: u64,
    /// Since a user request last completed or was cancelled; `None` before the first.
    pub seconds_since_last_request: Option<f64>,
    pub seconds_since_last_arrival: Option<f64>,
    /// Wall clock (Unix seconds) of the last completion, for people reading /health.
    pub last_request_unix: Option<f64>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Arrived,
    Queued,
    Active,
}

/// One user request, from the first line of its HTTP handler to its end. Dropping it in any
/// phase ends the request and its phase's counter goes down. A request that was served
/// (it reached the gate's queue: it generated, or its client left while it waited) also
/// stamps `last_request_at` and counts in `requests_completed`, together; one refused before
/// that (a body that failed to parse, an unknown model, a full queue) is no served request
/// and moves neither.
pub struct UserRequest {
    fg: Arc<Foreground>,
    phase: Phase,
}

impl Foreground {
    pub fn new() -> Foreground {
        Foreground::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding this lock cannot leave the counters half-updated
        // (every update is one statement), so a poisoned lock is still good.
        self.state.locked()
    }

    /// A user request arrived: stamp `last_arrival_at` before any parsing or tokenizing.
    pub fn arrive(self: &Arc<Self>) -> UserRequest {
        let mut s = self.lock();
        s.arriving += 1;
        s.last_arrival_at = Some(Instant::now());
        UserRequest { fg: self.clone(), phase: Phase::Arrived }
    }

    pub fn snapshot(&self) -> ForegroundSnapshot {
        let s = self.lock();
        let since = |t: Option<Instant>| t.map(|t| t.elapsed().as_secs_f64());
        let unix = s.last_request_at.map(|t| {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            now - t.elapsed().as_secs_f64()
        });
        ForegroundSnapshot {
            foreground_active: s.active,
            foreground_queued: s.queued,
            foreground_arriving: s.arriving,
            requests_completed: s.requests_completed,
            seconds_since_last_request: since(s.last_request_at),
            seconds_since_last_arrival: since(s.last_arrival_at),
            last_request_unix: unix,
        }
    }

    /// How many requests have ever reached the gate's queue.
    pub fn requests_queued(&self) -> u64 {
        self.lock().requests_queued
    }

    /// Any user work in flight: arriving, queued or generating.
    pub fn busy(&self) -> bool {
        let s = self.lock();
        s.active + s.queued + s.arriving > 0
    }
}

impl UserRequest {
    /// Waiting for the generation gate.
    pub fn queue(&mut self) {
        self.move_to(Phase::Queued);
    }

    /// Generating.
    pub fn start(&mut self) {
        self.move_to(Phase::Active);
    }

    fn move_to(&mut self, to: Phase) {
        let mut s = self.fg.lock();
        dec(&mut s, self.phase);
        match to {
            Phase::Arrived => s.arriving += 1,
            Phase::Queued => {
                s.queued += 1;
                s.requests_queued += 1;
            }
            Phase::Active => s.active += 1,
        }
        self.phase = to;
    }
}

fn dec(s: &mut State, phase: Phase) {
    match phase {
        Phase::Arrived => s.arriving -= 1,
        Phase::Queued => s.queued -= 1,
        Phase::Active => s.active -= 1,
    }
}

impl Drop for UserRequest {
    fn drop(&mut self) {
        let mut s = self.fg.lock();
        dec(&mut s, self.phase);
        if self.phase != Phase::Arrived {
            s.requests_completed += 1;
            s.last_request_at = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_ends_and_stamps_together() {
        let fg = Arc::new(Foreground::new());
        {
            let mut r = fg.arrive();
            assert_eq!(fg.snapshot().foreground_arriving, 1);
            r.queue();
            let s = fg.snapshot();
            assert_eq!((s.foreground_arriving, s.foreground_queued), (0, 1));
            r.start();
            assert_eq!(fg.snapshot().foreground_active, 1);
            assert!(fg.busy());
        }
        let s = fg.snapshot();
        assert_eq!((s.foreground_active, s.foreground_queued, s.requests_completed), (0, 0, 1));
        assert!(s.seconds_since_last_request.is_some() && !fg.busy());
        // Ended while queued (a client gone before its turn), and by a panic.
        let mut r = fg.arrive();
        r.queue();
        drop(r);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut r = fg.arrive();
            r.start();
            panic!("generation failed");
        }));
        assert!(caught.is_err());
        let s = fg.snapshot();
        assert_eq!(
            (s.foreground_active, s.foreground_queued, s.foreground_arriving, s.requests_completed),
            (0, 0, 0, 3)
        );
    }

    #[test]
    fn a_refused_request_is_not_a_served_one() {
        let fg = Arc::new(Foreground::new());
        // Refused before the queue (400, 413, 429, an unknown model): it was counted as
        // arriving while it was read, and it leaves no trace of a served request.
        drop(fg.arrive());
        let s = fg.snapshot();
        assert_eq!(s.foreground_arriving, 0);
        assert_eq!(s.requests_completed, 0, "a refused request counted as completed");
        assert_eq!(s.seconds_since_last_request, None, "a refused request stamped the last one");
        assert!(s.seconds_since_last_arrival.is_some(), "its arrival is still seen");
        // A client that left while queued was served (it was cancelled).
        let mut r = fg.arrive();
        r.queue();
        drop(r);
        assert_eq!(fg.snapshot().requests_completed, 1);
    }
}
