//! A turn's events as the Responses API answers: output items (`reasoning`, `message`,
//! `function_call`) built as the events arrive, sent either as one `response` object or as
//! the typed event stream (`response.created` … `response.completed`). One builder serves
//! both, so a streamed answer and its stored object cannot disagree.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde_json::{json, Map, Value};

use super::request::push_call;
use super::store::{Store, Stored};
use crate::chat::ChatMessage;
use crate::decode::{FinishReason, TokenLogprob};
use crate::runtime::{TurnEnd, TurnEvent, Usage};
use crate::server::error::ApiError;
use crate::server::exchange::{unix_now, Exchange};

/// What rendering needs besides the turn's events.
pub struct RenderOptions {
    pub store: Option<Arc<Store>>,
    pub conversation: Vec<ChatMessage>,
    pub echo: Map<String, Value>,
    pub logprobs: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    None,
    Reasoning,
    Message,
    Call,
}

/// The response as it grows, and the events that tell a streaming client so.
struct Builder {
    id: String,
    model: String,
    created_at: u64,
    render: RenderOptions,
    output: Vec<Value>,
    open: Open,
    events: VecDeque<Value>,
    sequence: u64,
}

fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        // Reasoning and answer tokens are one count here.
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn logprobs_json(lps: &[TokenLogprob]) -> Vec<Value> {
    let entry = |t: &str, lp: f32| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
    lps.iter()
        .map(|t| {
            let mut e = entry(&t.text, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|a| entry(&a.text, a.logprob)).collect();
            e
        })
        .collect()
}

impl Builder {
    fn response(&self, status: &str) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": null, "incomplete_details": null,
            "model": self.model, "output": self.output, "usage": null,
        });
        for (k, v) in &self.render.echo {
            r[k] = v.clone();
        }
        r
    }

    fn emit(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.events.push_back(data);
    }

    fn start(&mut self) {
        let r = self.response("in_progress");
        self.emit("response.created", json!({"response": r}));
        self.emit("response.in_progress", json!({"response": r}));
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}-{}-{}", self.id, self.output.len())
    }

    /// Close the open item: its `done` events, its status `completed`.
    fn close(&mut self) {
        let i = self.output.len().wrapping_sub(1);
        let (open, item_id) = match self.output.last() {
            Some(item) => (self.open, item["id"].clone()),
            None => return,
        };
        let at = json!({"item_id": item_id, "output_index": i});
        let with = |extra: Value| {
            let mut v = at.clone();
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        match open {
            Open::None => return,
            Open::Reasoning => {
                let part = self.output[i]["content"][0].clone();
                self.emit(
                    "response.reasoning_text.done",
                    with(json!({"content_index": 0, "text": part["text"]})),
                );
                self.emit(
                    "response.content_part.done",
                    with(json!({"content_index": 0, "part": part})),
                );
            }
            Open::Message => {
                self.output[i]["status"] = json!("completed");
                let part = self.output[i]["content"][0].clone();
                self.emit(
                    "response.output_text.done",
                    with(json!({"content_index": 0, "text": part["text"], "logprobs": part["logprobs"]})),
                );
                self.emit(
                    "response.content_part.done",
                    with(json!({"content_index": 0, "part": part})),
                );
            }
            Open::Call => {
                self.output[i]["status"] = json!("completed");
                let (name, args) =
                    (self.output[i]["name"].clone(), self.output[i]["arguments"].clone());
                self.emit(
                    "response.function_call_arguments.done",
                    with(json!({"name": name, "arguments": args})),
                );
            }
        }
        let item = self.output[i].clone();
        self.emit("response.output_item.done", json!({"output_index": i, "item": item}));
        self.open = Open::None;
    }

    /// Open a new item (and, for reasoning and messages, its one content part).
    fn open(&mut self, kind: Open, item: Value, part: Option<Value>) {
        self.close();
        let i = self.output.len();
        let item_id = item["id"].clone();
        self.output.push(item.clone());
        self.open = kind;
        self.emit("response.output_item.added", json!({"output_index": i, "item": item}));
        if let Some(part) = part {
            self.output[i]["content"] = json!([part.clone()]);
            self.emit(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": i, "content_index": 0, "part": part}),
            );
        }
    }

    fn on(&mut self, ev: TurnEvent) -> Option<Result<TurnEnd, ApiError>> {
        match ev {
            TurnEvent::Reasoning { text } => {
                if self.open != Open::Reasoning {
                    let id = self.item_id("rs");
                    self.open(
                        Open::Reasoning,
                        json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
                        Some(json!({"type": "reasoning_text", "text": ""})),
                    );
                }
                let i = self.output.len() - 1;
                push_text(&mut self.output[i]["content"][0]["text"], &text);
                let item_id = self.output[i]["id"].clone();
                self.emit(
                    "response.reasoning_text.delta",
                    json!({"item_id": item_id, "output_index": i, "content_index": 0, "delta": text}),
                );
            }
            TurnEvent::Delta { text, logprobs } => {
                if text.is_empty() && logprobs.is_empty() {
                    return None;
                }
                if self.open != Open::Message {
                    let id = self.item_id("msg");
                    self.open(
                        Open::Message,
                        json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
                        Some(json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})),
                    );
                }
                let i = self.output.len() - 1;
                let lps = if self.render.logprobs { logprobs_json(&logprobs) } else { vec![] };
                let part = &mut self.output[i]["content"][0];
                push_text(&mut part["text"], &text);
                if let Some(all) = part["logprobs"].as_array_mut() {
                    all.extend(lps.iter().cloned());
                }
                let item_id = self.output[i]["id"].clone();
                self.emit(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": i, "content_index": 0, "delta": text, "logprobs": lps}),
                );
            }
            TurnEvent::ToolCallStart { id, name } => self.call(id, name, None),
            TurnEvent::ToolCallArgs { text } => {
                if self.open == Open::Call {
                    self.arguments(&text);
                }
            }
            TurnEvent::ToolCall(c) => self.call(c.id, c.name, Some(c.arguments)),
            TurnEvent::End(end) => {
                self.close();
                return Some(Ok(*end));
            }
            TurnEvent::Failed(e) => return Some(Err(ApiError::engine(&e, "input"))),
        }
        None
    }

    fn call(&mut self, call_id: String, name: String, whole: Option<String>) {
        let id = self.item_id("fc");
        self.open(
            Open::Call,
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"}),
            None,
        );
        if let Some(args) = whole {
            self.arguments(&args);
            self.close();
        }
    }

    fn arguments(&mut self, text: &str) {
        let i = self.output.len() - 1;
        push_text(&mut self.output[i]["arguments"], text);
        let item_id = self.output[i]["id"].clone();
        self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": i, "delta": text}),
        );
    }

    /// The finished response; kept in the store unless the client said `store: false`.
    fn finish(&mut self, end: &TurnEnd) -> Value {
        let incomplete = end.finish_reason == FinishReason::Length;
        let mut r = self.response(if incomplete { "incomplete" } else { "completed" });
        if incomplete {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        r["usage"] = usage(end.usage);
        if let Some(store) = &self.render.store {
            let mut conversation = std::mem::take(&mut self.render.conversation);
            conversation.extend(messages_of(&self.output));
            store.insert(
                self.id.clone(),
                Stored { conversation, body: r.clone(), model: self.model.clone() },
            );
        }
        r
    }

    fn fail(&mut self, e: &ApiError) -> Value {
        let mut r = self.response("failed");
        r["error"] = json!({"code": e.code.unwrap_or("server_error"), "message": e.message});
        r
    }
}

