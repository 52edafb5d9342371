//! Request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by field so
//! every error names the field (OpenAI's `param`).

use serde_json::{Map, Value};

use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{ModelRef, Prompt, ResponseFormat, Turn};
use crate::server::error::ApiError;

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

pub(super) struct Body<'a>(pub(super) &'a Map<String, Value>);

impl Body<'_> {
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn number(
        &self,
        key: &str,
        ok: impl Fn(f64) -> bool,
        range: &str,
    ) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            // Checked as given and as the f32 the sampler will use (1e-50 is > 0, its f32 is not).
            Some(v) => match v.as_f64() {
                Some(x) if ok(x) && ok(x as f32 as f64) => Ok(Some(x)),
                Some(x) => Err(ApiError::invalid(key, format!("`{key}` must be {range}; got {x}"))),
                None => Err(ApiError::invalid(
                    key,
                    format!("`{key}` must be a number; got {}", kind(v)),
                )
                .code("invalid_type")),
            },
        }
    }

    fn integer(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
                Some(x) => Err(ApiError::invalid(
                    key,
                    format!("`{key}` must be an integer from {min} to {max}; got {x}"),
                )),
                None => Err(ApiError::invalid(
                    key,
                    format!("`{key}` must be an integer; got {}", kind(v)),
                )
                .code("invalid_type")),
            },
        }
    }

    pub(super) fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => {
                Err(ApiError::invalid(key, format!("`{key}` must be a boolean; got {}", kind(v)))
                    .code("invalid_type"))
            }
        }
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

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
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("The body is not valid JSON: {e}"),
        )
        .code("invalid_json")
    })?;
    let Value::Object(map) = &value else {
        return Err(ApiError::invalid(
            "body",
            format!("The body must be a JSON object; got {}", kind(&value)),
        )
        .code("invalid_type"));
    };
    let b = Body(map);
    check_fields(endpoint, map)?;
    let model = match b.get("model") {
        Some(Value::String(s)) if !s.is_empty() => {
            s.parse::<ModelRef>().map_err(|e| ApiError::invalid("model", e.to_string()))?
        }
        Some(v) if !v.is_string() => {
            return Err(ApiError::invalid(
                "model",
                format!("`model` must be a string; got {}", kind(v)),
            )
            .code("invalid_type"))
        }
        _ => {
            return Err(ApiError::invalid("model", "`model` is required (see GET /v1/models)")
                .code("missing_required_parameter"))
        }
    };
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
    Ok(ParsedRequest {
        turn: Turn {
            max_tokens,
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
                    &format!("{FIELD}.{k}"),
                    format!("`{FIELD}.{k}` is not a field of `json_schema`"),
                )
                .code("unknown_parameter"))
            }
        };
        if !ok {
            return Err(ApiError::invalid(
                &format!("{FIELD}.{k}"),
                format!("`{FIELD}.{k}` is not valid (name: 1-64 of a-z A-Z 0-9 _ -; schema: an object; strict: a boolean)"),
            ));
        }
    }
    if !o.contains_key("name") {
        return Err(ApiError::invalid(
            &format!("{FIELD}.name"),
            format!("`{FIELD}.name` is required"),
        )
        .code("missing_required_parameter"));
    }
    let schema = match o.get("schema") {
        None | Some(Value::Bool(true)) => Value::Object(Map::new()),
        Some(s) => s.clone(),
    };
    Ok(ResponseFormat::JsonSchema(schema))
}

