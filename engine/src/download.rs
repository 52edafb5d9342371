//! Model downloads from the Hugging Face hub (or a mirror speaking its API): the repo's file
//! list from `/api/models/{repo}/revision/{rev}`, each file from `/{repo}/resolve/{sha}/{file}`.
//! Files land in `<models>/.downloads/<org>--<name>/` as `.part` files; a cut connection is
//! resumed with a `Range` request (guarded by `If-Range` on the file's etag), a later
//! download of the same repo picks up the parts left by an interrupted one, and only a
//! complete model is renamed into the models directory. Cancelling removes the staging
//! directory: nothing half-written remains.
//!
//! The hub is as untrusted as any download: HTTPS only (plain HTTP on loopback, for mirrors
//! and tests), a capped listing, no file written past its listed size, and every file with a
//! listed sha256 checked before it is kept.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync::LockExt;
use futures_util::StreamExt;
use serde::Serialize;
use tokio::io::AsyncWriteExt;

/// Attempts per file before a download is marked failed (its parts stay for a resume).
const ATTEMPTS: u32 = 6;
/// Bytes a repository listing may take (a large real repo lists in well under 1 MB).
const LISTING_MAX_BYTES: usize = 16 << 20;
/// Finished jobs kept for the downloads list.
const FINISHED_KEPT: usize = 32;
/// The most a file the listing gives no size for may be (configs, tokenizers): a listing that
/// leaves sizes out must not let a file be written without bound.
const UNSIZED_MAX_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("`{0}` is not a hub repository id like `mlx-community/Qwen3-0.6B-4bit`")]
    BadRepo(String),
    #[error("`{0}` is already being downloaded")]
    AlreadyRunning(String),
    #[error("a model named `{0}` is already installed")]
    AlreadyInstalled(String),
    /// The id is taken by a model from elsewhere (another organisation's of the same name, an
    /// import): pulling must not report the other one as this one.
    #[error("a model named `{id}` is already installed from {from}, not from `{repo}`: delete it first to download this one")]
    NameTaken { id: String, from: String, repo: String },
    #[error("repository `{0}` was not found on {1} (or it is private or gated)")]
    NotFound(String, String),
    #[error("`{0}` has no safetensors weights and config.json: not a model Perch can run (GGUF files can be imported instead)")]
    NotAModel(String),
    #[error("{0}")]
    Http(String),
    #[error("the hub's listing gives no {1} for `{0}`: refusing to download weights that cannot be checked")]
    Unlisted(String, &'static str),
    #[error("`{0}` is not a hub to download from: use https (plain http only on this machine)")]
    Insecure(String),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("cancelled")]
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Running,
    Done,
    Failed,
    Cancelled,
}

/// What the UI shows for one download.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: u64,
    pub repo: String,
    pub model_id: String,
    pub state: State,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub file: String,
    pub error: Option<String>,
    /// Bytes that came from an earlier, interrupted attempt or a resumed connection.
    pub resumed_bytes: u64,
}

struct Job {
    id: u64,
    repo: String,
    model_id: String,
    cancel: AtomicBool,
    done: AtomicU64,
    total: AtomicU64,
    resumed: AtomicU64,
    state: Mutex<(State, Option<String>, String)>,
}

impl Job {
    fn view(&self) -> JobView {
        let (state, error, file) = self.state.locked().clone();
        JobView {
            id: self.id,
            repo: self.repo.clone(),
            model_id: self.model_id.clone(),
            state,
            bytes_done: self.done.load(Ordering::Relaxed),
            bytes_total: self.total.load(Ordering::Relaxed),
            file,
            error,
            resumed_bytes: self.resumed.load(Ordering::Relaxed),
        }
    }

    fn set(&self, state: State, error: Option<String>) {
        let mut s = self.state.locked();
        s.0 = state;
        s.1 = error;
    }
}

pub struct Downloads {
    jobs: Mutex<Vec<Arc<Job>>>,
    client: reqwest::Client,
    next: AtomicU64,
}

/// Which repo files a model needs.
fn wanted(name: &str) -> bool {
    !name.contains('/')
        && (name.ends_with(".safetensors")
            || name.ends_with(".json")
            || name.ends_with(".jinja")
            || matches!(name, "tokenizer.model" | "merges.txt" | "vocab.txt"))
}

