//! A turn's events in OpenAI's wire format: one JSON body, or server-sent chunks ending in
//! `[DONE]`.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};

use super::request::Endpoint;
use super::RenderOptions;
use crate::chat::ToolCall;
use crate::decode::{FinishReason, TokenLogprob};
use crate::error::EngineError;
use crate::runtime::{Answer, TurnEvent, Usage};
use crate::server::error::ApiError;
use crate::server::exchange::{finish_name, unix_now, Exchange};

fn usage(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn error_of(endpoint: Endpoint, e: &EngineError) -> ApiError {
    ApiError::engine(e, if endpoint == Endpoint::Chat { "messages" } else { "prompt" })
}

fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    json!({"content": lps.iter().map(|t| {
        let mut e = entry(&t.text, t.logprob);
        e["top_logprobs"] = t.top.iter().map(|a| entry(&a.text, a.logprob)).collect();
        e
    }).collect::<Vec<_>>()})
}

fn completion_logprobs(lps: &[TokenLogprob], offset0: usize) -> Value {
    let mut offset = offset0;
    let mut offsets = vec![];
    for t in lps {
        offsets.push(offset);
        offset += t.text.len();
    }
    json!({
        "tokens": lps.iter().map(|t| &t.text).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|t| t.top.iter().map(|a| (a.text.clone(), json!(a.logprob))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// `finish_reason`: a stop after calls is `tool_calls` (`function_call` for the legacy form).
fn finish_of(reason: FinishReason, called: bool, legacy: bool) -> &'static str {
    match (reason, called, legacy) {
        (FinishReason::Stop, true, false) => "tool_calls",
        (FinishReason::Stop, true, true) => "function_call",
        _ => finish_name(reason),
    }
}

fn call_json(c: &ToolCall) -> Value {
    json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

/// The whole answer as one JSON body.
pub(super) async fn collect(mut x: Exchange<RenderOptions>) -> Response {
    let created = unix_now() as u64;
    let RenderOptions { endpoint, logprobs, legacy_functions, .. } = x.render;
    let (answer, end) = match x.handle.answer().await {
        Ok(done) => done,
        Err(e) => return error_of(endpoint, &e).into_response(),
    };
    let Answer { text, reasoning, logprobs: lps, calls, .. } = answer;
    let (id, model) = (&x.id, &x.handle.model);
    let finish = finish_of(end.finish_reason, !calls.is_empty(), legacy_functions);
    let body = match endpoint {
        Endpoint::Chat => {
            let mut message = json!({"role": "assistant", "content": text});
            if !reasoning.is_empty() {
                message["reasoning_content"] = reasoning.into();
            }
            if !calls.is_empty() {
                if text.is_empty() {
                    message["content"] = Value::Null;
                }
                if legacy_functions {
                    message["function_call"] =
                        json!({"name": calls[0].name, "arguments": calls[0].arguments});
                } else {
                    message["tool_calls"] = calls.iter().map(call_json).collect();
                }
            }
            json!({
                "id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": message,
                             "logprobs": if logprobs { chat_logprobs(&lps) } else { Value::Null }, "finish_reason": finish}],
                "usage": usage(end.usage),
            })
        }
        Endpoint::Completion => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text,
                         "logprobs": if logprobs { completion_logprobs(&lps, 0) } else { Value::Null }, "finish_reason": finish}],
            "usage": usage(end.usage),
        }),
    };
    Json(body).into_response()
}

struct SseState {
    x: Exchange<RenderOptions>,
    created: u64,
    queue: VecDeque<Event>,
    started: bool,
    done: bool,
    text_offset: usize,
    /// Calls sent so far (the next one's `index`).
    calls: usize,
}

