//! The bodies of Ollama's `/api/embed` and legacy `/api/embeddings` as Rust types: the one
//! place their fields are declared. The field check, `/openapi.json`'s `OllamaEmbedRequest`
//! and `OllamaEmbeddingsRequest`, and docs/embeddings.md's table are read from them.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Which;
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Int, Json, Object, Text};
use crate::server::field_tables;

/// `POST /api/embed`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("required" = ["model"]))]
pub struct EmbedRequest {
    /// An installed embedding model's id; Ollama's `:latest` tag is accepted.
    #[schemars(with = "Text")]
    pub model: Option<Text>,
    /// A string or a list of strings; none, or an empty string: load (or unload) the encoder.
    pub input: Option<Json<Input>>,
    /// Default true: an input longer than the encoder takes is cut to its length, as
    /// sentence-transformers cuts it; false refuses it.
    pub truncate: Option<Flag>,
    /// Honoured only when it is the encoder's own length.
    pub dimensions: Option<Int<1, 65536>>,
    /// Seconds or a duration (`"5m"`); 0 unloads the encoder after the request.
    pub keep_alive: Option<Json<field::KeepAlive>>,
    /// The hardware hints of `/api/chat` only (`num_thread`, `num_ctx`, …); a sampler's option
    /// does nothing to an encoder and is refused by name (`options.temperature`).
    pub options: Option<Object>,
}

/// `POST /api/embeddings` (legacy): one vector, always cut.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("required" = ["model"]))]
pub struct EmbeddingsRequest {
    /// An installed embedding model's id; Ollama's `:latest` tag is accepted.
    #[schemars(with = "Text")]
    pub model: Option<Text>,
    /// The text; none, or an empty string: load (or unload) the encoder.
    pub prompt: Option<Text>,
    /// Seconds or a duration (`"5m"`); 0 unloads the encoder after the request.
    pub keep_alive: Option<Json<field::KeepAlive>>,
    /// As on `/api/embed`.
    pub options: Option<Object>,
}

/// Every field of `map` is one the route's type declares, or a 400 naming it; fields sent as
/// `null` then leave the map (they count as absent).
pub fn check(which: Which, map: &mut Map<String, Value>) -> Result<(), ApiError> {
    field::check_fields(
        map,
        schema(which),
        |_, _| None,
        |k| {
            ApiError::invalid(k, format!("`{k}` is not a field Perch reads here"))
                .code("unknown_parameter")
        },
    )
}

/// The route's body as an OpenAPI 3.0 schema, generated from its type.
pub fn schema(which: Which) -> &'static Value {
    match which {
        Which::Embed => field::schema_for::<EmbedRequest>(),
        Which::Legacy => field::schema_for::<EmbeddingsRequest>(),
    }
}

/// `/openapi.json`'s names for the bodies, with their schemas.
pub fn schemas() -> [(&'static str, &'static Value); 2] {
    [
        ("OllamaEmbedRequest", schema(Which::Embed)),
        ("OllamaEmbeddingsRequest", schema(Which::Legacy)),
    ]
}

/// docs/embeddings.md's table for these routes (kept in step by a test).
pub fn field_tables() -> String {
    field_tables::tables(
        &[("embed", schema(Which::Embed)), ("embeddings", schema(Which::Legacy))],
        "Fields Perch does not know, and any option but the hints",
    )
}

field::described! {
    Input => {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]};
}

#[cfg(test)]
mod tests {
    /// docs/embeddings.md holds the tables the types generate; `UPDATE_DOCS=1` rewrites them.
    #[test]
    fn the_field_tables_in_the_docs_are_the_types() {
        crate::server::field_tables::check_doc("embeddings.md", "ollama", &super::field_tables());
    }
}
