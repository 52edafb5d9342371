//! Request bodies of Ollama's `/api/chat` and `/api/generate`: read into their types
//! (`request/types.rs`), then into a `Turn`; every refusal names its field, and an option Perch
//! cannot honour is refused, never ignored (docs/ollama.md).

use serde_json::{Map, Value};

use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{KeepAlive, ModelRef, Prompt, ResponseFormat, Turn};
use crate::server::body::{self, wrong_type, Body};
use crate::server::error::ApiError;
use crate::server::field::{self, Flag, Json, Num, Text, Words};
use types::{ChatRequest, GenerateRequest, Options};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Generate,
}

pub struct ParsedOllama {
    /// `None`: a load or unload request (no messages, or an empty prompt), nothing to generate.
    pub turn: Option<Turn>,
    pub model: ModelRef,
    pub keep_alive: Option<KeepAlive>,
    /// Ollama streams unless told not to.
    pub stream: bool,
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

pub fn parse(
    endpoint: Endpoint,
    bytes: &[u8],
    defaults: &SamplingDefaults,
) -> Result<ParsedOllama, ApiError> {
    let mut map = body::object(bytes)?;
    types::check(endpoint, &mut map)?;
    match map.get_mut("options") {
        None => {}
        Some(Value::Object(o)) => types::check_options(o)?,
        Some(v) => return Err(wrong_type("options", "an object", v)),
    }
    let (shared, input) = match endpoint {
        Endpoint::Chat => {
            let b: ChatRequest = field::typed_fields(map, Words::OpenAi)?;
            let input =
                Input::Chat { messages: b.messages.map(|j| j.0), tools: b.tools.map(|j| j.0) };
            (shared!(b), input)
        }
        Endpoint::Generate => {
            let b: GenerateRequest = field::typed_fields(map, Words::OpenAi)?;
            for (refused, v) in [
                ("images", &b.images),
                ("suffix", &b.suffix),
                ("template", &b.template),
                ("context", &b.context),
            ] {
                if Json::value(v).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
                    let why = match refused {
                        "images" => "images are not supported: this server runs text-only models",
                        "suffix" => "fill-in-the-middle (`suffix`) is not supported",
                        "template" => {
                            "a per-request template is not supported: the model's own is used"
                        }
                        _ => "`context` (the deprecated token context) is not supported: send the conversation",
                    };
                    return Err(
                        bad(refused, format!("`{refused}`: {why}")).code("unsupported_parameter")
                    );
                }
            }
            let input = Input::Generate {
                prompt: b.prompt.map(|t| t.0),
                system: b.system.map(|t| t.0),
                raw: Flag::get(b.raw),
            };
            (shared!(b), input)
        }
    };
    turn(shared, input, defaults)
}

/// The fields both endpoints share.
struct Shared {
    model: Option<Text>,
    format: Option<Value>,
    options: Option<Options>,
    stream: Option<Flag>,
    keep_alive: Option<Value>,
    think: Option<Value>,
}

macro_rules! shared {
    ($b:ident) => {
        Shared {
            model: $b.model,
            format: $b.format.map(|j| j.0),
            options: $b.options,
            stream: $b.stream,
            keep_alive: $b.keep_alive.map(|j| j.0),
            think: $b.think.map(|j| j.0),
        }
    };
}
use shared;

/// What each endpoint's prompt is made of.
enum Input {
    Chat { messages: Option<Value>, tools: Option<Value> },
    Generate { prompt: Option<String>, system: Option<String>, raw: bool },
}

