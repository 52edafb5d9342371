//! One training run: its controller (windows, yields, pause, cancel, save) and its status.
//!
//! A window is one task on the MLX thread doing `window_batches` batches; a user turn that
//! arrives meanwhile waits for it, which is exactly the slowdown the receipt measures. Each
//! window holds a lease on the model; between windows the run holds nothing.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;

use super::data::{samples, split, TrainData};
use super::pacing::{Pacing, PROBE_PAUSE};
use super::receipt::ReceiptSummary;
use super::request::{FieldError, TrainRequest};
use super::trainer::{TrainSetup, Trainer, WorkReport};
use super::Training;
use crate::error::{EngineError, Result};
use crate::runtime::Engine;
use crate::sync::LockExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    #[default]
    Starting,
    Running,
    Paused,
    Completed,
    Cancelled,
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct EpochLoss {
    pub epoch: usize,
    pub train_loss: Option<f32>,
    /// Mean loss on the held-out split after this epoch (epoch 0: before training).
    pub eval_loss: Option<f32>,
}

/// Window lengths kept for percentiles (the newest; older ones are dropped).
const WINDOWS_KEPT: usize = 1024;
/// Window spans listed in the status.
const SPANS_LISTED: usize = 64;
/// Points of the loss curve kept: when full, every other point is dropped.
const CURVE_POINTS: usize = 512;

/// What `GET /train` returns: built from the run's progress, the pacer and the receipt at
/// the moment it is asked for.
#[derive(Debug, Clone, Serialize)]
pub struct RunStatus {
    pub state: RunState,
    pub error: Option<String>,
    pub model: String,
    pub adapter: String,
    /// The model id that serves the adapter once saved.
    pub adapter_model: String,
    pub adapter_saved: bool,
    pub pacing: Pacing,
    pub window_batches: usize,
    pub samples_train: usize,
    pub samples_eval: usize,
    pub epochs_total: usize,
    pub epochs: Vec<EpochLoss>,
    pub steps: usize,
    pub tokens_trained: usize,
    /// Target tokens per second of training-window time.
    pub train_tokens_per_s: Option<f64>,
    /// (step, loss) pairs, thinned to at most 512.
    pub loss_curve: Vec<(usize, f32)>,
    pub windows: usize,
    pub window_s_p50: Option<f64>,
    pub window_s_p95: Option<f64>,
    pub window_s_max: Option<f64>,
    pub window_s_total: f64,
    pub yielded_s: f64,
    pub forced_pauses: usize,
    /// Training's share of the run's active time (windows / (windows + yields)).
    pub window_share_ppm: u32,
    /// The average decode slowdown that share implies: share · (1 − rw / r0), rw = 0 until
    /// measured.
    pub realised_slowdown_ppm: u32,
    pub decode_tps_clean: Option<f64>,
    pub decode_tps_in_window: Option<f64>,
    pub in_window: bool,
    /// The per-turn receipt. Each sample is a whole turn's slowdown, so a turn only partly
    /// overlapped by a window reads as proportionally less slowed.
    #[serde(flatten)]
    pub receipt: ReceiptSummary,
    pub elapsed_s: f64,
    /// The newest windows as [start, end] on the receipt's clock, and that clock now: a
    /// client can tell which of its own turns overlapped training.
    pub recent_windows: Vec<(f64, f64)>,
    pub clock_s: f64,
}

/// What the run has done so far (the part of the status that is not derived).
#[derive(Debug, Default)]
struct Progress {
    state: RunState,
    error: Option<String>,
    adapter_saved: bool,
    epochs: Vec<EpochLoss>,
    steps: usize,
    tokens_trained: usize,
    loss_curve: Vec<(usize, f32)>,
    /// Every `curve_stride`-th step is on the curve (doubles when it fills up).
    curve_stride: usize,
    windows: usize,
    window_lengths: VecDeque<f64>,
    recent_windows: VecDeque<(f64, f64)>,
    window_s_total: f64,
    train_window_s: f64,
    yielded_s: f64,
    forced_pauses: usize,
    ended_at: Option<f64>,
}

