//! What every decoding loop shares: a generation's parameters and result, the request they
//! run, prefill, the single `Output` end that emits text and stops (with `stop`'s matcher),
//! and the draft settings. The loops (`generate`, `guided`, `speculative`) build on this and never
//! on each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mlx_rs::transforms::eval;
use mlx_rs::Array;
use serde::{Deserialize, Serialize};

use super::sampler::{Sampler, SamplingParams};
use crate::error::{EngineError, Result};
use crate::model::kv_cache::{KvCache, KvState, SLIDING_SLACK};
use crate::model::LoadedModel;

#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends before the first occurrence of any of these; the stop text is not
    /// part of the output.
    pub stop: Vec<String>,
    /// Prompt tokens per prefill forward pass.
    pub prefill_chunk: usize,
    /// Keep going past EOS (benchmarks need a fixed number of tokens).
    pub ignore_eos: bool,
    /// Speculative decoding: where draft tokens come from (none: plain decoding).
    pub draft: DraftMode,
    /// Report each token's log-probability and this many most likely alternatives.
    pub logprobs: Option<usize>,
    /// Constrain the output to a grammar (ends when it is complete).
    pub constraint: Option<super::constraint::Constraint>,
    /// A LoRA adapter to apply (the engine loads it on the MLX thread).
    pub adapter: Option<AdapterRef>,
}

/// A saved LoRA adapter: its name and directory.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterRef {
    pub name: String,
    pub dir: std::path::PathBuf,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop: vec![],
            prefill_chunk: 512,
            ignore_eos: false,
            draft: DraftMode::None,
            logprobs: None,
            constraint: None,
            adapter: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    Cancelled,
}

#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt arrival to first sampled token.
    pub ttft: Duration,
    /// First token to last token.
    pub decode_time: Duration,
    /// Speculative decoding's statistics; `None` for plain decoding.
    pub draft: Option<DraftStats>,
    /// One entry per generated token when `GenerateParams::logprobs` asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// When the last token was produced (on the thread that ran the model).
    #[serde(skip)]
    pub finished_at: Instant,
    /// Prompt tokens whose keys and values came from the prefix cache (not prefilled).
    pub cached_tokens: usize,
    /// The stop string that ended the answer, when one did.
    pub stop_sequence: Option<String>,
    /// How many sequences stepped beside this one (continuous batching; `None` solo).
    pub batch: Option<BatchShare>,
}

/// The batch a generation ran in: the sequences sampling per step, itself included, on
/// average over its steps and at most.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct BatchShare {
    pub mean: f64,
    pub max: usize,
}

/// A generated token's log-probability under the model (log-softmax of its logits, before
/// temperature and filters), with the most likely alternatives at that position.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token: u32,
    pub text: String,
    pub logprob: f32,
}

impl Generation {
    pub fn prefill_tokens_per_sec(&self) -> f64 {
        self.prompt_tokens as f64 / self.ttft.as_secs_f64().max(1e-9)
    }

    /// Tokens after the first, over the time after the first.
    pub fn decode_tokens_per_sec(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 {
            return 0.0;
        }
        n as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Where draft tokens come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum DraftMode {
    /// Plain decoding.
    #[default]
    None,
    /// Continue the most recent earlier occurrence of the last n tokens (n from `max_ngram`
    /// down to `min_ngram`) with up to `max_draft` of the tokens that followed it.
    Lookup { min_ngram: usize, max_ngram: usize, max_draft: usize },
    /// The model's MTP head, chained `depth` times (1 to 3).
    Mtp { depth: usize },
}

pub const MAX_MTP_DEPTH: usize = 3;

impl DraftMode {
    pub fn lookup() -> DraftMode {
        DraftMode::Lookup { min_ngram: 2, max_ngram: 4, max_draft: 8 }
    }

    /// MTP when the model has a head, prompt lookup otherwise.
    pub fn auto(model: &LoadedModel) -> DraftMode {
        match model.mtp {
            Some(_) => DraftMode::Mtp { depth: 1 },
            None => DraftMode::lookup(),
        }
    }

    pub(crate) fn validate(&self, model: &LoadedModel) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        match *self {
            DraftMode::None => Ok(()),
            DraftMode::Mtp { .. } if model.mtp.is_none() => {
                bad(format!("model `{}` has no MTP head; use prompt lookup", model.id))
            }
            DraftMode::Mtp { depth } if !(1..=MAX_MTP_DEPTH).contains(&depth) => {
                bad(format!("MTP draft depth must be 1 to {MAX_MTP_DEPTH}, not {depth}"))
            }
            DraftMode::Lookup { min_ngram, max_ngram, max_draft } => {
                if min_ngram == 0 || min_ngram > max_ngram {
                    return bad("prompt lookup needs 1 <= min_ngram <= max_ngram".into());
                }
                // Rejected drafts are rolled back; a sliding-window cache keeps this much room.
                if !(1..=SLIDING_SLACK as usize).contains(&max_draft) {
                    return bad(format!("prompt lookup max_draft must be 1 to {SLIDING_SLACK}"));
                }
                Ok(())
            }
            DraftMode::Mtp { .. } => Ok(()),
        }
    }
}

/// What speculative decoding did for one request.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DraftStats {
    /// `mtp` or `lookup`.
    pub mode: String,
    /// Chained MTP steps per round (0 for prompt lookup).
    pub mtp_depth: usize,
    /// Forward passes of the main model after the prompt (each verifies one round's drafts).
    pub verify_calls: usize,
    /// Drafts proposed at depth i + 1 (the i-th token of a round's draft).
    pub drafted_by_depth: Vec<usize>,
    /// Drafts accepted at depth i + 1.
    pub accepted_by_depth: Vec<usize>,
    /// Rounds whose drafts were all accepted, so the verify pass added one more token.
    pub bonus_tokens: usize,
    /// Accepted / drafted over all depths.
    pub acceptance_rate: f64,
}

