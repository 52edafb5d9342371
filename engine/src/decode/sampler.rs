//! Token sampling, done with MLX ops so the decode loop can queue the next step before the
//! current token reaches the host (see `generate`).

use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::ops::{self, argpartition_axis, concatenate, cumsum};
use mlx_rs::{random, Array};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling; 1.0 disables.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: u32,
    /// Drop tokens whose probability is below `min_p` times the top one's; 0 disables.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of every token already in the
    /// prompt or the output; 1.0 disables.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a token already generated (OpenAI semantics).
    pub frequency_penalty: f32,
    /// Same seed and settings give the same text. `None` picks one at random.
    pub seed: Option<u64>,
    /// Added to the logits of these token ids before anything else (OpenAI's `logit_bias`:
    /// -100 bans a token, 100 all but forces it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: vec![],
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(EngineError::InvalidRequest(m.to_string()));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty must be > 0");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty)
            || !(-2.0..=2.0).contains(&self.frequency_penalty)
        {
            return bad("presence_penalty and frequency_penalty must be in [-2, 2]");
        }
        Ok(())
    }
}

/// Per-generation sampling state, kept on the device.
pub struct Sampler {
    params: SamplingParams,
    key: Array,
    /// 1.0 for every token seen in the prompt or output (repetition penalty), shape [V].
    seen: Option<Array>,
    /// Occurrences of each generated token (presence / frequency penalties), shape [V].
    counts: Option<Array>,
    /// 0..V, for the one-hot update of `seen`/`counts`; built once, only when penalties are on.
    vocab_ids: Option<Array>,
    /// `logit_bias` as a dense [V] row.
    bias: Option<Array>,
    vocab: i32,
}

