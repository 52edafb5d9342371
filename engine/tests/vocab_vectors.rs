//! GGUF vocabularies converted to tokenizer.json tokenize exactly as llama.cpp does: every
//! test vector llama.cpp ships (`models/ggml-vocab-*.gguf` with `.inp`/`.out`, from the
//! llama-cpp-python sdist, unpacked into .deps/llama-vocab by scripts/setup-peers).

use std::path::PathBuf;

use perch_engine::gguf::{tokenizer::convert, GgufFile};

/// The vocabularies Perch converts: SentencePiece (llama, phi-3) and byte-level BPE with each
/// supported pre-tokenizer.
const VOCABS: &[&str] = &["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "qwen35"];

fn vocab_dir() -> PathBuf {
    std::env::var_os("PERCH_LLAMA_VOCAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/llama-vocab"))
}

/// (input, expected ids) pairs from llama.cpp's `.inp`/`.out` files.
fn vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    // Every case, the last included, is followed by the separator line.
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: .inp and .out disagree on the number of cases"
    );
    inputs.into_iter().map(String::from).zip(outputs).collect()
}

#[test]
fn every_llama_cpp_vector_matches() {
    if !vocab_dir().join("ggml-vocab-gpt-2.gguf").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must unpack the vocab vectors (scripts/setup-peers)"
        );
        eprintln!("SKIPPED: llama.cpp vocab vectors not found in {}", vocab_dir().display());
        return;
    }
    let mut failures = Vec::new();
    let mut total = 0;
    for name in VOCABS {
        let g = GgufFile::open(&vocab_dir().join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let converted = convert(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut tok = tokenizers::Tokenizer::from_bytes(converted.tokenizer_json.to_string())
            .unwrap_or_else(|e| panic!("{name}: tokenizer.json does not load: {e}"));
        // llama.cpp's vectors are made without parsing special tokens in the text.
        tok.set_encode_special_tokens(true);
        for (text, expected) in vectors(name) {
            total += 1;
            let got = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
            if got != expected {
                failures.push(format!(
                    "{name}: {text:?}\n  llama.cpp {expected:?}\n  perch     {got:?}"
                ));
            }
        }
        println!("{name}: checked");
    }
    println!("{total} vectors, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {total} vectors differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