impl DraftStats {
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        self.verify_calls += 1;
        for d in 0..drafted {
            if self.drafted_by_depth.len() <= d {
                self.drafted_by_depth.push(0);
                self.accepted_by_depth.push(0);
            }
            self.drafted_by_depth[d] += 1;
            self.accepted_by_depth[d] += usize::from(d < accepted);
        }
        if drafted > 0 && accepted == drafted {
            self.bonus_tokens += 1;
        }
        let total: usize = self.drafted_by_depth.iter().sum();
        self.acceptance_rate =
            self.accepted_by_depth.iter().sum::<usize>() as f64 / total.max(1) as f64;
    }
}
/// One generation's inputs, as every decoding loop takes them.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub model: &'a LoadedModel,
    pub prompt: &'a [u32],
    pub params: &'a GenerateParams,
    pub cancel: Option<&'a AtomicBool>,
    /// Whether the prefill keeps states on its way (`PrefillStates`): only callers that store them.
    pub marks: bool,
}

/// What every decoding loop starts from: the request checked, the clock started, a sampler
/// and the caches: empty, or holding the prompt's first `reused` tokens (a prefix-cache hit).
pub(crate) struct Begin {
    pub max_tokens: usize,
    pub start: Instant,
    pub sampler: Sampler,
    pub caches: Vec<KvCache>,
    /// The MTP head's cache (MTP drafting only), holding `reused` pairs.
    pub mtp: Option<KvCache>,
    /// Prompt tokens the caches already hold; prefill starts after them.
    pub reused: usize,
}

pub(crate) fn begin(req: &Request<'_>, from: Option<KvState>) -> Result<Begin> {
    let max_tokens = check_request(req.model, req.prompt, req.params)?;
    let mtp_mode = matches!(req.params.draft, DraftMode::Mtp { .. }) && req.model.mtp.is_some();
    let fresh = req.model.net.new_caches();
    // A state that does not hold exactly a proper prefix of this prompt (in every layer, and
    // in the MTP head when it drafts) is not used: decoding from it would be wrong.
    let usable = |s: &KvState| {
        let n = s.len();
        n > 0
            && n < req.prompt.len()
            && s.tokens[..] == req.prompt[..n]
            && s.layers.len() == fresh.len()
            && s.layers.iter().all(|c| c.offset() as usize == n)
            && (!mtp_mode || s.mtp.as_ref().is_some_and(|m| m.offset() as usize == n))
    };
    let (caches, mtp, reused) = match from.filter(usable) {
        Some(s) => {
            let n = s.len();
            (s.layers, s.mtp.filter(|_| mtp_mode), n)
        }
        None => (fresh, mtp_mode.then(KvCache::new), 0),
    };
    Ok(Begin {
        max_tokens,
        start: Instant::now(),
        sampler: Sampler::new(req.params.sampling.clone(), req.model.vocab_size, req.prompt)?,
        caches,
        mtp,
        reused,
    })
}

