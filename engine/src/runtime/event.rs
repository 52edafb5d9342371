//! What a running turn reports to its protocol adapter, in order: text, reasoning and tool
//! calls as they are generated, then one end (with usage and timings) or one failure.

use std::time::Duration;

use serde::Serialize;

use crate::chat::ToolCall;
use crate::decode::{FinishReason, Generation, TokenLogprob};
use crate::error::EngineError;

/// What a running turn reports, in order: deltas, then one `End` or one `Failed`.
#[derive(Debug)]
pub enum TurnEvent {
    /// New text, with the log-probabilities of the tokens it came from (when asked for).
    Delta { text: String, logprobs: Vec<TokenLogprob> },
    /// A call the model made (only when the turn offered tools); its text never appears in
    /// a `Delta`.
    ToolCall(ToolCall),
    /// A call whose arguments follow in `ToolCallArgs` events, as they are generated.
    ToolCallStart { id: String, name: String },
    /// The next part of the last started call's arguments (JSON text).
    ToolCallArgs { text: String },
    /// Reasoning text (a thinking model's `<think>` block); never in a `Delta`.
    Reasoning { text: String },
    /// Boxed: the whole generation rides along, and deltas are the common event.
    End(Box<TurnEnd>),
    /// The generation failed after the turn started.
    Failed(EngineError),
}

#[derive(Debug, Clone)]
pub struct TurnEnd {
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// Arrival to the first token.
    pub ttft: Duration,
    /// The whole generation: its text, tokens, timings and draft statistics.
    pub generation: Generation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens the prefix cache supplied (counted in `prompt_tokens` too).
    pub cached_tokens: usize,
}
