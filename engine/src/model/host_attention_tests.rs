//! The host attention against MLX's kernel, and its exp against f64's.

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::*;

fn random(shape: &[i32], seed: u64) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    let a = mlx_rs::random::normal::<f32>(shape, None, None, Some(&key)).unwrap();
    a.eval().unwrap();
    a
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

/// MLX's answer for queries `q` over the first `n` positions of `k`/`v`, as [L, heads · Dv].
fn mlx_attention(q: &Array, k: &Array, v: &Array, n: i32, scale: f32, causal: bool) -> Vec<f32> {
    let (k, v) = (k.index((.., .., ..n, ..)), v.index((.., .., ..n, ..)));
    let mask = causal.then_some(ScaledDotProductAttentionMask::Causal);
    let out = fast::scaled_dot_product_attention(q, &k, &v, scale, mask, None).unwrap();
    let (l, width) = (q.shape()[2], q.shape()[1] * v.shape()[3]);
    let out = out.transpose_axes(&[0, 2, 1, 3]).unwrap().reshape(&[l, width]).unwrap();
    out.as_slice::<f32>().to_vec()
}

#[test]
fn the_host_attention_is_mlx_s() {
    // (heads, kv_heads, L, len, capacity, causal): grouped and plain heads, a prefill from
    // empty, a chunk after a prefix, a decode step, blocks that split a chunk (len 3000 with
    // 4 heads per key head takes 174 positions a block), capacity beyond len.
    let cases = [
        (4, 2, 7, 7, 16, true),
        (4, 2, 37, 100, 128, true),
        (3, 3, 1, 50, 64, false),
        (8, 2, 1, 300, 512, false),
        (8, 2, 400, 3000, 3072, true),
    ];
    for (seed, &(heads, kv_heads, l, len, cap, causal)) in cases.iter().enumerate() {
        let (dk, dv) = (16, 24);
        let seed = seed as u64 * 3;
        let q = random(&[1, heads, l, dk], seed);
        let k = random(&[1, kv_heads, cap, dk], seed + 1);
        let v = random(&[1, kv_heads, cap, dv], seed + 2);
        let scale = 0.3;
        let want = mlx_attention(&q, &k, &v, len, scale, causal);
        let cached = Cached {
            keys: k.as_slice(),
            values: v.as_slice(),
            kv_heads: kv_heads as usize,
            capacity: cap as usize,
            len: len as usize,
            key_dim: dk as usize,
            value_dim: dv as usize,
        };
        let mask = if causal { Mask::Causal } else { Mask::None };
        let got = attend(q.as_slice(), heads as usize, l as usize, &cached, scale, &mask);
        let w = worst(&got, &want);
        assert!(w < 2e-5, "case {heads}/{kv_heads} L {l} len {len}: {w:e} from MLX");
    }
}

#[test]
fn a_cache_s_chunk_is_served_on_the_host() {
    let (heads, kv_heads, d) = (4, 2, 16);
    let mut cache = KvCache::new();
    let (k0, v0) = (random(&[1, kv_heads, 40, d], 7), random(&[1, kv_heads, 40, d], 8));
    cache.update(&k0, &v0).unwrap();
    let (k1, v1) = (random(&[1, kv_heads, 9, d], 9), random(&[1, kv_heads, 9, d], 10));
    let (k, v, mask) = cache.update(&k1, &v1).unwrap();
    // A transposed view, as the attention's queries are: the path must read its layout.
    let q = random(&[1, 9, heads, d], 11).transpose_axes(&[0, 2, 1, 3]).unwrap();
    let got = try_attend(&q, &k, &v, &mask, &cache, 0.25).unwrap();
    if !host_matrix::enabled() {
        assert!(got.is_none(), "PERCH_NO_HOST_HEAD turns the host path off");
        return;
    }
    let got = got.expect("a full-attention cache's chunk is served on the host");
    assert_eq!(got.shape(), &[1, 9, heads * d]);
    let want = mlx_attention(&q, &k, &v, 49, 0.25, true);
    let w = worst(got.as_slice(), &want);
    assert!(w < 2e-5, "{w:e} from MLX");
}