/// A decoding loop's end: the generation and the caches it leaves (after a prefill that was
/// cancelled, what it had prefilled).
pub(crate) struct Ended {
    pub generation: Generation,
    pub caches: Vec<KvCache>,
    /// The MTP head's cache with only confirmed pairs in it.
    pub mtp: Option<KvCache>,
    /// States the prefill kept on its way (`mark`).
    pub marks: Vec<KvState>,
}

impl Ended {
    /// `reused`: prompt tokens the caches held at the start (`Begin::reused`).
    pub fn new(
        mut generation: Generation,
        caches: Vec<KvCache>,
        mtp: Option<KvCache>,
        reused: usize,
    ) -> Ended {
        generation.cached_tokens = reused;
        Ended { generation, caches, mtp, marks: vec![] }
    }

    pub fn with_marks(self, marks: PrefillStates) -> Ended {
        Ended { marks: marks.states, ..self }
    }

    /// What the caches hold, as a state the next generation can start from: the prompt and
    /// the generated tokens they saw (a token sampled but never fed is not in it; one fed
    /// but not output, such as end-of-sequence, is cut off). `None` when nothing is usable.
    pub fn into_state(self, prompt: &[u32]) -> (Generation, Option<KvState>) {
        let Ended { generation, mut caches, mtp, .. } = self;
        let held = caches.first().map_or(0, |c| c.offset() as usize);
        let n = held.min(prompt.len() + generation.tokens.len());
        let cut = (held - n) as i32;
        let trimmed = caches.iter_mut().all(|c| c.offset() as usize == held && c.trim(cut) == cut);
        if n == 0 || !trimmed {
            return (generation, None);
        }
        let mut tokens = Vec::with_capacity(n);
        tokens.extend_from_slice(&prompt[..n.min(prompt.len())]);
        tokens.extend_from_slice(&generation.tokens[..n - tokens.len()]);
        // MTP pair p needs token p + 1: at most n - 1 pairs.
        let mtp = mtp.and_then(|mut m| {
            let extra = m.offset() - (n as i32 - 1);
            (extra <= 0 || m.trim(extra) == extra).then_some(m)
        });
        (generation, Some(KvState { tokens, layers: caches, mtp }))
    }
}

/// Prefill `prompt[range]` in chunks, evaluating only the caches (the logits of these
/// positions are never needed, so MLX never computes them). False if cancelled first. Each
/// chunk's end before the range's end is offered to `marks` (see `mark`).
pub(crate) fn prefill(
    model: &LoadedModel,
    prompt: &[u32],
    range: std::ops::Range<usize>,
    chunk: usize,
    caches: &mut [KvCache],
    cancel: Option<&AtomicBool>,
    marks: &mut PrefillStates,
) -> Result<bool> {
    let mut at = range.start;
    for chunk in prompt[range.clone()].chunks(chunk.max(1)) {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Ok(false);
        }
        // Hidden states only: nothing reads a prefill's logits.
        model.hidden(&token_array(chunk), caches)?;
        eval(caches.iter().flat_map(|c| c.state()))?;
        at += chunk.len();
        if at < range.end {
            marks.mark(prompt, at, caches);
        }
    }
    Ok(true)
}

/// The most states one prefill keeps on its way. Each is a copy of the caches (the full-
/// attention layers' grow with the prompt), so keeping one per chunk made a long prompt's
/// memory grow with its square; past this many, every other one goes and marks are offered
/// half as often, so the kept ones stay spread over the whole prompt.
pub const MAX_PREFILL_STATES: usize = 4;

/// The states a prefill keeps on its way, when the caller stores them (`Request::marks`).
pub(crate) struct PrefillStates {
    keep: bool,
    pub states: Vec<KvState>,
    spread: Spread,
}

/// Which of a prefill's chunk ends are kept (see `MAX_PREFILL_STATES`): multiples of a stride that
/// doubles each time the kept ones would pass the bound.
#[derive(Debug, Default)]
struct Spread {
    /// Chunk ends seen so far.
    seen: usize,
    stride: usize,
    /// The chunk ends kept, in order (parallel to `PrefillStates::states`).
    kept: Vec<usize>,
}

impl Spread {
    /// Whether the next chunk end is kept.
    fn offer(&mut self) -> bool {
        self.seen += 1;
        self.stride = self.stride.max(1);
        self.seen.is_multiple_of(self.stride)
    }

