//! The bodies of Ollama's model routes, `/api/show`, `/api/pull` and `/api/delete`, as Rust
//! types: their field checks and `/openapi.json`'s schemas are read from them.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::server::body;
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Text, Words};

/// `POST /api/show`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShowRequest {
    /// An installed model's id; Ollama's `:latest` tag is accepted.
    pub model: Option<Text>,
    /// The older name of `model`.
    pub name: Option<Text>,
    /// Ollama's tensor-level details; Perch has none to add (ignored).
    #[schemars(extend("x-perch" = "ignored"))]
    pub verbose: Option<Flag>,
}

/// `POST /api/pull`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// A hub repository id, `org/name[:revision]` (`:latest` is the default branch).
    pub model: Option<Text>,
    /// The older name of `model`.
    pub name: Option<Text>,
    /// NDJSON progress unless `false`.
    pub stream: Option<Flag>,
    /// A registry without TLS: the `hub_endpoint` setting decides that here (ignored).
    #[schemars(extend("x-perch" = "ignored"))]
    pub insecure: Option<Flag>,
}

/// `DELETE /api/delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    /// An installed model's id (only folders Perch installed, never the default model).
    pub model: Option<Text>,
    /// The older name of `model`.
    pub name: Option<Text>,
}

/// A body read as `T`: a field `T` does not declare is refused by name, then each field's
/// type is checked. `null` counts as absent.
pub fn read<T: DeserializeOwned + JsonSchema + 'static>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut map = body::object(bytes)?;
    field::check_fields(
        &mut map,
        field::schema_for::<T>(),
        |_, _| None,
        |k| {
            ApiError::invalid(k, format!("`{k}` is not a field Perch reads here"))
                .code("unknown_parameter")
        },
    )?;
    field::typed_fields(map, Words::OpenAi)
}

/// `model`, or the older `name`: required, a non-empty string.
pub fn model_of(model: Option<Text>, name: Option<Text>) -> Result<String, ApiError> {
    match model.or(name) {
        Some(Text(s)) if !s.is_empty() => Ok(s),
        _ => {
            Err(ApiError::invalid("model", "`model` is required")
                .code("missing_required_parameter"))
        }
    }
}

/// `/openapi.json`'s names for the bodies, with their schemas.
pub fn schemas() -> [(&'static str, &'static Value); 3] {
    [
        ("OllamaShowRequest", field::schema_for::<ShowRequest>()),
        ("OllamaPullRequest", field::schema_for::<PullRequest>()),
        ("OllamaDeleteRequest", field::schema_for::<DeleteRequest>()),
    ]
}
