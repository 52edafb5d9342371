//! GGUF files are downloaded from anywhere: a crafted one must be an error naming the file and
//! what is wrong, never a panic, an abort or an allocation the size of a lie. Crafted cases
//! for each hole found once, then random mutations of a small valid file through the whole
//! import (reader, vocabulary converter, config translation, weights).

use std::path::Path;

use perch_engine::gguf::import::{import, ImportOptions, Quantize, StoreDtype};
use proptest::prelude::*;

/// A metadata value as GGUF writes it: its type id and its little-endian payload.
struct Kv(String, u32, Vec<u8>);

fn gstr(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

fn kv_u32(k: &str, v: u32) -> Kv {
    Kv(k.into(), 4, v.to_le_bytes().to_vec())
}

fn kv_str(k: &str, v: &str) -> Kv {
    Kv(k.into(), 8, gstr(v))
}

/// An array of `item`-typed values already encoded in `payload`.
fn kv_array(k: &str, item: u32, n: u64, payload: &[u8]) -> Kv {
    let mut b = item.to_le_bytes().to_vec();
    b.extend_from_slice(&n.to_le_bytes());
    b.extend_from_slice(payload);
    Kv(k.into(), 9, b)
}

/// A tiny but complete llama-architecture GGUF (SentencePiece vocabulary, one layer, F32
/// tensors), with `edit` applied to its metadata before writing.
fn tiny_gguf(edit: impl FnOnce(&mut Vec<Kv>)) -> Vec<u8> {
    let (hidden, ffn, heads, vocab) = (8u64, 16u64, 2u32, 8u64);
    let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "▁ab"];
    let mut meta = vec![
        kv_str("general.architecture", "llama"),
        kv_u32("llama.embedding_length", hidden as u32),
        kv_u32("llama.feed_forward_length", ffn as u32),
        kv_u32("llama.attention.head_count", heads),
        kv_u32("llama.attention.head_count_kv", heads),
        kv_u32("llama.block_count", 1),
        kv_u32("llama.context_length", 64),
        kv_str("tokenizer.ggml.model", "llama"),
        kv_array(
            "tokenizer.ggml.tokens",
            8,
            vocab,
            &tokens.iter().flat_map(|t| gstr(t)).collect::<Vec<_>>(),
        ),
        kv_array(
            "tokenizer.ggml.scores",
            6,
            vocab,
            &(0..vocab).flat_map(|i| (-(i as f32)).to_le_bytes()).collect::<Vec<_>>(),
        ),
        kv_array(
            "tokenizer.ggml.token_type",
            5,
            vocab,
            &[2i32, 3, 3, 1, 1, 1, 1, 1].iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>(),
        ),
        kv_u32("tokenizer.ggml.bos_token_id", 1),
        kv_u32("tokenizer.ggml.eos_token_id", 2),
    ];
    edit(&mut meta);
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![hidden, vocab]),
        ("output_norm.weight".into(), vec![hidden]),
    ];
    for (n, shape) in [
        ("attn_norm", vec![hidden]),
        ("attn_q", vec![hidden, hidden]),
        ("attn_k", vec![hidden, hidden]),
        ("attn_v", vec![hidden, hidden]),
        ("attn_output", vec![hidden, hidden]),
        ("ffn_norm", vec![hidden]),
        ("ffn_gate", vec![hidden, ffn]),
        ("ffn_up", vec![hidden, ffn]),
        ("ffn_down", vec![ffn, hidden]),
    ] {
        tensors.push((format!("blk.0.{n}.weight"), shape));
    }
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for Kv(k, t, payload) in &meta {
        out.extend(gstr(k));
        out.extend_from_slice(&t.to_le_bytes());
        out.extend_from_slice(payload);
    }
    let mut offset = 0u64;
    let mut data = Vec::new();
    for (i, (name, ne)) in tensors.iter().enumerate() {
        out.extend(gstr(name));
        out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.extend_from_slice(&0u32.to_le_bytes()); // F32
        out.extend_from_slice(&offset.to_le_bytes());
        let n: u64 = ne.iter().product();
        data.extend(
            (0..n).flat_map(|j| (((i as u64 * 31 + j) % 17) as f32 * 0.01 - 0.08).to_le_bytes()),
        );
        while data.len() % 32 != 0 {
            data.push(0);
        }
        offset = data.len() as u64;
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    out.extend(data);
    out
}

