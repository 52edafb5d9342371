//! Speculative decoding: propose a few tokens cheaply, score them all in one forward pass of
//! the main model, keep the prefix the main model agrees with, and roll the KV caches back
//! past the rest.
//!
//! Drafts come from the model's MTP head (`model::mtp`) or from n-gram matches in the prompt
//! and the text so far (prompt lookup). Either way the output follows the main model exactly:
//! greedy keeps a draft only where it equals the main model's argmax; sampling accepts draft
//! d with probability min(1, p(d)/q(d)) and on rejection draws from the normalised residual
//! max(0, p - q), which leaves every token distributed as p (Leviathan et al., Chen et al.,
//! 2023). p is the distribution plain sampling would use at that position (penalties,
//! temperature, top-k/p, min-p); q is the draft's (one-hot for prompt lookup).

use std::sync::atomic::Ordering;

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::ops::{self, concatenate};
use mlx_rs::transforms::eval;
use mlx_rs::{random, Array};

use super::output::Output;
use super::request::{
    begin, cancelled_early, token_array, Begin, DraftMode, DraftStats, Ended, PrefillStates,
    Request, TokenLogprob,
};
use super::sampler::Sampler;
use crate::error::{EngineError, Result};
use crate::model::kv_cache::{KvCache, KvState};
use crate::model::mtp::MtpHead;
use crate::model::LoadedModel;

/// One round's drafts, on the device: ids [k] and, when sampling, the distributions they were
/// drawn from ([k, V]; `None` means one-hot, as for prompt lookup and greedy MTP).
struct Drafts {
    ids: Option<Array>,
    q: Option<Array>,
}

impl Drafts {
    fn none() -> Drafts {
        Drafts { ids: None, q: None }
    }

    fn from_host(ids: &[u32]) -> Drafts {
        Drafts {
            ids: (!ids.is_empty()).then(|| Array::from_slice(ids, &[ids.len() as i32])),
            q: None,
        }
    }

    fn len(&self) -> usize {
        self.ids.as_ref().map_or(0, |ids| ids.shape()[0] as usize)
    }
}

/// The main model's verdict on a round, still on the device.
struct Verdict {
    /// Greedy: the argmax of every row [k + 1]. Sampling: a draw per row from the residual
    /// (rows < k) or from p (row k).
    choice: Array,
    /// Sampling only: whether each draft passed its acceptance test [k].
    accept: Option<Array>,
}

/// Score `logits` ([k + 1, V], row j following draft j) against `drafts`.
fn verify(
    sampler: &mut Sampler,
    logits: &Array,
    drafts: &Drafts,
    vocab_ids: &Array,
) -> Result<Verdict> {
    let p_logits = sampler.penalised(logits, drafts.ids.as_ref())?;
    if sampler.is_greedy() {
        return Ok(Verdict { choice: argmax_axis(&p_logits, -1, None)?, accept: None });
    }
    let p = ops::softmax_axis(&sampler.filtered(&p_logits)?, -1, true)?;
    let (Some(ids), k) = (&drafts.ids, drafts.len() as i32) else {
        let key = sampler.next_key()?;
        return Ok(Verdict {
            choice: random::categorical(&p.log()?, -1, None, &key)?,
            accept: None,
        });
    };
    let q = match &drafts.q {
        Some(q) => q.clone(),
        None => one_hot(ids, vocab_ids)?,
    };
    let (accept, choice) =
        rejection_step(&p, &q, ids, sampler.next_key()?, sampler.next_key()?, Residual::Exact)?;
    debug_assert_eq!(accept.shape(), &[k]);
    Ok(Verdict { choice, accept: Some(accept) })
}

fn one_hot(ids: &Array, vocab_ids: &Array) -> Result<Array> {
    Ok(vocab_ids
        .reshape(&[1, -1])?
        .eq(&ids.reshape(&[-1, 1])?)?
        .as_dtype(mlx_rs::Dtype::Float32)?)
}

/// How a rejected draft's replacement is drawn; only `Exact` is ever used outside the tests
/// that show the distribution test catches a wrong rule.
#[derive(Clone, Copy)]
enum Residual {
    /// max(0, p - q), normalised.
    Exact,
    #[cfg(test)]
    /// p itself: the classic mistake (over-weights the rejected draft's competitors wrongly).
    PlainP,
}