pub struct Run {
    pub model: String,
    pub adapter: String,
    pub dir: PathBuf,
    pacing: Pacing,
    window_batches: usize,
    samples: (usize, usize),
    epochs: usize,
    /// On the receipt's clock.
    started: f64,
    cancel: AtomicBool,
    paused: AtomicBool,
    wake: Notify,
    progress: Mutex<Progress>,
}

impl Run {
    fn update(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut self.progress.locked());
    }

    fn state(&self) -> RunState {
        self.progress.locked().state
    }

    pub fn is_active(&self) -> bool {
        matches!(self.state(), RunState::Starting | RunState::Running | RunState::Paused)
    }

    pub fn status(&self, training: &Training) -> RunStatus {
        let (receipt, pacer, in_window) = training.snapshot();
        let now = training.now();
        let p = self.progress.locked();
        let active = p.window_s_total + p.yielded_s;
        let share = if active > 0.0 { p.window_s_total / active } else { 0.0 };
        let kept = match (pacer.r0, pacer.rw) {
            (Some(r0), Some(rw)) if r0.tps > 0.0 => (rw.tps / r0.tps).clamp(0.0, 1.0),
            _ => 0.0,
        };
        let mut lengths: Vec<f64> = p.window_lengths.iter().copied().collect();
        lengths.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            (!lengths.is_empty())
                .then(|| lengths[((lengths.len() - 1) as f64 * q).round() as usize])
        };
        RunStatus {
            state: p.state,
            error: p.error.clone(),
            model: self.model.clone(),
            adapter: self.adapter.clone(),
            adapter_model: format!("{}+{}", self.model, self.adapter),
            adapter_saved: p.adapter_saved,
            pacing: self.pacing,
            window_batches: self.window_batches,
            samples_train: self.samples.0,
            samples_eval: self.samples.1,
            epochs_total: self.epochs,
            epochs: p.epochs.clone(),
            steps: p.steps,
            tokens_trained: p.tokens_trained,
            train_tokens_per_s: (p.train_window_s > 0.0)
                .then(|| p.tokens_trained as f64 / p.train_window_s),
            loss_curve: p.loss_curve.clone(),
            windows: p.windows,
            window_s_p50: pick(0.5),
            window_s_p95: pick(0.95),
            window_s_max: lengths.last().copied(),
            window_s_total: p.window_s_total,
            yielded_s: p.yielded_s,
            forced_pauses: p.forced_pauses,
            window_share_ppm: (share * 1e6).round() as u32,
            realised_slowdown_ppm: (share * (1.0 - kept) * 1e6).round() as u32,
            decode_tps_clean: pacer.r0.map(|r| r.tps),
            decode_tps_in_window: pacer.rw.map(|r| r.tps),
            in_window,
            receipt,
            elapsed_s: p.ended_at.unwrap_or(now) - self.started,
            recent_windows: p.recent_windows.iter().copied().collect(),
            clock_s: now,
        }
    }

    /// The run is over (`at` on the receipt's clock; NaN when the engine is gone).
    fn end(&self, state: RunState, error: Option<String>, at: f64) {
        self.update(|p| {
            (p.state, p.error) = (state, error);
            p.ended_at = Some(if at.is_nan() { p.ended_at.unwrap_or(self.started) } else { at });
        });
    }

    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        self.update(|s| {
            if s.state == RunState::Running {
                s.state = RunState::Paused;
            }
        });
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        self.update(|s| {
            if s.state == RunState::Paused {
                s.state = RunState::Running;
            }
        });
        self.wake.notify_waiters();
    }

    pub fn stop(&self, why: &str) {
        if !self.cancel.swap(true, Ordering::SeqCst) {
            tracing::info!(model = %self.model, adapter = %self.adapter, why, "training run stopping");
        }
        self.wake.notify_waiters();
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Sleep `d`, cut short by cancel.
    async fn sleep(&self, d: Duration) {
        if d.is_zero() || self.cancelled() {
            return;
        }
        let notified = self.wake.notified();
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = notified => {}
        }
    }

    async fn wait_while_paused(&self) {
        while self.paused.load(Ordering::SeqCst) && !self.cancelled() {
            let notified = self.wake.notified();
            if !self.paused.load(Ordering::SeqCst) || self.cancelled() {
                break;
            }
            notified.await;
        }
    }

    fn record(&self, report: &WorkReport, span: (f64, f64)) {
        let window_s = span.1 - span.0;
        self.update(|s| {
            s.windows += 1;
            if s.recent_windows.len() == SPANS_LISTED {
                s.recent_windows.pop_front();
            }
            s.recent_windows.push_back(span);
            s.window_s_total += window_s;
            if s.window_lengths.len() == WINDOWS_KEPT {
                s.window_lengths.pop_front();
            }
            s.window_lengths.push_back(window_s);
            if !report.batches.is_empty() {
                s.train_window_s += window_s;
            }
            for &(loss, n) in &report.batches {
                s.steps += 1;
                s.tokens_trained += n;
                if s.steps % s.curve_stride.max(1) == 0 {
                    s.loss_curve.push((s.steps, loss));
                    if s.loss_curve.len() >= CURVE_POINTS {
                        s.curve_stride = s.curve_stride.max(1) * 2;
                        let stride = s.curve_stride;
                        s.loss_curve.retain(|(step, _)| step % stride == 0);
                    }
                }
            }
            if let Some((epoch, loss)) = report.epoch_trained {
                s.epochs.push(EpochLoss { epoch, train_loss: Some(loss), eval_loss: None });
            }
            if let Some((epoch, loss)) = report.eval {
                match s.epochs.iter_mut().find(|e| e.epoch == epoch) {
                    Some(e) => e.eval_loss = loss,
                    None => s.epochs.push(EpochLoss { epoch, train_loss: None, eval_loss: loss }),
                }
            }
        });
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("A training run is already active ({0:?}); cancel it first (POST /train/cancel)")]
    Busy(RunState),
    #[error("{0}")]
    Field(FieldError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

fn field(param: &str, message: impl Into<String>) -> StartError {
    StartError::Field(FieldError { param: param.into(), message: message.into() })
}

impl Training {
    /// Start a training run on `engine`'s requested (or loaded) model.
    pub async fn start(
        self: &Arc<Self>,
        engine: &Arc<Engine>,
        req: TrainRequest,
    ) -> std::result::Result<Arc<Run>, StartError> {
        // Claimed before any work: concurrent POSTs get a 409 at once instead of each
        // tokenizing its data, and a client that leaves stops the tokenizing.
        let Some(claim) = self.claim() else {
            let state =
                self.current().filter(|r| r.is_active()).map_or(RunState::Starting, |r| r.state());
            return Err(StartError::Busy(state));
        };
        let model = match req.model.clone().or_else(|| engine.loaded().map(|m| m.id)) {
            Some(m) => m,
            None => return Err(field("model", "no model is loaded; name one")),
        };
        let model: crate::runtime::ModelRef = model
            .parse()
            .map_err(|e: crate::runtime::ModelRefError| field("model", e.to_string()))?;
        if model.adapter.is_some() {
            return Err(field("model", "train a base model, not an adapter"));
        }
        let info = engine.resolve(&model).map_err(|e| field("model", e.to_string()))?;
        let dir =
            crate::model::lora::adapter_dir(&engine.config.models_dir, &info.id, &req.adapter);
        if dir.exists() {
            return Err(field(
                "adapter",
                format!("`{}` already exists for `{}`; pick another name", req.adapter, info.id),
            ));
        }
        let seq_len = req.seq_len.min(info.context_length);
        let tok = info.tokenizer.clone();
        let data = req.data;
        let param = if matches!(data, TrainData::Text(_)) { "text" } else { "examples" };
        let cancel = claim.cancel.clone();
        let all = tokio::task::spawn_blocking(move || samples(&tok, &data, seq_len, &cancel))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|e| {
                field(
                    param,
                    match e {
                        EngineError::InvalidRequest(m) => m,
                        other => other.to_string(),
                    },
                )
            })?;
        if all.is_empty() {
            return Err(field("text", "too short: not one chunk of 8 or more tokens"));
        }
        let (train, eval) = split(all, req.eval_fraction, req.seed);
        let setup = TrainSetup {
            lora: req.lora,
            train,
            eval,
            epochs: req.epochs,
            batch_size: req.batch_size,
            learning_rate: req.learning_rate,
            weight_decay: req.weight_decay,
            seed: req.seed,
        };
        let run = Arc::new(Run {
            model: info.id.clone(),
            adapter: req.adapter,
            dir,
            pacing: req.pacing,
            window_batches: req.window_batches,
            samples: (setup.train.len(), setup.eval.len()),
            epochs: setup.epochs,
            started: self.now(),
            cancel: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            wake: Notify::new(),
            progress: Mutex::default(),
        });
        if let Err(active) = self.install(run.clone()) {
            return Err(StartError::Busy(active.state()));
        }
        // From here the run is installed in `Starting`: every way out of this function
        // (an error, or the request's future dropped mid-start) must end it, or every later
        // POST /train would be refused as busy.
        let mut starting = StartingRun { training: self, run: run.clone(), done: false };
        // Load the model if needed; the lease only covers the load and the trainer's setup.
        let lease = match engine.lease_model(&info.id).await {
            Ok(l) => l,
            Err(e) => return Err(starting.failed(e, false)),
        };
        self.begin_receipt(req.pacing);
        let id = info.id.clone();
        let created = engine
            .mlx
            .submit(move |w| {
                let model = w
                    .models
                    .get(&id)
                    .ok_or_else(|| EngineError::Internal(format!("model `{id}` is not loaded")))?;
                w.job_state = Some(Box::new(Trainer::new(model, setup)?));
                Ok(())
            })
            .map(|rx| async {
                rx.await
                    .map_err(|_| EngineError::Internal("the MLX thread dropped the task".into()))
                    .and_then(|r| r)
            });
        let created = match created {
            Ok(waiting) => waiting.await,
            Err(e) => Err(e),
        };
        drop(lease);
        if let Err(e) = created {
            return Err(starting.failed(e, true));
        }
        starting.done = true;
        run.update(|s| {
            s.state =
                if run.paused.load(Ordering::SeqCst) { RunState::Paused } else { RunState::Running }
        });
        tokio::spawn(drive(Arc::downgrade(engine), self.clone(), run.clone()));
        Ok(run)
    }
}

