//! The server's side of one turn, shared by every protocol: the arrival stamped first, the
//! body read and parsed off the async threads, the turn started, its cancellation registered
//! for shutdown, and its end counted in the metrics and the request log. A protocol adapter
//! brings a parse function and renders the turn's events.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

use super::error::ApiError;
use super::request_log::RequestRecord;
use super::App;
use crate::chat::ToolNote;
use crate::config::SamplingDefaults;
use crate::decode::FinishReason;
use crate::runtime::turn::TurnRecord;
use crate::runtime::{Arrival, Embed, Embedded, Turn, TurnHandle};
use crate::sync::LockExt;

/// An endpoint as the exchange sees it.
pub(super) struct Route {
    /// Its name in the metrics and the request log.
    pub name: &'static str,
    /// Response ids are `{id_prefix}-` and 128 random bits in hex.
    pub id_prefix: &'static str,
    /// The field a prompt error names (`messages`, `prompt`).
    pub prompt_param: &'static str,
}

/// A body parsed into a turn, with what the protocol needs to render it (`render`).
pub(super) struct Parsed<P> {
    pub turn: Turn,
    pub stream: bool,
    pub render: P,
}

/// Set when a turn decodes without the drafts its model would use, with the reason.
pub const DRAFTS_HEADER: &str = "x-perch-drafts";
/// Response header: the prompt's length in tokens (known before the first token is).
pub const PROMPT_TOKENS_HEADER: &str = "x-perch-prompt-tokens";
/// Response header (whole answers): the formats tool calls were recovered from, e.g.
/// `fenced-json` (docs/api-fields.md, "Tool calls").
pub const TOOL_RECOVERY_HEADER: &str = "x-perch-tool-call-recovered";
/// Response header (whole answers): calls that repeat answered ones, `name; earlier=N`.
pub const REPEATED_CALL_HEADER: &str = "x-perch-repeated-tool-call";

/// A started turn and the protocol's own options for rendering it.
pub(super) struct Exchange<P> {
    pub id: String,
    pub handle: TurnHandle,
    pub stream: bool,
    pub render: P,
    /// While the exchange lives, shutdown can cancel its turn.
    _in_flight: InFlight,
}

impl<P> Exchange<P> {
    /// The answer, streamed (`sse`) or whole (`collect`), with Perch's headers on every
    /// protocol: the prompt's length (the chat window says "Reading N tokens…" from it while
    /// a long prompt prefills) and, when the turn decodes without its model's drafts, why
    /// (docs/api-fields.md).
    pub(super) async fn answer<F: Future<Output = Response>>(
        self,
        sse: impl FnOnce(Self) -> Response,
        collect: impl FnOnce(Self) -> F,
    ) -> Response {
        let drafts_off = self.handle.drafts_off.clone();
        let prompt_tokens = self.handle.prompt_tokens;
        let notes = self.handle.tool_notes.clone();
        let mut r = if self.stream { sse(self) } else { collect(self).await };
        r.headers_mut().insert(PROMPT_TOKENS_HEADER, prompt_tokens.into());
        if let Some(v) = drafts_off.and_then(|w| HeaderValue::from_str(&w).ok()) {
            r.headers_mut().insert(DRAFTS_HEADER, v);
        }
        // A streamed answer's headers left before its calls were read: the request log has
        // its notes.
        let (recovered, repeated) = tool_notes(&notes.locked());
        for (name, values) in [(TOOL_RECOVERY_HEADER, recovered), (REPEATED_CALL_HEADER, repeated)]
        {
            if let Some(v) = (!values.is_empty()).then(|| values.join(", ")) {
                if let Ok(v) = HeaderValue::from_str(&v) {
                    r.headers_mut().insert(name, v);
                }
            }
        }
        r
    }
}