fn valid_repo(repo: &str) -> bool {
    let parts: Vec<&str> = repo.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.len() <= 96
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

impl Downloads {
    pub fn new() -> Arc<Downloads> {
        // A redirect may not leave HTTPS (a CDN's plain-http mirror could hand anything back).
        let redirects = reqwest::redirect::Policy::custom(|a| {
            if a.previous().len() >= 10 {
                a.error("too many redirects")
            } else if secure(a.url()) {
                a.follow()
            } else {
                a.error("a redirect to plain http")
            }
        });
        let client = reqwest::Client::builder()
            .redirect(redirects)
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("perch/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("HTTP client");
        Arc::new(Downloads { jobs: Mutex::new(vec![]), client, next: AtomicU64::new(1) })
    }

    pub fn list(&self) -> Vec<JobView> {
        self.jobs.locked().iter().map(|j| j.view()).collect()
    }

    pub fn get(&self, id: u64) -> Option<JobView> {
        self.jobs.locked().iter().find(|j| j.id == id).map(|j| j.view())
    }

    /// Ask a running download to stop; it removes its staging directory.
    pub fn cancel(&self, id: u64) -> bool {
        let jobs = self.jobs.locked();
        jobs.iter().find(|j| j.id == id).map(|j| j.cancel.store(true, Ordering::Relaxed)).is_some()
    }

    pub fn cancel_all(&self) {
        self.jobs.locked().iter().for_each(|j| j.cancel.store(true, Ordering::Relaxed));
    }

    /// Start downloading `repo` (at `revision`, default `main`) from `endpoint` into
    /// `models_dir`, as the model id `repo`'s name part.
    pub fn start(
        self: &Arc<Self>,
        repo: &str,
        revision: Option<&str>,
        endpoint: &str,
        models_dir: &Path,
    ) -> Result<JobView, DownloadError> {
        if !valid_repo(repo) {
            return Err(DownloadError::BadRepo(repo.to_string()));
        }
        if !reqwest::Url::parse(endpoint).is_ok_and(|u| secure(&u)) {
            return Err(DownloadError::Insecure(endpoint.to_string()));
        }
        let model_id = repo.split('/').nth(1).unwrap_or(repo).to_string();
        installed_as(&models_dir.join(&model_id), &model_id, repo)?;
        let revision = revision.filter(|r| !r.is_empty()).unwrap_or("main").to_string();
        if !revision.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(DownloadError::BadRepo(format!("{repo}@{revision}")));
        }
        let job = {
            let mut jobs = self.jobs.locked();
            if jobs.iter().any(|j| j.repo == repo && j.view().state == State::Running) {
                return Err(DownloadError::AlreadyRunning(repo.to_string()));
            }
            // Keep the newest finished jobs; running ones always stay.
            let finished = jobs.iter().filter(|j| j.view().state != State::Running).count();
            let mut drop = finished.saturating_sub(FINISHED_KEPT - 1);
            jobs.retain(|j| {
                let gone = drop > 0 && j.view().state != State::Running;
                drop -= usize::from(gone);
                !gone
            });
            let job = Arc::new(Job {
                id: self.next.fetch_add(1, Ordering::Relaxed),
                repo: repo.to_string(),
                model_id,
                cancel: AtomicBool::new(false),
                done: AtomicU64::new(0),
                total: AtomicU64::new(0),
                resumed: AtomicU64::new(0),
                state: Mutex::new((State::Running, None, String::new())),
            });
            jobs.push(job.clone());
            job
        };
        let view = job.view();
        let (client, endpoint, models_dir) = (
            self.client.clone(),
            endpoint.trim_end_matches('/').to_string(),
            models_dir.to_path_buf(),
        );
        tokio::spawn(async move {
            let staging = models_dir.join(".downloads").join(job.repo.replace('/', "--"));
            let result =
                fetch_repo(&client, &endpoint, &job, &revision, &staging, &models_dir).await;
            match result {
                Ok(()) => job.set(State::Done, None),
                Err(DownloadError::Cancelled) => {
                    let _ = tokio::fs::remove_dir_all(&staging).await;
                    // Only succeeds when no other download is staged there.
                    let _ = tokio::fs::remove_dir(models_dir.join(".downloads")).await;
                    job.set(State::Cancelled, None);
                }
                Err(e) => {
                    tracing::warn!(repo = %job.repo, "download failed: {e}");
                    job.set(State::Failed, Some(e.to_string()));
                }
            }
        });
        Ok(view)
    }
}

#[derive(serde::Deserialize)]
struct RepoInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(serde::Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    /// Large files are stored in LFS; the listing (`?blobs=true`) gives their hash.
    lfs: Option<Lfs>,
}

#[derive(serde::Deserialize)]
struct Lfs {
    sha256: Option<String>,
    size: Option<u64>,
}

impl Sibling {
    fn size(&self) -> Option<u64> {
        self.lfs.as_ref().and_then(|l| l.size).or(self.size)
    }

    fn sha256(&self) -> Option<&str> {
        self.lfs.as_ref()?.sha256.as_deref()
    }
}

/// HTTPS anywhere, plain HTTP only on this machine.
fn secure(url: &reqwest::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => url.host_str().is_some_and(|h| {
            h == "localhost"
                || h.trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }),
        _ => false,
    }
}

