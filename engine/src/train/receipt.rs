//! The per-turn slowdown receipt (docs/training.md): how much each finished user turn was slowed by
//! training windows. Pure bookkeeping on one clock (seconds), no I/O, no waiting: the serving
//! path calls it under a lock for every finished turn, so every method is short.
//!
//! A turn's rate is its decode steps over its time without prefill: the wait behind a window
//! stays in (that is the slowdown), the prompt's length does not. A turn that overlapped no
//! window is a clean sample for its slot's baseline, the median of its last clean rates (one
//! odd turn cannot move it); a turn that overlapped one is measured against that baseline
//! (slowdown = 1 − rate / clean, clamped to [0, 1]). The sample is the whole turn's slowdown,
//! so partial overlap dilutes it.
//! Spans are pruned only after the turn's overlap is summed, and only spans that ended before
//! the earliest start of any turn still in flight.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

/// Turns with fewer decode steps time the scheduler, not the model.
pub const MIN_STEPS: usize = 16;
/// Clean rates a slot's baseline is the median of.
const BASELINE_SAMPLES: usize = 9;
const BUCKETS: usize = 101;

/// A training window: `end` is `None` while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    start: f64,
    end: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// Under `MIN_STEPS` decode steps.
    Skipped,
    /// No overlap: a new baseline for its slot.
    Clean { tps: f64 },
    /// Overlapped `overlap_s` of training, slowed by `slowdown_ppm`.
    Slowed { overlap_s: f64, slowdown_ppm: u32 },
    /// Overlapped, but its slot has no clean baseline yet.
    Unmeasured { overlap_s: f64 },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReceiptSummary {
    pub turns_clean: u64,
    pub turns_overlapped: u64,
    pub turns_unmeasured: u64,
    /// The clean baseline of the slot measured last (tokens per second).
    pub turn_tps_clean: Option<f64>,
    pub turn_slowdown_ppm_p50: Option<u32>,
    pub turn_slowdown_ppm_p95: Option<u32>,
    pub turn_slowdown_ppm_max: Option<u32>,
}

#[derive(Debug, Default)]
pub struct Receipt {
    spans: VecDeque<Span>,
    /// Turns in flight: id → start.
    open: BTreeMap<u64, f64>,
    /// Each slot's last clean rates, newest last.
    clean_tps: HashMap<usize, VecDeque<f64>>,
    last_clean: Option<f64>,
    histogram: Vec<u64>,
    max_ppm: Option<u32>,
    turns_clean: u64,
    turns_overlapped: u64,
    turns_unmeasured: u64,
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(v: &VecDeque<f64>) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().collect();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(s[n / 2]),
        _ => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

impl Receipt {
    pub fn new() -> Receipt {
        Receipt { histogram: vec![0; BUCKETS], ..Default::default() }
    }

    pub fn window_started(&mut self, t: f64) {
        self.close_window(t);
        // Without user turns nothing else prunes: a long run alone keeps one span at a time.
        self.prune();
        self.spans.push_back(Span { start: t, end: None });
    }

    pub fn window_ended(&mut self, t: f64) {
        self.close_window(t);
    }

    /// The run's end closes its last window, so later turns never read as overlapped.
    pub fn run_ended(&mut self, t: f64) {
        self.close_window(t);
    }

    fn close_window(&mut self, t: f64) {
        if let Some(last) = self.spans.back_mut() {
            if last.end.is_none() {
                last.end = Some(t.max(last.start));
            }
        }
    }

    /// A turn began generating (its start bounds which spans may be pruned).
    pub fn turn_started(&mut self, id: u64, start: f64) {
        self.open.insert(id, start);
    }