/// A turn's tool notes as the header and the request log write them: the formats calls were
/// recovered from (each once), and the repeated calls (`name; earlier=N`).
fn tool_notes(notes: &[ToolNote]) -> (Vec<String>, Vec<String>) {
    let (mut recovered, mut repeated) = (Vec::<String>::new(), Vec::new());
    for n in notes {
        match n {
            ToolNote::Recovered(f) if !recovered.iter().any(|r| r == f.name()) => {
                recovered.push(f.name().into())
            }
            ToolNote::Recovered(_) => {}
            ToolNote::Repeated { name, earlier } => {
                repeated.push(format!("{name}; earlier={earlier}"))
            }
        }
    }
    (recovered, repeated)
}

pub(super) fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The finish reason as OpenAI, the request log and the metrics name it (a cancelled turn
/// stopped).
pub(super) fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// The body's bytes, or the protocol-neutral error for a body that could not be read.
fn body_bytes(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The body is larger than {} bytes", app.config.max_body_bytes),
        )
        .code("request_too_large"),
        s => ApiError::new(s, "invalid_request_error", r.body_text()),
    })
}

/// Start one turn: everything between the route and the first event.
pub(super) async fn start<P: Send + 'static>(
    app: &Arc<App>,
    route: &'static Route,
    body: Result<Bytes, BytesRejection>,
    parse: impl FnOnce(&[u8], &SamplingDefaults) -> Result<Parsed<P>, ApiError> + Send + 'static,
) -> Result<Exchange<P>, ApiError> {
    // docs/runtime.md §1: stamp the arrival before anything else.
    let arrival = Arrival::now(&app.engine);
    let n = app.next_id();
    // Random, not `n`: a stored response is read, continued and deleted by its id alone, so
    // one client must not be able to guess another's (docs/responses.md).
    let id = super::ids::random_id(route.id_prefix);
    let failed =
        |model: &str, stream: bool, e: ApiError| refused(app, route, &id, model, stream, e);
    let bytes = body_bytes(app, body).map_err(|e| failed("", false, e))?;
    // Parsing is CPU work on untrusted input: off the async threads, so /health and other
    // requests keep answering whatever a body holds.
    let defaults = *app.sampling.locked();
    let parsed = tokio::task::spawn_blocking(move || parse(&bytes, &defaults))
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("parsing the request failed: {e}"),
            ))
        })
        .map_err(|e| failed("", false, e))?;
    let Parsed { turn, stream, render } = parsed;
    let model = turn.model.to_string();
    let on_end = {
        let (app, id) = (app.clone(), id.clone());
        move |r: &TurnRecord<'_>| ended(&app, route, id, stream, r)
    };
    let handle = arrival
        .start_observed(turn, on_end)
        .await
        .map_err(|e| failed(&model, stream, ApiError::engine(&e, route.prompt_param)))?;
    let in_flight = InFlight::register(app, n, handle.cancel_flag());
    Ok(Exchange { id, handle, stream, render, _in_flight: in_flight })
}

/// A request refused before it ran, in the metrics and the request log.
fn refused(app: &App, route: &Route, id: &str, model: &str, stream: bool, e: ApiError) -> ApiError {
    app.metrics.request(route.name, e.status.as_u16());
    app.metrics.error(e.label());
    if let Some(log) = &app.log {
        log.write(&RequestRecord {
            id: id.into(),
            time_unix: unix_now(),
            endpoint: route.name.into(),
            model: model.into(),
            stream,
            status: e.status.as_u16(),
            error: Some(e.message.clone()),
            ..Default::default()
        });
    }
    e
}

