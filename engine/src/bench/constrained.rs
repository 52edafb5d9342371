//! `perch bench --scenario constrained`: what a JSON-schema constraint costs. The same chat
//! prompt is answered under a schema (greedy, until the document closes) and without one (the
//! plain pipelined loop, the same number of tokens), alternating; then the constrained answer's
//! tokens are replayed through a fresh grammar to time the mask alone, per token.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use super::median;
use crate::chat::ChatMessage;
use crate::decode::constraint::{Constraint, Grammars};
use crate::decode::{generate, FinishReason, GenerateParams};
use crate::error::{EngineError, Result};
use crate::model::LoadedModel;

#[derive(Debug, Clone, Serialize)]
pub struct ConstrainedReport {
    pub model: String,
    pub vocab_size: usize,
    pub runs: usize,
    pub prompt_tokens: usize,
    /// Tokens of the constrained answer (the unconstrained run decodes as many).
    pub answer_tokens: usize,
    /// Every constrained answer parsed as JSON and ended by the grammar.
    pub answers_valid: bool,
    pub constrained_decode_tok_s: f64,
    pub unconstrained_decode_tok_s: f64,
    /// Constrained over unconstrained decode speed (medians).
    pub ratio: f64,
    /// The vocabulary's trie, built once per model on first use.
    pub vocabulary_build_ms: f64,
    /// Compiling the schema, once per request.
    pub grammar_compile_ms: f64,
    /// Computing one step's mask (and taking the chosen token), replayed alone.
    pub mask_mean_us: f64,
    pub mask_max_us: f64,
    /// The mean mask time as a share of one constrained decode step.
    pub mask_share_of_step: f64,
}

/// An invoice: nested objects, an array of objects, a pattern, a nullable field.
pub fn invoice_schema() -> Value {
    let string = json!({"type": "string"});
    json!({"type": "object", "properties": {
        "id": string,
        "customer": {"type": "object", "properties": {
            "name": string,
            "address": {"type": "object", "properties": {
                "street": string, "city": string,
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"], "additionalProperties": false}},
            "required": ["name", "address"], "additionalProperties": false},
        "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "sku": string, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
            "required": ["sku", "qty", "price"], "additionalProperties": false}},
        "paid": {"type": "boolean"},
        "notes": {"type": ["string", "null"]}},
        "required": ["id", "customer", "items", "paid", "notes"], "additionalProperties": false})
}

const ASK: &str = "Write the invoice INV-2041 for Grace Hopper, 1 Harbor Way, Arlington 22201: \
    two boxes of punch cards at 19.50, one relay at 240, twelve vacuum tubes at 0.75. Not paid \
    yet. Answer with the invoice as JSON.";

pub fn run(model: &LoadedModel, runs: usize, max_tokens: usize) -> Result<ConstrainedReport> {
    let runs = runs.max(1);
    let prompt = model.tokenizer.encode_chat(&[ChatMessage::new("user", ASK)])?;
    let schema = invoice_schema();
    let grammars = Grammars::default();
    let t = Instant::now();
    let first = compile(&grammars, model, &schema)?;
    let vocabulary_build = t.elapsed();
    let t = Instant::now();
    drop(compile(&grammars, model, &schema)?);
    let grammar_compile = t.elapsed();

    let constrained =
        |c: Constraint| GenerateParams { max_tokens, constraint: Some(c), ..Default::default() };
    // Untimed warm-up of both loops.
    generate(
        model,
        &prompt,
        &GenerateParams { max_tokens: 4, ..constrained(first) },
        None,
        |_| {},
    )?;
    let plain = |n: usize| GenerateParams { max_tokens: n, ignore_eos: true, ..Default::default() };
    generate(model, &prompt, &plain(4), None, |_| {})?;

    let (mut with, mut without, mut valid, mut answer) = (vec![], vec![], true, vec![]);
    for _ in 0..runs {
        let g = generate(
            model,
            &prompt,
            &constrained(compile(&grammars, model, &schema)?),
            None,
            |_| {},
        )?;
        valid &= g.finish_reason == FinishReason::Stop
            && serde_json::from_str::<Value>(&g.text).is_ok_and(|v| v.is_object());
        with.push(g.decode_tokens_per_sec());
        let u = generate(model, &prompt, &plain(g.tokens.len()), None, |_| {})?;
        without.push(u.decode_tokens_per_sec());
        answer = g.tokens;
    }

    // The mask alone: the answer's tokens through a fresh grammar.
    let mut c = compile(&grammars, model, &schema)?;
    let (mut total, mut max) = (Duration::ZERO, Duration::ZERO);
    for &id in &answer {
        let t = Instant::now();
        let allowed = c.allowed().map_err(EngineError::Internal)?;
        if !allowed.contains(id) {
            return Err(EngineError::Internal(format!("replay: token {id} refused")));
        }
        if !model.tokenizer.is_eos(id) {
            c.consume(id).map_err(EngineError::Internal)?;
        }
        let d = t.elapsed();
        (total, max) = (total + d, max.max(d));
    }
    let steps = answer.len().max(1) as f64;
    let (a, b) = (median(with), median(without));
    let mask_mean = total.as_secs_f64() / steps;
    Ok(ConstrainedReport {
        model: model.id.clone(),
        vocab_size: model.vocab_size,
        runs,
        prompt_tokens: prompt.len(),
        answer_tokens: answer.len(),
        answers_valid: valid,
        constrained_decode_tok_s: a,
        unconstrained_decode_tok_s: b,
        ratio: a / b.max(1e-9),
        vocabulary_build_ms: vocabulary_build.as_secs_f64() * 1e3,
        grammar_compile_ms: grammar_compile.as_secs_f64() * 1e3,
        mask_mean_us: mask_mean * 1e6,
        mask_max_us: max.as_secs_f64() * 1e6,
        mask_share_of_step: mask_mean * a,
    })
}

fn compile(grammars: &Grammars, model: &LoadedModel, schema: &Value) -> Result<Constraint> {
    grammars
        .json_schema(&model.tokenizer, model.vocab_size, schema)
        .map_err(|e| EngineError::Internal(format!("{e:?}")))
}

impl ConstrainedReport {
    pub fn table(&self) -> String {
        format!(
            "model              {} (vocabulary {})\nprompt             {} tok; answer {} tok, {} run(s) (median), valid JSON ended by the grammar: {}\n\
             decode constrained {:>9.2} tok/s\ndecode plain       {:>9.2} tok/s\nratio              {:>9.3}\n\
             vocabulary trie    {:>9.1} ms (once per model)\ngrammar compile    {:>9.2} ms (per request)\n\
             mask per token     {:>9.1} µs mean, {:.1} µs max ({:.2} % of a constrained step)\n",
            self.model,
            self.vocab_size,
            self.prompt_tokens,
            self.answer_tokens,
            self.runs,
            self.answers_valid,
            self.constrained_decode_tok_s,
            self.unconstrained_decode_tok_s,
            self.ratio,
            self.vocabulary_build_ms,
            self.grammar_compile_ms,
            self.mask_mean_us,
            self.mask_max_us,
            self.mask_share_of_step * 100.0,
        )
    }
}