impl SseState {
    fn object(&self) -> &'static str {
        match self.x.render.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, lps: Option<Value>) -> Event {
        let choice = match self.x.render.endpoint {
            Endpoint::Chat => {
                json!({"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")), "logprobs": lps, "finish_reason": finish})
            }
        };
        let mut body = json!({"id": self.x.id, "object": self.object(), "created": self.created, "model": self.x.handle.model, "choices": [choice]});
        if self.x.render.include_usage {
            body["usage"] = Value::Null;
        }
        Event::default().data(body.to_string())
    }

    fn lp_value(&mut self, lps: &[TokenLogprob]) -> Option<Value> {
        if !self.x.render.logprobs {
            return None;
        }
        Some(match self.x.render.endpoint {
            Endpoint::Chat => chat_logprobs(lps),
            Endpoint::Completion => completion_logprobs(lps, self.text_offset),
        })
    }

    fn on(&mut self, ev: Option<TurnEvent>) {
        match ev {
            Some(TurnEvent::Delta { text, logprobs }) => {
                let lp = self.lp_value(&logprobs);
                self.text_offset += logprobs.iter().map(|t| t.text.len()).sum::<usize>();
                let ev = self.chunk(json!({"content": text}), None, lp);
                self.queue.push_back(ev);
            }
            Some(TurnEvent::Reasoning { text }) => {
                let ev = self.chunk(json!({"reasoning_content": text}), None, None);
                self.queue.push_back(ev);
            }
            Some(TurnEvent::ToolCallStart { id, name }) => {
                let i = self.calls;
                self.calls += 1;
                let head = if self.x.render.legacy_functions {
                    json!({"function_call": {"name": name, "arguments": ""}})
                } else {
                    json!({"tool_calls": [{"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]})
                };
                let ev = self.chunk(head, None, None);
                self.queue.push_back(ev);
            }
            Some(TurnEvent::ToolCallArgs { text }) => {
                let i = self.calls.saturating_sub(1);
                let part = if self.x.render.legacy_functions {
                    json!({"function_call": {"arguments": text}})
                } else {
                    json!({"tool_calls": [{"index": i, "function": {"arguments": text}}]})
                };
                let ev = self.chunk(part, None, None);
                self.queue.push_back(ev);
            }
            Some(TurnEvent::ToolCall(c)) => {
                let i = self.calls;
                self.calls += 1;
                if self.x.render.legacy_functions {
                    let ev = self.chunk(
                        json!({"function_call": {"name": c.name, "arguments": c.arguments}}),
                        None,
                        None,
                    );
                    self.queue.push_back(ev);
                    return;
                }
                // As OpenAI streams them: id and name first, then the arguments.
                let head = json!({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]});
                let args =
                    json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]});
                let (head, args) = (self.chunk(head, None, None), self.chunk(args, None, None));
                self.queue.push_back(head);
                self.queue.push_back(args);
            }
            Some(TurnEvent::End(end)) => {
                let finish =
                    finish_of(end.finish_reason, self.calls > 0, self.x.render.legacy_functions);
                let ev = self.chunk(json!({}), Some(finish), None);
                self.queue.push_back(ev);
                if self.x.render.include_usage {
                    let body = json!({"id": self.x.id, "object": self.object(), "created": self.created, "model": self.x.handle.model, "choices": [], "usage": usage(end.usage)});
                    self.queue.push_back(Event::default().data(body.to_string()));
                }
                self.finish();
            }
            Some(TurnEvent::Failed(e)) => {
                let e = error_of(self.x.render.endpoint, &e);
                self.queue.push_back(Event::default().data(e.body().to_string()));
                self.finish();
            }
            None => {
                self.queue
                    .push_back(Event::default().data(ApiError::unfinished().body().to_string()));
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.queue.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}

/// The answer as server-sent events: a role chunk (chat), content chunks, a finish chunk,
/// the usage chunk when asked for, `[DONE]`.
pub(super) fn sse(
    x: Exchange<RenderOptions>,
    keep_alive: std::time::Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let state = SseState {
        x,
        created: unix_now() as u64,
        queue: VecDeque::new(),
        started: false,
        done: false,
        text_offset: 0,
        calls: 0,
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
                if s.x.render.endpoint == Endpoint::Chat {
                    let ev = s.chunk(json!({"role": "assistant", "content": ""}), None, None);
                    return Some((Ok(ev), s));
                }
            }
            let ev = s.x.handle.next().await;
            s.on(ev);
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
}
