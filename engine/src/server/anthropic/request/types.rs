//! The bodies of Anthropic's `/v1/messages` and `/v1/messages/count_tokens` as Rust types:
//! the one place their fields are declared. The field check and `/openapi.json`'s
//! `MessagesRequest` and `CountTokensRequest` are read from them.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Endpoint, MAX_STOPS, MAX_TOOLS};
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Ignored, Int, Json, Num, Text};
use crate::server::field_tables;

const U32: i64 = u32::MAX as i64;

/// Declares a body type: its own fields, then those both endpoints share (the conversation
/// and what shapes its prompt). A macro because serde's `flatten` loses the field path that
/// every refusal names.
macro_rules! messages_body {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        #[derive(Debug, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        $(#[$m])*
        pub struct $name {
            /// An installed model's id, or `id+adapter`; `claude-*` names map to installed models.
            #[schemars(with = "Text")]
            pub model: Option<Text>,
            /// User and assistant turns, each `content` a string or blocks: `text`; assistant
            /// `tool_use`; user `tool_result` (a string or
            /// text blocks; `is_error` prefixes `Error: `); assistant `thinking` and
            /// `redacted_thinking` are accepted and not shown to the model again, as chat
            /// templates drop earlier reasoning.
            #[schemars(with = "Json<Conversation>")]
            pub messages: Option<Json<Conversation>>,
            /// A string or text blocks (joined with a newline), the conversation's first
            /// message; Claude Code's billing line is dropped (below).
            pub system: Option<Json<System>>,
            /// Client tools (`name`, `description`, `input_schema`), rendered like OpenAI
            /// functions; server tools are refused by their `type`.
            pub tools: Option<Json<Tools>>,
            /// `auto`, `any` (a call is forced), `tool` with `name`, `none`;
            /// `disable_parallel_tool_use`.
            pub tool_choice: Option<Json<ToolChoice>>,
            /// `enabled` (budget ≥ 1024 and below `max_tokens`), `adaptive`, `between_tools` or
            /// `disabled`: the template's `enable_thinking`. `max_tokens` bounds reasoning and
            /// answer together, so the budget is checked, not enforced apart.
            /// `display: "omitted"` returns thinking blocks without their text.
            pub thinking: Option<Json<Thinking>>,
            /// `json_schema`: the answer is constrained to the schema (as `output_config.format`).
            pub output_format: Option<Json<OutputFormat>>,
            /// `format` as `output_format`; `effort` is the template's `reasoning_effort`
            /// (`xhigh` and `max` read as `high`).
            pub output_config: Option<Json<OutputConfig>>,
            /// Anywhere in the body: the prefix cache reuses shared prefixes by their tokens, and
            /// `usage.cache_read_input_tokens` says how many it supplied.
            #[schemars(extend("x-perch" = "ignored"))]
            pub cache_control: Option<Json<Ignored>>,
            /// `clear_thinking_…` edits (Claude Code sends one on every request): earlier
            /// thinking never reaches the model here, so there is nothing to clear; other edits
            /// are refused, naming the edit.
            pub context_management: Option<Json<ContextManagement>>,
            $($(#[$fm])* pub $f: $t,)*
        }
    };
}

messages_body! {
    /// `POST /v1/messages`.
    #[schemars(extend("required" = ["model", "messages", "max_tokens"]))]
    pub struct MessagesRequest {
        /// Required here, not on `count_tokens`.
        #[schemars(with = "Int<1, U32>")]
        pub max_tokens: Option<Int<1, U32>>,
        /// The answer's `stop_sequence` says which one ended it.
        pub stop_sequences: Option<Json<StopSequences>>,
        /// The event stream below.
        pub stream: Option<Flag>,
        /// Anthropic's range. Its newest SDKs no longer send it, `top_p` or `top_k`; then the
        /// user's sampling defaults apply.
        pub temperature: Option<Num<0, 1>>,
        pub top_p: Option<Num<0, 1, true>>,
        pub top_k: Option<Int<0, U32>>,
        /// Ollama's, as on the OpenAI routes (api-fields.md): `0` unloads the model when done.
        pub keep_alive: Option<Json<field::KeepAlive>>,
        /// A label.
        #[schemars(extend("x-perch" = "ignored"))]
        pub metadata: Option<field::Object>,
        /// A hosted service's routing.
        #[schemars(extend("x-perch" = "ignored"))]
        pub service_tier: Option<Text>,
        /// A hosted service's speed tier.
        #[schemars(extend("x-perch" = "ignored"))]
        pub speed: Option<Json<Ignored>>,
        /// A hosted account's label.
        #[schemars(extend("x-perch" = "ignored"))]
        pub user_profile_id: Option<Json<Ignored>>,
        /// A hosted account's label.
        #[schemars(extend("x-perch" = "ignored"))]
        pub workspace_id: Option<Json<Ignored>>,
        /// No cache-miss report comes back.
        #[schemars(extend("x-perch" = "ignored"))]
        pub diagnostics: Option<Json<Ignored>>,
    }
}

messages_body! {
    /// `POST /v1/messages/count_tokens`: the prompt's fields only.
    #[schemars(extend("required" = ["model", "messages"]))]
    pub struct CountTokensRequest {}
}

/// Fields Perch knows and cannot honour: a 400 naming each, even when `null`.
pub const REFUSED: &[(&str, &str)] = &[
    ("container", "code execution containers are not supported"),
    ("mcp_servers", "remote MCP servers are not supported: run the tools on the client"),
    ("inference_geo", "inference regions do not apply to a local server"),
];

/// Every field of `map` is one the endpoint's type declares, or a 400 naming it (a refused
/// one even as `null`); fields sent as `null` then leave the map (they count as absent).
pub fn check(endpoint: Endpoint, map: &mut Map<String, Value>) -> Result<(), ApiError> {
    let refused = |key: &str, _: &Value| {
        let (_, why) = REFUSED.iter().find(|(k, _)| *k == key)?;
        Some(ApiError::invalid(key, format!("{key}: {why}")).code("unsupported_parameter"))
    };
    field::check_fields(map, schema(endpoint), refused, |key| {
        ApiError::invalid(key, format!("{key}: Extra inputs are not permitted"))
            .code("unknown_parameter")
    })
}

/// The endpoint's body as an OpenAPI 3.0 schema, generated from its type.
pub fn schema(endpoint: Endpoint) -> &'static Value {
    match endpoint {
        Endpoint::Messages => field::schema_for::<MessagesRequest>(),
        Endpoint::CountTokens => field::schema_for::<CountTokensRequest>(),
    }
}

