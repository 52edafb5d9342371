//! Decoding where the host looks at every step: per-token logprobs, and grammars
//! (`constraint`: forced tool calls, `json_object`, JSON schemas), which end the generation
//! when complete. Each step's choice needs the host, so steps are not queued ahead; the
//! grammar's mask is computed while the model's forward pass runs.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::Array;

use super::output::Output;
use super::request::{
    begin, cancelled_early, host_u32, prefill, token_array, Begin, Ended, GenerateParams,
    PrefillStates, Request, TokenLogprob, TopLogprob,
};
use super::sampler::Sampler;
use crate::error::{EngineError, Result};
use crate::model::kv_cache::KvState;
use crate::tokenizer::Tokenizer;

/// Candidates checked against the constraint before the rest of the vocabulary is sorted.
const CANDIDATES: usize = 64;

pub(crate) fn generate(
    req: Request<'_>,
    from: Option<KvState>,
    on_piece: &mut dyn FnMut(&str, &[TokenLogprob]),
) -> Result<Ended> {
    let Begin { max_tokens, start, mut sampler, mut caches, reused, .. } = begin(&req, from)?;
    let Request { model, prompt, params, cancel, marks: keep_marks } = req;
    let mut marks = PrefillStates::new(keep_marks);
    let head = reused..prompt.len() - 1;
    if !prefill(model, prompt, head, params.prefill_chunk, &mut caches, cancel, &mut marks)? {
        // What was prefilled stays usable: a retry of the same prompt starts from it.
        let ended = Ended::new(cancelled_early(prompt.len(), start), caches, None, reused);
        return Ok(ended.with_marks(marks));
    }
    let mut guide = Guide::new(params, start);
    let mut out = Output::new(model, params, max_tokens, cancel, on_piece);
    let mut input = prompt[prompt.len() - 1];
    loop {
        let logits = model.forward(&token_array(&[input]), &mut caches)?.index((.., -1, ..));
        let (id, lp) = guide.pick(&model.tokenizer, &mut sampler, &logits)?;
        if !out.push_with(id, lp)? {
            break;
        }
        if guide.done() {
            out.stop();
            break;
        }
        input = id;
    }
    Ok(Ended::new(out.finish(prompt.len(), start, None)?, caches, None, reused).with_marks(marks))
}

/// One generation's per-step host work: its grammar, the random stream sampling under it
/// draws from, and how many logprobs it reports. Solo decoding (`generate`) and a batch's
/// sequences (`batch`) choose each token through it.
pub(crate) struct Guide {
    grammar: Option<super::constraint::Constraint>,
    rng: HostRng,
    logprobs: Option<usize>,
}

impl Guide {
    /// Whether a generation with `params` needs the host at every step.
    pub fn needed(params: &GenerateParams) -> bool {
        params.logprobs.is_some() || params.constraint.is_some()
    }

    pub fn new(params: &GenerateParams, start: std::time::Instant) -> Guide {
        let seed = params
            .sampling
            .seed
            .unwrap_or_else(|| start.elapsed().as_nanos() as u64 ^ 0x9E37_79B9_7F4A_7C15);
        Guide {
            grammar: params.constraint.clone(),
            rng: HostRng::new(seed),
            logprobs: params.logprobs,
        }
    }

    /// The grammar is complete: the generation ends here.
    pub fn done(&self) -> bool {
        self.grammar.as_ref().is_some_and(|g| g.is_done())
    }