/// A run installed but not yet running (see `Training::start`): ends it as failed unless
/// the start went through.
struct StartingRun<'a> {
    training: &'a Training,
    run: Arc<Run>,
    done: bool,
}

impl StartingRun<'_> {
    /// The start failed with `e`; `receipt` when the run's receipt had begun (it is closed).
    fn failed(&mut self, e: EngineError, receipt: bool) -> StartError {
        self.done = true;
        let at = if receipt { self.training.run_ended() } else { self.training.now() };
        self.run.end(RunState::Failed, Some(e.to_string()), at);
        e.into()
    }
}

impl Drop for StartingRun<'_> {
    fn drop(&mut self) {
        if !self.done {
            let why = "the request that started the run went away before it began";
            self.run.end(RunState::Failed, Some(why.into()), self.training.run_ended());
        }
    }
}

/// The run's loop: window, yield, repeat; then save the adapter and close the receipt.
async fn drive(engine: Weak<Engine>, training: Arc<Training>, run: Arc<Run>) {
    let outcome = windows(&engine, &training, &run).await;
    let (saved, at) = match engine.upgrade() {
        Some(e) => {
            let saved = save(&e, &training, &run).await;
            (saved, training.run_ended())
        }
        None => (
            Err(EngineError::Internal("the engine stopped before the adapter was saved".into())),
            f64::NAN,
        ),
    };
    let (state, error) = match (&outcome, &saved) {
        (Err(e), _) | (Ok(_), Err(e)) => (RunState::Failed, Some(e.to_string())),
        (Ok(true), _) => (RunState::Completed, None),
        (Ok(false), _) => (RunState::Cancelled, None),
    };
    run.update(|p| p.adapter_saved = saved.is_ok_and(|w| w));
    run.end(state, error, at);
    tracing::info!(model = %run.model, adapter = %run.adapter, ?state, "training run ended");
}