    /// A turn finished: measure it, then prune. `start`/`end` are its times on the receipt's
    /// clock (from queueing on the MLX thread to its last token), `prefill` the seconds its
    /// prompt took, `steps` its decode steps, `slot` the baseline it is measured against (its
    /// decode mode, `DecodeMode::slot`: a step's yield differs by mode).
    pub fn turn_finished(
        &mut self,
        id: u64,
        slot: usize,
        (start, end): (f64, f64),
        prefill: f64,
        steps: usize,
    ) -> TurnOutcome {
        self.open.remove(&id);
        let decoding = end - start - prefill.max(0.0);
        let outcome = if steps < MIN_STEPS || decoding <= 0.0 {
            TurnOutcome::Skipped
        } else {
            let overlap = self.overlap(start, end);
            let tps = steps as f64 / decoding;
            if overlap <= 0.0 {
                let kept = self.clean_tps.entry(slot).or_default();
                if kept.len() == BASELINE_SAMPLES {
                    kept.pop_front();
                }
                kept.push_back(tps);
                self.last_clean = median(kept);
                self.turns_clean += 1;
                TurnOutcome::Clean { tps }
            } else {
                self.turns_overlapped += 1;
                match self.clean_tps.get(&slot).and_then(median) {
                    Some(clean) => {
                        let slowdown = (1.0 - tps / clean).clamp(0.0, 1.0);
                        let ppm = (slowdown * 1e6).round() as u32;
                        self.histogram[((slowdown * 100.0).floor() as usize).min(BUCKETS - 1)] += 1;
                        self.max_ppm = Some(self.max_ppm.map_or(ppm, |m| m.max(ppm)));
                        TurnOutcome::Slowed { overlap_s: overlap, slowdown_ppm: ppm }
                    }
                    None => {
                        self.turns_unmeasured += 1;
                        TurnOutcome::Unmeasured { overlap_s: overlap }
                    }
                }
            }
        };
        self.prune();
        outcome
    }

    /// Seconds of [start, end] covered by windows (a running window counts up to `end`).
    fn overlap(&self, start: f64, end: f64) -> f64 {
        self.spans
            .iter()
            .map(|s| (s.end.unwrap_or(end).min(end) - s.start.max(start)).max(0.0))
            .sum()
    }

    /// Drop closed spans that ended before every turn still in flight started.
    fn prune(&mut self) {
        let horizon = self.open.values().copied().fold(f64::INFINITY, f64::min);
        self.spans.retain(|s| s.end.is_none_or(|e| e >= horizon));
    }

    /// Turns in flight.
    pub fn open_turns(&self) -> usize {
        self.open.len()
    }

    pub fn summary(&self) -> ReceiptSummary {
        let n: u64 = self.histogram.iter().sum();
        let pct = |q: f64| -> Option<u32> {
            if n == 0 {
                return None;
            }
            let want = (q * n as f64).ceil().max(1.0) as u64;
            let mut seen = 0;
            let bucket = self.histogram.iter().position(|&c| {
                seen += c;
                seen >= want
            })?;
            // A bucket reads as its upper edge, never above what was actually seen.
            let upper = ((bucket as u32 + 1) * 10_000).min(1_000_000);
            Some(upper.min(self.max_ppm.unwrap_or(upper)))
        };
        ReceiptSummary {
            turns_clean: self.turns_clean,
            turns_overlapped: self.turns_overlapped,
            turns_unmeasured: self.turns_unmeasured,
            turn_tps_clean: self.last_clean,
            turn_slowdown_ppm_p50: pct(0.50),
            turn_slowdown_ppm_p95: pct(0.95),
            turn_slowdown_ppm_max: self.max_ppm,
        }
    }