impl Sampler {
    pub fn new(params: SamplingParams, vocab: usize, prompt: &[u32]) -> Result<Sampler> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(random_seed);
        let vocab = vocab as i32;
        let seen = if params.repetition_penalty != 1.0 {
            let mut mask = vec![0f32; vocab as usize];
            for &t in prompt {
                if let Some(m) = mask.get_mut(t as usize) {
                    *m = 1.0;
                }
            }
            Some(Array::from_slice(&mask, &[vocab]))
        } else {
            None
        };
        let counts = (params.presence_penalty != 0.0 || params.frequency_penalty != 0.0)
            .then(|| ops::zeros::<f32>(&[vocab]))
            .transpose()?;
        let vocab_ids = (seen.is_some() || counts.is_some())
            .then(|| ops::arange::<_, i32>(None, vocab, None))
            .transpose()?;
        let bias = if params.logit_bias.is_empty() {
            None
        } else {
            let mut row = vec![0f32; vocab as usize];
            for &(id, b) in &params.logit_bias {
                let slot = row.get_mut(id as usize).ok_or_else(|| EngineError::BadField {
                    field: "logit_bias",
                    msg: format!(
                        "`logit_bias` names token {id}, outside the vocabulary (0 to {})",
                        vocab - 1
                    ),
                })?;
                *slot = b;
            }
            Some(Array::from_slice(&row, &[vocab]))
        };
        Ok(Sampler { key: random::key(seed)?, params, seen, counts, vocab_ids, bias, vocab })
    }

    /// `logits`: [1, V] (any float dtype) → the chosen token id, shape [1], still lazy.
    pub fn sample(&mut self, logits: &Array) -> Result<Array> {
        let logits = self.penalised(logits, None)?;
        let token = if self.is_greedy() {
            argmax_axis(&logits, -1, None)?
        } else {
            let key = self.next_key()?;
            random::categorical(&self.filtered(&logits)?, -1, None, &key)?
        };
        self.observe(&token)?;
        Ok(token)
    }

    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0
    }

    /// A fresh random key, advancing the generation's seeded stream.
    pub fn next_key(&mut self) -> Result<Array> {
        let (next, sub) = random::split(&self.key, 2)?;
        self.key = next;
        Ok(sub)
    }

    /// Apply the repetition / presence / frequency penalties to `logits` ([R, V]) as f32.
    /// `drafted` ([R - 1] token ids) are tokens not yet taken, one per row: row j is penalised
    /// as if `drafted[..j]` had been generated (speculative verification scores R positions
    /// at once).
    pub fn penalised(&self, logits: &Array, drafted: Option<&Array>) -> Result<Array> {
        let mut logits = logits.as_dtype(mlx_rs::Dtype::Float32)?;
        if let Some(bias) = &self.bias {
            logits = logits.add(bias)?;
        }
        let p = &self.params;
        let extra = match (drafted, &self.vocab_ids) {
            (Some(d), Some(ids)) if d.size() > 0 => {
                let one_hot = ids
                    .reshape(&[1, -1])?
                    .eq(&d.reshape(&[-1, 1])?)?
                    .as_dtype(mlx_rs::Dtype::Float32)?;
                let before = cumsum(&one_hot, 0, None, None)?;
                Some(concatenate(&[ops::zeros::<f32>(&[1, self.vocab])?, before], 0)?)
            }
            _ => None,
        };
        if let Some(seen) = &self.seen {
            let seen = match &extra {
                Some(e) => ops::maximum(seen, e)?,
                None => seen.clone(),
            };
            let penalised = ops::select(
                &logits.lt(Array::from_f32(0.0))?,
                &logits.multiply(Array::from_f32(p.repetition_penalty))?,
                &logits.divide(Array::from_f32(p.repetition_penalty))?,
            )?;
            logits = ops::select(&seen.gt(Array::from_f32(0.0))?, &penalised, &logits)?;
        }
        if let Some(counts) = &self.counts {
            let counts = match &extra {
                Some(e) => counts.add(e)?,
                None => counts.clone(),
            };
            let presence = counts.gt(Array::from_f32(0.0))?.as_dtype(mlx_rs::Dtype::Float32)?;
            logits = logits
                .subtract(presence.multiply(Array::from_f32(p.presence_penalty))?)?
                .subtract(counts.multiply(Array::from_f32(p.frequency_penalty))?)?;
        }
        Ok(logits)
    }

    /// Temperature, then top-k, min-p and top-p as -inf logits: what `sample` draws from when
    /// not greedy. `logits`: [R, V] f32.
    pub fn filtered(&self, logits: &Array) -> Result<Array> {
        let p = &self.params;
        let mut logits = logits.multiply(Array::from_f32(1.0 / p.temperature))?;
        // Compared wide: a top_k past i32 (clients send "no limit" as huge numbers) must not
        // wrap negative; any k at or past the vocabulary keeps every token.
        if p.top_k > 0 && i64::from(p.top_k) < i64::from(self.vocab) {
            logits = keep_top_k(&logits, p.top_k as i32)?;
        }
        if p.min_p > 0.0 {
            logits = keep_min_p(&logits, p.min_p)?;
        }
        if p.top_p < 1.0 {
            logits = keep_top_p(&logits, p.top_p)?;
        }
        Ok(logits)
    }

    /// Record tokens taken outside `sample` (speculative decoding's accepted drafts).
    pub fn observe_ids(&mut self, ids: &[u32]) -> Result<()> {
        for &id in ids {
            if self.vocab_ids.is_none() {
                break;
            }
            self.observe(&Array::from_slice(&[id], &[1]))?;
        }
        Ok(())
    }

    fn observe(&mut self, token: &Array) -> Result<()> {
        let Some(ids) = &self.vocab_ids else {
            return Ok(());
        };
        let one_hot = ids.eq(token)?.as_dtype(mlx_rs::Dtype::Float32)?;
        if let Some(seen) = &self.seen {
            self.seen = Some(ops::maximum(seen, &one_hot)?);
        }
        if let Some(counts) = &self.counts {
            self.counts = Some(counts.add(&one_hot)?);
        }
        Ok(())
    }
}

const NEG_INF: f32 = f32::NEG_INFINITY;

fn keep_top_k(logits: &Array, k: i32) -> Result<Array> {
    // The k-th largest value is the threshold; argpartition puts it at position V-k.
    let v = logits.shape()[logits.ndim() - 1];
    let idx = argpartition_axis(logits, v - k, -1)?;
    let kth = logits.take_along_axis(idx.index((.., (v - k)..(v - k + 1))), -1)?;
    Ok(ops::select(&logits.lt(&kth)?, Array::from_f32(NEG_INF), logits)?)
}

fn keep_min_p(logits: &Array, min_p: f32) -> Result<Array> {
    let top = logits.max_axis(-1, true)?;
    let threshold = top.add(Array::from_f32(min_p.ln()))?;
    Ok(ops::select(&logits.lt(&threshold)?, Array::from_f32(NEG_INF), logits)?)
}

