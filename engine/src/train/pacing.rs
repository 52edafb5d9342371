//! How long training yields to serving after each window (docs/training.md).
//!
//! With a fixed share s, a window of length d is followed by d·(1−s)/s of serving. With a
//! slowdown bound T, the yield is y = d·(r0·(1−T) − rw)/(r0·T): r0 is the decode rate with no
//! window running, rw the rate during windows, so that over a window and its yield the decode
//! rate averages at least r0·(1−T). Until both rates are measured the trainer assumes the
//! worst (rw = 0, which is exact when a window holds the model's thread). Rates decay: each
//! new sample weighs more the older the last one is, and a stale r0 forces a short pause so a
//! clean turn can measure it.

use std::time::Duration;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pacing {
    /// Training's share of the time, parts per million.
    SharePpm(u32),
    /// Average decode slowdown allowed, parts per million.
    MaxSlowdownPpm(u32),
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing::SharePpm(250_000)
    }
}

/// Rates older than this have decayed to little; a new sample mostly replaces them.
const DECAY_S: f64 = 60.0;
/// An r0 older than this (while turns keep overlapping windows) is re-measured.
pub const R0_STALE_S: f64 = 120.0;
/// How long a forced pause lasts at most (it ends early once a clean turn measured r0).
pub const PROBE_PAUSE: Duration = Duration::from_secs(10);
/// An overlapped turn estimates rw only when windows covered this much of it.
const RW_MIN_COVER: f64 = 0.2;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rate {
    pub tps: f64,
    /// When it was last sampled (receipt clock, seconds).
    pub at: f64,
}

