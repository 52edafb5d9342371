//! Tokenizer, streaming detokenizer and chat template on the fixtures' GPT-2-derived vocabulary.

mod common;

use common::*;
use perch_engine::tokenizer::{ChatMessage, StreamDecoder};

#[test]
fn stream_decoder_never_emits_broken_utf8_and_loses_nothing() {
    let model = load_fixture("llama");
    let tok = &model.tokenizer;
    // Emoji and accented letters are split across byte-level tokens.
    let text = "Perch 🐦 sings: naïve café — 日本語 ok 👍🏽!";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > text.chars().count() / 2);
    let mut dec = StreamDecoder::new();
    let mut pieces = Vec::new();
    for &id in &ids {
        let piece = dec.push(tok, id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "piece {piece:?} holds a broken character");
        pieces.push(piece);
    }
    pieces.push(dec.flush(tok).unwrap());
    assert_eq!(pieces.concat(), text);
    // Not held back longer than needed: every ASCII-only token is emitted at once.
    let mut dec = StreamDecoder::new();
    for &id in &tok.encode(" plain words here", false).unwrap() {
        assert!(!dec.push(tok, id).unwrap().is_empty(), "an ASCII token was held back");
    }
}

#[test]
fn a_dangling_partial_character_is_flushed_not_lost() {
    let model = load_fixture("llama");
    let tok = &model.tokenizer;
    let ids = tok.encode("🐦", false).unwrap();
    assert!(ids.len() >= 2, "the emoji should span byte tokens");
    let mut dec = StreamDecoder::new();
    let held: String = ids[..ids.len() - 1].iter().map(|&id| dec.push(tok, id).unwrap()).collect();
    assert_eq!(held, "", "a partial character was emitted");
    assert_eq!(dec.flush(tok).unwrap(), "\u{FFFD}");
}

#[test]
fn chat_template_renders_like_transformers() {
    let model = load_fixture("qwen3");
    let msgs = vec![
        ChatMessage { role: "system".into(), content: "Be brief.".into() },
        ChatMessage { role: "user".into(), content: "Hi there".into() },
    ];
    let text = model.tokenizer.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = model.tokenizer.encode_chat(&msgs).unwrap();
    assert_eq!(model.tokenizer.decode(&ids).unwrap(), text);
}

#[test]
fn a_model_without_template_says_so() {
    let model = load_fixture("llama");
    assert!(!model.tokenizer.has_chat_template());
    let err = model.tokenizer.apply_chat_template(&[], true).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
}

#[test]
fn eos_ids_come_from_config_and_tokenizer() {
    let model = load_fixture("qwen3");
    assert_eq!(model.tokenizer.eos_ids(), vec![4095]);
    assert!(model.tokenizer.is_eos(4095));
}
