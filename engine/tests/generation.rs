//! Behaviour of the generation loop on a real (tiny) model: sampling settings, seeds, stop
//! strings, EOS, cancellation and streamed text.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::batch::{run_batch, Job};
use common::*;
use perch_engine::decode::DraftMode;
use perch_engine::{generate, FinishReason, GenerateParams, SamplingParams};

fn params(max_tokens: usize, sampling: SamplingParams) -> GenerateParams {
    GenerateParams { max_tokens, sampling, ignore_eos: true, ..Default::default() }
}

/// The fixtures' logits are sharply peaked, so sampling needs a high temperature to differ
/// from greedy.
fn hot(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 5.0, seed: Some(seed), ..Default::default() }
}

#[test]
fn same_seed_same_text_and_different_seeds_differ() {
    let model = load_fixture("qwen2");
    let prompt = golden("qwen2").prompt_ids;
    let run =
        |s: SamplingParams| generate(&model, &prompt, &params(24, s), None, |_| {}).unwrap().tokens;
    let a = run(hot(7));
    assert_eq!(a, run(hot(7)), "same seed must give the same tokens");
    let others: Vec<_> = (8..11).map(|s| run(hot(s))).collect();
    assert!(others.iter().any(|o| *o != a), "three other seeds all reproduced seed 7's output");
    // Sampling at a high temperature is not greedy.
    assert_ne!(a, golden("qwen2").greedy_tokens[..24].to_vec());
}

#[test]
fn filters_that_leave_one_token_are_greedy() {
    let model = load_fixture("llama");
    let g = golden("llama");
    let greedy = g.greedy_tokens[..16].to_vec();
    let run = |s: SamplingParams| {
        generate(&model, &g.prompt_ids, &params(16, s), None, |_| {}).unwrap().tokens
    };
    assert_eq!(run(SamplingParams { top_k: 1, ..hot(1) }), greedy, "top_k=1");
    assert_eq!(run(SamplingParams { top_p: 1e-6, ..hot(2) }), greedy, "tiny top_p");
    assert_eq!(run(SamplingParams { min_p: 0.999_999, ..hot(3) }), greedy, "min_p near 1");
    // And a loose filter really samples.
    assert_ne!(run(SamplingParams { top_k: 50, ..hot(4) }), greedy, "top_k=50 at T=5");
}

#[test]
fn repetition_penalty_changes_a_real_model_output() {
    // Exact penalty arithmetic is unit-tested in sampler.rs; here, end to end through a model.
    let model = load_fixture("qwen3");
    let g = golden("qwen3");
    let run = |s: SamplingParams| {
        generate(&model, &g.prompt_ids, &params(32, s), None, |_| {}).unwrap().tokens
    };
    assert_eq!(run(SamplingParams::greedy()), g.greedy_tokens);
    let distinct = |t: &[u32]| t.iter().collect::<std::collections::BTreeSet<_>>().len();
    let out = run(SamplingParams { repetition_penalty: 1e6, ..Default::default() });
    assert_eq!(distinct(&out), out.len(), "repetition penalty 1e6 still repeated a token: {out:?}");
    assert!(
        out.iter().all(|t| !g.prompt_ids.contains(t)),
        "a prompt token came back despite the penalty"
    );
    let out =
        run(SamplingParams { frequency_penalty: 2.0, presence_penalty: 2.0, ..Default::default() });
    assert!(
        distinct(&out) > distinct(&g.greedy_tokens),
        "presence/frequency penalties changed nothing: {out:?}"
    );
}

