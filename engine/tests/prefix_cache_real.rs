//! The prefix cache on both real models (imported from their GGUFs, f32): a next turn started
//! from the cache gives the greedy tokens and log-probabilities (within 1e-4) of a cold run.
//! On Gemma 3 270M the prompt crosses its 512-token sliding window.

mod common;

use std::sync::Arc;

use common::*;
use perch_engine::bench::prompt_of_length;
use perch_engine::decode::{generate_from, GenerateParams};
use perch_engine::gguf::import::StoreDtype;
use perch_engine::prefix_cache::{CacheKey, PrefixCache, PrefixCacheConfig, PrefixStats};
use perch_engine::{LoadedModel, SamplingParams};

fn check(name: &str, model: &LoadedModel, prompt_len: usize) {
    let p = GenerateParams {
        max_tokens: 8,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        logprobs: Some(5),
        ..Default::default()
    };
    let first = prompt_of_length(model, prompt_len).unwrap();
    let (g1, state) = generate_from(model, &first, &p, None, None, |_, _| {}).unwrap();
    let mut cache =
        PrefixCache::new(&PrefixCacheConfig::default(), Arc::new(PrefixStats::default()));
    let key = CacheKey::of(model, None);
    cache.store(key.clone(), state.unwrap());
    let mut second = first.clone();
    second.extend_from_slice(&g1.tokens[..5]);
    second.extend_from_slice(&first[10..40]);
    let (cold, _) = generate_from(model, &second, &p, None, None, |_, _| {}).unwrap();
    let from = cache.lookup(&key, &second, false);
    let (warm, _) = generate_from(model, &second, &p, None, from, |_, _| {}).unwrap();
    assert_eq!(warm.cached_tokens, prompt_len + 5, "{name}: the first turn and its answer");
    assert_eq!(warm.tokens, cold.tokens, "{name}");
    // The chosen tokens' log-probabilities within 1e-4; the alternatives' (down to -20 and
    // below, where f32 summation order shows more) within 1e-4 relative.
    let (mut chosen, mut alternatives) = (0.0f32, 0.0f32);
    for (a, b) in warm.logprobs.iter().zip(&cold.logprobs) {
        chosen = chosen.max((a.logprob - b.logprob).abs());
        for (x, y) in a.top.iter().zip(&b.top) {
            assert_eq!(x.token, y.token, "{name}: top alternatives differ");
            let rel = (x.logprob - y.logprob).abs() / y.logprob.abs().max(1.0);
            alternatives = alternatives.max(rel);
        }
    }
    eprintln!(
        "{name}: {} cached tokens; chosen tokens' logprobs differ by at most {chosen:e}, \
         the top-5 alternatives' by {alternatives:e} relative",
        warm.cached_tokens
    );
    assert!(chosen < 1e-4, "{name}: chosen logprobs differ by {chosen}");
    assert!(alternatives < 1e-4, "{name}: alternatives differ by {alternatives} relative");
}

#[test]
fn both_real_models_give_the_same_answer_from_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(gguf) = gemma_gguf() {
        let gemma = import_gemma(&gguf, tmp.path(), StoreDtype::F32);
        check("gemma-3-270m", &gemma, 700);
    }
    if let Some(gguf) = qwen_gguf() {
        let qwen = import_as(&gguf, tmp.path(), "qwen", StoreDtype::F32);
        check("qwen2.5-coder-0.5b", &qwen, 400);
    }
}
