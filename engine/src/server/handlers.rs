//! The endpoints. Completions run on a blocking thread while holding the generation gate;
//! the async side streams their text out and cancels them when the client goes away.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::request::{self, Endpoint, Input, ParsedRequest};
use super::request_log::RequestRecord;
use super::App;
use crate::decode::{FinishReason, Generation, TokenLogprob};
use crate::runtime::engine::ModelInfo;
use crate::runtime::{GateError, GatePermit, Lease, Policy, UserRequest};
use crate::sync::LockExt;

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn model_entry(id: &str, context_length: Option<u64>, architecture: &str, loaded: bool) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "perch", "context_length": context_length, "architecture": architecture, "loaded": loaded})
}

fn model_list(app: &App) -> Vec<Value> {
    let resident = app.engine.resident_snapshot();
    let mut out: Vec<Value> = app
        .engine
        .config
        .catalog()
        .list()
        .into_iter()
        .flat_map(|m| {
            let loaded = resident.iter().any(|r| r.id == m.id);
            // Each saved LoRA adapter is served as `model+adapter`.
            let adapters = crate::model::lora::list_adapters(&app.engine.config.models_dir, &m.id);
            let mut entries = vec![model_entry(&m.id, m.context_length, &m.architecture, loaded)];
            entries.extend(adapters.iter().map(|a| {
                model_entry(&format!("{}+{a}", m.id), m.context_length, &m.architecture, loaded)
            }));
            entries
        })
        .collect();
    // A model served from a directory outside the catalog.
    for r in resident {
        if !out.iter().any(|m| m["id"] == r.id.as_str()) {
            out.insert(0, model_entry(&r.id, Some(r.context_length as u64), &r.architecture, true));
        }
    }
    out
}

pub async fn models(State(app): State<Arc<App>>) -> Response {
    Json(json!({"object": "list", "data": model_list(&app)})).into_response()
}

pub async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match model_list(&app).into_iter().find(|m| m["id"] == id.as_str()) {
        Some(m) => Json(m).into_response(),
        None => ApiError::model_not_found(&id).into_response(),
    }
}

pub async fn health(State(app): State<Arc<App>>) -> Response {
    let e = &app.engine;
    let fg = e.foreground.snapshot();
    let resident = e.resident_snapshot();
    let mem = |r: mlx_rs::error::Result<usize>| r.ok().map(|v| v as u64);
    Json(json!({
        "status": "ok",
        "uptime_s": e.started.elapsed().as_secs_f64(),
        "foreground_active": fg.foreground_active,
        "foreground_queued": fg.foreground_queued,
        "foreground_arriving": fg.foreground_arriving,
        "seconds_since_last_request": fg.seconds_since_last_request,
        "seconds_since_last_arrival": fg.seconds_since_last_arrival,
        "requests_completed": fg.requests_completed,
        "gate": e.gate.snapshot(),
        "model": resident.last(),
        "models": resident,
        "draft": e.config.draft,
        "leases": {"total": e.leases.total(), "by_model": e.leases.snapshot()},
        "mtp": resident.last().map(|m| json!({"present": m.mtp, "warm": m.mtp_warm, "load_time_warmup": m.load_time_warmup})),
        "warmup_ladder": e.ladder_status(),
        "last_request": *app.last_request.locked(),
        "memory": {
            "active_bytes": mem(mlx_rs::memory::active_memory()),
            "cache_bytes": mem(mlx_rs::memory::cache_memory()),
            "peak_bytes": mem(mlx_rs::memory::peak_memory()),
            "rss_peak_bytes": crate::platform::peak_rss_bytes(),
        },
    }))
    .into_response()
}

pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    let gate = app.engine.gate.snapshot();
    let body = app.metrics.render(gate.waiting, app.engine.foreground.snapshot().foreground_active);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// The OpenAPI description, with the models this server has as the `model` enum.
pub async fn openapi(State(app): State<Arc<App>>) -> Response {
    let mut doc: Value =
        serde_json::from_str(include_str!("openapi.json")).expect("openapi.json is valid JSON");
    let ids: Vec<Value> = model_list(&app).into_iter().map(|m| m["id"].clone()).collect();
    doc["components"]["schemas"]["Sampling"]["properties"]["model"]["enum"] = Value::Array(ids);
    doc["servers"] = json!([{"url": format!("http://{}:{}", app.config.host, app.config.port)}]);
    Json(doc).into_response()
}

