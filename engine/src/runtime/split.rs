//! A turn's streamed text split as it arrives: reasoning (`<think>…</think>`) to its own
//! events, then tool-call markup to calls, the rest to content deltas. Log-probabilities of
//! content held back go out with the next content, so none is lost; those of reasoning are
//! dropped with it (OpenAI's `logprobs.content` covers the answer only).

use tokio::sync::mpsc;

use super::event::TurnEvent;
use crate::chat::{CallSplitter, Part, Piece, ThinkSplitter};
use crate::decode::TokenLogprob;

pub(crate) struct Split {
    think: Option<ThinkSplitter>,
    calls: Option<CallSplitter>,
    logprobs: Vec<TokenLogprob>,
}

impl Split {
    /// `None` when there is nothing to split (every piece goes out as it came).
    pub fn new(think: Option<ThinkSplitter>, calls: Option<CallSplitter>) -> Option<Split> {
        (think.is_some() || calls.is_some()).then(|| Split { think, calls, logprobs: vec![] })
    }

    pub fn push(&mut self, tx: &mpsc::UnboundedSender<TurnEvent>, text: &str, l: &[TokenLogprob]) {
        self.logprobs.extend_from_slice(l);
        let parts = match &mut self.think {
            Some(t) => t.push(text),
            None => vec![Part::Content(text.to_string())],
        };
        self.send(tx, parts, false);
    }

    /// What the tool-call reader noticed (none without tools).
    pub fn notes(&self) -> &[crate::chat::ToolNote] {
        self.calls.as_ref().map_or(&[], |c| c.notes())
    }

    /// The answer has ended: everything held.
    pub fn finish(&mut self, tx: &mpsc::UnboundedSender<TurnEvent>) {
        let parts = self.think.as_mut().map(ThinkSplitter::finish).unwrap_or_default();
        self.send(tx, parts, true);
    }

    fn send(&mut self, tx: &mpsc::UnboundedSender<TurnEvent>, parts: Vec<Part>, end: bool) {
        let mut pieces = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(text) => {
                    self.flush(tx, std::mem::take(&mut pieces));
                    // Granularity is a piece of text, not a token: a piece that ends the
                    // reasoning and starts the answer counts as reasoning here.
                    self.logprobs.clear();
                    let _ = tx.send(TurnEvent::Reasoning { text });
                }
                Part::Content(text) => match &mut self.calls {
                    Some(c) => pieces.extend(c.push(&text)),
                    None => pieces.push(Piece::Content(text)),
                },
            }
        }
        if end {
            if let Some(c) = &mut self.calls {
                pieces.extend(c.finish());
            }
        }
        self.flush(tx, pieces);
    }

    fn flush(&mut self, tx: &mpsc::UnboundedSender<TurnEvent>, pieces: Vec<Piece>) {
        for p in pieces {
            let _ = tx.send(match p {
                Piece::Content(text) => {
                    TurnEvent::Delta { text, logprobs: std::mem::take(&mut self.logprobs) }
                }
                Piece::Call(c) => TurnEvent::ToolCall(c),
                Piece::CallHead { id, name } => TurnEvent::ToolCallStart { id, name },
                Piece::CallArgs(text) => TurnEvent::ToolCallArgs { text },
            });
        }
    }
}