#[test]
fn invalid_sampling_settings_are_rejected() {
    let model = load_fixture("qwen2");
    let prompt = golden("qwen2").prompt_ids;
    for s in [
        SamplingParams { temperature: -0.5, ..Default::default() },
        SamplingParams { top_p: 0.0, ..Default::default() },
        SamplingParams { top_p: 1.5, ..Default::default() },
        SamplingParams { min_p: 2.0, ..Default::default() },
        SamplingParams { repetition_penalty: 0.0, ..Default::default() },
    ] {
        let err = generate(&model, &prompt, &params(4, s.clone()), None, |_| {}).unwrap_err();
        assert!(err.to_string().contains("invalid request"), "{s:?}: {err}");
    }
    assert!(generate(&model, &[], &params(4, SamplingParams::greedy()), None, |_| {}).is_err());
    assert!(generate(&model, &prompt, &params(0, SamplingParams::greedy()), None, |_| {}).is_err());
    let too_long = vec![prompt[0]; model.context_length];
    let err = generate(&model, &too_long, &params(4, SamplingParams::greedy()), None, |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
}

#[test]
fn streamed_pieces_add_up_to_the_decoded_text() {
    let model = load_fixture("llama");
    let g = golden("llama");
    let mut pieces = Vec::new();
    let out = generate(&model, &g.prompt_ids, &params(32, SamplingParams::greedy()), None, |p| {
        pieces.push(p.to_string())
    })
    .unwrap();
    assert_eq!(pieces.concat(), out.text);
    assert_eq!(out.text, model.tokenizer.decode(&out.tokens).unwrap());
    assert!(pieces.len() > 4, "text came out in {} pieces, not streamed", pieces.len());
}

#[test]
fn stop_string_ends_generation_before_it() {
    let model = load_fixture("qwen3");
    let g = golden("qwen3");
    let full = generate(&model, &g.prompt_ids, &params(32, SamplingParams::greedy()), None, |_| {})
        .unwrap()
        .text;
    // A stop string that starts in the middle of the output, spanning several tokens.
    let start = full.char_indices().map(|(i, _)| i).find(|&i| i >= full.len() / 2).unwrap();
    let stop: String = full[start..].chars().take(6).collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let mut streamed = String::new();
    let p = GenerateParams {
        stop: vec!["never appears \u{1F426}".into(), stop.clone()],
        ..params(32, SamplingParams::greedy())
    };
    let out = generate(&model, &g.prompt_ids, &p, None, |s| streamed.push_str(s)).unwrap();
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.text, expected, "stop {stop:?}");
    assert_eq!(streamed, expected, "streamed text leaked part of the stop string");
}

#[test]
fn eos_from_config_ends_generation_unless_ignored() {
    // A copy of a fixture whose config names the 6th greedy token as EOS.
    let g = golden("qwen2");
    let eos = g.greedy_tokens[5];
    let first = g.greedy_tokens.iter().position(|&t| t == eos).unwrap();
    let (_tmp, dir) = copy_fixture("qwen2", "qwen2");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["eos_token_id"] = serde_json::json!([eos]);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let model = perch_engine::load_model(&dir).unwrap();

    let stop_at_eos = GenerateParams { ignore_eos: false, ..params(16, SamplingParams::greedy()) };
    let out = generate(&model, &g.prompt_ids, &stop_at_eos, None, |_| {}).unwrap();
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.tokens, g.greedy_tokens[..first].to_vec(), "EOS is not part of the output");
    let out = generate(&model, &g.prompt_ids, &params(16, SamplingParams::greedy()), None, |_| {})
        .unwrap();
    assert_eq!(out.tokens, g.greedy_tokens[..16].to_vec());
}

#[test]
fn cancellation_ends_within_one_step() {
    let model = load_fixture("llama");
    let prompt = golden("llama").prompt_ids;
    let cancel = AtomicBool::new(false);
    let mut seen = 0;
    let out =
        generate(&model, &prompt, &params(200, SamplingParams::greedy()), Some(&cancel), |_| {
            seen += 1;
            if seen == 3 {
                cancel.store(true, Ordering::Relaxed);
            }
        })
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert!(
        out.tokens.len() <= 4,
        "ran {} tokens after cancellation at the 3rd piece",
        out.tokens.len()
    );

    // Cancelled before the start: nothing generated.
    let cancel = AtomicBool::new(true);
    let out =
        generate(&model, &prompt, &params(50, SamplingParams::greedy()), Some(&cancel), |_| {})
            .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert!(out.tokens.len() <= 1);
}