pub async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        "No such endpoint (see GET /openapi.json)",
    )
    .code("unknown_url")
    .into_response()
}

pub async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "Method not allowed for this endpoint",
    )
    .code("method_not_allowed")
    .into_response()
}

pub async fn chat(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(app, Endpoint::Chat, body).await
}

pub async fn completions(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(app, Endpoint::Completion, body).await
}

/// A request that passed every check and is ready to queue.
struct Prepared {
    req: ParsedRequest,
    info: ModelInfo,
    prompt: Vec<u32>,
}

/// How long parsing, rendering and tokenizing one request may take before the client gets an
/// error (the work itself is bounded by the template's fuel and the body cap).
const PREPARE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

fn prepare(
    app: &App,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Prepared, ApiError> {
    let bytes = body.map_err(|r| match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The body is larger than {} bytes", app.config.max_body_bytes),
        )
        .code("request_too_large"),
        s => ApiError::new(s, "invalid_request_error", r.body_text()),
    })?;
    let defaults = *app.sampling.locked();
    let mut req = request::parse_with(endpoint, &bytes, &defaults)?;
    let info = app.engine.resolve(&req.model)?;
    let tok = &info.tokenizer;
    let mut prompt = match &req.input {
        Input::Messages(m) => tok.encode_chat(m)?,
        Input::Text(t) => tok.encode(t, true)?,
        Input::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!(
                        "token id {bad} is outside the model's vocabulary (0 to {})",
                        info.vocab_size - 1
                    ),
                ));
            }
            ids.clone()
        }
    };
    if prompt.is_empty() {
        prompt.extend(tok.start_token());
    }
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            if endpoint == Endpoint::Chat { "messages" } else { "prompt" },
            "the prompt is empty",
        ));
    }
    if prompt.len() >= info.context_length {
        return Err(ApiError::invalid(
            if endpoint == Endpoint::Chat { "messages" } else { "prompt" },
            format!("This model's maximum context length is {} tokens. However, your prompt has {} tokens.", info.context_length, prompt.len()),
        )
        .code("context_length_exceeded"));
    }
    let cap = app.config.max_tokens_cap.unwrap_or(usize::MAX);
    req.params.max_tokens =
        req.max_tokens.unwrap_or(usize::MAX).min(cap).min(info.context_length - prompt.len());
    req.params.adapter = info.adapter.clone();
    Ok(Prepared { req, info, prompt })
}

enum Msg {
    Piece(String, Vec<TokenLogprob>),
    Done(Result<Generation, ApiError>),
}

/// Sets the generation's cancel flag when dropped: the response (stream or future) is gone.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn endpoint_name(e: Endpoint) -> &'static str {
    match e {
        Endpoint::Chat => "chat",
        Endpoint::Completion => "completions",
    }
}

