//! Tool calls end to end on the default model, Qwen2.5-Coder-0.5B-Instruct imported from its
//! real GGUF (scripts/fetch-qwen-gguf) and served on loopback: the tools reach the prompt,
//! the model's `<tool_call>` markup comes back as `tool_calls` (streamed too, never as
//! content), and `tool_choice` is honoured. Greedy, so each answer is the model's own.

mod common;

use common::*;
use perch_engine::gguf::import::{import, ImportOptions, Quantize, StoreDtype};
use perch_engine::server::{ServeConfig, Server};
use serde_json::{json, Value};

const ID: &str = "qwen2.5-coder-0.5b-instruct";

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city name"}
            }, "required": ["city"]}
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Get the current local time in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}
            }, "required": ["city"]}
        }}
    ])
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": ID,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 60,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// `body` posted to `path`: the status, the answer, and one response header.
async fn post_header(
    server: &Server,
    path: &str,
    body: Value,
    header: &str,
) -> (u16, Value, String) {
    let r = client().post(format!("{}{path}", server.base())).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let h = r.headers().get(header).map_or(String::new(), |v| v.to_str().unwrap().to_string());
    (status, r.json().await.unwrap_or(Value::Null), h)
}

/// The calls of a non-streamed answer, as (name, arguments object).
fn calls(answer: &Value) -> Vec<(String, Value)> {
    let Some(list) = answer["choices"][0]["message"]["tool_calls"].as_array() else {
        return vec![];
    };
    list.iter()
        .map(|c| {
            assert_eq!(c["type"], "function", "{c}");
            assert!(c["id"].as_str().is_some_and(|id| !id.is_empty()), "{c}");
            let args = c["function"]["arguments"].as_str().expect("arguments are a string");
            let args: Value = serde_json::from_str(args).expect("arguments are JSON");
            assert!(args.is_object(), "{args}");
            (c["function"]["name"].as_str().unwrap().to_string(), args)
        })
        .collect()
}

