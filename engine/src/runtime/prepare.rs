//! A turn's prompt made ready for its model, off the async threads: messages rendered through
//! the chat template (with the tools offered and any forced call's opening), checked against
//! the vocabulary and context; the splitter that reads tool calls back out of the answer; and
//! the grammar the answer is decoded against (a forced call, a `json_schema`).

use super::engine::ModelInfo;
use crate::chat::{
    CallSplitter, ChatMessage, ChatOptions, ForcedGrammar, ThinkSplitter, Tool, ToolChoice,
};
use crate::decode::constraint::{Constraint, GrammarError};
use crate::decode::context_room;
use crate::error::{EngineError, Result};

/// What the model continues.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Tokenized as is (with the model's start token).
    Text(String),
    Tokens(Vec<u32>),
}

/// The shape of the output.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResponseFormat {
    #[default]
    Text,
    /// One JSON object (generation ends when it is complete).
    JsonObject,
    /// JSON valid against this schema, enforced by constrained decoding.
    JsonSchema(serde_json::Value),
}

/// What the turn asked for, as far as the prompt and the output's shape go.
pub(crate) struct Asked {
    pub prompt: Prompt,
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    pub format: ResponseFormat,
    /// `parallel_tool_calls`: several calls may be made in one answer.
    pub parallel: bool,
    /// Calls written outside the template's format are read back (the engine's
    /// `tool_call_recovery`; never with `tool_choice` `none`, where no call is read at all).
    pub recover: bool,
}

pub(crate) struct Prepared {
    pub ids: Vec<u32>,
    /// With tools offered: reads the calls out of the answer.
    pub calls: Option<CallSplitter>,
    /// With a template that thinks: reads the reasoning out of the answer.
    pub think: Option<ThinkSplitter>,
    pub constraint: Option<Constraint>,
}

pub(crate) fn prepare(info: &ModelInfo, asked: Asked) -> Result<Prepared> {
    let tok = &info.tokenizer;
    let Asked { prompt, tools, choice, kwargs, format, parallel, recover } = asked;
    let (mut splitter, mut think) = (None, None);
    let mut constraint = match &format {
        ResponseFormat::JsonSchema(schema) => {
            Some(grammar(info, schema).map_err(|e| EngineError::BadField {
                field: "response_format.json_schema.schema",
                msg: format!("`response_format.json_schema.schema`: {e}"),
            })?)
        }
        // Any one JSON object: the same grammar engine, with the schema that says only that.
        ResponseFormat::JsonObject => Some(
            grammar(info, &serde_json::json!({"type": "object"}))
                .map_err(|e| EngineError::BadField { field: "response_format", msg: e })?,
        ),
        ResponseFormat::Text => None,
    };
    let mut ids = match prompt {
        Prompt::Messages(m) => {
            let call_format = tok.tool_format();
            let offered = !tools.is_empty() && choice != ToolChoice::None;
            let only = match &choice {
                ToolChoice::Named(n) => Some(n.as_str()),
                _ => None,
            };
            // A forced call opens in the prompt; the model writes the call object, decoded
            // against the schema of a call to an allowed tool with valid arguments.
            let forced = match &choice {
                ToolChoice::Required | ToolChoice::Named(_) if offered => {
                    let forced = call_format.forced(&tools, only, parallel).ok_or_else(|| EngineError::BadField {
                        field: "tool_choice",
                        msg: format!(
                            "`tool_choice` that forces a call is not supported for this model's tool-call format ({call_format:?}); use \"auto\""
                        ),
                    })?;
                    if constraint.is_some() {
                        return Err(EngineError::BadField {
                            field: "response_format",
                            msg: "`response_format` `json_object` or `json_schema` cannot be combined with a `tool_choice` that forces a call".into(),
                        });
                    }
                    let compiled = match &forced.grammar {
                        ForcedGrammar::Schema(schema) => grammar(info, schema),
                        ForcedGrammar::Lark(lark) => {
                            check(info.grammars.lark(&info.tokenizer, info.vocab_size, lark))
                        }
                    };
                    constraint = Some(compiled.map_err(|e| EngineError::BadField {
                        field: "tools",
                        msg: format!("a tool's `parameters` cannot be enforced: {e}"),
                    })?);
                    Some(forced.prefix)
                }
                _ => None,
            };
            let options = ChatOptions {
                tools: if offered {
                    tools.iter().map(|t| t.definition.clone()).collect()
                } else {
                    vec![]
                },
                kwargs,
            };
            if offered {
                let names = tools.iter().map(|t| t.name.clone()).collect();
                let opened = forced.filter(|p| !p.is_empty());
                let mut s = CallSplitter::new(call_format, names, opened)
                    .after_calls(crate::chat::answered_calls(&m));
                // A forced call or a `response_format` is decoded under its grammar: the
                // answer is in the shape asked for, never a call in another format.
                if recover && forced.is_none() && constraint.is_none() {
                    s = s.recovering(crate::chat::Recovery::new(&tools));
                }
                splitter = Some(if parallel { s } else { s.one_call() });
            }
            let (ids, rendered) = tok.encode_chat_rendered(&m, &options, forced.unwrap_or(""))?;
            think =
                rendered.and_then(|p| ThinkSplitter::for_prompt(tok.chat_template_source()?, &p));
            ids
        }
        Prompt::Text(t) => tok.encode(&t, true)?,
        Prompt::Tokens(ids) => {
            if let Some(&token) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
                return Err(EngineError::TokenOutOfVocabulary { token, vocab: info.vocab_size });
            }
            ids
        }
    };
    if ids.is_empty() {
        ids.extend(tok.start_token());
    }
    context_room(ids.len(), info.context_length)?;
    Ok(Prepared { ids, calls: splitter, think, constraint })
}

/// `schema` compiled for the model; a schema the engine cannot enforce is the caller's to
/// name, a vocabulary it cannot read is the model's fault (500).
fn grammar(info: &ModelInfo, schema: &serde_json::Value) -> Result<Constraint, String> {
    check(info.grammars.json_schema(&info.tokenizer, info.vocab_size, schema))
}

fn check(compiled: Result<Constraint, GrammarError>) -> Result<Constraint, String> {
    match compiled {
        Ok(c) => Ok(c),
        Err(GrammarError::Schema(e)) => Err(e),
        Err(GrammarError::Vocabulary(e)) => {
            Err(format!("this model's vocabulary cannot be constrained ({e})"))
        }
    }
}