    /// Spans kept now (for tests of the pruning rule).
    pub fn spans_kept(&self) -> usize {
        self.spans.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receipt whose slot 0 has a clean baseline of 100 tok/s.
    fn with_baseline() -> Receipt {
        let mut r = Receipt::new();
        r.turn_started(0, 0.0);
        assert_eq!(r.turn_finished(0, 0, (0.0, 1.0), 0.0, 100), TurnOutcome::Clean { tps: 100.0 });
        r
    }

    #[test]
    fn overlap_is_summed_before_the_span_is_pruned() {
        let mut r = with_baseline();
        r.window_started(100.0);
        r.window_ended(200.0);
        r.turn_started(1, 50.0);
        // 250 s for 100 steps: 0.4 tok/s against 100 → slowdown 0.996.
        match r.turn_finished(1, 0, (50.0, 300.0), 0.0, 100) {
            TurnOutcome::Slowed { overlap_s, slowdown_ppm } => {
                assert_eq!(overlap_s, 100.0);
                assert_eq!(slowdown_ppm, 996_000);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.spans_kept(), 0, "nothing else open: the span is dropped after measuring");
    }

    #[test]
    fn a_running_window_counts_and_a_run_end_closes_it() {
        let mut r = with_baseline();
        r.window_started(10.0);
        r.turn_started(1, 12.0);
        assert!(
            matches!(r.turn_finished(1, 0, (12.0, 14.0), 0.0, 100), TurnOutcome::Slowed { overlap_s, .. } if overlap_s == 2.0)
        );
        assert_eq!(r.spans_kept(), 1, "a running window is never pruned");
        r.run_ended(15.0);
        r.turn_started(2, 20.0);
        assert!(
            matches!(r.turn_finished(2, 0, (20.0, 21.0), 0.0, 100), TurnOutcome::Clean { .. }),
            "after the run's end nothing overlaps"
        );
        assert_eq!(r.spans_kept(), 0);
    }

    #[test]
    fn a_window_is_kept_while_another_open_turn_overlaps_it() {
        let mut r = with_baseline();
        r.turn_started(1, 5.0);
        r.window_started(10.0);
        r.window_ended(20.0);
        r.turn_started(2, 8.0);
        assert!(
            matches!(r.turn_finished(2, 1, (8.0, 30.0), 0.0, 100), TurnOutcome::Unmeasured { overlap_s } if overlap_s == 10.0),
            "slot 1 has no baseline yet"
        );
        assert_eq!(r.spans_kept(), 1, "turn 1 (from 5 s) is still open");
        assert!(
            matches!(r.turn_finished(1, 0, (5.0, 40.0), 0.0, 100), TurnOutcome::Slowed { overlap_s, .. } if overlap_s == 10.0)
        );
        assert_eq!(r.spans_kept(), 0);
        let s = r.summary();
        assert_eq!(
            (s.turns_clean, s.turns_overlapped, s.turns_unmeasured),
            (1, 2, 1),
            "unmeasured turns are still counted as overlapped"
        );
    }

    #[test]
    fn an_empty_turn_still_prunes() {
        let mut r = with_baseline();
        r.window_started(10.0);
        r.window_ended(20.0);
        r.turn_started(1, 30.0);
        assert_eq!(r.turn_finished(1, 0, (30.0, 30.5), 0.0, 3), TurnOutcome::Skipped);
        assert_eq!(r.spans_kept(), 0);
        assert_eq!(r.summary().turns_overlapped, 0);
    }

    #[test]
    fn turns_finishing_out_of_order_across_slots_are_measured_right() {
        let mut r = Receipt::new();
        for (slot, id) in [(0, 10), (1, 11)] {
            r.turn_started(id, 0.0);
            r.turn_finished(id, slot, (0.0, 1.0), 0.0, 100);
        }
        r.turn_started(1, 100.0); // slot 0, long
        r.turn_started(2, 110.0); // slot 1, short
        r.window_started(120.0);
        r.window_ended(130.0);
        // B finishes first: 20 s for 1000 steps = 50 tok/s → 0.5 slowdown.
        assert_eq!(
            r.turn_finished(2, 1, (110.0, 130.0), 0.0, 1000),
            TurnOutcome::Slowed { overlap_s: 10.0, slowdown_ppm: 500_000 }
        );
        assert_eq!(r.spans_kept(), 1, "A (from 100 s) still needs the span");
        // A: 50 s for 4000 steps = 80 tok/s → 0.2 slowdown, the same span measured again.
        assert_eq!(
            r.turn_finished(1, 0, (100.0, 150.0), 0.0, 4000),
            TurnOutcome::Slowed { overlap_s: 10.0, slowdown_ppm: 200_000 }
        );
        let s = r.summary();
        assert_eq!(
            (s.turn_slowdown_ppm_p50, s.turn_slowdown_ppm_p95, s.turn_slowdown_ppm_max),
            (Some(200_000), Some(500_000), Some(500_000))
        );
    }

    #[test]
    fn percentiles_come_from_buckets_clamped_to_the_exact_maximum() {
        let mut r = with_baseline();
        r.window_started(1.0);
        // Ten turns slowed 10.5 %, one slowed 12.34 %.
        for i in 0..11u64 {
            let tps = if i == 10 { 87.66 } else { 89.5 };
            r.turn_started(i + 1, 2.0);
            r.turn_finished(i + 1, 0, (2.0, 2.0 + 100.0 / tps), 0.0, 100);
        }
        let s = r.summary();
        assert_eq!(s.turn_slowdown_ppm_max, Some(123_400));
        assert_eq!(
            s.turn_slowdown_ppm_p50,
            Some(110_000),
            "bucket [10 %, 11 %) reads as its upper edge"
        );
        assert_eq!(
            s.turn_slowdown_ppm_p95,
            Some(123_400),
            "bucket [12 %, 13 %) clamped to the exact maximum"
        );
    }

    #[test]
    fn memory_stays_bounded_over_100000_turns() {
        let mut r = with_baseline();
        let mut t = 10.0;
        for i in 0..100_000u64 {
            if i % 3 == 0 {
                r.window_started(t);
                r.window_ended(t + 0.5);
            }
            r.turn_started(i + 1, t);
            r.turn_finished(i + 1, (i % 4) as usize, (t, t + 1.0), 0.0, 50);
            t += 1.0;
        }
        assert!(r.spans_kept() <= 1, "{} spans kept", r.spans_kept());
        assert!(r.open.is_empty() && r.clean_tps.len() <= 4 && r.histogram.len() == BUCKETS);
        assert_eq!(r.summary().turns_clean + r.summary().turns_overlapped, 100_001);
    }

    #[test]
    fn windows_without_turns_keep_no_spans_behind() {
        let mut r = Receipt::new();
        for i in 0..10_000 {
            r.window_started(i as f64);
            r.window_ended(i as f64 + 0.5);
        }
        assert!(r.spans_kept() <= 1, "{} spans kept", r.spans_kept());
        // A turn in flight still keeps what it may overlap.
        r.turn_started(1, 20_000.0);
        r.window_started(20_000.5);
        r.window_ended(20_001.0);
        r.window_started(20_002.0);
        assert_eq!(r.spans_kept(), 2);
    }

    #[test]
    fn prompt_length_does_not_read_as_slowdown() {
        // Clean turns decoding at 100 tok/s after prompts of very different lengths.
        let mut r = Receipt::new();
        for (i, prefill) in [0.5, 2.0, 0.25, 4.0].into_iter().enumerate() {
            let id = i as u64;
            r.turn_started(id, 10.0 * i as f64);
            let (start, end) = (10.0 * i as f64, 10.0 * i as f64 + prefill + 1.0);
            assert_eq!(
                r.turn_finished(id, 0, (start, end), prefill, 100),
                TurnOutcome::Clean { tps: 100.0 }
            );
        }
        // A turn during a window, with a long prompt, that still decoded at 100 tok/s: not slowed.
        r.window_started(100.0);
        r.turn_started(9, 100.0);
        assert_eq!(
            r.turn_finished(9, 0, (100.0, 104.0), 3.0, 100),
            TurnOutcome::Slowed { overlap_s: 4.0, slowdown_ppm: 0 }
        );
        // One that waited 1 s behind the window before its 1 s of decoding: slowed by half.
        r.turn_started(10, 110.0);
        assert_eq!(
            r.turn_finished(10, 0, (110.0, 112.5), 0.5, 100),
            TurnOutcome::Slowed { overlap_s: 2.5, slowdown_ppm: 500_000 }
        );
    }

    #[test]
    fn one_odd_clean_turn_does_not_move_the_baseline() {
        let mut r = Receipt::new();
        for i in 0..5u64 {
            r.turn_started(i, i as f64);
            r.turn_finished(i, 0, (i as f64, i as f64 + 1.0), 0.0, 100);
        }
        // A clean turn ten times faster (a short answer cached somewhere, a timer hiccup).
        r.turn_started(5, 10.0);
        r.turn_finished(5, 0, (10.0, 10.1), 0.0, 100);
        r.window_started(20.0);
        r.turn_started(6, 20.0);
        assert_eq!(
            r.turn_finished(6, 0, (20.0, 21.0), 0.0, 100),
            TurnOutcome::Slowed { overlap_s: 1.0, slowdown_ppm: 0 }
        );
        assert_eq!(r.summary().turn_tps_clean, Some(100.0));
    }

    #[test]
    fn the_floor_is_sixteen_decode_steps() {
        let mut r = Receipt::new();
        r.turn_started(1, 0.0);
        assert_eq!(r.turn_finished(1, 0, (0.0, 1.0), 0.0, 15), TurnOutcome::Skipped);
        r.turn_started(2, 2.0);
        assert_eq!(r.turn_finished(2, 0, (2.0, 3.0), 0.0, 16), TurnOutcome::Clean { tps: 16.0 });
    }
}
