//! The bodies of Ollama's `/api/chat` and `/api/generate`, and their `options`, as Rust
//! types: the one place their fields are declared. The field checks, `/openapi.json`'s
//! `OllamaChatRequest` and `OllamaGenerateRequest`, and docs/ollama.md's tables are read from
//! them.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Endpoint;
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Ignored, Int, Json, Num, Text};
use crate::server::field_tables;

const U32: i64 = u32::MAX as i64;

/// Declares a body type: its own fields, then those both endpoints share. A macro because
/// serde's `flatten` loses the field path that every refusal names.
macro_rules! ollama_body {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        #[derive(Debug, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        $(#[$m])*
        pub struct $name {
            /// An installed model's id; Ollama's `:latest` tag is accepted.
            #[schemars(with = "Text")]
            pub model: Option<Text>,
            $($(#[$fm])* pub $f: $t,)*
            /// `"json"` (one JSON object) or a JSON schema (constrained decoding).
            pub format: Option<Json<Format>>,
            /// Sampling and length (below).
            pub options: Option<Options>,
            /// On unless `false`, as in Ollama: newline-delimited JSON.
            pub stream: Option<Flag>,
            /// Seconds or a duration (`"5m"`); 0 unloads the model after the request, negative
            /// keeps it; without it the engine's setting.
            pub keep_alive: Option<Json<field::KeepAlive>>,
            /// `true` or `false` (the template's `enable_thinking`) or `low`/`medium`/`high`
            /// (its `reasoning_effort`).
            pub think: Option<Json<Think>>,
        }
    };
}

ollama_body! {
    /// `POST /api/chat`.
    #[schemars(extend("required" = ["model"]))]
    pub struct ChatRequest {
        /// With assistant `tool_calls` and `tool` results; none: load (or unload) the model.
        pub messages: Option<Json<Messages>>,
        /// Rendered by the model's own chat template; calls come back whole.
        pub tools: Option<Json<Tools>>,
    }
}

ollama_body! {
    /// `POST /api/generate`.
    #[schemars(extend("required" = ["model"]))]
    pub struct GenerateRequest {
        /// Under the chat template as a user message, or as is with `raw: true`; empty: load
        /// (or unload) the model.
        pub prompt: Option<Text>,
        /// The system message under the chat template (not with `raw`).
        pub system: Option<Text>,
        /// The prompt as is, without the chat template.
        pub raw: Option<Flag>,
        /// Unless empty: text-only models.
        #[schemars(extend("x-perch" = "refused"))]
        pub images: Option<Json<Ignored>>,
        /// Fill-in-the-middle.
        #[schemars(extend("x-perch" = "refused"))]
        pub suffix: Option<Json<Ignored>>,
        /// A per-request template: the model's own is used.
        #[schemars(extend("x-perch" = "refused"))]
        pub template: Option<Json<Ignored>>,
        /// Unless empty: the deprecated token context (send the conversation).
        #[schemars(extend("x-perch" = "refused"))]
        pub context: Option<Json<Ignored>>,
    }
}

/// `options`: the samplers and lengths Perch honours, and the hardware and memory hints it
/// settles itself (accepted and ignored). Any other option is refused by name.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(inline)]
pub struct Options {
    pub temperature: Option<Num<0, 2>>,
    /// 0 reads as off, like 1.
    pub top_p: Option<Num<0, 1>>,
    pub top_k: Option<Int<0, U32>>,
    pub min_p: Option<Num<0, 1>>,
    pub seed: Option<Int>,
    /// -1 and -2: up to the context; else at least 1.
    pub num_predict: Option<Int<-2>>,
    /// Up to 16 strings.
    pub stop: Option<Json<Stop>>,
    /// 0 reads as off, like 1.
    pub repeat_penalty: Option<Num<0, 10>>,
    pub presence_penalty: Option<Num<-2, 2>>,
    pub frequency_penalty: Option<Num<-2, 2>>,
    /// The model's own context is the limit.
    #[schemars(extend("x-perch" = "ignored"))]
    pub num_ctx: Option<Json<Ignored>>,
    /// A hardware hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub num_batch: Option<Json<Ignored>>,
    /// A hardware hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub num_gpu: Option<Json<Ignored>>,
    /// A hardware hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub main_gpu: Option<Json<Ignored>>,
    /// A hardware hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub num_thread: Option<Json<Ignored>>,
    /// A memory hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub use_mmap: Option<Json<Ignored>>,
    /// A memory hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub use_mlock: Option<Json<Ignored>>,
    /// A hardware hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub numa: Option<Json<Ignored>>,
    /// A memory hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub low_vram: Option<Json<Ignored>>,
    /// A loading hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub vocab_only: Option<Json<Ignored>>,
    /// A memory hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub f16_kv: Option<Json<Ignored>>,
    /// A context hint Perch settles itself.
    #[schemars(extend("x-perch" = "ignored"))]
    pub num_keep: Option<Json<Ignored>>,
    /// The window of `repeat_penalty`: Perch's penalty reads the whole answer.
    #[schemars(extend("x-perch" = "ignored"))]
    pub repeat_last_n: Option<Json<Ignored>>,
}

/// Every field of `map` is one the endpoint's type declares, or a 400 naming it; fields sent
/// as `null` then leave the map (they count as absent).
pub fn check(endpoint: Endpoint, map: &mut Map<String, Value>) -> Result<(), ApiError> {
    field::check_fields(
        map,
        schema(endpoint),
        |_, _| None,
        |k| {
            ApiError::invalid(k, format!("`{k}` is not a field Perch reads here"))
                .code("unknown_parameter")
        },
    )
}

/// Every option in `options` is one `Options` declares, or a 400 naming it
/// (`options.mirostat`); options sent as `null` then leave it.
pub fn check_options(options: &mut Map<String, Value>) -> Result<(), ApiError> {
    field::check_fields(
        options,
        options_schema(),
        |_, _| None,
        |k| {
            ApiError::invalid(
            &format!("options.{k}"),
            format!("`options.{k}` is not supported (see docs/ollama.md for the options Perch reads)"),
        )
        .code("unsupported_parameter")
        },
    )
}

/// The options accepted and ignored on purpose (hardware and memory hints); `/api/embed`
/// accepts these too.
pub fn hints() -> impl Iterator<Item = &'static str> {
    let p = options_schema()["properties"].as_object().into_iter().flatten();
    p.filter(|(_, s)| s["x-perch"] == "ignored").map(|(k, _)| k.as_str())
}

