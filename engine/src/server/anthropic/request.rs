//! Request bodies of Anthropic's `/v1/messages` and `/v1/messages/count_tokens`, checked
//! field by field: every refusal names its field, and a field Perch cannot honour is refused,
//! never ignored (docs/api-fields.md).

use serde_json::{json, Map, Value};

use crate::chat::{ChatMessage, Tool, ToolChoice};
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{KeepAlive, ModelRef, Prompt, ResponseFormat, Turn};
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
    let keep_alive = match get("keep_alive") {
        None => None,
        Some(v) => Some(KeepAlive::from_request(v).map_err(|e| bad("keep_alive", e))?),
    };
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

/// `system`: a string or text blocks, as the conversation's first message.
fn system(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    Ok(match v {
        None => vec![],
        Some(v) => {
            let text = text_of(v, "system")?;
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

/// `context_management`: edits the server makes to a long conversation. Perch never shows
/// earlier thinking to the model again (chat templates drop it), so `clear_thinking_*` edits
/// leave nothing to do, whatever they keep; other edits (clearing old tool results) are
/// refused by name. Claude Code sends a `clear_thinking` edit on every request.
fn context_management(v: Option<&Value>) -> Result<(), ApiError> {
    const FIELD: &str = "context_management";
    let Some(v) = v else { return Ok(()) };
    let Value::Object(o) = v else { return Err(wrong_type(FIELD, "an object", v)) };
    for (k, v) in o {
        if k != "edits" {
            return Err(bad(&format!("{FIELD}.{k}"), format!("{FIELD}.{k}: not supported"))
                .code("unsupported_parameter"));
        }
        let Value::Array(edits) = v else {
            return Err(wrong_type(&format!("{FIELD}.edits"), "a list of edits", v));
        };
        for (i, e) in edits.iter().enumerate() {
            let at = format!("{FIELD}.edits.{i}.type");
            match e.get("type").and_then(Value::as_str) {
                Some(t) if t.starts_with("clear_thinking_") => {}
                Some(t) => {
                    return Err(bad(&at, format!("{at}: `{t}` is not supported (only clear_thinking edits, which change nothing here)"))
                        .code("unsupported_value"))
                }
                None => return Err(missing(&at)),
            }
        }
    }
    Ok(())
}

/// `tools`: client tools (`name`, `description`, `input_schema`), rendered by the chat
/// template in OpenAI's function shape. Anthropic's server tools (web search, code
/// execution, …) run on Anthropic's side and are refused.
fn tools(v: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    let list = match v {
        None => return Ok(vec![]),
        Some(Value::Array(l)) if l.len() <= MAX_TOOLS => l,
        Some(Value::Array(_)) => {
            return Err(bad("tools", format!("tools: at most {MAX_TOOLS} tools")))
        }
        Some(v) => return Err(wrong_type("tools", "a list of tools", v)),
    };
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools.{i}");
        let Value::Object(t) = t else { return Err(wrong_type(&at, "an object", t)) };
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(bad(
                    &format!("{at}.type"),
                    format!("{at}.type: `{other}` is one of Anthropic's server tools, which do not run here: define it as a client tool with an `input_schema`"),
                )
                .code("unsupported_value"))
            }
        }
        let name = match t.get("name") {
            Some(Value::String(n))
                if (1..=64).contains(&n.len())
                    && n.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-') =>
            {
                n.clone()
            }
            Some(n) => {
                return Err(bad(
                    &format!("{at}.name"),
                    format!("{at}.name: must be 1 to 64 letters, digits, `_` or `-`; got {n}"),
                ))
            }
            None => return Err(missing(&format!("{at}.name"))),
        };
        if tools.iter().any(|x| x.name == name) {
            return Err(bad(
                &format!("{at}.name"),
                format!("{at}.name: `{name}` is offered twice"),
            ));
        }
        let schema = match t.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            Some(v) => {
                return Err(wrong_type(&format!("{at}.input_schema"), "a JSON Schema object", v))
            }
            None => return Err(missing(&format!("{at}.input_schema"))),
        };
        // In the order OpenAI's clients send a function, which templates print as given.
        let mut function = Map::new();
        function.insert("name".into(), Value::from(name.as_str()));
        match t.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(d)) => {
                function.insert("description".into(), Value::from(d.as_str()));
            }
            Some(v) => return Err(wrong_type(&format!("{at}.description"), "a string", v)),
        }
        function.insert("parameters".into(), schema);
        tools.push(Tool { name, definition: json!({"type": "function", "function": function}) });
    }
    Ok(tools)
}

/// `tool_choice`: `auto`, `any` (some call), `tool` (that one), `none`; and whether several
/// calls may come in one answer.
fn tool_choice(v: Option<&Value>, tools: &[Tool]) -> Result<(ToolChoice, bool), ApiError> {
    let Some(v) = v else { return Ok((ToolChoice::Auto, true)) };
    let Value::Object(o) = v else { return Err(wrong_type("tool_choice", "an object", v)) };
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(d)) => !d,
        Some(v) => return Err(wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", v)),
    };
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(n) if tools.iter().any(|t| t.name == n) => ToolChoice::Named(n.into()),
            Some(n) => {
                return Err(bad(
                    "tool_choice.name",
                    format!("tool_choice.name: `{n}` is not among the tools offered"),
                ))
            }
            None => return Err(missing("tool_choice.name")),
        },
        Some(t) => {
            return Err(bad(
                "tool_choice.type",
                format!("tool_choice.type: must be auto, any, tool or none; got `{t}`"),
            ))
        }
        None => return Err(missing("tool_choice.type")),
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad("tool_choice", "tool_choice: forcing a call needs `tools`"));
    }
    Ok((choice, parallel))
}

