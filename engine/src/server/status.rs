//! Perch's own endpoints beside the protocols: `/health` and `/metrics` for tools to read,
//! the OpenAPI description, and the JSON answers for unknown routes and methods.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::{ApiError, Dialect};
use super::openai::model_list;
use super::App;

pub async fn health(State(app): State<Arc<App>>) -> Response {
    let e = &app.engine;
    let fg = e.foreground.snapshot();
    let resident = e.resident_snapshot();
    let mem = |r: mlx_rs::error::Result<usize>| r.ok().map(|v| v as u64);
    Json(json!({
        // A sharded model whose group lost a rank serves nothing until it restarts.
        "status": if e.shard_health().is_some_and(|s| s.reason.is_some()) { "degraded" } else { "ok" },
        "uptime_s": e.started.elapsed().as_secs_f64(),
        "foreground_active": fg.foreground_active,
        "foreground_queued": fg.foreground_queued,
        "foreground_arriving": fg.foreground_arriving,
        "seconds_since_last_request": fg.seconds_since_last_request,
        "seconds_since_last_arrival": fg.seconds_since_last_arrival,
        "requests_completed": fg.requests_completed,
        "gate": e.gate.snapshot(),
        "max_batch": e.config.max_batch,
        "slots": e.batch.slots(),
        "batch": {
            "steps": e.batch.steps.load(std::sync::atomic::Ordering::Relaxed),
            "sequences_per_step_total": e.batch.step_sequences.load(std::sync::atomic::Ordering::Relaxed),
            "prefill_tokens": e.batch.prefill_tokens.load(std::sync::atomic::Ordering::Relaxed),
        },
        // The chat model served; an encoder loaded beside it is in `models`.
        "model": resident.iter().rev().find(|m| m.kind == "chat"),
        "models": resident,
        "embeddings": {
            "requests": e.embeddings.requests.load(std::sync::atomic::Ordering::Relaxed),
            "inputs": e.embeddings.inputs.load(std::sync::atomic::Ordering::Relaxed),
            "tokens": e.embeddings.tokens.load(std::sync::atomic::Ordering::Relaxed),
        },
        "loading": e.loading(),
        "shard": e.shard_health(),
        "draft": e.config.draft,
        "leases": {"total": e.leases.total(), "by_model": e.leases.snapshot()},
        "mtp": resident.iter().rev().find(|m| m.kind == "chat").map(|m| json!({"present": m.mtp, "warm": m.mtp_warm, "load_time_warmup": m.load_time_warmup})),
        "warmup_ladder": e.ladder_status(),
        "last_request": e.last_turn(),
        "prefix_cache": e.prefix.snapshot(),
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
    let fg = app.engine.foreground.snapshot();
    let body = app.metrics.render(
        gate.waiting,
        fg.foreground_active,
        &app.engine.prefix.snapshot(),
        &app.engine.batch,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// The OpenAPI description: `openapi.json`, with the request bodies that are Rust types
/// generated from them, and the models this server has as their `model` enum.
pub async fn openapi(State(app): State<Arc<App>>) -> Response {
    use super::{anthropic, ollama, openai};
    let mut doc: Value =
        serde_json::from_str(include_str!("openapi.json")).expect("openapi.json is valid JSON");
    let ids: Vec<Value> = model_list(&app).into_iter().map(|m| m["id"].clone()).collect();
    let typed = openai::request::types::schemas().into_iter();
    let typed = typed.chain(anthropic::request::types::schemas());
    let typed = typed.chain(ollama::request::types::schemas());
    let typed = typed.chain(ollama::embed::types::schemas());
    let typed = typed.chain(ollama::model_types::schemas());
    let responses = ("ResponsesRequest", openai::responses::request::types::schema());
    let embeddings = ("EmbeddingRequest", openai::embeddings::types::schema());
    for (name, schema) in typed.chain([responses, embeddings]) {
        let mut schema = schema.clone();
        schema["properties"]["model"]["enum"] = Value::Array(ids.clone());
        doc["components"]["schemas"][name] = schema;
    }
    doc["servers"] = json!([{"url": format!("http://{}:{}", app.config.host, app.config.port)}]);
    Json(doc).into_response()
}

pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        "No such endpoint (see GET /openapi.json)",
    )
    .code("unknown_url")
    .into_response_as(Dialect::of_path(uri.path()))
}

pub async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "Method not allowed for this endpoint",
    )
    .code("method_not_allowed")
    .into_response_as(Dialect::of_path(uri.path()))
}
