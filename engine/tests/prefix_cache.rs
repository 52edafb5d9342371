//! The prefix cache is exact: a generation that starts from a cached state gives the same
//! greedy tokens, and log-probabilities within 1e-4, as one that prefills everything, on
//! every fixture architecture: prefixes that end inside a sliding window and prompts that
//! cross it (Gemma 3), recurrent states (the Qwen3.5-style hybrid), drafts on (prompt lookup,
//! MTP), and the disk tier after a restart.

mod common;

use std::sync::Arc;

use common::*;
use perch_engine::decode::{
    generate_from, generate_marked, DraftMode, FinishReason, GenerateParams, Generation,
};
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
/// once cold and once from the cache. Returns the tokens reused. The cache keeps what
/// generation 1 left and, as the engine does, the states its prefill marked on the way.
fn check(name: &str, model: &LoadedModel, first: &[u32], tail: Tail, p: &GenerateParams) -> usize {
    check_with(name, model, first, tail, p, true)
}

fn check_with(
    name: &str,
    model: &LoadedModel,
    first: &[u32],
    tail: Tail,
    p: &GenerateParams,
    keep_marks: bool,
) -> usize {
    let mut cache =
        PrefixCache::new(&PrefixCacheConfig::default(), Arc::new(PrefixStats::default()));
    let key = CacheKey::of(model, None);
    let mtp = matches!(p.draft, DraftMode::Mtp { .. });
    let (g1, state, marks) = generate_marked(model, first, p, None, None, |_, _| {}).unwrap();
    assert_eq!(g1.cached_tokens, 0);
    if keep_marks {
        for mark in marks {
            cache.keep(key.clone(), mark);
        }
    }
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
fn sliding_windows_reuse_what_the_ring_still_holds_and_the_prefills_marks() {
    // Gemma fixture: window 8 (+32 slack for drafts). The prompt crosses the window many times.
    let model = load_fixture("gemma3");
    let p = params(DraftMode::None, true);
    let first = long_prompt("gemma3", 90);
    // The prefix ends inside the ring's reach: reused.
    assert_eq!(check("gemma3", &model, &first, Tail::NextTurn(3), &p), 93);
    assert_eq!(check("gemma3", &model, &first, Tail::Diverge(85), &p), 85);
    // A prefix the final state's rings no longer hold (another conversation sharing the
    // first 40 tokens): the prefill's mark at 48 (chunks of 16) cut back to 40 serves it,
    // with the same answer; without the marks it is prefilled again, same answer too.
    assert_eq!(check("gemma3", &model, &first, Tail::Diverge(40), &p), 40);
    assert_eq!(check_with("gemma3", &model, &first, Tail::Diverge(40), &p, false), 0);
    // Across the drafting loop as well (the mark at 64).
    let lookup = params(DraftMode::Lookup { min_ngram: 1, max_ngram: 3, max_draft: 4 }, false);
    assert_eq!(check("gemma3", &model, &first, Tail::Diverge(60), &lookup), 60);
    assert_eq!(check_with("gemma3", &model, &first, Tail::Diverge(60), &lookup, false), 0);
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

/// A cache with both tiers, its disk tier in a fresh directory.
fn disk_config() -> (tempfile::TempDir, PrefixCacheConfig) {
    let dir = tempfile::tempdir().unwrap();
    let disk_dir = Some(dir.path().to_path_buf());
    (dir, PrefixCacheConfig { ram_bytes: 1 << 30, disk_bytes: 1 << 30, disk_dir, block: 1 })
}

#[test]
fn the_disk_tier_survives_a_restart_and_bad_files_are_removed() {
    let model = load_fixture("qwen3");
    let (dir, config) = disk_config();
    #[cfg(unix)]
    {
        // As an older Perch left it: open to others (the tier narrows it).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
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
    #[cfg(unix)]
    {
        // The file holds the prompt's token ids in the clear: the user's alone.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&good), 0o600, "a cached prompt is readable by others");
        assert_eq!(mode(dir.path()), 0o700, "the cache folder is open to others");
    }
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

#[test]
fn the_prefills_marks_reach_the_disk_and_serve_another_conversation_after_a_restart() {
    // Gemma fixture (window 8 + 32 slack, chunks of 16): a 300-token prompt leaves a final
    // state of 311 tokens, whose rings cannot be cut back to 250.
    let model = load_fixture("gemma3");
    let (dir, config) = disk_config();
    let key = CacheKey::of(&model, None);
    let p = params(DraftMode::None, true);
    let first = long_prompt("gemma3", 300);
    let (g, state, marks) = generate_marked(&model, &first, &p, None, None, |_, _| {}).unwrap();
    {
        let mut cache = PrefixCache::new(&config, Arc::new(PrefixStats::default()));
        // What the engine does with a server turn's states.
        for s in cache.keep_turn(&key, state, marks, g.cached_tokens) {
            cache.persist(&key, &s);
        }
    }
    let files = || std::fs::read_dir(dir.path()).unwrap().count();
    // The prefill kept at most MAX_PREFILL_STATES of its 18 chunk ends, spread over the prompt (64,
    // 128, 192 and 256); marks of at least 256 tokens go to disk: the one at 256 and the final
    // state (the writer thread runs on its own).
    assert_eq!(perch_engine::decode::request::MAX_PREFILL_STATES, 4);
    wait_for(|| files() == 2);

    // After a restart, another conversation sharing the first 250 tokens: the mark at 256
    // cut back to 250 serves it.
    let mut second = first[..250].to_vec();
    second.extend_from_slice(&golden("gemma3").prompt_ids[3..9]);
    let mut cache = PrefixCache::new(&config, Arc::new(PrefixStats::default()));
    let from = cache.lookup(&key, &second, false);
    assert_eq!(from.as_ref().map(|s| s.len()), Some(250), "a mark read back from disk");
    let (warm, _) = run(&model, &second, &p, from);
    let (cold, _) = run(&model, &second, &p, None);
    assert_eq!(warm.cached_tokens, 250);
    assert_eq!(warm.tokens, cold.tokens);
    for (a, b) in warm.logprobs.iter().zip(&cold.logprobs) {
        assert!((a.logprob - b.logprob).abs() < 1e-4);
    }
}

#[test]
fn recurrent_states_are_reused_whole_or_from_the_prefills_marks() {
    // Hybrid fixture (layers 0 and 2 gated DeltaNet, chunks of 16): a recurrent state cannot
    // be cut back into its past, only rolled back over its last short call.
    let model = load_fixture(HYBRID_FIXTURE);
    let name = HYBRID_FIXTURE;
    let p = params(DraftMode::None, true);
    let first = long_prompt(name, 70);
    // The next turn holds the whole state (70 + the 11 answer tokens fed): reused whole.
    assert_eq!(check(name, &model, &first, Tail::NextTurn(11), &p), 81);
    // A prefix inside it: the final state cannot be cut back to 77; the prefill's mark at
    // 64 serves it (without the marks nothing does).
    assert_eq!(check(name, &model, &first, Tail::NextTurn(7), &p), 64);
    assert_eq!(check_with(name, &model, &first, Tail::NextTurn(7), &p, false), 0);
    // The mark at 48 rolls back over its chunk's last 8 tokens (a chunk this short keeps
    // its per-token states, as a draft's verification does).
    assert_eq!(check(name, &model, &first, Tail::Diverge(40), &p), 40);
    // Drafts roll the recurrent state back over rejected tokens; the answer is the same.
    let lookup = params(DraftMode::Lookup { min_ngram: 1, max_ngram: 3, max_draft: 4 }, false);
    assert_eq!(check(name, &model, &first, Tail::Diverge(60), &lookup), 60);
}

#[test]
fn recurrent_states_reach_the_disk_and_serve_after_a_restart() {
    let model = load_fixture(HYBRID_FIXTURE);
    let (dir, config) = disk_config();
    let key = CacheKey::of(&model, None);
    let p = params(DraftMode::None, true);
    let first = long_prompt(HYBRID_FIXTURE, 300);
    let (g, state, marks) = generate_marked(&model, &first, &p, None, None, |_, _| {}).unwrap();
    {
        let mut cache = PrefixCache::new(&config, Arc::new(PrefixStats::default()));
        for s in cache.keep_turn(&key, state, marks, g.cached_tokens) {
            cache.persist(&key, &s);
        }
    }
    // As for the sliding windows: the mark at 256 and the final state are written.
    wait_for(|| std::fs::read_dir(dir.path()).unwrap().count() == 2);
    let mut second = first[..256].to_vec();
    second.extend_from_slice(&golden(HYBRID_FIXTURE).prompt_ids[3..9]);
    let mut cache = PrefixCache::new(&config, Arc::new(PrefixStats::default()));
    let from = cache.lookup(&key, &second, false);
    assert_eq!(from.as_ref().map(|s| s.len()), Some(256), "a mark read back from disk");
    let (warm, _) = run(&model, &second, &p, from);
    let (cold, _) = run(&model, &second, &p, None);
    assert_eq!(warm.cached_tokens, 256);
    assert_eq!(warm.tokens, cold.tokens);
    for (a, b) in warm.logprobs.iter().zip(&cold.logprobs) {
        assert!((a.logprob - b.logprob).abs() < 1e-4);
    }
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

/// The keys a generation's state holds, layer by layer, against the same tokens prefilled
/// from scratch: a state must hold exactly its tokens, however the generation stopped (in the
/// middle of a round of drafts, on a stop string, at max_tokens).
#[test]
fn a_finished_generation_leaves_exactly_the_state_of_its_tokens() {
    for (name, draft) in [
        ("qwen3", DraftMode::lookup()),
        ("qwen3", DraftMode::None),
        ("gemma3", DraftMode::lookup()),
        (MTP_FIXTURE, DraftMode::Mtp { depth: 3 }),
    ] {
        let model = load_fixture(name);
        let prompt = long_prompt(name, 50);
        // Ends at max_tokens, and on a stop string in the text of each of the first 14
        // tokens (a stop can land on the token after a rejected draft).
        // Sampling warm enough that some drafts are rejected: the first temperature and seed
        // where that happens.
        let sampled = |t: f32, seed| GenerateParams {
            sampling: SamplingParams { temperature: t, seed: Some(seed), ..Default::default() },
            ..params(draft.clone(), false)
        };
        let rejects = |p: &GenerateParams| {
            let (g, _) = run(&model, &prompt, p, None);
            g.draft.is_some_and(|d| {
                d.accepted_by_depth.iter().sum::<usize>() < d.drafted_by_depth.iter().sum()
            })
        };
        let choice = [1.0f32, 2.0, 4.0, 8.0, 16.0]
            .iter()
            .flat_map(|&t| (1..8).map(move |seed| (t, seed)))
            .find(|&(t, seed)| rejects(&sampled(t, seed)));
        assert!(draft == DraftMode::None || choice.is_some(), "{name}: no draft was ever rejected");
        let (t, seed) = choice.unwrap_or((1.0, 1));
        let base =
            |logprobs: bool| GenerateParams { logprobs: logprobs.then_some(4), ..sampled(t, seed) };
        let (whole, _) = run(&model, &prompt, &base(false), None);
        let stops: Vec<Vec<String>> = whole
            .tokens
            .iter()
            .filter_map(|&t| model.tokenizer.decode(&[t]).ok())
            .filter(|t| !t.trim().is_empty())
            .map(|t| vec![t])
            .collect();
        let ends = (1..=14).map(|m| (m, vec![])).chain(stops.into_iter().map(|s| (14, s)));
        for (max_tokens, stop) in ends {
            for logprobs in [false, true] {
                let p = GenerateParams { max_tokens, stop: stop.clone(), ..base(logprobs) };
                let (_, state) = run(&model, &prompt, &p, None);
                let state = state.unwrap();
                let mut fresh = model.net.new_caches();
                let ids = mlx_rs::Array::from_slice(&state.tokens, &[1, state.len() as i32]);
                model.forward(&ids, &mut fresh).unwrap();
                for (l, (a, b)) in state.layers.iter().zip(&fresh).enumerate() {
                    let (ka, _, na) = a.parts();
                    let (kb, _, nb) = b.parts();
                    assert_eq!(na, nb);
                    let (ka, kb) = (ka.unwrap(), kb.unwrap());
                    // The slots of the positions the cache says it holds (a ring keeps its
                    // latest `stored` positions at slot p % capacity).
                    let slots: Vec<i32> = match a.ring() {
                        Some((_, stored)) => {
                            let cap = ka.shape()[2];
                            (na - stored..na).map(|p| p % cap).collect()
                        }
                        None => (0..na).collect(),
                    };
                    let idx = mlx_rs::Array::from_slice(&slots, &[slots.len() as i32]);
                    let pick = |k: &mlx_rs::Array| k.take_axis(&idx, 2).unwrap();
                    let d = pick(ka).subtract(pick(kb)).unwrap();
                    let worst =
                        mlx_rs::ops::max(d.abs().unwrap(), None).unwrap().item_cast::<f32>();
                    assert!(
                        worst < 1e-3,
                        "{name} {draft:?} max_tokens {max_tokens} stop {stop:?} logprobs {logprobs}: layer {l} differs by {worst}"
                    );
                }
            }
        }
    }
}

/// A generation cancelled while it prefills leaves what it had prefilled, exactly (an agent
/// that gives up on a long prompt and retries, as Claude Code does after its stream timeout,
/// starts from there instead of from nothing). The cancel is timed at fractions of how long
/// the whole prefill took, until one lands inside it.
#[test]
fn a_cancelled_prefill_leaves_what_it_prefilled() {
    let model = load_fixture("qwen3");
    let prompt = long_prompt("qwen3", 1500);
    let p = GenerateParams { prefill_chunk: 4, max_tokens: 4, ..params(DraftMode::None, false) };
    let t = std::time::Instant::now();
    let (cold, _) = run(&model, &prompt, &p, None);
    let whole = t.elapsed();
    let mut landed = None;
    for frac in [0.5, 0.25, 0.75, 0.1, 0.9] {
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let (g, state) = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(whole.mul_f64(frac));
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            generate_from(&model, &prompt, &p, Some(&cancel), None, |_, _| {}).unwrap()
        });
        if g.finish_reason == FinishReason::Cancelled && g.tokens.is_empty() {
            let state = state.expect("a prefill cancelled after its first chunk leaves a state");
            landed = Some(state);
            break;
        }
    }
    let state = landed.expect("no cancel landed inside the prefill");
    let n = state.len();
    assert!(n > 0 && n < prompt.len() && n % 4 == 0, "whole chunks of the prompt: {n}");
    assert_eq!(state.tokens, prompt[..n]);
    let (warm, _) = run(&model, &prompt, &p, Some(state));
    assert_eq!(warm.cached_tokens, n);
    assert_eq!(warm.tokens, cold.tokens, "the retry answers as a cold run does");
}
