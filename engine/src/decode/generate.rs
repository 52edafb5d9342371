//! The generation loop: chunked prefill, then decode with the next step queued (async_eval)
//! while the host reads the current token, the way mlx-lm pipelines it.

use std::sync::atomic::AtomicBool;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::async_eval;
use mlx_rs::Array;

use super::output::Output;
use super::request::{
    begin, cancelled_early, host_u32, prefill, token_array, Begin, DraftMode, Ended,
    GenerateParams, Generation, PrefillStates, Request, TokenLogprob,
};
use crate::error::Result;
use crate::model::kv_cache::{KvCache, KvState};
use crate::model::LoadedModel;

/// Plain decoding, with the next step queued (async_eval) while the host reads the current
/// token.
fn generate_plain(
    req: Request<'_>,
    from: Option<KvState>,
    on_piece: &mut dyn FnMut(&str, &[TokenLogprob]),
) -> Result<Ended> {
    let Begin { max_tokens, start, mut sampler, mut caches, reused, .. } = begin(&req, from)?;
    let Request { model, prompt, params, cancel, marks: keep_marks } = req;

    let last = prompt[prompt.len() - 1];
    let mut marks = PrefillStates::new(keep_marks);
    let head = reused..prompt.len() - 1;
    if !prefill(model, prompt, head, params.prefill_chunk, &mut caches, cancel, &mut marks)? {
        // What was prefilled stays usable: a retry of the same prompt starts from it.
        let ended = Ended::new(cancelled_early(prompt.len(), start), caches, None, reused);
        return Ok(ended.with_marks(marks));
    }

    let mut step = |input: &Array, caches: &mut [KvCache]| -> Result<Array> {
        let logits = model.forward(input, caches)?;
        let last = logits.index((.., -1, ..));
        sampler.sample(&last)
    };

    let mut y = step(&token_array(&[last]), &mut caches)?;
    async_eval([&y])?;

    let mut out = Output::new(model, params, max_tokens, cancel, on_piece);
    // The step queued behind the token being read; drained before returning so no MLX work
    // is left running when the caller (or the process) moves on.
    let mut queued: Option<Array> = None;
    for n in 0..max_tokens {
        // Queue step n+1 before the host waits on token n.
        if n + 1 < max_tokens {
            let next = step(&y.reshape(&[1, 1])?, &mut caches)?;
            async_eval([&next])?;
            queued = Some(next);
        }
        if !out.push(host_u32(&y)?)? {
            break;
        }
        match queued.take() {
            Some(next) => y = next,
            None => break,
        }
    }
    if let Some(pending) = queued.take() {
        pending.eval()?;
    }
    Ok(Ended::new(out.finish(prompt.len(), start, None)?, caches, None, reused).with_marks(marks))
}

/// Generate from `prompt` token ids. `on_text` receives each new piece of text as soon as it
/// is known to be final (whole UTF-8, not part of a possible stop string). Setting `cancel`
/// ends the generation within one step.
pub fn generate(
    model: &LoadedModel,
    prompt: &[u32],
    params: &GenerateParams,
    cancel: Option<&AtomicBool>,
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    generate_streaming(model, prompt, params, cancel, |t, _| on_text(t))
}

/// `generate`, with each piece's tokens' logprobs (when asked for) passed along.
///
/// Dispatch: logprobs and grammars need the host to see every step (`guided`); otherwise
/// speculative decoding when a draft source is set, else plain pipelined decoding.
pub fn generate_streaming(
    model: &LoadedModel,
    prompt: &[u32],
    params: &GenerateParams,
    cancel: Option<&AtomicBool>,
    on_piece: impl FnMut(&str, &[TokenLogprob]),
) -> Result<Generation> {
    Ok(generate_from(model, prompt, params, cancel, None, on_piece)?.0)
}

/// `generate_streaming`, starting from `from` when it holds a proper prefix of `prompt` (a
/// prefix-cache hit: only the rest is prefilled; `Generation::cached_tokens` says how much
/// was not), and returning what the caches hold at the end for the next generation.
pub fn generate_from(
    model: &LoadedModel,
    prompt: &[u32],
    params: &GenerateParams,
    cancel: Option<&AtomicBool>,
    from: Option<KvState>,
    mut on_piece: impl FnMut(&str, &[TokenLogprob]),
) -> Result<(Generation, Option<KvState>)> {
    let req = Request { model, prompt, params, cancel, marks: false };
    let (g, state, _) = dispatch(req, from, &mut on_piece)?;
    Ok((g, state))
}

/// `generate_from`, also returning the states the prefill kept on its way: on models with
/// sliding-window layers, the caches after each prefill chunk (`request::PrefillStates`), which a later
/// prompt sharing only part of this one can start from.
pub fn generate_marked(
    model: &LoadedModel,
    prompt: &[u32],
    params: &GenerateParams,
    cancel: Option<&AtomicBool>,
    from: Option<KvState>,
    mut on_piece: impl FnMut(&str, &[TokenLogprob]),
) -> Result<(Generation, Option<KvState>, Vec<KvState>)> {
    dispatch(Request { model, prompt, params, cancel, marks: true }, from, &mut on_piece)
}

fn dispatch(
    req: Request<'_>,
    from: Option<KvState>,
    on_piece: &mut dyn FnMut(&str, &[TokenLogprob]),
) -> Result<(Generation, Option<KvState>, Vec<KvState>)> {
    let mut ended = if req.params.logprobs.is_some() || req.params.constraint.is_some() {
        super::guided::generate(req, from, on_piece)?
    } else {
        match req.params.draft {
            DraftMode::None => generate_plain(req, from, on_piece)?,
            _ => super::speculative::generate(req, from, on_piece)?,
        }
    };
    let marks = std::mem::take(&mut ended.marks);
    let (g, state) = ended.into_state(req.prompt);
    Ok((g, state, marks))
}