fn keep_top_p(logits: &Array, top_p: f32) -> Result<Array> {
    // Keep the smallest set of most likely tokens whose probabilities sum to at least top_p.
    let probs = ops::softmax_axis(logits, -1, true)?;
    let order = ops::argsort_axis(&probs.negative()?, -1)?; // descending
    let sorted = probs.take_along_axis(&order, -1)?;
    let before = cumsum(&sorted, -1, None, None)?.subtract(&sorted)?; // mass strictly above each
    let keep_sorted = before.lt(Array::from_f32(top_p))?;
    // Scatter the keep mask back to vocabulary order.
    let keep = ops::zeros::<bool>(logits.shape())?.put_along_axis(&order, &keep_sorted, -1)?;
    Ok(ops::select(&keep, logits, Array::from_f32(NEG_INF))?)
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_once(s: &mut Sampler, logits: &[f32]) -> u32 {
        let a = Array::from_slice(logits, &[1, logits.len() as i32]);
        s.sample(&a).unwrap().try_item_cast::<u32>().unwrap()
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy(), 4, &[]).unwrap();
        assert_eq!(sample_once(&mut s, &[0.1, 3.0, 2.9, -1.0]), 1);
    }

    #[test]
    fn presence_penalty_subtracts_once_per_seen_token() {
        let p = SamplingParams { presence_penalty: 1.5, ..Default::default() };
        let mut s = Sampler::new(p, 3, &[]).unwrap();
        assert_eq!(sample_once(&mut s, &[5.0, 4.0, 0.0]), 0);
        // Token 0 now costs 1.5: 3.5 < 4.0.
        assert_eq!(sample_once(&mut s, &[5.0, 4.0, 0.0]), 1);
        // Both seen once: 3.5 vs 2.5 -> back to 0; presence does not grow with count.
        assert_eq!(sample_once(&mut s, &[5.0, 4.0, 0.0]), 0);
        assert_eq!(sample_once(&mut s, &[5.0, 4.0, 0.0]), 0);
    }

    #[test]
    fn frequency_penalty_grows_with_count() {
        let p = SamplingParams { frequency_penalty: 0.6, ..Default::default() };
        let mut s = Sampler::new(p, 3, &[]).unwrap();
        let picks: Vec<u32> = (0..3).map(|_| sample_once(&mut s, &[5.0, 4.0, 0.0])).collect();
        // 5.0 -> 0; 4.4 vs 4.0 -> 0; 3.8 vs 4.0 -> 1.
        assert_eq!(picks, vec![0, 0, 1]);
    }

    #[test]
    fn repetition_penalty_covers_the_prompt_and_both_signs() {
        let p = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
        // Token 0 is in the prompt: 5.0 / 2 = 2.5 < 3.0.
        let mut s = Sampler::new(p.clone(), 3, &[0]).unwrap();
        assert_eq!(sample_once(&mut s, &[5.0, 3.0, -1.0]), 1);
        // Negative logits are multiplied: -1 * 2 = -2 < -1.5.
        let mut s = Sampler::new(p, 3, &[2]).unwrap();
        assert_eq!(sample_once(&mut s, &[-9.0, -1.5, -1.0]), 1);
    }

    #[test]
    fn top_k_top_p_min_p_keep_the_expected_tokens() {
        let logits = Array::from_slice(&[2.0f32, 1.0, 0.5, -3.0], &[1, 4]);
        let finite =
            |a: Array| -> Vec<bool> { a.as_slice::<f32>().iter().map(|x| x.is_finite()).collect() };
        assert_eq!(finite(keep_top_k(&logits, 2).unwrap()), vec![true, true, false, false]);
        // probs ~ [0.61, 0.23, 0.14, 0.004]: 0.7 needs the first two.
        assert_eq!(finite(keep_top_p(&logits, 0.7).unwrap()), vec![true, true, false, false]);
        assert_eq!(finite(keep_top_p(&logits, 0.5).unwrap()), vec![true, false, false, false]);
        // min_p 0.3: keep p >= 0.3 * 0.61 = 0.18.
        assert_eq!(finite(keep_min_p(&logits, 0.3).unwrap()), vec![true, true, false, false]);
    }

    #[test]
    fn a_top_k_past_i32_keeps_every_token() {
        let logits = Array::from_slice(&[2.0f32, 1.0, 0.5, -3.0], &[1, 4]);
        for top_k in [4, 1 << 31, u32::MAX] {
            let s = Sampler::new(
                SamplingParams { temperature: 1.0, top_k, ..Default::default() },
                4,
                &[],
            )
            .unwrap();
            let kept = s.filtered(&logits).unwrap();
            assert!(kept.as_slice::<f32>().iter().all(|x| x.is_finite()), "top_k {top_k}");
        }
    }

    #[test]
    fn seeded_sampling_follows_the_distribution() {
        // p = softmax([ln 3, 0]) = [0.75, 0.25]; 2000 draws land within a few percent.
        let p = SamplingParams { temperature: 1.0, seed: Some(42), ..Default::default() };
        let mut s = Sampler::new(p, 2, &[]).unwrap();
        let ones: usize = (0..2000).map(|_| sample_once(&mut s, &[3f32.ln(), 0.0]) as usize).sum();
        let frac = ones as f64 / 2000.0;
        assert!((frac - 0.25).abs() < 0.04, "token 1 drawn {frac:.3} of the time, expected 0.25");
    }
}
