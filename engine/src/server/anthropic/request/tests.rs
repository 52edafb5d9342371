//! Anthropic request parsing: the conversation maps onto chat messages as the template reads
//! them, every refusal names its field, and no input panics.

use super::*;
use crate::chat::ToolChoice;
use crate::runtime::ResponseFormat;
use proptest::prelude::*;

fn parse_ok(body: Value) -> ParsedMessages {
    parse(Endpoint::Messages, body.to_string().as_bytes(), &SamplingDefaults::default())
        .unwrap_or_else(|e| panic!("{body}: {}", e.message))
}

fn refused(endpoint: Endpoint, body: Value) -> ApiError {
    match parse(endpoint, body.to_string().as_bytes(), &SamplingDefaults::default()) {
        Ok(_) => panic!("accepted {body}"),
        Err(e) => e,
    }
}

fn messages_of(p: &ParsedMessages) -> &[ChatMessage] {
    match &p.turn.prompt {
        Prompt::Messages(m) => m,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tool_loop_maps_onto_the_templates_messages() {
    let p = parse_ok(json!({
        "model": "claude-sonnet-4-5", "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "get_weather", "description": "Weather now", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call it", "signature": "abc"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                {"type": "text", "text": "And tomorrow?"}]},
        ],
        "stop_sequences": ["###"], "temperature": 0.2, "top_k": 40, "metadata": {"user_id": "u"},
    }));
    let m = messages_of(&p);
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(m[0].content, "Be brief.\nUse tools.");
    assert_eq!(m[2].content, "Checking.");
    assert_eq!(
        m[2].tool_calls,
        vec![
            json!({"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}})
        ]
    );
    assert_eq!((m[3].content.as_str(), m[3].tool_call_id.as_deref()), ("18 C", Some("toolu_1")));
    assert_eq!(m[4].content, "And tomorrow?");
    assert_eq!(
        p.turn.tools[0].definition["function"]["parameters"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(p.turn.tool_choice, ToolChoice::Required);
    assert!(!p.turn.parallel_tool_calls);
    assert_eq!((p.turn.max_tokens, p.turn.sampling.top_k), (Some(64), 40));
    assert_eq!(p.turn.stop, ["###"]);
    assert_eq!(p.stop_sequences, ["###"]);
    assert!((p.turn.sampling.temperature - 0.2).abs() < 1e-6);
}

#[test]
fn thinking_and_structured_output_are_honoured() {
    let base = || json!({"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]});
    let mut b = base();
    b["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    assert_eq!(parse_ok(b).turn.template_kwargs["enable_thinking"], true);
    let mut b = base();
    b["thinking"] = json!({"type": "disabled"});
    assert_eq!(parse_ok(b).turn.template_kwargs["enable_thinking"], false);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let mut b = base();
    b["output_config"] = json!({"format": {"type": "json_schema", "schema": schema}});
    assert_eq!(parse_ok(b).turn.response_format, ResponseFormat::JsonSchema(schema.clone()));
    // What Claude Code sends on every request.
    let mut b = base();
    b["context_management"] =
        json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
    parse_ok(b);
    let mut b = base();
    b["output_config"] = json!({"effort": "max"});
    assert_eq!(parse_ok(b).turn.template_kwargs["reasoning_effort"], "high");
    let mut b = base();
    b["thinking"] = json!({"type": "adaptive", "display": "omitted"});
    let p = parse_ok(b);
    assert!(p.omit_thinking && p.turn.template_kwargs["enable_thinking"] == true);
    let mut b = base();
    b["output_format"] = json!({"type": "json_schema", "schema": schema});
    assert_eq!(parse_ok(b).turn.response_format, ResponseFormat::JsonSchema(schema));
}

#[test]
fn each_bad_field_is_named() {
    let base =
        || json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|b| drop(b.as_object_mut().unwrap().remove("max_tokens"))), "max_tokens"),
        (Box::new(|b| b["max_tokens"] = json!(0)), "max_tokens"),
        (Box::new(|b| drop(b.as_object_mut().unwrap().remove("model"))), "model"),
        (Box::new(|b| b["temperature"] = json!(1.5)), "temperature"),
        (Box::new(|b| b["top_p"] = json!(0)), "top_p"),
        (Box::new(|b| b["top_k"] = json!(-1)), "top_k"),
        (Box::new(|b| b["stream"] = json!("yes")), "stream"),
        (Box::new(|b| b["stop_sequences"] = json!("x")), "stop_sequences"),
        (Box::new(|b| b["frequency_penalty"] = json!(1)), "frequency_penalty"),
        (Box::new(|b| b["mcp_servers"] = json!([])), "mcp_servers"),
        (
            Box::new(|b| {
                b["context_management"] = json!({"edits": [{"type": "clear_tool_uses_20250919"}]})
            }),
            "context_management.edits.0.type",
        ),
        (Box::new(|b| b["messages"] = json!([])), "messages"),
        (Box::new(|b| b["messages"][0]["role"] = json!("system")), "messages.0.role"),
        (
            Box::new(
                |b| b["messages"][0]["content"] = json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]),
            ),
            "messages.0.content.0",
        ),
        (Box::new(|b| b["system"] = json!([{"type": "image"}])), "system.0"),
        (Box::new(|b| b["tools"] = json!([{"name": "x"}])), "tools.0.input_schema"),
        (
            Box::new(|b| {
                b["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}])
            }),
            "tools.0.type",
        ),
        (Box::new(|b| b["tools"] = json!([{"name": "a b", "input_schema": {}}])), "tools.0.name"),
        (
            Box::new(|b| b["tool_choice"] = json!({"type": "tool", "name": "nope"})),
            "tool_choice.name",
        ),
        (Box::new(|b| b["tool_choice"] = json!({"type": "sometimes"})), "tool_choice.type"),
        (
            Box::new(|b| b["thinking"] = json!({"type": "enabled", "budget_tokens": 2048})),
            "thinking.budget_tokens",
        ),
        (Box::new(|b| b["output_config"] = json!({"effort": "extreme"})), "output_config.effort"),
        (Box::new(|b| b["output_config"] = json!({"task_budget": 5})), "output_config.task_budget"),
        (
            Box::new(|b| b["thinking"] = json!({"type": "adaptive", "display": "full"})),
            "thinking.display",
        ),
        (
            Box::new(|b| b["output_config"] = json!({"format": {"type": "xml"}})),
            "output_config.format.type",
        ),
    ];
    for (edit, field) in cases {
        let mut b = base();
        edit(&mut b);
        let e = refused(Endpoint::Messages, b.clone());
        assert_eq!(e.param.as_deref(), Some(field), "{b}: {}", e.message);
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains(field.split('.').next().unwrap()), "{}", e.message);
    }
}

/// The typed fields refuse in Anthropic's words ("field: must be …"), with the codes the
/// hand-read fields used.
#[test]
fn typed_fields_refuse_in_anthropics_words() {
    let chat = json!([{"role": "user", "content": "hi"}]);
    for (body, message, code) in [
        (
            json!({"model": "m", "max_tokens": 8, "messages": chat, "temperature": 1.5}),
            "temperature: must be in [0, 1]; got 1.5",
            "invalid_value",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": chat, "top_p": 0}),
            "top_p: must be in (0, 1]; got 0",
            "invalid_value",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": chat, "stream": "yes"}),
            "stream: must be a boolean; got a string",
            "invalid_type",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": chat, "metadata": 3}),
            "metadata: must be an object; got a number",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": chat}),
            "max_tokens: Field required",
            "missing_required_parameter",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": chat, "zzz": 1}),
            "zzz: Extra inputs are not permitted",
            "unknown_parameter",
        ),
    ] {
        let e = refused(Endpoint::Messages, body.clone());
        assert_eq!((e.message.as_str(), e.code), (message, Some(code)), "{body}");
    }
}

#[test]
fn count_tokens_needs_no_max_tokens_and_refuses_generation_fields() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    assert!(parse(
        Endpoint::CountTokens,
        body.to_string().as_bytes(),
        &SamplingDefaults::default()
    )
    .is_ok());
    let e = refused(
        Endpoint::CountTokens,
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(e.param.as_deref(), Some("stream"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn no_body_panics(s in "\\PC{0,200}") {
        let _ = parse(Endpoint::Messages, s.as_bytes(), &SamplingDefaults::default());
    }

    #[test]
    fn no_json_value_panics(v in proptest::collection::vec(any::<(u8, i64, bool)>(), 0..8)) {
        // Shapes near valid ones: fields of the wrong kind in every position.
        let pick = |(k, n, b): (u8, i64, bool)| match k % 5 {
            0 => json!(n), 1 => json!(b), 2 => json!([n]), 3 => json!({"type": "text", "text": n}), _ => Value::Null,
        };
        let fields = ["model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking", "stop_sequences"];
        let mut body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]});
        for (i, x) in v.into_iter().enumerate() {
            body[fields[i % fields.len()]] = pick(x);
        }
        let _ = parse(Endpoint::Messages, body.to_string().as_bytes(), &SamplingDefaults::default());
    }
}
