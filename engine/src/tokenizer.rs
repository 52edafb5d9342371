//! Tokenizer (`tokenizer.json`), the model's chat template (`tokenizer_config.json`; rendered
//! by `chat::template`), end-of-sequence ids, and a streaming detokenizer.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::chat::{ChatMessage, ChatOptions, ChatTemplate, ToolFormat};
use crate::error::{EngineError, Result};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<ChatTemplate>,
    bos_token: Option<String>,
    /// Every id that ends a generation: config.json, generation_config.json and the
    /// tokenizer's own eos token.
    eos_ids: BTreeSet<u32>,
}

impl Tokenizer {
    /// The tokenizer files of model directory `dir`; `config_eos` are the end ids its
    /// `config.json` names (taken as an argument so this module needs nothing of `model`).
    pub fn load(dir: &Path, config_eos: &[u32]) -> Result<Tokenizer> {
        let file = dir.join("tokenizer.json");
        if !file.exists() {
            return Err(EngineError::Tokenizer(format!("{} is missing", file.display())));
        }
        let mut inner = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", file.display())))?;
        // A file may carry the truncation and padding it was exported with (sentence
        // encoders: 128 tokens, padded to 128): a prompt cut or padded silently is a wrong
        // answer, so Perch does its own truncating (and refuses where a protocol says so).
        inner.with_truncation(None).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        inner.with_padding(None);
        let tc = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
        let gen = read_json_if_exists(&dir.join("generation_config.json"))?;
        let token_text = |v: Option<&Value>| -> Option<String> {
            match v? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(String::from),
                _ => None,
            }
        };
        let chat_template = match tc.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default".
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(String::from)),
            _ => None,
        }
        .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        let bos_token = token_text(tc.get("bos_token"));
        let eos_token = token_text(tc.get("eos_token"));
        let chat_template = chat_template.map(|source| ChatTemplate {
            source,
            bos_token: bos_token.clone().unwrap_or_default(),
            eos_token: eos_token.clone().unwrap_or_default(),
        });

        let mut eos_ids: BTreeSet<u32> = config_eos.iter().copied().collect();
        if let Some(ids) = gen.get("eos_token_id") {
            match ids {
                Value::Number(n) => eos_ids.extend(n.as_u64().map(|n| n as u32)),
                Value::Array(l) => {
                    eos_ids.extend(l.iter().filter_map(|v| v.as_u64()).map(|n| n as u32))
                }
                _ => {}
            }
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.insert(id);
        }
        Ok(Tokenizer { inner, chat_template, bos_token, eos_ids })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// `content` (ids without special tokens) wrapped in the special tokens the tokenizer's
    /// post-processor adds to one sequence (BERT's `[CLS] … [SEP]`).
    pub fn with_specials(&self, content: &[u32]) -> Result<Vec<u32>> {
        let tokens = content
            .iter()
            .map(|&id| {
                let value = self.inner.id_to_token(id).unwrap_or_default();
                tokenizers::Token::new(id, value, (0, 0))
            })
            .collect();
        let enc = tokenizers::Encoding::from_tokens(tokens, 0);
        let enc = self
            .inner
            .post_process(enc, None, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// How many special tokens `with_specials` adds.
    pub fn specials_added(&self) -> Result<usize> {
        Ok(self.with_specials(&[])?.len())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The tokenizer as `tokenizer.json` text (what grammar engines read the vocabulary from).
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// The token a generation may start from when the prompt is empty: BOS if the model has
    /// one, else its first EOS (GPT-2's `<|endoftext|>` separates documents the same way).
    pub fn start_token(&self) -> Option<u32> {
        self.bos_token
            .as_deref()
            .and_then(|b| self.inner.token_to_id(b))
            .or_else(|| self.eos_ids.iter().next().copied())
    }

    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.iter().copied().collect()
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Render `messages` through the model's chat template, ending with the assistant's
    /// turn opened when `add_generation_prompt`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(messages, add_generation_prompt, &ChatOptions::default())
    }

    /// `apply_chat_template` with tools and template keyword arguments.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| EngineError::Template("this model has no chat template".into()))?
            .render(messages, add_generation_prompt, options)
    }

    /// How this model writes tool calls, from what its chat template shows it.
    pub fn tool_format(&self) -> ToolFormat {
        self.chat_template
            .as_ref()
            .map_or(ToolFormat::Generic, |t| ToolFormat::of_template(&t.source))
    }

    /// Tokens for a chat: the rendered template already holds any BOS text, so special tokens
    /// are not added a second time. A model without a template (a base model) gets the
    /// messages' text in order, separated by blank lines, as a plain prompt to continue.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, &ChatOptions::default(), "")
    }

    /// `encode_chat` with tools and keyword arguments, and `answer_start` written after the
    /// generation prompt (the opening of a forced tool call).
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
        answer_start: &str,
    ) -> Result<Vec<u32>> {
        Ok(self.encode_chat_rendered(messages, options, answer_start)?.0)
    }

    /// `encode_chat_with`, and the text the template rendered (`None` without a template).
    pub fn encode_chat_rendered(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
        answer_start: &str,
    ) -> Result<(Vec<u32>, Option<String>)> {
        if self.chat_template.is_none() {
            if !options.tools.is_empty() {
                return Err(EngineError::BadField {
                    field: "tools",
                    msg: "`tools`: this model has no chat template, so it cannot be shown tools"
                        .into(),
                });
            }
            let text: Vec<&str> =
                messages.iter().map(|m| m.content.as_str()).filter(|c| !c.is_empty()).collect();
            return Ok((self.encode(&format!("{}\n\n", text.join("\n\n")), true)?, None));
        }
        let text = self.apply_chat_template_with(messages, true, options)?;
        let text = format!("{text}{answer_start}");
        Ok((self.encode(&text, false)?, Some(text)))
    }

    /// The chat template's source, if the model has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_ref().map(|t| t.source.as_str())
    }
}

fn read_json_if_exists(path: &Path) -> Result<Value> {
    if !path.exists() {
        return Ok(Value::Null);
    }
    let text = std::fs::read_to_string(path).map_err(EngineError::io(path))?;
    serde_json::from_str(&text)
        .map_err(|e| EngineError::Config { file: path.to_path_buf(), msg: e.to_string() })
}

/// Turns a stream of token ids into text pieces that are always whole UTF-8 and never held
/// back longer than needed.
///
/// Decoding one token at a time is wrong for byte-level and SentencePiece vocabularies (a
/// character can span tokens; a leading-space marker depends on context), so each step
/// decodes a short window: the tokens since the last emitted piece plus the ones before it as
/// context, and emits only what the new tokens added. A trailing U+FFFD means an incomplete
/// character: wait for the next token.
pub struct StreamDecoder {
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder { tokens: Vec::new(), prefix_offset: 0, read_offset: 0 }
    }

    /// Add one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.tokens.push(id);
        let prefix = tok.decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.tokens[self.prefix_offset..])?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still pending at the end of a generation (a dangling partial character
    /// comes out as U+FFFD rather than being lost).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let prefix = tok.decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.tokens[self.prefix_offset..])?;
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        Ok(full.get(prefix.len()..).unwrap_or("").to_string())
    }
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}
