//! Training data: plain text cut into fixed-length chunks, or chat examples rendered through
//! the model's chat template where only the assistant's turns carry loss. Tokenizing happens
//! here, off the MLX thread.

use serde::Deserialize;

use crate::chat::ChatMessage;
use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;

/// One training sequence: `loss[i]` says whether token `i` is a prediction target.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub tokens: Vec<u32>,
    pub loss: Vec<bool>,
}

impl Sample {
    pub fn targets(&self) -> usize {
        self.loss.iter().skip(1).filter(|l| **l).count()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    pub messages: Vec<ChatMessage>,
}

pub enum TrainData {
    Text(String),
    Examples(Vec<Example>),
}

/// Chunks shorter than this carry too little signal to be worth a step.
const MIN_CHUNK: usize = 8;

/// Tokenize `data` into samples of at most `seq_len` tokens; stops between examples once
/// `cancel` is set (the request went away).
pub fn samples(
    tok: &Tokenizer,
    data: &TrainData,
    seq_len: usize,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Vec<Sample>> {
    match data {
        TrainData::Text(text) => Ok(text_samples(tok, text, seq_len)?),
        TrainData::Examples(examples) => examples
            .iter()
            .enumerate()
            .map(|(i, e)| {
                if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(EngineError::InvalidRequest("cancelled".into()));
                }
                example_sample(tok, e, seq_len).map_err(|e| at(i, e))
            })
            .collect(),
    }
}

fn at(i: usize, e: EngineError) -> EngineError {
    let why = match e {
        EngineError::InvalidRequest(m) => m,
        other => other.to_string(),
    };
    EngineError::InvalidRequest(format!("examples[{i}]: {why}"))
}

/// The text's tokens in consecutive chunks, each opened by the model's start token (BOS) when
/// it has one, so every chunk reads like the start of a document.
fn text_samples(tok: &Tokenizer, text: &str, seq_len: usize) -> Result<Vec<Sample>> {
    let body = tok.encode(text, false)?;
    let bos = tok.start_token().filter(|b| !tok.is_eos(*b));
    let per = seq_len - usize::from(bos.is_some());
    Ok(body
        .chunks(per)
        .filter(|c| c.len() >= MIN_CHUNK)
        .map(|c| {
            let tokens: Vec<u32> = bos.into_iter().chain(c.iter().copied()).collect();
            let loss = tokens.iter().enumerate().map(|(i, _)| i > 0 || bos.is_none()).collect();
            Sample { tokens, loss }
        })
        .collect())
}

/// A chat as (text, carries loss) pieces: each assistant turn is the difference between the
/// conversation rendered up to it with the generation prompt and rendered including it.
fn pieces(tok: &Tokenizer, messages: &[ChatMessage]) -> Result<Vec<(String, bool)>> {
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err(EngineError::InvalidRequest(
            "needs at least one assistant message (only assistant turns are trained on)".into(),
        ));
    }
    if let Some(m) =
        messages.iter().find(|m| !["system", "user", "assistant"].contains(&m.role.as_str()))
    {
        return Err(EngineError::InvalidRequest(format!(
            "role `{}` is not system, user or assistant",
            m.role
        )));
    }
    if !tok.has_chat_template() {
        // A base model: the messages in order, separated by blank lines, as in `encode_chat`.
        return Ok(messages
            .iter()
            .map(|m| (format!("{}\n\n", m.content), m.role == "assistant"))
            .collect());
    }
    let mut out = Vec::new();
    let mut done = String::new();
    for (i, m) in messages.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let prompt = tok.apply_chat_template(&messages[..i], true)?;
        let full = tok.apply_chat_template(&messages[..=i], false)?;
        let (Some(context), Some(answer)) =
            (prompt.strip_prefix(done.as_str()), full.strip_prefix(prompt.as_str()))
        else {
            return Err(EngineError::Template("the chat template does not render a conversation as a continuation of its beginning, so assistant turns cannot be located".into()));
        };
        out.push((context.to_string(), false));
        out.push((answer.to_string(), true));
        done = full;
    }
    Ok(out)
}

fn example_sample(tok: &Tokenizer, e: &Example, seq_len: usize) -> Result<Sample> {
    let mut tokens = Vec::new();
    let mut loss = Vec::new();
    let templated = tok.has_chat_template();
    for (n, (text, trains)) in pieces(tok, &e.messages)?.into_iter().enumerate() {
        // A rendered template holds its own BOS text; a plain rendering gets the tokenizer's.
        let ids = tok.encode(&text, n == 0 && !templated)?;
        loss.extend(std::iter::repeat_n(trains, ids.len()));
        tokens.extend(ids);
    }
    tokens.truncate(seq_len);
    loss.truncate(seq_len);
    let sample = Sample { tokens, loss };
    if sample.targets() == 0 {
        return Err(EngineError::InvalidRequest(format!(
            "no assistant token fits in seq_len = {seq_len}"
        )));
    }
    Ok(sample)
}

/// Deterministic split: every sample whose shuffled position falls in the last `fraction`
/// goes to eval (at least one when there are two or more samples and `fraction > 0`).
pub fn split(mut samples: Vec<Sample>, fraction: f64, seed: u64) -> (Vec<Sample>, Vec<Sample>) {
    shuffle(&mut samples, seed);
    let n = samples.len();
    let mut k = (n as f64 * fraction).round() as usize;
    if fraction > 0.0 && n >= 2 {
        k = k.clamp(1, n - 1);
    }
    let eval = samples.split_off(n - k.min(n));
    (samples, eval)
}

/// Fisher–Yates with a small xorshift generator: reproducible from the run's seed.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..items.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        items.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_deterministic_and_keeps_everything() {
        let samples: Vec<Sample> =
            (0..20).map(|i| Sample { tokens: vec![i], loss: vec![true] }).collect();
        let (a, b) = split(samples.clone(), 0.1, 3);
        let (a2, b2) = split(samples.clone(), 0.1, 3);
        assert_eq!((a.len(), b.len()), (18, 2));
        assert_eq!((&a, &b), (&a2, &b2));
        let mut all: Vec<u32> = a.iter().chain(&b).map(|s| s.tokens[0]).collect();
        all.sort();
        assert_eq!(all, (0..20).collect::<Vec<_>>());
        let (a, b) = split(samples[..2].to_vec(), 0.1, 3);
        assert_eq!((a.len(), b.len()), (1, 1));
        let (a, b) = split(samples[..5].to_vec(), 0.0, 3);
        assert_eq!((a.len(), b.len()), (5, 0));
    }
}