#[test]
fn a_batch_of_mixed_sequences_decodes_each_as_it_would_alone() {
    // Every fixture family, Gemma's sliding-window rings among them: mixed prompt lengths
    // (one far past Gemma's window of 8, prefilled in small chunks while the others decode),
    // joins mid-way, a stop string, seeded sampling, logprobs and a grammar in one batch;
    // the hybrid's recurrent states, one per sequence.
    for name in ["llama", "qwen3", "gemma3", HYBRID_FIXTURE] {
        let model = load_fixture(name);
        let g = golden(name);
        let base = |n| GenerateParams { prefill_chunk: 5, ..params(n, SamplingParams::greedy()) };
        let long: Vec<u32> =
            g.prompt_ids.iter().cycle().take(g.prompt_ids.len() * 6).copied().collect();
        let solo_text = generate(&model, &g.prompt_ids, &base(24), None, |_| {}).unwrap().text;
        let at =
            solo_text.char_indices().map(|(i, _)| i).find(|&i| i >= solo_text.len() / 2).unwrap();
        let stop: String = solo_text[at..].chars().take(4).collect();
        let tok = &model.tokenizer;
        let grammar = perch_engine::decode::constraint::Grammars::default()
            .json_schema(tok, model.vocab_size, &serde_json::json!({"type": "object"}))
            .unwrap();
        let jobs = vec![
            Job { prompt: g.prompt_ids.clone(), params: base(24), joins_at: 0, cancel_at: None },
            Job {
                prompt: g.prompt_ids[..5].to_vec(),
                params: base(10),
                joins_at: 0,
                cancel_at: None,
            },
            Job { prompt: long.clone(), params: base(12), joins_at: 3, cancel_at: None },
            Job {
                prompt: g.prompt_ids[2..].to_vec(),
                params: GenerateParams { logprobs: Some(2), ..params(16, hot(5)) },
                joins_at: 1,
                cancel_at: None,
            },
            Job {
                prompt: g.prompt_ids.clone(),
                params: GenerateParams { stop: vec![stop.clone()], ..base(24) },
                joins_at: 4,
                cancel_at: None,
            },
            Job {
                prompt: long[3..].to_vec(),
                params: GenerateParams { constraint: Some(grammar), ..base(20) },
                joins_at: 2,
                cancel_at: None,
            },
        ];
        let batch = run_batch(&model, &jobs, 9);
        for (i, (job, (got, streamed))) in jobs.iter().zip(&batch).enumerate() {
            let want = generate(&model, &job.prompt, &job.params, None, |_| {}).unwrap();
            assert_eq!(got.tokens, want.tokens, "{name}: sequence {i} differs from its solo run");
            assert_eq!(got.text, want.text, "{name}: sequence {i}");
            assert_eq!(*streamed, want.text, "{name}: sequence {i}'s streamed text");
            assert_eq!(got.finish_reason, want.finish_reason, "{name}: sequence {i}");
            assert_eq!(got.logprobs.len(), want.logprobs.len(), "{name}: sequence {i}");
            for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
                assert_eq!(a.token, b.token);
                assert!((a.logprob - b.logprob).abs() < 1e-3, "{name}: {a:?} vs {b:?}");
            }
        }
        assert_eq!(batch[4].0.finish_reason, FinishReason::Stop, "{name}: the stop string");
        assert!(batch[4].0.tokens.len() < 24, "{name}: the stop string ended nothing");
    }
}

#[test]
fn a_sequence_cancelled_mid_batch_leaves_the_others_as_they_were() {
    let model = load_fixture("qwen3");
    let g = golden("qwen3");
    let long: Vec<u32> =
        g.prompt_ids.iter().cycle().take(g.prompt_ids.len() * 8).copied().collect();
    let p = |n| GenerateParams { prefill_chunk: 4, ..params(n, SamplingParams::greedy()) };
    let jobs = vec![
        Job { prompt: g.prompt_ids.clone(), params: p(30), joins_at: 0, cancel_at: None },
        // Cancelled while decoding, and another while still prefilling (budget 6 a step).
        Job { prompt: g.prompt_ids.clone(), params: p(30), joins_at: 0, cancel_at: Some(5) },
        Job { prompt: long, params: p(30), joins_at: 1, cancel_at: Some(3) },
        Job { prompt: g.prompt_ids[1..].to_vec(), params: p(20), joins_at: 2, cancel_at: None },
    ];
    let batch = run_batch(&model, &jobs, 6);
    assert_eq!(batch[1].0.finish_reason, FinishReason::Cancelled);
    assert!(batch[1].0.tokens.len() <= 6, "ran {} tokens", batch[1].0.tokens.len());
    assert_eq!(batch[2].0.finish_reason, FinishReason::Cancelled);
    assert!(batch[2].0.tokens.is_empty(), "cancelled while prefilling, yet it decoded");
    for i in [0, 3] {
        let want = generate(&model, &jobs[i].prompt, &jobs[i].params, None, |_| {}).unwrap();
        assert_eq!(batch[i].0.tokens, want.tokens, "sequence {i}");
    }
}