    /// After keeping one: which kept ones to drop (indices, descending) to stay in bound.
    fn thin(&mut self) -> Vec<usize> {
        self.kept.push(self.seen);
        if self.kept.len() <= MAX_PREFILL_STATES {
            return vec![];
        }
        self.stride *= 2;
        let stride = self.stride;
        let drop: Vec<usize> =
            (0..self.kept.len()).rev().filter(|&i| !self.kept[i].is_multiple_of(stride)).collect();
        for &i in &drop {
            self.kept.remove(i);
        }
        drop
    }
}

impl PrefillStates {
    pub fn new(keep: bool) -> PrefillStates {
        PrefillStates { keep, states: vec![], spread: Spread::default() }
    }

    /// Keep the caches after `prompt[..at]` as a state of their own when some layer is a
    /// sliding-window ring or a recurrent state. The state a generation leaves can be cut back
    /// only as far as its rings still reach (window + slack), and a recurrent state hardly at
    /// all (`model::recurrent_state`), so without these a later prompt that shares a long
    /// prefix but not the rest (another conversation with the same system prompt) would find
    /// nothing to reuse. The arrays are shared until the next chunk writes new ones, but a
    /// kept state stops MLX from updating them in place, so callers that would throw the
    /// states away (`perch run`, `perch bench`) do not ask for them.
    pub fn mark(&mut self, prompt: &[u32], at: usize, caches: &[KvCache]) {
        if self.keep && caches.iter().any(|c| !c.cuts_back_anywhere()) && self.spread.offer() {
            let layers = caches.to_vec();
            self.states.push(KvState { tokens: prompt[..at].to_vec(), layers, mtp: None });
            for i in self.spread.thin() {
                self.states.remove(i);
            }
        }
    }
}

/// Checks every decoding mode shares; returns the number of tokens that may be generated.
pub(crate) fn check_request(
    model: &LoadedModel,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<usize> {
    if params.max_tokens == 0 {
        return Err(EngineError::InvalidRequest("max_tokens must be at least 1".into()));
    }
    let room = context_room(prompt.len(), model.context_length)?;
    params.sampling.validate()?;
    Ok(params.max_tokens.min(room))
}

/// How many tokens may follow a prompt of `prompt_tokens` in a context of `context_length`:
/// the one check of a prompt's length, whoever asks (a turn before it queues, every decoding
/// loop as it starts).
pub fn context_room(prompt_tokens: usize, context_length: usize) -> Result<usize> {
    if prompt_tokens == 0 {
        return Err(EngineError::EmptyPrompt);
    }
    if prompt_tokens >= context_length {
        return Err(EngineError::ContextOverflow { context_length, prompt_tokens });
    }
    Ok(context_length - prompt_tokens)
}

pub(crate) fn host_u32(a: &Array) -> Result<u32> {
    a.try_item_cast().map_err(|e| EngineError::Mlx(mlx_rs::error::Exception::custom(e.to_string())))
}

pub(crate) fn token_array(ids: &[u32]) -> Array {
    Array::from_slice(ids, &[1, ids.len() as i32])
}

pub(crate) fn cancelled_early(prompt_tokens: usize, start: Instant) -> Generation {
    Generation {
        text: String::new(),
        tokens: vec![],
        finish_reason: FinishReason::Cancelled,
        prompt_tokens,
        ttft: start.elapsed(),
        decode_time: Duration::ZERO,
        draft: None,
        logprobs: vec![],
        finished_at: Instant::now(),
        cached_tokens: 0,
        stop_sequence: None,
        batch: None,
    }
}

#[cfg(test)]
mod spread_tests {
    use super::*;

    #[test]
    fn a_long_prefill_keeps_a_bounded_spread_of_marks() {
        for chunks in [1, 3, 4, 5, 16, 64, 1000] {
            let mut s = Spread::default();
            let mut kept = vec![];
            for end in 1..=chunks {
                if s.offer() {
                    kept.push(end);
                    for i in s.thin() {
                        kept.remove(i);
                    }
                }
            }
            assert_eq!(kept, s.kept);
            assert!(kept.len() <= MAX_PREFILL_STATES, "{chunks} chunks kept {kept:?}");
            assert!(!kept.is_empty(), "{chunks} chunks kept nothing");
            // Spread over the prompt: the last kept is past its first half, the first kept
            // within its first half (a shared system prompt early on still finds one).
            let last = *kept.last().unwrap();
            assert!(last * 2 > chunks, "{chunks} chunks kept {kept:?}");
            assert!(kept[0] * 2 <= chunks.max(2), "{chunks} chunks kept {kept:?}");
            assert!(kept.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
