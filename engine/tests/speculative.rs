//! Speculative decoding (MTP and prompt-lookup drafts) against plain decoding on real models:
//! greedy output token for token, sampled output in distribution, and stop strings, EOS,
//! max_tokens and cancellation ending at the same token.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use perch_engine::decode::{DraftMode, DraftSetting, DraftStats};
use perch_engine::{
    generate, FinishReason, GenerateParams, Generation, LoadedModel, SamplingParams,
};

fn run(
    model: &LoadedModel,
    prompt: &[u32],
    n: usize,
    sampling: SamplingParams,
    draft: DraftMode,
) -> Generation {
    let p =
        GenerateParams { max_tokens: n, sampling, ignore_eos: true, draft, ..Default::default() };
    generate(model, prompt, &p, None, |_| {}).unwrap()
}

/// Lookup that drafts from single-token matches too, so the random fixtures get drafts.
fn eager_lookup() -> DraftMode {
    DraftMode::Lookup { min_ngram: 1, max_ngram: 3, max_draft: 6 }
}

/// Tokens identical to plain greedy decoding, or a divergence at a numerical near-tie: there,
/// plain decoding's top two logits (recomputed with a full forward pass) must be within 1e-3
/// relative. Returns the near-tie positions found.
fn assert_same_greedy(
    model: &LoadedModel,
    prompt: &[u32],
    plain: &[u32],
    drafted: &[u32],
    what: &str,
) -> Vec<usize> {
    let Some(at) = plain.iter().zip(drafted).position(|(a, b)| a != b) else {
        assert_eq!(plain.len(), drafted.len(), "{what}: lengths differ");
        return vec![];
    };
    let ids: Vec<u32> = prompt.iter().chain(&plain[..at]).copied().collect();
    let logits = forward_logits(model, &ids);
    let row = &logits[(ids.len() - 1) * model.vocab_size..];
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let gap = (sorted[0] - sorted[1]) / sorted[0].abs().max(1e-6);
    println!("{what}: diverges at token {at}; top-two logit gap {gap:.2e} relative");
    assert!(gap <= 1e-3, "{what}: token {at} differs from plain greedy ({} vs {}) without a near-tie (gap {gap:.2e})", drafted[at], plain[at]);
    vec![at]
}

fn drafted_and_accepted(s: &DraftStats) -> (usize, usize) {
    (s.drafted_by_depth.iter().sum(), s.accepted_by_depth.iter().sum())
}

#[test]
fn greedy_with_drafts_is_plain_greedy_on_every_fixture() {
    let mut near_ties = 0;
    let mut accepted_anywhere = 0;
    for name in FIXTURES {
        let model = load_fixture(name);
        let g = golden(name);
        // The prompt repeats its own start, so prompt lookup has something to draft from.
        let prompt: Vec<u32> =
            g.prompt_ids.iter().chain(&g.prompt_ids[..g.prompt_ids.len() / 2]).copied().collect();
        let plain = run(&model, &prompt, 48, SamplingParams::greedy(), DraftMode::None);
        let mut modes = vec![eager_lookup(), DraftMode::lookup()];
        if model.mtp.is_some() {
            modes.extend((1..=3).map(|depth| DraftMode::Mtp { depth }));
        }
        for mode in modes {
            let spec = run(&model, &prompt, 48, SamplingParams::greedy(), mode.clone());
            let stats = spec.draft.clone().expect("speculative decoding reports statistics");
            let (drafted, accepted) = drafted_and_accepted(&stats);
            println!(
                "{name} {mode:?}: {drafted} drafted, {accepted} accepted, {} verify calls",
                stats.verify_calls
            );
            assert_eq!(
                stats.verify_calls + accepted,
                spec.tokens.len(),
                "{name}: every token is a verified draft or a verify call's own"
            );
            near_ties += assert_same_greedy(
                &model,
                &prompt,
                &plain.tokens,
                &spec.tokens,
                &format!("{name} {mode:?}"),
            )
            .len();
            accepted_anywhere += accepted;
            if mode == eager_lookup() {
                assert!(
                    drafted > 0,
                    "{name}: prompt lookup never drafted on a self-repeating prompt"
                );
            }
        }
    }
    println!("{near_ties} near-tie divergences");
    assert!(accepted_anywhere > 0, "no draft was ever accepted: nothing was verified");
}

