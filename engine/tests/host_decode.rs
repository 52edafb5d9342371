//! The CPU backend's host path (`model/host_matrix.rs`): a prefill's products of
//! many vectors (sgemm over widened bands) and one-token steps, against MLX's f32 matmuls on
//! the same weights. The fixtures' random weights have no exact 8-bit copy, so each fixture is
//! copied with its projection matrices rounded to an 8-bit affine grid per block of 32 (as GGUF
//! imports are); then the prefill's and every decode step's logits with the host path must
//! equal those with it switched off (`PERCH_NO_HOST_HEAD`) up to summation order, and
//! sequences decoded together in a batch on the host path equal their solo runs.
//! One test in its own binary: it sets the switch for the process.

// The host path is off on macOS (Metal runs MLX's own ops), so this binary is empty there.
#![cfg(not(target_os = "macos"))]

mod common;

use common::batch::{run_batch, Job};
use common::*;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::Array;
use perch_engine::train::trainer::masked_loss;
use perch_engine::{GenerateParams, LoadedModel};

/// The prompt's logits at every position (one prefill: many vectors per product), then the
/// logits of each one-token step after it, feeding `tokens` in turn.
fn step_logits(model: &LoadedModel, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut caches = model.net.new_caches();
    let values = |l: Array| {
        let l = l.as_dtype(mlx_rs::Dtype::Float32).unwrap();
        l.eval().unwrap();
        l.as_slice::<f32>().to_vec()
    };
    let p = Array::from_slice(prompt, &[1, prompt.len() as i32]);
    let prefill = values(model.net.forward(&p, &mut caches).unwrap());
    let vocab = prefill.len() / prompt.len();
    let mut out: Vec<Vec<f32>> = prefill.chunks(vocab).map(<[f32]>::to_vec).collect();
    out.extend(tokens.iter().map(|&t| {
        values(model.net.forward(&Array::from_slice(&[t], &[1, 1]), &mut caches).unwrap())
    }));
    out
}

/// Gradients of training's loss over `ids` for a rank-2 adapter on every projection.
fn lora_grads(model: &LoadedModel, ids: &[u32]) -> Vec<Vec<f32>> {
    use perch_engine::model::lora::{Lora, LoraSpec};
    let dims = model.net.projection_dims();
    let targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
    let spec = LoraSpec {
        rank: 2,
        alpha: 4.0,
        targets: targets.iter().map(|t| t.to_string()).collect(),
        layers: None,
    };
    let slots = spec.slots(&dims).unwrap();
    // Both factors nonzero (B starts at zero), so every factor has a gradient.
    let params: Vec<Array> = Lora::init_params(&spec, &dims, &slots, 1)
        .unwrap()
        .into_iter()
        .map(|p| p.add(Array::from_f32(0.01)).unwrap())
        .collect();
    let ids: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    let l = ids.len() as i32 - 1;
    let inputs = Array::from_slice(&ids[..ids.len() - 1], &[1, l]);
    let targets = Array::from_slice(&ids[1..], &[1, l]);
    let mask = Array::ones::<f32>(&[1, l]).unwrap();
    let f = |p: &[Array]| -> Result<Vec<Array>, mlx_rs::error::Exception> {
        let lora = Lora::from_params(&spec, &dims, &slots, p);
        let loss = masked_loss(model.net.as_ref(), Some(&lora), &inputs, &targets, &mask);
        Ok(vec![loss.map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))?])
    };
    let argnums: Vec<i32> = (0..params.len() as i32).collect();
    let (_, grads) = value_and_grad_with_argnums(f, &argnums[..])(&params).unwrap();
    grads
        .iter()
        .map(|g| {
            let g = g.flatten(None, None).unwrap();
            g.eval().unwrap();
            g.as_slice::<f32>().to_vec()
        })
        .collect()
}