impl Rate {
    fn update(old: Option<Rate>, tps: f64, at: f64) -> Rate {
        match old {
            None => Rate { tps, at },
            Some(o) => {
                let w = 1.0 - (-(at - o.at).max(0.0) / DECAY_S).exp();
                let w = w.max(0.25);
                Rate { tps: o.tps + w * (tps - o.tps), at }
            }
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Pacer {
    pub pacing: Pacing,
    pub r0: Option<Rate>,
    pub rw: Option<Rate>,
    /// An overlapped turn finished after r0 was last sampled.
    overlapped_since_r0: bool,
}

impl Pacer {
    pub fn new(pacing: Pacing) -> Pacer {
        Pacer { pacing, ..Default::default() }
    }

    /// A clean turn's rate (no window overlapped it).
    pub fn clean_turn(&mut self, tps: f64, now: f64) {
        self.r0 = Some(Rate::update(self.r0, tps, now));
        self.overlapped_since_r0 = false;
    }

    /// A turn of `steps` over `duration` s, `overlap` s of which windows ran: with r0 known,
    /// what it did outside the windows is r0's, the rest estimates rw.
    pub fn overlapped_turn(&mut self, steps: usize, duration: f64, overlap: f64, now: f64) {
        self.overlapped_since_r0 = true;
        let Some(r0) = self.r0 else { return };
        if duration <= 0.0 || overlap / duration < RW_MIN_COVER {
            return;
        }
        let inside = (steps as f64 - r0.tps * (duration - overlap).max(0.0)).max(0.0);
        let rw = (inside / overlap).min(r0.tps);
        self.rw = Some(Rate::update(self.rw, rw, now));
    }

    /// The yield after a window of `d`.
    pub fn yield_after(&self, d: Duration) -> Duration {
        let d = d.as_secs_f64();
        let y = match self.pacing {
            Pacing::SharePpm(s) => {
                let s = s as f64 / 1e6;
                d * (1.0 - s) / s
            }
            Pacing::MaxSlowdownPpm(t) => {
                let t = t as f64 / 1e6;
                match (self.r0, self.rw) {
                    (Some(r0), Some(rw)) if r0.tps > 0.0 => {
                        d * (r0.tps * (1.0 - t) - rw.tps).max(0.0) / (r0.tps * t)
                    }
                    _ => d * (1.0 - t) / t,
                }
            }
        };
        Duration::from_secs_f64(y.clamp(0.0, 3600.0))
    }

    /// Whether r0 needs re-measuring: it is missing or stale and turns keep overlapping windows.
    pub fn probe_due(&self, now: f64) -> bool {
        matches!(self.pacing, Pacing::MaxSlowdownPpm(_))
            && self.overlapped_since_r0
            && self.r0.is_none_or(|r| now - r.at > R0_STALE_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_yields_the_rest_of_the_time() {
        let p = Pacer::new(Pacing::SharePpm(250_000));
        assert_eq!(p.yield_after(Duration::from_secs(1)), Duration::from_secs(3));
        let full = Pacer::new(Pacing::SharePpm(1_000_000));
        assert_eq!(full.yield_after(Duration::from_secs(1)), Duration::ZERO);
    }

    #[test]
    fn bound_assumes_the_worst_until_both_rates_are_known() {
        let mut p = Pacer::new(Pacing::MaxSlowdownPpm(100_000));
        let worst = Duration::from_secs(9);
        assert_eq!(p.yield_after(Duration::from_secs(1)), worst);
        p.clean_turn(100.0, 0.0);
        assert_eq!(p.yield_after(Duration::from_secs(1)), worst);
        // 40 steps in 1 s, 0.5 s of it in a window: 50 outside at r0 = 100, so rw = 0... clamped.
        // 70 steps: 20 inside 0.5 s → rw = 40.
        p.overlapped_turn(70, 1.0, 0.5, 1.0);
        let rw = p.rw.unwrap().tps;
        assert!((rw - 40.0).abs() < 1e-9, "{rw}");
        // y = d·(r0(1−T) − rw)/(r0·T) = (90 − 40)/10 = 5 s per second of window.
        let y = p.yield_after(Duration::from_secs(1)).as_secs_f64();
        assert!((y - 5.0).abs() < 1e-6, "{y}");
        // Decoding as fast in windows as outside: no yield needed beyond the bound.
        p.rw = Some(Rate { tps: 100.0, at: 1.0 });
        assert_eq!(p.yield_after(Duration::from_secs(1)), Duration::ZERO);
    }

    #[test]
    fn the_bound_holds_on_average() {
        // A decoder at r0 = 50 that runs at rw = 10 during windows of 0.3 s, yielding as told:
        // over many cycles the average rate stays at or above r0·(1 − T).
        let t = 0.1;
        let mut p = Pacer::new(Pacing::MaxSlowdownPpm((t * 1e6) as u32));
        p.clean_turn(50.0, 0.0);
        p.rw = Some(Rate { tps: 10.0, at: 0.0 });
        let (mut tokens, mut time) = (0.0, 0.0);
        for _ in 0..100 {
            let d = 0.3;
            let y = p.yield_after(Duration::from_secs_f64(d)).as_secs_f64();
            tokens += 10.0 * d + 50.0 * y;
            time += d + y;
        }
        let avg = tokens / time;
        assert!(avg >= 50.0 * (1.0 - t) - 1e-6, "{avg}");
        assert!(avg <= 50.0 * (1.0 - t) + 0.5, "the yield is not oversized: {avg}");
    }

    #[test]
    fn rates_decay_toward_new_samples() {
        let mut p = Pacer::new(Pacing::MaxSlowdownPpm(100_000));
        p.clean_turn(100.0, 0.0);
        p.clean_turn(50.0, 1.0);
        let soon = p.r0.unwrap().tps;
        assert!(soon > 80.0, "a sample right after moves it a little: {soon}");
        p.clean_turn(50.0, 600.0);
        let later = p.r0.unwrap().tps;
        assert!((later - 50.0).abs() < 1.0, "a sample after a long gap replaces it: {later}");
    }

    #[test]
    fn a_stale_r0_forces_a_probe_only_while_turns_overlap() {
        let mut p = Pacer::new(Pacing::MaxSlowdownPpm(100_000));
        assert!(!p.probe_due(0.0), "no turns, nothing to protect");
        p.overlapped_turn(40, 1.0, 0.5, 1.0);
        assert!(p.probe_due(1.0), "never measured");
        p.clean_turn(100.0, 2.0);
        assert!(!p.probe_due(3.0));
        p.overlapped_turn(40, 1.0, 0.5, 10.0);
        assert!(!p.probe_due(2.0 + R0_STALE_S - 1.0));
        assert!(p.probe_due(2.0 + R0_STALE_S + 1.0));
        assert!(!Pacer::new(Pacing::SharePpm(500_000)).probe_due(1e6));
    }
}
