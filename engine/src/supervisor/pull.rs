//! Ollama's `/api/pull` and `/api/delete` over Perch's downloads and models directory: a
//! model name `org/repo[:revision]` is a hub repository, pulled with NDJSON progress lines
//! as Ollama's clients read them; errors come back as `{"error": …}`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete as delete_route, post};
use axum::{Json, Router};
use futures_util::stream;
use serde_json::{json, Value};

use super::control::{current_settings, delete_installed, live, S};
use crate::download::{DownloadError, JobView, State};
use crate::server::error::{ApiError, Dialect};
use crate::server::ollama::model_types::{self, DeleteRequest, PullRequest};

/// How often a pull's progress is read from its job.
const POLL: Duration = Duration::from_millis(250);

fn ollama(e: ApiError) -> Response {
    e.into_response_as(Dialect::Ollama)
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

/// Bytes so far, as Ollama's pull reports a layer's progress.
fn bytes(job: &JobView) -> Value {
    json!({
        "status": format!("pulling {}", job.file),
        "digest": job.file,
        "total": job.bytes_total,
        "completed": job.bytes_done,
    })
}

/// The progress lines a job's state calls for: a finished download reports its bytes in
/// full before `success`, however fast it went.
fn progress(job: &JobView) -> Vec<Value> {
    match job.state {
        State::Running if job.bytes_total == 0 => vec![json!({"status": "pulling manifest"})],
        State::Running => vec![bytes(job)],
        State::Done => vec![bytes(job), json!({"status": "success"})],
        State::Failed => {
            vec![
                json!({"error": job.error.clone().unwrap_or_else(|| "the download failed".into())}),
            ]
        }
        State::Cancelled => vec![json!({"error": "the download was cancelled"})],
    }
}

/// `POST /api/pull`: start (or join) the download of `org/repo[:revision]`.
/// `POST /api/pull` and `DELETE /api/delete`, served with the control routes.
pub(super) fn routes() -> Router<std::sync::Weak<super::Supervisor>> {
    Router::new().route("/api/pull", post(pull)).route("/api/delete", delete_route(delete))
}

pub async fn pull(axum::extract::State(sup): S, bytes: Bytes) -> Response {
    let sup = match live(sup) {
        Ok(s) => s,
        Err(e) => return ollama(e),
    };
    let started = async {
        let b: PullRequest = model_types::read(&bytes)?;
        let stream = b.stream.is_none_or(|s| s.0);
        let name = model_types::model_of(b.model, b.name)?;
        let (repo, revision) = match name.rsplit_once(':') {
            Some((r, "latest")) => (r.to_string(), None),
            Some((r, rev)) => (r.to_string(), Some(rev.to_string())),
            None => (name.clone(), None),
        };
        let settings = current_settings(&sup);
        let job = match sup.downloads.start(
            &repo,
            revision.as_deref(),
            &settings.hub_endpoint(),
            &settings.models_dir(),
        ) {
            Ok(job) => Some(job),
            // Pulling what is installed succeeds at once, as Ollama's does.
            Err(DownloadError::AlreadyInstalled(_)) => None,
            // A second pull of the same repository follows the first.
            Err(DownloadError::AlreadyRunning(_)) => sup
                .downloads
                .list()
                .into_iter()
                .find(|j| j.repo == repo && j.state == State::Running),
            Err(e @ DownloadError::BadRepo(_)) => {
                return Err(bad(
                    "model",
                    format!("{e}: Perch pulls models from the hub by repository id"),
                ))
            }
            Err(e) => return Err(bad("model", e.to_string())),
        };
        Ok((job.map(|j| j.id), stream))
    };
    let (job, stream) = match started.await {
        Ok(x) => x,
        Err(e) => return ollama(e),
    };
    let Some(id) = job else {
        return Json(json!({"status": "success"})).into_response();
    };
    let sup = Arc::downgrade(&sup);
    if !stream {
        loop {
            let view = sup.upgrade().and_then(|s| s.downloads.get(id));
            match view {
                Some(j) if j.state == State::Running => tokio::time::sleep(POLL).await,
                Some(j) if j.state == State::Done => {
                    return Json(json!({"status": "success"})).into_response()
                }
                Some(j) => {
                    let line = progress(&j).pop().unwrap_or_default();
                    return (StatusCode::INTERNAL_SERVER_ERROR, Json(line)).into_response();
                }
                None => return ollama(ApiError::unfinished()),
            }
        }
    }
    // Lines until the job ends, each sent when it differs from the one before.
    let state = (sup, false, None::<Value>, std::collections::VecDeque::<Value>::new());
    let lines = stream::unfold(state, move |(sup, mut done, mut last, mut queue)| async move {
        loop {
            if let Some(line) = queue.pop_front() {
                if last.as_ref() != Some(&line) {
                    last = Some(line.clone());
                    return Some((
                        Ok::<_, std::io::Error>(ndjson(&line)),
                        (sup, done, last, queue),
                    ));
                }
                continue;
            }
            if done {
                return None;
            }
            match sup.upgrade().and_then(|s| s.downloads.get(id)) {
                Some(j) => {
                    done = j.state != State::Running;
                    queue.extend(progress(&j));
                    if !done && queue.front() == last.as_ref() {
                        queue.clear();
                        tokio::time::sleep(POLL).await;
                    }
                }
                None => {
                    done = true;
                    queue.push_back(json!({"error": "Perch is shutting down"}));
                }
            }
        }
    });
    let mut r = Body::from_stream(lines).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, "application/x-ndjson".parse().unwrap());
    r
}

fn ndjson(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// `DELETE /api/delete`: remove an installed model (only folders Perch installed).
pub async fn delete(axum::extract::State(sup): S, bytes: Bytes) -> Response {
    let answer = async {
        let sup = live(sup)?;
        let b: DeleteRequest = model_types::read(&bytes)?;
        let name = model_types::model_of(b.model, b.name)?;
        let id = name.strip_suffix(":latest").unwrap_or(&name);
        delete_installed(&sup, id).await
    };
    match answer.await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => ollama(e),
    }
}
