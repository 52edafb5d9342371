//! Constraints on the qwen3 fixture's real byte-level BPE vocabulary.

use super::*;
use serde_json::json;

fn tokenizer() -> Tokenizer {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3");
    Tokenizer::load(&dir, &[]).unwrap()
}

/// Feeds `text`'s tokens; the index of the first one the constraint refuses, if any.
fn first_refused(c: &mut Constraint, tok: &Tokenizer, text: &str) -> Option<usize> {
    for (i, id) in tok.encode(text, false).unwrap().into_iter().enumerate() {
        if !c.allowed().unwrap().contains(id) {
            return Some(i);
        }
        c.consume(id).unwrap();
    }
    None
}

#[test]
fn a_schema_lets_through_exactly_its_json() {
    let tok = tokenizer();
    let g = Grammars::default();
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}
    }, "required": ["city", "days"], "additionalProperties": false});
    let mut c = g.json_schema(&tok, 151_936, &schema).unwrap();
    assert_eq!(first_refused(&mut c, &tok, r#"{"city": "Paris", "days": 3}"#), None);
    assert!(c.is_done(), "the object is complete: nothing may follow");
    // A wrong key, a string for the integer, a missing required key, padding whitespace.
    for bad in [
        r#"{"town": "Paris"}"#,
        r#"{"city": "Paris", "days": "3"}"#,
        r#"{"city": "Paris"}"#,
        "{\n  \"city\"",
    ] {
        let mut c = g.json_schema(&tok, 151_936, &schema).unwrap();
        assert!(first_refused(&mut c, &tok, bad).is_some(), "{bad} got through");
    }
}

#[test]
fn end_of_sequence_only_once_the_json_is_complete() {
    let tok = tokenizer();
    let eos = *tok.eos_ids().first().expect("the fixture has an eos id");
    let mut c = Grammars::default().json_schema(&tok, 151_936, &json!({"type": "object"})).unwrap();
    assert!(!c.allowed().unwrap().contains(eos));
    assert_eq!(first_refused(&mut c, &tok, "{\"a\": [1, 2]"), None);
    assert!(!c.allowed().unwrap().contains(eos));
    assert_eq!(first_refused(&mut c, &tok, "}"), None);
    assert!(c.is_done() || c.allowed().unwrap().contains(eos));
}

#[test]
fn what_cannot_be_enforced_is_refused_by_name() {
    let tok = tokenizer();
    let g = Grammars::default();
    let e = g
        .json_schema(
            &tok,
            151_936,
            &json!({"type": "object", "oneOf": [{"type": "object"}, {"required": ["a"]}]}),
        )
        .unwrap_err();
    assert!(matches!(&e, GrammarError::Schema(m) if m.contains("oneOf")), "{e:?}");
    let e = g.json_schema(&tok, 151_936, &json!({"$ref": "#/nowhere"})).unwrap_err();
    assert!(matches!(e, GrammarError::Schema(_)), "{e:?}");
}

#[test]
fn a_vocabulary_size_from_a_hostile_config_is_refused_not_allocated() {
    let e = Grammars::default()
        .json_schema(&tokenizer(), 1 << 40, &json!({"type": "object"}))
        .unwrap_err();
    assert!(matches!(&e, GrammarError::Vocabulary(m) if m.contains("1099511627776")), "{e:?}");
}

/// Every format Perch can force: its grammar takes a call in the format's own markup and
/// nothing else, and the splitter reads that text (after the prompt's opening) as the call.
#[test]
fn forced_calls_in_each_format_are_read_back_as_calls() {
    use crate::chat::{CallSplitter, Forced, ForcedGrammar, Piece, Tool, ToolFormat};
    let tok = tokenizer();
    let g = Grammars::default();
    let tool = |name: &str, params: Value| Tool {
        name: name.into(),
        definition: json!({"type": "function", "function": {"name": name, "parameters": params}}),
    };
    let tools = [
        tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}),
        ),
        tool(
            "add",
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false}),
        ),
    ];
    let cases = [
        (
            ToolFormat::TaggedCall,
            r#"{"name": "add", "arguments": {"a": 2, "b": 3}}"#,
            r#"{"name": "sub", "arguments": {"a": 2, "b": 3}}"#,
        ),
        (
            ToolFormat::Mistral,
            r#"[{"name": "add", "arguments": {"a": 2, "b": 3}}]"#,
            r#"[{"name": "add", "arguments": {"a": "2"}}]"#,
        ),
        (ToolFormat::MistralArgs, r#"add[ARGS]{"a": 2, "b": 3}"#, r#"sub[ARGS]{"a": 2, "b": 3}"#),
        (
            ToolFormat::PythonTag,
            r#"{"name": "add", "parameters": {"a": 2, "b": 3}}"#,
            r#"{"name": "add", "arguments": {"a": 2, "b": 3}}"#,
        ),
        (
            ToolFormat::DeepSeek,
            "add\n```json\n{\"a\": 2, \"b\": 3}\n```",
            "add\n```json\n{\"a\": 2}\n```",
        ),
        (
            ToolFormat::Generic,
            r#"{"name": "add", "arguments": {"a": 2, "b": 3}}"#,
            r#"{"name": "add", "arguments": {"b": 3, "a": 2}}"#,
        ),
    ];
    for (format, good, bad) in cases {
        let Forced { prefix, grammar } = format.forced(&tools, None, true).unwrap();
        let compile = || match &grammar {
            ForcedGrammar::Schema(s) => g.json_schema(&tok, 151_936, s).unwrap(),
            ForcedGrammar::Lark(l) => g.lark(&tok, 151_936, l).unwrap(),
        };
        let mut c = compile();
        assert_eq!(first_refused(&mut c, &tok, good), None, "{format:?}: {good}");
        assert!(c.is_done(), "{format:?}: the call is complete, nothing may follow");
        assert!(
            first_refused(&mut compile(), &tok, bad).is_some(),
            "{format:?}: {bad} got through"
        );
        let names = tools.iter().map(|t| t.name.clone()).collect();
        let opened = Some(prefix).filter(|p| !p.is_empty());
        let mut s = CallSplitter::new(format, names, opened);
        let mut out = s.push(good);
        out.extend(s.finish());
        // Whole calls, or a streamed head followed by its argument fragments.
        let mut calls: Vec<(String, String)> = vec![];
        for p in &out {
            match p {
                Piece::Call(c) => calls.push((c.name.clone(), c.arguments.clone())),
                Piece::CallHead { name, .. } => calls.push((name.clone(), String::new())),
                Piece::CallArgs(a) => calls.last_mut().unwrap().1.push_str(a),
                Piece::Content(c) => panic!("{format:?}: content {c:?}"),
            }
        }
        let calls: Vec<(String, Value)> =
            calls.into_iter().map(|(n, a)| (n, serde_json::from_str(&a).unwrap())).collect();
        assert_eq!(
            calls,
            vec![("add".to_string(), json!({"a": 2, "b": 3}))],
            "{format:?}: {out:?}"
        );
    }
    // A named choice allows only that tool.
    let Forced { grammar: ForcedGrammar::Lark(l), .. } =
        ToolFormat::MistralArgs.forced(&tools, Some("get_weather"), true).unwrap()
    else {
        panic!()
    };
    assert!(first_refused(
        &mut g.lark(&tok, 151_936, &l).unwrap(),
        &tok,
        r#"add[ARGS]{"a": 2, "b": 3}"#
    )
    .is_some());
}
