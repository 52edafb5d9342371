//! A `/v1/responses` body read into the runtime's turn: `input` (a string or items: messages,
//! function calls and their outputs), `instructions`, function tools, `text.format`, and a
//! conversation carried on from `previous_response_id`. Every refusal names its field.

use serde_json::{json, Map, Value};

use super::store::Store;
use crate::chat::{ChatMessage, ToolChoice};
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{KeepAlive, ModelRef, Prompt, ResponseFormat, Turn};
use crate::server::body::{self, wrong_type};
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Json, Num, Text, Words};
use crate::server::openai::request::json_schema_fields;
use crate::server::openai::tools::{tool_list, Shape};
use types::ResponsesRequest;

/// A body read into a turn, with what the response object echoes back.
#[derive(Debug)]
pub struct ParsedResponse {
    pub turn: Turn,
    pub stream: bool,
    pub store: bool,
    /// The conversation as the model sees it, minus `instructions` (what a follow-up
    /// inherits).
    pub conversation: Vec<ChatMessage>,
    /// The request fields a response object repeats (`instructions`, `tools`, `text`, …).
    pub echo: Map<String, Value>,
    /// `include: ["message.output_text.logprobs"]`.
    pub logprobs: bool,
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

pub fn parse(
    bytes: &[u8],
    defaults: &SamplingDefaults,
    store: &Store,
) -> Result<ParsedResponse, ApiError> {
    let mut map = body::object(bytes)?;
    types::check(&mut map)?;
    let b: ResponsesRequest = field::typed_fields(map, Words::OpenAi)?;
    let model = match &b.model {
        Some(Text(s)) if !s.is_empty() => {
            s.parse::<ModelRef>().map_err(|e| bad("model", e.to_string()))?
        }
        _ => {
            return Err(bad("model", "`model` is required (see GET /v1/models)")
                .code("missing_required_parameter"))
        }
    };
    if Flag::get(b.background) {
        return Err(bad("background", "`background` responses are not supported: stream instead")
            .code("unsupported_value"));
    }
    match Json::value(&b.truncation) {
        None => {}
        Some(Value::String(t)) if t == "disabled" => {}
        Some(Value::String(t)) if t == "auto" => return Err(bad(
            "truncation",
            "`truncation` `auto` is not supported: an input longer than the context is an error",
        )
        .code("unsupported_value")),
        Some(v) => {
            return Err(bad(
                "truncation",
                format!("`truncation` must be auto or disabled; got {v}"),
            ))
        }
    }
    let metadata = b.metadata.map_or(json!({}), |o| Value::Object(o.0));
    let store_it = b.store.is_none_or(|s| s.0);
    let stream = Flag::get(b.stream);
    if let Some(v) = Json::value(&b.stream_options) {
        if !stream {
            return Err(bad("stream_options", "`stream_options` needs `stream: true`"));
        }
        let Value::Object(o) = v else { return Err(wrong_type("stream_options", "an object", v)) };
        // Obfuscation pads events against a network observer; loopback has none.
        if let Some((k, _)) =
            o.iter().find(|(k, x)| *k != "include_obfuscation" || !(x.is_boolean() || x.is_null()))
        {
            return Err(bad(
                &format!("stream_options.{k}"),
                format!(
                    "`stream_options.{k}` is not supported (include_obfuscation, a boolean, is)"
                ),
            ));
        }
    }

    // The conversation: what `previous_response_id` left, then this input.
    let previous_id = b.previous_response_id.map(|t| t.0);
    let previous = match &previous_id {
        None => None,
        Some(id) => Some(store.get(id).ok_or_else(|| ApiError {
            status: axum::http::StatusCode::NOT_FOUND,
            ..bad(
                "previous_response_id",
                format!("Previous response with id '{id}' not found (the newest {} responses are kept, in memory, and none sent with `store: false`)", super::store::MAX_RESPONSES),
            )
            .code("previous_response_not_found")
        })?),
    };
    let mut conversation = previous.map(|p| p.conversation.clone()).unwrap_or_default();
    conversation.extend(input(Json::value(&b.input))?);
    if conversation.is_empty() {
        return Err(bad("input", "`input` is required").code("missing_required_parameter"));
    }
    let instructions = b.instructions.map(|t| t.0);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(ChatMessage::new("system", i.clone()));
    }
    messages.extend(conversation.iter().cloned());

