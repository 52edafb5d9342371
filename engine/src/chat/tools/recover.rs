//! Tool calls a model wrote outside its template's format, read back as calls. Small models
//! often print a call as a ```json block, a bare object, or in another family's markup
//! (`<tool_call>`, `<function=…>`, `[TOOL_CALLS]`, `<|python_tag|>`, DeepSeek's markers);
//! an agent then sees text and stops. Such text becomes a call only when it names an offered
//! tool and its arguments validate against that tool's `parameters` schema; each recovery is
//! noted, so the response header and the request log say so (docs/api-fields.md).
//! The same place notes a call identical to one the conversation already made and answered:
//! the loop a small model falls into after a tool result, reported rather than cut.

use serde_json::Value;

use super::{call_of_value, parse_body, parse_xml_call, Tool, ToolFormat};

/// Where a recovered call was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// A ```json (or untagged ``` opening with `{`) code block.
    FencedJson,
    /// A JSON object in the text, with no markup.
    BareJson,
    /// `<tool_call>…</tool_call>`, from a template that does not teach it.
    TaggedCall,
    /// `<function=name><parameter=…>…</function>` without `<tool_call>` around it.
    XmlFunction,
    /// `<|python_tag|>` (Llama 3.x).
    PythonTag,
    /// `[TOOL_CALLS]` (Mistral).
    Mistral,
    /// `<｜tool▁calls▁begin｜>` (DeepSeek).
    DeepSeek,
}

impl Foreign {
    /// The name the response header and the request log give it.
    pub fn name(self) -> &'static str {
        match self {
            Foreign::FencedJson => "fenced-json",
            Foreign::BareJson => "bare-json",
            Foreign::TaggedCall => "tool-call-tags",
            Foreign::XmlFunction => "xml-function",
            Foreign::PythonTag => "python-tag",
            Foreign::Mistral => "mistral",
            Foreign::DeepSeek => "deepseek",
        }
    }
}

/// What the splitter noticed about a turn's calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolNote {
    /// A call was read from text written in this other format.
    Recovered(Foreign),
    /// The model called `name` with the same arguments as `earlier` calls before it in the
    /// conversation, each already answered by a tool result.
    Repeated { name: String, earlier: usize },
}

/// How a foreign call's text ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// At this text (which is not part of the call).
    At(&'static str),
    /// At the end of the answer.
    End,
    /// Where the JSON object that opens it closes.
    Object,
}

/// An opening of call markup that is not the template's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    pub kind: Foreign,
    pub open: &'static str,
    pub close: Close,
    /// Where the call's body starts, from the start of `open`.
    pub body_at: usize,
}

const MARKERS: &[Marker] = &[
    Marker { kind: Foreign::FencedJson, open: "```json", close: Close::At("```"), body_at: 7 },
    Marker { kind: Foreign::FencedJson, open: "```\n{", close: Close::At("```"), body_at: 4 },
    Marker {
        kind: Foreign::TaggedCall,
        open: "<tool_call>",
        close: Close::At("</tool_call>"),
        body_at: 11,
    },
    Marker {
        kind: Foreign::XmlFunction,
        open: "<function=",
        close: Close::At("</function>"),
        body_at: 0,
    },
    Marker { kind: Foreign::PythonTag, open: "<|python_tag|>", close: Close::End, body_at: 14 },
    Marker { kind: Foreign::Mistral, open: "[TOOL_CALLS]", close: Close::End, body_at: 12 },
    Marker {
        kind: Foreign::DeepSeek,
        open: "<｜tool▁calls▁begin｜>",
        close: Close::At("<｜tool▁calls▁end｜>"),
        body_at: 0,
    },
    Marker { kind: Foreign::BareJson, open: "{\"name\"", close: Close::Object, body_at: 0 },
];

/// The markers to watch for beside `native`'s own opening.
pub(super) fn markers(native: Option<&str>) -> Vec<Marker> {
    MARKERS.iter().copied().filter(|m| Some(m.open) != native).collect()
}