#[test]
fn the_host_path_equals_mlx_on_every_architecture() {
    let prompt: Vec<u32> = (1..40).map(|i| (i * 37) % 200 + 3).collect();
    let tokens: Vec<u32> = (0..24).map(|i| (i * 53) % 200 + 5).collect();
    // The copies this test makes stay out of the user's cache.
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("PERCH_CACHE_DIR", cache.path());
    for name in ["qwen3", "llama", "qwen2", "gemma3"] {
        let (_tmp, dir) = rounded_fixture_copy(name);
        std::env::set_var("PERCH_NO_HOST_HEAD", "1");
        let mlx = perch_engine::model::load_model(&dir).unwrap();
        let without = step_logits(&mlx, &prompt, &tokens);
        let grads_mlx = lora_grads(&mlx, &prompt);
        drop(mlx);
        std::env::remove_var("PERCH_NO_HOST_HEAD");
        // Training builds MLX graphs even where copies exist: same gradients both ways. (This
        // first load with the path on also makes the copies and keeps them on disk.)
        let host = perch_engine::model::load_model(&dir).unwrap();
        let grads_host = lora_grads(&host, &prompt);
        drop(host);
        let worst = grads_host.iter().zip(&grads_mlx).map(|(a, b)| relative_error(a, b));
        let worst = worst.fold(0f32, f32::max);
        eprintln!("{name}: LoRA gradients with copies vs without, worst {worst:.2e}");
        assert!(worst < 1e-4, "{name}: training's gradients changed with the copies: {worst:.2e}");
        // A load that reads its copies from disk never reads the projections' f32 weights,
        // which MLX loads lazily: after one step has read every other tensor, the weight files
        // are overwritten in place, and the prefill and steps must not notice.
        let host = perch_engine::model::load_model(&dir).unwrap();
        assert!(host.host_copies.reused > 0, "{name}: no copies read from disk");
        let mut caches = host.net.new_caches();
        let one = Array::from_slice(&[prompt[0]], &[1, 1]);
        host.net.forward(&one, &mut caches).unwrap().eval().unwrap();
        scribble_weight_files(&dir);
        let with = step_logits(&host, &prompt, &tokens);
        let split = prompt.len();
        for (part, with, without) in [
            ("prefill", &with[..split], &without[..split]),
            ("steps", &with[split..], &without[split..]),
        ] {
            let worst = with.iter().zip(without).map(|(a, b)| relative_error(a, b));
            let worst = worst.fold(0f32, f32::max);
            eprintln!("{name} {part}: host vs MLX logits, worst relative difference {worst:.2e}");
            // Equal up to summation order (a prefill's sgemm over the widened copy can be
            // bit-identical to MLX's over the same values).
            assert!(worst < 1e-4, "{name} {part}: {worst:.2e}");
        }
        // A batch's decode steps take the host path too (a few rows, one per sequence, up to
        // six here: the copies' loop four vectors at a time, then two): each sequence decodes
        // token for token as it does alone.
        let params = |n| GenerateParams {
            max_tokens: n,
            ignore_eos: true,
            prefill_chunk: 5,
            ..Default::default()
        };
        let jobs: Vec<Job> = (0..6)
            .map(|i| Job {
                prompt: prompt[i * 3..].to_vec(),
                params: params(10 + i),
                joins_at: i,
                cancel_at: None,
            })
            .collect();
        let batch = run_batch(&host, &jobs, 9);
        for (i, (job, (got, _))) in jobs.iter().zip(&batch).enumerate() {
            let want = perch_engine::generate(&host, &job.prompt, &job.params, None, |_| {});
            assert_eq!(got.tokens, want.unwrap().tokens, "{name}: sequence {i} batched");
        }
    }
}

/// Every tensor byte of the directory's safetensors files set to 0x7f (f32 3.4e38), in place:
/// the header stays, so a lazy read still finds its tensor, with values no model survives.
fn scribble_weight_files(dir: &std::path::Path) {
    use std::io::{Read, Seek, SeekFrom, Write};
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut len = [0u8; 8];
        f.read_exact(&mut len).unwrap();
        let start = 8 + u64::from_le_bytes(len);
        let size = f.metadata().unwrap().len();
        f.seek(SeekFrom::Start(start)).unwrap();
        f.write_all(&vec![0x7f; (size - start) as usize]).unwrap();
        f.sync_all().unwrap();
    }
}