fn write(dir: &Path, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join("crafted.gguf");
    std::fs::write(&p, bytes).unwrap();
    p
}

fn import_err(bytes: &[u8]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let path = write(tmp.path(), bytes);
    let opts = ImportOptions {
        name: Some("m".into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: false,
    };
    let e = import(&path, &tmp.path().join("models"), &opts)
        .expect_err("a crafted GGUF imported")
        .to_string();
    assert!(e.contains("crafted.gguf"), "the error does not name the file: {e}");
    let left: Vec<_> =
        std::fs::read_dir(tmp.path().join("models")).map(|d| d.collect()).unwrap_or_default();
    assert!(left.is_empty(), "a failed import left {left:?}");
    e
}

fn set(meta: &mut [Kv], key: &str, kv: Kv) {
    *meta.iter_mut().find(|k| k.0 == key).unwrap() = kv;
}

#[test]
fn the_tiny_gguf_imports_and_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write(tmp.path(), &tiny_gguf(|_| {}));
    let opts = ImportOptions {
        name: Some("tiny".into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: false,
    };
    let dir = import(&path, &tmp.path().join("models"), &opts).unwrap();
    let model = perch_engine::load_model(&dir).unwrap();
    let ids = model.tokenizer.encode("a ab", false).unwrap();
    assert_eq!(ids, [6, 7]);
    assert_eq!(model.tokenizer.decode(&ids).unwrap(), "a ab");
}

#[test]
fn concurrent_imports_of_one_name_never_share_or_delete_each_others_work() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write(tmp.path(), &tiny_gguf(|_| {}));
    let models = tmp.path().join("models");
    for overwrite in [false, true] {
        let _ = std::fs::remove_dir_all(&models);
        let opts = ImportOptions {
            name: Some("same".into()),
            quantize: Quantize::None,
            dtype: StoreDtype::F32,
            overwrite,
        };
        let results: Vec<_> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..4).map(|_| s.spawn(|| import(&path, &models, &opts))).collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(!overwrite && e.to_string().contains("already exists"), "{e}");
        }
        // Without overwrite one import wins and the rest are told; with it, all succeed.
        assert!(if overwrite { ok == 4 } else { ok >= 1 }, "{results:?}");
        let model = perch_engine::load_model(&models.join("same")).unwrap();
        assert_eq!(model.tokenizer.encode("a ab", false).unwrap(), [6, 7]);
        assert!(perch_engine::catalog::installed_by_perch(&models.join("same")));
        let left: Vec<_> = std::fs::read_dir(&models)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["same"], "temporary folders left behind");
    }
}

#[test]
fn an_import_killed_midway_is_cleaned_up_by_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write(tmp.path(), &tiny_gguf(|_| {}));
    let models = tmp.path().join("models");
    // What `kill -9` leaves: a temp folder named after a process that is gone; and one of a
    // live import (this process) that must be left alone.
    let dead = models.join(".import-tiny-999999999-0");
    let live = models.join(format!(".import-tiny-{}-77", std::process::id()));
    for d in [&dead, &live] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("model.safetensors"), b"half").unwrap();
    }
    let opts = ImportOptions {
        name: Some("tiny".into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: false,
    };
    import(&path, &models, &opts).unwrap();
    assert!(!dead.exists(), "the dead import's folder was left");
    assert!(live.exists(), "a live import's folder was removed");
}

