//! The body of `/v1/embeddings` as a Rust type: the one place its fields are declared. The
//! field check, `/openapi.json`'s `EmbeddingRequest` and docs/embeddings.md's table are read
//! from it.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::server::error::ApiError;
use crate::server::field::{self, Int, Json, Text};
use crate::server::field_tables;

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("required" = ["model", "input"]))]
pub struct EmbeddingRequest {
    /// An installed embedding model's id (GET /v1/models, kind `embedding`).
    #[schemars(with = "Text")]
    pub model: Option<Text>,
    /// A string, a list of strings, a list of token ids, or a list of lists of token ids (at
    /// most 2,048 inputs). Token ids are the content: the encoder's special tokens are added
    /// around them as around text. An input longer than the encoder takes is refused.
    #[schemars(with = "Json<Input>")]
    pub input: Option<Json<Input>>,
    /// `float` (default) or `base64` (little-endian float32, as OpenAI's clients decode it).
    pub encoding_format: Option<Json<EncodingFormat>>,
    /// Honoured only when it is the encoder's own length (384 for MiniLM): its vectors were
    /// not trained to be cut, so any other value is refused.
    pub dimensions: Option<Int<1, 65536>>,
    /// Perch's (Ollama's semantics), as on chat.
    pub keep_alive: Option<Json<field::KeepAlive>>,
    /// A label for a hosted service's abuse monitoring.
    #[schemars(extend("x-perch" = "ignored"))]
    pub user: Option<Text>,
}

/// Every field of `map` is one the type declares, or a 400 naming it; fields sent as `null`
/// then leave the map (they count as absent).
pub fn check(map: &mut Map<String, Value>) -> Result<(), ApiError> {
    field::check_fields(
        map,
        schema(),
        |_, _| None,
        |k| {
            ApiError::invalid(k, format!("unknown field `{k}` for /v1/embeddings"))
                .code("unknown_parameter")
        },
    )
}

/// The body as an OpenAPI 3.0 schema, generated from its type.
pub fn schema() -> &'static Value {
    field::schema_for::<EmbeddingRequest>()
}

/// docs/embeddings.md's table for this route (kept in step by a test).
pub fn field_tables() -> String {
    field_tables::tables(&[("embeddings", schema())], "Fields Perch does not know")
}

field::described! {
    Input => {"oneOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "string"}},
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        {"type": "array", "minItems": 1, "maxItems": 2048,
            "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}}
    ]};
    EncodingFormat => {"type": "string", "enum": ["float", "base64"]};
}

#[cfg(test)]
mod tests {
    /// docs/embeddings.md holds the table the type generates; `UPDATE_DOCS=1` rewrites it.
    #[test]
    fn the_field_table_in_the_docs_is_the_type() {
        crate::server::field_tables::check_doc("embeddings.md", "openai", &super::field_tables());
    }
}