/// Speculative sampling for k drafts: `p` [k + 1, V] target distributions, `q` [k, V] draft
/// distributions, `ids` [k] drafts. Returns (accept [k], choice [k + 1]): draft j is kept when
/// u * q(d) < p(d) (u uniform in [0, 1)), i.e. with probability min(1, p/q); choice j < k is a
/// draw from the residual of row j, choice k a draw from p of the last row (the bonus token).
fn rejection_step(
    p: &Array,
    q: &Array,
    ids: &Array,
    key_u: Array,
    key_c: Array,
    rule: Residual,
) -> Result<(Array, Array)> {
    let k = ids.shape()[0];
    let rows = p.index(..k);
    let col = ids.reshape(&[-1, 1])?;
    let pd = rows.take_along_axis(&col, -1)?.reshape(&[-1])?;
    let qd = q.take_along_axis(&col, -1)?.reshape(&[-1])?;
    let u = random::uniform::<_, f32>(0.0, 1.0, &[k], &key_u)?;
    let accept = u.multiply(&qd)?.lt(&pd)?;
    let residual = match rule {
        Residual::Exact => ops::maximum(&rows.subtract(q)?, Array::from_f32(0.0))?,
        #[cfg(test)]
        Residual::PlainP => rows.clone(),
    };
    // categorical() normalises; an all-zero residual only happens when p == q, where the
    // draft is always accepted and this row's draw is never used.
    let dist = concatenate(&[residual, p.index(k..)], 0)?;
    let choice = random::categorical(&dist.log()?, -1, None, &key_c)?;
    Ok((accept, choice))
}

/// The MTP head's state across rounds: its own KV cache, and how many chained (speculative)
/// positions it holds beyond the confirmed ones.
struct MtpDrafter<'m> {
    head: &'m MtpHead,
    cache: KvCache,
    depth: usize,
    chained: i32,
}

impl MtpDrafter<'_> {
    /// Feed confirmed pairs (main hidden state at p, token at p + 1) and draft up to `count`
    /// tokens after the last one.
    fn draft(
        &mut self,
        model: &LoadedModel,
        sampler: &mut Sampler,
        hidden: &Array,
        next: &[u32],
        count: usize,
    ) -> Result<Drafts> {
        let trimmed = self.cache.trim(self.chained);
        debug_assert_eq!(trimmed, self.chained);
        let m =
            self.head.forward(model.net.as_ref(), hidden, &token_array(next), &mut self.cache)?;
        let mut last = m.index((.., -1.., ..));
        let (mut ids, mut qs) = (Vec::new(), Vec::new());
        for j in 0..count {
            if j > 0 {
                let prev: &Array = ids.last().unwrap();
                last = self.head.forward(
                    model.net.as_ref(),
                    &last,
                    &prev.reshape(&[1, 1])?,
                    &mut self.cache,
                )?;
            }
            let logits =
                model.net.logits(&last)?.reshape(&[1, -1])?.as_dtype(mlx_rs::Dtype::Float32)?;
            if sampler.is_greedy() {
                ids.push(argmax_axis(&logits, -1, None)?);
            } else {
                let q = ops::softmax_axis(&sampler.filtered(&logits)?, -1, true)?;
                let key = sampler.next_key()?;
                ids.push(random::categorical(&q.log()?, -1, None, &key)?);
                qs.push(q);
            }
        }
        self.chained = count.saturating_sub(1) as i32;
        if ids.is_empty() {
            return Ok(Drafts::none());
        }
        let refs: Vec<&Array> = ids.iter().collect();
        let q = if qs.is_empty() {
            None
        } else {
            Some(concatenate(&qs.iter().collect::<Vec<_>>(), 0)?)
        };
        Ok(Drafts { ids: Some(concatenate(&refs, 0)?), q })
    }
}

/// Up to `limit` tokens that followed the most recent earlier occurrence of the last n tokens
/// of `history`, trying n from `max_ngram` down to `min_ngram`.
pub fn lookup_draft(history: &[u32], min_ngram: usize, max_ngram: usize, limit: usize) -> Vec<u32> {
    let len = history.len();
    for n in (min_ngram..=max_ngram).rev() {
        if len <= n || limit == 0 {
            continue;
        }
        let pattern = &history[len - n..];
        if let Some(i) = (0..len - n).rev().find(|&i| &history[i..i + n] == pattern) {
            let from = i + n;
            return history[from..len.min(from + limit)].to_vec();
        }
    }
    Vec::new()
}

