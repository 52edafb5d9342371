//! Constrained decoding through llguidance (Earley parsing over a lexer, with token masks
//! computed against the vocabulary's trie): a grammar, here a JSON schema, is compiled for the
//! model's vocabulary once per request, and at every step only the tokens that keep the output
//! inside the grammar may be chosen. Forced tool calls and `response_format` `json_schema` use
//! it; the generation ends when the grammar is complete.

use std::sync::{Arc, OnceLock};

use llguidance::api::{GrammarWithLexer, ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::chat::tools::dumps_layout;
use crate::tokenizer::Tokenizer;

/// Larger than any real vocabulary (the largest are ~260k tokens).
const MAX_VOCAB: usize = 1 << 22;

/// Per model: its vocabulary as llguidance sees it, built on first use (a trie over every
/// token's bytes; ~0.1–0.5 s for a 150k vocabulary) and kept.
#[derive(Default)]
pub struct Grammars(OnceLock<Result<Arc<ParserFactory>, String>>);

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Grammars(built)" } else { "Grammars" })
    }
}

/// Why a grammar could not be used.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarError {
    /// The model's vocabulary could not be read (its tokenizer, not the request, is at fault).
    Vocabulary(String),
    /// The schema is not one the engine can enforce (an unsupported keyword, a bad `$ref`, …).
    Schema(String),
}

impl Grammars {
    fn factory(&self, tok: &Tokenizer, vocab_size: usize) -> Result<Arc<ParserFactory>, String> {
        self.0
            .get_or_init(|| {
                let json: Value = serde_json::from_str(&tok.to_json().map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
                let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
                    .map_err(|e| format!("the vocabulary: {e}"))?;
                // The embedding may have more rows than the tokenizer has tokens: those ids
                // have no bytes and are never allowed. `vocab_size` comes from the model's
                // config.json (untrusted, and read before any weight is): bounded before
                // anything is allocated for it.
                if vocab_size > MAX_VOCAB {
                    return Err(format!(
                        "a vocabulary of {vocab_size} tokens (at most {MAX_VOCAB})"
                    ));
                }
                words.resize(vocab_size.max(words.len()), vec![]);
                // A model's files are untrusted: an end id outside the vocabulary is refused
                // here, not met as an out-of-range index while decoding.
                let eos = tok.eos_ids().first().copied().unwrap_or(0);
                if eos as usize >= words.len() {
                    return Err(format!(
                        "the end-of-sequence id {eos} is outside the vocabulary ({} tokens)",
                        words.len()
                    ));
                }
                let info = TokRxInfo::new(words.len() as u32, eos);
                let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                *f.limits_mut() = limits();
                Ok(Arc::new(f))
            })
            .clone()
    }

    /// A constraint that holds the output to `schema`'s JSON (written as Python's json.dumps
    /// writes it: `", "` and `": "`, no other whitespace, so a model cannot pad forever).
    pub fn json_schema(
        &self,
        tok: &Tokenizer,
        vocab_size: usize,
        schema: &Value,
    ) -> Result<Constraint, GrammarError> {
        let mut schema = schema.clone();
        dumps_layout(&mut schema);
        self.compile(tok, vocab_size, GrammarWithLexer::from_json_schema(schema))
    }

    /// A constraint that holds the output to a Lark grammar (llguidance's dialect, where
    /// `%json {…}` embeds a JSON schema): forced tool calls in formats that are not one JSON
    /// document.
    pub fn lark(
        &self,
        tok: &Tokenizer,
        vocab_size: usize,
        grammar: &str,
    ) -> Result<Constraint, GrammarError> {
        self.compile(tok, vocab_size, GrammarWithLexer::from_lark(grammar.to_string()))
    }

    fn compile(
        &self,
        tok: &Tokenizer,
        vocab_size: usize,
        grammar: GrammarWithLexer,
    ) -> Result<Constraint, GrammarError> {
        let factory = self.factory(tok, vocab_size).map_err(GrammarError::Vocabulary)?;
        let grammar = TopLevelGrammar { grammars: vec![grammar], max_tokens: None };
        let parser =
            factory.create_parser(grammar).map_err(|e| GrammarError::Schema(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Schema(e));
        }
        Ok(Constraint { matcher, eos: tok.eos_ids() })
    }
}

/// Bounds on the work one grammar may cost: schemas come from clients.
fn limits() -> ParserLimits {
    ParserLimits {
        max_grammar_size: 200_000,
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        ..ParserLimits::default()
    }
}

/// One generation's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Constraint {
    /// The tokens allowed next (end-of-sequence ids among them once the grammar may end).
    pub fn allowed(&mut self) -> Result<Allowed, String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        Ok(Allowed { mask, eos: self.eos.clone() })
    }

    /// `id` was chosen.
    pub fn consume(&mut self, id: u32) -> Result<(), String> {
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    /// The grammar is complete and nothing may follow: the generation ends here.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// A step's allowed tokens.
pub struct Allowed {
    mask: SimpleVob,
    eos: Vec<u32>,
}

impl Allowed {
    pub fn contains(&self, id: u32) -> bool {
        let may_end = self
            .eos
            .first()
            .is_some_and(|&e| (e as usize) < self.mask.len() && self.mask.is_allowed(e));
        if self.eos.contains(&id) {
            return may_end;
        }
        (id as usize) < self.mask.len() && self.mask.is_allowed(id)
    }
}

#[cfg(test)]
mod tests;