async fn complete(
    app: Arc<App>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // docs/runtime.md §1: stamp the arrival before anything else.
    let mut user = app.engine.foreground.arrive();
    let arrived = Instant::now();
    let n = app.next_id();
    let id = format!("{}-{n}", if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" });
    let record = |model: &str, stream: bool, e: &ApiError| {
        app.metrics.request(endpoint_name(endpoint), e.status.as_u16());
        app.metrics.error(e.label());
        if let Some(log) = &app.log {
            log.write(&RequestRecord {
                id: id.clone(),
                time_unix: unix_now(),
                endpoint: endpoint_name(endpoint).into(),
                model: model.into(),
                stream,
                status: e.status.as_u16(),
                error: Some(e.message.clone()),
                ..Default::default()
            });
        }
    };
    // Parsing, the chat template and tokenizing are CPU work on untrusted input: off the
    // async threads, so /health and other requests keep answering whatever a body or a
    // model's template does, and with a deadline for the client.
    let prepared = tokio::task::spawn_blocking({
        let app = app.clone();
        move || prepare(&app, endpoint, body)
    });
    let prepared = match tokio::time::timeout(PREPARE_DEADLINE, prepared).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("preparing the request failed: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!(
                "preparing the prompt (chat template, tokenizer) took longer than {} s",
                PREPARE_DEADLINE.as_secs()
            ),
        )),
    };
    let p = match prepared {
        Ok(p) => p,
        Err(e) => {
            record("", false, &e);
            return e.into_response();
        }
    };
    // Pin the model (loading it if needed) before queueing for the gate.
    let lease = match app.engine.lease_model(&p.info.id).await {
        Ok(lease) => lease,
        Err(e) => {
            let e = ApiError::from(e);
            record(&p.req.model.to_string(), p.req.stream, &e);
            return e.into_response();
        }
    };
    user.queue();
    let permit = match app.engine.gate.acquire(Policy::WaitForTurn).await {
        Ok(permit) => permit,
        Err(e) => {
            let e = ApiError::busy(match e {
                GateError::QueueFull(n) => n,
                GateError::Busy => 0,
            });
            record(&p.req.model.to_string(), p.req.stream, &e);
            return e.into_response();
        }
    };
    user.start();
    let cancel = Arc::new(AtomicBool::new(false));
    app.in_flight.locked().insert(n, cancel.clone());
    let (tx, rx) = mpsc::unbounded_channel();
    let stream = p.req.stream;
    let include_usage = p.req.include_usage;
    let model = p.info.served_id();
    let prompt_tokens = p.prompt.len();
    let logprobs = p.req.logprobs.is_some();
    {
        let (app, id, cancel) = (app.clone(), id.clone(), cancel.clone());
        tokio::task::spawn_blocking(move || {
            run(app, id, n, p, (permit, lease), user, cancel, arrived, tx)
        });
    }
    let guard = CancelOnDrop(cancel);
    let created = unix_now() as u64;
    if stream {
        sse(endpoint, id, model, created, prompt_tokens, include_usage, logprobs, rx, guard)
            .into_response()
    } else {
        collect(endpoint, id, model, created, prompt_tokens, logprobs, rx, guard).await
    }
}

/// The generation itself, on a blocking thread. The permit and the user guard live exactly as
/// long as the generation does.
#[allow(clippy::too_many_arguments)]
fn run(
    app: Arc<App>,
    id: String,
    n: u64,
    p: Prepared,
    held: (GatePermit, Lease),
    user: UserRequest,
    cancel: Arc<AtomicBool>,
    arrived: Instant,
    tx: mpsc::UnboundedSender<Msg>,
) {
    let started = Instant::now();
    let mut params = p.req.params.clone();
    params.logprobs = p.req.logprobs;
    params.json_mode = p.req.json_mode;
    let pieces = tx.clone();
    let result = app.engine.generate_blocking(
        &p.info.id,
        p.prompt.clone(),
        params,
        cancel,
        move |text, lps| {
            let _ = pieces.send(Msg::Piece(text.to_string(), lps.to_vec()));
        },
    );
    app.in_flight.locked().remove(&n);
    let endpoint = endpoint_name(p.req.endpoint);
    let mut rec = RequestRecord {
        id,
        time_unix: unix_now(),
        endpoint: endpoint.into(),
        model: p.info.served_id(),
        stream: p.req.stream,
        prompt_tokens: p.prompt.len(),
        ..Default::default()
    };
    let result = match result {
        Ok(g) => {
            let ttft = (started - arrived).as_secs_f64() + g.ttft.as_secs_f64();
            let decode = (g.tokens.len() > 1).then(|| g.decode_tokens_per_sec());
            app.metrics.request(endpoint, 200);
            app.metrics.generation(g.prompt_tokens, g.tokens.len(), ttft, decode);
            rec.status = 200;
            rec.completion_tokens = g.tokens.len();
            rec.ttft_s = Some(ttft);
            rec.prefill_tok_s = Some(g.prefill_tokens_per_sec());
            rec.decode_tok_s = decode;
            *app.last_request.locked() = Some(
                json!({"model": p.info.id, "completion_tokens": g.tokens.len(), "decode_tok_s": decode, "ttft_s": ttft}),
            );
            rec.finish_reason = Some(finish_name(g.finish_reason).into());
            rec.draft = g.draft.clone();
            if app.log.as_ref().is_some_and(|l| l.with_text) {
                rec.prompt = p.info.tokenizer.decode(&p.prompt).ok();
                rec.completion = Some(g.text.clone());
            }
            Ok(g)
        }
        Err(e) => {
            let e = ApiError::from(e);
            app.metrics.request(endpoint, e.status.as_u16());
            app.metrics.error(e.label());
            rec.status = e.status.as_u16();
            rec.error = Some(e.message.clone());
            Err(e)
        }
    };
    if let Some(log) = &app.log {
        log.write(&rec);
    }
    // The request has ended for the engine before its client can see it end: the next one may
    // start, and /health already counts this one.
    drop(held);
    drop(user);
    let _ = tx.send(Msg::Done(result));
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
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

#[allow(clippy::too_many_arguments)]
async fn collect(
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    logprobs: bool,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    _guard: CancelOnDrop,
) -> Response {
    let mut lps = Vec::new();
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Piece(_, l) => lps.extend(l),
            Msg::Done(Err(e)) => return e.into_response(),
            Msg::Done(Ok(g)) => {
                let finish = finish_name(g.finish_reason);
                let body = match endpoint {
                    Endpoint::Chat => json!({
                        "id": id, "object": "chat.completion", "created": created, "model": model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": g.text},
                                     "logprobs": if logprobs { chat_logprobs(&lps) } else { Value::Null }, "finish_reason": finish}],
                        "usage": usage(prompt_tokens, g.tokens.len()),
                    }),
                    Endpoint::Completion => json!({
                        "id": id, "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": 0, "text": g.text,
                                     "logprobs": if logprobs { completion_logprobs(&lps, 0) } else { Value::Null }, "finish_reason": finish}],
                        "usage": usage(prompt_tokens, g.tokens.len()),
                    }),
                };
                return Json(body).into_response();
            }
        }
    }
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the generation ended without a result",
    )
    .into_response()
}

