//! OpenAI's API: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`
//! (`embeddings`), and the Responses API (`responses`). A body is parsed
//! into a turn (`request`), the exchange runs it, and its events are rendered back
//! (`render`); nothing here touches the runtime otherwise.

pub mod embeddings;
mod render;
pub mod request;
pub mod responses;
pub(crate) mod tools;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::exchange::{self, Parsed, Route};
use super::App;
use request::Endpoint;

fn model_entry(
    id: &str,
    context_length: Option<u64>,
    architecture: &str,
    kind: &str,
    loaded: bool,
) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "perch", "context_length": context_length, "architecture": architecture, "kind": kind, "loaded": loaded})
}

pub(super) fn model_list(app: &App) -> Vec<Value> {
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
            let mut entries =
                vec![model_entry(&m.id, m.context_length, &m.architecture, m.kind, loaded)];
            entries.extend(adapters.iter().map(|a| {
                let id = format!("{}+{a}", m.id);
                model_entry(&id, m.context_length, &m.architecture, m.kind, loaded)
            }));
            entries
        })
        .collect();
    // A model served from a directory outside the catalog.
    for r in resident {
        if !out.iter().any(|m| m["id"] == r.id.as_str()) {
            let length = Some(r.context_length as u64);
            out.insert(0, model_entry(&r.id, length, &r.architecture, r.kind, true));
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

const CHAT: Route = Route { name: "chat", id_prefix: "chatcmpl", prompt_param: "messages" };
const COMPLETIONS: Route = Route { name: "completions", id_prefix: "cmpl", prompt_param: "prompt" };

pub use super::exchange::{DRAFTS_HEADER, PROMPT_TOKENS_HEADER};

/// What rendering needs besides the turn's events.
pub(super) struct RenderOptions {
    endpoint: Endpoint,
    include_usage: bool,
    logprobs: bool,
    /// Calls go out as the legacy `function_call`.
    legacy_functions: bool,
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

async fn complete(
    app: Arc<App>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let route = if endpoint == Endpoint::Chat { &CHAT } else { &COMPLETIONS };
    let parse = move |bytes: &[u8], defaults: &_| {
        let r = request::parse_with(endpoint, bytes, defaults)?;
        let render = RenderOptions {
            endpoint,
            include_usage: r.include_usage,
            logprobs: r.turn.logprobs.is_some(),
            legacy_functions: r.legacy_functions,
        };
        Ok(Parsed { stream: r.stream, turn: r.turn, render })
    };
    match exchange::start(&app, route, body, parse).await {
        Ok(x) => {
            let keep_alive = app.config.sse_keep_alive;
            x.answer(|x| render::sse(x, keep_alive).into_response(), render::collect).await
        }
        Err(e) => e.into_response(),
    }
}
