//! `perch bench --scenario batch`: what one decode step of the batch costs by its size, on the
//! engine alone (no HTTP, no client threads on the same cores): N sequences with prompts of
//! their own are prefilled, then every step of `steps` decodes one token for each, timed one
//! by one. The aggregate rate against one sequence's is what batching buys
//! (`scripts/bench-concurrent` measures the same through the server, against peers).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::median;

use crate::decode::batch::{step, Sequence};
use crate::decode::GenerateParams;
use crate::error::Result;
use crate::model::LoadedModel;

#[derive(Debug, Clone, Serialize)]
pub struct BatchRow {
    pub sequences: usize,
    /// Median time of one decode step of all of them.
    pub step_ms: f64,
    pub aggregate_tok_s: f64,
    /// Aggregate rate over one sequence's.
    pub vs_one: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub model: String,
    pub steps: usize,
    pub rows: Vec<BatchRow>,
}

impl BatchReport {
    pub fn table(&self) -> String {
        let mut t = format!(
            "model {}: decode steps of the batch ({} timed per size)\n{:>9} {:>9} {:>12} {:>7}\n",
            self.model, self.steps, "sequences", "step ms", "agg tok/s", "vs 1"
        );
        for r in &self.rows {
            t += &format!(
                "{:>9} {:>9.1} {:>12.1} {:>6.2}x\n",
                r.sequences, r.step_ms, r.aggregate_tok_s, r.vs_one
            );
        }
        t
    }
}

/// Step batches of each of `sizes` sequences: `steps` timed decode steps each.
pub fn run(model: &LoadedModel, sizes: &[usize], steps: usize) -> Result<BatchReport> {
    let mut rows: Vec<BatchRow> = vec![];
    for &n in sizes {
        let mut seqs = (0..n)
            .map(|i| {
                let text = format!("Request {i}: {}", super::prompt_head());
                let prompt = model.tokenizer.encode(&text, true)?;
                let params = GenerateParams {
                    max_tokens: steps + 8,
                    ignore_eos: true,
                    ..GenerateParams::default()
                };
                let cancel = Arc::new(AtomicBool::new(false));
                Sequence::new(model, prompt, params, None, cancel, Box::new(|_, _| {}))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut live: Vec<&mut Sequence> = seqs.iter_mut().collect();
        // Prefill every prompt, and one step more so that each decodes (and is warm).
        while live.iter().any(|s| s.prefilling()) {
            step(model, &mut live, 4096)?;
        }
        step(model, &mut live, 4096)?;
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let t = Instant::now();
            let r = step(model, &mut live, 4096)?;
            times.push(t.elapsed().as_secs_f64());
            debug_assert_eq!(r.decoded, n);
        }
        let step_s = median(times);
        let aggregate = n as f64 / step_s;
        let one = rows.first().map_or(aggregate, |r| r.aggregate_tok_s / r.sequences as f64);
        rows.push(BatchRow {
            sequences: n,
            step_ms: step_s * 1e3,
            aggregate_tok_s: aggregate,
            vs_one: aggregate / one,
        });
    }
    Ok(BatchReport { model: model.id.clone(), steps, rows })
}