    /// The next token from one position's `logits` ([1, V], still lazy), with its logprobs
    /// when they were asked for.
    pub fn pick(
        &mut self,
        tokenizer: &Tokenizer,
        sampler: &mut Sampler,
        logits: &Array,
    ) -> Result<(u32, Option<TokenLogprob>)> {
        let logits = logits.as_dtype(mlx_rs::Dtype::Float32)?;
        let id = match &mut self.grammar {
            Some(g) => {
                // The mask is host work: start the forward pass first so the two overlap.
                async_eval([&logits])?;
                let allowed = g.allowed().map_err(grammar_failed)?;
                let scores = sampler.penalised(&logits, None)?;
                let scores =
                    if sampler.is_greedy() { scores } else { sampler.filtered(&scores)? };
                scores.eval()?;
                let id = choose(
                    scores.as_slice::<f32>(),
                    |id| allowed.contains(id),
                    sampler.is_greedy(),
                    &mut self.rng,
                )
                .or_else(|| {
                    // The filters left nothing the grammar allows: the best allowed logit.
                    logits.eval().ok()?;
                    let raw = logits.as_slice::<f32>();
                    (0..raw.len() as u32)
                        .filter(|&i| allowed.contains(i))
                        .max_by(|a, b| raw[*a as usize].total_cmp(&raw[*b as usize]))
                })
                .ok_or_else(|| grammar_failed("no token of this vocabulary continues it".into()))?;
                if !tokenizer.is_eos(id) {
                    g.consume(id).map_err(grammar_failed)?;
                }
                sampler.observe_ids(&[id])?;
                id
            }
            None => {
                let y = sampler.sample(&logits)?;
                eval([&y, &logits])?;
                host_u32(&y)?
            }
        };
        let lp = match self.logprobs {
            Some(n) => Some(token_logprob(tokenizer, logits.as_slice::<f32>(), id, n)?),
            None => None,
        };
        Ok((id, lp))
    }
}

fn token_logprob(
    tokenizer: &Tokenizer,
    logits: &[f32],
    id: u32,
    top: usize,
) -> Result<TokenLogprob> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let lse = max + logits.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32;
    let text = |t: u32| tokenizer.decode(&[t]);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(order.len());
    if top > 0 {
        order.select_nth_unstable_by(top - 1, |a, b| {
            logits[*b as usize].total_cmp(&logits[*a as usize])
        });
        order.truncate(top);
        order.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
    }
    Ok(TokenLogprob {
        token: id,
        text: text(id)?,
        logprob: logits[id as usize] - lse,
        top: order
            .into_iter()
            .take(top)
            .map(|t| Ok(TopLogprob { token: t, text: text(t)?, logprob: logits[t as usize] - lse }))
            .collect::<Result<_>>()?,
    })
}

/// The best (greedy) or a sampled token among the finite `scores` that `allowed` lets
/// through; `None` when it lets none through.
fn choose(
    scores: &[f32],
    allowed: impl Fn(u32) -> bool,
    greedy: bool,
    rng: &mut HostRng,
) -> Option<u32> {
    let mut order: Vec<u32> =
        (0..scores.len() as u32).filter(|&i| scores[i as usize].is_finite()).collect();
    let by_score = |a: &u32, b: &u32| scores[*b as usize].total_cmp(&scores[*a as usize]);
    // The few best usually include an allowed token; sort everything only when they do not.
    let k = CANDIDATES.min(order.len());
    if k > 0 {
        order.select_nth_unstable_by(k - 1, by_score);
    }
    let (head, tail) = order.split_at_mut(k);
    head.sort_by(by_score);
    let mut pick = |candidates: &[u32]| -> Option<u32> {
        let ok: Vec<u32> = candidates.iter().copied().filter(|&i| allowed(i)).collect();
        if greedy {
            return ok.first().copied();
        }
        // Sampling restricted to the allowed tokens: renormalise their probabilities.
        let max = ok.iter().map(|&i| scores[i as usize]).fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> =
            ok.iter().map(|&i| ((scores[i as usize] - max) as f64).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut u = rng.next_f64() * total;
        for (i, w) in ok.iter().zip(&weights) {
            if u < *w {
                return Some(*i);
            }
            u -= w;
        }
        ok.last().copied()
    };
    if let Some(id) = pick(head) {
        return Some(id);
    }
    let mut rest = tail.to_vec();
    rest.sort_by(by_score);
    pick(&rest)
}

fn grammar_failed(e: String) -> EngineError {
    EngineError::Internal(format!("constrained decoding failed: {e}"))
}

/// splitmix64: the host-side random stream for sampling restricted to a grammar's tokens.
struct HostRng(u64);

impl HostRng {
    fn new(seed: u64) -> HostRng {
        HostRng(seed)
    }

    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}
