//! Continuous batching's decoding side: several generations advanced by one forward pass per
//! step. Each `Sequence` keeps what a solo loop keeps (its caches at its own length, sampler,
//! grammar, stops, logprobs, output); a `step` feeds every decoding sequence its last token
//! and each prefilling one the next chunk of its prompt, within a token budget, so a long
//! prompt joining never freezes the streams already running. Which sequences step together
//! (one model, one adapter) and when they join or leave is the runtime's (`runtime::batch`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::Array;

use super::guided::Guide;
use super::output::OutputCore;
use super::request::{
    begin, cancelled_early, host_u32, BatchShare, Begin, DraftMode, DraftStats, Ended,
    GenerateParams, PrefillStates, Request, TokenLogprob,
};
use super::sampler::Sampler;
use super::speculative::{lookup_draft, lookup_round, next_draft_len};
use crate::error::{EngineError, Result};
use crate::model::kv_cache::{KvCache, KvState};
use crate::model::LoadedModel;

/// Where a sequence's text goes as it is decided.
pub type OnPiece = Box<dyn FnMut(&str, &[TokenLogprob]) + Send>;

/// One generation of a batch, between steps.
pub struct Sequence {
    prompt: Vec<u32>,
    params: GenerateParams,
    caches: Vec<KvCache>,
    /// Prompt tokens the caches held when it joined (a prefix-cache hit).
    reused: usize,
    start: Instant,
    /// Prompt tokens the caches hold now.
    fed: usize,
    /// The token the next step feeds once the prompt's head is in (the prompt's last, then
    /// each sampled one).
    next: u32,
    sampler: Sampler,
    /// Per-step host work (logprobs, grammars), when it has any.
    guide: Option<Guide>,
    out: Option<OutputCore>,
    marks: PrefillStates,
    cancel: Arc<AtomicBool>,
    on_piece: OnPiece,
    /// Why it stopped early with an error of its own (its grammar failed); the others go on.
    failed: Option<EngineError>,
    /// Its decoding steps, the sequences sampling in them summed, and the most at once.
    steps: usize,
    beside: usize,
    most: usize,
    /// Prompt lookup, used in the steps where it decodes alone.
    lookup: Option<Lookup>,
    max_tokens: usize,
}

/// A sequence's prompt-lookup drafts: its settings, the last round's drafted and accepted
/// counts (the next round's length follows them; none before the first, whose round drafts
/// nothing, as a solo generation's first), and what every round did.
struct Lookup {
    min_ngram: usize,
    max_ngram: usize,
    max_draft: usize,
    last: Option<(usize, usize)>,
    stats: DraftStats,
}

/// What one step did, for the scheduler's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepRows {
    /// Sequences that sampled a token.
    pub decoded: usize,
    /// Prompt tokens prefilled.
    pub prefilled: usize,
}

impl Sequence {
    /// A generation of `prompt` that may start from `from` (a prefix-cache hit). Plain,
    /// guided, or with prompt-lookup drafts, which it verifies in the steps where it decodes
    /// alone (a batch step gives each sequence one row; MTP's head is the solo engine's).
    pub fn new(
        model: &LoadedModel,
        prompt: Vec<u32>,
        params: GenerateParams,
        from: Option<KvState>,
        cancel: Arc<AtomicBool>,
        on_piece: OnPiece,
    ) -> Result<Sequence> {
        let lookup = match params.draft {
            DraftMode::None => None,
            DraftMode::Lookup { min_ngram, max_ngram, max_draft } => {
                params.draft.validate(model)?;
                let stats = DraftStats { mode: "lookup".into(), ..Default::default() };
                Some(Lookup { min_ngram, max_ngram, max_draft, last: None, stats })
            }
            DraftMode::Mtp { .. } => {
                return Err(EngineError::Internal("a batched sequence was given MTP drafts".into()))
            }
        };
        let req = Request { model, prompt: &prompt, params: &params, cancel: None, marks: true };
        let Begin { max_tokens, start, sampler, caches, reused, .. } = begin(&req, from)?;
        let out = OutputCore::new(model, &params, max_tokens);
        let guide = Guide::needed(&params).then(|| Guide::new(&params, start));
        Ok(Sequence {
            next: prompt[prompt.len() - 1],
            prompt,
            params,
            caches,
            reused,
            start,
            fed: reused,
            sampler,
            guide,
            out: Some(out),
            marks: PrefillStates::new(true),
            cancel,
            on_piece,
            failed: None,
            steps: 0,
            beside: 0,
            most: 0,
            lookup,
            max_tokens,
        })
    }

