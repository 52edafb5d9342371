//! Request parsing: every refusal names its field; good bodies parse; no input panics.

use super::*;
use proptest::prelude::*;

fn err(endpoint: Endpoint, body: &str) -> ApiError {
    parse(endpoint, body.as_bytes()).unwrap_err()
}

#[test]
fn each_bad_field_is_named() {
    let chat = |extra: &str| {
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    for (extra, param) in [
        (r#","max_tokens":-1"#, "max_tokens"),
        (r#","max_completion_tokens":0"#, "max_completion_tokens"),
        (r#","temperature":-0.5"#, "temperature"),
        (r#","temperature":"hot""#, "temperature"),
        (r#","top_p":0"#, "top_p"),
        (r#","top_p":1.5"#, "top_p"),
        (r#","top_p":1e-60"#, "top_p"),
        (r#","repetition_penalty":1e-300"#, "repetition_penalty"),
        (r#","n":2"#, "n"),
        (r#","stop":7"#, "stop"),
        (r#","stream":"yes""#, "stream"),
        (r#","top_logprobs":3"#, "top_logprobs"),
        (r#","response_format":{"type":"xml"}"#, "response_format"),
        (r#","stream_options":{"include_usage":1}"#, "stream_options.include_usage"),
        (r#","stream_options":{"include_usage":true,"chunk_size":4}"#, "stream_options.chunk_size"),
        (r#","stream_options":{"include_obfuscation":"no"}"#, "stream_options.include_obfuscation"),
    ] {
        let e = err(Endpoint::Chat, &chat(extra));
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some(param)),
            "{extra}: {}",
            e.message
        );
    }
    assert_eq!(err(Endpoint::Chat, r#"{"messages":[]}"#).param.as_deref(), Some("model"));
    assert_eq!(err(Endpoint::Chat, r#"{"model":"m"}"#).param.as_deref(), Some("messages"));
    assert_eq!(
        err(Endpoint::Chat, r#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#)
            .param
            .as_deref(),
        Some("messages[0].role")
    );
    assert_eq!(
        err(Endpoint::Chat, r#"{"model":"m","messages":[{"role":"user","content":5}]}"#)
            .param
            .as_deref(),
        Some("messages[0].content")
    );
    assert_eq!(
        err(Endpoint::Completion, r#"{"model":"m","prompt":{"a":1}}"#).param.as_deref(),
        Some("prompt")
    );
    assert_eq!(
        err(Endpoint::Completion, r#"{"model":"m","prompt":"x","logprobs":9}"#).param.as_deref(),
        Some("logprobs")
    );
    // Obfuscation has nothing to pad on loopback: accepted, and changes nothing.
    let ok = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}"#;
    assert!(parse(Endpoint::Chat, ok.as_bytes()).is_ok_and(|r| r.include_usage));
    assert_eq!(err(Endpoint::Chat, "{not json").code, Some("invalid_json"));
    assert_eq!(err(Endpoint::Chat, "[1,2]").param.as_deref(), Some("body"));
}

/// The typed fields refuse in the words and codes the hand-read fields used.
#[test]
fn typed_fields_keep_the_words_and_codes_of_each_refusal() {
    for (body, message, code) in [
        (
            r#"{"model":"m","messages":[],"temperature":"hot"}"#,
            "`temperature` must be a number; got a string",
            "invalid_type",
        ),
        (r#"{"model":"m","top_p":0}"#, "`top_p` must be in (0, 1]; got 0", "invalid_value"),
        (
            r#"{"model":"m","max_tokens":-1}"#,
            "`max_tokens` must be an integer from 1 to 4294967295; got -1",
            "invalid_value",
        ),
        (r#"{"model":"m","seed":1.5}"#, "`seed` must be an integer; got a number", "invalid_type"),
        (r#"{"stream":"yes"}"#, "`stream` must be a boolean; got a string", "invalid_type"),
        (r#"{"model":5}"#, "`model` must be a string; got a number", "invalid_type"),
    ] {
        let e = err(Endpoint::Chat, body);
        assert_eq!((e.message.as_str(), e.code), (message, Some(code)), "{body}");
    }
}

#[test]
fn good_requests_parse() {
    let r = parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":"hi"}],"max_tokens":5,"stop":["a","b"],"seed":3,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"response_format":{"type":"json_object"},"user":"u1","metadata":{"a":"b"}}"#).unwrap();
    assert_eq!(
        r.turn.prompt,
        Prompt::Messages(vec![
            ChatMessage::new("system", "be brief"),
            ChatMessage::new("user", "hi")
        ])
    );
    assert_eq!((r.turn.max_tokens, r.turn.stop.len(), r.turn.sampling.seed), (Some(5), 2, Some(3)));
    assert!(r.stream && r.include_usage);
    assert_eq!(r.turn.response_format, ResponseFormat::JsonObject);
    assert_eq!(r.turn.logprobs, Some(2));
    let r =
        parse(Endpoint::Completion, br#"{"model":"m","prompt":[1,2,3],"temperature":0}"#).unwrap();
    assert_eq!(r.turn.prompt, Prompt::Tokens(vec![1, 2, 3]));
    assert_eq!(r.turn.sampling.temperature, 0.0);
}

#[test]
fn unknown_and_refused_fields_are_named() {
    let chat = |extra: &str| {
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    for (extra, param, code) in [
        (r#","unknown_field":1"#, "unknown_field", "unknown_parameter"),
        (
            r#","prediction":{"type":"content","content":"x"}"#,
            "prediction",
            "unsupported_parameter",
        ),
        (r#","audio":{"voice":"alloy"}"#, "audio", "unsupported_parameter"),
        (r#","modalities":["text","audio"]"#, "modalities", "unsupported_value"),
    ] {
        let e = err(Endpoint::Chat, &chat(extra));
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref(), e.code),
            (400, Some(param), Some(code)),
            "{extra}: {}",
            e.message
        );
    }
    // A completion-only field on chat is unknown there.
    let e = err(Endpoint::Chat, &chat(r#","echo":true"#));
    assert_eq!(e.param.as_deref(), Some("echo"));
    // Null means absent, as the OpenAI clients send it.
    assert!(parse(Endpoint::Chat, chat(r#","prediction":null,"modalities":["text"]"#).as_bytes())
        .is_ok());
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("model"),
            Just("messages"),
            Just("role"),
            Just("user"),
            Just("content"),
            Just("text"),
            Just("type")
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("model".to_string()),
                    Just("messages".to_string()),
                    Just("prompt".to_string()),
                    Just("role".to_string()),
                    Just("content".to_string()),
                    Just("stop".to_string()),
                    Just("max_tokens".to_string()),
                    Just("temperature".to_string()),
                    Just("top_p".to_string()),
                    Just("n".to_string()),
                    Just("stream".to_string()),
                    Just("stream_options".to_string()),
                    Just("logprobs".to_string()),
                    Just("top_logprobs".to_string()),
                    Just("response_format".to_string()),
                    Just("type".to_string()),
                    Just("seed".to_string()),
                    ".{0,6}",
                ],
                inner,
                0..8,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]
    #[test]
    fn no_input_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), value in json_value()) {
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            let _ = parse(endpoint, &bytes);
            let text = serde_json::to_vec(&value).unwrap();
            if let Err(e) = parse(endpoint, &text) {
                prop_assert!(e.status.is_client_error());
            }
        }
    }
}
