//! The 8-bit copy against MLX's f32 matmul on matrices shaped like GGUF imports.

use super::*;

/// A [rows, cols] matrix of `block`-wide blocks, each `offset + scale * q` with q drawn from
/// `levels` (symmetric when `offset` is minus half the span).
fn quantized(rows: usize, cols: usize, block: usize, levels: u32, affine: bool) -> Vec<f32> {
    let mut data = vec![0f32; rows * cols];
    let mut seed = 12345u64;
    for (b, values) in data.chunks_mut(block).enumerate() {
        let d = 0.001 + (b % 97) as f32 * 1e-4;
        let m = if affine { 0.01 * (b % 13) as f32 } else { d * (levels / 2) as f32 };
        for v in values.iter_mut() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let q = ((seed >> 33) % levels as u64) as f32;
            *v = d * q - m;
        }
    }
    data
}

fn check(data: &[f32], rows: usize, cols: usize, l: usize, block: usize) {
    let w = Array::from_slice(data, &[rows as i32, cols as i32]);
    let host = HostMatrix::new(&w).unwrap().expect("an exact 8-bit copy");
    assert_eq!(host.block, block);
    let x: Vec<f32> = (0..l * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
    let h = Array::from_slice(&x, &[1, l as i32, cols as i32]);
    let got = host.forward(&h).unwrap();
    let want = h.matmul(w.t()).unwrap();
    // The portable loop too, whatever this CPU runs by default.
    let sums: Vec<f32> = x.chunks_exact(block).map(|c| c.iter().sum()).collect();
    let mut plain = vec![0f32; rows * l];
    host.rows_into_plain(0, &mut plain, &x, &sums, l);
    let plain: Vec<f32> = (0..l * rows).map(|k| plain[(k % rows) * l + k / rows]).collect();
    let plain = Array::from_slice(&plain, &[1, l as i32, rows as i32]);
    assert_close(&plain, &want, "portable loop");
    assert_close(&got, &want, "host copy");
}

fn assert_close(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape());
    let (got, want) = (got.as_slice::<f32>(), want.as_slice::<f32>());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
    assert!(err < 1e-5, "{what} differs from the f32 matmul by {err:.2e} relative");
}

#[test]
fn q8_q4k_and_q6k_shaped_matrices_are_exact() {
    // Q8_0: symmetric, 255 levels per 32; Q4_K: affine, 16 levels per 32 (some unused);
    // Q6_K: symmetric, 64 levels per 16 (a 32-block mixes two scales, so 16 it is).
    check(&quantized(300, 256, 32, 255, false), 300, 256, 1, 32);
    check(&quantized(300, 256, 32, 16, true), 300, 256, 3, 32);
    check(&quantized(64, 512, 16, 64, false), 64, 512, 1, 16);
}

#[test]
fn many_vectors_go_through_sgemm_band_by_band() {
    // 5000 rows of 512: bands of 2048 rows, the last one short; 40 vectors (> gemm::FEW).
    assert!(gemm::available(), "libmlx.so's BLAS should bring cblas_sgemm");
    let (rows, cols, l) = (5000, 512, 40);
    let data = quantized(rows, cols, 32, 16, true);
    check(&data, rows, cols, l, 32);
    // And the same values straight from `gemm`, so the test knows which path it checked.
    let w = Array::from_slice(&data, &[rows as i32, cols as i32]);
    let host = HostMatrix::new(&w).unwrap().unwrap();
    let x: Vec<f32> = (0..l * cols).map(|i| ((i * 31) % 101) as f32 / 50.0 - 1.0).collect();
    let got = Array::from_slice(&host.gemm(&x, l).unwrap(), &[1, l as i32, rows as i32]);
    let want = Array::from_slice(&x, &[1, l as i32, cols as i32]).matmul(w.t()).unwrap();
    assert_close(&got, &want, "sgemm over widened bands");
}

#[test]
fn rows_read_from_the_copy_are_the_table_rows() {
    let (rows, cols) = (500, 64);
    let data = quantized(rows, cols, 32, 16, true);
    let table = Array::from_slice(&data, &[rows as i32, cols as i32]);
    let host = HostMatrix::new(&table).unwrap().unwrap();
    let ids = Array::from_slice(&[3u32, 499, 0, 3, 250, 17], &[2, 3]);
    let got = host.gather(&ids).unwrap();
    let want = table.take_axis(&ids, 0).unwrap();
    assert_eq!(got.shape(), [2, 3, 64]);
    assert_close(&got, &want, "gathered rows");
    // An id past the table is an error, not a read out of bounds.
    assert!(host.gather(&Array::from_slice(&[500u32], &[1])).is_err());
}

#[test]
fn a_matrix_that_is_not_exact_keeps_mlx() {
    let data: Vec<f32> =
        (0..256 * 256).map(|i| ((i * 2654435761usize) % 1000) as f32 / 997.0 - 0.5).collect();
    let w = Array::from_slice(&data, &[256, 256]);
    assert!(HostMatrix::new(&w).unwrap().is_none());
}

