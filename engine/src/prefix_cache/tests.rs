//! The RAM tier's bookkeeping on small synthetic states: longest prefix wins, a state that
//! covers an older one replaces it, the byte budget evicts the least recently used.

use mlx_rs::Array;

use super::*;
use crate::model::kv_cache::KvCache;

/// A one-layer state holding `tokens` (each position's key is its token, as f32).
fn state(tokens: &[u32]) -> KvState {
    let mut c = KvCache::new();
    let vals: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
    let k = Array::from_slice(&vals, &[1, 1, tokens.len() as i32, 1]);
    c.update_and_fetch(&k, &k).unwrap();
    KvState { tokens: tokens.to_vec(), layers: vec![c], mtp: None }
}

fn key(name: &str) -> CacheKey {
    CacheKey { model: name.into(), digest: format!("{name}-digest") }
}

fn cache(ram_bytes: usize) -> (PrefixCache, Arc<PrefixStats>) {
    let stats = Arc::new(PrefixStats::default());
    let config = PrefixCacheConfig { ram_bytes, ..Default::default() };
    (PrefixCache::new(&config, stats.clone()), stats)
}

#[test]
fn the_longest_shared_prefix_wins_and_is_cut_to_fit() {
    let (mut c, stats) = cache(1 << 20);
    c.store(key("m"), state(&[1, 2, 3, 4, 5, 6]));
    c.store(key("m"), state(&[1, 2, 9, 9]));
    let hit = c.lookup(&key("m"), &[1, 2, 3, 4, 7, 7], false).unwrap();
    assert_eq!(hit.tokens, vec![1, 2, 3, 4]);
    assert_eq!(hit.layers[0].offset(), 4);
    // The last prompt token is always run, even when everything before it is cached.
    assert_eq!(c.lookup(&key("m"), &[1, 2, 3], false).unwrap().len(), 2);
    // Another model's states are never candidates.
    assert!(c.lookup(&key("other"), &[1, 2, 3, 4, 5], false).is_none());
    let s = stats.snapshot();
    assert_eq!((s.hit_tokens, s.miss_tokens), (6, 2 + 1 + 5));
}

#[test]
fn a_longer_state_replaces_the_prefix_it_covers() {
    let (mut c, stats) = cache(1 << 20);
    c.store(key("m"), state(&[1, 2, 3]));
    c.store(key("m"), state(&[1, 2, 3, 4, 5]));
    c.store(key("m"), state(&[7, 8]));
    assert_eq!(stats.snapshot().ram_entries, 2);
    // The cached clone is unaffected by the caller's later writes.
    let mut hit = c.lookup(&key("m"), &[1, 2, 3, 4, 5, 6], false).unwrap();
    let k = Array::from_slice(&[99.0f32], &[1, 1, 1, 1]);
    hit.layers[0].update_and_fetch(&k, &k).unwrap();
    let again = c.lookup(&key("m"), &[1, 2, 3, 4, 5, 6], false).unwrap();
    let (keys, _, n) = again.layers[0].parts();
    let keys = keys.unwrap();
    keys.eval().unwrap();
    assert_eq!(n, 5);
    assert_eq!(&keys.as_slice::<f32>()[..5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn the_budget_evicts_the_least_recently_used() {
    let one = state(&[1, 2, 3]).nbytes();
    let (mut c, stats) = cache(2 * one);
    c.store(key("m"), state(&[1, 2, 3]));
    c.store(key("m"), state(&[4, 5, 6]));
    // Using the first makes the second the oldest.
    assert!(c.lookup(&key("m"), &[1, 2, 3, 0], false).is_some());
    c.store(key("m"), state(&[7, 8, 9]));
    assert_eq!(stats.snapshot().ram_entries, 2);
    assert!(c.lookup(&key("m"), &[4, 5, 6, 0], false).is_none(), "evicted");
    assert!(c.lookup(&key("m"), &[1, 2, 3, 0], false).is_some());
    assert_eq!(stats.snapshot().ram_bytes, 2 * one as u64);
    // A budget of 0 keeps nothing.
    let (mut off, s) = cache(0);
    off.store(key("m"), state(&[1, 2, 3]));
    assert_eq!(s.snapshot().ram_entries, 0);
}

#[test]
fn with_a_block_a_guess_learns_only_whole_blocks() {
    // A victim's conversation, 300 tokens; two guesses at it that share 140 and 180 tokens.
    let victim: Vec<u32> = (0..300).map(|i| i % 97 + 3).collect();
    let guess = |right: usize| -> Vec<u32> {
        let mut g = victim[..right].to_vec();
        g.extend([1, 1, 1]);
        g
    };
    let stats = Arc::new(PrefixStats::default());
    let config = PrefixCacheConfig { block: SHARED_BLOCK, ..Default::default() };
    let mut c = PrefixCache::new(&config, stats);
    c.store(key("m"), state(&victim));
    let reused =
        |c: &mut PrefixCache, p: &[u32]| c.lookup(&key("m"), p, false).map_or(0, |s| s.len());
    assert_eq!(reused(&mut c, &guess(140)), 128);
    assert_eq!(reused(&mut c, &guess(180)), 128, "a closer guess looks the same");
    assert_eq!(reused(&mut c, &guess(100)), 0, "less than a block reuses nothing");
    assert_eq!(reused(&mut c, &guess(290)), 256);
    // Without a block (no key: every local program equally trusted) reuse is exact.
    let (mut exact, _) = cache(1 << 20);
    exact.store(key("m"), state(&victim));
    assert_eq!(reused(&mut exact, &guess(140)), 140);
    assert_eq!(PrefixCacheConfig::block_for(true), SHARED_BLOCK);
    assert_eq!(PrefixCacheConfig::block_for(false), 1);
}
