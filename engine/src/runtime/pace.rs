//! How many prompt tokens a batch step may prefill while other sequences are decoding: as
//! many as keep that step within about `TARGET` times a step that only decodes, learnt from
//! the steps themselves. A prompt joining running streams then stretches the streams' gaps
//! by a bounded factor (measured 3.8–4.4 decode steps at most, docs/runtime.md §2); the
//! joiner's own first token comes later instead.

/// The step a prefill joins may take this many times a decode-only step; the aim sits below
/// 3 because a prompt's later chunks attend over more context than the estimate has seen.
pub const TARGET: f64 = 2.5;
/// Never fewer prompt tokens than this per step, so a prompt always gets in; also the share
/// before any step has shown what one costs.
pub const MIN_PREFILL: usize = 8;
/// Weight of the newest decode-only step in the estimate of one.
const ALPHA: f64 = 0.3;
/// The most one step's evidence may shrink or grow the next step's prompt tokens.
const SHRINK: f64 = 0.5;
const GROW: f64 = 1.25;

/// A decode-only step's running cost, and the prompt tokens the next paced step may take.
/// The tokens follow the steps' own cost: a step over `TARGET` decode steps shrinks the next
/// one's share in proportion, one under grows it, so fixed costs of a mixed step (another
/// kernel path for more rows) are paid for without being modelled.
#[derive(Debug, Clone, Default)]
pub struct Pace {
    decode_s: Option<f64>,
    tokens: Option<f64>,
}

impl Pace {
    /// A step ran: `decoded` sequences took a token and `prefilled` prompt tokens went in, in
    /// `seconds`; `paced` when the prompt tokens were what `budget(cap)` allowed.
    pub fn observe(
        &mut self,
        decoded: usize,
        prefilled: usize,
        seconds: f64,
        paced: bool,
        cap: usize,
    ) {
        if decoded == 0 || !seconds.is_finite() {
            return;
        }
        if prefilled == 0 {
            self.decode_s = Some(match self.decode_s {
                Some(e) => e + ALPHA * (seconds - e),
                None => seconds,
            });
            return;
        }
        if let (true, Some(decode)) = (paced, self.decode_s) {
            let ratio = seconds / decode.max(1e-6);
            let now = self.tokens.unwrap_or(prefilled as f64);
            // Within what `cap` allows, so a long run of cheap steps cannot bank growth.
            let next = now * (TARGET / ratio).clamp(SHRINK, GROW);
            self.tokens = Some(next.clamp(MIN_PREFILL.min(cap) as f64, cap as f64));
        }
    }

    /// Prompt tokens the next step may prefill beside decoding sequences: at most `cap` (the
    /// `step_tokens` setting), at least `MIN_PREFILL` (or `cap`, if smaller).
    pub fn budget(&self, cap: usize) -> usize {
        let floor = MIN_PREFILL.min(cap);
        let tokens = self.tokens.unwrap_or(MIN_PREFILL as f64);
        (tokens.min(cap as f64) as usize).clamp(floor, cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of a simulated engine: `decode` seconds for the decoding sequences plus
    /// `per_token` seconds per prompt token, the pace choosing each step's prompt tokens.
    fn run(pace: &mut Pace, decode: f64, per_token: f64, steps: usize, cap: usize) -> Vec<f64> {
        (0..steps)
            .map(|_| {
                let n = pace.budget(cap);
                let took = decode + per_token * n as f64;
                pace.observe(4, n, took, true, cap);
                took / decode
            })
            .collect()
    }

    #[test]
    fn a_joining_prompt_keeps_each_step_within_three_decode_steps() {
        let mut pace = Pace::default();
        assert_eq!(pace.budget(64), MIN_PREFILL, "nothing learnt yet");
        for _ in 0..5 {
            pace.observe(4, 0, 0.046, false, 64);
        }
        // 5 ms a prompt token: 64 of them would make a step 8x a decode step.
        let ratios = run(&mut pace, 0.046, 0.005, 40, 64);
        assert!(ratios.iter().all(|&r| r <= 3.0), "{ratios:?}");
        let n = pace.budget(64);
        assert!((12..=15).contains(&n), "1.5 decode steps of prompt tokens (13.8): {n}");
        // The context grows and each token costs more: the pace follows within a few steps.
        let later = run(&mut pace, 0.046, 0.010, 40, 64);
        assert!(later[5..].iter().all(|&r| r <= 3.0), "{later:?}");
        assert!(pace.budget(64) < n);
    }

    #[test]
    fn the_setting_caps_it_and_a_prompt_always_gets_in() {
        let mut pace = Pace::default();
        pace.observe(2, 0, 0.040, false, 64);
        // Cheap tokens: the cap (`step_tokens`) holds.
        run(&mut pace, 0.040, 0.0001, 20, 64);
        assert_eq!(pace.budget(64), 64);
        // Dear tokens: never fewer than MIN_PREFILL, and never more than a smaller cap.
        run(&mut pace, 0.040, 0.5, 20, 64);
        assert_eq!(pace.budget(64), MIN_PREFILL);
        assert_eq!(pace.budget(4), 4);
        // Steps with nothing decoding (a prompt alone) change nothing.
        let before = pace.budget(64);
        pace.observe(0, 512, 9.0, false, 64);
        assert_eq!(pace.budget(64), before);
    }
}
