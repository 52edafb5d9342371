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
    /// The part of `ttft` spent waiting for the model to be loaded (zero when it was).
    pub load: Duration,
    /// The whole generation: its text, tokens, timings and draft statistics.
    pub generation: Generation,
}

/// A turn's events folded into its whole answer, for a response that is not streamed; every
/// protocol's one-body rendering starts here.
#[derive(Debug, Default)]
pub struct Answer {
    pub text: String,
    pub reasoning: String,
    /// The model reasoned (even if every reasoning delta was empty).
    pub reasoned: bool,
    pub logprobs: Vec<TokenLogprob>,
    /// Calls in order, their arguments whole.
    pub calls: Vec<ToolCall>,
}

impl Answer {
    /// Fold one event in; the end or the failure comes back out, the rest is kept.
    pub fn add(&mut self, ev: TurnEvent) -> Option<Result<TurnEnd, EngineError>> {
        match ev {
            TurnEvent::Delta { text, logprobs } => {
                self.text.push_str(&text);
                self.logprobs.extend(logprobs);
            }
            TurnEvent::Reasoning { text } => {
                self.reasoning.push_str(&text);
                self.reasoned = true;
            }
            TurnEvent::ToolCall(c) => self.calls.push(c),
            TurnEvent::ToolCallStart { id, name } => {
                self.calls.push(ToolCall { id, name, arguments: String::new() })
            }
            TurnEvent::ToolCallArgs { text } => {
                if let Some(c) = self.calls.last_mut() {
                    c.arguments.push_str(&text);
                }
            }
            TurnEvent::End(end) => return Some(Ok(*end)),
            TurnEvent::Failed(e) => return Some(Err(e)),
        }
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens the prefix cache supplied (counted in `prompt_tokens` too).
    pub cached_tokens: usize,
}
