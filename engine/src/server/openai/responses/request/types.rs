//! The body of `/v1/responses` as a Rust type: the one place its fields are declared. The
//! field check, `/openapi.json`'s `ResponsesRequest` and docs/responses.md's tables are read
//! from it.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Int, Json, Num, Object, Text};
use crate::server::field_tables;
use crate::server::openai::request::MAX_TOP_LOGPROBS;

const U32: i64 = u32::MAX as i64;
const TOP: i64 = MAX_TOP_LOGPROBS as i64;

/// `POST /v1/responses`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("required" = ["model", "input"]))]
pub struct ResponsesRequest {
    /// An installed model's id, or `id+adapter` (GET /v1/models lists them).
    #[schemars(with = "Text")]
    pub model: Option<Text>,
    /// A string (one user message) or items: messages, `function_call` and
    /// `function_call_output`; after the conversation `previous_response_id` left.
    #[schemars(with = "Json<Input>")]
    pub input: Option<Json<Input>>,
    /// The system message (not inherited by a follow-up).
    pub instructions: Option<Text>,
    /// Capped by the server's cap and the context's room.
    pub max_output_tokens: Option<Int<1, U32>>,
    pub temperature: Option<Num<0, 2>>,
    pub top_p: Option<Num<0, 1, true>>,
    /// Needs `include: ["message.output_text.logprobs"]`.
    pub top_logprobs: Option<Int<0, TOP>>,
    /// Server-sent events, Responses' own.
    pub stream: Option<Flag>,
    /// `include_obfuscation` only (loopback has no observer to pad against); needs `stream`.
    pub stream_options: Option<Json<StreamOptions>>,
    /// Keep the response (in memory, the newest ones) for `previous_response_id`.
    pub store: Option<Flag>,
    /// Carries on a stored response's conversation.
    pub previous_response_id: Option<Text>,
    /// Function tools (`type: function`, flat).
    pub tools: Option<Json<Tools>>,
    /// `auto`, `none`, `required` or a function by name.
    pub tool_choice: Option<Json<ToolChoice>>,
    /// `false`: one call at most.
    pub parallel_tool_calls: Option<Flag>,
    /// `format`: `text`, `json_object` or `json_schema` (always enforced).
    pub text: Option<Json<TextOptions>>,
    /// `effort`: the template's `reasoning_effort`; reasoning comes back whole, never
    /// summarized.
    pub reasoning: Option<Json<Reasoning>>,
    /// `message.output_text.logprobs`.
    pub include: Option<Json<Include>>,
    /// `disabled` only: an input longer than the context is an error.
    pub truncation: Option<Json<Truncation>>,
    /// `false` only: stream instead.
    #[schemars(extend("enum" = [false]))]
    pub background: Option<Flag>,
    /// Ollama's: seconds or a duration (`"5m"`).
    pub keep_alive: Option<Json<field::KeepAlive>>,
    /// Kept with the response and echoed back.
    pub metadata: Option<Object>,
    /// Echoed back; nothing else.
    #[schemars(extend("x-perch" = "ignored"))]
    pub user: Option<Text>,
    /// A hosted service's abuse tracking.
    #[schemars(extend("x-perch" = "ignored"))]
    pub safety_identifier: Option<Text>,
    /// A hosted service's routing.
    #[schemars(extend("x-perch" = "ignored"))]
    pub service_tier: Option<Text>,
    /// The prefix cache is automatic and keyed by content, whatever key a client names.
    #[schemars(extend("x-perch" = "ignored"))]
    pub prompt_cache_key: Option<Text>,
    /// A hosted cache's policy; the prefix cache has its own.
    #[schemars(extend("x-perch" = "ignored"))]
    pub prompt_cache_retention: Option<Text>,
}

/// Fields Perch knows and cannot honour: a 400 naming each (a `null` asks for nothing).
pub const REFUSED: &[(&str, &str)] = &[
    ("conversation", "the Conversations API is not supported: use `previous_response_id`"),
    ("prompt", "stored prompt templates are not supported: send `input` and `instructions`"),
    ("context_management", "server-side compaction is not supported"),
    (
        "max_tool_calls",
        "a limit on built-in tool calls does not apply: only function tools run, on the client",
    ),
    ("moderation", "moderation is not available on a local server"),
    ("prompt_cache_options", "the prefix cache is automatic and not configurable per request"),
];