/// One prompt-lookup round outside `generate`, for a batch's sequence decoding alone in its
/// step: feed `y` then `drafts`, keep the drafts the main model agrees with (as `generate`
/// does), roll `caches` back past the rest, and record the taken tokens with `sampler`.
/// Returns the accepted drafts followed by the model's own next token.
pub(crate) fn lookup_round(
    model: &LoadedModel,
    caches: &mut [KvCache],
    sampler: &mut Sampler,
    y: u32,
    drafts: &[u32],
) -> Result<Vec<u32>> {
    let mut fed = vec![y];
    fed.extend_from_slice(drafts);
    let hidden = model.hidden(&token_array(&fed), caches)?;
    let logits = model.net.logits(&hidden)?.index(0);
    let drafts_dev = Drafts::from_host(drafts);
    // The vocabulary's ids only serve sampling's one-hot draft distributions.
    let vocab_ids = match sampler.is_greedy() || drafts.is_empty() {
        true => Array::from_int(0),
        false => ops::arange::<_, i32>(None, model.vocab_size as i32, None)?,
    };
    let verdict = verify(sampler, &logits, &drafts_dev, &vocab_ids)?;
    let mut pending: Vec<&Array> = vec![&verdict.choice];
    pending.extend(verdict.accept.iter());
    eval(pending)?;
    let choice: Vec<u32> =
        verdict.choice.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>().to_vec();
    let accepted = match &verdict.accept {
        Some(acc) => acc.as_slice::<bool>().iter().take_while(|&&a| a).count(),
        None => drafts.iter().zip(&choice).take_while(|(d, c)| d == c).count(),
    };
    let rejected = (drafts.len() - accepted) as i32;
    for c in caches.iter_mut() {
        if c.trim(rejected) != rejected {
            return Err(EngineError::Internal(
                "a KV cache could not roll back a rejected draft".into(),
            ));
        }
    }
    let mut taken = drafts[..accepted].to_vec();
    taken.push(choice[accepted]);
    sampler.observe_ids(&taken)?;
    Ok(taken)
}

/// How many tokens the next lookup round drafts after one that drafted `k` and kept
/// `accepted`: verifying a long wrong draft costs more than a plain step, so the length grows
/// (doubling) while drafts are accepted and falls back to what was accepted + 1.
pub(crate) fn next_draft_len(k: usize, accepted: usize, max_draft: usize) -> usize {
    if k > 0 && accepted == k {
        (2 * k).min(max_draft)
    } else {
        (accepted + 1).min(max_draft)
    }
}

