//! Request bodies of Anthropic's `/v1/messages` and `/v1/messages/count_tokens`: read into
//! their types (`request/types.rs`), then into a `Turn`; every refusal names its field, and a
//! field Perch cannot honour is refused, never ignored (docs/anthropic.md).

use serde_json::{json, Map, Value};

use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{KeepAlive, ModelRef, Prompt, Turn};
use crate::server::body::{self, kind};
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Int, Num, Text, Words};
use types::{CountTokensRequest, MessagesRequest};

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
    let mut map = body::object(bytes)?;
    types::check(endpoint, &mut map)?;
    let (prompt, generation) = match endpoint {
        Endpoint::Messages => {
            let b: MessagesRequest = field::typed_fields(map, Words::Anthropic)?;
            let generation = Generation {
                max_tokens: b.max_tokens,
                stop_sequences: b.stop_sequences.map(|j| j.0),
                stream: b.stream,
                temperature: b.temperature,
                top_p: b.top_p,
                top_k: b.top_k,
                keep_alive: b.keep_alive.map(|j| j.0),
            };
            (prompt_fields!(b), Some(generation))
        }
        Endpoint::CountTokens => {
            let b: CountTokensRequest = field::typed_fields(map, Words::Anthropic)?;
            (prompt_fields!(b), None)
        }
    };
    turn(prompt, generation, defaults)
}

/// The fields both endpoints share: the conversation and what shapes its prompt.
struct PromptFields {
    model: Option<Text>,
    messages: Option<Value>,
    system: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    output_format: Option<Value>,
    output_config: Option<Value>,
    context_management: Option<Value>,
}

macro_rules! prompt_fields {
    ($b:ident) => {
        PromptFields {
            model: $b.model,
            messages: $b.messages.map(|j| j.0),
            system: $b.system.map(|j| j.0),
            tools: $b.tools.map(|j| j.0),
            tool_choice: $b.tool_choice.map(|j| j.0),
            thinking: $b.thinking.map(|j| j.0),
            output_format: $b.output_format.map(|j| j.0),
            output_config: $b.output_config.map(|j| j.0),
            context_management: $b.context_management.map(|j| j.0),
        }
    };
}
use prompt_fields;

/// The fields only `/v1/messages` has: how to generate.
struct Generation {
    max_tokens: Option<Int<1, { u32::MAX as i64 }>>,
    stop_sequences: Option<Value>,
    stream: Option<Flag>,
    temperature: Option<Num<0, 1>>,
    top_p: Option<Num<0, 1, true>>,
    top_k: Option<Int<0, { u32::MAX as i64 }>>,
    keep_alive: Option<Value>,
}

fn turn(
    b: PromptFields,
    generation: Option<Generation>,
    defaults: &SamplingDefaults,
) -> Result<ParsedMessages, ApiError> {
    let model = match &b.model {
        Some(Text(s)) if !s.is_empty() => {
            s.parse::<ModelRef>().map_err(|e| bad("model", e.to_string()))?
        }
        _ => return Err(missing("model")),
    };
    let mut messages = system(b.system.as_ref())?;
    messages.extend(conversation(b.messages.as_ref())?);
    let g = match generation {
        Some(g) if g.max_tokens.is_none() => return Err(missing("max_tokens")),
        g => g,
    };
    let max_tokens = g.as_ref().and_then(|g| g.max_tokens).map(|n| n.0 as usize);
    let sampling = match &g {
        None => SamplingParams::default(),
        Some(g) => SamplingParams {
            // Anthropic's range is 0 to 1 (and its default 1).
            temperature: Num::get(g.temperature, defaults.temperature),
            top_p: Num::get(g.top_p, defaults.top_p),
            top_k: g.top_k.map_or(0, |k| k.0 as u32),
            ..SamplingParams::default()
        },
    };
    let stop_sequences = match g.as_ref().and_then(|g| g.stop_sequences.as_ref()) {
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
    let stream = g.as_ref().is_some_and(|g| Flag::get(g.stream));
    context_management(b.context_management.as_ref())?;
    let tools = tools(b.tools.as_ref())?;
    let (tool_choice, parallel) = tool_choice(b.tool_choice.as_ref(), &tools)?;
    let mut template_kwargs = Map::new();
    let think = thinking(b.thinking.as_ref(), max_tokens)?;
    if let Some((on, _)) = think {
        template_kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let (response_format, effort) =
        output_config(b.output_format.as_ref(), b.output_config.as_ref())?;
    if let Some(e) = effort {
        template_kwargs.insert("reasoning_effort".into(), Value::from(e));
    }
    let keep_alive = g
        .and_then(|g| g.keep_alive)
        .map(|v| KeepAlive::from_request(&v).map_err(|e| bad("keep_alive", e)))
        .transpose()?;
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
pub mod types;
use options::{context_management, output_config, thinking, tool_choice, tools};

#[cfg(test)]
mod tests;
