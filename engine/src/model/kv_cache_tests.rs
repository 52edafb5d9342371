//! The cache's sliding-window rings under drafts, and its host-side writes against MLX's.

use super::*;

/// Which stored values each query sees, per query row.
fn visible(keys: &Array, mask: &AttentionMask, queries: usize) -> Vec<Vec<i64>> {
    let vals: Vec<i64> = keys.as_slice::<f32>().iter().map(|v| *v as i64).collect();
    let n = vals.len();
    (0..queries)
        .map(|q| {
            let mut seen: Vec<i64> = match mask {
                AttentionMask::None => vals.clone(),
                AttentionMask::Causal => vals[..n - queries + q + 1].to_vec(),
                AttentionMask::Array(m) => {
                    let m = m.as_slice::<bool>();
                    (0..n).filter(|&k| m[(q * n + k) % m.len()]).map(|k| vals[k]).collect()
                }
            };
            seen.sort();
            seen
        })
        .collect()
}

#[test]
fn a_sliding_cache_rolls_back_drafts_and_always_shows_exactly_the_window() {
    // Value of position p written by write number v: p * 1000 + v. After a rollback, the
    // next write of p must replace the stale one.
    let w = 8;
    let mut cache = KvCache::sliding(w);
    let mut latest: Vec<i64> = vec![]; // value currently valid for each position
    let mut rng = 99u64;
    let mut next = |m: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % m
    };
    for write in 0..400i64 {
        let l = 1 + next(6) as i32;
        let o = cache.offset();
        let vals: Vec<f32> = (0..l).map(|i| ((o + i) as i64 * 1000 + write) as f32).collect();
        let k = Array::from_slice(&vals, &[1, 1, l, 1]);
        let (keys, _, mask) = cache.update(&k, &k).unwrap();
        latest.truncate(o as usize);
        latest.extend(vals.iter().map(|v| *v as i64));
        for (q, seen) in visible(&keys, &mask, l as usize).into_iter().enumerate() {
            let p = o as usize + q;
            let mut want: Vec<i64> = latest[(p + 1).saturating_sub(w as usize)..=p].to_vec();
            want.sort();
            assert_eq!(seen, want, "write {write}: query at position {p}");
        }
        // Reject some of a multi-token write's tail, as a verify pass does.
        if l > 1 {
            let reject = next(l as u64) as i32;
            assert_eq!(cache.trim(reject), reject);
        }
    }
    assert!(cache.offset() > 4 * (w + SLIDING_SLACK), "the ring wrapped several times");
}

/// What a host write's view lets the new query see, sorted.
fn host_visible(view: &HostView) -> Vec<i64> {
    let mut seen: Vec<i64> = (0..view.len)
        .filter(|&s| view.visible.as_ref().is_none_or(|v| v[s]))
        .map(|s| view.keys[s] as i64)
        .collect();
    seen.sort();
    seen
}

#[test]
fn host_writes_show_what_mlx_writes_show_and_never_reach_a_clone() {
    // The same positions written through MLX (`update`) into one cache and on the host
    // (`host_append`, after the same MLX prefill) into another, with rollbacks as a verify
    // pass makes: each decode query sees the same values. A clone taken mid-way keeps
    // what it held.
    for window in [None, Some(8)] {
        let new = || window.map_or_else(KvCache::new, KvCache::sliding);
        let (mut mlx, mut host) = (new(), new());
        let first: Vec<f32> = (0..5).map(|p| (p * 1000) as f32).collect();
        let k = Array::from_slice(&first, &[1, 1, 5, 1]);
        mlx.update(&k, &k).unwrap();
        host.update(&k, &k).unwrap();
        assert!(host.host_ready(1, 1, 1) && !host.host_ready(2, 1, 1));
        let mut snapshot = None;
        let mut rng = 7u64;
        for write in 0..300i64 {
            let p = mlx.offset() as i64;
            let v = [(p * 1000 + write) as f32];
            let (keys, _, mask) = mlx
                .update(
                    &Array::from_slice(&v, &[1, 1, 1, 1]),
                    &Array::from_slice(&v, &[1, 1, 1, 1]),
                )
                .unwrap();
            let want = visible(&keys, &mask, 1).remove(0);
            let view = host.host_append(&v, &v).unwrap();
            assert_eq!(host_visible(&view), want, "{window:?}: write {write} at {p}");
            if write == 20 {
                snapshot = Some((host.clone(), want));
            }
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if (rng >> 33).is_multiple_of(5) {
                let n = ((rng >> 40) % 3) as i32;
                assert_eq!(mlx.trim(n), host.trim(n), "{window:?}: trim");
            }
        }
        // The clone's own next write (through MLX) sees what it held when taken.
        let (mut clone, held) = snapshot.unwrap();
        let last = held.iter().copied().max().unwrap();
        let v = [-1.0f32];
        let (keys, _, mask) = clone
            .update(&Array::from_slice(&v, &[1, 1, 1, 1]), &Array::from_slice(&v, &[1, 1, 1, 1]))
            .unwrap();
        let seen = visible(&keys, &mask, 1).remove(0);
        assert!(
            seen.contains(&last) && seen.contains(&-1),
            "{window:?}: the clone lost its positions"
        );
        let later: Vec<&i64> = seen.iter().filter(|&&x| x > last).collect();
        assert!(later.is_empty(), "{window:?}: the clone sees later host writes {later:?}");
    }
}