/// `/openapi.json`'s names for the bodies, with their schemas.
pub fn schemas() -> [(&'static str, &'static Value); 2] {
    [
        ("MessagesRequest", schema(Endpoint::Messages)),
        ("CountTokensRequest", schema(Endpoint::CountTokens)),
    ]
}

/// docs/anthropic.md's tables, generated from the types (kept in step by a test).
pub fn field_tables() -> String {
    let refused: Vec<String> = REFUSED.iter().map(|(k, _)| format!("`{k}`")).collect();
    field_tables::tables(
        &[
            ("messages", schema(Endpoint::Messages)),
            ("count_tokens", schema(Endpoint::CountTokens)),
        ],
        &format!(
            "{}, Anthropic's server tools (their `type` is named), image and document blocks, \
             and any field Perch does not know",
            refused.join(", ")
        ),
    )
}

// The schemas of the fields their own parsers read (`request.rs`, `options.rs`).
field::described! {
    Conversation => {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "content": {"oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object", "required": ["type"],
                    "properties": {"type": {"type": "string",
                        "enum": ["text", "tool_use", "tool_result", "thinking", "redacted_thinking"]}}}}
            ]}
        }
    }};
    System => {"oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}}
    ]};
    Tools => {"type": "array", "maxItems": MAX_TOOLS, "items": {
        "type": "object", "required": ["name", "input_schema"], "properties": {
            "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
            "description": {"type": "string"},
            "input_schema": {"type": "object"}
        }
    }};
    ToolChoice => {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
        "name": {"type": "string"},
        "disable_parallel_tool_use": {"type": "boolean"}
    }};
    Thinking => {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive", "between_tools"]},
        "budget_tokens": {"type": "integer", "minimum": 1024},
        "display": {"type": "string", "enum": ["summarized", "omitted"]}
    }};
    OutputFormat => {"type": "object", "required": ["type", "schema"], "properties": {
        "type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object"}
    }};
    OutputConfig => {"type": "object", "properties": {
        "effort": {"type": "string", "enum": ["low", "medium", "high", "xhigh", "max"]},
        "format": {"type": "object", "required": ["type", "schema"], "properties": {
            "type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object"}
        }}
    }};
    ContextManagement => {"type": "object", "properties": {"edits": {"type": "array",
        "items": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}}}};
    StopSequences => {"type": "array", "maxItems": MAX_STOPS,
        "items": {"type": "string", "minLength": 1}};
}

#[cfg(test)]
mod tests {
    /// docs/anthropic.md holds the tables the types generate; `UPDATE_DOCS=1` rewrites them.
    #[test]
    fn the_field_tables_in_the_docs_are_the_types() {
        crate::server::field_tables::check_doc("anthropic.md", "messages", &super::field_tables());
    }
}
