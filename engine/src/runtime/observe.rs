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

/// How a turn decoded. A step yields one token in plain and guided decoding and several
/// with drafts, and guided decoding (grammars, logprobs) does host work every step: rates
/// compare only within one mode, so the receipt keeps a baseline per mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecodeMode {
    Plain,
    /// A grammar or logprobs: one token at a time, with host work per step.
    Guided,
    /// Prompt-lookup drafts.
    Lookup,
    /// The model's MTP head as the draft.
    Mtp,
}

impl DecodeMode {
    /// The mode a generation ran in: drafts from what it reports, `guided` when the turn
    /// asked for a grammar or logprobs.
    pub fn of(guided: bool, draft: Option<&str>) -> DecodeMode {
        match (guided, draft) {
            (true, _) => DecodeMode::Guided,
            (false, Some("mtp")) => DecodeMode::Mtp,
            (false, Some(_)) => DecodeMode::Lookup,
            (false, None) => DecodeMode::Plain,
        }
    }

    /// Its index among the receipt's baselines.
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// What a finished turn reports to an observer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnFinish {
    /// Tokens after the first (each took part of a decode step; with drafts a step yields
    /// several, which `mode` tells apart).
    pub tokens_after_first: usize,
    /// Arrival on the MLX thread to the first token: the prompt's share of the turn.
    pub prefill: Duration,
    /// When the last token was produced (on the MLX thread).
    pub at: Instant,
    pub mode: DecodeMode,
    /// Sequences sampling per step of its batch (rounded mean; 1 alone): a step of a batch
    /// of four yields each of them a token more slowly than a step alone does.
    pub batch: usize,
}

/// Decode modes, for the receipt's baseline index.
const MODES: usize = 4;

impl TurnFinish {
    /// Its baseline among the receipt's: by decode mode and batch size (docs/training.md:
    /// rates compare only within one mode and one batch size).
    pub fn slot(&self) -> usize {
        self.mode.slot() + MODES * (self.batch.clamp(1, super::batch::MAX_BATCH) - 1)
    }
}

/// One turn's entry with an observer. Dropped unfinished: the turn failed.
pub trait TurnMark: Send {
    fn finish(self: Box<Self>, finish: TurnFinish);
}
