//! `perch bench`: prefill and decode speed, time to first token and peak memory, measured
//! through the same `generate` path users hit.

pub mod batch;
pub mod constrained;

use serde::Serialize;

use crate::decode::{generate, DraftMode, DraftStats, GenerateParams};
use crate::error::Result;
use crate::model::LoadedModel;
use crate::platform::peak_rss_bytes;
pub use crate::runtime::warmup::{prompt_of_length, PASSAGE};
use crate::runtime::{Arrival, DraftChoice, Prompt, Turn};

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub compute_dtype: String,
    pub runs: usize,
    pub prefill_128_tok_s: f64,
    pub prefill_1024_tok_s: f64,
    pub decode_tok_s: f64,
    pub decode_tokens: usize,
    pub ttft_128_s: f64,
    pub peak_mlx_memory_bytes: u64,
    pub peak_rss_bytes: u64,
}

/// Median of `runs` measurements of each figure, after one untimed warm-up generation.
pub fn run(model: &LoadedModel, runs: usize, decode_tokens: usize) -> Result<BenchReport> {
    let runs = runs.max(1);
    let p128 = prompt_of_length(model, 128)?;
    let p1024 = prompt_of_length(model, 1024.min(model.context_length.saturating_sub(2)))?;
    let one = GenerateParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
    let many = GenerateParams { max_tokens: decode_tokens, ignore_eos: true, ..Default::default() };
    let _ = mlx_rs::memory::reset_peak_memory();
    generate(model, &p128[..16], &GenerateParams { max_tokens: 8, ..one.clone() }, None, |_| {})?;

    let (mut pre128, mut pre1024, mut ttft, mut decode) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let g = generate(model, &p128, &one, None, |_| {})?;
        ttft.push(g.ttft.as_secs_f64());
        pre128.push(g.prefill_tokens_per_sec());
        let g = generate(model, &p1024, &one, None, |_| {})?;
        pre1024.push(g.prefill_tokens_per_sec());
        let g = generate(model, &p128, &many, None, |_| {})?;
        decode.push(g.decode_tokens_per_sec());
    }
    Ok(BenchReport {
        model: model.id.clone(),
        compute_dtype: format!("{:?}", model.compute_dtype),
        runs,
        prefill_128_tok_s: median(pre128),
        prefill_1024_tok_s: median(pre1024),
        decode_tok_s: median(decode),
        decode_tokens,
        ttft_128_s: median(ttft),
        peak_mlx_memory_bytes: mlx_rs::memory::peak_memory().unwrap_or(0) as u64,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// A code-editing prompt: code, then the start of the same code with a small change, the
/// kind of request prompt lookup speeds up.
pub const CODE_EDIT: &str = include_str!("code_edit.txt");

/// Decoding with drafts against plain decoding, alternating in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct DraftBenchReport {
    pub model: String,
    pub draft: DraftMode,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
    pub runs: usize,
    pub plain_decode_tok_s: f64,
    pub draft_decode_tok_s: f64,
    /// Draft over plain decode speed (medians).
    pub speedup: f64,
    /// The greedy tokens were identical with and without drafts.
    pub identical_output: bool,
    /// Statistics of the last run with drafts.
    pub stats: DraftStats,
}

/// Greedy decoding of `decode_tokens` after `prompt`, with and without `draft`, `runs` times
/// each (alternating, after one untimed warm-up of each).
pub fn run_draft(
    model: &LoadedModel,
    prompt: &[u32],
    draft: DraftMode,
    runs: usize,
    decode_tokens: usize,
) -> Result<DraftBenchReport> {
    let runs = runs.max(1);
    let plain =
        GenerateParams { max_tokens: decode_tokens, ignore_eos: true, ..Default::default() };
    let drafted = GenerateParams { draft: draft.clone(), ..plain.clone() };
    generate(model, prompt, &GenerateParams { max_tokens: 8, ..plain.clone() }, None, |_| {})?;
    generate(model, prompt, &GenerateParams { max_tokens: 8, ..drafted.clone() }, None, |_| {})?;
    let (mut p, mut d, mut identical, mut stats) = (vec![], vec![], true, DraftStats::default());
    for _ in 0..runs {
        let a = generate(model, prompt, &plain, None, |_| {})?;
        let b = generate(model, prompt, &drafted, None, |_| {})?;
        p.push(a.decode_tokens_per_sec());
        d.push(b.decode_tokens_per_sec());
        identical &= a.tokens == b.tokens;
        stats = b.draft.unwrap_or_default();
    }
    let (plain_decode_tok_s, draft_decode_tok_s) = (median(p), median(d));
    Ok(DraftBenchReport {
        model: model.id.clone(),
        draft,
        prompt_tokens: prompt.len(),
        decode_tokens,
        runs,
        plain_decode_tok_s,
        draft_decode_tok_s,
        speedup: draft_decode_tok_s / plain_decode_tok_s.max(1e-9),
        identical_output: identical,
        stats,
    })
}

impl DraftBenchReport {
    pub fn table(&self) -> String {
        let s = &self.stats;
        format!(
            "model            {}\ndraft            {:?}\nprompt           {} tok, decode {} tok, {} run(s) (median)\n\
             plain decode     {:>9.1} tok/s\ndraft decode     {:>9.1} tok/s\nspeedup          {:>9.2}x\n\
             acceptance       {:>9.3} (accepted/drafted by depth {:?} / {:?}), {} bonus, {} verify calls\n\
             identical output {}\n",
            self.model,
            self.draft,
            self.prompt_tokens,
            self.decode_tokens,
            self.runs,
            self.plain_decode_tok_s,
            self.draft_decode_tok_s,
            self.speedup,
            s.acceptance_rate,
            s.accepted_by_depth,
            s.drafted_by_depth,
            s.bonus_tokens,
            s.verify_calls,
            self.identical_output
        )
    }
}

/// `perch bench --scenario first-request`: a user request 0.5 s after a fresh engine starts,
/// with the warmup ladder on and off; then the first requests after the ladder finished
/// against a cold engine's first requests.
#[derive(Debug, Clone, Serialize)]
pub struct FirstRequestReport {
    pub model: String,
    pub ladder_rungs: Vec<usize>,
    pub ladder_chunk: usize,
    /// Arrival to first token of a request sent 0.5 s after start.
    pub ttft_ladder_off_s: f64,
    pub ttft_ladder_on_s: f64,
    /// Time of one warming chunk (measured from the ladder's own rungs).
    pub warming_chunk_s: f64,
    /// Decode tok/s of the first 3 requests (mean), cold engine vs after the ladder finished.
    pub decode_cold_tok_s: f64,
    pub decode_warm_tok_s: f64,
    pub ladder_seconds: f64,
}

pub async fn first_request(
    config: crate::runtime::EngineConfig,
    prompt_tokens: usize,
    max_tokens: usize,
) -> Result<FirstRequestReport> {
    use crate::runtime::{Engine, LadderConfig, LadderState};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let start = |ladder: LadderConfig| -> Result<Arc<Engine>> {
        let engine = Arc::new(Engine::start(crate::runtime::EngineConfig {
            ladder,
            draft: crate::decode::DraftSetting::None,
            ..config.clone()
        })?);
        engine.start_background();
        Ok(engine)
    };
    let on_cfg = config.ladder.clone();
    let off_cfg = LadderConfig { enabled: false, ..on_cfg.clone() };
    let mut report = FirstRequestReport {
        model: String::new(),
        ladder_rungs: on_cfg.rungs.clone(),
        ladder_chunk: on_cfg.chunk,
        ttft_ladder_off_s: 0.0,
        ttft_ladder_on_s: 0.0,
        warming_chunk_s: 0.0,
        decode_cold_tok_s: 0.0,
        decode_warm_tok_s: 0.0,
        ladder_seconds: 0.0,
    };
    for ladder_on in [false, true] {
        let engine = tokio::task::block_in_place(|| {
            start(if ladder_on { on_cfg.clone() } else { off_cfg.clone() })
        })?;
        let info = engine.loaded().expect("a model is loaded");
        report.model = info.id.clone();
        let unit = info.tokenizer.encode(PASSAGE, false)?;
        let prompt: Vec<u32> = unit.iter().copied().cycle().take(prompt_tokens).collect();
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ttft =
            Arrival::now(&engine).run(fixed(&info.id, prompt.clone(), max_tokens)?).await?.ttft;
        if ladder_on {
            report.ttft_ladder_on_s = ttft.as_secs_f64();
            loop {
                let st = engine.ladder_status();
                if matches!(
                    st.state,
                    LadderState::Done | LadderState::AbandonedBusy | LadderState::Disabled
                ) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            report.ladder_seconds = t0.elapsed().as_secs_f64();
            // One chunk: a prefill of one chunk's tokens from an empty cache on the warm engine
            // (chunks deep in a long rung attend to more keys and take somewhat longer).
            let chunk_prompt: Vec<u32> = unit.iter().copied().cycle().take(on_cfg.chunk).collect();
            let g = Arrival::now(&engine).run(fixed(&info.id, chunk_prompt, 1)?).await?.generation;
            report.warming_chunk_s = g.ttft.as_secs_f64();
            report.decode_warm_tok_s = first_three_decode_rate(&engine, &info.id, &prompt).await?;
        } else {
            report.ttft_ladder_off_s = ttft.as_secs_f64();
            // A separate cold engine for the cold decode figure (the first request above
            // already warmed this one a little).
            let cold = tokio::task::block_in_place(|| start(off_cfg.clone()))?;
            report.decode_cold_tok_s = first_three_decode_rate(&cold, &info.id, &prompt).await?;
        }
    }
    Ok(report)
}

/// A turn of exactly `max_tokens` greedy tokens after `prompt`, without drafts.
fn fixed(id: &str, prompt: Vec<u32>, max_tokens: usize) -> Result<Turn> {
    Ok(Turn {
        max_tokens: Some(max_tokens),
        draft: DraftChoice::Off,
        ignore_eos: true,
        ..Turn::new(id.parse()?, Prompt::Tokens(prompt))
    })
}

/// Mean decode tok/s of three 32-token requests (prompts differing in their last token).
async fn first_three_decode_rate(
    engine: &std::sync::Arc<crate::runtime::Engine>,
    id: &str,
    prompt: &[u32],
) -> Result<f64> {
    let mut sum = 0.0;
    for i in 0..3u32 {
        let mut p = prompt.to_vec();
        p.push(prompt[i as usize % prompt.len()]);
        sum +=
            Arrival::now(engine).run(fixed(id, p, 32)?).await?.generation.decode_tokens_per_sec();
    }
    Ok(sum / 3.0)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

impl BenchReport {
    pub fn table(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        format!(
            "model            {}\ncompute dtype    {}\nruns (median)    {}\n\
             prefill @128     {:>9.1} tok/s\nprefill @1024    {:>9.1} tok/s\n\
             decode ({} tok)  {:>9.1} tok/s\nTTFT @128        {:>9.3} s\n\
             peak MLX memory  {:>9.1} MB\npeak RSS         {:>9.1} MB\n",
            self.model,
            self.compute_dtype,
            self.runs,
            self.prefill_128_tok_s,
            self.prefill_1024_tok_s,
            self.decode_tokens,
            self.decode_tok_s,
            self.ttft_128_s,
            mb(self.peak_mlx_memory_bytes),
            mb(self.peak_rss_bytes)
        )
    }
}

/// The passage's first sentences: a prompt of about a hundred tokens.
pub(crate) fn prompt_head() -> &'static str {
    let end = PASSAGE.char_indices().nth(400).map_or(PASSAGE.len(), |(i, _)| i);
    &PASSAGE[..end]
}
