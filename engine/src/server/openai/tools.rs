//! OpenAI's tool fields: `tools`, `tool_choice`, `parallel_tool_calls`, the legacy
//! `functions` / `function_call`, and the calls an assistant message carries in the history.
//! Every refusal names its field.

use serde_json::{json, Map, Value};

use crate::chat::{Tool, ToolChoice};
use crate::server::body::{kind, Body};
use crate::server::error::ApiError;

/// At most this many tools per request (OpenAI's own limit).
pub const MAX_TOOLS: usize = 128;

pub struct ParsedTools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// Came in as `functions`: answer with `function_call`.
    pub legacy: bool,
}

pub fn parse(b: &Body<'_>) -> Result<ParsedTools, ApiError> {
    let (tools, legacy) = match (b.get("tools"), b.get("functions")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "functions",
                "`functions` is the legacy form of `tools`: send one of them, not both",
            ))
        }
        (Some(v), None) => (tool_list(v, "tools", Shape::Nested)?, false),
        (None, Some(v)) => (tool_list(v, "functions", Shape::Legacy)?, true),
        (None, None) => (vec![], false),
    };
    let choice_key = if legacy { "function_call" } else { "tool_choice" };
    if legacy && b.get("tool_choice").is_some() {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` goes with `tools`, not `functions` (use `function_call`)",
        ));
    }
    if !legacy && b.get("function_call").is_some() {
        return Err(ApiError::invalid(
            "function_call",
            "`function_call` goes with `functions`, not `tools` (use `tool_choice`)",
        ));
    }
    let choice = match b.get(choice_key) {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" if !legacy => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    choice_key,
                    format!(
                        "`{choice_key}` `{other}` is not one of {}",
                        if legacy {
                            "auto, none, or {\"name\": …}"
                        } else {
                            "auto, none, required, or {\"type\": \"function\", \"function\": {\"name\": …}}"
                        }
                    ),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name =
                if legacy { o.get("name") } else { o.get("function").and_then(|f| f.get("name")) };
            let Some(Value::String(name)) = name else {
                return Err(ApiError::invalid(
                    choice_key,
                    format!(
                        "`{choice_key}` names no function (expected {})",
                        if legacy {
                            "{\"name\": …}"
                        } else {
                            "{\"type\": \"function\", \"function\": {\"name\": …}}"
                        }
                    ),
                ));
            };
            if !tools.iter().any(|t| &t.name == name) {
                return Err(ApiError::invalid(
                    choice_key,
                    format!("`{choice_key}` names `{name}`, which is not among the tools offered"),
                ));
            }
            ToolChoice::Named(name.clone())
        }
        Some(v) => {
            return Err(ApiError::invalid(
                choice_key,
                format!("`{choice_key}` must be a string or an object; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
    };
    if tools.is_empty() && choice == ToolChoice::Required {
        return Err(ApiError::invalid(
            choice_key,
            format!("`{choice_key}` `required` needs `tools`"),
        ));
    }
    let parallel = b.boolean("parallel_tool_calls")?.unwrap_or(true);
    Ok(ParsedTools { tools, choice, parallel, legacy })
}

/// How a request spells one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Chat completions' `{"type": "function", "function": {"name", …}}`.
    Nested,
    /// The legacy `functions`: `{"name", …}`.
    Legacy,
    /// The Responses API's `{"type": "function", "name", …}`.
    Flat,
}

/// A list of function definitions, each checked, the refusal naming the field as sent;
/// templates get them in chat completions' shape, whichever way they came.
pub fn tool_list(v: &Value, key: &str, shape: Shape) -> Result<Vec<Tool>, ApiError> {
    let legacy = shape == Shape::Legacy;
    let Value::Array(list) = v else {
        return Err(ApiError::invalid(key, format!("`{key}` must be an array; got {}", kind(v)))
            .code("invalid_type"));
    };
    if list.len() > MAX_TOOLS {
        return Err(ApiError::invalid(key, format!("`{key}` may hold at most {MAX_TOOLS} tools")));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| format!("{key}[{i}]{f}");
        let function = if legacy {
            t
        } else {
            match t.get("type") {
                Some(Value::String(s)) if s == "function" => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        &at(".type"),
                        format!("`{}` must be \"function\"; got {other}", at(".type")),
                    )
                    .code("unsupported_value"))
                }
                None => {
                    return Err(ApiError::invalid(
                        &at(".type"),
                        format!("`{}` is required", at(".type")),
                    )
                    .code("missing_required_parameter"))
                }
            }
            t.get("function").unwrap_or(&Value::Null)
        };
        let function = if shape == Shape::Flat { t } else { function };
        let fkey =
            |f: &str| if shape == Shape::Nested { at(&format!(".function{f}")) } else { at(f) };
        let Value::Object(f) = function else {
            return Err(ApiError::invalid(
                &fkey(""),
                format!("`{}` must be an object with a `name`", fkey("")),
            )
            .code("invalid_type"));
        };
        let name = match f.get("name") {
            Some(Value::String(n)) if valid_name(n) => n.clone(),
            Some(n) => {
                return Err(ApiError::invalid(
                    &fkey(".name"),
                    format!(
                        "`{}` must be 1 to 64 letters, digits, `_`, `-`, `.` or `:`; got {n}",
                        fkey(".name")
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &fkey(".name"),
                    format!("`{}` is required", fkey(".name")),
                )
                .code("missing_required_parameter"))
            }
        };
        if tools.iter().any(|t| t.name == name) {
            return Err(ApiError::invalid(
                &fkey(".name"),
                format!("`{}`: `{name}` is offered twice", fkey(".name")),
            ));
        }
        match f.get("description") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(v) => {
                return Err(ApiError::invalid(
                    &fkey(".description"),
                    format!("`{}` must be a string; got {}", fkey(".description"), kind(v)),
                )
                .code("invalid_type"))
            }
        }
        match f.get("parameters") {
            None | Some(Value::Null) | Some(Value::Object(_)) => {}
            Some(v) => {
                return Err(ApiError::invalid(
                    &fkey(".parameters"),
                    format!(
                        "`{}` must be a JSON Schema object; got {}",
                        fkey(".parameters"),
                        kind(v)
                    ),
                )
                .code("invalid_type"))
            }
        }
        match f.get("strict") {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(v) => {
                return Err(ApiError::invalid(
                    &fkey(".strict"),
                    format!("`{}` must be a boolean; got {}", fkey(".strict"), kind(v)),
                )
                .code("invalid_type"))
            }
        }
        // Templates read the OpenAI shape whichever way it came in.
        let definition = match shape {
            Shape::Nested => t.clone(),
            Shape::Legacy => json!({"type": "function", "function": f}),
            Shape::Flat => {
                let mut f = f.clone();
                f.remove("type");
                json!({"type": "function", "function": f})
            }
        };
        tools.push(Tool { name, definition });
    }
    Ok(tools)
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

/// An assistant message's `tool_calls` (or legacy `function_call`) as templates expect them:
/// `arguments` an object, not the JSON text the wire carries.
pub fn history_calls(
    m: &Map<String, Value>,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<Value>, ApiError> {
    let calls: Vec<(String, &Value)> = match (m.get("tool_calls"), m.get("function_call")) {
        (None | Some(Value::Null), None | Some(Value::Null)) => return Ok(vec![]),
        (Some(Value::Array(list)), _) => {
            list.iter().enumerate().map(|(i, c)| (at(&format!(".tool_calls[{i}]")), c)).collect()
        }
        (None | Some(Value::Null), Some(f)) => vec![(at(".function_call"), f)],
        (Some(v), _) => {
            return Err(ApiError::invalid(
                &at(".tool_calls"),
                format!("`{}` must be an array; got {}", at(".tool_calls"), kind(v)),
            )
            .code("invalid_type"))
        }
    };
    calls
        .into_iter()
        .enumerate()
        .map(|(i, (path, c))| {
            let legacy = path.ends_with(".function_call");
            let f = if legacy { Some(c) } else { c.get("function") };
            let name = f.and_then(|f| f.get("name")).and_then(|n| n.as_str());
            let Some(name) = name else {
                return Err(ApiError::invalid(&path, format!("`{path}` needs a function `name`")));
            };
            let arguments = match f.and_then(|f| f.get("arguments")) {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    ApiError::invalid(&path, format!("`{path}` arguments are not valid JSON: {e}"))
                })?,
                Some(v @ Value::Object(_)) => v.clone(),
                Some(v) => {
                    return Err(ApiError::invalid(
                        &path,
                        format!("`{path}` arguments must be a JSON string; got {}", kind(v)),
                    )
                    .code("invalid_type"))
                }
            };
            let id = c.get("id").and_then(|i| i.as_str()).map_or_else(|| format!("call_{i}"), String::from);
            Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
        })
        .collect()
}