/// `cargo test --release -p perch-engine --lib host_matrix_speed -- --ignored --nocapture`:
/// bytes read per second by one-vector products on the Qwen 0.5B MLP's shapes.
#[test]
#[ignore]
fn host_matrix_speed() {
    for (rows, cols) in [(9728usize, 896usize), (896, 4864), (151936, 896), (1152, 896), (896, 896)]
    {
        let w =
            Array::from_slice(&quantized(rows, cols, 32, 16, true), &[rows as i32, cols as i32]);
        w.eval().unwrap();
        let t = std::time::Instant::now();
        let host = HostMatrix::new(&w).unwrap().unwrap();
        let ns = t.elapsed().as_secs_f64() * 1e9 / (rows * cols) as f64;
        eprintln!("{rows}x{cols}: the copy made in {ns:.1} ns per weight");
        let x = Array::from_slice(&vec![0.5f32; cols], &[1, 1, cols as i32]);
        let n = 50;
        let t = std::time::Instant::now();
        for _ in 0..n {
            host.forward(&x).unwrap().eval().unwrap();
        }
        let per = t.elapsed().as_secs_f64() / n as f64;
        let bytes = (rows * cols) as f64 * (1.0 + 8.0 / 32.0);
        eprintln!("{rows}x{cols}: {:.3} ms per product, {:.1} GB/s", per * 1e3, bytes / per / 1e9);
    }
}

/// Products of many vectors: MLX's f32 matmul against the copy's (`forward`: its own loop up
/// to `gemm::FEW` vectors, sgemm over widened bands above), on Qwen2.5-0.5B's gate/up and down
/// shapes. Earlier figures on the alternatives (MLX's `dequantize` then matmul, its 8-bit
/// `quantized_matmul`) are in docs/cpu-decode.md.
#[test]
#[ignore]
fn many_vector_speed() {
    for (rows, cols) in [(9728usize, 896usize), (896, 4864)] {
        let w =
            Array::from_slice(&quantized(rows, cols, 32, 16, true), &[rows as i32, cols as i32]);
        w.eval().unwrap();
        let host = HostMatrix::new(&w).unwrap().unwrap();
        for l in [1usize, 2, 4, 8, 32, 128, 512] {
            let x = Array::from_slice(&vec![0.5f32; l * cols], &[1, l as i32, cols as i32]);
            x.eval().unwrap();
            let time = |f: &dyn Fn() -> Array| {
                f().eval().unwrap();
                let t = std::time::Instant::now();
                for _ in 0..5 {
                    f().eval().unwrap();
                }
                t.elapsed().as_secs_f64() / 5.0 * 1e3
            };
            let f32mm = time(&|| x.matmul(w.t()).unwrap());
            let hostf = time(&|| host.forward(&x).unwrap());
            eprintln!("{rows}x{cols} L={l}: f32 matmul {f32mm:.2} ms, host {hostf:.2} ms");
        }
    }
}

#[test]
fn a_vector_s_product_is_the_same_whatever_the_vectors_beside_it() {
    // A batch's decode step multiplies several sequences' vectors at once: each one's result
    // must be exactly what it gets alone, so batching changes no sequence's tokens.
    for (block, levels, affine) in [(32, 16, true), (16, 64, false)] {
        let (rows, cols) = (70, 256);
        let w = Array::from_slice(
            &quantized(rows, cols, block, levels, affine),
            &[rows as i32, cols as i32],
        );
        let host = HostMatrix::new(&w).unwrap().expect("an exact 8-bit copy");
        for l in [2usize, 3, 4, 5, 7] {
            let x: Vec<f32> =
                (0..l * cols).map(|i| ((i * 7919) % 211) as f32 / 97.0 - 1.0).collect();
            let together = host.product(&x);
            for (j, v) in x.chunks_exact(cols).enumerate() {
                let alone = host.product(v);
                assert_eq!(
                    &together[j * rows..(j + 1) * rows],
                    &alone[..],
                    "vector {j} of {l}, block {block}"
                );
            }
        }
        check(&quantized(rows, cols, block, levels, affine), rows, cols, 4, block);
    }
}

#[test]
fn a_blas_with_64_bit_integers_is_refused() {
    use gemm::wide_integers;
    let debian = "OpenBLAS 0.3.21 NO_AFFINITY SKYLAKEX MAX_THREADS=64";
    let ilp64 = "OpenBLAS 0.3.21 USE64BITINT NO_AFFINITY SKYLAKEX MAX_THREADS=64";
    let pthread = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3";
    assert_eq!(wide_integers(Some(debian), Some(pthread)), None);
    assert!(wide_integers(Some(ilp64), Some(pthread)).unwrap().contains("USE64BITINT"));
    let by_name = "/usr/lib/x86_64-linux-gnu/openblas64-pthread/libopenblas64.so.0";
    assert!(wide_integers(None, Some(by_name)).unwrap().contains("libopenblas64"));
    assert!(wide_integers(None, Some("/opt/intel/libmkl_intel_ilp64.so")).is_some());
    assert_eq!(wide_integers(None, Some("/usr/lib/libblas.so.3")), None);
    assert_eq!(wide_integers(None, None), None);
}
