//! Request bodies of `/v1/chat/completions` and `/v1/completions`: read into their types
//! (`request/types.rs`), then into a `Turn`, every error naming its field (OpenAI's `param`).

use serde_json::{Map, Value};

use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{KeepAlive, ModelRef, Prompt, ResponseFormat, Turn};
use crate::server::body::{self, kind, Body};
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Int, Json, Num, Text, Words};
use types::{ChatRequest, CompletionRequest};

/// The endpoint a body is for: each has fields of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

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
    let mut map = body::object(bytes)?;
    types::check(endpoint, &mut map)?;
    match endpoint {
        Endpoint::Chat => chat(field::typed_fields(map, Words::OpenAi)?, defaults),
        Endpoint::Completion => completion(field::typed_fields(map, Words::OpenAi)?, defaults),
    }
}

/// The fields both endpoints share, moved out of either body type.
struct Shared {
    max_tokens: Option<Int<1, { u32::MAX as i64 }>>,
    temperature: Option<Num<0, 2>>,
    top_p: Option<Num<0, 1, true>>,
    top_k: Option<Int<0, { u32::MAX as i64 }>>,
    min_p: Option<Num<0, 1>>,
    presence_penalty: Option<Num<-2, 2>>,
    frequency_penalty: Option<Num<-2, 2>>,
    repetition_penalty: Option<Num<0, 10, true>>,
    seed: Option<Int>,
    n: Option<Int>,
    stop: Option<Value>,
    stream: Option<Flag>,
    stream_options: Option<Value>,
    logit_bias: Option<Value>,
    keep_alive: Option<Value>,
}

macro_rules! shared {
    ($b:ident) => {
        Shared {
            max_tokens: $b.max_tokens,
            temperature: $b.temperature,
            top_p: $b.top_p,
            top_k: $b.top_k,
            min_p: $b.min_p,
            presence_penalty: $b.presence_penalty,
            frequency_penalty: $b.frequency_penalty,
            repetition_penalty: $b.repetition_penalty,
            seed: $b.seed,
            n: $b.n,
            stop: $b.stop.map(|j| j.0),
            stream: $b.stream,
            stream_options: $b.stream_options.map(|j| j.0),
            logit_bias: $b.logit_bias.map(|j| j.0),
            keep_alive: $b.keep_alive.map(|j| j.0),
        }
    };
}

