//! Request bodies of Anthropic's `/v1/messages` and `/v1/messages/count_tokens`, checked
//! field by field: every refusal names its field, and a field Perch cannot honour is refused,
//! never ignored (docs/api-fields.md).

use serde_json::{json, Map, Value};

use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{ModelRef, Prompt, Turn};
use crate::server::body::{self, kind, Body};
use crate::server::error::ApiError;

/// Which of the two endpoints a body is for (`count_tokens` needs no `max_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    CountTokens,
}

pub struct ParsedMessages {
    pub turn: Turn,
    pub stream: bool,
    /// The client's own stop sequences: only these are reported as `stop_sequence`.
    pub stop_sequences: Vec<String>,
    /// `thinking.display: "omitted"`: thinking blocks come back empty.
    pub omit_thinking: bool,
}

pub const MAX_STOPS: usize = 16;
pub const MAX_TOOLS: usize = 128;

/// Fields read, per endpoint. Accepted and ignored on purpose (docs/api-fields.md):
/// `cache_control` (the prefix cache is automatic), `diagnostics` (no cache-miss report comes
/// back), and labels that change nothing a local server computes: `metadata`,
/// `service_tier`, `speed`, `user_profile_id`, `workspace_id`.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "output_format",
    "output_config",
    "cache_control",
    "context_management",
];
const MESSAGES_ONLY: &[&str] = &[
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "service_tier",
    "speed",
    "user_profile_id",
    "workspace_id",
    "diagnostics",
    "keep_alive",
];
const REFUSED: &[(&str, &str)] = &[
    ("container", "code execution containers are not supported"),
    ("mcp_servers", "remote MCP servers are not supported: run the tools on the client"),
    ("inference_geo", "inference regions do not apply to a local server"),
];

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

fn missing(field: &str) -> ApiError {
    bad(field, format!("{field}: Field required")).code("missing_required_parameter")
}

fn wrong_type(field: &str, want: &str, v: &Value) -> ApiError {
    bad(field, format!("{field}: must be {want}; got {}", kind(v))).code("invalid_type")
}

