//! The bodies of `/v1/chat/completions` and `/v1/completions` as Rust types: the one place
//! their fields are declared. The unknown-field check, `/openapi.json`'s `ChatRequest` and
//! `CompletionRequest`, and the field tables of docs/api-fields.md are all read from these
//! types, so a new field is one line here (plus the code that honours it).

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Endpoint;
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Ignored, Int, Json, Num, Text};
use crate::server::field_tables;

const U32: i64 = u32::MAX as i64;

/// Declares a body type: its own fields, then those both endpoints share. (A macro because
/// serde's `flatten` loses the field path that every refusal names.)
macro_rules! completions_body {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        #[derive(Debug, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        $(#[$m])*
        pub struct $name {
            /// An installed model's id, or `id+adapter` (GET /v1/models lists them).
            #[schemars(with = "Text")]
            pub model: Option<Text>,
            $($(#[$fm])* pub $f: $t,)*
            /// Capped by the server's cap and the context's room.
            pub max_tokens: Option<Int<1, U32>>,
            pub temperature: Option<Num<0, 2>>,
            pub top_p: Option<Num<0, 1, true>>,
            pub top_k: Option<Int<0, U32>>,
            pub min_p: Option<Num<0, 1>>,
            pub presence_penalty: Option<Num<-2, 2>>,
            pub frequency_penalty: Option<Num<-2, 2>>,
            pub repetition_penalty: Option<Num<0, 10, true>>,
            pub seed: Option<Int>,
            /// 1 only (one choice per request).
            #[schemars(extend("enum" = [1]))]
            pub n: Option<Int>,
            pub stop: Option<Json<Stop>>,
            pub stream: Option<Flag>,
            /// `include_usage`: a last chunk with the usage; `include_obfuscation` is accepted and
            /// adds nothing (loopback has no observer to pad against); any other key is refused.
            pub stream_options: Option<Json<StreamOptions>>,
            /// Token id → bias from -100 to 100, added to the logits.
            pub logit_bias: Option<Json<LogitBias>>,
            /// Ollama's: seconds or a duration (`"5m"`); `0` unloads the model when the request
            /// is done, negative keeps it loaded; without it the engine's own (`keep_alive_s`).
            pub keep_alive: Option<Json<field::KeepAlive>>,
            /// A label for a hosted service's accounting (ignored).
            #[schemars(extend("x-perch" = "ignored"))]
            pub user: Option<Json<Ignored>>,
            /// Labels for a hosted service (ignored).
            #[schemars(extend("x-perch" = "ignored"))]
            pub metadata: Option<Json<Ignored>>,
            /// A hosted service's storage (ignored).
            #[schemars(extend("x-perch" = "ignored"))]
            pub store: Option<Json<Ignored>>,
            /// A hosted service's routing (ignored).
            #[schemars(extend("x-perch" = "ignored"))]
            pub service_tier: Option<Json<Ignored>>,
            /// A hosted cache's key (ignored: the prefix cache finds shared prefixes by their
            /// tokens; `usage.prompt_tokens_details.cached_tokens` says what it supplied).
            #[schemars(extend("x-perch" = "ignored"))]
            pub prompt_cache_key: Option<Json<Ignored>>,
            /// How long a hosted cache keeps the prompt (ignored: the prefix cache has its own).
            #[schemars(extend("x-perch" = "ignored"))]
            pub prompt_cache_retention: Option<Json<Ignored>>,
            /// A hosted service's abuse tracking (ignored).
            #[schemars(extend("x-perch" = "ignored"))]
            pub safety_identifier: Option<Json<Ignored>>,
        }
    };
}

completions_body! {
    /// `POST /v1/chat/completions`.
    #[schemars(extend("required" = ["model", "messages"]))]
    pub struct ChatRequest {
        /// The conversation; content as a string or text parts; `developer` counts as `system`.
        #[schemars(with = "Json<Messages>")]
        pub messages: Option<Json<Messages>>,
        /// The newer name of `max_tokens`.
        pub max_completion_tokens: Option<Int<1, U32>>,
        pub logprobs: Option<Flag>,
        /// Needs `logprobs: true`.
        pub top_logprobs: Option<Int<0, 20>>,
        /// `text`, `json_object` (one JSON object) or `json_schema` (always enforced).
        pub response_format: Option<Json<ResponseFormat>>,
        /// Rendered by the model's own chat template; calls come back as `tool_calls`.
        pub tools: Option<Json<Tools>>,
        /// `auto`, `none`, `required` or a named function (forced by a grammar).
        pub tool_choice: Option<Json<ToolChoice>>,
        /// `false`: one call at most.
        pub parallel_tool_calls: Option<Flag>,
        /// The legacy form of `tools`: answered with `function_call`.
        pub functions: Option<Json<Tools>>,
        /// The legacy form of `tool_choice`.
        pub function_call: Option<Json<ToolChoice>>,
        /// Passed to the chat template as `reasoning_effort`.
        pub reasoning_effort: Option<Json<ReasoningEffort>>,
        /// Passed to the chat template (`enable_thinking`, …).
        pub chat_template_kwargs: Option<Json<TemplateKwargs>>,
        /// `["text"]` only.
        pub modalities: Option<Json<Modalities>>,
    }
}

completions_body! {
    /// `POST /v1/completions`.
    #[schemars(extend("required" = ["model", "prompt"]))]
    pub struct CompletionRequest {
        /// A string, a list of one string, or a list of token ids.
        #[schemars(with = "Json<PromptInput>")]
        pub prompt: Option<Json<PromptInput>>,
        /// The number of alternatives per token (0 to 5).
        pub logprobs: Option<Int<0, 5>>,
        /// `false` only.
        #[schemars(extend("enum" = [false]))]
        pub echo: Option<Flag>,
    }
}

/// Fields Perch knows and cannot honour, per endpoint (`None`: both): a 400 naming each.
pub const REFUSED: &[(&str, Option<Endpoint>, &str)] = &[
    ("prediction", None, "`prediction`: predicted outputs are not supported"),
    ("audio", None, "`audio`: audio output is not supported"),
    ("web_search_options", None, "`web_search_options`: web search is not supported"),
    ("suffix", Some(Endpoint::Completion), "`suffix` is not supported"),
    ("best_of", Some(Endpoint::Completion), "`best_of` is not supported"),
];

/// Every field of `map` is one the endpoint's type declares, or a 400 naming it: refused
/// fields with their reason, others as unknown. `null` counts as absent (a refused field
/// too: it asks for nothing), and such fields leave the map.
pub fn check(endpoint: Endpoint, map: &mut Map<String, Value>) -> Result<(), ApiError> {
    let refused = |key: &str, v: &Value| {
        let (_, _, why) = REFUSED
            .iter()
            .find(|(k, e, _)| *k == key && !v.is_null() && e.is_none_or(|e| e == endpoint))?;
        Some(ApiError::invalid(key, *why).code("unsupported_parameter"))
    };
    field::check_fields(map, schema(endpoint), refused, |key| {
        ApiError::invalid(key, format!("Unrecognized request argument supplied: {key}"))
            .code("unknown_parameter")
    })
}

/// The endpoint's body as an OpenAPI 3.0 schema, generated from its type.
pub fn schema(endpoint: Endpoint) -> &'static Value {
    match endpoint {
        Endpoint::Chat => field::schema_for::<ChatRequest>(),
        Endpoint::Completion => field::schema_for::<CompletionRequest>(),
    }
}

