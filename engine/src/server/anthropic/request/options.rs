//! The Messages API's options besides the conversation: `context_management`, `tools`,
//! `tool_choice`, `thinking` and the output format (`output_config`, `output_format`), each
//! checked and every refusal naming its field.

use serde_json::{json, Map, Value};

use super::{bad, missing, wrong_type, MAX_TOOLS};
use crate::chat::{Tool, ToolChoice};
use crate::runtime::ResponseFormat;
use crate::server::error::ApiError;

/// `context_management`: edits the server makes to a long conversation. Perch never shows
/// earlier thinking to the model again (chat templates drop it), so `clear_thinking_*` edits
/// leave nothing to do, whatever they keep; other edits (clearing old tool results) are
/// refused by name. Claude Code sends a `clear_thinking` edit on every request.
pub(super) fn context_management(v: Option<&Value>) -> Result<(), ApiError> {
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
pub(super) fn tools(v: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
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
pub(super) fn tool_choice(
    v: Option<&Value>,
    tools: &[Tool],
) -> Result<(ToolChoice, bool), ApiError> {
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
pub(super) fn thinking(
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
pub(super) fn output_config(
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
