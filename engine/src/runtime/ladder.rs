//! The background warmup ladder (docs/runtime.md §5): while nobody is using the engine, prefill prompts
//! of growing length so first-touch costs are paid before a user needs them, and get out of
//! the way within one chunk the moment a user shows up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Serialize;

use super::{Foreground, ForegroundSnapshot, Gate, Leases};
use crate::error::Result;
use crate::sync::LockExt;

#[derive(Debug, Clone, Serialize)]
pub struct LadderConfig {
    pub enabled: bool,
    /// Prompt lengths, in tokens, warmed in order.
    pub rungs: Vec<usize>,
    /// Tokens per prefill chunk: the most a user can wait for the ladder to yield.
    pub chunk: usize,
    /// Tokens generated after each rung's prefill.
    pub decode_tokens: usize,
    /// After a user request, quiet time before the ladder may run (0: none).
    #[serde(serialize_with = "secs")]
    pub idle_grace: Duration,
    /// A rung interrupted this many times ends the ladder (`abandoned_busy`). Only
    /// interruptions that cost work and came from a real turn count (see `run`).
    pub max_interruptions: u32,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for LadderConfig {
    fn default() -> Self {
        LadderConfig {
            enabled: true,
            rungs: vec![512, 2560],
            chunk: 256,
            decode_tokens: 8,
            idle_grace: Duration::from_secs(90),
            max_interruptions: 8,
        }
    }
}

impl LadderConfig {
    pub const TURBO: [usize; 8] = [512, 1024, 2048, 2560, 4096, 8192, 16384, 32768];

    pub fn profile(profile: WarmupProfile) -> LadderConfig {
        let d = LadderConfig::default();
        match profile {
            WarmupProfile::Default => d,
            WarmupProfile::Turbo => LadderConfig { rungs: Self::TURBO.to_vec(), ..d },
            WarmupProfile::Off => LadderConfig { enabled: false, ..d },
        }
    }
}

/// The ladder's profile as the settings file and `--ladder` name it: `default`, `turbo`
/// (longer rungs) or `off`; parsed where it enters, so a bad name is refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmupProfile {
    #[default]
    Default,
    Turbo,
    Off,
}

impl std::fmt::Display for WarmupProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WarmupProfile::Default => "default",
            WarmupProfile::Turbo => "turbo",
            WarmupProfile::Off => "off",
        })
    }
}

