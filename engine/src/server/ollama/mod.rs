//! Ollama's API for the editor plugins, web UIs and scripts that speak it: `/api/chat`,
//! `/api/generate` (NDJSON streams), `/api/embed` and `/api/embeddings` (`embed`), `/api/tags`,
//! `/api/ps`, `/api/show`, `/api/version`.
//! A thin adapter like the others: a body becomes the runtime's turn (`request`), its events
//! come back as Ollama's objects (`render`), errors as `{"error": "..."}` (docs/ollama.md).

pub mod embed;
pub mod model_types;
mod render;
pub mod request;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::{ApiError, Dialect};
use super::exchange::{self, Parsed, Route};
use super::App;
use crate::runtime::KeepAlive;
use crate::sync::LockExt;
use request::{Endpoint, ParsedOllama};

/// The Ollama API version whose behaviour these routes follow (clients check it).
const OLLAMA_VERSION: &str = "0.12.0";

const CHAT: Route = Route { name: "ollama_chat", id_prefix: "ollama", prompt_param: "messages" };
const GENERATE: Route =
    Route { name: "ollama_generate", id_prefix: "ollama", prompt_param: "prompt" };

fn err(e: ApiError) -> Response {
    e.into_response_as(Dialect::Ollama)
}

pub async fn version() -> Response {
    Json(json!({"version": OLLAMA_VERSION})).into_response()
}

fn details(architecture: &str, format: &str) -> Value {
    json!({"parent_model": "", "format": format, "family": architecture, "families": [architecture],
           "parameter_size": "", "quantization_level": ""})
}

/// Installed models, as `name:latest`.
pub async fn tags(State(app): State<Arc<App>>) -> Response {
    let models: Vec<Value> = app
        .engine
        .config
        .catalog()
        .list()
        .into_iter()
        .map(|m| {
            let modified = std::fs::metadata(&m.path)
                .and_then(|md| md.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            json!({"name": format!("{}:latest", m.id), "model": format!("{}:latest", m.id),
                   "modified_at": render::rfc3339(modified as f64), "size": m.size_bytes, "digest": "",
                   "details": details(&m.architecture, &m.format)})
        })
        .collect();
    Json(json!({"models": models})).into_response()
}

/// Loaded models.
pub async fn ps(State(app): State<Arc<App>>) -> Response {
    let models: Vec<Value> = app
        .engine
        .resident_snapshot()
        .into_iter()
        .map(|m| {
            json!({"name": format!("{}:latest", m.id), "model": format!("{}:latest", m.id), "size": 0,
                   "digest": "", "details": details(&m.architecture, ""), "context_length": m.context_length})
        })
        .collect();
    Json(json!({"models": models})).into_response()
}

/// One model's details: its template, context length and what it can do.
pub async fn show(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = async {
        let bytes =
            body.map_err(|r| ApiError::new(r.status(), "invalid_request_error", r.body_text()))?;
        let b: model_types::ShowRequest = model_types::read(&bytes)?;
        let name = model_types::model_of(b.model, b.name)?;
        let id = name.strip_suffix(":latest").unwrap_or(&name).to_string();
        let engine = app.engine.clone();
        let info = tokio::task::spawn_blocking(move || engine.model_info(&id))
            .await
            .map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string())
            })?
            .map_err(|e| ApiError::engine(&e, "model"))?;
        let template = info.tokenizer.chat_template_source().unwrap_or_default().to_string();
        let mut capabilities = vec!["completion"];
        if info.kind != crate::model::ModelKind::Chat {
            capabilities = vec!["embedding"];
        }
        if template.contains("tools") {
            capabilities.push("tools");
        }
        if template.contains("<think>") || template.contains("enable_thinking") {
            capabilities.push("thinking");
        }
        let arch = info.architecture.clone();
        Ok::<_, ApiError>(
            Json(json!({
                "modelfile": "", "parameters": "", "template": template,
                "details": details(&arch, ""),
                "model_info": {"general.architecture": arch, format!("{arch}.context_length"): info.context_length},
                "capabilities": capabilities,
            }))
            .into_response(),
        )
    };
    answer.await.unwrap_or_else(err)
}

pub async fn chat(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(app, Endpoint::Chat, body).await
}

pub async fn generate(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(app, Endpoint::Generate, body).await
}

async fn run(app: Arc<App>, endpoint: Endpoint, body: Result<Bytes, BytesRejection>) -> Response {
    let route = if endpoint == Endpoint::Chat { &CHAT } else { &GENERATE };
    // A body without anything to generate loads or (keep_alive 0) unloads the model: parsed
    // here first, as Ollama's clients use it to manage memory.
    if let Ok(bytes) = &body {
        let defaults = *app.sampling.locked();
        if let Ok(ParsedOllama { turn: None, model, keep_alive, .. }) =
            request::parse(endpoint, bytes, &defaults)
        {
            return load_or_unload(&app, endpoint, model, keep_alive).await.unwrap_or_else(err);
        }
    }
    let parse = move |bytes: &[u8], defaults: &_| {
        let r = request::parse(endpoint, bytes, defaults)?;
        let turn =
            r.turn.ok_or_else(|| ApiError::invalid(route.prompt_param, "nothing to generate"))?;
        Ok(Parsed { stream: r.stream, turn, render: endpoint })
    };
    match exchange::start(&app, route, body, parse).await {
        Ok(x) => x.answer(render::ndjson, render::collect).await,
        Err(e) => err(e),
    }
}

async fn load_or_unload(
    app: &Arc<App>,
    endpoint: Endpoint,
    model: crate::runtime::ModelRef,
    keep_alive: Option<KeepAlive>,
) -> Result<Response, ApiError> {
    let info = app.engine.resolve(&model).map_err(|e| ApiError::engine(&e, "model"))?;
    let reason = if keep_alive == Some(KeepAlive::UnloadWhenIdle) {
        app.engine.unload(&info.id).await.map_err(|e| ApiError::engine(&e, "model"))?;
        "unload"
    } else {
        let lease =
            app.engine.lease_model(&info.id).await.map_err(|e| ApiError::engine(&e, "model"))?;
        app.engine.set_keep_alive(&info.id, keep_alive);
        drop(lease);
        "load"
    };
    let mut body = json!({"model": info.served_id(), "created_at": render::now_rfc3339(), "done": true, "done_reason": reason});
    match endpoint {
        Endpoint::Chat => body["message"] = json!({"role": "assistant", "content": ""}),
        Endpoint::Generate => body["response"] = json!(""),
    }
    Ok(Json(body).into_response())
}
