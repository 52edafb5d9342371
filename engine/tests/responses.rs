//! OpenAI's Responses API over real HTTP on the fixture model: the response object and its
//! event stream agree, conversations carry on through `previous_response_id` (and not from
//! a response sent with `store: false`), stored responses are retrieved and deleted, and
//! refusals name their field. (Tool loops and the official `openai` client against the real
//! instruct model: official_clients.rs.)

mod common;

use common::*;
use perch_engine::server::{ServeConfig, Server};
use serde_json::{json, Value};

async fn start() -> Server {
    serve(engine_config(&fixtures_models(), "qwen3"), ServeConfig::default()).await
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "qwen3", "max_output_tokens": 12, "temperature": 0,
        "instructions": "You are terse.", "input": "baga dase fagi",
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn output_text(r: &Value) -> String {
    let mut out = String::new();
    for item in r["output"].as_array().unwrap() {
        if item["type"] == "message" {
            for part in item["content"].as_array().unwrap() {
                out.push_str(part["text"].as_str().unwrap());
            }
        }
    }
    out
}

/// The raw event stream's data, each checked against its `event:` name.
async fn events(s: &Server, body: Value) -> Vec<Value> {
    let events = sse_events(s, "/v1/responses", body).await;
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{data}");
    }
    events.into_iter().map(|(_, data)| data).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_and_its_stream_agree() {
    let s = start().await;
    let (code, r) = post(&s, "/v1/responses", ask(json!({}))).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!((r["object"].as_str(), r["model"].as_str()), (Some("response"), Some("qwen3")));
    assert!(["completed", "incomplete"].contains(&r["status"].as_str().unwrap()), "{r}");
    assert_eq!(r["instructions"], "You are terse.");
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
    );
    let text = output_text(&r);
    assert!(!text.is_empty(), "{r}");

    let ev = events(&s, ask(json!({}))).await;
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..3],
        ["response.created", "response.in_progress", "response.output_item.added"]
    );
    assert!(["response.completed", "response.incomplete"].contains(kinds.last().unwrap()));
    let seq: Vec<u64> = ev.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seq, (0..ev.len() as u64).collect::<Vec<_>>(), "sequence numbers count up");
    let deltas: String = ev
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text, "greedy: the stream says what the object does");
    let last = &ev.last().unwrap()["response"];
    assert_eq!(output_text(last), text);
    assert_eq!(last["usage"]["output_tokens"], r["usage"]["output_tokens"]);
    let done = ev.iter().find(|e| e["type"] == "response.output_text.done").unwrap();
    assert_eq!(done["text"], text.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_response_id_carries_the_conversation_and_store_false_keeps_nothing() {
    let s = start().await;
    let (_, first) = post(&s, "/v1/responses", ask(json!({}))).await;
    let id = first["id"].as_str().unwrap();
    // Stored responses are read, continued and deleted by id alone: it must be unguessable.
    let random = id.strip_prefix("resp-").unwrap_or("");
    assert!(
        random.len() == 32 && random.bytes().all(|c| c.is_ascii_hexdigit()),
        "`{id}` is not 128 random bits"
    );
    let follow = json!({"previous_response_id": id, "input": "dase"});
    let (code, second) = post(&s, "/v1/responses", ask(follow)).await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(second["previous_response_id"], id);
    // The same conversation sent whole: the prompt is the same length.
    let whole = json!({"input": [
        {"role": "user", "content": "baga dase fagi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": output_text(&first)}]},
        {"role": "user", "content": "dase"},
    ]});
    let (_, sent) = post(&s, "/v1/responses", ask(whole)).await;
    assert_eq!(second["usage"]["input_tokens"], sent["usage"]["input_tokens"], "{second} {sent}");
    assert!(
        second["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64(),
        "the follow-up's prompt holds the first turn"
    );

    let (code, got) = get(&s, &format!("/v1/responses/{id}")).await;
    assert_eq!(code, 200);
    assert_eq!(got["output"], first["output"]);
    let (code, _) = call(&s, reqwest::Method::DELETE, &format!("/v1/responses/{id}"), None).await;
    assert_eq!(code, 200);
    let (code, e) = get(&s, &format!("/v1/responses/{id}")).await;
    assert_eq!(code, 404, "{e}");

    let (_, unstored) = post(&s, "/v1/responses", ask(json!({"store": false}))).await;
    let follow = json!({"previous_response_id": unstored["id"], "input": "dase"});
    let (code, e) = post(&s, "/v1/responses", ask(follow)).await;
    assert_eq!(code, 404, "{e}");
    assert_eq!(e["error"]["param"], "previous_response_id");
    assert_eq!(e["error"]["code"], "previous_response_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_field() {
    let s = start().await;
    for (extra, param) in [
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"tools": [{"type": "function"}]}), "tools[0].name"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0]",
        ),
        (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
        (json!({"background": true}), "background"),
        (json!({"truncation": "auto"}), "truncation"),
        (json!({"conversation": "conv_1"}), "conversation"),
        (json!({"text": {"format": {"type": "json_schema", "schema": {}}}}), "text.format.name"),
        (json!({"include": ["file_search_call.results"]}), "include[0]"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"temperature": 3}), "temperature"),
        (json!({"frobnicate": 1}), "frobnicate"),
        (
            json!({"stream": true, "stream_options": {"include_usage": true}}),
            "stream_options.include_usage",
        ),
    ] {
        let (code, e) = post(&s, "/v1/responses", ask(extra.clone())).await;
        assert_eq!(code, 400, "{extra}: {e}");
        assert_eq!(e["error"]["param"], param, "{extra}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_format_constrains_the_answer() {
    let s = start().await;
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    let format = json!({"text": {"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": true}}, "max_output_tokens": 40});
    let (code, r) = post(&s, "/v1/responses", ask(format)).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["text"]["format"]["name"], "A", "the format is echoed");
    if r["status"] == "completed" {
        let v: Value = serde_json::from_str(&output_text(&r)).expect("JSON");
        assert!(v["a"].is_i64(), "{v}");
    }
}