    let sampling = SamplingParams {
        temperature: Num::get(b.temperature, defaults.temperature),
        top_p: Num::get(b.top_p, defaults.top_p),
        ..SamplingParams::default()
    };
    let max_tokens = b.max_output_tokens.map(|n| n.0 as usize);
    let top_logprobs = b.top_logprobs.map(|n| n.0);
    let logprobs = include(Json::value(&b.include))?;
    if top_logprobs.is_some_and(|n| n > 0) && !logprobs {
        return Err(bad(
            "top_logprobs",
            "`top_logprobs` needs `include: [\"message.output_text.logprobs\"]`",
        ));
    }

    let tools = match Json::value(&b.tools) {
        None => vec![],
        Some(v) => tool_list(v, "tools", Shape::Flat)?,
    };
    let tool_choice = tool_choice(Json::value(&b.tool_choice), &tools)?;
    let parallel = b.parallel_tool_calls.is_none_or(|p| p.0);
    let (response_format, text_echo) = text(Json::value(&b.text))?;
    let mut template_kwargs = Map::new();
    let reasoning = match Json::value(&b.reasoning) {
        None => json!({"effort": null, "summary": null}),
        Some(Value::Object(r)) => {
            for (k, v) in r {
                match (k.as_str(), v) {
                    (_, Value::Null) => {}
                    ("effort", Value::String(e))
                        if ["none", "minimal", "low", "medium", "high", "xhigh"]
                            .contains(&e.as_str()) =>
                    {
                        template_kwargs.insert("reasoning_effort".into(), v.clone());
                    }
                    // Reasoning comes back whole (as `reasoning_text`), never summarized.
                    ("summary" | "generate_summary", Value::String(_)) => {}
                    (k, v) => {
                        return Err(bad(
                            &format!("reasoning.{k}"),
                            format!("`reasoning.{k}` is not valid here (effort: none, minimal, low, medium, high or xhigh; summary: a string); got {v}"),
                        ))
                    }
                }
            }
            Value::Object(r.clone())
        }
        Some(v) => return Err(wrong_type("reasoning", "an object", v)),
    };
    let keep_alive = Json::value(&b.keep_alive)
        .map(|v| KeepAlive::from_request(v).map_err(|e| bad("keep_alive", e)))
        .transpose()?;

    let mut echo = Map::new();
    echo.insert("instructions".into(), instructions.map_or(Value::Null, Value::from));
    echo.insert("max_output_tokens".into(), json!(max_tokens));
    echo.insert("metadata".into(), metadata);
    echo.insert("parallel_tool_calls".into(), json!(parallel));
    echo.insert("previous_response_id".into(), previous_id.into());
    echo.insert("reasoning".into(), reasoning);
    echo.insert("store".into(), json!(store_it));
    // As sent (an f32 round trip would print 0.7 as 0.699999988…).
    let as_sent = |x: Option<f64>, default: f32| json!(x.unwrap_or(f64::from(default)));
    echo.insert("temperature".into(), as_sent(b.temperature.map(|n| n.0), defaults.temperature));
    echo.insert("text".into(), text_echo);
    echo.insert(
        "tool_choice".into(),
        Json::value(&b.tool_choice).cloned().unwrap_or(json!("auto")),
    );
    echo.insert(
        "tools".into(),
        tools
            .iter()
            .map(|t| {
                let mut f = t.definition["function"].clone();
                f["type"] = json!("function");
                f
            })
            .collect(),
    );
    echo.insert("top_logprobs".into(), json!(top_logprobs.unwrap_or(0)));
    echo.insert("top_p".into(), as_sent(b.top_p.map(|n| n.0), defaults.top_p));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("user".into(), b.user.map(|t| t.0).into());

    Ok(ParsedResponse {
        turn: Turn {
            max_tokens,
            keep_alive,
            sampling,
            logprobs: logprobs.then_some(top_logprobs.unwrap_or(0) as usize),
            response_format,
            tools,
            tool_choice,
            parallel_tool_calls: parallel,
            template_kwargs,
            ..Turn::new(model, Prompt::Messages(messages))
        },
        stream,
        store: store_it,
        conversation,
        echo,
        logprobs,
    })
}

