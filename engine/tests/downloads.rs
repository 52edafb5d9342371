//! Model downloads against a local server speaking the hub's API on loopback (`/api/models/
//! {repo}/revision/{rev}` listings with sizes, `/{repo}/resolve/{sha}/{file}` with etags and
//! ranges): a full download, a connection cut mid-file and resumed, an interrupted download
//! resumed by a second one, a cancel that leaves nothing behind, and a missing repo.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::hub::{hub, REPO};
use common::*;
use perch_engine::download::{Downloads, JobView, State as JobState};

async fn finish(d: &Downloads, id: u64) -> JobView {
    let t = Instant::now();
    loop {
        let j = d.get(id).unwrap();
        if j.state != JobState::Running {
            return j;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "download stuck: {j:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn same_as_fixture(dir: &Path) {
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(dir.join(f)).unwrap(),
            std::fs::read(fixture_dir("qwen3").join(f)).unwrap(),
            "{f}"
        );
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.ends_with(".part")
            && !n.ends_with(".etag")
            && (!n.starts_with('.') || n == perch_engine::catalog::INSTALLED_MARKER)),
        "leftovers: {names:?}"
    );
    assert!(perch_engine::catalog::installed_by_perch(dir), "marked as Perch's own: {names:?}");
    assert!(!names.contains(&"README.md".to_string()), "only model files are fetched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_download_installs_a_model_that_loads() {
    let (hub, url) = hub().await;
    let models = tempfile::tempdir().unwrap();
    let d = Downloads::new();
    let job = d.start(REPO, None, &url, models.path()).unwrap();
    let j = finish(&d, job.id).await;
    assert_eq!(j.state, JobState::Done, "{j:?}");
    let total: u64 = hub.files.values().map(|b| b.len() as u64).sum();
    assert_eq!((j.bytes_done, j.bytes_total, j.resumed_bytes), (total, total, 0));
    let dir = models.path().join("tiny-qwen3");
    same_as_fixture(&dir);
    assert!(!models.path().join(".downloads/perch-test--tiny-qwen3").exists());
    perch_engine::load_model_as(&dir, perch_engine::platform::ComputeDtype::F32)
        .expect("the downloaded model loads");
    // Downloading it again is refused rather than overwriting it.
    assert!(d
        .start(REPO, None, &url, models.path())
        .unwrap_err()
        .to_string()
        .contains("already installed"));
    // Another organisation's model of the same name is not this one: refused, not "installed".
    let e = d.start("someone-else/tiny-qwen3", None, &url, models.path()).unwrap_err();
    assert!(
        matches!(&e, perch_engine::download::DownloadError::NameTaken { from, .. } if from.contains(REPO)),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_resumes_where_it_stopped() {
    let (hub, url) = hub().await;
    hub.cut_at.store(600_000, Ordering::Relaxed);
    hub.cuts_left.store(2, Ordering::Relaxed);
    let models = tempfile::tempdir().unwrap();
    let d = Downloads::new();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Done, "{j:?}");
    let ranges = hub.ranges.lock().unwrap().clone();
    assert_eq!(ranges.len(), 2, "each cut is resumed with a Range request: {ranges:?}");
    assert!(
        ranges[0].starts_with("model.safetensors bytes=") && !ranges[0].ends_with("bytes=0-"),
        "{ranges:?}"
    );
    assert!(j.resumed_bytes >= 600_000, "{j:?}");
    same_as_fixture(&models.path().join("tiny-qwen3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_download_is_resumed_by_the_next_one() {
    let (hub, url) = hub().await;
    // Every attempt is cut: the download gives up, keeping what it has.
    hub.cut_at.store(100_000, Ordering::Relaxed);
    hub.cuts_left.store(1_000, Ordering::Relaxed);
    let models = tempfile::tempdir().unwrap();
    let d = Downloads::new();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(j.error.as_deref().unwrap().contains("start it again to resume"), "{j:?}");
    let part = models.path().join(".downloads/perch-test--tiny-qwen3/model.safetensors.part");
    let kept =
        std::fs::metadata(&part).unwrap_or_else(|e| panic!("{e}: {:?}", walk(models.path()))).len();
    assert!(kept >= 100_000, "the part file keeps what arrived: {kept}");
    assert!(!models.path().join("tiny-qwen3").exists(), "nothing half-done is installed");

    hub.cuts_left.store(0, Ordering::Relaxed);
    hub.ranges.lock().unwrap().clear();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Done, "{j:?}");
    assert!(
        hub.ranges.lock().unwrap()[0].ends_with(&format!("bytes={kept}-")),
        "{:?}",
        hub.ranges.lock().unwrap()
    );
    assert!(j.resumed_bytes >= kept);
    same_as_fixture(&models.path().join("tiny-qwen3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_download_leaves_nothing_behind() {
    let (hub, url) = hub().await;
    hub.slow_ms.store(40, Ordering::Relaxed);
    let models = tempfile::tempdir().unwrap();
    let d = Downloads::new();
    let id = d.start(REPO, None, &url, models.path()).unwrap().id;
    let t = Instant::now();
    while d.get(id).unwrap().bytes_done < 100_000 {
        assert!(t.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(d.cancel(id));
    let j = finish(&d, id).await;
    assert_eq!(j.state, JobState::Cancelled, "{j:?}");
    assert!(j.bytes_done < j.bytes_total, "cancelled mid-way: {j:?}");
    let left: Vec<_> = walk(models.path());
    assert!(left.is_empty(), "nothing half-written remains: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_repo_fails_clearly_and_writes_nothing() {
    let (hub, url) = hub().await;
    let models = tempfile::tempdir().unwrap();
    let d = Downloads::new();
    let j = finish(&d, d.start("perch-test/no-such-model", None, &url, models.path()).unwrap().id)
        .await;
    assert_eq!(j.state, JobState::Failed);
    assert!(j.error.as_deref().unwrap().contains("was not found"), "{j:?}");
    assert!(walk(models.path()).is_empty());
    assert_eq!(hub.requests.load(Ordering::Relaxed), 0, "no file was requested");
    assert!(d.start("not a repo", None, &url, models.path()).is_err());
    assert!(d.start("../etc", None, &url, models.path()).is_err());
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            let inner = walk(&p);
            out.push(p.display().to_string());
            out.extend(inner);
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_that_lies_gets_nothing_installed() {
    let weights = "model.safetensors";
    // More bytes than it listed: never written past the listed size, and not installed.
    let (h, url) = common::hub::hub().await;
    let listed = h.files[weights].len() as u64 - 100;
    h.listed_size.lock().unwrap().insert(weights.into(), listed);
    let models = tempfile::tempdir().unwrap();
    let d = Downloads::new();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(j.error.as_deref().unwrap().contains("longer than the listed"), "{j:?}");
    assert!(!models.path().join("tiny-qwen3").exists());
    for f in walk(models.path()) {
        let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        assert!(len <= listed, "{f} has {len} bytes, past the listed {listed}");
    }

    // A file whose bytes do not hash to the listed sha256.
    let (h, url) = common::hub::hub().await;
    h.listed_sha256.lock().unwrap().insert(weights.into(), "ab".repeat(32));
    let models = tempfile::tempdir().unwrap();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(j.error.as_deref().unwrap().contains("sha256"), "{j:?}");
    assert!(!models.path().join("tiny-qwen3").exists());

    // Weights listed without a size (nor an LFS entry): nothing bounds or checks them.
    let (h, url) = common::hub::hub().await;
    h.unlisted.lock().unwrap().push(weights.into());
    let models = tempfile::tempdir().unwrap();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(j.error.as_deref().unwrap().contains("no size"), "{j:?}");
    assert_eq!(h.requests.load(Ordering::Relaxed), 0, "no file was requested");
    assert!(!models.path().join("tiny-qwen3").exists());

    // A listing past the cap.
    let (h, url) = common::hub::hub().await;
    h.listing_pad.store(17 << 20, Ordering::Relaxed);
    let models = tempfile::tempdir().unwrap();
    let j = finish(&d, d.start(REPO, None, &url, models.path()).unwrap().id).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(j.error.as_deref().unwrap().contains("larger than"), "{j:?}");
    assert_eq!(h.requests.load(Ordering::Relaxed), 0, "no file was requested");

    // Plain http is for this machine only.
    for insecure in ["http://example.com", "http://192.168.1.5:8080", "ftp://127.0.0.1", "nonsense"]
    {
        let e = d.start(REPO, None, insecure, models.path()).unwrap_err().to_string();
        assert!(e.contains("https"), "{insecure}: {e}");
    }
    for (repo, local) in
        [("perch-test/a", "http://localhost:1"), ("perch-test/b", "http://[::1]:1")]
    {
        assert!(d.start(repo, None, local, models.path()).is_ok(), "{local}");
    }
}
