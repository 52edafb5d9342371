//! A JSON request body as every protocol adapter reads it: parsed into an object, its
//! fields read with their types checked (a JSON `null` counts as absent), each refusal
//! naming the field. The wording of the messages is shared; each protocol renders the error
//! in its own shape (`error::Dialect`).

use axum::http::StatusCode;
use serde_json::{Map, Value};

use super::error::ApiError;

/// The body as a JSON object, or a 400: `invalid_json` for what does not parse,
/// `invalid_type` for JSON that is not an object.
pub fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("The body is not valid JSON: {e}"),
        )
        .code("invalid_json")
    })?;
    match value {
        Value::Object(map) => Ok(map),
        v => Err(ApiError::invalid(
            "body",
            format!("The body must be a JSON object; got {}", kind(&v)),
        )
        .code("invalid_type")),
    }
}

/// The body read as `T`, a typed request (`deny_unknown_fields`): an unknown field or a
/// wrong type is refused by its path (`messages[1].parent`).
pub fn typed<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid(if path == "." { "body" } else { &path }, e.inner().to_string())
    })
}

/// The refusal of a field whose JSON type is wrong.
pub fn wrong_type(field: &str, want: &str, v: &Value) -> ApiError {
    ApiError::invalid(field, format!("`{field}` must be {want}; got {}", kind(v)))
        .code("invalid_type")
}

pub struct Body<'a>(pub &'a Map<String, Value>);

impl Body<'_> {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => {
                Err(ApiError::invalid(key, format!("`{key}` must be a boolean; got {}", kind(v)))
                    .code("invalid_type"))
            }
        }
    }
}

pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
