//! Ollama's embeddings: `POST /api/embed` (`input`: a string or a list of them; `truncate`,
//! true unless told otherwise, cuts an input to the encoder's length, false refuses it) and
//! the legacy `POST /api/embeddings` (`prompt`, one vector, always cut). A body with nothing
//! to embed loads the encoder, or with `keep_alive: 0` unloads it, as Ollama's clients expect.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::runtime::{Embed, EmbedInput, KeepAlive, ModelRef};
use crate::server::body::{self, wrong_type};
use crate::server::error::{ApiError, Dialect};
use crate::server::exchange::{self, Route};
use crate::server::field::{self, Text, Words};
use crate::server::App;
use types::{EmbedRequest, EmbeddingsRequest};

const EMBED: Route = Route { name: "ollama_embed", id_prefix: "ollama", prompt_param: "input" };
const LEGACY: Route =
    Route { name: "ollama_embeddings", id_prefix: "ollama", prompt_param: "prompt" };

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `/api/embed`.
    Embed,
    /// `/api/embeddings`.
    Legacy,
}

/// A parsed body: what to embed, or (no inputs) a model to load or unload.
pub struct Parsed {
    pub embed: Embed,
}

pub async fn embed(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(app, Which::Embed, body).await
}

pub async fn embeddings(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(app, Which::Legacy, body).await
}

async fn run(app: Arc<App>, which: Which, body: Result<Bytes, BytesRejection>) -> Response {
    let err = |e: ApiError| e.into_response_as(Dialect::Ollama);
    // Nothing to embed: load or unload, answered here (Ollama's clients manage memory so).
    if let Ok(bytes) = &body {
        if let Ok(Parsed { embed }) = parse(which, bytes) {
            if embed.inputs.is_empty() {
                return load_or_unload(&app, which, embed).await.unwrap_or_else(err);
            }
        }
    }
    let route = if which == Which::Embed { &EMBED } else { &LEGACY };
    match exchange::embed(&app, route, body, move |b| parse(which, b).map(|p| (p.embed, ()))).await
    {
        Ok((done, ())) => {
            let nanos = |d: std::time::Duration| d.as_nanos() as u64;
            let body = match which {
                Which::Embed => json!({
                    "model": done.model,
                    "embeddings": done.vectors,
                    "total_duration": nanos(done.total),
                    "load_duration": nanos(done.load),
                    "prompt_eval_count": done.tokens,
                }),
                Which::Legacy => json!({"embedding": done.vectors.first()}),
            };
            Json(body).into_response()
        }
        Err(e) => err(e),
    }
}

async fn load_or_unload(app: &Arc<App>, which: Which, e: Embed) -> Result<Response, ApiError> {
    let info = app.engine.resolve(&e.model).map_err(|x| ApiError::engine(&x, "model"))?;
    if e.keep_alive == Some(KeepAlive::UnloadWhenIdle) {
        app.engine.unload(&info.id).await.map_err(|x| ApiError::engine(&x, "model"))?;
    } else {
        if info.kind == crate::model::ModelKind::Chat {
            let msg = format!("`{}` is a chat model without an embedding head", info.id);
            return Err(ApiError::invalid("model", msg));
        }
        let lease =
            app.engine.lease_model(&info.id).await.map_err(|x| ApiError::engine(&x, "model"))?;
        app.engine.set_keep_alive(&info.id, e.keep_alive);
        drop(lease);
    }
    Ok(Json(match which {
        Which::Embed => json!({"model": info.served_id(), "embeddings": [], "total_duration": 0,
                               "load_duration": 0, "prompt_eval_count": 0}),
        Which::Legacy => json!({"embedding": []}),
    })
    .into_response())
}

pub fn parse(which: Which, bytes: &[u8]) -> Result<Parsed, ApiError> {
    let mut map = body::object(bytes)?;
    types::check(which, &mut map)?;
    // As in Ollama, an empty string is nothing to embed (the body only loads the model).
    let text = |s: String| if s.is_empty() { vec![] } else { vec![EmbedInput::Text(s)] };
    let (model, inputs, truncate, dimensions, keep_alive, options) = match which {
        Which::Embed => {
            let b: EmbedRequest = field::typed_fields(map, Words::OpenAi)?;
            let inputs = match field::Json::value(&b.input) {
                None => vec![],
                Some(Value::Array(list)) => list
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                        v => Err(wrong_type("input", "a string", v)),
                    })
                    .collect::<Result<_, _>>()?,
                Some(Value::String(s)) => text(s.clone()),
                Some(v) => return Err(wrong_type("input", "a string or a list of strings", v)),
            };
            let truncate = b.truncate.is_none_or(|t| t.0);
            (b.model, inputs, truncate, b.dimensions, b.keep_alive, b.options)
        }
        Which::Legacy => {
            let b: EmbeddingsRequest = field::typed_fields(map, Words::OpenAi)?;
            let inputs = b.prompt.map_or(vec![], |p| text(p.0));
            (b.model, inputs, true, None, b.keep_alive, b.options)
        }
    };
    let name = match &model {
        Some(Text(s)) if !s.is_empty() => s.as_str(),
        _ => {
            return Err(ApiError::invalid("model", "`model` is required (see GET /api/tags)")
                .code("missing_required_parameter"))
        }
    };
    let model: ModelRef =
        name.strip_suffix(":latest").unwrap_or(name).parse().map_err(
            |e: crate::runtime::ModelRefError| ApiError::invalid("model", e.to_string()),
        )?;
    check_options(options.as_ref().map(|o| &o.0))?;
    let dimensions = dimensions.map(|d| d.0 as usize);
    let keep_alive = field::Json::value(&keep_alive)
        .map(|v| KeepAlive::from_request(v).map_err(|e| ApiError::invalid("keep_alive", e)))
        .transpose()?;
    Ok(Parsed { embed: Embed { model, inputs, truncate, dimensions, keep_alive } })
}

/// `options`: the hardware hints Perch sizes itself are accepted on purpose, as on
/// `/api/chat`; a sampler's option does nothing to an embedding and is refused by name.
fn check_options(opts: Option<&Map<String, Value>>) -> Result<(), ApiError> {
    let Some(opts) = opts else { return Ok(()) };
    for (k, v) in opts {
        if v.is_null() || super::request::types::hints().any(|h| h == k) {
            continue;
        }
        return Err(ApiError::invalid(
            &format!("options.{k}"),
            format!("`options.{k}` does nothing to an embedding (an encoder does not sample)"),
        )
        .code("unsupported_parameter"));
    }
    Ok(())
}

pub mod types;