/// Windows until the data is done (`Ok(true)`) or the run is stopped (`Ok(false)`).
async fn windows(engine: &Weak<Engine>, training: &Arc<Training>, run: &Arc<Run>) -> Result<bool> {
    loop {
        run.wait_while_paused().await;
        if run.cancelled() {
            return Ok(false);
        }
        let Some(e) = engine.upgrade() else { return Ok(false) };
        if training.ledger().pacer.probe_due(training.now()) {
            // r0 is stale while turns keep landing in windows: stay out until a clean turn
            // measures it (or the probe times out).
            run.update(|s| s.forced_pauses += 1);
            let from = training.now();
            while training.ledger().pacer.probe_due(training.now())
                && training.now() - from < PROBE_PAUSE.as_secs_f64()
                && !run.cancelled()
            {
                run.sleep(Duration::from_millis(100)).await;
            }
            run.update(|s| s.yielded_s += training.now() - from);
            continue;
        }
        // A window never starts on a model that is being unloaded: unloading stops the run
        // first, and a model that is gone has no lease to give.
        let Some(lease) = e.lease_if_resident(&run.model) else {
            return Err(EngineError::Internal(format!(
                "model `{}` is no longer loaded",
                run.model
            )));
        };
        let (r, t, k) = (run.clone(), training.clone(), run.window_batches);
        let rx = e.mlx.submit(move |w| {
            let trainer = w.job_state.as_mut().and_then(|s| s.downcast_mut::<Trainer>());
            let (Some(model), Some(trainer)) = (w.models.get(&r.model), trainer) else {
                return Err(EngineError::Internal(format!(
                    "model `{}` is no longer loaded",
                    r.model
                )));
            };
            let start = t.window_started();
            if t.take_window_panic() {
                panic!("injected fault: a training window panicked");
            }
            let report = trainer.work(model, k, &|| r.cancelled());
            let end = t.window_ended();
            Ok((report?, (start, end)))
        })?;
        drop(e);
        let (report, span) = rx
            .await
            .map_err(|_| EngineError::Internal("the MLX thread dropped a window".into()))??;
        drop(lease);
        run.record(&report, span);
        let window_s = span.1 - span.0;
        if report.finished {
            return Ok(true);
        }
        let y = training.ledger().pacer.yield_after(Duration::from_secs_f64(window_s));
        run.update(|s| s.yielded_s += y.as_secs_f64());
        run.sleep(y).await;
    }
}

/// Save the adapter (if it took a step) and free the trainer; `Ok(true)` when written.
async fn save(e: &Arc<Engine>, training: &Arc<Training>, run: &Arc<Run>) -> Result<bool> {
    let steps = run.progress.locked().steps;
    let (dir, meta) =
        (run.dir.clone(), serde_json::json!({"base_model": run.model, "steps": steps}));
    let training = training.clone();
    let rx = e.mlx.submit(move |w| {
        let Some(Ok(trainer)) = w.job_state.take().map(|s| s.downcast::<Trainer>()) else {
            return Ok(false);
        };
        if steps == 0 {
            return Ok(false);
        }
        // Writing is training work on the MLX thread too: it is a (short) window.
        training.window_started();
        let saved = trainer.save(&dir, meta);
        training.window_ended();
        saved.map(|_| true)
    })?;
    rx.await.map_err(|_| EngineError::Internal("the MLX thread dropped the save".into()))?
}
