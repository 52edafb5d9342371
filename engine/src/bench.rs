//! `perch bench`: prefill and decode speed, time to first token and peak memory, measured
//! through the same `generate` path users hit.

use serde::Serialize;

use crate::error::Result;
use crate::generate::{generate, GenerateParams};
use crate::model::LoadedModel;

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

/// A fixed English passage, tokenized and repeated to the lengths we need, so runs and peers
/// (scripts/bench-vs-mlx-lm reads the same file) see the same token ids.
pub const PASSAGE: &str = include_str!("bench_passage.txt");

pub fn prompt_of_length(model: &LoadedModel, n: usize) -> Result<Vec<u32>> {
    let unit = model.tokenizer.encode(PASSAGE, false)?;
    Ok(unit.iter().copied().cycle().take(n).collect())
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The process's peak resident set size.
///
/// On Linux this is `VmHWM`, which starts afresh at exec; `getrusage`'s `ru_maxrss` keeps the
/// peak of whatever process image ran before, so a child of a big parent would report the
/// parent's peak.
pub fn peak_rss_bytes() -> u64 {
    if cfg!(target_os = "linux") {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        return status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
    }
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    // macOS reports bytes.
    usage.ru_maxrss as u64
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