pub fn parse(
    endpoint: Endpoint,
    bytes: &[u8],
    defaults: &SamplingDefaults,
) -> Result<ParsedMessages, ApiError> {
    let b = &body::object(bytes)?;
    for (key, v) in b {
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| k == key) {
            return Err(bad(key, format!("{key}: {why}")).code("unsupported_parameter"));
        }
        let known = FIELDS.contains(&key.as_str())
            || (endpoint == Endpoint::Messages && MESSAGES_ONLY.contains(&key.as_str()));
        if !known && !v.is_null() {
            return Err(bad(key, format!("{key}: Extra inputs are not permitted"))
                .code("unknown_parameter"));
        }
    }
    let get = |k: &str| b.get(k).filter(|v| !v.is_null());
    let model = Body(b)
        .model("see GET /v1/models")?
        .parse::<ModelRef>()
        .map_err(|e| bad("model", e.to_string()))?;
    let mut messages = system(get("system"))?;
    messages.extend(conversation(get("messages"))?);
    let max_tokens = match (endpoint, get("max_tokens")) {
        (Endpoint::CountTokens, _) => None,
        (_, None) => return Err(missing("max_tokens")),
        (_, Some(v)) => match v.as_u64() {
            Some(n) if (1..=u64::from(u32::MAX)).contains(&n) => Some(n as usize),
            _ => {
                return Err(bad(
                    "max_tokens",
                    format!("max_tokens: must be an integer of at least 1; got {v}"),
                ))
            }
        },
    };
    let number = |k: &str, lo: f64, hi: f64, open_lo: bool| -> Result<Option<f32>, ApiError> {
        match get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if (if open_lo { x > lo } else { x >= lo }) && x <= hi => {
                    Ok(Some(x as f32))
                }
                Some(x) => Err(bad(
                    k,
                    format!(
                        "{k}: must be {}{lo}, {hi}]; got {x}",
                        if open_lo { "in (" } else { "in [" }
                    ),
                )),
                None => Err(wrong_type(k, "a number", v)),
            },
        }
    };
    let sampling = SamplingParams {
        // Anthropic's range is 0 to 1 (and its default 1).
        temperature: number("temperature", 0.0, 1.0, false)?.unwrap_or(defaults.temperature),
        top_p: number("top_p", 0.0, 1.0, true)?.unwrap_or(defaults.top_p),
        top_k: match get("top_k") {
            None => 0,
            Some(v) => match v.as_u64() {
                Some(k) if k <= u64::from(u32::MAX) => k as u32,
                _ => {
                    return Err(bad(
                        "top_k",
                        format!("top_k: must be a non-negative integer; got {v}"),
                    ))
                }
            },
        },
        ..SamplingParams::default()
    };
    let stop_sequences = match get("stop_sequences") {
        None => vec![],
        Some(Value::Array(list)) if list.len() <= MAX_STOPS => list
            .iter()
            .map(|s| match s {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                _ => Err(bad("stop_sequences", "stop_sequences: each must be a non-empty string")),
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => {
            return Err(bad(
                "stop_sequences",
                format!("stop_sequences: at most {MAX_STOPS} sequences"),
            ))
        }
        Some(v) => return Err(wrong_type("stop_sequences", "a list of strings", v)),
    };
    let stream = match get("stream") {
        None => false,
        Some(Value::Bool(s)) => *s,
        Some(v) => return Err(wrong_type("stream", "a boolean", v)),
    };
    if let Some(v) = get("metadata") {
        if !v.is_object() {
            return Err(wrong_type("metadata", "an object", v));
        }
    }
    if let Some(v) = get("service_tier") {
        if !v.is_string() {
            return Err(wrong_type("service_tier", "a string", v));
        }
    }
    context_management(get("context_management"))?;
    let tools = tools(get("tools"))?;
    let (tool_choice, parallel) = tool_choice(get("tool_choice"), &tools)?;
    let mut template_kwargs = Map::new();
    let think = thinking(get("thinking"), max_tokens)?;
    if let Some((on, _)) = think {
        template_kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let (response_format, effort) = output_config(get("output_format"), get("output_config"))?;
    if let Some(e) = effort {
        template_kwargs.insert("reasoning_effort".into(), Value::from(e));
    }
    let keep_alive = Body(b).keep_alive()?;
    Ok(ParsedMessages {
        turn: Turn {
            max_tokens,
            keep_alive,
            sampling,
            stop: stop_sequences.clone(),
            response_format,
            tools,
            tool_choice,
            parallel_tool_calls: parallel,
            template_kwargs,
            ..Turn::new(model, Prompt::Messages(messages))
        },
        stream,
        stop_sequences,
        omit_thinking: think.is_some_and(|(_, omit)| omit),
    })
}

/// Text out of a string or a list of text blocks (`cache_control` and `citations` on a
/// block are accepted: the prefix cache is automatic, and citations are the client's).
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                let here = format!("{at}.{i}");
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push(t.as_str()),
                    (Some("image" | "document"), _) => {
                        return Err(bad(
                            &here,
                            format!("{here}: images and documents are not supported: this server runs text-only models"),
                        )
                        .code("unsupported_value"))
                    }
                    _ => return Err(bad(&here, format!("{here}: expected a text block"))),
                }
            }
            Ok(out.join("\n"))
        }
        v => Err(wrong_type(at, "a string or a list of text blocks", v)),
    }
}

/// The line Claude Code puts first in `system`: `x-anthropic-billing-header: cc_version=…;
/// cc_entrypoint=…; cch=…;`. It is addressed to Anthropic's billing, not to the model, and
/// its hashes change with the request's content: left in, every request's prompt differed
/// from about its 20th token, so the prefix cache never served Claude Code's 10k-token system
/// prompt (seen with `scripts/bench-agents`: 21 of 9,905 prompt tokens reused, 231 s to the
/// first token). vllm-mlx and Claude Code routers drop it too.
const BILLING_LINE: &str = "x-anthropic-billing-header:";

/// `system` without Claude Code's billing line (docs/anthropic.md).
fn without_billing_line(text: String) -> String {
    if !text.contains(BILLING_LINE) {
        return text;
    }
    let kept: String =
        text.split_inclusive('\n').filter(|l| !l.starts_with(BILLING_LINE)).collect();
    tracing::debug!("system: dropped Claude Code's billing line, which changes with every request");
    kept
}

/// `system`: a string or text blocks, as the conversation's first message.
fn system(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    Ok(match v {
        None => vec![],
        Some(v) => {
            let text = without_billing_line(text_of(v, "system")?);
            if text.is_empty() {
                vec![]
            } else {
                vec![ChatMessage::new("system", text)]
            }
        }
    })
}