/// `thinking`: on (`enabled`, `adaptive`, `between_tools`) or `disabled`, passed to the chat
/// template as `enable_thinking` (models without a thinking switch ignore it, as they do
/// everywhere), and whether its text is `omitted` from the answer. An `enabled` budget must
/// be below `max_tokens`, as Anthropic requires; `max_tokens` bounds reasoning and answer
/// together, so the budget is not a separate limit here (docs/api-fields.md).
fn thinking(
    v: Option<&Value>,
    max_tokens: Option<usize>,
) -> Result<Option<(bool, bool)>, ApiError> {
    let Some(v) = v else { return Ok(None) };
    let Value::Object(o) = v else { return Err(wrong_type("thinking", "an object", v)) };
    let omit = match o.get("display") {
        None | Some(Value::Null) => false,
        Some(Value::String(d)) if d == "summarized" => false,
        Some(Value::String(d)) if d == "omitted" => true,
        Some(d) => {
            return Err(bad(
                "thinking.display",
                format!("thinking.display: must be summarized or omitted; got {d}"),
            ))
        }
    };
    let on = match o.get("type").and_then(Value::as_str) {
        Some("disabled") => false,
        Some("enabled") => {
            let budget = o.get("budget_tokens").and_then(Value::as_u64);
            match (budget, max_tokens) {
                (None, _) => return Err(missing("thinking.budget_tokens")),
                (Some(b), _) if b < 1024 => {
                    return Err(bad(
                        "thinking.budget_tokens",
                        format!("thinking.budget_tokens: must be at least 1024; got {b}"),
                    ))
                }
                (Some(b), Some(m)) if b as usize >= m => {
                    return Err(bad(
                        "thinking.budget_tokens",
                        format!(
                            "thinking.budget_tokens: must be less than max_tokens ({m}); got {b}"
                        ),
                    ))
                }
                _ => true,
            }
        }
        Some("adaptive" | "between_tools") => true,
        Some(t) => {
            return Err(bad(
                "thinking.type",
                format!(
                    "thinking.type: must be enabled, adaptive, between_tools or disabled; got `{t}`"
                ),
            ))
        }
        None => return Err(missing("thinking.type")),
    };
    Ok(Some((on, omit)))
}

/// Structured output: `output_config.format` (or the beta's `output_format`) with a JSON
/// schema, enforced by constrained decoding like OpenAI's `json_schema`; and
/// `output_config.effort`, passed to the template as `reasoning_effort` (as OpenAI's is).
fn output_config(
    legacy: Option<&Value>,
    config: Option<&Value>,
) -> Result<(ResponseFormat, Option<&'static str>), ApiError> {
    let mut effort = None;
    let format = output_format(legacy, config, &mut effort)?;
    Ok((format, effort))
}

fn output_format(
    legacy: Option<&Value>,
    config: Option<&Value>,
    effort: &mut Option<&'static str>,
) -> Result<ResponseFormat, ApiError> {
    let (field, format) = match (legacy, config) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "output_format",
                "output_format: send it or output_config.format, not both",
            ))
        }
        (Some(f), None) => ("output_format", f),
        (None, Some(Value::Object(c))) => {
            for k in c.keys() {
                if k != "format" && k != "effort" {
                    return Err(bad(
                        &format!("output_config.{k}"),
                        format!("output_config.{k}: not supported (format and effort are)"),
                    )
                    .code("unsupported_parameter"));
                }
            }
            *effort = match c.get("effort") {
                None | Some(Value::Null) => None,
                Some(e) => Some(match e.as_str() {
                    Some("low") => "low",
                    Some("medium") => "medium",
                    // Templates know low, medium and high.
                    Some("high" | "xhigh" | "max") => "high",
                    _ => {
                        return Err(bad(
                            "output_config.effort",
                            format!(
                                "output_config.effort: must be low, medium, high, xhigh or max; got {e}"
                            ),
                        ))
                    }
                }),
            };
            match c.get("format").filter(|f| !f.is_null()) {
                Some(f) => ("output_config.format", f),
                None => return Ok(ResponseFormat::Text),
            }
        }
        (None, Some(v)) => return Err(wrong_type("output_config", "an object", v)),
        (None, None) => return Ok(ResponseFormat::Text),
    };
    let Value::Object(f) = format else { return Err(wrong_type(field, "an object", format)) };
    match f.get("type").and_then(Value::as_str) {
        Some("json_schema") => match f.get("schema") {
            Some(s @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema(s.clone())),
            Some(v) => Err(wrong_type(&format!("{field}.schema"), "a JSON Schema object", v)),
            None => Err(missing(&format!("{field}.schema"))),
        },
        Some(t) => Err(bad(
            &format!("{field}.type"),
            format!("{field}.type: must be json_schema; got `{t}`"),
        )),
        None => Err(missing(&format!("{field}.type"))),
    }
}

#[cfg(test)]
mod tests;