/// Speculative decoding; called by `generate::generate` when `params.draft` is not `None`.
pub(crate) fn generate(
    req: Request<'_>,
    from: Option<KvState>,
    on_piece: &mut dyn FnMut(&str, &[TokenLogprob]),
) -> Result<Ended> {
    req.params.draft.validate(req.model)?;
    let Begin { max_tokens, start, mut sampler, mut caches, mtp, reused } = begin(&req, from)?;
    let Request { model, prompt, params, cancel, marks: keep_marks } = req;
    let vocab_ids = ops::arange::<_, i32>(None, model.vocab_size as i32, None)?;
    let mut mtp = match (&params.draft, &model.mtp, mtp) {
        (DraftMode::Mtp { depth }, Some(head), Some(cache)) => {
            Some(MtpDrafter { head, cache, depth: *depth, chained: 0 })
        }
        _ => None,
    };
    let mut stats = DraftStats {
        mode: if mtp.is_some() { "mtp" } else { "lookup" }.into(),
        mtp_depth: mtp.as_ref().map_or(0, |m| m.depth),
        ..Default::default()
    };

    // Prefill all but the last prompt token (after those the caches hold already); the MTP
    // head sees each (hidden, next token) pair.
    let last = &prompt[prompt.len() - 1..];
    let head = &prompt[reused..prompt.len() - 1];
    let chunk = params.prefill_chunk.max(1);
    let mut marks = PrefillStates::new(keep_marks);
    for (c, ids) in head.chunks(chunk).enumerate() {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            // What was prefilled stays usable: a retry of the same prompt starts from it.
            let ended = Ended::new(cancelled_early(prompt.len(), start), caches, None, reused);
            return Ok(ended.with_marks(marks));
        }
        let hidden = model.hidden(&token_array(ids), &mut caches)?;
        let mut state: Vec<&Array> = caches.iter().flat_map(|c| c.state()).collect();
        if let Some(m) = &mut mtp {
            let from = reused + c * chunk + 1;
            m.head.forward(
                model.net.as_ref(),
                &hidden,
                &token_array(&prompt[from..from + ids.len()]),
                &mut m.cache,
            )?;
            state.extend(m.cache.state());
        }
        eval(state)?;
        let at = reused + c * chunk + ids.len();
        if at < prompt.len() - 1 {
            marks.mark(prompt, at, &caches);
        }
    }

    let mut out = Output::new(model, params, max_tokens, cancel, on_piece);
    let mut history = prompt.to_vec();
    let mut y = last[0];
    let mut drafts = Drafts::none();
    loop {
        let k = drafts.len();
        let input = match &drafts.ids {
            Some(ids) => concatenate(
                &[Array::from_slice(&[y], &[1]), ids.as_dtype(mlx_rs::Dtype::Uint32)?],
                0,
            )?
            .reshape(&[1, -1])?,
            None => token_array(&[y]),
        };
        let hidden = model.hidden(&input, &mut caches)?;
        let logits = model.net.logits(&hidden)?.index(0);
        let verdict = verify(&mut sampler, &logits, &drafts, &vocab_ids)?;
        let mut pending: Vec<&Array> = vec![&verdict.choice];
        pending.extend(verdict.accept.iter());
        pending.extend(drafts.ids.iter());
        eval(pending)?;

        let draft_ids: Vec<u32> = match &drafts.ids {
            Some(ids) => ids.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>().to_vec(),
            None => vec![],
        };
        let choice: Vec<u32> =
            verdict.choice.as_dtype(mlx_rs::Dtype::Uint32)?.as_slice::<u32>().to_vec();
        let accepted = match &verdict.accept {
            Some(acc) => acc.as_slice::<bool>().iter().take_while(|&&a| a).count(),
            None => draft_ids.iter().zip(&choice).take_while(|(d, c)| d == c).count(),
        };
        let next = choice[accepted];
        stats.record(k, accepted);

        let mut going = true;
        for &id in draft_ids[..accepted].iter().chain([&next]) {
            going = out.push(id)?;
            if !going {
                break;
            }
        }
        // Roll back the rejected drafts' positions, also when the answer ends here: the caches
        // must hold exactly the tokens that were output (the prefix cache keeps them).
        let rejected = (k - accepted) as i32;
        for c in caches.iter_mut() {
            if c.trim(rejected) != rejected {
                return Err(EngineError::Internal(
                    "a KV cache could not roll back a rejected draft".into(),
                ));
            }
        }
        if !going {
            break;
        }
        let mut taken = draft_ids[..accepted].to_vec();
        taken.push(next);
        sampler.observe_ids(&taken)?;
        history.extend_from_slice(&taken);

        // Next round: at most what max_tokens and the context leave room for.
        let position = caches[0].offset() as usize; // where `next` goes
        let room = (max_tokens - out.tokens().len())
            .saturating_sub(1)
            .min(model.context_length.saturating_sub(position + 1));
        drafts = match (&mut mtp, &params.draft) {
            (Some(m), _) => {
                let confirmed = hidden.index((.., ..=accepted as i32, ..));
                let count = m.depth.min(room);
                m.draft(model, &mut sampler, &confirmed, &taken, count)?
            }
            (None, DraftMode::Lookup { min_ngram, max_ngram, max_draft }) => {
                let len = next_draft_len(k, accepted, *max_draft);
                Drafts::from_host(&lookup_draft(&history, *min_ngram, *max_ngram, len.min(room)))
            }
            _ => Drafts::none(),
        };
        y = next;
    }
    let generation = out.finish(prompt.len(), start, Some(stats))?;
    // Only the MTP head's confirmed pairs are worth keeping.
    let mtp = mtp.and_then(|mut m| (m.cache.trim(m.chained) == m.chained).then_some(m.cache));
    Ok(Ended::new(generation, caches, mtp, reused).with_marks(marks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_longest_match() {
        // "1 2 3 9 ... 1 2 3" -> the 3-gram matches and its continuation is drafted.
        let h = [1, 2, 3, 9, 8, 7, 5, 1, 2, 3];
        assert_eq!(lookup_draft(&h, 1, 3, 4), vec![9, 8, 7, 5]);
        assert_eq!(lookup_draft(&h, 1, 3, 2), vec![9, 8]);
        // The latest occurrence wins over an earlier one.
        let h = [4, 5, 1, 4, 5, 2, 4, 5];
        assert_eq!(lookup_draft(&h, 2, 2, 3), vec![2, 4, 5]);
        // No n-gram of the allowed sizes repeats: nothing to draft.
        assert!(lookup_draft(&[1, 2, 3, 4], 2, 3, 4).is_empty());
        assert!(lookup_draft(&[1, 2, 1], 2, 3, 4).is_empty());
        assert_eq!(lookup_draft(&[1, 2, 1], 1, 3, 4), vec![2, 1]);
    }

    #[test]
    fn stats_count_by_depth_and_bonus() {
        let mut s = DraftStats::default();
        s.record(3, 3);
        s.record(3, 1);
        s.record(0, 0);
        assert_eq!(s.verify_calls, 3);
        assert_eq!(s.drafted_by_depth, vec![2, 2, 2]);
        assert_eq!(s.accepted_by_depth, vec![2, 1, 1]);
        assert_eq!(s.bonus_tokens, 1);
        assert!((s.acceptance_rate - 4.0 / 6.0).abs() < 1e-12);
    }

    /// Pearson chi-square of `counts` against probabilities `p` (bins with expectation < 5
    /// pooled), and its degrees of freedom.
    fn chi_square(counts: &[f64], p: &[f64]) -> (f64, usize) {
        let n: f64 = counts.iter().sum();
        let (mut stat, mut bins, mut pool_o, mut pool_e) = (0.0, 0, 0.0, 0.0);
        for (o, pi) in counts.iter().zip(p) {
            let e = pi * n;
            if e < 5.0 {
                pool_o += o;
                pool_e += e;
            } else {
                stat += (o - e).powi(2) / e;
                bins += 1;
            }
        }
        if pool_e > 0.0 {
            stat += (pool_o - pool_e).powi(2) / pool_e.max(1e-9);
            bins += 1;
        }
        (stat, bins - 1)
    }

    /// Upper 0.1 % point of chi-square with `df` degrees of freedom (Wilson-Hilferty).
    fn chi_square_critical(df: usize) -> f64 {
        let d = df as f64;
        let z = 3.090; // standard normal, one-sided 0.001
        d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
    }

    /// Run the one-draft rejection step `n` times and count the resulting token.
    fn first_token_counts(p: &[f32], q: &[f32], rule: Residual, n: usize) -> Vec<f64> {
        let v = p.len() as i32;
        let p_arr = Array::from_slice(&[p, p].concat(), &[2, v]);
        let q_arr = Array::from_slice(q, &[1, v]);
        let q_log = q_arr.log().unwrap();
        let mut counts = vec![0.0; p.len()];
        let mut key = random::key(1234).unwrap();
        for _ in 0..n {
            let mut sub = || {
                let (next, sub) = random::split(&key, 2).unwrap();
                key = next;
                sub
            };
            let d = random::categorical(&q_log, -1, None, &sub()).unwrap();
            let (ku, kc) = (sub(), sub());
            let (accept, choice) = rejection_step(&p_arr, &q_arr, &d, ku, kc, rule).unwrap();
            let token = if accept.as_slice::<bool>()[0] {
                d.as_slice::<u32>()[0]
            } else {
                choice.as_slice::<u32>()[0]
            };
            counts[token as usize] += 1.0;
        }
        counts
    }

    #[test]
    fn rejection_sampling_reproduces_the_target_distribution() {
        // A draft that over-weights token 0 and misses token 3 entirely.
        let p = [0.1f32, 0.2, 0.3, 0.4];
        let q = [0.55f32, 0.25, 0.2, 0.0];
        let p64: Vec<f64> = p.iter().map(|&x| x as f64).collect();
        let n = 4000;
        let (stat, df) = chi_square(&first_token_counts(&p, &q, Residual::Exact, n), &p64);
        let critical = chi_square_critical(df);
        assert!(stat < critical, "exact rule: chi-square {stat:.1} >= {critical:.1} (df {df})");
        // The test has the power to see a wrong residual: drawing replacements from p itself.
        let (bad, _) = chi_square(&first_token_counts(&p, &q, Residual::PlainP, n), &p64);
        eprintln!("chi-square (df {df}, 0.1% critical {critical:.1}): exact rule {stat:.1}, residual = p {bad:.1}");
        assert!(
            bad > critical,
            "a broken rule went unnoticed: chi-square {bad:.1} < {critical:.1}"
        );
    }
}
