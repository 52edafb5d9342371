//! Reasoning over real HTTP: a model whose chat template opens `<think>` for it answers into
//! `reasoning_content`, streamed and not, never into `content`. The fixture model writes
//! arbitrary tokens (it never closes the block), so its whole answer is reasoning; that answer
//! must be exactly the text the same prompt continues with on `/v1/completions`.

mod common;

use common::*;
use perch_engine::server::ServeConfig;
use serde_json::{json, Value};

/// The fixture's template, with the assistant's turn opening a `<think>` block.
const THINKING: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}";

#[tokio::test]
async fn thinking_goes_to_reasoning_content() {
    let (tmp, dir) = copy_fixture("qwen3", "thinker");
    let cfg = dir.join("tokenizer_config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["chat_template"] = THINKING.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    let server = serve(engine_config(tmp.path(), "thinker"), ServeConfig::default()).await;

    let chat = json!({"model": "thinker", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 12, "temperature": 0});
    let (s, a) = post(&server, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(s, 200, "{a}");
    let message = &a["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().expect("reasoning_content");
    assert_eq!(message["content"], "", "{a}");

    // The same prompt as plain text: its continuation is the reasoning, to the byte.
    let prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let completion =
        json!({"model": "thinker", "prompt": prompt, "max_tokens": 12, "temperature": 0});
    let (s, c) = post(&server, "/v1/completions", completion).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(a["usage"]["prompt_tokens"], c["usage"]["prompt_tokens"], "{a} {c}");
    assert_eq!(reasoning, c["choices"][0]["text"].as_str().unwrap(), "{a} {c}");

    // Streamed: reasoning_content deltas that add up to the same text; no content but the
    // opening empty one.
    let (mut streamed, mut content) = (String::new(), String::new());
    for chunk in stream_chunks(&server, "/v1/chat/completions", chat).await {
        let delta = &chunk["choices"][0]["delta"];
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!((streamed.as_str(), content.as_str()), (reasoning, ""));
}