/// A sliding window's chunk (keys in position order, an explicit band mask) and its decode
/// step (the ring's slots, a mask of the valid ones) against MLX with the same masks.
#[test]
fn a_sliding_window_is_served_on_the_host() {
    if !host_matrix::enabled() {
        return; // PERCH_NO_HOST_HEAD: a_cache_s_chunk_is_served_on_the_host checks the switch
    }
    let (heads, kv_heads, d, window) = (2, 1, 8, 16);
    let mut ring = KvCache::sliding(window);
    let mut seed = 20;
    for l in [30, 12, 1, 1] {
        let k1 = random(&[1, kv_heads, l, d], seed);
        let v1 = random(&[1, kv_heads, l, d], seed + 1);
        let q = random(&[1, l, heads, d], seed + 2).transpose_axes(&[0, 2, 1, 3]).unwrap();
        seed += 3;
        let (k, v, mask) = ring.update(&k1, &v1).unwrap();
        let AttentionMask::Array(m) = &mask else {
            panic!("a window past its size masks explicitly")
        };
        let got = try_attend(&q, &k, &v, &mask, &ring, 0.5).unwrap().expect("served");
        let want = fast::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            0.5,
            Some(ScaledDotProductAttentionMask::Array(m)),
            None,
        )
        .unwrap();
        let want = want.transpose_axes(&[0, 2, 1, 3]).unwrap().reshape(&[l, heads * d]).unwrap();
        let w = worst(got.as_slice(), want.as_slice());
        assert!(w < 2e-5, "L {l}: {w:e} from MLX");
    }
}

/// Both exps (the vector one where this CPU has AVX2, and the portable one) against f64's.
#[test]
fn the_exps_are_close_to_f64_s() {
    type Exp = fn(&mut [f32]) -> f32;
    let paths: [(&str, Exp); 2] = [("dispatched", exp_shifted), ("portable", exp_shifted_plain)];
    for (name, exp) in paths {
        // Shifted scores from 0 down to -90, 1001 of them (a tail past a multiple of eight).
        let xs: Vec<f32> = (0..1001).map(|i| -90.0 * i as f32 / 1000.0).collect();
        let mut got = xs.clone();
        let sum = exp(&mut got);
        let mut total = 0f64;
        for (x, g) in xs.iter().zip(&got) {
            let want = (*x as f64).exp();
            total += want;
            if *x > -87.0 {
                let rel = ((*g as f64 - want) / want).abs();
                assert!(rel < 3e-7, "{name}: exp({x}) = {g}, f64 says {want}: {rel:e}");
            } else {
                assert!(*g < 2e-38, "{name}: exp({x}) = {g}");
            }
        }
        let rel = ((sum as f64 - total) / total).abs();
        assert!(rel < 1e-6, "{name}: sum {sum} vs {total}: {rel:e}");
    }
}

/// `cargo test --release -p perch-engine --lib host_attention_speed -- --ignored --nocapture`:
/// MLX's kernel against the host's on Qwen2.5-0.5B's heads (14 query, 2 key/value, 64 wide),
/// for a 512-token prefill chunk after growing prefixes and for decode steps.
#[test]
#[ignore]
fn host_attention_speed() {
    for (l, n) in [(512, 1024), (512, 4096), (512, 8000), (1, 1000), (1, 8000)] {
        let q = random(&[1, 14, l, 64], 1);
        let (k, v) = (random(&[1, 2, n, 64], 2), random(&[1, 2, n, 64], 3));
        let (causal, runs) = (l > 1, 3);
        let flops = 4.0 * 14.0 * 64.0 * l as f64 * n as f64;
        let t = std::time::Instant::now();
        for _ in 0..runs {
            let mask = causal.then_some(ScaledDotProductAttentionMask::Causal);
            let out = fast::scaled_dot_product_attention(&q, &k, &v, 0.125, mask, None).unwrap();
            out.eval().unwrap();
        }
        let mlx = t.elapsed().as_secs_f64() / runs as f64;
        let c = Cached {
            keys: k.as_slice(),
            values: v.as_slice(),
            kv_heads: 2,
            capacity: n as usize,
            len: n as usize,
            key_dim: 64,
            value_dim: 64,
        };
        let mask = if causal { Mask::Causal } else { Mask::None };
        let t = std::time::Instant::now();
        for _ in 0..runs {
            std::hint::black_box(attend(q.as_slice(), 14, l as usize, &c, 0.125, &mask));
        }
        let host = t.elapsed().as_secs_f64() / runs as f64;
        eprintln!(
            "L {l} over {n}: MLX {:.2} ms ({:.1} GFLOP/s), host {:.2} ms ({:.1} GFLOP/s)",
            mlx * 1e3,
            flops / mlx / 1e9,
            host * 1e3,
            flops / host / 1e9
        );
    }
}
