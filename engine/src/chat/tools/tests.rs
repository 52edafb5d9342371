//! The splitter on outputs in each format, split at every position.

use super::*;
use serde_json::json;

fn tool(name: &str, parameters: Value) -> Tool {
    Tool {
        name: name.into(),
        definition: json!({"type": "function", "function": {"name": name, "parameters": parameters}}),
    }
}

/// The tools these tests offer: `get_weather` needs a string `city`; `add` takes numbers only.
fn offered() -> Vec<Tool> {
    vec![
        tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        ),
        tool(
            "add",
            json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "additionalProperties": false}),
        ),
    ]
}

/// A splitter as a turn offering `offered()` gets one (recovery on, as by default).
fn splitter(format: ToolFormat) -> CallSplitter {
    let names = offered().into_iter().map(|t| t.name).collect();
    CallSplitter::new(format, names, None).recovering(Recovery::new(&offered()))
}

fn run(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
    run_with(splitter(format), pieces).0
}

fn run_with(mut s: CallSplitter, pieces: &[&str]) -> ((String, Vec<ToolCall>), Vec<ToolNote>) {
    let mut out = Vec::new();
    for p in pieces {
        out.extend(s.push(p));
    }
    out.extend(s.finish());
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for p in out {
        match p {
            Piece::Content(c) => content.push_str(&c),
            Piece::Call(c) => calls.push(c),
            Piece::CallHead { id, name } => {
                calls.push(ToolCall { id, name, arguments: String::new() })
            }
            Piece::CallArgs(a) => {
                calls.last_mut().expect("arguments after a head").arguments.push_str(&a)
            }
        }
    }
    // Streamed arguments are the model's own JSON text; compare them as JSON.
    for c in &mut calls {
        c.arguments = serde_json::from_str::<Value>(&c.arguments)
            .map_or_else(|_| c.arguments.clone(), |v| v.to_string());
    }
    ((content, calls), s.notes().to_vec())
}

/// Every split of `text` into two deltas and into single characters gives the same result,
/// and no delta of content ever holds markup.
fn all_splits(format: ToolFormat, text: &str) -> (String, Vec<(String, String)>) {
    let strip = |calls: Vec<ToolCall>| -> Vec<(String, String)> {
        calls.into_iter().map(|c| (c.name, c.arguments)).collect()
    };
    let (content, calls) = run(format, &[text]);
    let whole = (content, strip(calls));
    let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &i in &cuts {
        let (c, k) = run(format, &[&text[..i], &text[i..]]);
        assert_eq!((c, strip(k)), whole, "split at {i}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (c, k) = run(format, &refs);
    assert_eq!((c, strip(k)), whole, "char by char");
    whole
}

#[test]
fn tagged_json_calls_never_reach_content() {
    // The markup Qwen 2.5's template teaches (as its template shows it to the model).
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (content, calls) = all_splits(ToolFormat::TaggedCall, text);
    assert_eq!(content, "");
    assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())]);
}

#[test]
fn a_bare_call_without_the_templates_markup_is_a_call() {
    // Qwen2.5-Coder-0.5B-Instruct's real greedy answer (perch serve, temperature 0) to "What
    // is the weather like in Paris right now?" with get_weather and get_time offered: the
    // call without its <tool_call> tags.
    let text = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    for format in [ToolFormat::TaggedCall, ToolFormat::Mistral, ToolFormat::Generic] {
        let (content, calls) = all_splits(format, text);
        assert_eq!(content, "", "{format:?}");
        assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())]);
    }
    // In a json fence, and two in a row.
    let fenced = "```json\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n```";
    assert_eq!(all_splits(ToolFormat::TaggedCall, fenced).1.len(), 1);
    let two =
        "{\"name\": \"add\", \"arguments\": {}}\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}";
    assert_eq!(all_splits(ToolFormat::TaggedCall, two).1.len(), 2);
    // JSON that is no call to an offered tool stays content, whole.
    for text in [r#"{"name": "Ann", "age": 3}"#, "```json\n{\"a\": 1}\n```"] {
        assert_eq!(all_splits(ToolFormat::TaggedCall, text), (text.to_string(), vec![]));
    }
    // A call followed by words: the call, then the words.
    let (content, calls) = all_splits(ToolFormat::TaggedCall, "{\"name\": \"add\"} and more");
    assert_eq!((content.as_str(), calls), (" and more", vec![("add".into(), "{}".into())]));
}

