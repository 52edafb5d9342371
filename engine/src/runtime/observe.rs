//! What the runtime reports outward: the last turn's figures (the tray, `/health`), and the
//! observer that hears of every user turn and unload (training while serving).

use std::time::{Duration, Instant};

use serde::Serialize;

/// The last finished turn's figures (the tray's status line, `/health`).
#[derive(Debug, Clone, Serialize)]
pub struct LastTurn {
    pub model: String,
    pub completion_tokens: usize,
    pub decode_tok_s: Option<f64>,
    pub ttft_s: f64,
}

/// Work outside the runtime that must hear of user turns and of unloads (training while
/// serving: its receipt and pacer, docs/training.md).
pub trait TurnObserver: Send + Sync {
    /// A user turn is about to queue on the MLX thread; the mark reports its end.
    fn turn_begin(&self) -> Box<dyn TurnMark>;
    /// Model `model` is being unloaded, or (`None`) the engine is stopping.
    fn stop(&self, model: Option<&str>, why: &str);
}

/// One turn's entry with an observer. Dropped unfinished: the turn failed.
pub trait TurnMark: Send {
    /// The turn produced its last token at `at` (on the MLX thread) after a prefill of
    /// `prefill` and `steps` decode steps (the tokens after the first).
    fn finish(self: Box<Self>, steps: usize, prefill: Duration, at: Instant);
}
