//! The host copies' file (`model/host_matrix/store.rs`): a second load reads the
//! copies the first one recovered and computes the same logits; a corrupt, truncated or
//! foreign file, or weights changed since, make the load recover them again (and replace
//! the file), never fail. One test in its own binary: it points the cache at a temporary
//! directory for the process.

// The host path is off on macOS (Metal runs MLX's own ops), so this binary is empty there.
#![cfg(not(target_os = "macos"))]

mod common;

use common::*;
use mlx_rs::Array;
use perch_engine::model::{load_model, HostCopyCounts, LoadedModel};

/// Logits of the prompt's last position and of a few one-token steps after it.
fn logits(model: &LoadedModel) -> Vec<f32> {
    let mut caches = model.net.new_caches();
    let prompt: Vec<u32> = (1..30).map(|i| (i * 37) % 200 + 3).collect();
    let mut out = vec![];
    let mut x = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    for t in [5u32, 77, 140] {
        let l = model.net.forward(&x, &mut caches).unwrap();
        l.eval().unwrap();
        out.extend_from_slice(l.as_slice::<f32>());
        x = Array::from_slice(&[t], &[1, 1]);
    }
    out
}

fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

#[test]
fn a_second_load_reads_the_copies_and_a_bad_file_is_replaced() {
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("PERCH_CACHE_DIR", cache.path());
    std::env::remove_var("PERCH_NO_HOST_HEAD");
    let store = cache.path().join("host-copies");
    let (_tmp, dir) = rounded_fixture_copy("qwen2");

    let first = load_model(&dir).unwrap();
    let HostCopyCounts { recovered, reused } = first.host_copies;
    assert!(recovered > 0 && reused == 0, "{:?}", first.host_copies);
    let want = logits(&first);
    drop(first);
    let written = files(&store);
    assert_eq!(written.len(), 1, "{written:?}");

    let again = |what: &str, expect: HostCopyCounts| {
        let m = load_model(&dir).unwrap();
        assert_eq!(m.host_copies, expect, "{what}");
        assert_eq!(logits(&m), want, "{what}: logits differ from the first load's");
    };
    let from_file = HostCopyCounts { recovered: 0, reused: recovered };
    let rebuilt = HostCopyCounts { recovered, reused: 0 };
    again("second load", from_file);

    // One flipped byte in the data: the checksum fails, the copies are recovered again and
    // the file is rewritten, so the load after reads it.
    let file = &written[0];
    let mut bytes = std::fs::read(file).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(file, &bytes).unwrap();
    again("flipped byte", rebuilt);
    again("after the rewrite", from_file);

    // Truncated, then foreign bytes under the same name.
    let len = std::fs::metadata(file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(file).unwrap().set_len(len / 2).unwrap();
    again("truncated", rebuilt);
    std::fs::write(file, b"PERCHHC1 not really").unwrap();
    again("foreign", rebuilt);
    again("after the second rewrite", from_file);

    // Weights rewritten since (a re-import): a new key; the old file is removed.
    let weights = dir.join("model.safetensors");
    let data = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, data).unwrap();
    // An explicit time: a filesystem's clock granularity must not decide whether it changed.
    let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options().write(true).open(&weights).unwrap().set_modified(then).unwrap();
    again("weights rewritten", rebuilt);
    let now = files(&store);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], *file);

    // With the host path off nothing is read or written.
    std::env::set_var("PERCH_NO_HOST_HEAD", "1");
    let off = load_model(&dir).unwrap();
    assert_eq!(off.host_copies, HostCopyCounts::default());
}