fn chat(b: ChatRequest, defaults: &SamplingDefaults) -> Result<ParsedRequest, ApiError> {
    let model = model(&b.model)?;
    let input = Prompt::Messages(messages(Json::value(&b.messages))?);
    let max_tokens = b.max_completion_tokens.or(b.max_tokens);
    let on = Flag::get(b.logprobs);
    if b.top_logprobs.is_some() && !on {
        return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    let logprobs = on.then_some(b.top_logprobs.map_or(0, |t| t.0 as usize));
    if let Some(m) = Json::value(&b.modalities) {
        if !m.as_array().is_some_and(|m| m.iter().all(|x| x == "text")) {
            return Err(ApiError::invalid(
                "modalities",
                "`modalities`: only [\"text\"] is supported (no audio output)",
            )
            .code("unsupported_value"));
        }
    }
    let response_format = response_format(Json::value(&b.response_format))?;
    let mut tool_fields = Map::new();
    for (key, v) in [
        ("tools", Json::value(&b.tools)),
        ("tool_choice", Json::value(&b.tool_choice)),
        ("functions", Json::value(&b.functions)),
        ("function_call", Json::value(&b.function_call)),
        ("parallel_tool_calls", b.parallel_tool_calls.map(|f| Value::Bool(f.0)).as_ref()),
    ] {
        if let Some(v) = v {
            tool_fields.insert(key.into(), v.clone());
        }
    }
    let tools = super::tools::parse(&Body(&tool_fields))?;
    let mut template_kwargs = match Json::value(&b.chat_template_kwargs) {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => return Err(body::wrong_type("chat_template_kwargs", "an object", v)),
    };
    match Json::value(&b.reasoning_effort) {
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
    let mut shared = shared!(b);
    shared.max_tokens = max_tokens;
    let mut r = request(model, input, shared, defaults)?;
    r.turn.logprobs = logprobs;
    r.turn.response_format = response_format;
    r.turn.tools = tools.tools;
    r.turn.tool_choice = tools.choice;
    r.turn.parallel_tool_calls = tools.parallel;
    r.turn.template_kwargs = template_kwargs;
    r.legacy_functions = tools.legacy;
    Ok(r)
}

fn completion(
    b: CompletionRequest,
    defaults: &SamplingDefaults,
) -> Result<ParsedRequest, ApiError> {
    let model = model(&b.model)?;
    let input = prompt(Json::value(&b.prompt))?;
    if Flag::get(b.echo) {
        return Err(
            ApiError::invalid("echo", "`echo` is not supported").code("unsupported_parameter")
        );
    }
    // Legacy completions: `logprobs` is the number of alternatives.
    let logprobs = b.logprobs.map(|n| n.0 as usize);
    let mut r = request(model, input, shared!(b), defaults)?;
    r.turn.logprobs = logprobs;
    Ok(r)
}

/// `model`: required, a non-empty string.
fn model(v: &Option<Text>) -> Result<ModelRef, ApiError> {
    match v {
        Some(Text(s)) if !s.is_empty() => {
            s.parse::<ModelRef>().map_err(|e| ApiError::invalid("model", e.to_string()))
        }
        _ => Err(ApiError::invalid("model", "`model` is required (see GET /v1/models)")
            .code("missing_required_parameter")),
    }
}

/// The turn both endpoints ask for, from their shared fields.
fn request(
    model: ModelRef,
    input: Prompt,
    b: Shared,
    defaults: &SamplingDefaults,
) -> Result<ParsedRequest, ApiError> {
    if let Some(Int(n)) = b.n {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be 1 (one choice per request); got {n}"),
            )
            .code("unsupported_value"));
        }
    }
    let d = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: Num::get(b.temperature, defaults.temperature),
        top_p: Num::get(b.top_p, defaults.top_p),
        top_k: b.top_k.map_or(0, |k| k.0 as u32),
        min_p: Num::get(b.min_p, d.min_p),
        presence_penalty: Num::get(b.presence_penalty, 0.0),
        frequency_penalty: Num::get(b.frequency_penalty, 0.0),
        repetition_penalty: Num::get(b.repetition_penalty, 1.0),
        seed: b.seed.map(|s| s.0 as u64),
        logit_bias: logit_bias(b.logit_bias.as_ref())?,
    };
    let stop = stop(b.stop.as_ref())?;
    let include_usage = match &b.stream_options {
        None => false,
        Some(Value::Object(o)) => {
            // `include_obfuscation` pads events against a network observer: loopback has
            // none, so it is accepted and adds nothing. Anything else is named, not ignored.
            if let Some(k) =
                o.keys().find(|k| !["include_usage", "include_obfuscation"].contains(&k.as_str()))
            {
                return Err(ApiError::invalid(
                    &format!("stream_options.{k}"),
                    format!("`stream_options.{k}` is not supported (include_usage and include_obfuscation are)"),
                )
                .code("unknown_parameter"));
            }
            let flag = |k: &str| {
                Body(o)
                    .boolean(k)
                    .map_err(|e| ApiError { param: Some(format!("stream_options.{k}")), ..e })
            };
            flag("include_obfuscation")?;
            flag("include_usage")?.unwrap_or(false)
        }
        Some(v) => return Err(body::wrong_type("stream_options", "an object", v)),
    };
    let keep_alive = b
        .keep_alive
        .as_ref()
        .map(|v| KeepAlive::from_request(v).map_err(|e| ApiError::invalid("keep_alive", e)))
        .transpose()?;
    Ok(ParsedRequest {
        turn: Turn {
            max_tokens: b.max_tokens.map(|n| n.0 as usize),
            keep_alive,
            sampling,
            stop,
            ..Turn::new(model, input)
        },
        stream: Flag::get(b.stream),
        include_usage,
        legacy_functions: false,
    })
}

fn stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match v {
        None => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(list)) if list.len() <= MAX_STOPS => list
            .iter()
            .map(|v| {
                v.as_str().map(String::from).ok_or_else(|| {
                    ApiError::invalid("stop", "`stop` must be a string or a list of strings")
                        .code("invalid_type")
                })
            })
            .collect(),
        Some(Value::Array(_)) => {
            Err(ApiError::invalid("stop", format!("`stop` may hold at most {MAX_STOPS} strings")))
        }
        Some(v) => Err(ApiError::invalid(
            "stop",
            format!("`stop` must be a string or a list of strings; got {}", kind(v)),
        )
        .code("invalid_type")),
    }
}

fn response_format(v: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    match v {
        None => Ok(ResponseFormat::Text),
        Some(Value::Object(o)) => match o.get("type").and_then(|t| t.as_str()) {
            Some("text") => Ok(ResponseFormat::Text),
            Some("json_object") => Ok(ResponseFormat::JsonObject),
            Some("json_schema") => json_schema(o.get("json_schema")),
            Some(other) => Err(ApiError::invalid(
                "response_format",
                format!(
                    "`response_format.type` `{other}` is not supported (text, json_object, json_schema are)"
                ),
            )
            .code("unsupported_value")),
            None => {
                Err(ApiError::invalid("response_format", "`response_format` needs a `type`"))
            }
        },
        Some(v) => Err(ApiError::invalid(
            "response_format",
            format!("`response_format` must be an object; got {}", kind(v)),
        )
        .code("invalid_type")),
    }
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

pub mod types;

#[cfg(test)]
mod tests;