/// `messages`: user and assistant turns, their blocks mapped onto the chat template's
/// messages (a `tool_result` becomes a `tool` message, a `tool_use` an assistant call).
fn conversation(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match v {
        None => return Err(missing("messages")),
        Some(Value::Array(l)) if !l.is_empty() => l,
        Some(Value::Array(_)) => {
            return Err(bad("messages", "messages: at least one message is required"))
        }
        Some(v) => return Err(wrong_type("messages", "a list of messages", v)),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages.{i}");
        let Value::Object(m) = m else { return Err(wrong_type(&at, "an object", m)) };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            Some(r) => {
                return Err(bad(
                    &format!("{at}.role"),
                    format!("{at}.role: must be user or assistant; got `{r}` (the system prompt goes in `system`)"),
                ))
            }
            None => return Err(missing(&format!("{at}.role"))),
        };
        let content = m.get("content").ok_or_else(|| missing(&format!("{at}.content")))?;
        let blocks = match content {
            Value::String(s) => {
                out.push(ChatMessage::new(role, s.clone()));
                continue;
            }
            Value::Array(b) => b,
            v => {
                return Err(wrong_type(&format!("{at}.content"), "a string or a list of blocks", v))
            }
        };
        let mut text = String::new();
        let mut calls = vec![];
        for (j, b) in blocks.iter().enumerate() {
            let here = format!("{at}.content.{j}");
            let Value::Object(b) = b else { return Err(wrong_type(&here, "a content block", b)) };
            match (role, b.get("type").and_then(Value::as_str)) {
                (_, Some("text")) => match b.get("text") {
                    Some(Value::String(t)) => text.push_str(t),
                    _ => return Err(missing(&format!("{here}.text"))),
                },
                (_, Some("image" | "document")) => {
                    return Err(bad(
                        &here,
                        format!("{here}: images and documents are not supported: this server runs text-only models"),
                    )
                    .code("unsupported_value"))
                }
                // Earlier reasoning is not shown to the model again (chat templates drop it
                // too); its signature means nothing here.
                ("assistant", Some("thinking" | "redacted_thinking")) => {}
                ("assistant", Some("tool_use")) => calls.push(tool_use(b, &here)?),
                ("user", Some("tool_result")) => {
                    // Text before a result goes first, so the order stays as sent.
                    if !text.is_empty() {
                        out.push(ChatMessage::new("user", std::mem::take(&mut text)));
                    }
                    out.push(tool_result(b, &here)?);
                }
                (_, Some(t)) => {
                    return Err(bad(
                        &format!("{here}.type"),
                        format!("{here}.type: `{t}` is not supported in a {role} message"),
                    )
                    .code("unsupported_value"))
                }
                (_, None) => return Err(missing(&format!("{here}.type"))),
            }
        }
        if !text.is_empty() || !calls.is_empty() || (role == "user" && blocks.is_empty()) {
            let mut msg = ChatMessage::new(role, text);
            msg.tool_calls = calls;
            out.push(msg);
        }
    }
    Ok(out)
}

fn tool_use(b: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let id = b.get("id").and_then(Value::as_str).ok_or_else(|| missing(&format!("{at}.id")))?;
    let name =
        b.get("name").and_then(Value::as_str).ok_or_else(|| missing(&format!("{at}.name")))?;
    let input = match b.get("input") {
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => json!({}),
        Some(v) => return Err(wrong_type(&format!("{at}.input"), "an object", v)),
    };
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
}

fn tool_result(b: &Map<String, Value>, at: &str) -> Result<ChatMessage, ApiError> {
    let id = b
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| missing(&format!("{at}.tool_use_id")))?;
    let mut content = match b.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(v) => text_of(v, &format!("{at}.content"))?,
    };
    match b.get("is_error") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        // The model learns the call failed the way it would read it in a transcript.
        Some(Value::Bool(true)) => content = format!("Error: {content}"),
        Some(v) => return Err(wrong_type(&format!("{at}.is_error"), "a boolean", v)),
    }
    let mut msg = ChatMessage::new("tool", content);
    msg.tool_call_id = Some(id.to_string());
    Ok(msg)
}

mod options;
use options::{context_management, output_config, thinking, tool_choice, tools};

#[cfg(test)]
mod tests;
