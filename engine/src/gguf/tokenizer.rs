//! A GGUF vocabulary as a Hugging Face `tokenizer.json` that tokenizes the way llama.cpp does.
//!
//! - `llama` (SentencePiece): llama.cpp repeatedly merges the adjacent pair whose concatenation
//!   is the highest-scoring piece, then falls back to `<0xXX>` byte tokens. A BPE model whose
//!   merges are every split of every piece, ranked by that piece's score, makes the same
//!   choices; byte fallback and the `▁` space marker complete it.
//! - `gpt2` (byte-level BPE): vocabulary and merges as stored, with the pre-tokenizer regex
//!   llama.cpp uses for the file's `tokenizer.ggml.pre`.
//!
//! Control tokens become special added tokens (matched in text only when special tokens are
//! parsed), user-defined ones plain added tokens (always matched), as llama.cpp treats them.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::GgufFile;
use crate::error::{EngineError, Result};

const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_BYTE: i64 = 6;

/// What the importer needs besides tokenizer.json.
pub struct ConvertedTokenizer {
    pub tokenizer_json: Value,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub add_bos_token: bool,
    pub chat_template: Option<String>,
}

pub fn convert(g: &GgufFile) -> Result<ConvertedTokenizer> {
    let bad = |msg: String| EngineError::Tokenizer(format!("{}: {msg}", g.path.display()));
    let model =
        g.str("tokenizer.ggml.model").ok_or_else(|| bad("no tokenizer.ggml.model".into()))?;
    let tokens: Vec<String> = g
        .metadata
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("no tokenizer.ggml.tokens".into()))?
        .iter()
        .map(|t| t.as_str().unwrap_or_default().to_string())
        .collect();
    let types: Vec<i64> =
        match g.metadata.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()) {
            Some(t) => t.iter().map(|v| v.as_i64().unwrap_or(TYPE_NORMAL)).collect(),
            None => vec![TYPE_NORMAL; tokens.len()],
        };
    if types.len() != tokens.len() {
        return Err(bad(format!(
            "tokenizer.ggml.token_type has {} entries for {} tokens",
            types.len(),
            tokens.len()
        )));
    }
    let token = |key: &str| g.u64(key).and_then(|id| tokens.get(id as usize).cloned());
    let bos_token = token("tokenizer.ggml.bos_token_id");
    let eos_token = token("tokenizer.ggml.eos_token_id");
    let add_bos = g
        .metadata
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(model == "llama");
    let add_eos =
        g.metadata.get("tokenizer.ggml.add_eos_token").and_then(|v| v.as_bool()).unwrap_or(false);

    let added_tokens: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, t))| matches!(**t, TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN))
        .map(|(id, (content, t))| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": *t != TYPE_USER_DEFINED})
        })
        .collect();

    let (normalizer, pre_tokenizer, model_json, decoder) = match model {
        "llama" => spm(g, &tokens, &types)?,
        "gpt2" => byte_level_bpe(g, &tokens)?,
        other => {
            return Err(bad(format!(
                "tokenizer model `{other}` is not supported (llama/SentencePiece and gpt2/BPE are)"
            )))
        }
    };
    let mut single = vec![];
    if add_bos {
        single.push(
            json!({"SpecialToken": {"id": bos_token.clone().unwrap_or_default(), "type_id": 0}}),
        );
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if add_eos {
        single.push(
            json!({"SpecialToken": {"id": eos_token.clone().unwrap_or_default(), "type_id": 0}}),
        );
    }
    let mut special_tokens = serde_json::Map::new();
    for (on, tok) in [(add_bos, &bos_token), (add_eos, &eos_token)] {
        if let (true, Some(t)) = (on, tok) {
            let id = tokens.iter().position(|x| x == t).unwrap_or(0);
            special_tokens.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
        }
    }
    let post_processor = json!({
        "type": "TemplateProcessing", "single": single,
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": special_tokens,
    });
    let tokenizer_json = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor, "decoder": decoder, "model": model_json,
    });
    Ok(ConvertedTokenizer {
        tokenizer_json,
        bos_token,
        eos_token,
        add_bos_token: add_bos,
        chat_template: g.str("tokenizer.chat_template").map(String::from),
    })
}

