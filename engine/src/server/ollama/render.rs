//! A turn's events as Ollama answers `/api/chat` and `/api/generate`: newline-delimited JSON
//! objects (`done: false` with each piece, then one `done: true` with the timings), or the
//! whole answer as one object with `stream: false`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{json, Value};

use super::request::Endpoint;
use crate::chat::ToolCall;
use crate::decode::FinishReason;
use crate::runtime::{TurnEnd, TurnEvent};
use crate::server::error::{ApiError, Dialect};
use crate::server::exchange::Exchange;

/// Now, as Ollama's `created_at`.
pub(super) fn now_rfc3339() -> String {
    rfc3339(crate::server::exchange::unix_now())
}

/// Unix time `t` as RFC 3339 in UTC, to the nanosecond.
pub(super) fn rfc3339(t: f64) -> String {
    let secs = t.floor();
    chrono::DateTime::from_timestamp(secs as i64, ((t - secs) * 1e9) as u32)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn call_json(c: &ToolCall) -> Value {
    let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"function": {"name": c.name, "arguments": args}})
}

/// What one object carries besides `model`, `created_at` and `done`.
fn piece(endpoint: Endpoint, text: &str, thinking: &str, calls: &[ToolCall]) -> Value {
    match endpoint {
        Endpoint::Chat => {
            let mut m = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                m["thinking"] = thinking.into();
            }
            if !calls.is_empty() {
                m["tool_calls"] = calls.iter().map(call_json).collect();
            }
            json!({"message": m})
        }
        Endpoint::Generate => {
            let mut o = json!({"response": text});
            if !thinking.is_empty() {
                o["thinking"] = thinking.into();
            }
            o
        }
    }
}

/// The last object's fields: why it stopped and Ollama's counts and durations (nanoseconds).
fn done_fields(end: &TurnEnd) -> Value {
    let g = &end.generation;
    let load = end.load.as_nanos() as u64;
    // From arrival to the first token, less the load: waiting for the gate and prefill.
    let prefill = (end.ttft.saturating_sub(end.load)).as_nanos() as u64;
    let eval = g.decode_time.as_nanos() as u64;
    json!({
        "done_reason": if end.finish_reason == FinishReason::Length { "length" } else { "stop" },
        "total_duration": load + prefill + eval,
        "load_duration": load,
        "prompt_eval_count": end.usage.prompt_tokens - end.usage.cached_tokens,
        "prompt_eval_duration": prefill,
        "eval_count": end.usage.completion_tokens,
        "eval_duration": eval,
    })
}

fn object(model: &str, body: Value, done: bool) -> Value {
    let mut o = json!({"model": model, "created_at": now_rfc3339()});
    for (k, v) in body.as_object().into_iter().flatten() {
        o[k] = v.clone();
    }
    o["done"] = done.into();
    o
}

fn merge(mut a: Value, b: Value) -> Value {
    for (k, v) in b.as_object().into_iter().flatten() {
        a[k] = v.clone();
    }
    a
}

/// The whole answer as one object.
pub(super) async fn collect(mut x: Exchange<Endpoint>) -> Response {
    match x.handle.answer().await {
        Ok((a, end)) => {
            let body = merge(piece(x.render, &a.text, &a.reasoning, &a.calls), done_fields(&end));
            axum::Json(object(&x.handle.model, body, true)).into_response()
        }
        Err(e) => ApiError::engine(&e, "messages").into_response_as(Dialect::Ollama),
    }
}

struct Ndjson {
    x: Exchange<Endpoint>,
    /// A started call whose arguments are still coming (Ollama sends calls whole).
    pending: Option<ToolCall>,
    done: bool,
}

impl Ndjson {
    fn line(&self, body: Value, done: bool) -> Bytes {
        let mut s = object(&self.x.handle.model, body, done).to_string();
        s.push('\n');
        Bytes::from(s)
    }

    /// The next line, or `None` after the last.
    async fn next(&mut self) -> Option<Bytes> {
        let endpoint = self.x.render;
        loop {
            if self.done {
                return None;
            }
            let Some(ev) = self.x.handle.next().await else {
                self.done = true;
                return Some(self.line(json!({"error": ApiError::unfinished().message}), true));
            };
            match ev {
                TurnEvent::Delta { text, .. } if !text.is_empty() => {
                    return Some(self.line(piece(endpoint, &text, "", &[]), false))
                }
                TurnEvent::Delta { .. } => {}
                TurnEvent::Reasoning { text } => {
                    return Some(self.line(piece(endpoint, "", &text, &[]), false))
                }
                TurnEvent::ToolCall(c) => {
                    return Some(self.line(piece(endpoint, "", "", &[c]), false))
                }
                TurnEvent::ToolCallStart { id, name } => {
                    let done =
                        self.pending.replace(ToolCall { id, name, arguments: String::new() });
                    if let Some(c) = done {
                        return Some(self.line(piece(endpoint, "", "", &[c]), false));
                    }
                }
                TurnEvent::ToolCallArgs { text } => {
                    if let Some(c) = self.pending.as_mut() {
                        c.arguments.push_str(&text);
                    }
                }
                TurnEvent::End(end) => {
                    self.done = true;
                    let calls: Vec<ToolCall> = self.pending.take().into_iter().collect();
                    let body = merge(piece(endpoint, "", "", &calls), done_fields(&end));
                    return Some(self.line(body, true));
                }
                TurnEvent::Failed(e) => {
                    self.done = true;
                    let e = ApiError::engine(&e, "messages");
                    return Some(self.line(json!({"error": e.message}), true));
                }
            }
        }
    }
}

/// The answer as newline-delimited JSON (`application/x-ndjson`).
pub(super) fn ndjson(x: Exchange<Endpoint>) -> Response {
    let state = Ndjson { x, pending: None, done: false };
    let lines = stream::unfold(state, |mut s| async move {
        s.next().await.map(|line| (Ok::<_, Infallible>(line), s))
    });
    let mut r = Body::from_stream(lines).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/x-ndjson"));
    r
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(super::rfc3339(0.5), "1970-01-01T00:00:00.500000000Z");
        assert_eq!(super::rfc3339(1_764_633_600.0), "2025-12-02T00:00:00.000000000Z");
    }
}