/// `input`: a string (one user message) or a list of items.
fn input(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match v {
        None => return Ok(vec![]),
        Some(Value::String(s)) => return Ok(vec![ChatMessage::new("user", s.clone())]),
        Some(Value::Array(l)) => l,
        Some(v) => return Err(wrong_type("input", "a string or a list of items", v)),
    };
    let mut out: Vec<ChatMessage> = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at = |f: &str| format!("input[{i}]{f}");
        let Value::Object(o) = item else { return Err(wrong_type(&at(""), "an object", item)) };
        let ty = match o.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(v) => return Err(wrong_type(&at(".type"), "a string", v)),
        };
        let text_field = |k: &str| match o.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(wrong_type(&at(&format!(".{k}")), "a string", v)),
            None => {
                Err(bad(&at(&format!(".{k}")), format!("`{}` is required", at(&format!(".{k}"))))
                    .code("missing_required_parameter"))
            }
        };
        match ty {
            "message" => {
                let role = match o.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "assistant")) => r,
                    Some("system" | "developer") => "system",
                    Some(r) => {
                        return Err(bad(
                            &at(".role"),
                            format!("`{}` `{r}` is not one of user, assistant, system, developer", at(".role")),
                        ))
                    }
                    None => {
                        return Err(bad(&at(".role"), format!("`{}` is required", at(".role")))
                            .code("missing_required_parameter"))
                    }
                };
                let content = content(o.get("content"), &at(".content"))?;
                out.push(ChatMessage::new(role, content));
            }
            "function_call" => {
                let call_id = text_field("call_id")?;
                let name = text_field("name")?;
                let arguments = text_field("arguments")?;
                push_call(&mut out, json!(call_id), json!(name), &arguments);
            }
            "function_call_output" => {
                let call_id = text_field("call_id")?;
                let output = match o.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content(Some(v), &at(".output"))?,
                    Some(v) => return Err(wrong_type(&at(".output"), "a string or a list of text parts", v)),
                    None => {
                        return Err(bad(&at(".output"), format!("`{}` is required", at(".output")))
                            .code("missing_required_parameter"))
                    }
                };
                let mut m = ChatMessage::new("tool", output);
                m.tool_call_id = Some(call_id);
                out.push(m);
            }
            // Earlier reasoning is not shown to the model again (chat templates drop it too).
            "reasoning" => {}
            t => {
                return Err(bad(
                    &at(".type"),
                    format!("`{}` `{t}` is not supported (message, function_call, function_call_output and reasoning are)", at(".type")),
                )
                .code("unsupported_value"))
            }
        }
    }
    Ok(out)
}

/// A function call into the conversation: it belongs to the assistant message it follows
/// (or to the calls before it), else it starts one. Templates `tojson` the arguments: an
/// object when they parse as one, the text as sent otherwise.
pub(super) fn push_call(out: &mut Vec<ChatMessage>, call_id: Value, name: Value, arguments: &str) {
    let args = match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::from(arguments),
    };
    let call =
        json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}});
    match out.last_mut() {
        Some(m) if m.role == "assistant" => m.tool_calls.push(call),
        _ => {
            let mut m = ChatMessage::new("assistant", "");
            m.tool_calls.push(call);
            out.push(m);
        }
    }
}

/// A message's content: a string or text parts (`input_text`, `output_text`, `refusal`).
fn content(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let here = format!("{at}[{j}]");
                match (p.get("type").and_then(Value::as_str), p.get("text"), p.get("refusal")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t)), _)
                    | (Some("refusal"), _, Some(Value::String(t))) => out.push_str(t),
                    (Some(t @ ("input_image" | "input_file" | "input_audio")), ..) => {
                        return Err(bad(
                            &here,
                            format!("`{here}`: `{t}` is not supported: this server runs text-only models"),
                        )
                        .code("unsupported_value"))
                    }
                    _ => return Err(bad(&here, format!("`{here}` must be a text part (input_text or output_text)"))),
                }
            }
            Ok(out)
        }
        Some(v) => Err(wrong_type(at, "a string or a list of content parts", v)),
        None => Err(bad(at, format!("`{at}` is required")).code("missing_required_parameter")),
    }
}