/// One embedding request, shared by every protocol that has one: the arrival stamped first,
/// the body read and parsed off the async threads (into the runtime's `Embed` and what the
/// protocol renders with, `P`), the vectors made, and the request counted in the metrics and
/// the request log however it ends.
pub(super) async fn embed<P: Send + 'static>(
    app: &Arc<App>,
    route: &'static Route,
    body: Result<Bytes, BytesRejection>,
    parse: impl FnOnce(&[u8]) -> Result<(Embed, P), ApiError> + Send + 'static,
) -> Result<(Embedded, P), ApiError> {
    let arrival = Arrival::now(&app.engine);
    let id = super::ids::random_id(route.id_prefix);
    let failed = |model: &str, e: ApiError| refused(app, route, &id, model, false, e);
    let bytes = body_bytes(app, body).map_err(|e| failed("", e))?;
    let (req, render) = tokio::task::spawn_blocking(move || parse(&bytes))
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("parsing the request failed: {e}"),
            ))
        })
        .map_err(|e| failed("", e))?;
    let (model, inputs) = (req.model.to_string(), req.inputs.len());
    let done =
        arrival.embed(req).await.map_err(|e| failed(&model, ApiError::engine(&e, "input")))?;
    app.metrics.request(route.name, 200);
    app.metrics.embedding(inputs, done.tokens);
    if let Some(log) = &app.log {
        log.write(&RequestRecord {
            id,
            time_unix: unix_now(),
            endpoint: route.name.into(),
            model: done.model.clone(),
            status: 200,
            prompt_tokens: done.tokens,
            inputs: Some(inputs),
            ..Default::default()
        });
    }
    Ok((done, render))
}

/// A turn's end, in the metrics and the request log (on the generation's thread, before
/// its client hears of it).
fn ended(app: &App, route: &Route, id: String, stream: bool, r: &TurnRecord<'_>) {
    let mut rec = RequestRecord {
        id,
        time_unix: unix_now(),
        endpoint: route.name.into(),
        model: r.model.served_id(),
        stream,
        prompt_tokens: r.prompt.len(),
        ..Default::default()
    };
    match r.result {
        Ok(g) => {
            let ttft = r.ttft.unwrap_or_default().as_secs_f64();
            let decode = (g.tokens.len() > 1).then(|| g.decode_tokens_per_sec());
            app.metrics.request(route.name, 200);
            app.metrics.generation(g.prompt_tokens, g.tokens.len(), ttft, decode);
            app.metrics.prefix_cache(g.cached_tokens, g.prompt_tokens - g.cached_tokens);
            rec.status = 200;
            rec.cached_tokens = g.cached_tokens;
            rec.completion_tokens = g.tokens.len();
            rec.ttft_s = Some(ttft);
            rec.prefill_tok_s = Some(g.prefill_tokens_per_sec());
            rec.decode_tok_s = decode;
            rec.finish_reason = Some(finish_name(g.finish_reason).into());
            rec.draft = g.draft.clone();
            rec.batch = g.batch;
            rec.drafts_off = r.drafts_off.map(String::from);
            if let Some(why) = r.drafts_off {
                tracing::info!(request = %rec.id, "{why}");
            }
            let (recovered, repeated) = tool_notes(r.tool_notes);
            for call in &repeated {
                tracing::warn!(request = %rec.id, call = %call, "the model repeated a tool call the conversation already made and answered");
            }
            app.metrics.tool_notes(recovered.len(), repeated.len());
            rec.tool_calls_recovered = (!recovered.is_empty()).then_some(recovered);
            rec.repeated_tool_calls = (!repeated.is_empty()).then_some(repeated);
            if app.log.as_ref().is_some_and(|l| l.with_text) {
                rec.prompt = r.model.tokenizer.decode(r.prompt).ok();
                rec.completion = Some(g.text.clone());
            }
        }
        Err(e) => {
            let e = ApiError::engine(e, route.prompt_param);
            app.metrics.request(route.name, e.status.as_u16());
            app.metrics.error(e.label());
            rec.status = e.status.as_u16();
            rec.error = Some(e.message.clone());
        }
    }
    if let Some(log) = &app.log {
        log.write(&rec);
    }
}

/// A turn's cancel flag in the app's registry, for shutdown; removed when the exchange ends.
struct InFlight {
    app: Arc<App>,
    n: u64,
}

impl InFlight {
    fn register(app: &Arc<App>, n: u64, cancel: Arc<AtomicBool>) -> InFlight {
        app.in_flight.locked().insert(n, cancel);
        InFlight { app: app.clone(), n }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.app.in_flight.locked().remove(&self.n);
    }
}
