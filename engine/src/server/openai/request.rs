//! Request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by field so
//! every error names the field (OpenAI's `param`).

use serde_json::{Map, Value};

use super::fields;
pub use super::fields::Endpoint;
use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{ModelRef, Prompt, ResponseFormat, Turn};
use crate::server::body::{self, kind, Body};
use crate::server::error::ApiError;

/// A request body: the turn it asks for and how it wants the answer.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    pub turn: Turn,
    pub stream: bool,
    pub include_usage: bool,
    /// The request used the legacy `functions`: answer with `function_call`, not `tool_calls`.
    pub legacy_functions: bool,
}

pub const MAX_STOPS: usize = 16;
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Parse and check a request body. Sampling defaults follow OpenAI's (temperature 1).
pub fn parse(endpoint: Endpoint, bytes: &[u8]) -> Result<ParsedRequest, ApiError> {
    parse_with(endpoint, bytes, &SamplingDefaults::default())
}

/// `parse`, with the user's own defaults for what the request leaves out.
pub fn parse_with(
    endpoint: Endpoint,
    bytes: &[u8],
    defaults: &SamplingDefaults,
) -> Result<ParsedRequest, ApiError> {
    let map = &body::object(bytes)?;
    let b = Body(map);
    fields::check(endpoint, map)?;
    let model = b
        .model("see GET /v1/models")?
        .parse::<ModelRef>()
        .map_err(|e| ApiError::invalid("model", e.to_string()))?;
    let input = match endpoint {
        Endpoint::Chat => Prompt::Messages(messages(b.get("messages"))?),
        Endpoint::Completion => prompt(b.get("prompt"))?,
    };
    if let Some(n) = b.integer("n", i64::MIN, i64::MAX)? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be 1 (one choice per request); got {n}"),
            )
            .code("unsupported_value"));
        }
    }
    let max_key = if b.get("max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let max_tokens = b.integer(max_key, 1, i64::from(u32::MAX))?.map(|n| n as usize);
    let d = SamplingParams::default();
    let f = |x: Option<f64>, default: f32| x.map_or(default, |x| x as f32);
    let sampling = SamplingParams {
        temperature: f(
            b.number("temperature", |x| (0.0..=2.0).contains(&x), "from 0 to 2")?,
            defaults.temperature,
        ),
        top_p: f(b.number("top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?, defaults.top_p),
        top_k: b.integer("top_k", 0, i64::from(u32::MAX))?.map_or(0, |k| k as u32),
        min_p: f(b.number("min_p", |x| (0.0..=1.0).contains(&x), "from 0 to 1")?, d.min_p),
        presence_penalty: f(
            b.number("presence_penalty", |x| (-2.0..=2.0).contains(&x), "from -2 to 2")?,
            0.0,
        ),
        frequency_penalty: f(
            b.number("frequency_penalty", |x| (-2.0..=2.0).contains(&x), "from -2 to 2")?,
            0.0,
        ),
        repetition_penalty: f(
            b.number("repetition_penalty", |x| x > 0.0 && x <= 10.0, "in (0, 10]")?,
            1.0,
        ),
        seed: b.integer("seed", i64::MIN, i64::MAX)?.map(|s| s as u64),
        logit_bias: logit_bias(b.get("logit_bias"))?,
    };
    let stop = match b.get("stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) if list.len() <= MAX_STOPS => list
            .iter()
            .map(|v| {
                v.as_str().map(String::from).ok_or_else(|| {
                    ApiError::invalid("stop", "`stop` must be a string or a list of strings")
                        .code("invalid_type")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` may hold at most {MAX_STOPS} strings"),
            ))
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` must be a string or a list of strings; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
    };
    let stream = b.boolean("stream")?.unwrap_or(false);
    let include_usage = match b.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Body(o)
            .boolean("include_usage")
            .map_err(|e| ApiError { param: Some("stream_options.include_usage".into()), ..e })?
            .unwrap_or(false),
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("`stream_options` must be an object; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
    };
    let logprobs = match endpoint {
        Endpoint::Chat => {
            let on = b.boolean("logprobs")?.unwrap_or(false);
            let top = b.integer("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            if top.is_some() && !on {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            on.then_some(top.unwrap_or(0) as usize)
        }
        // Legacy completions: `logprobs` is the number of alternatives (0 to 5).
        Endpoint::Completion => b.integer("logprobs", 0, 5)?.map(|n| n as usize),
    };
    let response_format = match b.get("response_format") {
        None => ResponseFormat::Text,
        Some(Value::Object(o)) => match o.get("type").and_then(|t| t.as_str()) {
            Some("text") => ResponseFormat::Text,
            Some("json_object") => ResponseFormat::JsonObject,
            Some("json_schema") => json_schema(o.get("json_schema"))?,
            Some(other) => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!(
                        "`response_format.type` `{other}` is not supported (text, json_object, json_schema are)"
                    ),
                )
                .code("unsupported_value"))
            }
            None => {
                return Err(ApiError::invalid(
                    "response_format",
                    "`response_format` needs a `type`",
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                "response_format",
                format!("`response_format` must be an object; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
    };
    if endpoint == Endpoint::Completion {
        for unsupported in ["suffix", "best_of"] {
            if b.get(unsupported).is_some() {
                return Err(ApiError::invalid(
                    unsupported,
                    format!("`{unsupported}` is not supported"),
                )
                .code("unsupported_parameter"));
            }
        }
        if b.boolean("echo")? == Some(true) {
            return Err(
                ApiError::invalid("echo", "`echo` is not supported").code("unsupported_parameter")
            );
        }
    }
    let tools = super::tools::parse(&b)?;
    let mut template_kwargs = match b.get("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!("`chat_template_kwargs` must be an object; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
    };
    match b.get("reasoning_effort") {
        None => {}
        Some(Value::String(e)) if ["minimal", "low", "medium", "high"].contains(&e.as_str()) => {
            template_kwargs.insert("reasoning_effort".into(), Value::from(e.as_str()));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!("`reasoning_effort` must be one of minimal, low, medium, high; got {v}"),
            ))
        }
    }
    let keep_alive = b.keep_alive()?;
    Ok(ParsedRequest {
        turn: Turn {
            max_tokens,
            keep_alive,
            sampling,
            stop,
            logprobs,
            response_format,
            tools: tools.tools,
            tool_choice: tools.choice,
            parallel_tool_calls: tools.parallel,
            template_kwargs,
            ..Turn::new(model, input)
        },
        stream,
        include_usage,
        legacy_functions: tools.legacy,
    })
}

/// `response_format.json_schema`: `{"name", "schema"?, "strict"?, "description"?}`. The
/// schema is always enforced (`strict: false` gets the same guarantee); whether the engine
/// can enforce it is decided when it is compiled for the model.
fn json_schema(v: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    const FIELD: &str = "response_format.json_schema";
    let Some(Value::Object(o)) = v else {
        return Err(ApiError::invalid(
            FIELD,
            format!("`{FIELD}` must be an object with a `name` and a `schema`"),
        ));
    };
    json_schema_fields(o, FIELD)
}

/// The fields of a JSON-schema format (`name`, `schema`, `strict`, `description`), wherever
/// a protocol puts them (`FIELD` names the place in refusals).
pub(crate) fn json_schema_fields(
    o: &Map<String, Value>,
    field: &str,
) -> Result<ResponseFormat, ApiError> {
    for (k, v) in o {
        let ok = match k.as_str() {
            "name" => v.as_str().is_some_and(|n| {
                (1..=64).contains(&n.len())
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            }),
            "description" => v.is_string(),
            "strict" => v.is_boolean() || v.is_null(),
            "schema" => v.is_object() || v.is_boolean(),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{field}.{k}"),
                    format!("`{field}.{k}` is not a field of a JSON schema format"),
                )
                .code("unknown_parameter"))
            }
        };
        if !ok {
            return Err(ApiError::invalid(
                &format!("{field}.{k}"),
                format!("`{field}.{k}` is not valid (name: 1-64 of a-z A-Z 0-9 _ -; schema: an object; strict: a boolean)"),
            ));
        }
    }
    if !o.contains_key("name") {
        return Err(ApiError::invalid(
            &format!("{field}.name"),
            format!("`{field}.name` is required"),
        )
        .code("missing_required_parameter"));
    }
    let schema = match o.get("schema") {
        None | Some(Value::Bool(true)) => Value::Object(Map::new()),
        Some(s) => s.clone(),
    };
    Ok(ResponseFormat::JsonSchema(schema))
}

/// `{"token id": bias}`, bias from -100 to 100.
fn logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = v else { return Ok(vec![]) };
    let Value::Object(map) = v else {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("`logit_bias` must be an object of token id to bias; got {}", kind(v)),
        )
        .code("invalid_type"));
    };
    if map.len() > 1024 {
        return Err(ApiError::invalid("logit_bias", "`logit_bias` may name at most 1024 tokens"));
    }
    map.iter()
        .map(|(k, b)| {
            let id = k.parse::<u32>().map_err(|_| {
                ApiError::invalid("logit_bias", format!("`logit_bias` key `{k}` is not a token id"))
            })?;
            match b.as_f64() {
                Some(x) if (-100.0..=100.0).contains(&x) => Ok((id, x as f32)),
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias[{k}]` must be a number from -100 to 100; got {b}"),
                )),
            }
        })
        .collect()
}

fn messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match v {
        None => {
            return Err(ApiError::invalid("messages", "`messages` is required")
                .code("missing_required_parameter"))
        }
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid("messages", "`messages` must not be empty"))
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "messages",
                format!("`messages` must be an array; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |f: &str| format!("messages[{i}]{f}");
            let Value::Object(m) = m else {
                return Err(ApiError::invalid(&at(""), format!("`{}` must be an object", at("")))
                    .code("invalid_type"));
            };
            let role = match m.get("role").and_then(|r| r.as_str()) {
                Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_string(),
                // The legacy name of a tool result.
                Some("function") => "tool".to_string(),
                Some("developer") => "system".to_string(),
                Some(r) => {
                    return Err(ApiError::invalid(
                        &at(".role"),
                        format!(
                            "`{}` `{r}` is not one of system, developer, user, assistant, tool",
                            at(".role")
                        ),
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        &at(".role"),
                        format!("`{}` is required", at(".role")),
                    )
                    .code("missing_required_parameter"))
                }
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None if role == "assistant" => String::new(),
                // Content parts: text only.
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| {
                        match (
                            p.get("type").and_then(|t| t.as_str()),
                            p.get("text").and_then(|t| t.as_str()),
                        ) {
                            (Some("text"), Some(t)) => Ok(t.to_string()),
                            _ => Err(ApiError::invalid(
                                &at(".content"),
                                format!("`{}`: only text parts are supported", at(".content")),
                            )
                            .code("unsupported_value")),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(""),
                Some(v) => {
                    return Err(ApiError::invalid(
                        &at(".content"),
                        format!(
                            "`{}` must be a string or a list of text parts; got {}",
                            at(".content"),
                            kind(v)
                        ),
                    )
                    .code("invalid_type"))
                }
                None => {
                    return Err(ApiError::invalid(
                        &at(".content"),
                        format!("`{}` is required", at(".content")),
                    )
                    .code("missing_required_parameter"))
                }
            };
            let mut msg = ChatMessage::new(&role, content);
            if role == "assistant" {
                msg.tool_calls = super::tools::history_calls(m, &at)?;
            }
            if role == "tool" {
                msg.tool_call_id = match m.get("tool_call_id") {
                    Some(Value::String(id)) => Some(id.clone()),
                    None | Some(Value::Null) => None,
                    Some(v) => {
                        return Err(ApiError::invalid(
                            &at(".tool_call_id"),
                            format!("`{}` must be a string; got {}", at(".tool_call_id"), kind(v)),
                        )
                        .code("invalid_type"))
                    }
                };
            }
            if let Some(Value::String(name)) = m.get("name") {
                msg.name = Some(name.clone());
            }
            Ok(msg)
        })
        .collect()
}

fn prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, a list of one string, or a list of token ids",
        )
        .code("invalid_type")
    };
    match v {
        None => {
            Err(ApiError::invalid("prompt", "`prompt` is required")
                .code("missing_required_parameter"))
        }
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(list)) if list.len() == 1 && list[0].is_string() => {
            Ok(Prompt::Text(list[0].as_str().unwrap().to_string()))
        }
        Some(Value::Array(list)) if !list.is_empty() && list.iter().all(|t| t.is_u64()) => list
            .iter()
            .map(|t| t.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32).ok_or_else(bad))
            .collect::<Result<_, _>>()
            .map(Prompt::Tokens),
        Some(Value::Array(list)) if list.len() > 1 && list.iter().all(|t| t.is_string()) => {
            Err(ApiError::invalid(
                "prompt",
                "one prompt per request (a list of several prompts is not supported)",
            )
            .code("unsupported_value"))
        }
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests;