#[test]
fn greedy_with_prompt_lookup_is_plain_greedy_on_the_default_model() {
    let Some(gguf) = gemma_gguf() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let model = import_gemma(&gguf, tmp.path(), perch_engine::gguf::import::StoreDtype::F32);
    let code_edit = include_str!("../src/bench/code_edit.txt");
    // Rejections (a story) and long accepted runs (code copied with a change) past the
    // 512-token sliding window, so the ring buffers roll back drafts after wrapping.
    let long =
        format!("{}\n\nOnce upon a time, in a small village by the sea,", code_edit.repeat(4));
    for text in ["Once upon a time", code_edit, &long] {
        let prompt = model.tokenizer.encode(text, true).unwrap();
        let plain = run(&model, &prompt, 64, SamplingParams::greedy(), DraftMode::None);
        let spec = run(&model, &prompt, 64, SamplingParams::greedy(), DraftMode::lookup());
        let s = spec.draft.clone().unwrap();
        println!(
            "{} prompt tokens: acceptance {:.3}, {} verify calls for {} tokens",
            prompt.len(),
            s.acceptance_rate,
            s.verify_calls,
            spec.tokens.len()
        );
        assert!(s.drafted_by_depth.first().is_some_and(|&d| d > 0), "no drafts on {text:?}");
        if text == long {
            assert!(
                prompt.len() > 600 && s.acceptance_rate < 1.0,
                "the long prompt must roll back drafts past the window"
            );
        }
        assert_same_greedy(
            &model,
            &prompt,
            &plain.tokens,
            &spec.tokens,
            &format!("gemma {} tokens", prompt.len()),
        );
    }
}

#[test]
fn the_mtp_head_matches_its_reference_logits() {
    // The trained Qwen 3 head (reference: its training script) and the hybrid's native head
    // (gated-attention block; reference: make-hybrid-fixture.py, from the published wiring).
    for name in [MTP_FIXTURE, HYBRID_FIXTURE] {
        let model = load_fixture(name);
        let g = golden(name);
        let dir = fixture_dir(name);
        let want = Array::load_safetensors(dir.join("golden.safetensors")).unwrap()["mtp_logits"]
            .as_slice::<f32>()
            .to_vec();
        let ids = &g.prompt_ids;
        let l = ids.len() as i32;
        let mut caches = model.net.new_caches();
        let hidden = model.net.hidden(&Array::from_slice(ids, &[1, l]), &mut caches).unwrap();
        let mut cache = perch_engine::model::kv_cache::KvCache::new();
        let head = model.mtp.as_ref().unwrap_or_else(|| panic!("{name} has no MTP head"));
        let m = head
            .forward(
                model.net.as_ref(),
                &hidden.index((.., ..l - 1, ..)),
                &Array::from_slice(&ids[1..], &[1, l - 1]),
                &mut cache,
            )
            .unwrap();
        let got = model.net.logits(&m).unwrap();
        got.eval().unwrap();
        let err = relative_error(got.as_slice::<f32>(), &want);
        println!("{name}: MTP logits, relative error vs the reference {err:.2e}");
        assert!(err < 1e-4, "{name}: MTP logits differ from the reference by {err:.2e}");
    }
}

#[test]
fn the_trained_mtp_head_drafts_what_the_model_then_says() {
    let model = load_fixture(MTP_FIXTURE);
    let prompt = golden(MTP_FIXTURE).prompt_ids;
    for depth in 1..=3 {
        let g = run(&model, &prompt, 96, SamplingParams::greedy(), DraftMode::Mtp { depth });
        let s = g.draft.unwrap();
        println!(
            "depth {depth}: acceptance {:.3} by depth {:?} / {:?}, {} bonus",
            s.acceptance_rate, s.accepted_by_depth, s.drafted_by_depth, s.bonus_tokens
        );
        assert_eq!(s.mtp_depth, depth);
        assert_eq!(s.drafted_by_depth.len(), depth);
        assert!(
            s.accepted_by_depth[0] as f64 >= 0.8 * s.drafted_by_depth[0] as f64,
            "depth-1 acceptance {s:?}"
        );
    }
}

#[test]
fn penalties_apply_per_drafted_position() {
    // Penalties depend on the tokens before each position, drafts included.
    let model = load_fixture(MTP_FIXTURE);
    let prompt = golden(MTP_FIXTURE).prompt_ids;
    for sampling in [
        SamplingParams { presence_penalty: 2.0, frequency_penalty: 2.0, ..Default::default() },
        SamplingParams { repetition_penalty: 3.0, ..Default::default() },
    ] {
        let plain = run(&model, &prompt, 40, sampling.clone(), DraftMode::None);
        assert_ne!(
            plain.tokens,
            run(&model, &prompt, 40, SamplingParams::greedy(), DraftMode::None).tokens,
            "penalty changed nothing"
        );
        for mode in [DraftMode::Mtp { depth: 3 }, eager_lookup()] {
            let spec = run(&model, &prompt, 40, sampling.clone(), mode.clone());
            assert_same_greedy(
                &model,
                &prompt,
                &plain.tokens,
                &spec.tokens,
                &format!("{sampling:?} {mode:?}"),
            );
        }
    }
}

