//! Training while serving (docs/training.md) on fixture models: LoRA gradients against finite
//! differences, chat data with assistant-only loss, and `/train` over real HTTP: a run that
//! lowers held-out loss and whose adapter then serves as `model+adapter`, bad requests, the
//! one-run rule, pause/resume/cancel, the receipt seeing user turns, leases released, and a
//! run stopped by an unload.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx_rs::transforms::value_and_grad_with_argnums;
use mlx_rs::Array;
use perch_engine::chat::ChatMessage;
use perch_engine::model::lora::{Lora, LoraSpec};
use perch_engine::server::{ServeConfig, Server};
use perch_engine::train::data::{samples, Example, TrainData};
use perch_engine::train::trainer::masked_loss;
use reqwest::Method;
use serde_json::{json, Value};

/// A cycle of the qwen3-mtp fixture's words: a pattern its own language never makes.
fn pattern_text(words: usize) -> String {
    let cycle =
        ["baga", "dase", "fagi", "gaso", "kagu", "lasa", "mage", "nasi", "pago", "rasu", "saga"];
    (0..words).map(|i| cycle[i % cycle.len()]).collect::<Vec<_>>().join(" ")
}

#[test]
fn lora_gradients_match_finite_differences() {
    let model = load_fixture("qwen3");
    let dims = model.net.projection_dims();
    let spec = LoraSpec {
        rank: 2,
        alpha: 4.0,
        targets: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        layers: Some(2),
    };
    let slots = spec.slots(&dims).unwrap();
    // Both factors random, so every parameter has a gradient.
    let params: Vec<Array> = Lora::init_params(&spec, &dims, &slots, 1)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            if i % 2 == 1 {
                mlx_rs::random::normal::<f32>(p.shape(), 0.0, 0.05, None).unwrap()
            } else {
                p
            }
        })
        .collect();
    let ids: Vec<i32> = model
        .tokenizer
        .encode("The quick brown fox jumps over the lazy dog again and again", true)
        .unwrap()
        .iter()
        .map(|&t| t as i32)
        .collect();
    let l = ids.len() as i32 - 1;
    let inputs = Array::from_slice(&ids[..ids.len() - 1], &[1, l]);
    let targets = Array::from_slice(&ids[1..], &[1, l]);
    let mask = Array::from_slice(
        &(0..l).map(|i| if i >= 2 { 1.0f32 } else { 0.0 }).collect::<Vec<_>>(),
        &[1, l],
    );
    let loss_at = |p: &[Array]| -> f32 {
        let lora = Lora::from_params(&spec, &dims, &slots, p);
        masked_loss(model.net.as_ref(), Some(&lora), &inputs, &targets, &mask)
            .unwrap()
            .item_cast::<f32>()
    };
    let f = |p: &[Array]| -> Result<Vec<Array>, mlx_rs::error::Exception> {
        let lora = Lora::from_params(&spec, &dims, &slots, p);
        Ok(vec![masked_loss(model.net.as_ref(), Some(&lora), &inputs, &targets, &mask)
            .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))?])
    };
    let argnums: Vec<i32> = (0..params.len() as i32).collect();
    let (value, grads) = value_and_grad_with_argnums(f, &argnums[..])(&params).unwrap();
    assert!((value[0].item_cast::<f32>() - loss_at(&params)).abs() < 1e-5);
    // The directional derivative along the gradient is its squared norm: check it with a
    // central difference.
    let norm2: f32 =
        grads.iter().map(|g| g.square().unwrap().sum(None).unwrap().item_cast::<f32>()).sum();
    assert!(norm2 > 1e-8, "the gradient vanished: {norm2}");
    let eps = 1e-2 / norm2.sqrt();
    let step = |sign: f32| -> Vec<Array> {
        params
            .iter()
            .zip(&grads)
            .map(|(p, g)| p.add(g.multiply(Array::from_f32(sign * eps)).unwrap()).unwrap())
            .collect()
    };
    let numeric = (loss_at(&step(1.0)) - loss_at(&step(-1.0))) / (2.0 * eps);
    let rel = (numeric - norm2).abs() / norm2;
    assert!(rel < 0.02, "autodiff {norm2} vs finite differences {numeric} (rel {rel})");
    // And one single coordinate, in a B factor.
    let k = 5;
    let flat = grads[1].flatten(None, None).unwrap();
    let g_k = flat.index(k).item_cast::<f32>();
    let bump = |d: f32| -> Vec<Array> {
        let mut p = params.clone();
        let shape = p[1].shape().to_vec();
        let mut v: Vec<f32> = p[1].flatten(None, None).unwrap().as_slice::<f32>().to_vec();
        v[k as usize] += d;
        p[1] = Array::from_slice(&v, &shape);
        p
    };
    let h = 1e-2;
    let numeric_k = (loss_at(&bump(h)) - loss_at(&bump(-h))) / (2.0 * h);
    assert!(
        (numeric_k - g_k).abs() < 2e-3 + 0.02 * g_k.abs(),
        "∂L/∂B[{k}]: autodiff {g_k} vs finite differences {numeric_k}"
    );
}