fn turn(b: Shared, input: Input, defaults: &SamplingDefaults) -> Result<ParsedOllama, ApiError> {
    let name = match &b.model {
        Some(Text(s)) if !s.is_empty() => s.as_str(),
        _ => {
            return Err(bad("model", "`model` is required (see GET /api/tags)")
                .code("missing_required_parameter"))
        }
    };
    // Ollama's clients name models `name:tag`; Perch's ids have no tag, so `:latest` is the id.
    let model: ModelRef = name
        .strip_suffix(":latest")
        .unwrap_or(name)
        .parse()
        .map_err(|e: crate::runtime::ModelRefError| bad("model", e.to_string()))?;
    let keep_alive = b
        .keep_alive
        .as_ref()
        .map(|v| KeepAlive::from_request(v).map_err(|e| bad("keep_alive", e)))
        .transpose()?;
    let stream = b.stream.is_none_or(|s| s.0);
    let (prompt, tools) = match input {
        Input::Chat { messages, tools } => {
            let prompt = match messages {
                None => None,
                Some(Value::Array(list)) if list.is_empty() => None,
                Some(Value::Array(list)) => Some(Prompt::Messages(self::messages(&list)?)),
                Some(v) => return Err(wrong_type("messages", "an array", &v)),
            };
            let mut tool_fields = Map::new();
            if let Some(t) = tools {
                tool_fields.insert("tools".into(), t);
            }
            (prompt, crate::server::openai::tools::parse(&Body(&tool_fields))?)
        }
        Input::Generate { prompt, system, raw } => {
            let prompt = match prompt {
                None => None,
                Some(p) if p.is_empty() => None,
                Some(p) if raw => {
                    if system.is_some() {
                        return Err(bad("system", "`system` cannot go with `raw: true`"));
                    }
                    Some(Prompt::Text(p))
                }
                // Not raw: the prompt is a user message under the model's chat template.
                Some(p) => {
                    let mut m: Vec<ChatMessage> =
                        system.into_iter().map(|s| ChatMessage::new("system", s)).collect();
                    m.push(ChatMessage::new("user", p));
                    Some(Prompt::Messages(m))
                }
            };
            (prompt, crate::server::openai::tools::parse(&Body(&Map::new()))?)
        }
    };
    let Some(prompt) = prompt else {
        return Ok(ParsedOllama { turn: None, model, keep_alive, stream });
    };
    let o = b.options.unwrap_or_default();
    let sampling = SamplingParams {
        temperature: Num::get(o.temperature, defaults.temperature),
        // Ollama's top_p 0 means "off", like 1.
        top_p: o.top_p.filter(|p| p.0 > 0.0).map_or(defaults.top_p, |p| p.0 as f32),
        top_k: o.top_k.map_or(0, |k| k.0 as u32),
        min_p: Num::get(o.min_p, 0.0),
        repetition_penalty: o.repeat_penalty.filter(|p| p.0 > 0.0).map_or(1.0, |p| p.0 as f32),
        presence_penalty: Num::get(o.presence_penalty, 0.0),
        frequency_penalty: Num::get(o.frequency_penalty, 0.0),
        seed: o.seed.map(|s| s.0 as u64),
        ..SamplingParams::default()
    };
    // Ollama: -1 is "until the context is full", -2 "fill the context".
    let max_tokens = match o.num_predict.map(|n| n.0) {
        None | Some(-1) | Some(-2) => None,
        Some(n) if n >= 1 => Some(n as usize),
        Some(n) => {
            return Err(bad(
                "options.num_predict",
                format!("`options.num_predict` must be -1, -2 or at least 1; got {n}"),
            ))
        }
    };
    let stop = match Json::value(&o.stop) {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(l)) if l.len() <= 16 && l.iter().all(Value::is_string) => {
            l.iter().filter_map(|s| s.as_str().map(String::from)).collect()
        }
        Some(v) => {
            return Err(bad(
                "options.stop",
                format!("`options.stop` must be up to 16 strings; got {v}"),
            ))
        }
    };
    let response_format = match &b.format {
        None => ResponseFormat::Text,
        Some(Value::String(f)) if f == "json" => ResponseFormat::JsonObject,
        Some(Value::String(f)) if f.is_empty() => ResponseFormat::Text,
        Some(s @ Value::Object(_)) => ResponseFormat::JsonSchema(s.clone()),
        Some(v) => {
            return Err(bad(
                "format",
                format!("`format` must be \"json\" or a JSON schema; got {v}"),
            ))
        }
    };
    let mut template_kwargs = Map::new();
    match &b.think {
        None => {}
        Some(Value::Bool(t)) => {
            template_kwargs.insert("enable_thinking".into(), Value::Bool(*t));
        }
        Some(Value::String(e)) if ["low", "medium", "high"].contains(&e.as_str()) => {
            template_kwargs.insert("reasoning_effort".into(), Value::from(e.as_str()));
        }
        Some(v) => {
            return Err(bad(
                "think",
                format!("`think` must be a boolean or low, medium, high; got {v}"),
            ))
        }
    }
    Ok(ParsedOllama {
        turn: Some(Turn {
            max_tokens,
            sampling,
            stop,
            response_format,
            tools: tools.tools,
            template_kwargs,
            keep_alive,
            ..Turn::new(model.clone(), prompt)
        }),
        model,
        keep_alive,
        stream,
    })
}