/// A streamed answer: every content delta, the calls put together from their deltas (name,
/// arguments, how many argument fragments), and the finish reason.
async fn stream(
    server: &Server,
    body: Value,
) -> (Vec<String>, Vec<(String, String, usize)>, String) {
    let (mut content, mut calls, mut finish) =
        (vec![], Vec::<(String, String, usize)>::new(), String::new());
    for chunk in stream_chunks(server, "/v1/chat/completions", body).await {
        let choice = &chunk["choices"][0];
        if let Some(c) = choice["delta"]["content"].as_str() {
            content.push(c.to_string());
        }
        for d in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().expect("each tool_calls delta has an index") as usize;
            if i == calls.len() {
                // A call's first delta carries its id and name.
                assert!(d["id"].as_str().is_some(), "first delta of call {i} has no id: {d}");
                calls.push((d["function"]["name"].as_str().unwrap().to_string(), String::new(), 0));
            }
            if let Some(a) = d["function"]["arguments"].as_str().filter(|a| !a.is_empty()) {
                calls[i].1.push_str(a);
                calls[i].2 += 1;
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, calls, finish)
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen_calls_tools_as_asked() {
    let Some(gguf) = qwen_gguf() else { return };
    let models = tempfile::tempdir().unwrap();
    let opts = ImportOptions {
        name: Some(ID.into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: true,
    };
    let g = gguf.clone();
    let dir = models.path().to_path_buf();
    tokio::task::spawn_blocking(move || import(&g, &dir, &opts).unwrap()).await.unwrap();
    let server = serve(engine_config(models.path(), ID), ServeConfig::default()).await;
    let url = "/v1/chat/completions";
    let ask = "What is the weather like in Paris right now?";

    // The tools reach the prompt: the template lists them (a few hundred tokens).
    let (s, plain) = post(&server, url, chat(ask, json!({"max_tokens": 1}))).await;
    assert_eq!(s, 200, "{plain}");
    let (s, with) =
        post(&server, url, chat(ask, json!({"max_tokens": 1, "tools": weather_tools()}))).await;
    assert_eq!(s, 200, "{with}");
    let (p0, p1) = (
        plain["usage"]["prompt_tokens"].as_u64().unwrap(),
        with["usage"]["prompt_tokens"].as_u64().unwrap(),
    );
    assert!(p1 > p0 + 100, "tools not rendered: {p0} prompt tokens without, {p1} with");

    // auto: the model calls the weather tool; no markup in content. This model writes the call
    // as a bare object, without its template's <tool_call> tags: a recovered call, and the
    // response says so.
    let (s, a, recovered) = post_header(
        &server,
        url,
        chat(ask, json!({"tools": weather_tools()})),
        "x-perch-tool-call-recovered",
    )
    .await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(recovered, "bare-json", "{a}");
    let msg = &a["choices"][0]["message"];
    eprintln!("auto: {a}");
    assert_eq!(a["choices"][0]["finish_reason"], "tool_calls", "{a}");
    let got = calls(&a);
    assert_eq!(got.len(), 1, "{a}");
    assert_eq!(got[0].0, "get_weather");
    assert!(got[0].1["city"].as_str().is_some_and(|c| c.contains("Paris")), "{a}");
    assert!(!msg["content"].as_str().unwrap_or("").contains("<tool_call>"), "{a}");

    // The same streamed: a head delta (index, id, name), then arguments; content never
    // carries the markup.
    let (content, streamed, finish) =
        stream(&server, chat(ask, json!({"tools": weather_tools()}))).await;
    assert_eq!(finish, "tool_calls");
    assert!(content.iter().all(|c| !c.contains("<tool") && !c.contains("</tool")), "{content:?}");
    assert_eq!(streamed.len(), 1, "{streamed:?}");
    assert_eq!(streamed[0].0, "get_weather");
    let args: Value = serde_json::from_str(&streamed[0].1).unwrap();
    assert_eq!(args, got[0].1, "streamed arguments differ from the non-streamed ones");

    // none: the tools are not shown and nothing is read as a call.
    let (s, n) =
        post(&server, url, chat(ask, json!({"tools": weather_tools(), "tool_choice": "none"})))
            .await;
    assert_eq!(s, 200, "{n}");
    assert!(n["choices"][0]["message"].get("tool_calls").is_none_or(|t| t.is_null()), "{n}");
    assert_ne!(n["choices"][0]["finish_reason"], "tool_calls", "{n}");
    assert_eq!(n["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"], "{n}");

    // required on a question no tool answers: still a call to an offered tool.
    let hi = "Say hello to me in French.";
    let (s, r) =
        post(&server, url, chat(hi, json!({"tools": weather_tools(), "tool_choice": "required"})))
            .await;
    assert_eq!(s, 200, "{r}");
    eprintln!("required: {r}");
    let got = calls(&r);
    assert!(!got.is_empty(), "required gave no call: {r}");
    assert!(got.iter().all(|(n, _)| n == "get_weather" || n == "get_time"), "{r}");

    // Streamed, a forced call's name comes first and its arguments in fragments as they are
    // generated.
    let (content, streamed, finish) =
        stream(&server, chat(ask, json!({"tools": weather_tools(), "tool_choice": "required"})))
            .await;
    assert_eq!(finish, "tool_calls");
    assert!(content.iter().all(|c| c.is_empty()), "{content:?}");
    assert_eq!(streamed.len(), 1, "{streamed:?}");
    let args: Value = serde_json::from_str(&streamed[0].1).unwrap();
    assert!(args["city"].is_string(), "{streamed:?}");
    assert!(streamed[0].2 >= 2, "arguments came in one piece: {streamed:?}");

    // A named function: that one, even when the question asks about the weather.
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let (s, t) =
        post(&server, url, chat(ask, json!({"tools": weather_tools(), "tool_choice": named})))
            .await;
    assert_eq!(s, 200, "{t}");
    let got = calls(&t);
    assert_eq!(got.first().map(|c| c.0.as_str()), Some("get_time"), "{t}");

    // A call and its result in the history reach the prompt (what the model then writes is
    // its own: this 0.5B model tends to repeat the call and the result).
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]});
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 31, \"sky\": \"sunny\"}"});
    let user = json!({"role": "user", "content": ask});
    let history = |messages: Value| json!({"model": ID, "temperature": 0, "max_tokens": 1, "tools": weather_tools(), "messages": messages});
    let (s, h1) = post(&server, url, history(json!([user, call]))).await;
    assert_eq!(s, 200, "{h1}");
    let (s, h2) = post(&server, url, history(json!([user, call, result]))).await;
    assert_eq!(s, 200, "{h2}");
    let (p1, p2) = (
        h1["usage"]["prompt_tokens"].as_u64().unwrap(),
        h2["usage"]["prompt_tokens"].as_u64().unwrap(),
    );
    assert!(
        p1 > with["usage"]["prompt_tokens"].as_u64().unwrap() + 10,
        "the call is not in the prompt: {h1}"
    );
    assert!(p2 > p1 + 10, "the tool result is not in the prompt: {p1} then {p2}");

    // Answered, the model asks for the same weather again: the call goes back to the client
    // as written, and the response, /metrics and the log report the repeat.
    let mut again = history(json!([user, call, result]));
    again["max_tokens"] = json!(60);
    let (s, r, repeated) =
        post_header(&server, url, again.clone(), "x-perch-repeated-tool-call").await;
    eprintln!("after the result: {r}");
    assert_eq!(s, 200, "{r}");
    assert_eq!(calls(&r).first().map(|c| c.0.as_str()), Some("get_weather"), "{r}");
    assert_eq!(repeated, "get_weather; earlier=1", "{r}");
    let metrics = client().get(format!("{}/metrics", server.base())).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("perch_tool_call_notes_total{kind=\"repeated\"} 1"), "{metrics}");

    // json_schema: the answer is JSON valid against the schema (checked here by hand).
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "born": {"type": "integer"},
        "fields": {"type": "array", "items": {"type": "string"}}
    }, "required": ["name", "born", "fields"], "additionalProperties": false});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema}});
    let ask_json = "Give me a person: Ada Lovelace, born 1815. Answer in JSON.";
    let (s, j) =
        post(&server, url, chat(ask_json, json!({"response_format": rf, "max_tokens": 120}))).await;
    assert_eq!(s, 200, "{j}");
    eprintln!("json_schema: {j}");
    let v: Value =
        serde_json::from_str(j["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 3, "{v}");
    assert!(v["name"].is_string() && v["born"].is_i64() && v["fields"].is_array(), "{v}");
    assert!(v["fields"].as_array().unwrap().iter().all(Value::is_string), "{v}");
    let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": true}}});
    let (s, e) = post(&server, url, chat(ask_json, json!({"response_format": rf}))).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["param"], "response_format.json_schema.schema", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("uniqueItems"), "{e}");

    // A malformed tool is a 400 naming the field, in OpenAI's error shape.
    let bad = json!([{"type": "function", "function": {"name": "bad name!", "parameters": {"type": "object"}}}]);
    let (s, e) = post(&server, url, chat(ask, json!({"tools": bad}))).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["param"], "tools[0].function.name", "{e}");
    let (s, e) = post(&server, url, chat(ask, json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}))).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["param"], "tool_choice", "{e}");
    drop(server);

    // Recovery switched off: the same answer is the text the model wrote.
    let mut config = engine_config(models.path(), ID);
    config.tool_call_recovery = false;
    let server = serve(config, ServeConfig::default()).await;
    let (s, off, recovered) = post_header(
        &server,
        url,
        chat(ask, json!({"tools": weather_tools()})),
        "x-perch-tool-call-recovered",
    )
    .await;
    assert_eq!(s, 200, "{off}");
    assert_eq!((recovered.as_str(), calls(&off).len()), ("", 0), "{off}");
    let text = off["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(text.contains("\"get_weather\""), "{off}");
}
