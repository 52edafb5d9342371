//! The prefix cache is exact: a generation that starts from a cached state gives the same
//! greedy tokens, and log-probabilities within 1e-4, as one that prefills everything, on
//! every fixture architecture: prefixes that end inside a sliding window and prompts that
//! cross it (Gemma 3), drafts on (prompt lookup, MTP), and the disk tier after a restart.

mod common;

use std::sync::Arc;

use common::*;
use perch_engine::decode::{generate_from, DraftMode, GenerateParams, Generation};
use perch_engine::model::kv_cache::KvState;
use perch_engine::prefix_cache::{CacheKey, PrefixCache, PrefixCacheConfig, PrefixStats};
use perch_engine::{LoadedModel, SamplingParams};

fn params(draft: DraftMode, logprobs: bool) -> GenerateParams {
    GenerateParams {
        max_tokens: 12,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        draft,
        logprobs: logprobs.then_some(4),
        prefill_chunk: 16,
        ..Default::default()
    }
}

/// A prompt of `n` tokens made from the fixture's golden prompt, repeated.
fn long_prompt(name: &str, n: usize) -> Vec<u32> {
    golden(name).prompt_ids.iter().copied().cycle().take(n).collect()
}

fn run(
    model: &LoadedModel,
    prompt: &[u32],
    p: &GenerateParams,
    from: Option<KvState>,
) -> (Generation, Option<KvState>) {
    generate_from(model, prompt, p, None, from, |_, _| {}).unwrap()
}

/// Generation 1 on `first`, then `second` (which starts with part of what generation 1 saw)
/// once cold and once from the cache. Returns the tokens reused.
fn check(name: &str, model: &LoadedModel, first: &[u32], tail: Tail, p: &GenerateParams) -> usize {
    let mut cache =
        PrefixCache::new(&PrefixCacheConfig::default(), Arc::new(PrefixStats::default()));
    let key = CacheKey::of(model, None);
    let mtp = matches!(p.draft, DraftMode::Mtp { .. });
    let (g1, state) = run(model, first, p, None);
    assert_eq!(g1.cached_tokens, 0);
    let state = state.expect("a finished generation leaves its state");
    assert_eq!(state.tokens[..first.len()], first[..], "{name}: the state holds the prompt");
    cache.store(key.clone(), state);

    let mut second: Vec<u32> = first.to_vec();
    match tail {
        Tail::NextTurn(keep) => second.extend_from_slice(&g1.tokens[..keep]),
        Tail::Diverge(at) => second.truncate(at),
    }
    second.extend_from_slice(&golden(name).prompt_ids[3..9]);

    let (cold, _) = run(model, &second, p, None);
    let from = cache.lookup(&key, &second, mtp);
    let (warm, _) = run(model, &second, p, from);
    assert_eq!(warm.tokens, cold.tokens, "{name}: cached and uncached greedy tokens differ");
    for (i, (a, b)) in warm.logprobs.iter().zip(&cold.logprobs).enumerate() {
        assert_eq!(a.token, b.token);
        let top = a.top.iter().zip(&b.top).map(|(x, y)| (x.logprob - y.logprob).abs());
        let worst = top.chain([(a.logprob - b.logprob).abs()]).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{name}: token {i}: logprobs differ by {worst}");
    }
    assert_eq!(warm.logprobs.len(), cold.logprobs.len());
    warm.cached_tokens
}

#[derive(Clone, Copy)]
enum Tail {
    /// The next turn: the first prompt, `n` of the generated tokens, new tokens.
    NextTurn(usize),
    /// Another conversation: the first `n` tokens of the first prompt, then new tokens.
    Diverge(usize),
}

#[test]
fn cached_and_uncached_runs_agree_on_every_fixture() {
    for name in ["qwen3", "llama", "qwen2", "gemma3"] {
        let model = load_fixture(name);
        for logprobs in [true, false] {
            let p = params(DraftMode::None, logprobs);
            let first = long_prompt(name, 70);
            let n = check(name, &model, &first, Tail::NextTurn(7), &p);
            assert_eq!(n, 77, "{name}: the whole first turn and 7 answer tokens are reused");
        }
    }
}

#[test]
fn sliding_windows_reuse_what_the_ring_still_holds_and_nothing_else() {
    // Gemma fixture: window 8 (+32 slack for drafts). The prompt crosses the window many times.
    let model = load_fixture("gemma3");
    let p = params(DraftMode::None, true);
    let first = long_prompt("gemma3", 90);
    // The prefix ends inside the ring's reach: reused.
    assert_eq!(check("gemma3", &model, &first, Tail::NextTurn(3), &p), 93);
    assert_eq!(check("gemma3", &model, &first, Tail::Diverge(85), &p), 85);
    // A prefix the ring no longer holds: prefilled again, and still the same answer.
    assert_eq!(check("gemma3", &model, &first, Tail::Diverge(40), &p), 0);
    // Full-attention models reuse any prefix.
    let llama = load_fixture("llama");
    assert_eq!(check("llama", &llama, &long_prompt("llama", 90), Tail::Diverge(40), &p), 40);
}

