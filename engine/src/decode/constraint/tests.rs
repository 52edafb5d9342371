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