/// Every field of `map` is one the type declares, or a 400 naming it; fields sent as `null`
/// then leave the map (they count as absent; a refused one too: it asks for nothing).
pub fn check(map: &mut Map<String, Value>) -> Result<(), ApiError> {
    let refused = |k: &str, v: &Value| {
        let (_, why) = REFUSED.iter().find(|(r, _)| *r == k && !v.is_null())?;
        Some(ApiError::invalid(k, format!("`{k}`: {why}")).code("unsupported_parameter"))
    };
    field::check_fields(map, schema(), refused, |k| {
        ApiError::invalid(k, format!("`{k}` is not a field of /v1/responses"))
            .code("unknown_parameter")
    })
}

/// The body as an OpenAPI 3.0 schema, generated from its type.
pub fn schema() -> &'static Value {
    field::schema_for::<ResponsesRequest>()
}

/// docs/responses.md's tables, generated from the type (kept in step by a test).
pub fn field_tables() -> String {
    let refused: Vec<String> = REFUSED.iter().map(|(k, _)| format!("`{k}`")).collect();
    let refused = format!(
        "{}, `background: true`, `truncation: auto`, and fields Perch does not know",
        refused.join(", ")
    );
    field_tables::tables(&[("responses", schema())], &refused)
}

// The schemas of the fields their own parsers read (`request.rs`, `openai/tools.rs`).
field::described! {
    Input => {"oneOf": [{"type": "string"}, {"type": "array", "items": {"oneOf": [
        {"type": "object", "required": ["role", "content"], "properties": {
            "type": {"type": "string", "enum": ["message"]},
            "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {
                "type": "object", "required": ["type", "text"], "properties": {
                    "type": {"type": "string", "enum": ["input_text", "output_text"]},
                    "text": {"type": "string"}}}}]}
        }},
        {"type": "object", "required": ["type", "call_id", "name", "arguments"], "properties": {
            "type": {"type": "string", "enum": ["function_call"]},
            "call_id": {"type": "string"}, "name": {"type": "string"},
            "arguments": {"type": "string"}}},
        {"type": "object", "required": ["type", "call_id", "output"], "properties": {
            "type": {"type": "string", "enum": ["function_call_output"]},
            "call_id": {"type": "string"}, "output": {"type": "string"}}}
    ]}}]};
    StreamOptions => {"type": "object", "properties": {"include_obfuscation": {"type": "boolean"}}};
    Tools => {"type": "array", "maxItems": crate::server::openai::tools::MAX_TOOLS, "items": {
        "type": "object", "required": ["type", "name"], "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "name": {"type": "string", "pattern": "^[a-zA-Z0-9_.:-]{1,64}$"},
            "description": {"type": "string"}, "parameters": {"type": "object"},
            "strict": {"type": "boolean"}}}};
    ToolChoice => {"oneOf": [
        {"type": "string", "enum": ["auto", "none", "required"]},
        {"type": "object", "required": ["type", "name"], "properties": {
            "type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"}}}
    ]};
    TextOptions => {"type": "object", "properties": {
        "format": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}}},
        "verbosity": {"type": "string", "enum": ["low", "medium", "high"]}}};
    Reasoning => {"type": "object", "properties": {
        "effort": {"type": "string", "enum": ["none", "minimal", "low", "medium", "high", "xhigh"]},
        "summary": {"type": "string"}}};
    Include => {"type": "array", "items": {"type": "string",
        "enum": ["message.output_text.logprobs", "reasoning.encrypted_content"]}};
    Truncation => {"type": "string", "enum": ["disabled"]};
}

#[cfg(test)]
mod tests {
    /// docs/responses.md holds the tables the type generates; `UPDATE_DOCS=1` rewrites them.
    #[test]
    fn the_field_tables_in_the_docs_are_the_types() {
        crate::server::field_tables::check_doc("responses.md", "responses", &super::field_tables());
    }
}
