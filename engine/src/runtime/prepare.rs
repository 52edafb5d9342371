//! A turn's prompt made ready for its model, off the async threads: messages rendered through
//! the chat template (with the tools offered and any forced call's opening), checked against
//! the vocabulary and context; the splitter that reads tool calls back out of the answer; and
//! the grammar the answer is decoded against (a forced call, a `json_schema`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

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
    let Asked { prompt, tools, choice, kwargs, format, parallel } = asked;
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
                let s = CallSplitter::new(call_format, names, opened);
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

/// How long rendering and tokenizing one prompt may take, its wait for a place included,
/// before the turn fails (the work is bounded anyway, by the template's fuel and the body cap).
pub const PREPARE_DEADLINE: Duration = Duration::from_secs(30);

/// Preparations that run at once. Tokenizing a large body briefly takes far more memory than
/// the body (3 MiB of text peaked near 520 MB), so a burst of large requests must queue here
/// rather than all tokenize together before the gate's queue limit can apply.
pub const PREPARE_AT_ONCE: usize = 2;

/// The bounded pool every prompt preparation goes through (turns and `count_tokens` alike):
/// `PREPARE_AT_ONCE` at a time on the blocking threads, at most `max_waiting` waiting (more
/// are told the server is busy), each within `PREPARE_DEADLINE`.
pub struct Preparing {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
    deadline: Duration,
}

impl Preparing {
    pub fn new(at_once: usize, max_waiting: usize) -> Preparing {
        Preparing::with_deadline(at_once, max_waiting, PREPARE_DEADLINE)
    }

    fn with_deadline(at_once: usize, max_waiting: usize, deadline: Duration) -> Preparing {
        Preparing {
            slots: Arc::new(Semaphore::new(at_once.max(1))),
            waiting: AtomicUsize::new(0),
            max_waiting,
            deadline,
        }
    }

    /// Run `work` off the async threads once a place is free.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let waited = self.waiting.fetch_add(1, Ordering::SeqCst);
        let done = async {
            if waited >= self.max_waiting {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                return Err(EngineError::Busy(waited));
            }
            let permit = self.slots.clone().acquire_owned().await;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            let permit = permit.map_err(|e| EngineError::Internal(e.to_string()))?;
            // The place is held until the work itself ends, even past the deadline: a render
            // that overran still uses its memory.
            let work = tokio::task::spawn_blocking(move || {
                let r = work();
                drop(permit);
                r
            });
            match work.await {
                Ok(r) => r,
                Err(e) => Err(EngineError::Internal(format!("preparing failed: {e}"))),
            }
        };
        match tokio::time::timeout(self.deadline, done).await {
            Ok(r) => r,
            Err(_) => Err(EngineError::PrepareDeadline(self.deadline.as_secs())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn preparations_run_two_at_a_time_and_a_full_wait_is_busy() {
        let pool = Arc::new(Preparing::new(2, 3));
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut runs = vec![];
        for _ in 0..5 {
            let (pool, now, peak) = (pool.clone(), now.clone(), peak.clone());
            runs.push(tokio::spawn(async move {
                pool.run(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(50));
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Two run, three wait: a sixth finds no room.
        let sixth = pool.run(|| Ok(())).await;
        assert!(matches!(sixth, Err(EngineError::Busy(_))), "{sixth:?}");
        for r in runs {
            r.await.unwrap().unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2, "more than two preparations ran at once");
    }

    #[tokio::test]
    async fn the_deadline_counts_the_wait() {
        let pool = Arc::new(Preparing::with_deadline(1, 4, Duration::from_millis(100)));
        let busy = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(|| {
                    std::thread::sleep(Duration::from_millis(400));
                    Ok(())
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let late = pool.run(|| Ok(())).await;
        assert!(matches!(late, Err(EngineError::PrepareDeadline(_))), "{late:?}");
        assert!(matches!(busy.await.unwrap(), Err(EngineError::PrepareDeadline(_))));
    }
}
