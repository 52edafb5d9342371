//! Anthropic's Messages API over real HTTP on the fixture model: the answer's shape, the
//! event stream's order, stop sequences, token counting, model aliases, the API key as
//! `x-api-key`, and errors in Anthropic's shape. (Tool loops and the official `anthropic`
//! client against the real instruct model: official_clients.rs.)

mod common;

use common::*;
use perch_engine::runtime::EngineConfig;
use perch_engine::server::{ServeConfig, Server};
use serde_json::{json, Value};

async fn start(config: ServeConfig) -> Server {
    let engine = EngineConfig { max_queue: 1, ..engine_config(&fixtures_models(), "qwen3") };
    serve(engine, config).await
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "qwen3", "max_tokens": 12, "temperature": 0,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "baga dase fagi"}],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn text_of(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect()
}

/// The raw event stream: (event name, data) pairs.
async fn events(s: &Server, body: Value) -> Vec<(String, Value)> {
    sse_events(s, "/v1/messages", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_and_its_stream_agree_and_are_shaped_as_anthropics() {
    let s = start(ServeConfig::default()).await;
    let (code, m) = post(&s, "/v1/messages", ask(json!({}))).await;
    assert_eq!(code, 200, "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant")),
        "{m}"
    );
    assert_eq!(m["model"], "qwen3");
    assert!(m["id"].as_str().is_some_and(|i| i.starts_with("msg")), "{m}");
    assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()), "{m}");
    let u = &m["usage"];
    assert!(
        u["input_tokens"].as_u64().unwrap() > 0 && u["output_tokens"].as_u64().unwrap() > 0,
        "{m}"
    );
    assert!(u["cache_read_input_tokens"].is_u64(), "{m}");
    let text = text_of(&m);

    let ev = events(&s, ask(json!({}))).await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    for (n, d) in &ev {
        assert_eq!(d["type"], n.as_str(), "event name and data type differ: {n} {d}");
    }
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let starts = names.iter().filter(|n| **n == "content_block_start").count();
    let stops = names.iter().filter(|n| **n == "content_block_stop").count();
    assert_eq!((starts, stops), (1, 1), "{names:?}");
    let streamed: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(streamed, text, "greedy: the stream says what the message said");
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], m["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], m["usage"]["output_tokens"]);
    assert_eq!(
        ev[0].1["message"]["usage"]["input_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap()
    );

    // count_tokens: the same prompt's length, without generating.
    let mut count = ask(json!({}));
    count.as_object_mut().unwrap().remove("max_tokens");
    count.as_object_mut().unwrap().remove("temperature");
    let (code, c) = post(&s, "/v1/messages/count_tokens", count).await;
    assert_eq!(code, 200, "{c}");
    assert_eq!(
        c["input_tokens"].as_u64(),
        ev[0].1["message"]["usage"]["input_tokens"].as_u64(),
        "{c}"
    );

    // A stop sequence from the answer itself: the answer ends before it, and says which.
    assert!(text.chars().count() > 3, "{m}");
    let stop: String = text.chars().skip(1).take(2).collect();
    let (_, m2) = post(&s, "/v1/messages", ask(json!({"stop_sequences": ["never", stop]}))).await;
    assert_eq!(m2["stop_reason"], "stop_sequence", "{m2} (stop {stop:?} in {text:?})");
    assert_eq!(m2["stop_sequence"], stop.as_str());
    let cut = text_of(&m2);
    assert!(text.starts_with(&cut) && cut.len() < text.len(), "{m2}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_model_names_are_answered_by_the_default_model() {
    let s = start(ServeConfig::default()).await;
    let (code, m) =
        post(&s, "/v1/messages", ask(json!({"model": "claude-sonnet-4-5-20250929"}))).await;
    assert_eq!(code, 200, "{m}");
    assert_eq!(m["model"], "qwen3", "the answer names the model that answered: {m}");
    // OpenAI's names too, on OpenAI's route.
    let (code, c) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "gpt-4o", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!((code, c["model"].as_str()), (200, Some("qwen3")), "{c}");
    // Other unknown names are still a 404, in Anthropic's shape on Anthropic's route.
    let (code, e) = post(&s, "/v1/messages", ask(json!({"model": "llama-9000"}))).await;
    assert_eq!(code, 404, "{e}");
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "not_found_error", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("llama-9000"), "{e}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_come_back_in_anthropics_shape() {
    let s = start(ServeConfig { api_key: Some("sekrit".into()), ..ServeConfig::default() }).await;
    let url = format!("{}/v1/messages", s.url());
    let send = |key: Option<&'static str>, body: Value| {
        let mut r = client().post(&url).json(&body);
        if let Some(k) = key {
            r = r.header("x-api-key", k).header("anthropic-version", "2023-06-01");
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (code, e) = send(None, ask(json!({}))).await;
    assert_eq!((code, e["error"]["type"].as_str()), (401, Some("authentication_error")), "{e}");
    let (code, e) = send(Some("wrong"), ask(json!({}))).await;
    assert_eq!((code, e["error"]["type"].as_str()), (401, Some("authentication_error")), "{e}");
    let (code, m) = send(Some("sekrit"), ask(json!({}))).await;
    assert_eq!(code, 200, "x-api-key is Anthropic's way to send the key: {m}");
    let mut no_max = ask(json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let (code, e) = send(Some("sekrit"), no_max).await;
    assert_eq!(code, 400, "{e}");
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(e["error"]["message"].as_str().unwrap().contains("max_tokens"), "{e}");
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]});
    let (code, e) = send(Some("sekrit"), ask(image)).await;
    assert_eq!(code, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("images"), "{e}");
    let r = client()
        .post(&url)
        .header("x-api-key", "sekrit")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_is_overloaded_error_529() {
    use futures_util::StreamExt;
    // One generating (streamed, held open; a batch of one), one queued (max_queue 1): a third
    // is refused.
    let engine =
        EngineConfig { max_queue: 1, max_batch: 1, ..engine_config(&fixtures_models(), "qwen3") };
    let s = serve(engine, ServeConfig::default()).await;
    let url = s.url();
    let long = ask(json!({"max_tokens": 1500}));
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let running = client().post(format!("{url}/v1/messages")).json(&streamed).send().await.unwrap();
    let mut stream = running.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let queued = tokio::spawn({
        let (url, long) = (url.clone(), long.clone());
        async move { post(&url, "/v1/messages", long).await }
    });
    let t = std::time::Instant::now();
    loop {
        let (_, h) = get(&s, "/health").await;
        if h["foreground_queued"].as_u64() == Some(1) {
            break;
        }
        assert!(t.elapsed().as_secs() < 10, "the second request never queued: {h}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (code, e) = post(&s, "/v1/messages", long).await;
    assert_eq!(code, 529, "{e}");
    assert_eq!(e["error"]["type"], "overloaded_error", "{e}");
    drop(stream);
    assert_eq!(queued.await.unwrap().0, 200);
    s.shutdown().await;
}

/// Whether /health shows `id` loaded, polled for up to `within`, until it reads `want`.
async fn loaded_becomes(s: &Server, want: bool, within: std::time::Duration) -> bool {
    let t = std::time::Instant::now();
    loop {
        let (_, h) = get(s, "/health").await;
        let loaded = h["model"]["id"] == "qwen3";
        if loaded == want || t.elapsed() > within {
            return loaded;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_is_honoured_on_both_protocols() {
    let s = start(ServeConfig::default()).await;
    let wait = std::time::Duration::from_secs(5);
    // Ollama's semantics: 0 unloads the model once the request is done.
    let (code, m) = post(&s, "/v1/messages", ask(json!({"keep_alive": 0}))).await;
    assert_eq!(code, 200, "{m}");
    assert!(!loaded_becomes(&s, false, wait).await, "keep_alive 0 left the model loaded");
    // A duration keeps it (the engine's own keep-alive is 30 minutes; this says 10).
    let chat = json!({"model": "qwen3", "max_tokens": 2, "keep_alive": "10m",
                      "messages": [{"role": "user", "content": "hi"}]});
    let (code, c) = post(&s, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(code, 200, "{c}");
    assert!(loaded_becomes(&s, true, wait).await);
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert!(loaded_becomes(&s, true, wait).await, "keep_alive 10m unloaded the model");
    let mut zero = chat.clone();
    zero["keep_alive"] = json!("0s");
    assert_eq!(post(&s, "/v1/chat/completions", zero).await.0, 200);
    assert!(!loaded_becomes(&s, false, wait).await, "keep_alive \"0s\" left the model loaded");
    // A keep_alive that is not a duration is refused, naming it, in each protocol's shape.
    let mut bad = chat;
    bad["keep_alive"] = json!("soon");
    let (code, e) = post(&s, "/v1/chat/completions", bad).await;
    assert_eq!((code, e["error"]["param"].as_str()), (400, Some("keep_alive")), "{e}");
    let (code, e) = post(&s, "/v1/messages", ask(json!({"keep_alive": [5]}))).await;
    assert_eq!(code, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("keep_alive"), "{e}");
    s.shutdown().await;
}