/// The offered tools, as recovery checks calls against them. A schema is compiled the first
/// time a recovered call needs it: most turns never do.
pub struct Recovery {
    tools: Vec<(String, Value)>,
    compiled: Vec<Option<Option<jsonschema::Validator>>>,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery").field("tools", &self.tools.len()).finish()
    }
}

impl Recovery {
    pub fn new(tools: &[Tool]) -> Recovery {
        let tools: Vec<(String, Value)> = tools
            .iter()
            .map(|t| {
                let schema = t.definition.pointer("/function/parameters").cloned();
                (t.name.clone(), schema.unwrap_or(Value::Bool(true)))
            })
            .collect();
        let compiled = tools.iter().map(|_| None).collect();
        Recovery { tools, compiled }
    }

    /// Whether `arguments` (a JSON object as text) is a valid call of the offered `name`. A
    /// schema that does not compile (or refers outside itself) validates nothing.
    pub fn accepts(&mut self, name: &str, arguments: &str) -> bool {
        let Some(i) = self.tools.iter().position(|(n, _)| n == name) else { return false };
        let Ok(args) = serde_json::from_str::<Value>(arguments) else { return false };
        let schema = &self.tools[i].1;
        let validator =
            self.compiled[i].get_or_insert_with(|| jsonschema::validator_for(schema).ok());
        validator.as_ref().is_some_and(|v| v.is_valid(&args))
    }

    /// The calls a foreign body holds, when there is at least one and every one is valid.
    pub(super) fn calls(&mut self, kind: Foreign, body: &str) -> Option<Vec<(String, String)>> {
        let body = body.trim();
        let calls = match kind {
            Foreign::FencedJson | Foreign::BareJson => json_calls(body)?,
            Foreign::TaggedCall if body.starts_with("<function=") => vec![parse_xml_call(body)?],
            Foreign::TaggedCall => json_calls(body)?,
            Foreign::XmlFunction => vec![parse_xml_call(body)?],
            Foreign::PythonTag => parse_body(ToolFormat::PythonTag, body)?,
            Foreign::Mistral => parse_body(ToolFormat::MistralArgs, body)?,
            Foreign::DeepSeek => parse_body(ToolFormat::DeepSeek, body)?,
        };
        let valid = !calls.is_empty() && calls.iter().all(|(n, a)| self.accepts(n, a));
        valid.then_some(calls)
    }
}

/// One or more call objects (one after another, or a list), in the shapes models print:
/// `{"name", "arguments"|"parameters"}`, OpenAI's `{"type": "function", "function": {…}}`,
/// and llama.cpp's generic `{"tool_call": {…}}` / `{"tool_calls": […]}`.
pub(super) fn json_calls(body: &str) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    for v in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
        match v.ok()? {
            Value::Array(list) => {
                for v in &list {
                    calls.push(loose_call(v)?);
                }
            }
            Value::Object(o) if o.contains_key("tool_calls") => {
                for v in o.get("tool_calls")?.as_array()? {
                    calls.push(loose_call(v)?);
                }
            }
            v => calls.push(loose_call(&v)?),
        }
    }
    Some(calls)
}

fn loose_call(v: &Value) -> Option<(String, String)> {
    match v.get("function").or_else(|| v.get("tool_call")) {
        Some(inner) if inner.is_object() => call_of_value(inner),
        _ => call_of_value(v),
    }
}

/// The calls an assistant already made in `messages` and that a tool result answered, as
/// (name, arguments) to compare new calls with.
pub fn answered_calls(messages: &[super::super::ChatMessage]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if m.role != "assistant" || !messages[i + 1..].iter().any(|r| r.role == "tool") {
            continue;
        }
        for c in &m.tool_calls {
            let f = c.get("function").unwrap_or(c);
            let Some(name) = f.get("name").and_then(Value::as_str) else { continue };
            let args = match f.get("arguments") {
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::Null),
                Some(a) => a.clone(),
                None => Value::Object(Default::default()),
            };
            out.push((name.to_string(), args));
        }
    }
    out
}