fn check_fields(endpoint: Endpoint, map: &Map<String, Value>) -> Result<(), ApiError> {
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn err(endpoint: Endpoint, body: &str) -> ApiError {
        parse(endpoint, body.as_bytes()).unwrap_err()
    }

    #[test]
    fn each_bad_field_is_named() {
        let chat = |extra: &str| {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
        };
        for (extra, param) in [
            (r#","max_tokens":-1"#, "max_tokens"),
            (r#","max_completion_tokens":0"#, "max_completion_tokens"),
            (r#","temperature":-0.5"#, "temperature"),
            (r#","temperature":"hot""#, "temperature"),
            (r#","top_p":0"#, "top_p"),
            (r#","top_p":1.5"#, "top_p"),
            (r#","top_p":1e-60"#, "top_p"),
            (r#","repetition_penalty":1e-300"#, "repetition_penalty"),
            (r#","n":2"#, "n"),
            (r#","stop":7"#, "stop"),
            (r#","stream":"yes""#, "stream"),
            (r#","top_logprobs":3"#, "top_logprobs"),
            (r#","response_format":{"type":"xml"}"#, "response_format"),
            (r#","stream_options":{"include_usage":1}"#, "stream_options.include_usage"),
        ] {
            let e = err(Endpoint::Chat, &chat(extra));
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{extra}: {}",
                e.message
            );
        }
        assert_eq!(err(Endpoint::Chat, r#"{"messages":[]}"#).param.as_deref(), Some("model"));
        assert_eq!(err(Endpoint::Chat, r#"{"model":"m"}"#).param.as_deref(), Some("messages"));
        assert_eq!(
            err(Endpoint::Chat, r#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#)
                .param
                .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            err(Endpoint::Chat, r#"{"model":"m","messages":[{"role":"user","content":5}]}"#)
                .param
                .as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            err(Endpoint::Completion, r#"{"model":"m","prompt":{"a":1}}"#).param.as_deref(),
            Some("prompt")
        );
        assert_eq!(
            err(Endpoint::Completion, r#"{"model":"m","prompt":"x","logprobs":9}"#)
                .param
                .as_deref(),
            Some("logprobs")
        );
        assert_eq!(err(Endpoint::Chat, "{not json").code, Some("invalid_json"));
        assert_eq!(err(Endpoint::Chat, "[1,2]").param.as_deref(), Some("body"));
    }

    #[test]
    fn good_requests_parse() {
        let r = parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":"hi"}],"max_tokens":5,"stop":["a","b"],"seed":3,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"response_format":{"type":"json_object"},"user":"u1","metadata":{"a":"b"}}"#).unwrap();
        assert_eq!(
            r.turn.prompt,
            Prompt::Messages(vec![
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hi")
            ])
        );
        assert_eq!(
            (r.turn.max_tokens, r.turn.stop.len(), r.turn.sampling.seed),
            (Some(5), 2, Some(3))
        );
        assert!(r.stream && r.include_usage);
        assert_eq!(r.turn.response_format, ResponseFormat::JsonObject);
        assert_eq!(r.turn.logprobs, Some(2));
        let r = parse(Endpoint::Completion, br#"{"model":"m","prompt":[1,2,3],"temperature":0}"#)
            .unwrap();
        assert_eq!(r.turn.prompt, Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(r.turn.sampling.temperature, 0.0);
    }

    #[test]
    fn unknown_and_refused_fields_are_named() {
        let chat = |extra: &str| {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
        };
        for (extra, param, code) in [
            (r#","unknown_field":1"#, "unknown_field", "unknown_parameter"),
            (
                r#","prediction":{"type":"content","content":"x"}"#,
                "prediction",
                "unsupported_parameter",
            ),
            (r#","audio":{"voice":"alloy"}"#, "audio", "unsupported_parameter"),
            (r#","modalities":["text","audio"]"#, "modalities", "unsupported_value"),
        ] {
            let e = err(Endpoint::Chat, &chat(extra));
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref(), e.code),
                (400, Some(param), Some(code)),
                "{extra}: {}",
                e.message
            );
        }
        // A completion-only field on chat is unknown there.
        let e = err(Endpoint::Chat, &chat(r#","echo":true"#));
        assert_eq!(e.param.as_deref(), Some("echo"));
        // Null means absent, as the OpenAI clients send it.
        assert!(parse(
            Endpoint::Chat,
            chat(r#","prediction":null,"modalities":["text"]"#).as_bytes()
        )
        .is_ok());
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            ".{0,12}".prop_map(Value::String),
            prop_oneof![
                Just("model"),
                Just("messages"),
                Just("role"),
                Just("user"),
                Just("content"),
                Just("text"),
                Just("type")
            ]
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("model".to_string()),
                        Just("messages".to_string()),
                        Just("prompt".to_string()),
                        Just("role".to_string()),
                        Just("content".to_string()),
                        Just("stop".to_string()),
                        Just("max_tokens".to_string()),
                        Just("temperature".to_string()),
                        Just("top_p".to_string()),
                        Just("n".to_string()),
                        Just("stream".to_string()),
                        Just("stream_options".to_string()),
                        Just("logprobs".to_string()),
                        Just("top_logprobs".to_string()),
                        Just("response_format".to_string()),
                        Just("type".to_string()),
                        Just("seed".to_string()),
                        ".{0,6}",
                    ],
                    inner,
                    0..8,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]
        #[test]
        fn no_input_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), value in json_value()) {
            for endpoint in [Endpoint::Chat, Endpoint::Completion] {
                let _ = parse(endpoint, &bytes);
                let text = serde_json::to_vec(&value).unwrap();
                if let Err(e) = parse(endpoint, &text) {
                    prop_assert!(e.status.is_client_error());
                }
            }
        }
    }
}
