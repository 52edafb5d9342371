//! Where sampled tokens go, whichever loop sampled them: end-of-sequence, detokenizing, stop
//! strings, cancellation, `max_tokens` and the caller's callback (`Output`); `OutputCore` is
//! the same without the borrowed flag and callback, for a batch's sequences.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::request::{DraftStats, FinishReason, GenerateParams, Generation, TokenLogprob};
use super::stop::StopMatcher;
use crate::error::Result;
use crate::model::LoadedModel;
use crate::tokenizer::StreamDecoder;

/// Where sampled tokens go: EOS, detokenizing, stop strings, cancellation, `max_tokens`, the
/// caller's callback. Plain and speculative decoding share it, so they end the same way.
pub(crate) struct Output<'a> {
    core: OutputCore,
    cancel: Option<&'a AtomicBool>,
    on_piece: &'a mut dyn FnMut(&str, &[TokenLogprob]),
}

impl<'a> Output<'a> {
    pub fn new(
        model: &'a LoadedModel,
        params: &GenerateParams,
        max_tokens: usize,
        cancel: Option<&'a AtomicBool>,
        on_piece: &'a mut dyn FnMut(&str, &[TokenLogprob]),
    ) -> Self {
        Output { core: OutputCore::new(model, params, max_tokens), cancel, on_piece }
    }

    /// Take the next sampled token; false once the generation is over.
    pub fn push(&mut self, id: u32) -> Result<bool> {
        self.push_with(id, None)
    }

    /// `push`, with the token's logprobs.
    pub fn push_with(&mut self, id: u32, lp: Option<TokenLogprob>) -> Result<bool> {
        self.core.push_with(id, lp, self.cancel, self.on_piece)
    }

    /// Tokens taken so far (after the prompt).
    pub fn tokens(&self) -> &[u32] {
        self.core.tokens()
    }

    /// End the generation now (JSON mode: the object is complete).
    pub fn stop(&mut self) {
        self.core.stop();
    }

    pub fn finish(
        self,
        prompt_tokens: usize,
        start: Instant,
        draft: Option<DraftStats>,
    ) -> Result<Generation> {
        self.core.finish(prompt_tokens, start, draft, self.on_piece)
    }
}

/// `Output`'s state without the borrowed cancel flag and callback: what a sequence of a
/// batch keeps between steps (`decode::batch`), handing the two in at each token.
pub(crate) struct OutputCore {
    tokenizer: std::sync::Arc<crate::tokenizer::Tokenizer>,
    ignore_eos: bool,
    max_tokens: usize,
    /// Logprobs of tokens whose text has not been handed out yet, and all of them.
    pending_lps: Vec<TokenLogprob>,
    logprobs: Vec<TokenLogprob>,
    tokens: Vec<u32>,
    text: String,
    decoder: StreamDecoder,
    stops: StopMatcher,
    finish: Option<FinishReason>,
    first_at: Option<Instant>,
}

impl OutputCore {
    pub fn new(model: &LoadedModel, params: &GenerateParams, max_tokens: usize) -> Self {
        OutputCore {
            tokenizer: model.tokenizer.clone(),
            ignore_eos: params.ignore_eos,
            max_tokens,
            pending_lps: Vec::new(),
            logprobs: Vec::new(),
            tokens: Vec::new(),
            text: String::new(),
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(&params.stop),
            finish: None,
            first_at: None,
        }
    }

    /// Take the next sampled token; false once the generation is over.
    pub fn push_with(
        &mut self,
        id: u32,
        lp: Option<TokenLogprob>,
        cancel: Option<&AtomicBool>,
        on_piece: &mut dyn FnMut(&str, &[TokenLogprob]),
    ) -> Result<bool> {
        if self.finish.is_some() {
            return Ok(false);
        }
        self.first_at.get_or_insert_with(Instant::now);
        if !self.ignore_eos && self.tokenizer.is_eos(id) {
            return self.end(FinishReason::Stop);
        }
        self.tokens.push(id);
        if let Some(lp) = lp {
            self.pending_lps.push(lp.clone());
            self.logprobs.push(lp);
        }
        let piece = self.decoder.push(&self.tokenizer, id)?;
        let (ready, hit) = self.stops.push(&piece);
        if !ready.is_empty() {
            on_piece(&ready, &self.pending_lps);
            self.pending_lps.clear();
            self.text.push_str(&ready);
        }
        if hit {
            return self.end(FinishReason::Stop);
        }
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return self.end(FinishReason::Cancelled);
        }
        if self.tokens.len() >= self.max_tokens {
            return self.end(FinishReason::Length);
        }
        Ok(true)
    }

    /// Tokens taken so far (after the prompt).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether the generation is over.
    pub fn ended(&self) -> bool {
        self.finish.is_some()
    }

    /// End the generation now (JSON mode: the object is complete).
    pub fn stop(&mut self) {
        self.finish.get_or_insert(FinishReason::Stop);
    }

    /// End it as cancelled (a batch's sequence whose client left before its first token).
    pub fn cancel(&mut self) {
        self.finish.get_or_insert(FinishReason::Cancelled);
    }

    fn end(&mut self, reason: FinishReason) -> Result<bool> {
        self.finish = Some(reason);
        Ok(false)
    }

    pub fn finish(
        mut self,
        prompt_tokens: usize,
        start: Instant,
        draft: Option<DraftStats>,
        on_piece: &mut dyn FnMut(&str, &[TokenLogprob]),
    ) -> Result<Generation> {
        if !self.stops.hit() {
            let tail = self.decoder.flush(&self.tokenizer)?;
            let (ready, _) = self.stops.push(&tail);
            let rest = format!("{ready}{}", self.stops.finish());
            if !rest.is_empty() || !self.pending_lps.is_empty() {
                on_piece(&rest, &self.pending_lps);
                self.text.push_str(&rest);
            }
        }
        let first_at = self.first_at.unwrap_or(start);
        Ok(Generation {
            text: self.text,
            prompt_tokens,
            ttft: first_at - start,
            decode_time: first_at.elapsed(),
            tokens: self.tokens,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            draft,
            logprobs: self.logprobs,
            finished_at: Instant::now(),
            cached_tokens: 0,
            stop_sequence: self.stops.matched().map(String::from),
            batch: None,
        })
    }
}
