//! The prefix cache as a client sees it over HTTP: the next turn of a conversation and a
//! second conversation with the same system prompt report `cached_tokens`, and so do the
//! request log, `/metrics` and `/health`; a long prefill streams SSE keep-alive comments.

mod common;

use std::time::Duration;

use common::*;
use perch_engine::runtime::EngineConfig;
use perch_engine::server::ServeConfig;
use serde_json::{json, Value};

fn cached(r: &Value) -> u64 {
    r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_and_conversations_report_what_they_reuse() {
    let logs = tempfile::tempdir().unwrap();
    let s = serve(
        engine_config(&fixtures_models(), "qwen3"),
        ServeConfig { log_dir: Some(logs.path().to_path_buf()), ..Default::default() },
    )
    .await;
    let system = "You are a careful assistant who answers in short sentences. ".repeat(20);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Name a bird."}),
    ];
    let body = |m: &Vec<Value>| json!({"model": "qwen3", "messages": m, "max_tokens": 6, "temperature": 0});

    let (st, r1) = post(&s, "/v1/chat/completions", body(&messages)).await;
    assert_eq!(st, 200, "{r1}");
    let p1 = r1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached(&r1), 0, "nothing is cached before the first turn");

    // The next turn resends everything: turn one's prompt comes from the cache (the template
    // may tokenize the boundary before the answer differently, so one token may not).
    messages.push(json!({"role": "assistant", "content": r1["choices"][0]["message"]["content"]}));
    messages.push(json!({"role": "user", "content": "And another?"}));
    let (st, r2) = post(&s, "/v1/chat/completions", body(&messages)).await;
    assert_eq!(st, 200, "{r2}");
    assert!(cached(&r2) + 1 >= p1, "turn two reused {} of turn one's {p1} tokens", cached(&r2));
    assert!(cached(&r2) < r2["usage"]["prompt_tokens"].as_u64().unwrap());

    // Another conversation with the same system prompt reuses the system prompt.
    let other = vec![messages[0].clone(), json!({"role": "user", "content": "Name a fish."})];
    let (st, r3) = post(&s, "/v1/chat/completions", body(&other)).await;
    assert_eq!(st, 200, "{r3}");
    assert!(cached(&r3) > 100 && cached(&r3) < p1, "second conversation: {}", cached(&r3));

    // Streaming reports it in the usage chunk.
    let mut streamed = body(&messages);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&s, "/v1/chat/completions", streamed).await;
    let usage = chunks.iter().find(|c| !c["usage"].is_null()).expect("a usage chunk");
    let p2 = r2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached(usage), p2 - 1, "the same request again: all but its last token");

    let (_, h) = get(&s, "/health").await;
    assert!(h["prefix_cache"]["ram_entries"].as_u64().unwrap() >= 1, "{h}");
    assert!(h["prefix_cache"]["hit_tokens"].as_u64().unwrap() > 2 * p1, "{h}");
    let metrics = client().get(format!("{}/metrics", s.url())).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let hit = metrics
        .lines()
        .find(|l| l.starts_with("perch_prefix_cache_tokens_total{kind=\"hit\"}"))
        .unwrap_or_else(|| panic!("no hit counter in {metrics}"));
    let hits: u64 = hit.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(hits, cached(&r2) + cached(&r3) + cached(usage));
    assert!(metrics.contains("perch_prefix_cache_bytes{tier=\"ram\"}"), "{metrics}");
    let log = std::fs::read_to_string(logs.path().join("requests.jsonl")).unwrap();
    let logged: Vec<u64> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["cached_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(logged, vec![0, cached(&r2), cached(&r3), cached(usage)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prefill_streams_keep_alive_comments() {
    let s = serve(
        EngineConfig {
            prefix_cache: perch_engine::prefix_cache::PrefixCacheConfig {
                ram_bytes: 0,
                ..Default::default()
            },
            ..engine_config(&fixtures_models(), "qwen3")
        },
        ServeConfig { sse_keep_alive: Duration::from_millis(5), ..Default::default() },
    )
    .await;
    let prompt = "a b c d e f g h ".repeat(200);
    let body = json!({"model": "qwen3", "prompt": prompt, "max_tokens": 2, "stream": true});
    let r = client().post(format!("{}/v1/completions", s.url())).json(&body).send().await.unwrap();
    let tokens: u64 = r.headers()["x-perch-prompt-tokens"].to_str().unwrap().parse().unwrap();
    assert!(tokens > 1000, "{tokens}");
    let text = r.text().await.unwrap();
    assert!(
        text.lines().any(|l| l.starts_with(':') && l.contains("keep-alive")),
        "no keep-alive comment while {tokens} tokens prefilled: {text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
}

/// Claude Code opens `system` with a billing line whose hashes change with every request. It
/// is not the model's to read, and left in it made every request's prompt differ from its
/// first few tokens, so Claude Code's long system prompt was prefilled again each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_billing_line_neither_reaches_the_model_nor_splits_the_cache() {
    let s = serve(engine_config(&fixtures_models(), "qwen3"), ServeConfig::default()).await;
    let system = "You are a careful assistant who answers in short sentences. ".repeat(20);
    let billing = |cch: &str| {
        format!("x-anthropic-billing-header: cc_version=2.1.197.{cch}; cc_entrypoint=sdk-cli; cch={cch}a1;")
    };
    let ask = |system: Value, question: &str| {
        json!({"model": "qwen3", "max_tokens": 4, "temperature": 0, "system": system,
               "messages": [{"role": "user", "content": question}]})
    };
    let blocks = |cch: &str| {
        json!([{"type": "text", "text": billing(cch)},
               {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}])
    };
    let server = &s;
    let count = |mut body: Value| async move {
        let body_fields = body.as_object_mut().unwrap();
        body_fields.remove("max_tokens");
        body_fields.remove("temperature");
        let (st, r) = post(server, "/v1/messages/count_tokens", body).await;
        assert_eq!(st, 200, "{r}");
        r["input_tokens"].as_u64().unwrap()
    };
    let plain = count(ask(json!(system), "Name a bird.")).await;
    assert_eq!(
        count(ask(blocks("4f1"), "Name a bird.")).await,
        plain,
        "the billing block is not prompt"
    );
    let as_string = json!(format!("{}\n{system}", billing("07e")));
    assert_eq!(
        count(ask(as_string, "Name a bird.")).await,
        plain,
        "nor the billing line of a string"
    );

    let (st, a) = post(&s, "/v1/messages", ask(blocks("4f1"), "Name a bird.")).await;
    assert_eq!(st, 200, "{a}");
    let (st, b) = post(&s, "/v1/messages", ask(blocks("9c3"), "Name a fish.")).await;
    assert_eq!(st, 200, "{b}");
    let read = b["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    let prompt = read + b["usage"]["input_tokens"].as_u64().unwrap();
    assert!(read > 150, "the second request reused {read} of its {prompt} prompt tokens");
}