impl std::str::FromStr for WarmupProfile {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<WarmupProfile, String> {
        match s {
            "default" => Ok(WarmupProfile::Default),
            "turbo" => Ok(WarmupProfile::Turbo),
            "off" => Ok(WarmupProfile::Off),
            _ => Err(format!("must be default, turbo or off, not `{s}`")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LadderState {
    Idle,
    Waiting,
    Running,
    Done,
    AbandonedBusy,
    Disabled,
}

#[derive(Debug, Clone, Serialize)]
pub struct LadderStatus {
    pub state: LadderState,
    pub model: Option<String>,
    pub rungs_done: Vec<usize>,
    pub rungs_left: Vec<usize>,
    pub current_rung: Option<usize>,
    pub interruptions: u32,
}

/// Whether a rung may start now (docs/runtime.md §5 admission, in its order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A user request is generating or queued: its own branch, whatever the grace.
    HoldForeground,
    /// A user request arrived and has not begun yet.
    HoldArrival,
    /// No user request has completed since start: warm now.
    WarmFresh,
    WarmIdle,
    HoldGrace,
}

pub fn admission(fg: &ForegroundSnapshot, grace: Duration) -> Admission {
    if fg.foreground_active > 0 || fg.foreground_queued > 0 {
        return Admission::HoldForeground;
    }
    if fg.foreground_arriving > 0 {
        return Admission::HoldArrival;
    }
    match fg.seconds_since_last_request {
        None if fg.requests_completed == 0 => Admission::WarmFresh,
        Some(s) if s >= grace.as_secs_f64() => Admission::WarmIdle,
        None => Admission::WarmIdle,
        Some(_) => Admission::HoldGrace,
    }
}

/// The model work of a rung, so the ladder's policy can be tested with fakes.
pub trait RungWork: Send + Sync {
    /// Prefill positions `start..start + len` of a `rung`-token warmup prompt (start 0 begins
    /// a new rung).
    fn prefill_chunk(
        &self,
        rung: usize,
        start: usize,
        len: usize,
    ) -> BoxFuture<'static, Result<()>>;
    /// One decode step after the rung's prefill.
    fn decode_step(&self) -> BoxFuture<'static, Result<()>>;
    /// The rung ended (done or aborted): drop what it holds.
    fn end_rung(&self) -> BoxFuture<'static, ()>;
}

enum RungEnd {
    Done,
    /// Stopped for a user before any chunk ran.
    Yielded,
    /// Stopped for a user after some of its work ran (that work is lost).
    Interrupted,
    Failed,
}

/// How often a waiting ladder looks again.
const POLL: Duration = Duration::from_millis(20);

pub struct WarmupLadder {
    cfg: LadderConfig,
    status: Mutex<LadderStatus>,
    stop: AtomicBool,
}

impl WarmupLadder {
    /// A ladder for a model with `context` tokens (longer rungs are dropped).
    pub fn new(mut cfg: LadderConfig, model: &str, context: usize) -> Arc<WarmupLadder> {
        cfg.rungs.retain(|&r| r > 0 && r < context);
        let state = if cfg.enabled && !cfg.rungs.is_empty() {
            LadderState::Idle
        } else {
            LadderState::Disabled
        };
        let status = LadderStatus {
            state,
            model: Some(model.to_string()),
            rungs_done: vec![],
            rungs_left: cfg.rungs.clone(),
            current_rung: None,
            interruptions: 0,
        };
        Arc::new(WarmupLadder { cfg, status: Mutex::new(status), stop: AtomicBool::new(false) })
    }

    pub fn disabled() -> Arc<WarmupLadder> {
        let cfg = LadderConfig { enabled: false, ..LadderConfig::default() };
        let status = LadderStatus {
            state: LadderState::Disabled,
            model: None,
            rungs_done: vec![],
            rungs_left: vec![],
            current_rung: None,
            interruptions: 0,
        };
        Arc::new(WarmupLadder { cfg, status: Mutex::new(status), stop: AtomicBool::new(false) })
    }

    pub fn status(&self) -> LadderStatus {
        self.status.locked().clone()
    }

    fn update(&self, f: impl FnOnce(&mut LadderStatus)) {
        f(&mut self.status.locked());
    }

    /// Stop at the next chunk boundary (model unload, engine restart).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Run the ladder to its end. Background work: it never touches the foreground figures.
    pub async fn run(
        self: Arc<Self>,
        work: Arc<dyn RungWork>,
        model: String,
        fg: Arc<Foreground>,
        gate: Arc<Gate>,
        leases: Arc<Leases>,
    ) {
        if self.status().state == LadderState::Disabled {
            return;
        }
        let mut left: VecDeque<usize> = self.cfg.rungs.iter().copied().collect();
        // Interruptions of the current rung, and one not judged yet: the requests queued
        // when it happened (the arrival was still being parsed).
        let mut rung_interruptions = 0u32;
        let mut unjudged: Option<u64> = None;
        while let Some(&rung) = left.front() {
            if self.stopped() {
                return;
            }
            let admitted = matches!(
                admission(&fg.snapshot(), self.cfg.idle_grace),
                Admission::WarmFresh | Admission::WarmIdle
            );
            // A request arriving between this check and the first chunk is caught by the
            // rung's own check before that chunk.
            let permit = if admitted { gate.try_acquire() } else { None };
            let Some(permit) = permit else {
                self.update(|s| s.state = LadderState::Waiting);
                tokio::time::sleep(POLL).await;
                continue;
            };
            // Quiet again: an arrival that never queued (a body that failed to parse, a client
            // that left) was no real turn and does not count.
            if let Some(mark) = unjudged.take() {
                if fg.requests_queued() > mark && self.count_interruption(&mut rung_interruptions) {
                    return;
                }
            }
            self.update(|s| {
                s.state = LadderState::Running;
                s.current_rung = Some(rung);
            });
            let lease = leases.acquire(&model);
            let end = self.run_rung(work.as_ref(), rung, &fg).await;
            work.end_rung().await;
            drop(lease);
            drop(permit);
            match end {
                RungEnd::Done | RungEnd::Failed => {
                    left.pop_front();
                    rung_interruptions = 0;
                    let done = matches!(end, RungEnd::Done);
                    self.update(|s| {
                        if done {
                            s.rungs_done.push(rung);
                        }
                        s.rungs_left = left.iter().copied().collect();
                        s.current_rung = None;
                    });
                }
                // Yielded before its first chunk: no work lost, nothing to count. It pauses
                // like any wait: a rung admitted while a user is live (the admission broken)
                // must not spin taking and giving back the gate.
                RungEnd::Yielded => {
                    self.update(|s| {
                        s.current_rung = None;
                        s.state = LadderState::Waiting;
                    });
                    tokio::time::sleep(POLL).await;
                }
                RungEnd::Interrupted => {
                    self.update(|s| {
                        s.current_rung = None;
                        s.state = LadderState::Waiting;
                    });
                    let f = fg.snapshot();
                    if f.foreground_queued + f.foreground_active > 0 {
                        if self.count_interruption(&mut rung_interruptions) {
                            return;
                        }
                    } else {
                        unjudged = Some(fg.requests_queued());
                    }
                }
            }
        }
        self.update(|s| s.state = LadderState::Done);
    }

    /// Count an interruption of the current rung; true when that abandons the ladder.
    fn count_interruption(&self, rung_interruptions: &mut u32) -> bool {
        *rung_interruptions += 1;
        let abandoned = *rung_interruptions >= self.cfg.max_interruptions;
        self.update(|s| {
            s.interruptions += 1;
            if abandoned {
                s.state = LadderState::AbandonedBusy;
            }
        });
        if abandoned {
            tracing::info!("warmup ladder abandoned: the engine is too busy");
        }
        abandoned
    }

    /// Prefill then decode, checking for users between every chunk and step.
    async fn run_rung(&self, work: &dyn RungWork, rung: usize, fg: &Foreground) -> RungEnd {
        let chunk = self.cfg.chunk.max(1);
        let mut start = 0;
        let yield_now = || fg.busy() || self.stopped();
        while start < rung {
            if yield_now() {
                return if start == 0 { RungEnd::Yielded } else { RungEnd::Interrupted };
            }
            let len = chunk.min(rung - start);
            if let Err(e) = work.prefill_chunk(rung, start, len).await {
                tracing::warn!(error = %e, rung, "warmup rung failed");
                return RungEnd::Failed;
            }
            start += len;
        }
        for _ in 0..self.cfg.decode_tokens {
            if yield_now() {
                return RungEnd::Interrupted;
            }
            if let Err(e) = work.decode_step().await {
                tracing::warn!(error = %e, rung, "warmup rung failed");
                return RungEnd::Failed;
            }
        }
        RungEnd::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fg(active: usize, queued: usize, arriving: usize) -> ForegroundSnapshot {
        ForegroundSnapshot {
            foreground_active: active,
            foreground_queued: queued,
            foreground_arriving: arriving,
            requests_completed: 0,
            seconds_since_last_request: None,
            seconds_since_last_arrival: None,
            last_request_unix: None,
        }
    }

    /// One request has completed, `ago` seconds ago.
    fn after(mut f: ForegroundSnapshot, ago: f64) -> ForegroundSnapshot {
        f.requests_completed = 1;
        f.seconds_since_last_request = Some(ago);
        f
    }

    #[test]
    fn a_live_request_holds_whatever_the_grace() {
        for grace in [Duration::ZERO, Duration::from_secs(90)] {
            for live in [fg(1, 0, 0), fg(0, 1, 0), fg(1, 3, 2)] {
                // Fresh, long idle, or just finished: a request generating or queued holds.
                for f in [live.clone(), after(live.clone(), 1e6), after(live.clone(), 0.0)] {
                    assert_eq!(admission(&f, grace), Admission::HoldForeground, "{f:?} {grace:?}");
                }
            }
        }
    }

    #[test]
    fn an_arriving_request_holds_whatever_the_grace() {
        for grace in [Duration::ZERO, Duration::from_secs(90)] {
            for f in [fg(0, 0, 1), after(fg(0, 0, 2), 1e6)] {
                assert_eq!(admission(&f, grace), Admission::HoldArrival, "{f:?} {grace:?}");
            }
        }
    }

    #[test]
    fn an_idle_engine_warms_fresh_at_once_and_after_the_grace() {
        let grace = Duration::from_secs(90);
        assert_eq!(admission(&fg(0, 0, 0), grace), Admission::WarmFresh);
        assert_eq!(admission(&after(fg(0, 0, 0), 10.0), grace), Admission::HoldGrace);
        assert_eq!(admission(&after(fg(0, 0, 0), 90.0), grace), Admission::WarmIdle);
        assert_eq!(admission(&after(fg(0, 0, 0), 0.0), Duration::ZERO), Admission::WarmIdle);
    }
}