/// A response body of at most `max` bytes.
async fn capped_body(resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        if out.len() + chunk.len() > max {
            return Err(format!("the listing is larger than {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

async fn fetch_repo(
    client: &reqwest::Client,
    endpoint: &str,
    job: &Job,
    revision: &str,
    staging: &Path,
    models_dir: &Path,
) -> Result<(), DownloadError> {
    let http = |e: reqwest::Error| DownloadError::Http(format!("cannot reach {endpoint}: {e}"));
    let url = format!("{endpoint}/api/models/{}/revision/{revision}?blobs=true", job.repo);
    let resp = client.get(&url).send().await.map_err(http)?;
    if matches!(resp.status().as_u16(), 401 | 403 | 404) {
        return Err(DownloadError::NotFound(job.repo.clone(), endpoint.to_string()));
    }
    if !resp.status().is_success() {
        return Err(DownloadError::Http(format!("{url}: HTTP {}", resp.status())));
    }
    let bytes = capped_body(resp, LISTING_MAX_BYTES)
        .await
        .map_err(|e| DownloadError::Http(format!("{url}: {e}")))?;
    let info: RepoInfo = serde_json::from_slice(&bytes)
        .map_err(|e| DownloadError::Http(format!("{url}: not a repository listing: {e}")))?;
    let files: Vec<&Sibling> = info.siblings.iter().filter(|s| wanted(&s.rfilename)).collect();
    if !files.iter().any(|f| f.rfilename == "config.json")
        || !files.iter().any(|f| f.rfilename.ends_with(".safetensors"))
    {
        return Err(DownloadError::NotAModel(job.repo.clone()));
    }
    // Files are fetched by commit, so a resume never mixes two revisions.
    let sha = info.sha.unwrap_or_else(|| revision.to_string());
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| DownloadError::Io(p, e)
    };
    tokio::fs::create_dir_all(staging).await.map_err(io(staging))?;
    let marker = staging.join(".revision");
    if tokio::fs::read_to_string(&marker).await.ok().as_deref() != Some(sha.as_str()) {
        // Parts from another revision are useless.
        let _ = tokio::fs::remove_dir_all(staging).await;
        tokio::fs::create_dir_all(staging).await.map_err(io(staging))?;
        tokio::fs::write(&marker, &sha).await.map_err(io(&marker))?;
    }
    // Weights are the large files: each must come with its size and hash, or none is fetched.
    for f in files.iter().filter(|f| f.rfilename.ends_with(".safetensors")) {
        if f.size().is_none() {
            return Err(DownloadError::Unlisted(f.rfilename.clone(), "size"));
        }
        if f.sha256().is_none() {
            return Err(DownloadError::Unlisted(f.rfilename.clone(), "sha256"));
        }
    }
    let total = files.iter().filter_map(|f| f.size()).fold(0u64, u64::saturating_add);
    job.total.store(total, Ordering::Relaxed);
    for f in &files {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(DownloadError::Cancelled);
        }
        job.state.locked().2 = f.rfilename.clone();
        let url = format!("{endpoint}/{}/resolve/{sha}/{}", job.repo, f.rfilename);
        let listed = Listed { size: f.size(), sha256: f.sha256() };
        fetch_file(client, &url, job, &staging.join(&f.rfilename), listed).await?;
    }
    for f in [".revision"].iter().map(|n| staging.join(n)) {
        let _ = tokio::fs::remove_file(f).await;
    }
    let target = models_dir.join(&job.model_id);
    installed_as(&target, &job.model_id, &job.repo)?;
    crate::catalog::mark_downloaded(staging, &job.repo).map_err(io(staging))?;
    tokio::fs::rename(staging, &target).await.map_err(io(&target))?;
    let _ = tokio::fs::remove_dir(models_dir.join(".downloads")).await;
    tracing::info!(repo = %job.repo, dir = %target.display(), "download complete");
    Ok(())
}

/// Whether `dir` (model id `id`) is free for a download of `repo`: `AlreadyInstalled` when
/// it holds `repo`'s download, `NameTaken` when it holds anything else.
fn installed_as(dir: &Path, id: &str, repo: &str) -> Result<(), DownloadError> {
    if !dir.exists() {
        return Ok(());
    }
    match crate::catalog::downloaded_from(dir) {
        Some(from) if from == repo => Err(DownloadError::AlreadyInstalled(id.to_string())),
        from => Err(DownloadError::NameTaken {
            id: id.to_string(),
            from: from
                .map_or_else(|| "a source Perch did not record (an import, a copy, or a download made before Perch recorded sources)".into(), |f| format!("`{f}`")),
            repo: repo.to_string(),
        }),
    }
}

/// What the listing says of a file.
struct Listed<'a> {
    size: Option<u64>,
    sha256: Option<&'a str>,
}

/// Whether `path` hashes to `sha256` (hex; any case), read off the async threads.
async fn hash_matches(path: &Path, sha256: &str) -> std::io::Result<bool> {
    use sha2::{Digest, Sha256};
    let (path, want) = (path.to_path_buf(), sha256.to_ascii_lowercase());
    tokio::task::spawn_blocking(move || {
        let mut hasher = Sha256::new();
        std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
        let got: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(got == want)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Whether a complete `part` may be kept: it has the listed hash (when one is listed). A part
/// that does not is deleted, so the next attempt starts over.
async fn keep(part: &Path, listed: &Listed<'_>) -> std::io::Result<bool> {
    let Some(sha) = listed.sha256 else { return Ok(true) };
    let ok = hash_matches(part, sha).await?;
    if !ok {
        tracing::warn!(part = %part.display(), "sha256 mismatch; starting the file over");
        tokio::fs::remove_file(part).await?;
    }
    Ok(ok)
}

/// Download one file to `dest` through `dest.part`, resuming the part where it stopped.
async fn fetch_file(
    client: &reqwest::Client,
    url: &str,
    job: &Job,
    dest: &Path,
    listed: Listed<'_>,
) -> Result<(), DownloadError> {
    let size = listed.size;
    if let (Ok(m), Some(size)) = (tokio::fs::metadata(dest).await, size) {
        if m.len() == size {
            job.done.fetch_add(size, Ordering::Relaxed);
            job.resumed.fetch_add(size, Ordering::Relaxed);
            return Ok(());
        }
    }
    let part = dest.with_extension(format!(
        "{}.part",
        dest.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let etag_file = dest.with_extension(format!(
        "{}.etag",
        dest.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let io = |e| DownloadError::Io(part.clone(), e);
    let mut last_error = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
        }
        let have = tokio::fs::metadata(&part).await.map(|m| m.len()).unwrap_or(0);
        let etag = tokio::fs::read_to_string(&etag_file).await.ok();
        let mut req = client.get(url);
        if have > 0 {
            if let Some(etag) = &etag {
                req = req
                    .header(reqwest::header::RANGE, format!("bytes={have}-"))
                    .header(reqwest::header::IF_RANGE, etag.as_str());
            }
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                last_error = e.to_string();
                continue;
            }
        };
        let status = resp.status().as_u16();
        let append = match status {
            206 => true,
            200 => false,
            416 if Some(have) == size => {
                break;
            }
            404 => return Err(DownloadError::Http(format!("{url}: not found"))),
            s => {
                last_error = format!("{url}: HTTP {s}");
                continue;
            }
        };
        let new_etag = resp
            .headers()
            .get("x-linked-etag")
            .or_else(|| resp.headers().get(reqwest::header::ETAG))
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        if let Some(e) = &new_etag {
            tokio::fs::write(&etag_file, e).await.map_err(io)?;
        }
        let mut out = if append {
            job.resumed.fetch_add(have, Ordering::Relaxed);
            tokio::fs::OpenOptions::new().append(true).open(&part).await.map_err(io)?
        } else {
            tokio::fs::File::create(&part).await.map_err(io)?
        };
        let start = if append { have } else { 0 };
        // Progress counts this file from where the body starts.
        let base = job.done.load(Ordering::Relaxed);
        job.done.store(base + start, Ordering::Relaxed);
        let mut written = start;
        let mut body = resp.bytes_stream();
        let mut cut = None;
        let mut too_long = false;
        while let Some(chunk) = body.next().await {
            if job.cancel.load(Ordering::Relaxed) {
                return Err(DownloadError::Cancelled);
            }
            match chunk {
                // Never write past the listed size: a hub that sends more is refused.
                Ok(bytes) if written + bytes.len() as u64 > size.unwrap_or(UNSIZED_MAX_BYTES) => {
                    too_long = true;
                    break;
                }
                Ok(bytes) => {
                    out.write_all(&bytes).await.map_err(io)?;
                    written += bytes.len() as u64;
                    job.done.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    cut = Some(e.to_string());
                    break;
                }
            }
        }
        out.flush().await.map_err(io)?;
        drop(out);
        if too_long {
            let _ = tokio::fs::remove_file(&part).await;
            job.done.store(base, Ordering::Relaxed);
            last_error = match size {
                Some(_) => format!("{url}: the body is longer than the listed {written}+ bytes"),
                None => format!("{url}: no size listed, and longer than {UNSIZED_MAX_BYTES} bytes"),
            };
            continue;
        }
        // What this attempt counted is recounted by the next one from the part's length.
        job.done.store(base, Ordering::Relaxed);
        if let Some(e) = cut {
            tracing::info!(url, written, "connection cut; resuming");
            last_error = e;
            continue;
        }
        if size.is_some_and(|s| s != written) {
            last_error = format!("{url}: got {written} bytes, expected {}", size.unwrap_or(0));
            // A part longer than the file is useless.
            if size.is_some_and(|s| written > s) {
                let _ = tokio::fs::remove_file(&part).await;
            }
            continue;
        }
        if !keep(&part, &listed).await.map_err(io)? {
            last_error = format!("{url}: the file does not match the listed sha256");
            continue;
        }
        job.done.store(base + written, Ordering::Relaxed);
        tokio::fs::rename(&part, dest).await.map_err(io)?;
        let _ = tokio::fs::remove_file(&etag_file).await;
        return Ok(());
    }
    if Some(tokio::fs::metadata(&part).await.map(|m| m.len()).unwrap_or(0)) == size
        && size.is_some()
        && keep(&part, &listed).await.map_err(io)?
    {
        tokio::fs::rename(&part, dest).await.map_err(io)?;
        job.done.fetch_add(size.unwrap_or(0), Ordering::Relaxed);
        return Ok(());
    }
    Err(DownloadError::Http(format!(
        "download interrupted after {ATTEMPTS} attempts ({last_error}); start it again to resume"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_files() {
        for ok in ["mlx-community/Qwen3-0.6B-4bit", "a/b", "org_1/x.y"] {
            assert!(valid_repo(ok), "{ok}");
        }
        for bad in ["", "a", "a/b/c", "../x", "a/..", "a/b c", "/a"] {
            assert!(!valid_repo(bad), "{bad}");
        }
        assert!(
            wanted("model-00001-of-00002.safetensors")
                && wanted("tokenizer.json")
                && wanted("chat_template.jinja")
        );
        assert!(!wanted("model.gguf") && !wanted("onnx/model.json") && !wanted("README.md"));
    }
}
