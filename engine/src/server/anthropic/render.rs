//! A turn's events as Anthropic's Messages API answers: one `message` body, or the event
//! stream (`message_start`, content blocks opened, filled by deltas and closed, one
//! `message_delta` with the stop reason and usage, `message_stop`; `ping` while waiting).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};

use super::RenderOptions;
use crate::chat::ToolCall;
use crate::decode::FinishReason;
use crate::error::EngineError;
use crate::runtime::{Answer, TurnEnd, TurnEvent, Usage};
use crate::server::error::{ApiError, Dialect};
use crate::server::exchange::Exchange;

/// Anthropic counts prompt tokens read from a cache apart from `input_tokens`.
fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// `stop_reason` and `stop_sequence`: a call ends the answer as `tool_use`; a stop string
/// is reported only when it is one the client sent (not the end of a call Perch added).
fn stop_of(end: &TurnEnd, called: bool, render: &RenderOptions) -> (&'static str, Value) {
    let matched =
        end.generation.stop_sequence.as_ref().filter(|s| render.stop_sequences.contains(s));
    match (end.finish_reason, called, matched) {
        (FinishReason::Length, _, _) => ("max_tokens", Value::Null),
        (_, true, _) => ("tool_use", Value::Null),
        (FinishReason::Stop, _, Some(s)) => ("stop_sequence", Value::from(s.as_str())),
        _ => ("end_turn", Value::Null),
    }
}

fn engine_error(e: &EngineError) -> ApiError {
    ApiError::engine(e, "messages")
}

/// A call's arguments as the object Anthropic's `input` is (a model's malformed arguments
/// come back as the text they were, under `_raw`, rather than being lost).
fn input_of(c: &ToolCall) -> Value {
    match serde_json::from_str::<Value>(&c.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"_raw": c.arguments}),
    }
}

/// The whole answer as one `message`.
pub(super) async fn collect(mut x: Exchange<RenderOptions>) -> Response {
    let (answer, end) = match x.handle.answer().await {
        Ok(done) => done,
        Err(e) => return engine_error(&e).into_response_as(Dialect::Anthropic),
    };
    let Answer { text, reasoning, reasoned, calls, .. } = answer;
    let mut content = vec![];
    if reasoned {
        // `display: omitted`: the block stays, its text does not.
        let thinking = if x.render.omit_thinking { String::new() } else { reasoning };
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() || (calls.is_empty() && content.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for c in &calls {
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input_of(c)}));
    }
    let (stop_reason, stop_sequence) = stop_of(&end, !calls.is_empty(), &x.render);
    Json(json!({
        "id": x.id, "type": "message", "role": "assistant", "model": x.handle.model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": usage(end.usage),
    }))
    .into_response()
}

/// The content block open in a stream.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    None,
    Text,
    Thinking,
    Tool,
}

struct SseState {
    x: Exchange<RenderOptions>,
    queue: VecDeque<Event>,
    started: bool,
    done: bool,
    open: Open,
    /// The next block's index.
    blocks: usize,
    called: bool,
}

fn event(kind: &str, data: Value) -> Event {
    Event::default().event(kind).data(data.to_string())
}

impl SseState {
    fn push(&mut self, kind: &str, data: Value) {
        self.queue.push_back(event(kind, data));
    }

    fn close(&mut self) {
        if self.open == Open::None {
            return;
        }
        let index = self.blocks - 1;
        if self.open == Open::Thinking {
            // No signature: reasoning made here is not Anthropic's to sign.
            self.push(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": ""}}),
            );
        }
        self.push("content_block_stop", json!({"type": "content_block_stop", "index": index}));
        self.open = Open::None;
    }

    /// Make `want` the open block (opening it with `block` when it is not).
    fn ensure(&mut self, want: Open, block: Value) -> usize {
        if self.open != want || want == Open::Tool {
            self.close();
            let index = self.blocks;
            self.blocks += 1;
            self.open = want;
            self.push(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block}),
            );
        }
        self.blocks - 1
    }

    fn delta(&mut self, index: usize, delta: Value) {
        self.push(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
    }

    fn on(&mut self, ev: Option<TurnEvent>) {
        match ev {
            Some(TurnEvent::Delta { text, .. }) => {
                if text.is_empty() {
                    return;
                }
                let i = self.ensure(Open::Text, json!({"type": "text", "text": ""}));
                self.delta(i, json!({"type": "text_delta", "text": text}));
            }
            Some(TurnEvent::Reasoning { text }) => {
                let i = self.ensure(
                    Open::Thinking,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                );
                if !self.x.render.omit_thinking {
                    self.delta(i, json!({"type": "thinking_delta", "thinking": text}));
                }
            }
            Some(TurnEvent::ToolCallStart { id, name }) => {
                self.called = true;
                self.ensure(
                    Open::Tool,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                );
            }
            Some(TurnEvent::ToolCallArgs { text }) => {
                if self.open == Open::Tool {
                    let i = self.blocks - 1;
                    self.delta(i, json!({"type": "input_json_delta", "partial_json": text}));
                }
            }
            Some(TurnEvent::ToolCall(c)) => {
                self.called = true;
                let i = self.ensure(
                    Open::Tool,
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}}),
                );
                let args = input_of(&c).to_string();
                self.delta(i, json!({"type": "input_json_delta", "partial_json": args}));
            }
            Some(TurnEvent::End(end)) => {
                self.close();
                let (stop_reason, stop_sequence) = stop_of(&end, self.called, &self.x.render);
                self.push(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}, "usage": usage(end.usage)}),
                );
                self.push("message_stop", json!({"type": "message_stop"}));
                self.done = true;
            }
            Some(TurnEvent::Failed(e)) => self.fail(engine_error(&e)),
            None => self.fail(ApiError::unfinished()),
        }
    }

    fn fail(&mut self, e: ApiError) {
        self.push("error", e.body_as(Dialect::Anthropic));
        self.done = true;
    }
}

/// The answer as Anthropic's event stream. `ping` events keep a client's read timeout at
/// bay while a long prompt prefills.
pub(super) fn sse(
    x: Exchange<RenderOptions>,
    keep_alive: std::time::Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let state = SseState {
        x,
        queue: VecDeque::new(),
        started: false,
        done: false,
        open: Open::None,
        blocks: 0,
        called: false,
    };
    let events = stream::unfold(state, |mut s| async move {
        loop {
            if let Some(ev) = s.queue.pop_front() {
                return Some((Ok(ev), s));
            }
            if s.done {
                return None;
            }
            if !s.started {
                s.started = true;
                // Cached tokens are known once the turn ends: the final usage has them.
                let prompt = s.x.handle.prompt_tokens;
                let message = json!({
                    "id": s.x.id, "type": "message", "role": "assistant", "model": s.x.handle.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": prompt, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
                });
                s.push("message_start", json!({"type": "message_start", "message": message}));
                s.push("ping", json!({"type": "ping"}));
                continue;
            }
            let ev = s.x.handle.next().await;
            s.on(ev);
        }
    });
    let ping = event("ping", json!({"type": "ping"}));
    Sse::new(events).keep_alive(KeepAlive::new().interval(keep_alive).event(ping))
}