use mlx_rs::ops::indexing::IndexOp;

#[test]
fn chat_examples_train_only_on_the_assistant_turns() {
    let model = load_fixture("qwen3");
    let tok = &model.tokenizer;
    let msg = |role: &str, content: &str| ChatMessage::new(role, content);
    let example = Example {
        messages: vec![
            msg("system", "Be brief."),
            msg("user", "Name a bird."),
            msg("assistant", "A wren."),
            msg("user", "Another?"),
            msg("assistant", "A robin."),
        ],
    };
    let s = samples(tok, &TrainData::Examples(vec![example.clone()]), 512, &Default::default())
        .unwrap();
    assert_eq!(s.len(), 1);
    let trained: Vec<u32> =
        s[0].tokens.iter().zip(&s[0].loss).filter(|(_, l)| **l).map(|(t, _)| *t).collect();
    let text = tok.decode(&trained).unwrap();
    assert!(text.contains("A wren.") && text.contains("A robin."), "{text:?}");
    assert!(
        !text.contains("bird") && !text.contains("Another") && !text.contains("brief"),
        "user/system text carries loss: {text:?}"
    );
    // The whole conversation is there, as the template renders it.
    let all = tok.decode(&s[0].tokens).unwrap();
    assert!(all.contains("Name a bird.") && all.contains("Be brief."), "{all:?}");
    // No assistant turn: refused with the reason.
    let none = Example { messages: vec![msg("user", "hi")] };
    let err = samples(tok, &TrainData::Examples(vec![example, none]), 512, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("examples[1]") && err.contains("assistant"), "{err}");
}

// ---- over HTTP ----

/// `model` from `models` served with background work on (training runs beside it).
async fn start(models: &std::path::Path, model: &str) -> Server {
    serve(engine_config(models, model), ServeConfig::default()).await
}

