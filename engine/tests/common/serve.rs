//! One way for tests to run Perch and talk to it: an engine on fixture models with its
//! settings spelled out (nothing through process-wide environment variables), served on an
//! ephemeral loopback port, and JSON over real HTTP.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use perch_engine::platform::ComputeDtype;
use perch_engine::runtime::{Engine, EngineConfig, LadderConfig, WarmupProfile};
use perch_engine::server::{ServeConfig, Server};
use reqwest::Method;
use serde_json::Value;

/// The fixture models' directory, as a models directory (ids are the fixture names).
pub fn fixtures_models() -> PathBuf {
    super::fixture_dir("qwen3").parent().unwrap().to_path_buf()
}

/// Engine settings for a test: `model` from `models_dir`, computing in f32 (as the goldens
/// were computed), no drafts, no warmup ladder. Change what a test needs with `..`.
pub fn engine_config(models_dir: &Path, model: &str) -> EngineConfig {
    EngineConfig {
        models_dir: models_dir.to_path_buf(),
        model: model.into(),
        compute_dtype: ComputeDtype::F32,
        draft: perch_engine::decode::DraftSetting::None,
        ladder: LadderConfig::profile(WarmupProfile::Off),
        ..Default::default()
    }
}

/// Start `engine` and serve it on 127.0.0.1 at a free port (`serve.port` is ignored).
pub async fn serve(engine: EngineConfig, serve: ServeConfig) -> Server {
    let engine = Arc::new(Engine::start(engine).unwrap());
    Server::start(engine, ServeConfig { port: 0, ..serve }).await.unwrap()
}

/// What requests are sent to: a server, or a base URL.
pub trait Base {
    fn base(&self) -> String;
}

impl Base for Server {
    fn base(&self) -> String {
        self.url()
    }
}

impl Base for str {
    fn base(&self) -> String {
        self.to_string()
    }
}

impl Base for String {
    fn base(&self) -> String {
        self.clone()
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// `method path` with `body` as JSON: the status and the answer as JSON (null if it is not).
pub async fn call<B: Base + ?Sized>(
    to: &B,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = client().request(method, format!("{}{path}", to.base()));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn post<B: Base + ?Sized>(to: &B, path: &str, body: Value) -> (u16, Value) {
    call(to, Method::POST, path, Some(body)).await
}

pub async fn get<B: Base + ?Sized>(to: &B, path: &str) -> (u16, Value) {
    call(to, Method::GET, path, None).await
}

/// `body` sent to `path` with `stream: true`: every SSE data chunk as JSON, `[DONE]` left out.
pub async fn stream_chunks<B: Base + ?Sized>(to: &B, path: &str, body: Value) -> Vec<Value> {
    sse_events(to, path, body).await.into_iter().map(|(_, data)| data).collect()
}

/// `body` sent to `path` with `stream: true`: each SSE event as its `event:` name (empty
/// when it has none) and its data as JSON, `[DONE]` left out.
pub async fn sse_events<B: Base + ?Sized>(to: &B, path: &str, body: Value) -> Vec<(String, Value)> {
    let mut body = body;
    body["stream"] = Value::Bool(true);
    let text = client()
        .post(format!("{}{path}", to.base()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut out = vec![];
    let mut name = String::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ").filter(|d| *d != "[DONE]") {
            out.push((std::mem::take(&mut name), serde_json::from_str(d).unwrap()));
        }
    }
    out
}