    /// Whether its prompt's head is still being prefilled.
    pub fn prefilling(&self) -> bool {
        self.fed + 1 < self.prompt.len()
    }

    /// Prompt tokens still to prefill (all but the last, which the first decode step feeds).
    pub fn prefill_left(&self) -> usize {
        self.prompt.len().saturating_sub(self.fed + 1)
    }

    /// Whether it has ended (finished, cancelled or failed) and should leave the batch.
    pub fn ended(&self) -> bool {
        self.failed.is_some() || self.out.as_ref().is_none_or(|o| o.ended())
    }

    /// Prompt tokens, and tokens generated so far (for /health's slots).
    pub fn progress(&self) -> (usize, usize) {
        (self.prompt.len(), self.out.as_ref().map_or(0, |o| o.tokens().len()))
    }

    /// The sequence's end: its generation (or its own error) and the state its caches hold
    /// for the prefix cache, with the marks its prefill kept.
    pub fn finish(mut self) -> (Result<super::Generation>, Option<KvState>, Vec<KvState>) {
        if let Some(e) = self.failed.take() {
            return (Err(e), None, vec![]);
        }
        let generation = match self.out.take() {
            Some(out) if self.fed + 1 >= self.prompt.len() || !out.tokens().is_empty() => {
                let stats = self.lookup.take().map(|l| l.stats);
                out.finish(self.prompt.len(), self.start, stats, &mut *self.on_piece)
            }
            // Cancelled before its first token: what was prefilled stays usable.
            _ => Ok(cancelled_early(self.prompt.len(), self.start)),
        };
        let mut generation = match generation {
            Ok(g) => g,
            Err(e) => return (Err(e), None, vec![]),
        };
        generation.batch = (self.steps > 0)
            .then(|| BatchShare { mean: self.beside as f64 / self.steps as f64, max: self.most });
        let marks = std::mem::take(&mut self.marks.states);
        let ended = Ended::new(generation, self.caches, None, self.reused);
        let (g, state) = ended.into_state(&self.prompt);
        (Ok(g), state, marks)
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Whether it drafts by prompt lookup in a step it decodes alone: guided sequences pick
    /// each token on the host, one at a time.
    fn drafts(&self) -> bool {
        self.lookup.is_some() && self.guide.is_none() && !self.prefilling()
    }

    /// A step of this sequence alone, with prompt-lookup drafts: one pass verifies them, and
    /// the tokens it keeps go out as plain steps' do.
    fn lookup_step(&mut self, model: &LoadedModel) -> Result<StepRows> {
        let (Some(lk), Some(out)) = (self.lookup.as_mut(), self.out.as_mut()) else {
            return Ok(StepRows::default());
        };
        // Room for drafts: max_tokens and the context, less the token the pass samples itself.
        let position = self.caches[0].offset() as usize;
        let room = self
            .max_tokens
            .saturating_sub(out.tokens().len() + 1)
            .min(model.context_length.saturating_sub(position + 1));
        let len = lk.last.map_or(0, |(k, a)| next_draft_len(k, a, lk.max_draft)).min(room);
        let history: Vec<u32> = self.prompt.iter().chain(out.tokens()).copied().collect();
        let drafts = lookup_draft(&history, lk.min_ngram, lk.max_ngram, len);
        let taken = lookup_round(model, &mut self.caches, &mut self.sampler, self.next, &drafts)?;
        lk.last = Some((drafts.len(), taken.len() - 1));
        lk.stats.record(drafts.len(), taken.len() - 1);
        self.steps += 1;
        self.beside += 1;
        self.most = self.most.max(1);
        self.fed = self.fed.max(self.prompt.len());
        for &id in &taken {
            self.next = id;
            if !out.push_with(id, None, Some(&self.cancel), &mut *self.on_piece)? {
                break;
            }
        }
        Ok(StepRows { decoded: 1, prefilled: 0 })
    }
}

/// One forward pass for `seqs` (one model, one adapter, attached to `model`): each decoding
/// sequence feeds one token and samples the next; prefilling ones take chunks of their
/// prompts, first come first served, up to `budget` tokens in all (at least one chunk of a
/// token when nothing decodes). A sequence whose client left ends here without a pass.
pub fn step(model: &LoadedModel, seqs: &mut [&mut Sequence], budget: usize) -> Result<StepRows> {
    for s in seqs.iter_mut() {
        if s.cancelled() && s.prefilling() {
            if let Some(out) = s.out.as_mut() {
                out.cancel();
            }
        }
    }
    let live: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].ended()).collect();
    if let [only] = live[..] {
        if seqs[only].drafts() {
            return seqs[only].lookup_step(model);
        }
    }
    let decoding: Vec<usize> = live.iter().copied().filter(|&i| !seqs[i].prefilling()).collect();
    let mut room = budget.saturating_sub(decoding.len()).max(1);
    // Rows of this pass: (sequence, tokens), decoders first.
    let mut rows: Vec<(usize, Vec<u32>)> =
        decoding.iter().map(|&i| (i, vec![seqs[i].next])).collect();
    for &i in live.iter().filter(|&&i| seqs[i].prefilling()) {
        if room == 0 {
            break;
        }
        let s = &seqs[i];
        let head_end = s.prompt.len() - 1;
        let n = (head_end - s.fed).min(s.params.prefill_chunk.max(1)).min(room);
        rows.push((i, s.prompt[s.fed..s.fed + n].to_vec()));
        room -= n;
    }
    if rows.is_empty() {
        return Ok(StepRows::default());
    }
    let tokens: Vec<u32> = rows.iter().flat_map(|(_, t)| t.iter().copied()).collect();
    let lens: Vec<i32> = rows.iter().map(|(_, t)| t.len() as i32).collect();
    let input = Array::from_slice(&tokens, &[1, tokens.len() as i32]);
    let hidden = {
        let mut picked: Vec<Option<&mut Sequence>> =
            seqs.iter_mut().map(|s| Some(&mut **s)).collect();
        let mut caches: Vec<&mut [KvCache]> = Vec::with_capacity(rows.len());
        for (i, _) in &rows {
            let s = picked[*i].take().expect("a sequence has one row group per pass");
            caches.push(&mut s.caches[..]);
        }
        model.net.hidden_rows(&input, &mut caches, &lens, model.adapter.as_ref())?
    };
    // The last row of each decoding sequence's group is where its next token comes from.
    let mut ends = Vec::with_capacity(decoding.len());
    let mut at = 0;
    for (k, len) in lens.iter().enumerate() {
        at += len;
        if k < decoding.len() {
            ends.push(at - 1);
        }
    }
    let logits = match ends.is_empty() {
        true => None,
        false => {
            let idx = Array::from_slice(&ends, &[ends.len() as i32]);
            Some(model.net.logits(&hidden.take_axis(&idx, 1)?)?)
        }
    };
    // Plain sequences sample on the device, all evaluated at once; guided ones on the host.
    let mut lazy: Vec<(usize, Array)> = vec![];
    let mut chosen: Vec<(usize, u32, Option<TokenLogprob>)> = vec![];
    if let Some(logits) = &logits {
        for (j, &i) in decoding.iter().enumerate() {
            let row = logits.index((.., j as i32, ..));
            let s = &mut *seqs[i];
            match s.guide.as_mut() {
                Some(g) => match g.pick(&model.tokenizer, &mut s.sampler, &row) {
                    Ok((id, lp)) => chosen.push((i, id, lp)),
                    Err(e) => s.failed = Some(e),
                },
                None => lazy.push((i, s.sampler.sample(&row)?)),
            }
        }
    }
    let mut pending: Vec<&Array> = lazy.iter().map(|(_, y)| y).collect();
    let prefilled: Vec<usize> = rows[decoding.len()..].iter().map(|(i, _)| *i).collect();
    for &i in &prefilled {
        pending.extend(seqs[i].caches.iter().flat_map(|c| c.state()));
    }
    eval(pending)?;
    for (i, y) in &lazy {
        chosen.push((*i, host_u32(y)?, None));
    }
    for &i in &decoding {
        let s = &mut *seqs[i];
        s.steps += 1;
        s.beside += decoding.len();
        s.most = s.most.max(decoding.len());
    }
    for (i, id, lp) in chosen {
        let s = &mut *seqs[i];
        s.fed = s.fed.max(s.prompt.len());
        let Some(out) = s.out.as_mut() else { continue };
        let going = out.push_with(id, lp, Some(&s.cancel), &mut *s.on_piece)?;
        if going && s.guide.as_ref().is_some_and(Guide::done) {
            out.stop();
        }
        s.next = id;
    }
    let mut prefill_tokens = 0;
    for (i, t) in &rows[decoding.len()..] {
        let s = &mut *seqs[*i];
        s.fed += t.len();
        prefill_tokens += t.len();
        if s.prefilling() {
            s.marks.mark(&s.prompt, s.fed, &s.caches);
        }
    }
    Ok(StepRows { decoded: decoding.len(), prefilled: prefill_tokens })
}
