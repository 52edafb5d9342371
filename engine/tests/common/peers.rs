//! Talking to the peer implementations (llama.cpp, mlx-lm) through Python, and the one rule
//! for comparing greedy continuations with theirs: Perch may depart only at a near-tie of
//! both (gemma_vs_peers.rs explains why exact agreement is a property of the CPU).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{greedy_departures, own_gap, reference_gap, TopTokens};
use perch_engine::LoadedModel;

/// Prepended to every script that loads llama.cpp: `greedy(llm, ids, n, top)`, and no extra
/// buffer types (why: in the file, shared with the benchmarks).
pub const LLAMA_CPP_PLAIN: &str = include_str!("../../../scripts/lib/llama_cpp_plain.py");

/// Run `script` with `args` and `input` as JSON on stdin; its last line of output, as JSON.
pub fn run_python(
    python: &Path,
    script: &str,
    args: &[&str],
    input: serde_json::Value,
) -> serde_json::Value {
    let mut child = Command::new(python)
        .args(["-c", script])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "peer script failed");
    serde_json::from_slice(out.stdout.rsplit(|&b| b == b'\n').find(|l| !l.is_empty()).unwrap())
        .unwrap()
}

/// One prompt's reference continuation: its tokens and the reference's top tokens per step.
pub struct GreedyReference {
    pub label: String,
    pub ids: Vec<u32>,
    pub greedy: Vec<u32>,
    pub top: Vec<TopTokens>,
}

/// How Perch decodes the continuations it compares: one at a time (`generate`), or all of a
/// comparison's prompts together in one batch (`decode::batch`, this many tokens a step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoding {
    Solo,
    Batched { budget: usize },
}

/// Perch's departures from each reference, split into near-ties and real disagreements
/// (printed as they are found); returns (near-ties, disagreements, positions compared).
pub fn compare_greedy(
    model: &LoadedModel,
    refs: &[GreedyReference],
    peer: &str,
    near_tie: f64,
) -> (usize, usize, usize) {
    compare_greedy_as(model, refs, peer, near_tie, Decoding::Solo)
}

/// `compare_greedy`, Perch decoding as `decoding` says.
pub fn compare_greedy_as(
    model: &LoadedModel,
    refs: &[GreedyReference],
    peer: &str,
    near_tie: f64,
    decoding: Decoding,
) -> (usize, usize, usize) {
    let all = match decoding {
        Decoding::Solo => {
            refs.iter().map(|r| greedy_departures(model, &r.ids, &r.greedy)).collect()
        }
        Decoding::Batched { budget } => {
            let prompts: Vec<Vec<u32>> = refs.iter().map(|r| r.ids.clone()).collect();
            let greedy: Vec<Vec<u32>> = refs.iter().map(|r| r.greedy.clone()).collect();
            super::batch::batched_departures(model, &prompts, &greedy, budget)
        }
    };
    let (mut ties, mut wrong, mut compared) = (0, 0, 0);
    for (r, departures) in refs.iter().zip(all) {
        compared += r.greedy.len();
        println!(
            "{}: {}/{} tokens as {peer}'s ({decoding:?})",
            r.label,
            r.greedy.len() - departures.len(),
            r.greedy.len()
        );
        for d in departures {
            // A near-tie for both: the peer ranks Perch's token close to its best, and Perch
            // ranks the peer's token close to its own (on the same context).
            let gap = reference_gap(&r.top[d.at], d.ours);
            let mut context = r.ids.clone();
            context.extend_from_slice(&r.greedy[..d.at]);
            let own = f64::from(own_gap(model, &context, d.theirs));
            let shown = gap.map_or(format!("outside its top {}", r.top[d.at].len()), |g| {
                format!("{g:.3} below its best")
            });
            let tie = gap.is_some_and(|g| g < near_tie) && own < near_tie;
            println!(
                "  token {}: Perch {} vs {peer} {}: Perch's token is {shown} for {peer}, {peer}'s {own:.3} below Perch's best{}",
                d.at,
                d.ours,
                d.theirs,
                if tie { " (near-tie)" } else { "" }
            );
            if tie {
                ties += 1
            } else {
                wrong += 1
            }
        }
    }
    (ties, wrong, compared)
}
