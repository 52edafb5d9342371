//! The splitter on outputs in each format, split at every position.

use super::*;

fn run(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
    let mut s = CallSplitter::new(format, vec!["get_weather".into(), "add".into()], None);
    let mut out = Vec::new();
    for p in pieces {
        out.extend(s.push(p));
    }
    out.extend(s.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for p in out {
        match p {
            Piece::Content(c) => content.push_str(&c),
            Piece::Call(c) => calls.push(c),
        }
    }
    (content, calls)
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
    // Qwen2.5-Coder-0.5B-Instruct's answer to a weather question with one tool (greedy).
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (content, calls) = all_splits(ToolFormat::TaggedCall, text);
    assert_eq!(content, "");
    assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())]);
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
    let (c, k) = all_splits(ToolFormat::Generic, r#" {"name": "add", "arguments": {"a": 1}}"#);
    assert_eq!((c.as_str(), k.len()), ("", 1));
    // A JSON answer naming no offered tool is content.
    let (c, k) = all_splits(ToolFormat::Generic, r#"{"name": "Ann", "age": 3}"#);
    assert_eq!((c.as_str(), k.len()), (r#"{"name": "Ann", "age": 3}"#, 0));
}

#[test]
fn a_forced_named_call_completes_without_its_closing_brace() {
    let forced = ToolFormat::TaggedCall.forced_prefix(Some("add")).unwrap();
    let mut s = CallSplitter::new(ToolFormat::TaggedCall, vec!["add".into()], Some(&forced));
    let mut out = s.push("{\"a\": 2}");
    out.extend(s.finish());
    assert!(
        matches!(&out[..], [Piece::Call(c)] if c.name == "add" && c.arguments == r#"{"a":2}"#),
        "{out:?}"
    );
}

#[test]
fn the_format_comes_from_the_template() {
    assert_eq!(ToolFormat::of_template("{{ '<tool_call>' }}"), ToolFormat::TaggedCall);
    assert_eq!(ToolFormat::of_template("[TOOL_CALLS] {{ x }}"), ToolFormat::Mistral);
    assert_eq!(ToolFormat::of_template("<|python_tag|>"), ToolFormat::PythonTag);
    assert_eq!(ToolFormat::of_template("<｜tool▁calls▁begin｜>"), ToolFormat::DeepSeek);
    assert_eq!(ToolFormat::of_template("{{ messages }}"), ToolFormat::Generic);
}