/// Two-sample chi-square (equal sample sizes): sum (a - b)^2 / (a + b) over bins with
/// a + b >= 10, the rest pooled. Returns (statistic, degrees of freedom).
fn two_sample_chi_square(
    a: &std::collections::BTreeMap<Vec<u32>, f64>,
    b: &std::collections::BTreeMap<Vec<u32>, f64>,
) -> (f64, usize) {
    let keys: std::collections::BTreeSet<_> = a.keys().chain(b.keys()).collect();
    let (mut stat, mut bins, mut pa, mut pb) = (0.0, 0usize, 0.0, 0.0);
    for k in keys {
        let (x, y) = (a.get(k).copied().unwrap_or(0.0), b.get(k).copied().unwrap_or(0.0));
        if x + y < 10.0 {
            pa += x;
            pb += y;
        } else {
            stat += (x - y).powi(2) / (x + y);
            bins += 1;
        }
    }
    if pa + pb > 0.0 {
        stat += (pa - pb).powi(2) / (pa + pb);
        bins += 1;
    }
    (stat, bins.saturating_sub(1))
}

/// Upper 0.1 % point of chi-square (Wilson-Hilferty).
fn critical(df: usize) -> f64 {
    let d = df as f64;
    d * (1.0 - 2.0 / (9.0 * d) + 3.090 * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

#[test]
fn sampling_with_drafts_follows_the_plain_distribution() {
    // The MTP fixture's vocabulary has 64 tokens and its next-token distributions are not
    // one-hot (0.85 / 3 x 0.05 in its training language), so a few thousand runs see the
    // rare branches too. Fixed seeds: the test is deterministic.
    let model = load_fixture(MTP_FIXTURE);
    // Its first half again at the end, so prompt lookup drafts from the first round on.
    let ids = golden(MTP_FIXTURE).prompt_ids;
    let prompt: Vec<u32> = ids[..12].iter().chain(&ids[..6]).copied().collect();
    let n = 1500;
    let sampling = |seed: u64| SamplingParams {
        temperature: 1.0,
        top_k: 8,
        seed: Some(seed),
        ..Default::default()
    };
    let histogram = |mode: DraftMode, seed0: u64| {
        let mut by_pos = vec![std::collections::BTreeMap::<Vec<u32>, f64>::new(); 5];
        let (mut drafted, mut accepted) = (0, 0);
        for i in 0..n {
            let g = run(&model, &prompt, 5, sampling(seed0 + i), mode.clone());
            if let Some(s) = &g.draft {
                let (d, a) = drafted_and_accepted(s);
                drafted += d;
                accepted += a;
            }
            let t = g.tokens;
            for (pos, h) in by_pos.iter_mut().enumerate() {
                // Tokens 2..5 alone (token 1 never involves a draft), and the first three jointly.
                let key = if pos < 4 { vec![t[pos + 1]] } else { t[..3].to_vec() };
                *h.entry(key).or_default() += 1.0;
            }
        }
        if mode != DraftMode::None {
            println!("{mode:?}: {drafted} drafted, {accepted} accepted");
            assert!(
                accepted > n as usize && accepted < drafted,
                "{mode:?}: the test needs both accepted and rejected drafts"
            );
        }
        by_pos
    };
    let plain = histogram(DraftMode::None, 0);
    for mode in [DraftMode::Mtp { depth: 1 }, DraftMode::Mtp { depth: 3 }, eager_lookup()] {
        let spec = histogram(mode.clone(), 1_000_000);
        for (what, (a, b)) in ["token 2", "token 3", "token 4", "token 5", "tokens 1-3"]
            .iter()
            .zip(plain.iter().zip(&spec))
        {
            let (stat, df) = two_sample_chi_square(a, b);
            println!(
                "{mode:?} {what}: chi-square {stat:.1} (df {df}, 0.1% critical {:.1})",
                critical(df)
            );
            assert!(df >= 2, "{what}: too few populated outcomes to test");
            assert!(stat < critical(df), "{mode:?} {what}: distribution differs from plain sampling (chi-square {stat:.1}, df {df})");
        }
    }
}

/// Tokens and finish reason of plain and speculative decoding under the same limits.
fn same_ending(
    model: &LoadedModel,
    prompt: &[u32],
    params: GenerateParams,
    cancel_after: Option<usize>,
) {
    let go = |draft: DraftMode| {
        let cancel = AtomicBool::new(false);
        let mut pieces = 0;
        let p = GenerateParams { draft, ..params.clone() };
        let mut text = String::new();
        let g = generate(model, prompt, &p, Some(&cancel), |t| {
            text.push_str(t);
            pieces += 1;
            if cancel_after.is_some_and(|n| pieces >= n) {
                cancel.store(true, Ordering::Relaxed);
            }
        })
        .unwrap();
        assert_eq!(g.text, text, "streamed text and returned text differ");
        (g.tokens, g.text, g.finish_reason)
    };
    let plain = go(DraftMode::None);
    for mode in [DraftMode::Mtp { depth: 3 }, DraftMode::Mtp { depth: 1 }, eager_lookup()] {
        assert_eq!(go(mode.clone()), plain, "{mode:?} with {params:?}");
    }
}

#[test]
fn stops_eos_limits_and_cancellation_end_where_plain_decoding_ends() {
    let model = load_fixture(MTP_FIXTURE);
    let prompt = golden(MTP_FIXTURE).prompt_ids;
    let greedy = GenerateParams { max_tokens: 40, ignore_eos: true, ..Default::default() };
    let full = run(&model, &prompt, 40, SamplingParams::greedy(), DraftMode::None);
    // A stop string in the middle of the output (inside some accepted draft, given the
    // acceptance rate), and one that straddles two words.
    let words: Vec<&str> = full.text.split(' ').collect();
    let mid = format!("{} {}", words[9], words[10]);
    let straddle = format!("{} {}", &words[14][2..], &words[15][..2]);
    for stop in [mid, straddle] {
        same_ending(
            &model,
            &prompt,
            GenerateParams { stop: vec![stop.clone()], ..greedy.clone() },
            None,
        );
        let g = generate(
            &model,
            &prompt,
            &GenerateParams {
                stop: vec![stop.clone()],
                draft: DraftMode::Mtp { depth: 3 },
                ..greedy.clone()
            },
            None,
            |_| {},
        )
        .unwrap();
        assert_eq!(g.finish_reason, FinishReason::Stop);
        assert!(
            !g.text.contains(&stop) && full.text.starts_with(&g.text),
            "{stop:?} -> {:?}",
            g.text
        );
    }
    for max_tokens in [1, 2, 7, 13] {
        same_ending(&model, &prompt, GenerateParams { max_tokens, ..greedy.clone() }, None);
    }
    for after in [1, 5, 11] {
        same_ending(&model, &prompt, greedy.clone(), Some(after));
    }
    // EOS: a copy of the fixture whose EOS is a token the model says at step 6.
    let (_tmp, dir) = copy_fixture(MTP_FIXTURE, "eos");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let eos = full.tokens[6];
    cfg["eos_token_id"] = eos.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let model = perch_engine::load_model(&dir).unwrap();
    let first = full.tokens.iter().position(|&t| t == eos).unwrap();
    same_ending(&model, &prompt, GenerateParams { ignore_eos: false, ..greedy.clone() }, None);
    let g = generate(
        &model,
        &prompt,
        &GenerateParams { ignore_eos: false, draft: DraftMode::Mtp { depth: 3 }, ..greedy },
        None,
        |_| {},
    )
    .unwrap();
    assert_eq!((g.tokens.len(), g.finish_reason), (first, FinishReason::Stop));
}

#[test]
fn bad_draft_settings_are_clear_errors() {
    let plain = load_fixture("qwen3");
    let mtp = load_fixture(MTP_FIXTURE);
    let prompt = golden("qwen3").prompt_ids;
    let err = |m: &LoadedModel, draft: DraftMode| {
        let p = GenerateParams { max_tokens: 4, draft, ..Default::default() };
        generate(m, &prompt, &p, None, |_| {}).unwrap_err().to_string()
    };
    assert!(err(&plain, DraftMode::Mtp { depth: 1 }).contains("no MTP head"));
    assert!(err(&mtp, DraftMode::Mtp { depth: 4 }).contains("depth must be 1 to 3"));
    assert!(err(&mtp, DraftMode::Lookup { min_ngram: 3, max_ngram: 2, max_draft: 4 })
        .contains("min_ngram"));
    assert!(err(&mtp, DraftMode::Lookup { min_ngram: 1, max_ngram: 2, max_draft: 99 })
        .contains("max_draft"));
    let setting = |s: &str| s.parse::<DraftSetting>();
    assert_eq!(setting("mtp:2").unwrap().mode(&mtp), DraftMode::Mtp { depth: 2 });
    assert_eq!(setting("auto").unwrap().mode(&plain), DraftMode::lookup());
    assert_eq!(setting("auto").unwrap().mode(&mtp), DraftMode::Mtp { depth: 1 });
    assert!(setting("fast").is_err());
}
