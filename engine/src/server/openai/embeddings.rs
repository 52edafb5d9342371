//! OpenAI's `POST /v1/embeddings`: `input` as a string, a list of strings, a list of token ids
//! or a list of such lists; vectors as floats or base64 (little-endian f32, as OpenAI's
//! clients decode them); `dimensions` only where the encoder makes vectors of that length.
//! An input longer than the encoder takes is refused, as OpenAI refuses one.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::runtime::{Embed, EmbedInput, ModelRef};
use crate::server::body::{self, wrong_type, Body};
use crate::server::error::ApiError;
use crate::server::exchange::{self, Route};
use crate::server::App;

const EMBEDDINGS: Route = Route { name: "embeddings", id_prefix: "embd", prompt_param: "input" };

/// Fields read; `user` is accepted and ignored on purpose, as on the other routes (it labels
/// a request for a hosted service's abuse monitoring and changes nothing computed here).
const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user", "keep_alive"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
}

pub async fn create(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match exchange::embed(&app, &EMBEDDINGS, body, parse).await {
        Ok((done, encoding)) => {
            let data: Vec<Value> = done
                .vectors
                .iter()
                .enumerate()
                .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": encode(v, encoding)}))
                .collect();
            Json(json!({
                "object": "list",
                "data": data,
                "model": done.model,
                "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens},
            }))
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}

fn encode(v: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

pub fn parse(bytes: &[u8]) -> Result<(Embed, Encoding), ApiError> {
    let map = body::object(bytes)?;
    if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid(k, format!("unknown field `{k}` for /v1/embeddings"))
            .code("unknown_parameter"));
    }
    let b = Body(&map);
    let model = b
        .model("see GET /v1/models; embedding models are of kind `embedding`")?
        .parse::<ModelRef>()
        .map_err(|e| ApiError::invalid("model", e.to_string()))?;
    let inputs = match b.get("input") {
        None => {
            return Err(ApiError::invalid("input", "`input` is required")
                .code("missing_required_parameter"))
        }
        Some(v) => inputs(v)?,
    };
    let encoding = match b.get("encoding_format") {
        None => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(Value::String(s)) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`encoding_format` must be `float` or `base64`; got `{s}`"),
            ))
        }
        Some(v) => return Err(wrong_type("encoding_format", "a string", v)),
    };
    match b.get("user") {
        None | Some(Value::String(_)) => {}
        Some(v) => return Err(wrong_type("user", "a string", v)),
    }
    let dimensions = b.integer("dimensions", 1, 1 << 16)?.map(|d| d as usize);
    let keep_alive = b.keep_alive()?;
    Ok((Embed { model, inputs, truncate: false, dimensions, keep_alive }, encoding))
}

/// `input` in each of its four shapes.
fn inputs(v: &Value) -> Result<Vec<EmbedInput>, ApiError> {
    const SHAPES: &str =
        "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let token = |x: &Value| x.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32);
    let tokens = |list: &[Value]| -> Option<Vec<u32>> { list.iter().map(token).collect() };
    match v {
        Value::String(s) => Ok(vec![EmbedInput::Text(s.clone())]),
        Value::Array(list) if list.is_empty() => {
            Err(ApiError::invalid("input", "`input` is an empty list"))
        }
        Value::Array(list) if list.iter().all(Value::is_string) => Ok(list
            .iter()
            .map(|s| EmbedInput::Text(s.as_str().unwrap_or_default().to_string()))
            .collect()),
        Value::Array(list) if list.iter().all(Value::is_number) => match tokens(list) {
            Some(ids) => Ok(vec![EmbedInput::Tokens(ids)]),
            None => {
                Err(ApiError::invalid("input", "token ids must be integers from 0 to 4294967295"))
            }
        },
        Value::Array(list) if list.iter().all(Value::is_array) => list
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let l = l.as_array().map(Vec::as_slice).unwrap_or_default();
                match tokens(l) {
                    Some(ids) if !ids.is_empty() => Ok(EmbedInput::Tokens(ids)),
                    Some(_) => Err(ApiError::invalid(
                        "input",
                        format!("input {i} is an empty list of token ids"),
                    )),
                    None => Err(ApiError::invalid(
                        "input",
                        format!("input {i}: token ids must be integers from 0 to 4294967295"),
                    )),
                }
            })
            .collect(),
        other => Err(wrong_type("input", SHAPES, other)),
    }
}