/// Chat messages: `role`, `content`, an assistant's `tool_calls` (arguments as objects), a tool
/// result's `tool_name`; `images` refused, earlier `thinking` not shown to the model again.
fn messages(list: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |f: &str| format!("messages[{i}]{f}");
            let Value::Object(m) = m else { return Err(wrong_type(&at(""), "an object", m)) };
            let role = match m.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
                other => {
                    return Err(bad(
                        &at(".role"),
                        format!(
                            "`{}` must be system, user, assistant or tool; got {other:?}",
                            at(".role")
                        ),
                    ))
                }
            };
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(v) => return Err(wrong_type(&at(".content"), "a string", v)),
            };
            if m.get("images").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
                return Err(bad(
                    &at(".images"),
                    format!(
                        "`{}`: images are not supported: this server runs text-only models",
                        at(".images")
                    ),
                )
                .code("unsupported_parameter"));
            }
            let mut msg = ChatMessage::new(role, content);
            if role == "assistant" {
                msg.tool_calls = crate::server::openai::tools::history_calls(m, &at)?;
            }
            if let Some(Value::String(n)) = m.get("tool_name").or_else(|| m.get("name")) {
                msg.name = Some(n.clone());
            }
            Ok(msg)
        })
        .collect()
}

pub mod types;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(endpoint: Endpoint, v: Value) -> Result<ParsedOllama, ApiError> {
        parse(endpoint, v.to_string().as_bytes(), &SamplingDefaults::default())
    }

    #[test]
    fn options_map_onto_the_turn_and_unknown_ones_are_named() {
        let r = p(Endpoint::Chat, json!({"model": "qwen:latest", "stream": false, "keep_alive": "5m",
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "top_k": 5, "seed": 7, "num_predict": 9, "stop": ["x"], "repeat_penalty": 1.1, "num_ctx": 4096},
            "format": "json"})).unwrap();
        let t = r.turn.unwrap();
        assert_eq!(r.model.base, "qwen");
        assert!(!r.stream);
        assert_eq!((t.max_tokens, t.sampling.top_k, t.sampling.seed), (Some(9), 5, Some(7)));
        assert_eq!(t.stop, ["x"]);
        assert_eq!(t.response_format, ResponseFormat::JsonObject);
        assert!(t.keep_alive.is_some());
        for (body, field) in [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"mirostat": 2}}),
                "options.mirostat",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 9}}),
                "options.temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}),
                "messages[0].images",
            ),
            (json!({"model": "m", "messages": [], "hats": 1}), "hats"),
            (json!({"model": "m", "prompt": "x", "suffix": "y"}), "suffix"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "format": "xml"}),
                "format",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "soon"}),
                "keep_alive",
            ),
        ] {
            let e = p(
                if body.get("prompt").is_some() { Endpoint::Generate } else { Endpoint::Chat },
                body.clone(),
            )
            .err()
            .unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
        }
    }

    /// The typed fields refuse in the words Ollama's routes use ("`options.top_k` must be …").
    #[test]
    fn typed_fields_refuse_in_the_routes_words() {
        let chat = json!([{"role": "user", "content": "hi"}]);
        for (body, message, code) in [
            (
                json!({"model": "m", "messages": chat, "options": {"temperature": 9}}),
                "`options.temperature` must be from 0 to 2; got 9",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": chat, "options": {"top_k": "many"}}),
                "`options.top_k` must be an integer; got a string",
                "invalid_type",
            ),
            (
                json!({"model": "m", "messages": chat, "options": {"mirostat": 2}}),
                "`options.mirostat` is not supported (see docs/ollama.md for the options Perch reads)",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "messages": chat, "options": 3}),
                "`options` must be an object; got a number",
                "invalid_type",
            ),
            (json!({"model": "m", "hats": 1}), "`hats` is not a field Perch reads here", "unknown_parameter"),
            (json!({"model": "m", "stream": 1}), "`stream` must be a boolean; got a number", "invalid_type"),
        ] {
            let e = p(Endpoint::Chat, body.clone()).err().unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!((e.message.as_str(), e.code), (message, Some(code)), "{body}");
        }
        // A hint is accepted and changes nothing; `null` counts as absent.
        let r = p(
            Endpoint::Chat,
            json!({"model": "m", "messages": chat,
            "options": {"num_thread": 2, "temperature": null}, "think": null}),
        );
        assert!(r.is_ok());
    }

    #[test]
    fn an_empty_request_loads_or_unloads() {
        let r = p(Endpoint::Generate, json!({"model": "m", "keep_alive": 0})).unwrap();
        assert!(r.turn.is_none() && r.keep_alive == Some(KeepAlive::UnloadWhenIdle));
        let r = p(Endpoint::Chat, json!({"model": "m", "messages": []})).unwrap();
        assert!(r.turn.is_none() && r.stream);
    }
}