/// `include`: what to add to the answer. Logprobs are honoured; encrypted reasoning has
/// nothing to carry (reasoning comes back as plain `reasoning_text`, and is not shown to the
/// model again), so asking for it is accepted and adds nothing.
fn include(v: Option<&Value>) -> Result<bool, ApiError> {
    let Some(v) = v else { return Ok(false) };
    let Value::Array(list) = v else { return Err(wrong_type("include", "a list of strings", v)) };
    let mut logprobs = false;
    for (i, x) in list.iter().enumerate() {
        match x.as_str() {
            Some("message.output_text.logprobs") => logprobs = true,
            Some("reasoning.encrypted_content") => {}
            _ => {
                return Err(bad(
                    &format!("include[{i}]"),
                    format!("`include[{i}]` {x} is not supported (message.output_text.logprobs and reasoning.encrypted_content are)"),
                )
                .code("unsupported_value"))
            }
        }
    }
    Ok(logprobs)
}

/// `tool_choice`: `auto`, `none`, `required`, or `{"type": "function", "name": …}`.
fn tool_choice(v: Option<&Value>, tools: &[crate::chat::Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("`tool_choice` `{other}` is not one of auto, none, required, or {{\"type\": \"function\", \"name\": …}}"),
                ))
            }
        },
        Some(Value::Object(o)) => match (o.get("type").and_then(Value::as_str), o.get("name")) {
            (Some("function"), Some(Value::String(n))) => {
                if !tools.iter().any(|t| &t.name == n) {
                    return Err(bad(
                        "tool_choice",
                        format!("`tool_choice` names `{n}`, which is not among the tools offered"),
                    ));
                }
                ToolChoice::Named(n.clone())
            }
            (Some(t), _) if t != "function" => {
                return Err(bad(
                    "tool_choice.type",
                    format!("`tool_choice.type` `{t}` is not supported (only function tools run here)"),
                )
                .code("unsupported_value"))
            }
            _ => {
                return Err(bad("tool_choice.name", "`tool_choice.name` is required")
                    .code("missing_required_parameter"))
            }
        },
        Some(v) => return Err(wrong_type("tool_choice", "a string or an object", v)),
    };
    if tools.is_empty() && choice == ToolChoice::Required {
        return Err(bad("tool_choice", "`tool_choice` `required` needs `tools`"));
    }
    Ok(choice)
}

/// `text`: `format` (`text`, `json_object`, or `json_schema` with the schema's fields beside
/// the type) and `verbosity`, which only tunes OpenAI's own models: accepted, it changes
/// nothing here. Returns the format and the `text` a response object repeats.
fn text(v: Option<&Value>) -> Result<(ResponseFormat, Value), ApiError> {
    let default = json!({"format": {"type": "text"}});
    let Some(v) = v else { return Ok((ResponseFormat::Text, default)) };
    let Value::Object(o) = v else { return Err(wrong_type("text", "an object", v)) };
    for (k, x) in o {
        match k.as_str() {
            "format" => {}
            "verbosity" if x.is_null() || matches!(x.as_str(), Some("low" | "medium" | "high")) => {
            }
            "verbosity" => {
                return Err(bad(
                    "text.verbosity",
                    format!("`text.verbosity` must be low, medium or high; got {x}"),
                ))
            }
            _ => {
                return Err(bad(
                    &format!("text.{k}"),
                    format!("`text.{k}` is not a field of `text`"),
                )
                .code("unknown_parameter"))
            }
        }
    }
    let format = match o.get("format") {
        None | Some(Value::Null) => ResponseFormat::Text,
        Some(Value::Object(f)) => match f.get("type").and_then(Value::as_str) {
            Some("text") => ResponseFormat::Text,
            Some("json_object") => ResponseFormat::JsonObject,
            Some("json_schema") => {
                let mut rest = f.clone();
                rest.remove("type");
                json_schema_fields(&rest, "text.format")?
            }
            Some(t) => {
                return Err(bad(
                    "text.format.type",
                    format!("`text.format.type` `{t}` is not supported (text, json_object, json_schema are)"),
                )
                .code("unsupported_value"))
            }
            None => {
                return Err(bad("text.format.type", "`text.format.type` is required")
                    .code("missing_required_parameter"))
            }
        },
        Some(v) => return Err(wrong_type("text.format", "an object", v)),
    };
    let mut echo = v.clone();
    if echo.get("format").is_none_or(Value::is_null) {
        echo["format"] = json!({"type": "text"});
    }
    Ok((format, echo))
}

pub mod types;
