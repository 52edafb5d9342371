//! Every fixture architecture and weight format against the goldens mlx-lm produced
//! (scripts/make-fixtures.py): logits within 1e-3 relative, 32 greedy tokens identical.

mod common;

use common::*;
use perch_engine::{generate, FinishReason, GenerateParams};

#[test]
fn logits_match_mlx_lm_golden() {
    for name in FIXTURES {
        let model = load_fixture(name);
        let g = golden(name);
        let ours = forward_logits(&model, &g.prompt_ids);
        let err = relative_error(&ours, &g.logits);
        println!("{name}: relative logit error {err:.2e}");
        assert!(err <= 1e-3, "{name}: logits differ from mlx-lm by {err:.2e} relative");
    }
}

#[test]
fn greedy_tokens_match_mlx_lm_golden() {
    for name in FIXTURES {
        let model = load_fixture(name);
        let g = golden(name);
        let params = GenerateParams { max_tokens: g.greedy_tokens.len(), ignore_eos: true, ..Default::default() };
        let out = generate(&model, &g.prompt_ids, &params, None, |_| {}).unwrap();
        assert_eq!(out.tokens, g.greedy_tokens, "{name}: greedy tokens differ from mlx-lm");
        assert_eq!(out.finish_reason, FinishReason::Length);
    }
}

#[test]
fn chunked_prefill_matches_one_pass() {
    // The cache must make chunk boundaries invisible: the same greedy continuation whatever
    // the prefill chunk size, including chunks that cross the cache's 256-position growth step.
    // For Gemma's sliding-window layers (window 8) the chunks also cross the ring buffer.
    for name in ["qwen3", "gemma3"] {
        let model = load_fixture(name);
        let g = golden(name);
        let long: Vec<u32> = g.prompt_ids.iter().copied().cycle().take(300).collect();
        let run = |chunk: usize| {
            let p = GenerateParams { max_tokens: 12, ignore_eos: true, prefill_chunk: chunk, ..Default::default() };
            generate(&model, &long, &p, None, |_| {}).unwrap().tokens
        };
        let reference = run(1024);
        for chunk in [1, 3, 7, 8, 9, 64, 255] {
            assert_eq!(run(chunk), reference, "{name}: prefill chunk {chunk} changed the output");
        }
    }
}
