//! The HTTP API on a real loopback socket with a fixture model: responses, streaming, every
//! kind of bad input, limits, the Host/Origin/key guards, cancellation on disconnect, the
//! request log, and shutdown.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use perch_engine::chat::ChatMessage;
use perch_engine::runtime::{Engine, EngineConfig};
use perch_engine::server::{ServeConfig, ServeError, Server};
use perch_engine::{generate, GenerateParams};
use serde_json::{json, Value};

/// The fixture `qwen3` served with `config`, at most `max_queue` requests waiting.
async fn start_with(config: ServeConfig, max_queue: usize) -> Server {
    serve(EngineConfig { max_queue, ..engine_config(&fixtures_models(), "qwen3") }, config).await
}

async fn start() -> Server {
    start_with(ServeConfig::default(), 8).await
}

fn chat_body(extra: Value) -> Value {
    let mut b = json!({"model": "qwen3", "messages": [{"role": "user", "content": "Name a bird."}], "max_tokens": 12, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// Parse an SSE body into its `data:` payloads.
fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(String::from).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_matches_the_engine_and_streams_in_openai_shape() {
    let s = start().await;
    let model = load_fixture("qwen3");
    let msgs = vec![ChatMessage::new("user", "Name a bird.")];
    let ids = model.tokenizer.encode_chat(&msgs).unwrap();
    let want = generate(
        &model,
        &ids,
        &GenerateParams { max_tokens: 12, ..Default::default() },
        None,
        |_| {},
    )
    .unwrap();

    let (status, body) = post(&s, "/v1/chat/completions", chat_body(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["content"], want.text.as_str());
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": ids.len(), "completion_tokens": 12, "total_tokens": ids.len() + 12, "prompt_tokens_details": {"cached_tokens": 0}})
    );

    let r = client()
        .post(format!("{}/v1/chat/completions", s.url()))
        .json(&chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, want.text);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);

    // Legacy completions, streaming and not, agree.
    let (status, c) = post(&s, "/v1/completions", json!({"model": "qwen3", "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0})).await;
    assert_eq!(status, 200);
    let r = client().post(format!("{}/v1/completions", s.url())).json(&json!({"model": "qwen3", "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0, "stream": true})).send().await.unwrap();
    let events = sse_events(&r.text().await.unwrap());
    let streamed: String = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(c["choices"][0]["text"].as_str().unwrap(), streamed);
    s.shutdown().await;
}

/// An agent loop whose conversation outgrows the context (here a pasted file of some 4,000
/// tokens against the fixture's 2,048; the fixture's template knows no tool turns) gets each
/// protocol's own clear 400 saying the context's length, never a silent cut: OpenAI's
/// `context_length_exceeded`, Anthropic's error object, Ollama's `error` string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_past_the_context_is_refused_in_every_protocol() {
    let s = start().await;
    let big = format!("Here is a.txt: {}", "lorem ".repeat(4000));
    let turns = json!([
        {"role": "user", "content": "Summarise the file I paste next."},
        {"role": "assistant", "content": "Paste it."},
        {"role": "user", "content": big}]);
    let says_length = |m: &str| m.contains("2048");
    let openai = json!({"model": "qwen3", "max_tokens": 16, "messages": turns});
    let (st, b) = post(&s, "/v1/chat/completions", openai).await;
    assert_eq!((st, b["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{b}");
    assert!(says_length(b["error"]["message"].as_str().unwrap()), "{b}");

    let anthropic = json!({"model": "qwen3", "max_tokens": 16, "messages": turns});
    let (st, b) = post(&s, "/v1/messages", anthropic).await;
    assert_eq!((st, b["type"].as_str()), (400, Some("error")), "{b}");
    assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    assert!(says_length(b["error"]["message"].as_str().unwrap()), "{b}");

    let ollama = json!({"model": "qwen3", "stream": false, "messages": turns});
    let (st, b) = post(&s, "/api/chat", ollama).await;
    assert_eq!(st, 400, "{b}");
    assert!(says_length(b["error"].as_str().unwrap()), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_a_clear_error() {
    let s = start_with(ServeConfig { max_body_bytes: 64 << 10, ..Default::default() }, 8).await;
    let raw = |body: &'static str| {
        let url = format!("{}/v1/chat/completions", s.url());
        async move {
            let r = client()
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (st, b) = raw("{\"model\": \"qwen3\", \"messages\": [").await;
    assert_eq!((st, b["error"]["code"].as_str()), (400, Some("invalid_json")), "{b}");
    for (extra, param) in [
        (json!({"max_tokens": -5}), "max_tokens"),
        (json!({"temperature": -1}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_p": 1.01}), "top_p"),
        (json!({"temperature": "warm"}), "temperature"),
        (json!({"n": 3}), "n"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": [{"content": "hi"}]}), "messages[0].role"),
        (json!({"stop": [1, 2]}), "stop"),
        (json!({"response_format": {"type": "yaml"}}), "response_format"),
    ] {
        let (st, b) = post(&s, "/v1/chat/completions", chat_body(extra.clone())).await;
        assert_eq!(st, 400, "{extra}: {b}");
        let e = &b["error"];
        assert_eq!(e["param"], param, "{extra}: {b}");
        assert!(
            e["message"].as_str().unwrap().contains(param.split(['[', '.']).next().unwrap()),
            "{b}"
        );
        assert_eq!(e["type"], "invalid_request_error");
    }
    let (st, b) =
        post(&s, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}]}))
            .await;
    assert_eq!((st, b["error"]["param"].as_str()), (400, Some("model")));
    let (st, b) =
        post(&s, "/v1/chat/completions", chat_body(json!({"model": "no-such-model"}))).await;
    assert_eq!((st, b["error"]["code"].as_str()), (404, Some("model_not_found")), "{b}");
    let (st, b) = post(&s, "/v1/chat/completions", chat_body(json!({"model": "../qwen3"}))).await;
    assert_eq!(st, 404, "paths are not model ids: {b}");
    // A model id of 60 000 `+` (under this test's body cap) once recursed per `+` and
    // overflowed the stack, killing the process; stacked adapters are refused by name.
    for model in ["+".repeat(60_000), "qwen3+a+b".into()] {
        let (st, b) = post(&s, "/v1/chat/completions", chat_body(json!({"model": model}))).await;
        assert_eq!((st, b["error"]["param"].as_str()), (400, Some("model")), "{b}");
    }
    // The fixture's context is 2048 tokens.
    let (st, b) =
        post(&s, "/v1/completions", json!({"model": "qwen3", "prompt": vec![464; 3000]})).await;
    assert_eq!((st, b["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{b}");
    let msg = b["error"]["message"].as_str().unwrap();
    assert!(msg.contains("2048") && msg.contains("3000"), "{msg}");
    // Over the body cap: 413, still JSON.
    let big = json!({"model": "qwen3", "prompt": "x".repeat(100 << 10)});
    let (st, b) = post(&s, "/v1/completions", big).await;
    assert_eq!((st, b["error"]["code"].as_str()), (413, Some("request_too_large")), "{b}");
    // Unknown paths and methods.
    let r = client().get(format!("{}/v2/nothing", s.url())).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].is_string());
    let r = client().get(format!("{}/v1/chat/completions", s.url())).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    // The engine is still fine.
    let (st, _) = post(&s, "/v1/chat/completions", chat_body(json!({}))).await;
    assert_eq!(st, 200);
    let h: Value =
        client().get(format!("{}/health", s.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (
            h["foreground_active"].as_u64(),
            h["foreground_queued"].as_u64(),
            h["foreground_arriving"].as_u64()
        ),
        (Some(0), Some(0), Some(0))
    );
    s.shutdown().await;
}

/// Poll /health until `key` is 0 (at most 2 s, else fail with `what`); how long it took.
async fn health_reaches(url: &str, key: &str, what: &str) -> Duration {
    let since = Instant::now();
    loop {
        let h: Value =
            client().get(format!("{url}/health")).send().await.unwrap().json().await.unwrap();
        if h[key] == 0 {
            return since.elapsed();
        }
        assert!(since.elapsed() < Duration::from_secs(2), "{what}: {h}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A completion that runs for a while on the fixture (it never emits EOS).
fn long_completion(stream: bool) -> Value {
    json!({"model": "qwen3", "prompt": "The quick brown fox", "max_tokens": 1500, "temperature": 0, "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_a_gone_client_frees_the_gate() {
    // A batch of two: two generating (streaming, so we can hang up), one queued, the fourth
    // turned away.
    let engine =
        EngineConfig { max_queue: 1, max_batch: 2, ..engine_config(&fixtures_models(), "qwen3") };
    let s = serve(engine, ServeConfig::default()).await;
    let url = s.url();
    let mut streams = vec![];
    for _ in 0..2 {
        let running = client()
            .post(format!("{url}/v1/completions"))
            .json(&long_completion(true))
            .send()
            .await
            .unwrap();
        let mut stream = running.bytes_stream();
        stream.next().await.unwrap().unwrap();
        streams.push(stream);
    }
    let queued = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(format!("{url}/v1/completions"))
                .json(&long_completion(false))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let h: Value =
        client().get(format!("{url}/health")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (h["foreground_active"].as_u64(), h["foreground_queued"].as_u64()),
        (Some(2), Some(1)),
        "{h}"
    );
    assert_eq!(h["slots"].as_array().map(Vec::len), Some(2), "{h}");
    let r = client()
        .post(format!("{url}/v1/completions"))
        .json(&long_completion(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "rate_limit_error");
    // Hang up on a running stream: its generation stops within a step, the queued one runs.
    drop(streams.pop());
    let took = health_reaches(
        &url,
        "foreground_queued",
        "the gate was not released after the client left",
    )
    .await;
    println!("slot handed over {:.0} ms after the hang-up", took.as_secs_f64() * 1e3);
    drop(streams);
    assert_eq!(queued.await.unwrap(), 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_client_that_leaves_cancels_too() {
    let s = start().await;
    let url = s.url();
    let req = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(format!("{url}/v1/completions"))
                .json(&long_completion(false))
                .timeout(Duration::from_millis(300))
                .send()
                .await
        }
    });
    assert!(req.await.unwrap().is_err(), "the request should have timed out client-side");
    health_reaches(&url, "foreground_active", "generation kept running after the client left")
        .await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_origin_and_key_guards() {
    let s = start_with(
        ServeConfig {
            api_key: Some("sekrit".into()),
            allowed_origins: vec!["http://localhost:5173".into()],
            ..Default::default()
        },
        8,
    )
    .await;
    let url = s.url();
    let get = |path: &str| client().get(format!("{url}{path}"));
    assert_eq!(get("/v1/models").send().await.unwrap().status().as_u16(), 401);
    assert_eq!(get("/v1/models").bearer_auth("wrong").send().await.unwrap().status().as_u16(), 401);
    assert_eq!(get("/v1/models").bearer_auth("sekri").send().await.unwrap().status().as_u16(), 401);
    let ok = get("/v1/models").bearer_auth("sekrit").send().await.unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    assert!(ok.headers().get("access-control-allow-origin").is_none());
    // DNS rebinding: a page on evil.com resolving to 127.0.0.1 sends Host: evil.com.
    let r = get("/v1/models")
        .bearer_auth("sekrit")
        .header("host", "evil.com:7342")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "host_not_allowed");
    // CORS: a configured origin gets the header; any other origin is refused outright.
    let r = get("/v1/models")
        .bearer_auth("sekrit")
        .header("origin", "http://localhost:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], "http://localhost:5173");
    let r = client()
        .post(format!("{url}/v1/completions"))
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .bearer_auth("sekrit")
        .body(r#"{"model":"qwen3","prompt":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let pre = client()
        .request(reqwest::Method::OPTIONS, format!("{url}/v1/chat/completions"))
        .header("origin", "http://localhost:5173")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(pre.status().as_u16(), 204);
    assert!(pre.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("authorization"));
    s.shutdown().await;

    // Anything but loopback needs a key.
    let engine = Engine::start(engine_config(&fixtures_models(), "qwen3")).unwrap();
    let err = Server::start(
        Arc::new(engine),
        ServeConfig { host: "0.0.0.0".into(), port: 0, ..Default::default() },
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(err, ServeError::KeyRequired(_)), "{err}");
    assert!(err.to_string().contains("API key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_the_request_log() {
    let logs = tempfile::tempdir().unwrap();
    let s = start_with(
        ServeConfig { log_dir: Some(logs.path().to_path_buf()), ..Default::default() },
        8,
    )
    .await;
    let url = s.url();
    let h: Value =
        client().get(format!("{url}/health")).send().await.unwrap().json().await.unwrap();
    for key in [
        "foreground_active",
        "foreground_queued",
        "seconds_since_last_request",
        "requests_completed",
        "leases",
        "gate",
        "model",
        "mtp",
        "warmup_ladder",
        "memory",
        "uptime_s",
        "max_batch",
        "slots",
    ] {
        assert!(h.get(key).is_some(), "/health lacks {key}: {h}");
    }
    assert_eq!(
        (h["requests_completed"].as_u64(), h["seconds_since_last_request"].is_null()),
        (Some(0), true)
    );
    let (st, _) = post(
        &s,
        "/v1/chat/completions",
        chat_body(json!({"messages": [{"role": "user", "content": "SECRET-PROMPT"}]})),
    )
    .await;
    assert_eq!(st, 200);
    let (st, _) = post(&s, "/v1/chat/completions", chat_body(json!({"temperature": 9}))).await;
    assert_eq!(st, 400);
    let h: Value =
        client().get(format!("{url}/health")).send().await.unwrap().json().await.unwrap();
    assert_eq!(h["requests_completed"], 1, "the 400 was refused, not served: {h}");
    assert!(h["seconds_since_last_request"].as_f64().unwrap() < 5.0);
    let m = client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "perch_requests_total{endpoint=\"chat\",status=\"200\"} 1",
        "perch_requests_total{endpoint=\"chat\",status=\"400\"} 1",
        "perch_tokens_total{kind=\"completion\"} 12",
        "perch_time_to_first_token_seconds_count 1",
        "perch_errors_total{type=\"invalid_value\"} 1",
        "perch_queue_depth 0",
        // One request alone in the batch: a step of one for each of its 12 tokens.
        "perch_batch_steps_total{sequences=\"1\"} 12",
        "perch_batch_steps_total{sequences=\"2\"} 0",
        "perch_batch_slots 0",
    ] {
        assert!(m.contains(line), "/metrics lacks `{line}`:\n{m}");
    }
    let log = std::fs::read_to_string(logs.path().join("requests.jsonl")).unwrap();
    let lines: Vec<Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{log}");
    let ok = &lines[0];
    assert_eq!(
        (ok["status"].as_u64(), ok["completion_tokens"].as_u64(), ok["finish_reason"].as_str()),
        (Some(200), Some(12), Some("length"))
    );
    for key in [
        "id",
        "model",
        "prompt_tokens",
        "cached_tokens",
        "ttft_s",
        "prefill_tok_s",
        "decode_tok_s",
        "draft",
        "error",
    ] {
        assert!(ok.get(key).is_some(), "log line lacks {key}: {ok}");
    }
    assert_eq!(ok["batch"], json!({"mean": 1.0, "max": 1}), "{ok}");
    assert!(!log.contains("SECRET-PROMPT"), "prompt text logged without being asked to");
    assert!(lines[1]["error"].as_str().unwrap().contains("temperature"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_and_json_mode() {
    let s = start().await;
    let (st, b) = post(
        &s,
        "/v1/chat/completions",
        chat_body(json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 4})),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    let content = b["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(t["token"], top[0]["token"]);
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
    }
    // Seeds reproduce.
    let sampled =
        |seed: u64| chat_body(json!({"temperature": 1.5, "seed": seed, "max_tokens": 16}));
    let a = post(&s, "/v1/chat/completions", sampled(5)).await.1["choices"][0]["message"]
        ["content"]
        .clone();
    assert_eq!(
        a,
        post(&s, "/v1/chat/completions", sampled(5)).await.1["choices"][0]["message"]["content"]
    );
    // JSON mode: whatever the model prefers, the output is one JSON object. The fixture's
    // random weights would write digits until max_tokens; with `}` pushed up by logit_bias
    // the grammar still makes it open with `{`, and the generation ends as the object closes.
    let tok =
        perch_engine::tokenizer::Tokenizer::load(&fixtures_models().join("qwen3"), &[]).unwrap();
    let close = tok.encode("}", false).unwrap();
    assert_eq!(close.len(), 1);
    for bias in [json!({}), json!({close[0].to_string(): 100})] {
        let (st, b) = post(
            &s,
            "/v1/chat/completions",
            chat_body(json!({"response_format": {"type": "json_object"}, "max_tokens": 40, "logit_bias": bias})),
        )
        .await;
        assert_eq!(st, 200, "{b}");
        let text = b["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if bias != json!({}) {
            assert_eq!(b["choices"][0]["finish_reason"], "stop", "{text:?}");
            assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text:?}");
        }
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constrained_turn_says_its_drafts_are_off() {
    // Prompt lookup on: a plain turn drafts; a constrained one decodes token by token, and
    // the response header says so.
    // (A solo engine; a batched one is tested below.)
    let engine = EngineConfig {
        draft: perch_engine::decode::DraftSetting::Lookup,
        max_batch: 1,
        ..engine_config(&fixtures_models(), "qwen3")
    };
    let s = serve(engine, ServeConfig::default()).await;
    let send =
        |body: Value| client().post(format!("{}/v1/chat/completions", s.url())).json(&body).send();
    let plain = send(chat_body(json!({}))).await.unwrap();
    assert_eq!(plain.status(), 200);
    assert!(plain.headers().get("x-perch-drafts").is_none());
    for extra in [
        json!({"response_format": {"type": "json_object"}}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}}),
        json!({"logprobs": true, "stream": true}),
    ] {
        let r = send(chat_body(extra.clone())).await.unwrap();
        assert_eq!(r.status(), 200, "{extra}");
        let why = r.headers().get("x-perch-drafts").map(|v| v.to_str().unwrap().to_string());
        assert!(why.as_deref().is_some_and(|w| w.starts_with("drafts off: ")), "{extra}: {why:?}");
    }
    // A batched engine (max_batch above 1) keeps prompt lookup (a sequence drafts while it
    // decodes alone) and decodes MTP turns without their drafts, and says so.
    for (model, draft, off) in [("qwen3", "lookup", false), ("qwen3-mtp", "mtp", true)] {
        let batched = EngineConfig {
            draft: draft.parse().unwrap(),
            ..engine_config(&fixtures_models(), model)
        };
        let s3 = serve(batched, ServeConfig::default()).await;
        let r = client()
            .post(format!("{}/v1/chat/completions", s3.url()))
            .json(&chat_body(json!({"model": model})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{model}");
        let why = r.headers().get("x-perch-drafts").map(|v| v.to_str().unwrap().to_string());
        match off {
            true => assert!(why.as_deref().is_some_and(|w| w.contains("batched")), "{why:?}"),
            false => assert!(why.is_none(), "{model}: {why:?}"),
        }
        s3.shutdown().await;
    }
    // Drafts off for the model: nothing to report.
    let s2 = serve(engine_config(&fixtures_models(), "qwen3"), ServeConfig::default()).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", s2.url()))
        .json(&chat_body(json!({"response_format": {"type": "json_object"}})))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("x-perch-drafts").is_none());
    s.shutdown().await;
    s2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_short_requests_and_cancels_long_ones() {
    let s = start_with(
        ServeConfig { shutdown_grace: Duration::from_millis(300), ..Default::default() },
        8,
    )
    .await;
    let url = s.url();
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            let r = client().post(format!("{url}/v1/completions")).json(&json!({"model": "qwen3", "prompt": "a", "max_tokens": 2000, "temperature": 0, "stream": true})).send().await.unwrap();
            r.text().await.unwrap_or_default()
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    s.shutdown().await;
    println!("shutdown took {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    assert!(t.elapsed() < Duration::from_secs(3), "shutdown hung");
    let body = long.await.unwrap();
    assert!(
        !body.contains("\"finish_reason\":\"length\""),
        "the long request ran to its end instead of being cancelled"
    );
    assert!(
        client().get(format!("{url}/health")).send().await.is_err(),
        "still accepting connections"
    );

    // Within the grace period an in-flight request finishes normally.
    let s = start_with(
        ServeConfig { shutdown_grace: Duration::from_secs(20), ..Default::default() },
        8,
    )
    .await;
    let url = s.url();
    let short = tokio::spawn(async move {
        let r = client()
            .post(format!("{url}/v1/completions"))
            .json(&json!({"model": "qwen3", "prompt": "a", "max_tokens": 300, "temperature": 0}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.shutdown().await;
    let (st, b) = short.await.unwrap();
    assert_eq!((st, b["choices"][0]["finish_reason"].as_str()), (200, Some("length")), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_counts_as_arrived_while_its_body_is_parsed() {
    // docs/runtime.md §1: arrival is stamped before the body is parsed, so background work
    // yields to a request whose body is still being read into a turn. A large body that fails
    // its checks only at the end is "arriving" for the whole parse, and never gets further.
    let s = start_with(ServeConfig { max_body_bytes: 64 << 20, ..Default::default() }, 8).await;
    let messages: Vec<Value> =
        (0..400_000).map(|_| json!({"role": "user", "content": "x"})).collect();
    let body = json!({"model": "qwen3", "messages": messages, "n": 2}).to_string();
    let url = s.url();
    let slow = tokio::spawn(async move {
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    let mut seen_arriving = false;
    while !slow.is_finished() {
        let (_, h) = get(&s, "/health").await;
        seen_arriving |= h["foreground_arriving"] == 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (code, e) = slow.await.unwrap();
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("n")), "{e}");
    assert!(seen_arriving, "the request was not counted while its body was parsed");
    let (_, h) = get(&s, "/health").await;
    assert_eq!(h["foreground_arriving"], 0);
    s.shutdown().await;
}

/// The chat window's conversations over HTTP, with no engine hosted (they are served
/// through restarts): saved with a revision check, listed, searched, renamed, exported and
/// imported as Markdown, refused by field, private to Perch's own pages, kept on disk for a
/// new server, and a clear 404 where none are kept.
#[tokio::test]
async fn conversations_are_kept_checked_and_private() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServeConfig {
        port: 0,
        conversations_dir: Some(dir.path().join("chats")),
        allowed_origins: vec!["http://allowed.example".into()],
        ..Default::default()
    };
    let s = Server::bind(config.clone()).await.unwrap();
    let put = |body: Value| {
        let id = body["id"].as_str().unwrap().to_string();
        let url = s.url();
        async move {
            call(&url, reqwest::Method::PUT, &format!("/perch/conversations/{id}"), Some(body))
                .await
        }
    };
    let chat = json!({"id": "c1", "title": "Birds", "settings": {"model": "qwen3", "system": "Be brief."},
        "messages": [{"id": "q", "role": "user", "content": "Name a bird that cannot fly."},
                     {"id": "a", "parent": "q", "role": "assistant", "content": "The kiwi.",
                      "stats": {"completion_tokens": 3, "tokens_per_s": 20.5}}],
        "current": "a"});
    let (status, saved) = put(chat.clone()).await;
    assert_eq!(status, 200, "{saved}");
    assert_eq!(saved["revision"], 1);
    assert!(saved["updated_ms"].as_u64().unwrap() > 0);

    // A second save from a window that read revision 0 is refused, not lost on top.
    let (status, e) = put(chat.clone()).await;
    assert_eq!((status, e["error"]["code"].as_str()), (409, Some("conflict")), "{e}");

    // Listed and searched (case-insensitive, message text too).
    let (_, list) = get(&s, "/perch/conversations").await;
    assert_eq!(list["data"][0]["id"], "c1");
    let (_, hits) = get(&s, "/perch/conversations?q=KIWI").await;
    assert_eq!(hits["data"][0]["snippet"], "The kiwi.");
    let (_, none) = get(&s, "/perch/conversations?q=penguin").await;
    assert_eq!(none["data"].as_array().unwrap().len(), 0);

    // Refused by field: an unknown one, a tree that is not one, an id that is a path.
    let mut bad = saved.clone();
    bad["messages"][1]["colour"] = json!("red");
    let (status, e) = put(bad).await;
    assert_eq!(status, 400);
    assert!(e["error"]["param"].as_str().unwrap().starts_with("messages[1]"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("colour"), "{e}");
    let mut bad = saved.clone();
    bad["messages"][0]["parent"] = json!("a");
    let (status, e) = put(bad).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("messages[0].parent")), "{e}");
    let (status, e) = get(&s, "/perch/conversations/..%2F..%2Fetc%2Fpasswd").await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("id")), "{e}");
    let (status, e) =
        call(&s, reqwest::Method::PUT, "/perch/conversations/other", Some(saved.clone())).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("id")), "{e}");

    // Private: no other page reads them, not even an origin allowed to use the API, and
    // writes take JSON only.
    let r = client()
        .get(format!("{}/perch/conversations", s.url()))
        .header("Origin", "http://allowed.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = client()
        .put(format!("{}/perch/conversations/c1", s.url()))
        .header("Content-Type", "text/plain")
        .body(saved.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);

    // Renamed, then exported as Markdown and imported back as a new conversation.
    let (status, renamed) = call(
        &s,
        reqwest::Method::PATCH,
        "/perch/conversations/c1",
        Some(json!({"title": "Flightless birds"})),
    )
    .await;
    assert_eq!((status, renamed["revision"].as_u64()), (200, Some(2)), "{renamed}");
    let r = client()
        .get(format!("{}/perch/conversations/c1/export?format=markdown", s.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-disposition"].to_str().unwrap(),
        "attachment; filename=\"Flightless-birds.md\""
    );
    let md = r.text().await.unwrap();
    assert_eq!(md, "# Flightless birds\n\n## System\n\nBe brief.\n\n## User\n\nName a bird that cannot fly.\n\n## Assistant\n\nThe kiwi.\n");
    let (status, imported) = post(&s, "/perch/conversations/import", json!({"markdown": md})).await;
    assert_eq!(status, 201, "{imported}");
    let new_id = imported["imported"][0]["id"].as_str().unwrap().to_string();
    assert_ne!(new_id, "c1");
    let (_, copy) = get(&s, &format!("/perch/conversations/{new_id}")).await;
    assert_eq!(copy["settings"]["system"], "Be brief.");
    assert_eq!(copy["messages"][1]["content"], "The kiwi.");
    let (status, e) =
        post(&s, "/perch/conversations/import", json!({"markdown": "no headings"})).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("markdown")), "{e}");

    // Presets: named settings beside the chats, kept by name (case aside), refused by field,
    // private like them.
    let preset = |name: &str, body: Value| {
        let (url, path) = (s.url(), format!("/perch/conversations/presets/{name}"));
        async move { call(&url, reqwest::Method::PUT, &path, Some(body)).await }
    };
    let (status, p) = preset(
        "Terse%20coder",
        json!({"settings": {"system": "Code only.", "temperature": 0.2, "tools": "auto"}}),
    )
    .await;
    assert_eq!(status, 200, "{p}");
    let (_, p) = preset("terse%20CODER", json!({"settings": {"system": "Code, then stop."}})).await;
    assert_eq!(p["presets"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(p["presets"][0]["settings"]["system"], "Code, then stop.");
    let (status, e) = preset("x", json!({"settings": {"temprature": 1}})).await;
    assert_eq!(status, 400);
    assert!(e["error"]["message"].as_str().unwrap().contains("temprature"), "{e}");
    let (status, e) = preset("%20", json!({"settings": {}})).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("name")), "{e}");
    let r = client()
        .get(format!("{}/perch/conversations/presets", s.url()))
        .header("Origin", "http://allowed.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);

    // A new server over the same folder (a restart) has both chats and the preset;
    // deleting one chat leaves a 404.
    s.shutdown().await;
    let s = Server::bind(config).await.unwrap();
    let (_, list) = get(&s, "/perch/conversations").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 2, "{list}");
    let (_, p) = get(&s, "/perch/conversations/presets").await;
    assert_eq!(p["presets"][0]["name"], "terse CODER", "{p}");
    let (status, e) =
        call(&s, reqwest::Method::DELETE, "/perch/conversations/presets/nope", None).await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("preset_not_found")), "{e}");
    let (status, _) = call(&s, reqwest::Method::DELETE, "/perch/conversations/c1", None).await;
    assert_eq!(status, 200);
    let (status, e) = get(&s, "/perch/conversations/c1").await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("conversation_not_found")));
    s.shutdown().await;

    // A server that keeps none says so.
    let s = Server::bind(ServeConfig { port: 0, ..Default::default() }).await.unwrap();
    let (status, e) = get(&s, "/perch/conversations").await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("conversations_off")), "{e}");
    s.shutdown().await;
}

/// MCP tools from real servers installed from the registries (scripts/setup-ui):
/// server-everything over stdio and over streamable HTTP, server-filesystem on a folder, and
/// mcp-server-time from PyPI; their tools listed, called over the engine's HTTP routes, the
/// results read back. Servers that send garbage, exit or never answer give errors naming
/// them, bounded in time, and the others keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_come_from_real_servers_and_broken_ones_fail_clearly() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = |p: &str| root.join(p).display().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let files = tmp.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("note.txt"), "the heron waits").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let http = KillOnDrop(
        std::process::Command::new("node")
            .arg(bin("tests/ui/node_modules/@modelcontextprotocol/server-everything/dist/index.js"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("node (scripts/setup-ui)"),
    );
    let file = tmp.path().join("mcp.json");
    std::fs::write(
        &file,
        json!({"mcpServers": {
            "everything": {"command": "node", "args": [bin("tests/ui/node_modules/@modelcontextprotocol/server-everything/dist/index.js")]},
            "fs": {"command": bin("tests/ui/node_modules/.bin/mcp-server-filesystem"), "args": [files.display().to_string()]},
            "time": {"command": bin(".deps/mcp-venv/bin/mcp-server-time")},
            "web": {"url": format!("http://127.0.0.1:{port}/mcp")},
        }})
        .to_string(),
    )
    .unwrap();
    let s =
        Server::bind(ServeConfig { port: 0, mcp_file: Some(file.clone()), ..Default::default() })
            .await
            .unwrap();
    // The HTTP server needs a moment to listen.
    let mut tools = Value::Null;
    for _ in 0..100 {
        let (status, t) = get(&s, "/perch/mcp/tools").await;
        assert_eq!(status, 200, "{t}");
        if t["errors"].as_array().unwrap().is_empty() {
            tools = t;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<String> = tools["tools"]
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .map(|t| format!("{}/{}", t["server"].as_str().unwrap(), t["name"].as_str().unwrap()))
        .collect();
    for want in ["everything/echo", "web/echo", "fs/read_text_file", "time/get_current_time"] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    let call = |server: &str, tool: &str, arguments: Value| {
        let body = json!({"server": server, "tool": tool, "arguments": arguments});
        let url = s.url();
        async move { post(&url, "/perch/mcp/call", body).await }
    };
    let (status, r) = call("everything", "echo", json!({"message": "hello heron"})).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["text"].as_str().unwrap().contains("hello heron"), "{r}");
    let (_, r) = call("web", "echo", json!({"message": "over http"})).await;
    assert!(r["text"].as_str().unwrap().contains("over http"), "{r}");
    let path = files.join("note.txt").display().to_string();
    let (_, r) = call("fs", "read_text_file", json!({"path": path})).await;
    assert!(r["text"].as_str().unwrap().contains("the heron waits"), "{r}");
    let (_, r) = call("time", "get_current_time", json!({"timezone": "Europe/Paris"})).await;
    assert!(r["text"].as_str().unwrap().contains("Europe/Paris"), "{r}");
    // A tool's own failure comes back as its text, marked, for the model to read.
    let (status, r) = call("time", "get_current_time", json!({"timezone": "Not/AZone"})).await;
    assert_eq!((status, r["is_error"].as_bool()), (200, Some(true)), "{r}");
    let (status, e) = call("nope", "echo", json!({})).await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("mcp_not_found")), "{e}");
    // A bad file is refused by field and not written.
    let (status, e) = call_put(
        &s,
        "/perch/mcp",
        json!({"text": "{\"mcpServers\": {\"x\": {\"command\": \"a\", \"colour\": 1}}}"}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("colour"), "{e}");
    assert!(std::fs::read_to_string(&file).unwrap().contains("everything"));
    // "Always allow" is written into the file.
    let (status, _) =
        post(&s, "/perch/mcp/allow", json!({"server": "time", "tool": "get_current_time"})).await;
    assert_eq!(status, 200);
    let (_, t) = get(&s, "/perch/mcp/tools").await;
    let allowed: Vec<_> = t["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["always_allowed"] == true)
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(allowed, ["get_current_time"]);
    s.shutdown().await;
    drop(http);

    // Broken servers, through the manager with short bounds: each error names its server.
    let broken = tmp.path().join("broken.json");
    std::fs::write(
        &broken,
        json!({"mcpServers": {
            "garbage": {"command": "sh", "args": ["-c", "echo 'not json at all'; echo '{\"jsonrpc\": 7}'; sleep 30"]},
            "exits": {"command": "sh", "args": ["-c", "exit 3"]},
            "silent": {"command": "sleep", "args": ["30"]},
            "missing": {"command": "/nonexistent/mcp-server"},
            "time": {"command": bin(".deps/mcp-venv/bin/mcp-server-time")},
        }})
        .to_string(),
    )
    .unwrap();
    let m = perch_engine::mcp::Manager::with_timeouts(
        broken,
        Duration::from_secs(3),
        Duration::from_secs(3),
    );
    let t0 = Instant::now();
    let (tools, errors) = m.tools().await.unwrap();
    let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(tools.iter().all(|t| t.server == "time") && !tools.is_empty(), "{tools:?}");
    for name in ["garbage", "exits", "silent", "missing"] {
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("MCP server `{name}` did not start"))),
            "{name}: {errors:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "bounded: {:?}", t0.elapsed());
    let r = m.call("time", "get_current_time", serde_json::Map::new()).await;
    assert!(r.is_ok() || matches!(r, Err(perch_engine::mcp::McpError::Call { .. })), "{r:?}");
    m.stop_all().await;
    assert!(m.running().await.is_empty());
}

/// A child process stopped however the test ends (a failed assertion included).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn call_put(s: &Server, path: &str, body: Value) -> (u16, Value) {
    call(s, reqwest::Method::PUT, path, Some(body)).await
}
