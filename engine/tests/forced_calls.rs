//! Forced tool calls (`tool_choice` `required` and named) over real HTTP, in the markup of
//! real chat templates (llama.cpp's corpus, `.deps/chat-templates`, from scripts/setup-peers):
//! Qwen 2.5's `<tool_call>`, Mistral Nemo's `[TOOL_CALLS][…]`, Devstral's
//! `[TOOL_CALLS]name[ARGS]{…}`, Llama 3.1's bare `{"name", "parameters"}` and DeepSeek R1's
//! fenced calls. The fixture model's weights are random, so only the grammar can make its
//! answer a call: the tools take enums and booleans, so every call the grammar allows is short.

mod common;

use common::*;
use perch_engine::server::ServeConfig;
use serde_json::{json, Value};

const TEMPLATES: [(&str, &str); 5] = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "TaggedCall"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "Mistral"),
    ("unsloth-mistral-Devstral-Small-2507.jinja", "MistralArgs"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "PythonTag"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "DeepSeek"),
];

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "set_mode", "description": "Set the fan mode",
         "parameters": {"type": "object", "properties": {"mode": {"enum": ["quiet", "boost"]}},
                        "required": ["mode"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "toggle", "description": "Turn the light on or off",
         "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}},
                        "required": ["on"], "additionalProperties": false}}}
    ])
}

fn valid(name: &str, args: &Value) -> bool {
    match name {
        "set_mode" => args == &json!({"mode": "quiet"}) || args == &json!({"mode": "boost"}),
        "toggle" => {
            args.get("on").is_some_and(Value::is_boolean) && args.as_object().unwrap().len() == 1
        }
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_in_each_templates_own_markup() {
    let corpus =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/chat-templates");
    assert!(corpus.is_dir(), "{} missing: run scripts/setup-peers", corpus.display());
    for (file, format) in TEMPLATES {
        let (tmp, dir) = copy_fixture("qwen3", "tools");
        let cfg = dir.join("tokenizer_config.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        let source = std::fs::read_to_string(corpus.join(file)).unwrap();
        let detected = perch_engine::chat::ToolFormat::of_template(&source);
        assert_eq!(format!("{detected:?}"), format, "{file}");
        v["chat_template"] = source.into();
        std::fs::write(&cfg, v.to_string()).unwrap();
        // Devstral's template carries a system prompt of ~2k tokens: more room than the
        // fixture's 2048 (its weights are random either way).
        let config = dir.join("config.json");
        let mut c: Value =
            serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
        c["max_position_embeddings"] = 8192.into();
        std::fs::write(&config, c.to_string()).unwrap();
        let server = serve(engine_config(tmp.path(), "tools"), ServeConfig::default()).await;
        let body = |choice: Value, stream: bool| {
            json!({"model": "tools", "messages": [{"role": "user", "content": "Make it cosy in here."}],
                   "tools": tools(), "tool_choice": choice, "max_tokens": 60, "temperature": 0,
                   "stream": stream})
        };
        for choice in
            [json!("required"), json!({"type": "function", "function": {"name": "toggle"}})]
        {
            let (s, a) = post(&server, "/v1/chat/completions", body(choice.clone(), false)).await;
            assert_eq!(s, 200, "{format}: {a}");
            let choice0 = &a["choices"][0];
            assert_eq!(choice0["finish_reason"], "tool_calls", "{format} {choice}: {a}");
            assert!(
                choice0["message"]["content"].as_str().unwrap_or("").is_empty(),
                "{format}: {a}"
            );
            let call = &choice0["message"]["tool_calls"][0]["function"];
            let name = call["name"].as_str().unwrap();
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert!(valid(name, &args), "{format} {choice}: {name} {args}");
            if choice != json!("required") {
                assert_eq!(name, "toggle", "{format}");
            }
            // Streamed: the same call, and not a byte of markup in content.
            let (mut content, mut streamed_name, mut streamed_args) =
                (String::new(), String::new(), String::new());
            for chunk in
                stream_chunks(&server, "/v1/chat/completions", body(choice.clone(), true)).await
            {
                let delta = &chunk["choices"][0]["delta"];
                content.push_str(delta["content"].as_str().unwrap_or(""));
                if let Some(c) = delta["tool_calls"].get(0) {
                    streamed_name.push_str(c["function"]["name"].as_str().unwrap_or(""));
                    streamed_args.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
                }
            }
            assert_eq!(content, "", "{format} {choice}");
            assert_eq!(streamed_name, name, "{format} {choice}");
            assert_eq!(serde_json::from_str::<Value>(&streamed_args).unwrap(), args, "{format}");
        }
        eprintln!("{format} ({file}): forced calls answered");
    }
}