#[test]
fn drafts_on_reuse_the_cache_and_agree() {
    for name in ["qwen3", "gemma3"] {
        let model = load_fixture(name);
        let p = params(DraftMode::lookup(), false);
        let n = check(name, &model, &long_prompt(name, 60), Tail::NextTurn(5), &p);
        assert_eq!(n, 65, "{name} with prompt lookup");
    }
    let model = load_fixture(MTP_FIXTURE);
    let p = params(DraftMode::Mtp { depth: 2 }, false);
    let n = check(MTP_FIXTURE, &model, &long_prompt(MTP_FIXTURE, 60), Tail::NextTurn(5), &p);
    // The head's pair for the last reused position needs the token after it, so MTP reuses
    // at least all of the first prompt.
    assert!(n >= 60, "MTP reused {n}");
}

#[test]
fn a_state_keyed_for_other_weights_or_an_adapter_is_not_used() {
    let model = load_fixture("qwen3");
    let other = load_fixture("llama");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("adapters.safetensors"), b"x").unwrap();
    let base = CacheKey::of(&model, None);
    assert_ne!(base, CacheKey::of(&model, Some(dir.path())), "an adapter has its own key");
    assert_ne!(base, CacheKey::of(&other, None));
    let mut cache =
        PrefixCache::new(&PrefixCacheConfig::default(), Arc::new(PrefixStats::default()));
    let prompt = long_prompt("qwen3", 40);
    let (_, state) = run(&model, &prompt, &params(DraftMode::None, false), None);
    cache.store(base.clone(), state.unwrap());
    assert!(cache.lookup(&CacheKey::of(&model, Some(dir.path())), &prompt, false).is_none());
    assert_eq!(cache.lookup(&base, &prompt, false).map(|s| s.len()), Some(39));
}

#[test]
fn the_disk_tier_survives_a_restart_and_bad_files_are_removed() {
    let model = load_fixture("qwen3");
    let dir = tempfile::tempdir().unwrap();
    let config = PrefixCacheConfig {
        ram_bytes: 1 << 30,
        disk_bytes: 1 << 30,
        disk_dir: Some(dir.path().to_path_buf()),
    };
    let key = CacheKey::of(&model, None);
    let p = params(DraftMode::None, true);
    let first = long_prompt("qwen3", 300);
    let (g1, state) = run(&model, &first, &p, None);
    {
        let mut cache = PrefixCache::new(&config, Arc::new(PrefixStats::default()));
        cache.store(key.clone(), state.unwrap());
    } // the writer thread finishes its queue when the cache is dropped
    let files = || -> Vec<_> {
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect()
    };
    wait_for(|| files().iter().any(|f| f.extension().is_some_and(|e| e == "kv")));
    // A foreign file and a truncated copy beside it.
    std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    let good = files().into_iter().find(|f| f.extension().is_some_and(|e| e == "kv")).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(dir.path().join("short.kv"), &bytes[..bytes.len() / 2]).unwrap();

    let mut second = first.clone();
    second.extend_from_slice(&g1.tokens[..4]);
    let stats = Arc::new(PrefixStats::default());
    let mut cache = PrefixCache::new(&config, stats.clone());
    let from = cache.lookup(&key, &second, false);
    assert_eq!(
        from.as_ref().map(|s| s.len()),
        Some(303),
        "read back from disk (all but the last prompt token)"
    );
    let (warm, _) = run(&model, &second, &p, from);
    let (cold, _) = run(&model, &second, &p, None);
    assert_eq!(warm.tokens, cold.tokens);
    for (a, b) in warm.logprobs.iter().zip(&cold.logprobs) {
        assert!((a.logprob - b.logprob).abs() < 1e-4);
    }
    let s = stats.snapshot();
    assert_eq!((s.disk_loads, s.disk_entries, s.disk_rejected), (1, 1, 2));
    assert_eq!(files(), vec![good.clone()], "the foreign and the truncated file are gone");
    drop(cache);

    // One flipped bit in the data: the checksum catches it, the file goes, nothing is reused.
    let mut flipped = bytes.clone();
    let at = flipped.len() - 5;
    flipped[at] ^= 0x40;
    std::fs::write(&good, &flipped).unwrap();
    let stats = Arc::new(PrefixStats::default());
    let mut cache = PrefixCache::new(&config, stats.clone());
    assert!(cache.lookup(&key, &second, false).is_none());
    assert_eq!(stats.snapshot().disk_rejected, 1);
    assert!(files().is_empty());
}

fn wait_for(f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("timed out");
}
