//! Which fields a request body may carry: those Perch reads (per endpoint), a few it ignores
//! on purpose, and those it knows and cannot honour. Anything else is a 400 naming the field,
//! never silently ignored (docs/api-fields.md).

use serde_json::{Map, Value};

use crate::server::error::ApiError;

/// The endpoint a body is for: each has fields of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Fields Perch reads, per endpoint; anything else is refused by name rather than ignored.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "n",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "logit_bias",
    "keep_alive",
    // Accepted and ignored on purpose (docs/api-fields.md): they label or route a request
    // and change nothing a local server computes.
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "reasoning_effort",
    "chat_template_kwargs",
    "modalities",
];
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix", "best_of"];
/// Fields Perch knows and cannot honour: a 400 naming each.
const REFUSED: &[(&str, &str)] = &[
    ("prediction", "predicted outputs are not supported"),
    ("audio", "audio output is not supported"),
    ("web_search_options", "web search is not supported"),
];

/// Every field of `map` is one Perch reads for `endpoint`, one it ignores on purpose, or a
/// 400 naming it.
pub(super) fn check(endpoint: Endpoint, map: &Map<String, Value>) -> Result<(), ApiError> {
    let own = if endpoint == Endpoint::Chat { CHAT_FIELDS } else { COMPLETION_FIELDS };
    for (key, v) in map {
        if v.is_null() && !REFUSED.iter().any(|(k, _)| k == key) {
            continue;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| k == key) {
            if !v.is_null() {
                return Err(
                    ApiError::invalid(key, format!("`{key}`: {why}")).code("unsupported_parameter")
                );
            }
            continue;
        }
        if key == "modalities" {
            let text_only = v.as_array().is_some_and(|m| m.iter().all(|x| x == "text"));
            if !text_only {
                return Err(ApiError::invalid(
                    "modalities",
                    "`modalities`: only [\"text\"] is supported (no audio output)",
                )
                .code("unsupported_value"));
            }
            continue;
        }
        if !COMMON_FIELDS.contains(&key.as_str()) && !own.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                key,
                format!("Unrecognized request argument supplied: {key}"),
            )
            .code("unknown_parameter"));
        }
    }
    Ok(())
}