/// The text's calls and the kinds of recovery noted, fed whole.
fn recovered(format: ToolFormat, text: &str) -> (String, Vec<(String, String)>, Vec<Foreign>) {
    let ((content, calls), notes) = run_with(splitter(format), &[text]);
    let calls = calls.into_iter().map(|c| (c.name, c.arguments)).collect();
    let kinds = notes
        .into_iter()
        .filter_map(|n| match n {
            ToolNote::Recovered(f) => Some(f),
            ToolNote::Repeated { .. } => None,
        })
        .collect();
    (content, calls, kinds)
}

#[test]
fn calls_written_in_another_format_are_recovered_and_noted() {
    let add = || vec![("add".to_string(), r#"{"a":1,"b":2}"#.to_string())];
    // Claude Code's Write call came back from Qwen2.5-Coder-0.5B as a fenced block after words.
    let cases = [
        (ToolFormat::TaggedCall, "I'll add them.\n```json\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n```\nDone.", "I'll add them.\n", Foreign::FencedJson),
        (ToolFormat::TaggedCall, "Adding.\n```\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n```", "Adding.\n", Foreign::FencedJson),
        (ToolFormat::TaggedCall, "Sure: {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}", "Sure: ", Foreign::BareJson),
        (ToolFormat::TaggedCall, "<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>", "", Foreign::XmlFunction),
        (ToolFormat::TaggedCall, r#"[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]"#, "", Foreign::Mistral),
        (ToolFormat::TaggedCall, r#"<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}"#, "", Foreign::PythonTag),
        (ToolFormat::Mistral, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", "", Foreign::TaggedCall),
        (ToolFormat::Generic, "```json\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}}\n```", "", Foreign::FencedJson),
        (ToolFormat::PythonTag, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1, \"b\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", Foreign::DeepSeek),
    ];
    for (format, text, content, kind) in cases {
        let (c, calls, kinds) = recovered(format, text);
        let after = if text.ends_with("Done.") { "\nDone." } else { "" };
        assert_eq!(c, format!("{content}{after}"), "{format:?}: {text}");
        assert_eq!(calls, add(), "{format:?}: {text}");
        assert_eq!(kinds, vec![kind], "{format:?}: {text}");
        // Streamed in any pieces, the same.
        all_splits(format, text);
    }
    // The template's own format is no recovery.
    let native =
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
    assert_eq!(recovered(ToolFormat::TaggedCall, native), (String::new(), add(), vec![]));
}

#[test]
fn only_valid_calls_of_offered_tools_are_recovered() {
    let fenced = |call: &str| format!("Here:\n```json\n{call}\n```");
    for call in [
        // Not offered.
        r#"{"name": "rm_rf", "arguments": {"path": "/"}}"#,
        // Against the schema: a string where a number goes, a property not allowed, a
        // required one missing.
        r#"{"name": "add", "arguments": {"a": "one"}}"#,
        r#"{"name": "add", "arguments": {"a": 1, "c": 3}}"#,
        r#"{"name": "get_weather", "arguments": {}}"#,
        // Not a call at all.
        r#"{"a": 1}"#,
    ] {
        let text = fenced(call);
        assert_eq!(
            recovered(ToolFormat::TaggedCall, &text),
            (text.clone(), vec![], vec![]),
            "{call}"
        );
        let bare = call.to_string();
        assert_eq!(
            recovered(ToolFormat::TaggedCall, &bare),
            (bare.clone(), vec![], vec![]),
            "{call}"
        );
    }
    // A tool whose schema does not compile (or points outside itself) validates nothing.
    let bad = [tool("fetch", json!({"$ref": "https://example.com/schema.json"}))];
    let s = CallSplitter::new(ToolFormat::TaggedCall, vec!["fetch".into()], None)
        .recovering(Recovery::new(&bad));
    let text = r#"{"name": "fetch", "arguments": {"url": "x"}}"#;
    let ((content, calls), notes) = run_with(s, &[text]);
    assert_eq!((content.as_str(), calls.len(), notes.len()), (text, 0, 0));
}

#[test]
fn without_recovery_other_formats_stay_text() {
    let names = || offered().into_iter().map(|t| t.name).collect::<Vec<_>>();
    for text in [
        r#"{"name": "add", "arguments": {"a": 1}}"#,
        "```json\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n```",
        "<function=add>\n<parameter=a>\n1\n</parameter>\n</function>",
    ] {
        let s = CallSplitter::new(ToolFormat::TaggedCall, names(), None);
        let ((content, calls), notes) = run_with(s, &[text]);
        assert_eq!((content.as_str(), calls.len(), notes.len()), (text, 0, 0));
    }
    // The generic format's bare object is its own format, not a recovery.
    let s = CallSplitter::new(ToolFormat::Generic, names(), None);
    let ((_, calls), notes) = run_with(s, &[r#"{"name": "add", "arguments": {"a": 1}}"#]);
    assert_eq!((calls.len(), notes.len()), (1, 0));
}

#[test]
fn a_call_repeating_an_answered_one_is_noted() {
    use crate::chat::ChatMessage;
    let call = |name: &str, args: Value| json!({"id": "c1", "type": "function", "function": {"name": name, "arguments": args}});
    let mut asked = ChatMessage::new("assistant", "");
    asked.tool_calls = vec![call("add", json!({"a": 1, "b": 2}))];
    let mut unanswered = ChatMessage::new("assistant", "");
    unanswered.tool_calls = vec![call("get_weather", json!({"city": "Oslo"}))];
    let messages = [
        ChatMessage::new("user", "add 1 and 2"),
        asked.clone(),
        ChatMessage::new("tool", "3"),
        asked,
        ChatMessage::new("tool", "3"),
        unanswered,
    ];
    let answered = answered_calls(&messages);
    assert_eq!(answered.len(), 2, "the call without a result after it is not counted");
    let repeated = |format, text: &str| {
        let s = splitter(format).after_calls(answered.clone());
        let (_, notes) = run_with(s, &[text]);
        notes
    };
    // Streamed (its arguments as they came) and whole, in the template's format or recovered.
    let tagged =
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 2, \"a\": 1}}\n</tool_call>";
    let expect = vec![ToolNote::Repeated { name: "add".into(), earlier: 2 }];
    assert_eq!(repeated(ToolFormat::TaggedCall, tagged), expect);
    let arguments_as_text =
        "<tool_call>\n{\"arguments\": {\"a\": 1, \"b\": 2}, \"name\": \"add\"}\n</tool_call>";
    assert_eq!(repeated(ToolFormat::TaggedCall, arguments_as_text), expect);
    let fenced = "```json\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n```";
    let notes = repeated(ToolFormat::TaggedCall, fenced);
    assert!(
        notes.contains(&expect[0]) && notes.contains(&ToolNote::Recovered(Foreign::FencedJson))
    );
    // Other arguments, or a call never answered: nothing to say.
    let other =
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 3}}\n</tool_call>";
    assert_eq!(repeated(ToolFormat::TaggedCall, other), vec![]);
    let weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    assert_eq!(repeated(ToolFormat::TaggedCall, weather), vec![]);
}

#[test]
fn a_tagged_call_streams_its_name_first_then_its_arguments() {
    let mut s = CallSplitter::new(ToolFormat::TaggedCall, vec!["get_weather".into()], None);
    assert_eq!(
        s.push("Sure. <tool_call>\n{\"name\": \"get_wea"),
        vec![Piece::Content("Sure. ".into())]
    );
    let out = s.push("ther\", \"arguments\": {\"city\": \"Pa");
    assert!(
        matches!(&out[..], [Piece::CallHead { name, .. }, Piece::CallArgs(a)] if name == "get_weather" && a == "{\"city\": \"Pa"),
        "{out:?}"
    );
    // A brace inside a string does not end the arguments; the markup after them never shows.
    assert_eq!(s.push("ris}\"}}\n</tool_call>"), vec![Piece::CallArgs("ris}\"}".into())]);
    assert_eq!(s.finish(), vec![]);
    // A call to a tool not offered, or in another key order, is read whole (and checked).
    let mut s = CallSplitter::new(ToolFormat::TaggedCall, vec!["add".into()], None);
    let out = s.push("<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"add\"}\n</tool_call>");
    assert!(matches!(&out[..], [Piece::Call(c)] if c.name == "add"), "{out:?}");
}

#[test]
fn parallel_calls_and_text_around_them() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>";
    let (content, calls) = all_splits(ToolFormat::TaggedCall, text);
    assert_eq!(content, "Let me check.\n");
    assert_eq!(
        calls,
        vec![
            ("add".into(), r#"{"a":1,"b":2}"#.into()),
            ("get_weather".into(), r#"{"city":"Oslo"}"#.into())
        ]
    );
}

#[test]
fn text_that_only_looks_like_markup_is_content() {
    let (content, calls) = all_splits(ToolFormat::TaggedCall, "a < b and <tool is fine <tool_");
    assert_eq!((content.as_str(), calls.len()), ("a < b and <tool is fine <tool_", 0));
    // A call that never closes or holds no call is the text it was.
    let bad = "<tool_call>\nnot json\n</tool_call> done";
    let (content, calls) = all_splits(ToolFormat::TaggedCall, bad);
    assert_eq!((content.as_str(), calls.len()), (bad, 0));
}

#[test]
fn qwen_xml_calls() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let (content, calls) = all_splits(ToolFormat::TaggedCall, text);
    assert_eq!(content, "");
    assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris","days":3}"#.into())]);
}

#[test]
fn mistral_python_tag_deepseek_and_generic() {
    let (c, k) = all_splits(
        ToolFormat::Mistral,
        r#"[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]"#,
    );
    assert_eq!((c.as_str(), k.len()), ("", 2));
    let (c, k) = all_splits(
        ToolFormat::PythonTag,
        r#"<|python_tag|>{"name": "add", "parameters": {"a": 1}}"#,
    );
    assert_eq!((c.as_str(), k), ("", vec![("add".into(), r#"{"a":1}"#.into())]));
    let ds = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (c, k) = all_splits(ToolFormat::DeepSeek, ds);
    assert_eq!((c.as_str(), k), ("", vec![("add".into(), r#"{"a":1}"#.into())]));
    let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (c, k) = all_splits(ToolFormat::DeepSeekV31, v31);
    assert_eq!((c.as_str(), k), ("", vec![("add".into(), r#"{"a":1}"#.into())]));
    let args = r#"Sure.[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[CALL_ID]c1[ARGS]{"city": "Rome"}"#;
    let (c, k) = all_splits(ToolFormat::MistralArgs, args);
    assert_eq!(c, "Sure.");
    assert_eq!(k[1], ("get_weather".into(), r#"{"city":"Rome"}"#.into()));
    let (c, k) = all_splits(ToolFormat::Generic, r#" {"name": "add", "arguments": {"a": 1}}"#);
    assert_eq!((c.as_str(), k.len()), ("", 1));
    // A JSON answer naming no offered tool is content.
    let (c, k) = all_splits(ToolFormat::Generic, r#"{"name": "Ann", "age": 3}"#);
    assert_eq!((c.as_str(), k.len()), (r#"{"name": "Ann", "age": 3}"#, 0));
}

#[test]
fn a_forced_call_is_read_from_the_prefix_and_the_object() {
    let forced = ToolFormat::TaggedCall.forced(&[], None, true).unwrap().prefix;
    let mut s = CallSplitter::new(ToolFormat::TaggedCall, vec!["add".into()], Some(forced));
    let mut out = s.push(r#"{"name": "add", "arguments": {"a": 2}}"#);
    out.extend(s.finish());
    assert!(
        matches!(&out[..], [Piece::CallHead { name, .. }, Piece::CallArgs(a)] if name == "add" && a == r#"{"a": 2}"#),
        "{out:?}"
    );
}

#[test]
fn the_call_schema_names_each_tool_and_its_parameters() {
    let tool = |name: &str, params: Value| Tool {
        name: name.into(),
        definition: serde_json::json!({"type": "function", "function": {"name": name, "parameters": params}}),
    };
    let p = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let tools = [tool("add", p.clone()), tool("now", Value::Null)];
    let schema = |only| match ToolFormat::TaggedCall.forced(&tools, only, true) {
        Some(Forced { grammar: ForcedGrammar::Schema(s), .. }) => s,
        other => panic!("{other:?}"),
    };
    let one = schema(Some("add"));
    assert_eq!(one["properties"]["name"]["const"], "add");
    assert_eq!(one["properties"]["arguments"], p);
    let any = schema(None);
    assert_eq!(any["anyOf"].as_array().map(Vec::len), Some(2));
    assert_eq!(any["anyOf"][1]["properties"]["arguments"], serde_json::json!({"type": "object"}));
    // Llama's calls carry `parameters`; DeepSeek V3.1's separator cannot be forced.
    let Some(Forced { prefix: "", grammar: ForcedGrammar::Schema(s) }) =
        ToolFormat::PythonTag.forced(&tools, Some("add"), true)
    else {
        panic!("Llama 3.x: a bare object")
    };
    assert_eq!(s["properties"]["parameters"], p);
    assert_eq!(ToolFormat::DeepSeekV31.forced(&tools, None, true), None);
}

#[test]
fn the_format_comes_from_the_template() {
    assert_eq!(ToolFormat::of_template("{{ '<tool_call>' }}"), ToolFormat::TaggedCall);
    assert_eq!(ToolFormat::of_template("[TOOL_CALLS] {{ x }}"), ToolFormat::Mistral);
    assert_eq!(ToolFormat::of_template("<|python_tag|>"), ToolFormat::PythonTag);
    assert_eq!(ToolFormat::of_template("[TOOL_CALLS]{{ name }}[ARGS]"), ToolFormat::MistralArgs);
    assert_eq!(ToolFormat::of_template("<｜tool▁calls▁begin｜>```json"), ToolFormat::DeepSeek);
    assert_eq!(ToolFormat::of_template("<｜tool▁calls▁begin｜>"), ToolFormat::DeepSeekV31);
    assert_eq!(ToolFormat::of_template("{{ messages }}"), ToolFormat::Generic);
}

#[test]
fn without_parallel_calls_only_the_first_is_let_out() {
    let text = r#"[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]"#;
    let names = vec!["get_weather".into(), "add".into()];
    let mut s = CallSplitter::new(ToolFormat::Mistral, names, None).one_call();
    let mut out = s.push(text);
    out.extend(s.finish());
    // The first call streams; the second is dropped.
    assert!(
        matches!(&out[..], [Piece::CallHead { name, .. }, Piece::CallArgs(a)] if name == "add" && a == r#"{"a": 1}"#),
        "{out:?}"
    );
    // Forced, Mistral's list is held to one item.
    let tools = [Tool {
        name: "add".into(),
        definition: serde_json::json!({"type": "function", "function": {"name": "add"}}),
    }];
    let Some(Forced { grammar: ForcedGrammar::Schema(list), .. }) =
        ToolFormat::Mistral.forced(&tools, None, false)
    else {
        panic!()
    };
    assert_eq!(list["maxItems"], 1);
}

#[test]
fn mistral_and_deepseek_calls_stream_their_arguments() {
    // Fed a character at a time: each call's head goes out before its arguments are complete,
    // then its arguments in fragments.
    let cases = [
        (ToolFormat::MistralArgs, r#"[TOOL_CALLS]add[ARGS]{"a": 12345}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}"#),
        (ToolFormat::Mistral, r#"[TOOL_CALLS][{"name": "add", "arguments": {"a": 12345}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]"#),
        (ToolFormat::DeepSeek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 12345}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Rome\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        (ToolFormat::DeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 12345}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ];
    for (format, text) in cases {
        let mut s = CallSplitter::new(format, vec!["get_weather".into(), "add".into()], None);
        let mut pieces = Vec::new();
        for c in text.chars() {
            pieces.extend(s.push(&c.to_string()));
        }
        pieces.extend(s.finish());
        let heads: Vec<&str> = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::CallHead { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(heads, ["add", "get_weather"], "{format:?}: {pieces:?}");
        let first_args = pieces.iter().filter(|p| matches!(p, Piece::CallArgs(_))).count();
        assert!(first_args > 4, "{format:?}: arguments in {first_args} fragments");
        assert!(!pieces.iter().any(|p| matches!(p, Piece::Content(_))), "{format:?}: {pieces:?}");
        // And whole, they are the same calls.
        let (c, k) = all_splits(format, text);
        assert_eq!((c.as_str(), k.len()), ("", 2), "{format:?}");
    }
}