/// `/openapi.json`'s names for the bodies, with their schemas.
pub fn schemas() -> [(&'static str, &'static Value); 2] {
    [("ChatRequest", schema(Endpoint::Chat)), ("CompletionRequest", schema(Endpoint::Completion))]
}

/// docs/api-fields.md's tables, generated from the types (kept in step by a test).
pub fn field_tables() -> String {
    let refused: Vec<String> = REFUSED
        .iter()
        .map(|(k, e, _)| match e {
            None => format!("`{k}`"),
            Some(_) => format!("`{k}` (completions)"),
        })
        .collect();
    field_tables::tables(
        &[("chat", schema(Endpoint::Chat)), ("completions", schema(Endpoint::Completion))],
        &format!("{}, and `modalities` other than text, `echo: true`", refused.join(", ")),
    )
}

// The schemas of the fields their own parsers read (`request.rs`, `tools.rs`).
field::described! {
    Stop => {"oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": super::MAX_STOPS}
    ]};
    StreamOptions => {"type": "object", "additionalProperties": false, "properties": {
        "include_usage": {"type": "boolean"}, "include_obfuscation": {"type": "boolean"}}};
    LogitBias => {"type": "object", "maxProperties": 1024,
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}};
    Messages => {"type": "array", "minItems": 1, "items": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string",
                "enum": ["system", "developer", "user", "assistant", "tool", "function"]},
            "content": {"nullable": true, "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                    "properties": {"type": {"type": "string", "enum": ["text"]},
                        "text": {"type": "string"}}}}
            ]},
            "name": {"type": "string"},
            "tool_calls": {"type": "array", "items": {"type": "object"}},
            "tool_call_id": {"type": "string"}
        }
    }};
    ResponseFormat => {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "json_schema": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
            "description": {"type": "string"},
            "schema": {"type": "object"},
            "strict": {"type": "boolean", "nullable": true}
        }}
    }};
    Tools => {"type": "array", "maxItems": super::super::tools::MAX_TOOLS,
        "items": {"type": "object"}};
    ToolChoice => {"oneOf": [{"type": "string"}, {"type": "object"}]};
    ReasoningEffort => {"type": "string", "enum": ["minimal", "low", "medium", "high"]};
    TemplateKwargs => {"type": "object"};
    Modalities => {"type": "array", "items": {"type": "string", "enum": ["text"]}};
    PromptInput => {"oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    ]};
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// docs/api-fields.md holds the tables the types generate; `UPDATE_DOCS=1` rewrites them.
    #[test]
    fn the_field_tables_in_the_docs_are_the_types() {
        field_tables::check_doc("api-fields.md", "chat-and-completions", &field_tables());
    }

    #[test]
    fn the_schema_carries_each_bound_of_the_types() {
        let s = schema(Endpoint::Chat);
        let p = &s["properties"];
        assert_eq!(p["temperature"]["maximum"], 2, "{s}");
        assert_eq!(p["top_p"]["exclusiveMinimum"], true);
        assert_eq!(p["top_logprobs"]["maximum"], 20);
        assert_eq!(p["n"]["enum"], json!([1]));
        assert_eq!(p["temperature"]["nullable"], true);
        assert_eq!(s["required"], json!(["model", "messages"]));
        let completion = &schema(Endpoint::Completion)["properties"];
        assert!(completion.get("prompt").is_some() && completion.get("messages").is_none());
    }
}