#[test]
fn crafted_headers_are_errors() {
    // A tensor count of 2^44 in a 24-byte file once asked for 1 PB up front and aborted.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 44).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    let e = import_err(&b);
    assert!(e.contains("tensor count"), "{e}");
    // Arrays nested in arrays once recursed until the stack overflowed.
    let mut nested = Vec::new();
    for _ in 0..200_000 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    let e = import_err(&tiny_gguf(|m| m.push(Kv("x.nested".into(), 9, nested))));
    assert!(e.contains("arrays of arrays") && e.contains("x.nested"), "{e}");
    // An alignment of 0 once divided by zero; 48 is no power of two either.
    for a in [0, 48] {
        let e = import_err(&tiny_gguf(|m| m.push(kv_u32("general.alignment", a))));
        assert!(e.contains("general.alignment"), "{e}");
    }
    // A head count of 0 once divided by zero translating the config.
    let e = import_err(&tiny_gguf(|m| {
        set(m, "llama.attention.head_count", kv_u32("llama.attention.head_count", 0))
    }));
    assert!(e.contains("llama.attention.head_count") && e.contains("is 0"), "{e}");
    let e = import_err(&tiny_gguf(|m| {
        set(m, "llama.attention.head_count_kv", kv_u32("llama.attention.head_count_kv", 3))
    }));
    assert!(e.contains("head_count_kv"), "{e}");
    // A scores array shorter than the vocabulary once indexed out of bounds.
    let e = import_err(&tiny_gguf(|m| {
        set(m, "tokenizer.ggml.scores", kv_array("tokenizer.ggml.scores", 6, 2, &[0u8; 8]))
    }));
    assert!(e.contains("tokenizer.ggml.scores") && e.contains("2 entries"), "{e}");
    // An array claiming more items than the file holds.
    let e = import_err(&tiny_gguf(|m| m.push(kv_array("x.long", 4, 1 << 40, &[]))));
    assert!(e.contains("x.long"), "{e}");
    // A string longer than the file.
    let e = import_err(&tiny_gguf(|m| {
        m.push(Kv("x.s".into(), 8, (1u64 << 40).to_le_bytes().to_vec()))
    }));
    assert!(e.contains("x.s"), "{e}");
}

#[test]
fn a_tensor_shape_that_overflows_is_an_error() {
    let good = tiny_gguf(|_| {});
    // The first tensor's first dimension: find "token_embd.weight", then n_dims (u32), then ne[0].
    let at = good.windows(17).position(|w| w == b"token_embd.weight").unwrap() + 17 + 4;
    for d in [u64::MAX, 1 << 40, 0] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&d.to_le_bytes());
        let e = import_err(&b);
        assert!(e.contains("token_embd.weight"), "dimension {d}: {e}");
    }
}

/// Cases the mutation test below runs (each one a full import of the mutated file).
const FUZZ_CASES: u32 = 4000;

#[test]
fn mutated_ggufs_never_panic() {
    use proptest::test_runner::{Config, TestRunner};
    use std::cell::Cell;
    let good = tiny_gguf(|_| {});
    // Bytes, and whole little-endian words set to extreme values (counts, lengths, offsets),
    // then maybe a cut.
    let edit = (any::<prop::sample::Index>(), any::<u8>(), 0usize..4);
    let strategy =
        (prop::collection::vec(edit, 1..8), prop::option::of(any::<prop::sample::Index>()));
    let (imported, refused) = (Cell::new(0), Cell::new(0));
    let mut runner = TestRunner::new(Config {
        cases: FUZZ_CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(edits, cut)| {
            let mut b = good.clone();
            for (at, byte, kind) in edits {
                let i = at.index(b.len());
                let (j8, j4) = (i.min(b.len() - 8), i.min(b.len() - 4));
                match kind {
                    0 => b[i] = byte,
                    1 => b[j8..j8 + 8].copy_from_slice(&u64::MAX.to_le_bytes()),
                    2 => b[j8..j8 + 8].copy_from_slice(&(1u64 << (byte % 64)).to_le_bytes()),
                    _ => b[j4..j4 + 4].copy_from_slice(&u32::from(byte).to_le_bytes()),
                }
            }
            if let Some(c) = cut {
                b.truncate(c.index(b.len()));
            }
            let tmp = tempfile::tempdir().unwrap();
            let path = write(tmp.path(), &b);
            let opts = ImportOptions {
                name: Some("m".into()),
                quantize: Quantize::None,
                dtype: StoreDtype::F32,
                overwrite: false,
            };
            match import(&path, &tmp.path().join("models"), &opts) {
                Ok(_) => imported.set(imported.get() + 1),
                Err(e) => {
                    refused.set(refused.get() + 1);
                    prop_assert!(
                        e.to_string().contains("crafted.gguf"),
                        "an error that names no file: {e}"
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    println!(
        "{FUZZ_CASES} mutated GGUFs: {} imported, {} refused with an error, no panic",
        imported.get(),
        refused.get()
    );
}
