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

use crate::runtime::{Embed, EmbedInput, KeepAlive, ModelRef};
use crate::server::body::{self, wrong_type};
use crate::server::error::ApiError;
use crate::server::exchange::{self, Route};
use crate::server::field::{self, Text, Words};
use crate::server::App;
use types::EmbeddingRequest;

const EMBEDDINGS: Route = Route { name: "embeddings", id_prefix: "embd", prompt_param: "input" };

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
    let mut map = body::object(bytes)?;
    types::check(&mut map)?;
    let b: EmbeddingRequest = field::typed_fields(map, Words::OpenAi)?;
    let model = match &b.model {
        Some(Text(s)) if !s.is_empty() => {
            s.parse::<ModelRef>().map_err(|e| ApiError::invalid("model", e.to_string()))?
        }
        _ => return Err(ApiError::invalid(
            "model",
            "`model` is required (see GET /v1/models; embedding models are of kind `embedding`)",
        )
        .code("missing_required_parameter")),
    };
    let inputs = match field::Json::value(&b.input) {
        None => {
            return Err(ApiError::invalid("input", "`input` is required")
                .code("missing_required_parameter"))
        }
        Some(v) => inputs(v)?,
    };
    let encoding = match field::Json::value(&b.encoding_format) {
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
    let dimensions = b.dimensions.map(|d| d.0 as usize);
    let keep_alive = field::Json::value(&b.keep_alive)
        .map(|v| KeepAlive::from_request(v).map_err(|e| ApiError::invalid("keep_alive", e)))
        .transpose()?;
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

pub mod types;