async fn wait_for_end(s: &Server, within: Duration) -> Value {
    let t = Instant::now();
    loop {
        let (_, st) = call(s, Method::GET, "/train", None).await;
        if !["starting", "running", "paused"].contains(&st["state"].as_str().unwrap_or("")) {
            return st;
        }
        assert!(t.elapsed() < within, "the run did not end: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn complete(s: &Server, model: &str, prompt: &str, n: usize) -> (u16, Value) {
    call(
        s,
        Method::POST,
        "/v1/completions",
        Some(json!({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_lowers_held_out_loss_and_its_adapter_serves() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3-mtp", &models.path().join("qwen3-mtp"));
    let s = start(models.path(), "qwen3-mtp").await;
    let prompt = "baga dase fagi gaso kagu";
    let (_, base_before) = complete(&s, "qwen3-mtp", prompt, 12).await;

    let body = json!({"adapter": "cycle", "text": pattern_text(1200), "seq_len": 48, "epochs": 3, "batch_size": 4,
                      "learning_rate": 0.003, "rank": 4, "targets": ["q_proj", "v_proj", "o_proj", "down_proj"], "share_ppm": 1000000});
    let (code, started) = call(&s, Method::POST, "/train", Some(body.clone())).await;
    assert_eq!(code, 201, "{started}");
    assert_eq!(started["adapter_model"], "qwen3-mtp+cycle");
    // One run at a time.
    let (code, busy) = call(&s, Method::POST, "/train", Some(body)).await;
    assert_eq!(code, 409, "{busy}");
    assert_eq!(busy["error"]["code"], "training_running");

    let st = wait_for_end(&s, Duration::from_secs(120)).await;
    assert_eq!(st["state"], "completed", "{st}");
    assert_eq!(st["adapter_saved"], true);
    let epochs = st["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 4, "baseline + 3 epochs: {st}");
    let eval = |i: usize| epochs[i]["eval_loss"].as_f64().unwrap();
    assert!(
        eval(3) < 0.5 * eval(0),
        "held-out loss should fall well below the untrained model's: {epochs:?}"
    );
    assert!(st["steps"].as_u64().unwrap() > 0 && st["train_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(!st["loss_curve"].as_array().unwrap().is_empty());
    assert!(models.path().join(".adapters/qwen3-mtp/cycle/adapters.safetensors").is_file());
    assert!(models.path().join(".adapters/qwen3-mtp/cycle/adapter_config.json").is_file());

    // Served as `model+adapter`, listed, and continuing the trained cycle.
    let (_, list) = call(&s, Method::GET, "/v1/models", None).await;
    assert!(
        list["data"].as_array().unwrap().iter().any(|m| m["id"] == "qwen3-mtp+cycle"),
        "{list}"
    );
    let (code, tuned) = complete(&s, "qwen3-mtp+cycle", prompt, 12).await;
    assert_eq!(code, 200, "{tuned}");
    assert_eq!(tuned["model"], "qwen3-mtp+cycle");
    let text = tuned["choices"][0]["text"].as_str().unwrap().trim().to_string();
    let want = pattern_text(16)[prompt.len() + 1..].to_string();
    let agree = text.split(' ').zip(want.split(' ')).take_while(|(a, b)| a == b).count();
    assert!(
        agree >= 6,
        "the adapted model should continue the cycle: got {text:?}, cycle {want:?}"
    );
    // The base model is untouched by the adapter.
    let (_, base_after) = complete(&s, "qwen3-mtp", prompt, 12).await;
    assert_eq!(base_after["choices"][0]["text"], base_before["choices"][0]["text"]);
    assert_ne!(base_after["choices"][0]["text"], tuned["choices"][0]["text"]);
    // The same name is not overwritten; an unknown adapter is a 404.
    let (code, e) = call(
        &s,
        Method::POST,
        "/train",
        Some(json!({"adapter": "cycle", "text": pattern_text(100)})),
    )
    .await;
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("adapter")), "{e}");
    let (code, _) = complete(&s, "qwen3-mtp+nope", prompt, 4).await;
    assert_eq!(code, 404);
    // Adapters do not stack: a 400 naming the field.
    let (code, e) = complete(&s, "qwen3-mtp+cycle+cycle", prompt, 4).await;
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("model")), "{e}");
    let (_, health) = call(&s, Method::GET, "/health", None).await;
    assert_eq!(health["leases"]["total"], 0, "{health}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_training_requests_name_their_field() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3-mtp", &models.path().join("qwen3-mtp"));
    let s = start(models.path(), "qwen3-mtp").await;
    let cases = [
        (json!({"text": "baga dase", "rank": -1}), "rank"),
        (
            json!({"text": "baga dase", "share_ppm": 500000, "max_slowdown_ppm": 100000}),
            "max_slowdown_ppm",
        ),
        (json!({"text": ""}), "text"),
        (json!({"examples": []}), "examples"),
        (json!({}), "text"),
        (json!({"text": "baga dase", "targets": ["qkv"]}), "targets"),
        (json!({"text": "baga dase", "model": "no-such-model"}), "model"),
        (json!({"text": "baga dase"}), "text"),
        (json!({"text": "baga dase", "epochs": 0}), "epochs"),
        (json!({"examples": [{"messages": [{"role": "user", "content": "hi"}]}]}), "examples"),
    ];
    for (body, param) in cases {
        let (code, e) = call(&s, Method::POST, "/train", Some(body.clone())).await;
        assert_eq!(code, 400, "{body} → {e}");
        assert_eq!(e["error"]["param"], param, "{body} → {e}");
        assert!(!e["error"]["message"].as_str().unwrap().is_empty());
    }
    let (code, e) = call(&s, Method::POST, "/train/cancel", None).await;
    assert_eq!((code, e["error"]["code"].as_str()), (409, Some("no_training_run")));
    let (code, st) = call(&s, Method::GET, "/train", None).await;
    assert_eq!((code, st["state"].as_str()), (200, Some("idle")));
    // Nothing was written for the refused runs.
    assert!(!models.path().join(".adapters").exists());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_turns_during_a_run_get_a_receipt_and_control_works() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3-mtp", &models.path().join("qwen3-mtp"));
    let s = start(models.path(), "qwen3-mtp").await;
    let body = json!({"adapter": "long", "text": pattern_text(20000), "seq_len": 256, "epochs": 50, "batch_size": 4,
                      "window_batches": 2, "max_slowdown_ppm": 300000});
    let (code, st) = call(&s, Method::POST, "/train", Some(body)).await;
    assert_eq!(code, 201, "{st}");
    // Turns of 32 tokens at irregular times while windows come and go.
    let mut finished = 0;
    for i in 0..24 {
        let (code, r) = complete(&s, "qwen3-mtp", "baga dase", 32).await;
        assert_eq!(code, 200, "{r}");
        finished += 1;
        tokio::time::sleep(Duration::from_millis(20 + (i * 37 % 90) as u64)).await;
    }
    let (_, st) = call(&s, Method::GET, "/train", None).await;
    let clean = st["turns_clean"].as_u64().unwrap();
    let overlapped = st["turns_overlapped"].as_u64().unwrap();
    assert_eq!(clean + overlapped, finished, "every turn of 16+ steps is in the receipt: {st}");
    assert!(st["windows"].as_u64().unwrap() > 0, "{st}");
    assert!(st["decode_tps_clean"].as_f64().is_some(), "{st}");
    assert!(st["window_s_max"].as_f64().unwrap() >= st["window_s_p50"].as_f64().unwrap());
    for key in [
        "turn_tps_clean",
        "turn_slowdown_ppm_p50",
        "turn_slowdown_ppm_p95",
        "turn_slowdown_ppm_max",
        "turns_unmeasured",
        "yielded_s",
        "realised_slowdown_ppm",
    ] {
        assert!(st.get(key).is_some(), "status lacks {key}: {st}");
    }
    // The bound: windows' share of the time, discounted by what decoding kept doing during
    // them, stays at the 30 % asked for (yields are sized so that it is exactly the bound).
    let realised = st["realised_slowdown_ppm"].as_u64().unwrap();
    assert!(realised > 0 && realised <= 345_000, "{st}");

    // Pause: no window starts while paused; resume: they do again.
    let (code, p) = call(&s, Method::POST, "/train/pause", None).await;
    assert_eq!((code, p["state"].as_str()), (200, Some("paused")));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, a) = call(&s, Method::GET, "/train", None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, b) = call(&s, Method::GET, "/train", None).await;
    assert_eq!(a["windows"], b["windows"], "a window ran while paused");
    assert_eq!(b["in_window"], false);
    let (code, r) = call(&s, Method::POST, "/train/resume", None).await;
    assert_eq!((code, r["state"].as_str()), (200, Some("running")));
    let t = Instant::now();
    loop {
        let (_, c) = call(&s, Method::GET, "/train", None).await;
        if c["windows"].as_u64() > b["windows"].as_u64() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no window after resume: {c}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Cancel: the run ends, keeps what it learned, and holds no lease.
    let (code, _) = call(&s, Method::POST, "/train/cancel", None).await;
    assert_eq!(code, 200);
    let st = wait_for_end(&s, Duration::from_secs(30)).await;
    assert_eq!(st["state"], "cancelled", "{st}");
    assert_eq!(st["adapter_saved"], true, "{st}");
    let (_, health) = call(&s, Method::GET, "/health", None).await;
    assert_eq!(health["leases"]["total"], 0, "{health}");
    // After the run, turns are no longer overlapped.
    let before = st["turns_overlapped"].as_u64().unwrap();
    complete(&s, "qwen3-mtp", "baga dase", 32).await;
    let (_, after) = call(&s, Method::GET, "/train", None).await;
    assert_eq!(after["turns_overlapped"].as_u64().unwrap(), before, "{after}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloading_the_model_stops_its_run() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3-mtp", &models.path().join("qwen3-mtp"));
    install_fixture("qwen3", &models.path().join("qwen3"));
    let s = start(models.path(), "qwen3-mtp").await;
    let body = json!({"adapter": "x", "text": pattern_text(20000), "seq_len": 256, "epochs": 50, "share_ppm": 500000});
    let (code, _) = call(&s, Method::POST, "/train", Some(body)).await;
    assert_eq!(code, 201);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Asking for another model evicts this one (one resident model): the run stops first.
    let (code, r) = complete(&s, "qwen3", "Hello", 4).await;
    assert_eq!(code, 200, "{r}");
    let st = wait_for_end(&s, Duration::from_secs(30)).await;
    assert_eq!(st["state"], "cancelled", "{st}");
    let (_, health) = call(&s, Method::GET, "/health", None).await;
    assert_eq!(health["leases"]["total"], 0, "{health}");
    assert_eq!(health["model"]["id"], "qwen3", "{health}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_starts_are_refused_before_any_tokenizing_and_chats_are_capped() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3-mtp", &models.path().join("qwen3-mtp"));
    let s = start(models.path(), "qwen3-mtp").await;
    // A chat longer than the cap is refused by name.
    let long: Vec<Value> = (0..257)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"}))
        .collect();
    let (code, e) =
        call(&s, Method::POST, "/train", Some(json!({"examples": [{"messages": long}]}))).await;
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("examples")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("256"), "{e}");
    // Four starts at once, each with data that takes a while to tokenize: one runs, the others
    // are told at once (before the winner has even finished tokenizing).
    let chat: Vec<Value> = (0..12)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": pattern_text(30)})
        })
        .collect();
    let examples: Vec<Value> = (0..1500).map(|_| json!({"messages": chat})).collect();
    let t0 = Instant::now();
    let posts: Vec<_> = (0..4)
        .map(|i| {
            let url = s.url();
            let body = json!({"adapter": format!("race-{i}"), "examples": examples, "epochs": 1});
            tokio::spawn(async move {
                let r = post(&url, "/train", body).await;
                (r.0, r.1, t0.elapsed())
            })
        })
        .collect();
    let mut results = vec![];
    for p in posts {
        results.push(p.await.unwrap());
    }
    let won: Vec<_> = results.iter().filter(|r| r.0 == 201).collect();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 409).collect();
    assert_eq!((won.len(), refused.len()), (1, 3), "{results:?}");
    for r in &refused {
        assert_eq!(r.1["error"]["code"], "training_running", "{r:?}");
        assert!(
            r.2 < won[0].2,
            "a refusal ({:?}) came after the winner's start ({:?})",
            r.2,
            won[0].2
        );
    }
    println!(
        "winner started after {:?}; refusals after {:?}",
        won[0].2,
        refused.iter().map(|r| r.2).collect::<Vec<_>>()
    );
    call(&s, Method::POST, "/train/cancel", None).await;
    wait_for_end(&s, Duration::from_secs(30)).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_dies_mid_work_is_closed_by_the_run_end() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3-mtp", &models.path().join("qwen3-mtp"));
    let s = start(models.path(), "qwen3-mtp").await;
    // The window panics after it has stamped its start: nothing in the window closes it.
    s.app_host.app().unwrap().training.panic_next_window();
    let body = json!({"adapter": "dies", "text": pattern_text(4000), "seq_len": 64, "epochs": 5});
    let (code, st) = call(&s, Method::POST, "/train", Some(body)).await;
    assert_eq!(code, 201, "{st}");
    let st = wait_for_end(&s, Duration::from_secs(30)).await;
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(st["in_window"], false, "a dead window still reads as running: {st}");
    let (_, health) = call(&s, Method::GET, "/health", None).await;
    assert_eq!(health["leases"]["total"], 0, "{health}");
    // Later turns are clean, not overlapped by a window that will never end.
    let before = st["turns_overlapped"].as_u64().unwrap();
    let (code, r) = complete(&s, "qwen3-mtp", "baga dase", 32).await;
    assert_eq!(code, 200, "{r}");
    let (_, after) = call(&s, Method::GET, "/train", None).await;
    assert_eq!(after["turns_overlapped"].as_u64().unwrap(), before, "{after}");
    assert!(
        after["turns_clean"].as_u64().unwrap() > st["turns_clean"].as_u64().unwrap(),
        "{after}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_on_the_mlx_thread_ends_the_run() {
    let models = tempfile::tempdir().unwrap();
    install_fixture("qwen3", &models.path().join("qwen3"));
    let s = start(models.path(), "qwen3").await;
    // The model is resident (its lease needs no MLX job); the trainer's setup then cannot be
    // handed to the MLX thread.
    s.app_host.app().unwrap().engine.mlx.close();
    let body = json!({"adapter": "never", "text": pattern_text(400), "seq_len": 64});
    let (code, st) = call(&s, Method::POST, "/train", Some(body.clone())).await;
    assert_eq!(code, 500, "{st}");
    let (_, run) = call(&s, Method::GET, "/train", None).await;
    assert_eq!(run["state"], "failed", "the run stayed installed: {run}");
    assert!(run["error"].as_str().unwrap_or("").contains("MLX thread"), "{run}");
    // The next start is not refused as busy by a run that never began.
    let (code, st) = call(&s, Method::POST, "/train", Some(body)).await;
    assert_ne!(code, 409, "a failed start left the run `starting`: {st}");
    let (_, health) = call(&s, Method::GET, "/health", None).await;
    assert_eq!(health["leases"]["total"], 0, "{health}");
}