struct SseState {
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    include_usage: bool,
    logprobs: bool,
    rx: mpsc::UnboundedReceiver<Msg>,
    queue: std::collections::VecDeque<Event>,
    started: bool,
    done: bool,
    text_offset: usize,
    _guard: CancelOnDrop,
}

impl SseState {
    fn chunk(&self, delta: Value, finish: Option<&str>, lps: Option<Value>) -> Event {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                json!({"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")), "logprobs": lps, "finish_reason": finish})
            }
        };
        let object = if self.endpoint == Endpoint::Chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut body = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice]});
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        Event::default().data(body.to_string())
    }

    fn lp_value(&mut self, lps: &[TokenLogprob]) -> Option<Value> {
        if !self.logprobs {
            return None;
        }
        Some(match self.endpoint {
            Endpoint::Chat => chat_logprobs(lps),
            Endpoint::Completion => completion_logprobs(lps, self.text_offset),
        })
    }

    fn on(&mut self, msg: Msg) {
        match msg {
            Msg::Piece(text, lps) => {
                let lp = self.lp_value(&lps);
                self.text_offset += lps.iter().map(|t| t.text.len()).sum::<usize>();
                let ev = self.chunk(json!({"content": text}), None, lp);
                self.queue.push_back(ev);
            }
            Msg::Done(Ok(g)) => {
                let ev = self.chunk(json!({}), Some(finish_name(g.finish_reason)), None);
                self.queue.push_back(ev);
                if self.include_usage {
                    let object = if self.endpoint == Endpoint::Chat {
                        "chat.completion.chunk"
                    } else {
                        "text_completion"
                    };
                    let body = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [], "usage": usage(self.prompt_tokens, g.tokens.len())});
                    self.queue.push_back(Event::default().data(body.to_string()));
                }
                self.finish();
            }
            Msg::Done(Err(e)) => {
                self.queue.push_back(Event::default().data(e.body().to_string()));
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.queue.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}

#[allow(clippy::too_many_arguments)]
fn sse(
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    include_usage: bool,
    logprobs: bool,
    rx: mpsc::UnboundedReceiver<Msg>,
    guard: CancelOnDrop,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let state = SseState {
        endpoint,
        id,
        model,
        created,
        prompt_tokens,
        include_usage,
        logprobs,
        rx,
        queue: Default::default(),
        started: false,
        done: false,
        text_offset: 0,
        _guard: guard,
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
                if s.endpoint == Endpoint::Chat {
                    let ev = s.chunk(json!({"role": "assistant", "content": ""}), None, None);
                    return Some((Ok(ev), s));
                }
            }
            match s.rx.recv().await {
                Some(msg) => s.on(msg),
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the generation ended without a result",
                    );
                    s.on(Msg::Done(Err(e)));
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