/// The endpoint's body as an OpenAPI 3.0 schema, generated from its type.
pub fn schema(endpoint: Endpoint) -> &'static Value {
    match endpoint {
        Endpoint::Chat => field::schema_for::<ChatRequest>(),
        Endpoint::Generate => field::schema_for::<GenerateRequest>(),
    }
}

fn options_schema() -> &'static Value {
    field::schema_for::<Options>()
}

/// `/openapi.json`'s names for the bodies, with their schemas.
pub fn schemas() -> [(&'static str, &'static Value); 2] {
    [
        ("OllamaChatRequest", schema(Endpoint::Chat)),
        ("OllamaGenerateRequest", schema(Endpoint::Generate)),
    ]
}

/// docs/ollama.md's tables, generated from the types (kept in step by a test).
pub fn field_tables() -> String {
    let refused = "Fields Perch does not know, and any option not in the tables below";
    let body = field_tables::tables(
        &[("chat", schema(Endpoint::Chat)), ("generate", schema(Endpoint::Generate))],
        refused,
    );
    let options = field_tables::tables(&[("options", options_schema())], "Any other option");
    format!("{body}\n#### `options`\n\n{}", options.replace("### ", "#### "))
}

// The schemas of the fields their own parsers read (`request.rs`, `openai/tools.rs`).
field::described! {
    Format => {"oneOf": [{"type": "string", "enum": ["json", ""]}, {"type": "object"}]};
    Think => {"oneOf": [{"type": "boolean"}, {"type": "string", "enum": ["low", "medium", "high"]}]};
    Messages => {"type": "array", "items": {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"type": "string"},
        "thinking": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_name": {"type": "string"}
    }}};
    Tools => {"type": "array", "maxItems": crate::server::openai::tools::MAX_TOOLS,
        "items": {"type": "object"}};
    Stop => {"oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": 16}
    ]};
}

#[cfg(test)]
mod tests {
    /// docs/ollama.md holds the tables the types generate; `UPDATE_DOCS=1` rewrites them.
    #[test]
    fn the_field_tables_in_the_docs_are_the_types() {
        crate::server::field_tables::check_doc(
            "ollama.md",
            "chat-and-generate",
            &super::field_tables(),
        );
    }
}