type Parts = (Value, Value, Value, Value);

fn spm(g: &GgufFile, tokens: &[String], types: &[i64]) -> Result<Parts> {
    let scores: Vec<f64> = match g.metadata.get("tokenizer.ggml.scores").and_then(|v| v.as_array())
    {
        Some(s) => s.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
        None => vec![0.0; tokens.len()],
    };
    if scores.len() != tokens.len() {
        return Err(EngineError::Tokenizer(format!(
            "{}: tokenizer.ggml.scores has {} entries for {} tokens",
            g.path.display(),
            scores.len(),
            tokens.len()
        )));
    }
    let add_space_prefix =
        g.metadata.get("tokenizer.ggml.add_space_prefix").and_then(|v| v.as_bool()).unwrap_or(true);
    let mut vocab = serde_json::Map::new();
    let mut mergeable: HashMap<&str, usize> = HashMap::new();
    for (id, (t, ty)) in tokens.iter().zip(types).enumerate() {
        vocab.entry(t.clone()).or_insert(json!(id));
        if *ty == TYPE_NORMAL {
            mergeable.entry(t.as_str()).or_insert(id);
        }
    }
    // Every split of every normal piece into two mergeable pieces, best-scoring piece first.
    let mut merges: Vec<(f64, usize, &str, &str)> = Vec::new();
    for (piece, &id) in &mergeable {
        for (at, _) in piece.char_indices().skip(1) {
            let (a, b) = piece.split_at(at);
            if mergeable.contains_key(a) && mergeable.contains_key(b) {
                merges.push((scores[id], id, a, b));
            }
        }
    }
    merges.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.len().cmp(&y.2.len())));
    let merges: Vec<Value> = merges.iter().map(|(_, _, a, b)| json!([a, b])).collect();
    let unk = tokens.iter().zip(types).find(|(_, t)| **t == TYPE_UNKNOWN).map(|(s, _)| s.clone());
    let has_bytes = types.contains(&TYPE_BYTE);

    let mut normalizers = vec![];
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok((
        json!({"type": "Sequence", "normalizers": normalizers}),
        Value::Null,
        json!({"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
               "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": has_bytes,
               "ignore_merges": false, "vocab": vocab, "merges": merges}),
        json!({"type": "Sequence", "decoders": decoders}),
    ))
}

/// The pre-tokenizer split of each `tokenizer.ggml.pre` llama.cpp knows, as written in the
/// models' own tokenizer.json files.
fn bpe_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "default" | "gpt-2" | "gpt2" => {
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
        }
        "llama-bpe" | "llama3" => {
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        }
        "qwen2" => {
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        }
        "qwen35" => {
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        }
        _ => return None,
    })
}

fn byte_level_bpe(g: &GgufFile, tokens: &[String]) -> Result<Parts> {
    let pre = g.str("tokenizer.ggml.pre").unwrap_or("default");
    let regex = bpe_regex(pre).ok_or_else(|| {
        EngineError::Tokenizer(format!(
            "{}: BPE pre-tokenizer `{pre}` is not supported (gpt-2, llama-bpe, qwen2, qwen35 are)",
            g.path.display()
        ))
    })?;
    let merges: Vec<Value> = g
        .metadata
        .get("tokenizer.ggml.merges")
        .and_then(|v| v.as_array())
        .map(|m| {
            m.iter()
                .filter_map(|s| s.as_str())
                .filter_map(|s| s.split_once(' '))
                .map(|(a, b)| json!([a, b]))
                .collect()
        })
        .unwrap_or_default();
    let mut vocab = serde_json::Map::new();
    for (id, t) in tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(json!(id));
    }
    Ok((
        Value::Null,
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]}),
        json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
               "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
               "ignore_merges": pre == "llama-bpe", "vocab": vocab, "merges": merges}),
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
    ))
}