#[test]
fn a_sequence_alone_in_the_batch_drafts_by_prompt_lookup() {
    // Alone, a batch's sequence verifies prompt-lookup drafts round for round as a solo
    // generation does; beside another it decodes one token a step, and drafts again once
    // alone. Greedy output stays the solo run's either way.
    let lookup = DraftMode::Lookup { min_ngram: 1, max_ngram: 3, max_draft: 6 };
    // (Not the hybrid: its random answers never repeat the prompt, so nothing is drafted;
    // speculative.rs checks its rollback.)
    for name in ["llama", "qwen3", "gemma3"] {
        let model = load_fixture(name);
        let g = golden(name);
        // The prompt repeats its own start, so lookup has something to draft from.
        let prompt: Vec<u32> =
            g.prompt_ids.iter().chain(&g.prompt_ids[..g.prompt_ids.len() / 2]).copied().collect();
        let p = |n, draft: DraftMode| GenerateParams {
            prefill_chunk: 5,
            draft,
            ..params(n, SamplingParams::greedy())
        };
        let solo = generate(&model, &prompt, &p(40, lookup.clone()), None, |_| {}).unwrap();
        let alone = vec![Job {
            prompt: prompt.clone(),
            params: p(40, lookup.clone()),
            joins_at: 0,
            cancel_at: None,
        }];
        let (got, streamed) = run_batch(&model, &alone, 9).remove(0);
        assert_eq!(got.tokens, solo.tokens, "{name}: alone, the batch differs from solo lookup");
        assert_eq!(streamed, solo.text, "{name}");
        let (want, stats) = (solo.draft.unwrap(), got.draft.expect("{name}: no draft statistics"));
        assert_eq!(stats.verify_calls, want.verify_calls, "{name}: rounds");
        assert_eq!(stats.drafted_by_depth, want.drafted_by_depth, "{name}");
        assert_eq!(stats.accepted_by_depth, want.accepted_by_depth, "{name}");
        assert!(stats.drafted_by_depth.iter().sum::<usize>() > 0, "{name}: nothing drafted");

        // A plain sequence joins at step 3 and leaves after 6 tokens.
        let jobs = vec![
            Job {
                prompt: prompt.clone(),
                params: p(40, lookup.clone()),
                joins_at: 0,
                cancel_at: None,
            },
            Job {
                prompt: g.prompt_ids.clone(),
                params: p(6, DraftMode::None),
                joins_at: 3,
                cancel_at: None,
            },
        ];
        let batch = run_batch(&model, &jobs, 9);
        let plain = generate(&model, &prompt, &p(40, DraftMode::None), None, |_| {}).unwrap();
        assert_eq!(batch[0].0.tokens, plain.tokens, "{name}: the drafting sequence");
        let want = generate(&model, &jobs[1].prompt, &jobs[1].params, None, |_| {}).unwrap();
        assert_eq!(batch[1].0.tokens, want.tokens, "{name}: the plain one beside it");
        let stats = batch[0].0.draft.clone().unwrap();
        let accepted: usize = stats.accepted_by_depth.iter().sum();
        assert!(
            stats.verify_calls + accepted < batch[0].0.tokens.len(),
            "{name}: every token came from a lookup round, none from the shared steps"
        );
        assert!(stats.verify_calls > 4, "{name}: it never drafted again once alone");
    }
}
