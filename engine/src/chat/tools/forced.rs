//! A forced call (`tool_choice` `required` or a named function) in each format's own markup:
//! the text the prompt opens the answer with, and the grammar the rest of the call is decoded
//! against, so the model can only write a call to an allowed tool with valid arguments, the
//! way its template taught it to. The splitter then reads it back like any other call.

use serde_json::{json, Value};

use super::{Tool, ToolFormat};

/// What a forced call's answer starts with, and what it must continue with.
#[derive(Debug, Clone, PartialEq)]
pub struct Forced {
    /// Written by the prompt after the generation prompt (may be empty).
    pub prefix: &'static str,
    pub grammar: ForcedGrammar,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ForcedGrammar {
    /// The rest is one JSON document valid against this schema.
    Schema(Value),
    /// The rest is this Lark grammar (llguidance's dialect: `%json {…}` embeds a schema).
    Lark(String),
}

impl ToolFormat {
    /// The forced form of a call to one of `tools` (only to `only` when set); `None` where
    /// Perch cannot force this format (DeepSeek V3.1's bare `name<｜tool▁sep｜>{…}`, whose
    /// separator is a special token a text grammar cannot write).
    /// Only Mistral's list can hold several calls; `parallel` false holds it to one.
    pub fn forced(self, tools: &[Tool], only: Option<&str>, parallel: bool) -> Option<Forced> {
        let allowed: Vec<&Tool> =
            tools.iter().filter(|t| only.is_none_or(|n| n == t.name)).collect();
        let (prefix, grammar) = match self {
            // Qwen3-Coder's XML style is read inside the same tags, but forced as JSON: its
            // parameter values are free text that a JSON schema cannot hold to a type.
            ToolFormat::TaggedCall => {
                ("<tool_call>\n", ForcedGrammar::Schema(call_schema_of(&allowed, "arguments")))
            }
            ToolFormat::Mistral => {
                let mut list = json!({"type": "array", "minItems": 1,
                                      "items": call_schema_of(&allowed, "arguments")});
                if !parallel {
                    list["maxItems"] = 1.into();
                }
                ("[TOOL_CALLS]", ForcedGrammar::Schema(list))
            }
            // `[TOOL_CALLS]name[ARGS]{…}` (Mistral Small 3.2, Devstral, Ministral 3).
            ToolFormat::MistralArgs => {
                ("[TOOL_CALLS]", lark(&allowed, |name| format!("{name} \"[ARGS]\""), ""))
            }
            // Llama 3.x writes custom tools' calls as a bare `{"name", "parameters"}`.
            ToolFormat::PythonTag => {
                ("", ForcedGrammar::Schema(call_schema_of(&allowed, "parameters")))
            }
            ToolFormat::DeepSeek => (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
                lark(&allowed, |name| format!("{name} \"\\n```json\\n\""), " \"\\n```\""),
            ),
            ToolFormat::DeepSeekV31 => return None,
            ToolFormat::Generic => {
                ("", ForcedGrammar::Schema(call_schema_of(&allowed, "arguments")))
            }
        };
        Some(Forced { prefix, grammar })
    }
}

/// The JSON schema of one call object `{"name": …, <args_key>: …}` to one of `tools`, its
/// arguments held to that tool's `parameters`.
fn call_schema_of(tools: &[&Tool], args_key: &str) -> Value {
    let each: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, args_key: parameters(t)},
                "required": ["name", args_key],
                "additionalProperties": false
            })
        })
        .collect();
    match <[Value; 1]>::try_from(each) {
        Ok([one]) => one,
        Err(each) => json!({"anyOf": each}),
    }
}

fn parameters(t: &Tool) -> Value {
    match t.definition.pointer("/function/parameters") {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => json!({"type": "object"}),
    }
}

/// `start: call_0 | call_1 | …`, each `<head(name)> args_i <tail>` with the tool's parameters
/// as an embedded schema (written with json.dumps' separators, as the templates write them).
fn lark(tools: &[&Tool], head: impl Fn(&str) -> String, tail: &str) -> ForcedGrammar {
    let mut g = format!(
        "start: {}\n",
        (0..tools.len()).map(|i| format!("call_{i}")).collect::<Vec<_>>().join(" | ")
    );
    for (i, t) in tools.iter().enumerate() {
        // A JSON string literal is a Lark string literal (names are checked to be plain
        // identifiers when the request is parsed; quoting keeps any other one inert).
        let name = Value::from(t.name.as_str()).to_string();
        let mut schema = parameters(t);
        dumps_layout(&mut schema);
        g.push_str(&format!(
            "call_{i}: {} args_{i}{tail}\nargs_{i}: %json {schema}\n",
            head(&name)
        ));
    }
    ForcedGrammar::Lark(g)
}

/// Asks llguidance to write a schema's JSON as Python's json.dumps does (`", "`, `": "`, no
/// other whitespace): how templates render JSON, and no room for a model to pad forever.
pub fn dumps_layout(schema: &mut Value) {
    if let Value::Object(o) = schema {
        o.insert(
            "x-guidance".into(),
            json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}),
        );
    }
}
