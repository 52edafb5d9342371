//! Tokenizer, streaming detokenizer and chat template on the fixtures' GPT-2-derived vocabulary.

mod common;

use common::*;
use perch_engine::chat::ChatMessage;
use perch_engine::tokenizer::StreamDecoder;

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
    let msgs = vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi there")];
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

/// A fixture copy whose chat template is `template`.
fn with_template(template: &str) -> (tempfile::TempDir, perch_engine::LoadedModel) {
    let (tmp, dir) = copy_fixture("qwen3", "hostile");
    let cfg = dir.join("tokenizer_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["chat_template"] = template.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    let model = perch_engine::load_model(&dir).unwrap();
    (tmp, model)
}

#[test]
fn a_hostile_chat_template_is_an_error_not_a_hang() {
    let hi = [ChatMessage::new("user", "hi")];
    // Two nested range(100000) loops once froze the whole server while memory grew.
    let (_t, m) = with_template(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    );
    let t = std::time::Instant::now();
    let e = m.tokenizer.apply_chat_template(&hi, true).unwrap_err().to_string();
    assert!(e.contains("budget"), "{e}");
    println!("the looping template stopped after {:.2} s", t.elapsed().as_secs_f64());
    // Output that doubles each step: stopped by the output cap long before memory runs out.
    let (_t, m) = with_template("{% set s = namespace(x='0123456789abcdef') %}{% for i in range(40) %}{{ s.x }}{% set s.x = s.x ~ s.x %}{% endfor %}");
    let e = m.tokenizer.apply_chat_template(&hi, true).unwrap_err().to_string();
    assert!(e.contains("wrote more than"), "{e}");
    // A template that refuses the conversation is the request's fault (a 400 at the API);
    // one that fails otherwise is the model's (a 500).
    let (_t, m) = with_template("{{ raise_exception('Conversation roles must alternate') }}");
    let e = m.tokenizer.apply_chat_template(&hi, true).unwrap_err();
    assert!(
        matches!(&e, perch_engine::EngineError::TemplateRejected(m) if m == "Conversation roles must alternate"),
        "{e:?}"
    );
    let api = perch_engine::server::error::ApiError::engine(&e, "messages");
    assert_eq!((api.status.as_u16(), api.param.as_deref()), (400, Some("messages")));
    let (_t, m) = with_template("{{ messages[0].content | no_such_filter }}");
    let e = m.tokenizer.apply_chat_template(&hi, true).unwrap_err();
    assert!(matches!(&e, perch_engine::EngineError::Template(_)), "{e:?}");
    assert_eq!(perch_engine::server::error::ApiError::engine(&e, "messages").status.as_u16(), 500);
    // A real template still renders.
    let (_t, m) = with_template("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
    assert_eq!(m.tokenizer.apply_chat_template(&hi, true).unwrap(), "<user>hi");
}