fn push_text(slot: &mut Value, text: &str) {
    if let Value::String(s) = slot {
        s.push_str(text);
    }
}

/// The output as the chat messages a follow-up's conversation continues from (reasoning is
/// not shown to the model again, as chat templates drop it).
fn messages_of(output: &[Value]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = vec![];
    for item in output {
        match item["type"].as_str() {
            Some("message") => {
                let text = item["content"][0]["text"].as_str().unwrap_or_default();
                out.push(ChatMessage::new("assistant", text));
            }
            Some("function_call") => {
                let args = item["arguments"].as_str().unwrap_or_default();
                push_call(&mut out, item["call_id"].clone(), item["name"].clone(), args);
            }
            _ => {}
        }
    }
    out
}

fn builder(x: &Exchange<RenderOptions>, render: RenderOptions) -> Builder {
    Builder {
        id: x.id.clone(),
        model: x.handle.model.clone(),
        created_at: unix_now() as u64,
        render,
        output: vec![],
        open: Open::None,
        events: VecDeque::new(),
        sequence: 0,
    }
}

/// The whole response as one object.
pub async fn collect(mut x: Exchange<RenderOptions>) -> Response {
    let render = std::mem::replace(&mut x.render, empty_render_options());
    let mut b = builder(&x, render);
    while let Some(ev) = x.handle.next().await {
        let outcome = b.on(ev);
        // Only a stream sends the events.
        b.events.clear();
        match outcome {
            None => {}
            Some(Ok(end)) => return Json(b.finish(&end)).into_response(),
            Some(Err(e)) => return e.into_response(),
        }
    }
    ApiError::unfinished().into_response()
}

fn empty_render_options() -> RenderOptions {
    RenderOptions { store: None, conversation: vec![], echo: Map::new(), logprobs: false }
}

struct SseState {
    x: Exchange<RenderOptions>,
    b: Builder,
    done: bool,
}

/// The response as the typed event stream; SSE comments keep a client's read timeout at bay
/// while a long prompt prefills.
pub fn sse(
    mut x: Exchange<RenderOptions>,
    keep_alive: std::time::Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let render = std::mem::replace(&mut x.render, empty_render_options());
    let mut b = builder(&x, render);
    b.start();
    let state = SseState { x, b, done: false };
    let events = stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.b.events.pop_front() {
                let kind = data["type"].as_str().unwrap_or_default().to_string();
                return Some((Ok(Event::default().event(kind).data(data.to_string())), s));
            }
            if s.done {
                return None;
            }
            let outcome = match s.x.handle.next().await {
                Some(ev) => s.b.on(ev),
                None => Some(Err(ApiError::unfinished())),
            };
            match outcome {
                None => {}
                Some(Ok(end)) => {
                    let r = s.b.finish(&end);
                    let kind = if r["status"] == "incomplete" {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    s.b.emit(kind, json!({"response": r}));
                    s.done = true;
                }
                Some(Err(e)) => {
                    let r = s.b.fail(&e);
                    s.b.emit("response.failed", json!({"response": r}));
                    s.done = true;
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(keep_alive))
}
