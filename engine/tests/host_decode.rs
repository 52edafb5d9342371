//! The CPU backend's host path for one-token steps (issue 19, `model/host_matrix.rs`) against
//! MLX's f32 matmuls on the same weights. The fixtures' random weights have no exact 8-bit
//! copy, so each fixture is copied with its projection matrices rounded to an 8-bit affine
//! grid per block of 32 (as GGUF imports are); then every decode step's logits with the host
//! path must equal those with it switched off (`PERCH_NO_HOST_HEAD`) up to summation order.
//! One test in its own binary: it sets the switch for the process.

mod common;

use common::*;
use mlx_rs::Array;
use perch_engine::LoadedModel;

/// Logits of each one-token step after the prompt, feeding `tokens` in turn.
fn step_logits(model: &LoadedModel, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut caches = model.net.new_caches();
    let p = Array::from_slice(prompt, &[1, prompt.len() as i32]);
    model.net.forward(&p, &mut caches).unwrap().eval().unwrap();
    tokens
        .iter()
        .map(|&t| {
            let x = Array::from_slice(&[t], &[1, 1]);
            let l = model.net.forward(&x, &mut caches).unwrap();
            let l = l.as_dtype(mlx_rs::Dtype::Float32).unwrap();
            l.eval().unwrap();
            l.as_slice::<f32>().to_vec()
        })
        .collect()
}

#[test]
fn one_token_steps_on_the_host_equal_mlx_on_every_architecture() {
    let prompt: Vec<u32> = (1..40).map(|i| (i * 37) % 200 + 3).collect();
    let tokens: Vec<u32> = (0..24).map(|i| (i * 53) % 200 + 5).collect();
    // The copies this test makes stay out of the user's cache.
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("PERCH_CACHE_DIR", cache.path());
    for name in ["qwen3", "llama", "qwen2", "gemma3"] {
        let (_tmp, dir) = rounded_fixture_copy(name);
        std::env::remove_var("PERCH_NO_HOST_HEAD");
        let host = perch_engine::model::load_model(&dir).unwrap();
        let with = step_logits(&host, &prompt, &tokens);
        drop(host);
        std::env::set_var("PERCH_NO_HOST_HEAD", "1");
        let mlx = perch_engine::model::load_model(&dir).unwrap();
        let without = step_logits(&mlx, &prompt, &tokens);
        std::env::remove_var("PERCH_NO_HOST_HEAD");
        let (mut worst, mut differs) = (0f32, false);
        for (a, b) in with.iter().zip(&without) {
            worst = worst.max(relative_error(a, b));
            differs |= a != b;
        }
        eprintln!("{name}: host vs MLX logits, worst relative difference {worst:.2e}");
        // Equal up to summation order, and the host path was taken (bit-identical logits
        // would mean MLX computed both).
        assert!(worst < 1e-4, "{name}: {worst:.2e}");
        assert!(differs, "{name}: no step went through the host copy");
    }
}
