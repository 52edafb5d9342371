//! A local server speaking the Hugging Face hub's API on loopback, serving the qwen3 fixture as
//! one repo: listings with sizes, `resolve` URLs with etags and ranges, and knobs to cut
//! connections or slow them down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::fixture_dir;

pub const REPO: &str = "perch-test/tiny-qwen3";
pub const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Default)]
pub struct Hub {
    pub files: HashMap<String, Vec<u8>>,
    /// Bodies stop after this many bytes (then the connection drops), for this many responses.
    pub cut_at: AtomicU64,
    pub cuts_left: AtomicU64,
    /// Sleep per 16 KiB chunk, in ms (for cancelling mid-file).
    pub slow_ms: AtomicU64,
    pub ranges: Mutex<Vec<String>>,
    pub requests: AtomicU64,
    /// What the listing claims instead of the truth: sizes and LFS hashes by file.
    pub listed_size: Mutex<HashMap<String, u64>>,
    pub listed_sha256: Mutex<HashMap<String, String>>,
    /// Files the listing gives neither a size nor an LFS entry for.
    pub unlisted: Mutex<Vec<String>>,
    /// Bytes of filler added to the listing.
    pub listing_pad: AtomicU64,
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn etag(file: &str) -> String {
    format!("\"etag-{file}\"")
}

async fn listing(
    State(hub): State<Arc<Hub>>,
    UrlPath((org, name, _rev)): UrlPath<(String, String, String)>,
) -> Response {
    if format!("{org}/{name}") != REPO {
        return (StatusCode::NOT_FOUND, Json(json!({"error": "Repository not found"})))
            .into_response();
    }
    let sizes = hub.listed_size.lock().unwrap().clone();
    let shas = hub.listed_sha256.lock().unwrap().clone();
    let unlisted = hub.unlisted.lock().unwrap().clone();
    let mut siblings: Vec<_> = hub
        .files
        .iter()
        .map(|(f, b)| {
            let size = sizes.get(f).copied().unwrap_or(b.len() as u64);
            if unlisted.contains(f) {
                return json!({"rfilename": f});
            }
            // Like the hub, weights are LFS files listed with their sha256.
            if f.ends_with(".safetensors") {
                let sha = shas.get(f).cloned().unwrap_or_else(|| sha256_hex(b));
                json!({"rfilename": f, "size": size, "lfs": {"sha256": sha, "size": size}})
            } else {
                json!({"rfilename": f, "size": size})
            }
        })
        .collect();
    siblings.push(json!({"rfilename": "README.md", "size": 5}));
    let pad = "x".repeat(hub.listing_pad.load(Ordering::Relaxed) as usize);
    Json(json!({"id": REPO, "sha": SHA, "siblings": siblings, "pad": pad})).into_response()
}

async fn resolve(
    State(hub): State<Arc<Hub>>,
    UrlPath((org, name, rev, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    hub.requests.fetch_add(1, Ordering::Relaxed);
    let Some(bytes) =
        hub.files.get(&file).filter(|_| format!("{org}/{name}") == REPO && rev == SHA)
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let tag = etag(&file);
    let mut start = 0usize;
    let mut status = StatusCode::OK;
    if let Some(range) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        hub.ranges.lock().unwrap().push(format!("{file} {range}"));
        let if_range_ok =
            headers.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) == Some(tag.as_str());
        if if_range_ok {
            start = range.trim_start_matches("bytes=").trim_end_matches('-').parse().unwrap();
            status = StatusCode::PARTIAL_CONTENT;
        }
    }
    let body: Vec<u8> = bytes[start..].to_vec();
    let len = body.len();
    let cut = if hub.cuts_left.load(Ordering::Relaxed) > 0 && file.ends_with(".safetensors") {
        hub.cuts_left.fetch_sub(1, Ordering::Relaxed);
        Some(hub.cut_at.load(Ordering::Relaxed) as usize)
    } else {
        None
    };
    let slow = hub.slow_ms.load(Ordering::Relaxed);
    // Flush what was sent before a cut, as a real connection dropping mid-body would have.
    let slow = if cut.is_some() { slow.max(2) } else { slow };
    let stream = async_stream(body, cut, slow);
    let mut r = Response::builder()
        .status(status)
        .header(header::ETAG, tag)
        .header(header::CONTENT_LENGTH, len);
    if status == StatusCode::PARTIAL_CONTENT {
        r = r.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len()),
        );
    }
    r.body(Body::from_stream(stream)).unwrap()
}

/// The body in 16 KiB chunks; with `cut`, an error after that many bytes drops the connection.
fn async_stream(
    body: Vec<u8>,
    cut: Option<usize>,
    slow_ms: u64,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    let chunks: Vec<Vec<u8>> = body.chunks(16 << 10).map(|c| c.to_vec()).collect();
    futures_util::stream::unfold((chunks.into_iter(), 0usize), move |(mut it, sent)| async move {
        if slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(slow_ms)).await;
        }
        if cut.is_some_and(|c| sent >= c) {
            return Some((Err(std::io::Error::other("cut")), (it, usize::MAX)));
        }
        if sent == usize::MAX {
            return None;
        }
        let c = it.next()?;
        let n = c.len();
        Some((Ok(c), (it, sent + n)))
    })
}

pub async fn hub() -> (Arc<Hub>, String) {
    let mut files = HashMap::new();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        files.insert(f.to_string(), std::fs::read(fixture_dir("qwen3").join(f)).unwrap());
    }
    let hub = Arc::new(Hub { files, ..Default::default() });
    let app = Router::new()
        .route("/api/models/{org}/{name}/revision/{rev}", get(listing))
        .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
        .with_state(hub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (hub, url)
}
