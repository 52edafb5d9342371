//! Request bodies of Ollama's `/api/chat` and `/api/generate`, checked field by field; every
//! refusal names its field, and an option Perch cannot honour is refused, never ignored
//! (docs/ollama.md).

use serde_json::{Map, Value};

use crate::chat::ChatMessage;
use crate::config::SamplingDefaults;
use crate::decode::sampler::SamplingParams;
use crate::runtime::{KeepAlive, ModelRef, Prompt, ResponseFormat, Turn};
use crate::server::body::{self, wrong_type, Body};
use crate::server::error::ApiError;

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

const COMMON: &[&str] = &["model", "format", "options", "stream", "keep_alive", "think"];
const CHAT: &[&str] = &["messages", "tools"];
const GENERATE: &[&str] = &["prompt", "system", "raw", "suffix", "images", "template", "context"];

/// `options` Perch honours; hardware hints it sizes itself and accepts on purpose; and
/// samplers it does not have, refused by name.
const OPTIONS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "num_predict",
    "stop",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
];
pub(super) const HINTS: &[&str] = &[
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "vocab_only",
    "f16_kv",
    "num_keep",
    "repeat_last_n",
];

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

pub fn parse(
    endpoint: Endpoint,
    bytes: &[u8],
    defaults: &SamplingDefaults,
) -> Result<ParsedOllama, ApiError> {
    let map = &body::object(bytes)?;
    let own = if endpoint == Endpoint::Chat { CHAT } else { GENERATE };
    for (k, v) in map {
        if !v.is_null() && !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()) {
            return Err(
                bad(k, format!("`{k}` is not a field Perch reads here")).code("unknown_parameter")
            );
        }
    }
    let b = Body(map);
    let name = b.model("see GET /api/tags")?;
    // Ollama's clients name models `name:tag`; Perch's ids have no tag, so `:latest` is the id.
    let model: ModelRef = name
        .strip_suffix(":latest")
        .unwrap_or(name)
        .parse()
        .map_err(|e: crate::runtime::ModelRefError| bad("model", e.to_string()))?;
    let keep_alive = b.keep_alive()?;
    let stream = b.boolean("stream")?.unwrap_or(true);
    for refused in ["images", "suffix", "template", "context"] {
        if b.get(refused).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            let why = match refused {
                "images" => "images are not supported: this server runs text-only models",
                "suffix" => "fill-in-the-middle (`suffix`) is not supported",
                "template" => "a per-request template is not supported: the model's own is used",
                _ => "`context` (the deprecated token context) is not supported: send the conversation",
            };
            return Err(bad(refused, format!("`{refused}`: {why}")).code("unsupported_parameter"));
        }
    }
    let prompt = match endpoint {
        Endpoint::Chat => match b.get("messages") {
            None => None,
            Some(Value::Array(list)) if list.is_empty() => None,
            Some(Value::Array(list)) => Some(Prompt::Messages(messages(list)?)),
            Some(v) => return Err(wrong_type("messages", "an array", v)),
        },
        Endpoint::Generate => {
            let raw = b.boolean("raw")?.unwrap_or(false);
            let system = match b.get("system") {
                None => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(v) => return Err(wrong_type("system", "a string", v)),
            };
            match b.get("prompt") {
                None => None,
                Some(Value::String(p)) if p.is_empty() => None,
                Some(Value::String(p)) if raw => {
                    if system.is_some() {
                        return Err(bad("system", "`system` cannot go with `raw: true`"));
                    }
                    Some(Prompt::Text(p.clone()))
                }
                // Not raw: the prompt is a user message under the model's chat template.
                Some(Value::String(p)) => {
                    let mut m: Vec<ChatMessage> =
                        system.into_iter().map(|s| ChatMessage::new("system", s)).collect();
                    m.push(ChatMessage::new("user", p.clone()));
                    Some(Prompt::Messages(m))
                }
                Some(v) => return Err(wrong_type("prompt", "a string", v)),
            }
        }
    };
    let Some(prompt) = prompt else {
        return Ok(ParsedOllama { turn: None, model, keep_alive, stream });
    };
    let opts = match b.get("options") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => return Err(wrong_type("options", "an object", v)),
    };
    let o = Body(&opts);
    for (k, v) in &opts {
        if v.is_null() || OPTIONS.contains(&k.as_str()) || HINTS.contains(&k.as_str()) {
            continue;
        }
        return Err(bad(
            &format!("options.{k}"),
            format!(
                "`options.{k}` is not supported (see docs/ollama.md for the options Perch reads)"
            ),
        )
        .code("unsupported_parameter"));
    }
    let num = |k: &str, lo: f64, hi: f64| -> Result<Option<f32>, ApiError> {
        match o.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(Some(x as f32)),
                _ => Err(bad(
                    &format!("options.{k}"),
                    format!("`options.{k}` must be a number from {lo} to {hi}; got {v}"),
                )),
            },
        }
    };
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        match o.get(k) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                bad(&format!("options.{k}"), format!("`options.{k}` must be an integer; got {v}"))
            }),
        }
    };
    let top_p = num("top_p", 0.0, 1.0)?;
    let sampling = SamplingParams {
        temperature: num("temperature", 0.0, 2.0)?.unwrap_or(defaults.temperature),
        // Ollama's top_p 0 means "off", like 1.
        top_p: top_p.filter(|p| *p > 0.0).unwrap_or(defaults.top_p),
        top_k: match int("top_k")? {
            None => 0,
            Some(k) if (0..=i64::from(u32::MAX)).contains(&k) => k as u32,
            Some(k) => {
                return Err(bad(
                    "options.top_k",
                    format!("`options.top_k` must be 0 or more; got {k}"),
                ))
            }
        },
        min_p: num("min_p", 0.0, 1.0)?.unwrap_or(0.0),
        repetition_penalty: num("repeat_penalty", 0.0, 10.0)?.filter(|p| *p > 0.0).unwrap_or(1.0),
        presence_penalty: num("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: num("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        seed: int("seed")?.map(|s| s as u64),
        ..SamplingParams::default()
    };
    // Ollama: -1 is "until the context is full", -2 "fill the context".
    let max_tokens = match int("num_predict")? {
        None | Some(-1) | Some(-2) => None,
        Some(n) if n >= 1 => Some(n as usize),
        Some(n) => {
            return Err(bad(
                "options.num_predict",
                format!("`options.num_predict` must be -1, -2 or at least 1; got {n}"),
            ))
        }
    };
    let stop = match o.get("stop") {
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
    let response_format = match b.get("format") {
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
    match b.get("think") {
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
    let tools = crate::server::openai::tools::parse(&b)?;
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

    #[test]
    fn an_empty_request_loads_or_unloads() {
        let r = p(Endpoint::Generate, json!({"model": "m", "keep_alive": 0})).unwrap();
        assert!(r.turn.is_none() && r.keep_alive == Some(KeepAlive::UnloadWhenIdle));
        let r = p(Endpoint::Chat, json!({"model": "m", "messages": []})).unwrap();
        assert!(r.turn.is_none() && r.stream);
    }
}
