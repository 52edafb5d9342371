//! The loopback HTTP API: OpenAI- and Anthropic-compatible endpoints, `/health`, `/metrics`, the request
//! log, and the limits that keep a local engine safe (loopback by default, Host and Origin
//! checks, optional API key, bounded queue and body size).

pub mod anthropic;
pub(crate) mod body;
mod conversations;
pub mod error;
mod exchange;
pub(crate) mod field;
mod field_tables;
#[cfg(test)]
mod fuzz_tests;
pub mod guard;
mod ids;
mod mcp;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod request_log;
mod status;
mod train;
mod ui;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::config::SamplingDefaults;
use crate::runtime::Engine;
use crate::train::Training;
use error::ApiError;
use metrics::Metrics;
use request_log::RequestLog;

/// Perch's own control API (status, settings, models, downloads) lives under this prefix, so
/// that `/api/` means what Ollama's clients expect.
pub const CONTROL_PREFIX: &str = "/perch/";

/// Ollama's routes that change what is installed: the control API answers them (it owns
/// downloads and the models directory), in Ollama's shape.
pub const OLLAMA_CONTROL_ROUTES: &[&str] = &["/api/pull", "/api/delete"];

/// Whether the control API answers `path` (the guard, the error shapes and the dispatcher
/// ask; here, not in `supervisor`, which the server never names).
pub fn is_control(path: &str) -> bool {
    path.starts_with(CONTROL_PREFIX) || OLLAMA_CONTROL_ROUTES.contains(&path)
}

/// Perch's default port: clear of Ollama (11434), LM Studio (1234) and the usual dev servers
/// (3000, 5000, 5173, 8000, 8080, 8888).
pub use crate::paths::DEFAULT_PORT;
use crate::sync::{LockExt, RwLockExt};

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Web origins (scheme://host:port) whose pages may call the API.
    pub allowed_origins: Vec<String>,
    /// Host names besides the loopback ones that requests may address (e.g. `mymac.local`).
    pub allowed_hosts: Vec<String>,
    pub max_body_bytes: usize,
    /// Where `requests.jsonl` goes; `None`: no request log.
    pub log_dir: Option<PathBuf>,
    pub log_text: bool,
    pub log_max_bytes: usize,
    /// At shutdown, how long in-flight requests may take before they are cancelled.
    pub shutdown_grace: Duration,
    /// Bound to a non-loopback address (with a key): any Host header is accepted.
    pub any_host: bool,
    /// What requests get when they leave sampling fields out (changeable live).
    pub sampling: SamplingDefaults,
    /// A streamed answer sends an SSE comment after this long without an event, so that
    /// clients with read timeouts wait out a long prefill.
    pub sse_keep_alive: Duration,
    /// Where the chat window's conversations are kept (`None`: not kept; their routes
    /// answer 404 saying so).
    pub conversations_dir: Option<PathBuf>,
    /// The MCP servers file the chat's tools come from (`None`: no MCP tools).
    pub mcp_file: Option<PathBuf>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            api_key: None,
            allowed_origins: vec![],
            allowed_hosts: vec![],
            max_body_bytes: 4 << 20,
            log_dir: None,
            log_text: false,
            log_max_bytes: 10 << 20,
            shutdown_grace: Duration::from_secs(10),
            any_host: false,
            sampling: SamplingDefaults::default(),
            sse_keep_alive: Duration::from_secs(4),
            conversations_dir: None,
            mcp_file: None,
        }
    }
}

impl ServeConfig {
    /// What the settings file says about serving (the rest stays at the defaults).
    pub fn from_settings(
        settings: &crate::config::Settings,
        log_dir: Option<PathBuf>,
    ) -> ServeConfig {
        ServeConfig {
            port: settings.port,
            api_key: Some(settings.api_key.clone()).filter(|k| !k.is_empty()),
            allowed_origins: settings.allowed_origins.clone(),
            log_dir,
            log_text: settings.log_text,
            sampling: settings.sampling,
            conversations_dir: Some(settings.conversations_dir()),
            mcp_file: Some(settings.mcp_file()),
            ..ServeConfig::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("refusing to listen on {0} without an API key: anyone on the network could use the engine. Pass --api-key, or bind to 127.0.0.1")]
    KeyRequired(String),
    #[error("`{0}` is not an IP address to listen on (use 127.0.0.1, ::1 or localhost)")]
    BadHost(String),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("request log: {0}")]
    Log(std::io::Error),
}

/// Shared by every handler of one engine.
pub struct App {
    pub engine: Arc<Engine>,
    pub config: ServeConfig,
    pub metrics: Metrics,
    pub log: Option<RequestLog>,
    pub sampling: Mutex<SamplingDefaults>,
    /// Training runs on this engine, its per-turn receipt and pacer (docs/training.md).
    pub training: Arc<Training>,
    next_id: AtomicU64,
    /// Cancellation flags of the generations in flight, for shutdown.
    in_flight: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    /// Recent Responses API answers, for `previous_response_id`.
    pub responses: Arc<openai::responses::store::Store>,
}

impl App {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn cancel_all(&self) -> usize {
        let map = self.in_flight.locked();
        map.values().for_each(|c| c.store(true, Ordering::Relaxed));
        map.len()
    }

    /// Let this engine's requests finish for up to `grace`, then cancel what still runs; then
    /// stop background work and wait (bounded) for every lease to return.
    pub async fn drain(&self, grace: Duration) {
        self.engine.stop_background();
        let busy = || {
            let f = self.engine.foreground.snapshot();
            f.foreground_active + f.foreground_queued + f.foreground_arriving > 0
        };
        let deadline = tokio::time::Instant::now() + grace;
        while busy() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if busy() {
            let n = self.cancel_all();
            tracing::warn!(
                cancelled = n,
                "drain deadline passed; cancelling in-flight generations"
            );
        }
        if !self.engine.drain(Duration::from_secs(5)).await {
            tracing::warn!("leases still held after the drain deadline");
        }
    }
}

/// The engine's own API (OpenAI-compatible routes, /health, /metrics).
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(openai::embeddings::create))
        .route("/v1/responses", post(openai::responses::create))
        .route(
            "/v1/responses/{id}",
            get(openai::responses::retrieve).delete(openai::responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed::embed))
        .route("/api/embeddings", post(ollama::embed::embeddings))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .route("/health", get(status::health))
        .route("/metrics", get(status::metrics))
        .route("/openapi.json", get(status::openapi))
        .route("/train", get(train::status).post(train::start))
        .route("/train/cancel", post(train::cancel))
        .route("/train/pause", post(train::pause))
        .route("/train/resume", post(train::resume))
        .fallback(status::not_found)
        .method_not_allowed_fallback(status::method_not_allowed)
        // Bodies are read as bytes with this cap; the handlers turn the rejection into a 413.
        .layer(DefaultBodyLimit::max(app.config.max_body_bytes))
        .with_state(app)
}

/// What the listener serves, and outlives engine restarts: the UI at `/`, the control API
/// under `/perch/` (when an owner installs one), and the current engine's API — or, while there
/// is none (restarting, failed), a JSON 503 that says why.
pub struct AppHost {
    hosted: RwLock<Option<(Arc<App>, Router)>>,
    /// The limits the guard applies; kept across restarts so a key never lapses.
    guard: RwLock<Arc<ServeConfig>>,
    control: RwLock<Option<Router>>,
    /// Why there is no engine, for the 503: its `code` and message.
    unavailable: RwLock<(&'static str, String)>,
    /// The chat window's conversations: kept through restarts, like the UI.
    conversations: RwLock<Option<Arc<crate::conversations::Store>>>,
    /// The chat's MCP servers: started when first needed, stopped at shutdown.
    mcp: RwLock<Option<Arc<crate::mcp::Manager>>>,
}

impl AppHost {
    pub fn app(&self) -> Option<Arc<App>> {
        self.hosted.read_now().as_ref().map(|(a, _)| a.clone())
    }

    pub(crate) fn guard_config(&self) -> Arc<ServeConfig> {
        self.guard.read_now().clone()
    }

    pub fn set_control(&self, router: Router) {
        *self.control.write_now() = Some(router);
    }

    pub fn control_router(&self) -> Router {
        self.control.read_now().clone().unwrap_or_default()
    }

    /// No engine, because the one there was stopped or failed (code `engine_restarting`).
    pub fn set_unavailable(&self, why: impl Into<String>) {
        *self.unavailable.write_now() = ("engine_restarting", why.into());
    }

    /// No engine yet: the first is loading (code `engine_starting`).
    pub fn set_starting(&self, why: impl Into<String>) {
        *self.unavailable.write_now() = ("engine_starting", why.into());
    }

    pub fn conversations(&self) -> Option<Arc<crate::conversations::Store>> {
        self.conversations.read_now().clone()
    }

    pub fn mcp(&self) -> Option<Arc<crate::mcp::Manager>> {
        self.mcp.read_now().clone()
    }

    /// Take MCP servers from `file` from now on (the old servers stop when it moves).
    fn mcp_from(&self, file: Option<&std::path::Path>) {
        let mut mcp = self.mcp.write_now();
        if mcp.as_ref().map(|m| m.path()) != file {
            if let Some(old) = mcp.take() {
                tokio::spawn(async move { old.stop_all().await });
            }
            *mcp = file.map(|f| Arc::new(crate::mcp::Manager::new(f.to_path_buf())));
        }
    }

    /// Keep conversations in `dir` from now on (the store is replaced only when it moves).
    fn keep_conversations_in(&self, dir: Option<&std::path::Path>) {
        let mut store = self.conversations.write_now();
        if store.as_ref().map(|s| s.dir()) != dir {
            *store = dir.map(|d| Arc::new(crate::conversations::Store::new(d.to_path_buf())));
        }
    }
}

async fn dispatch(State(app_host): State<Arc<AppHost>>, req: Request) -> Response {
    let path = req.uri().path();
    if is_control(path) {
        let control = app_host.control.read_now().clone();
        return match control {
            Some(r) => r.oneshot(req).await.into_response(),
            None => ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "The control API (and Ollama's pull and delete) is served by the desktop app and by `perch serve --config FILE`",
            )
            .code("not_found")
            .into_response_as(error::Dialect::of_path(path)),
        };
    }
    let hosted = app_host.hosted.read_now().as_ref().map(|(_, r)| r.clone());
    match hosted {
        Some(r) => r.oneshot(req).await.into_response(),
        None => {
            let (code, why) = app_host.unavailable.read_now().clone();
            let mut r = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable", why)
                .code(code)
                .into_response_as(error::Dialect::of_path(req.uri().path()));
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
            r
        }
    }
}

/// Ollama's port, for tools that hard-code it (the `ollama_port` setting).
pub const OLLAMA_PORT: u16 = 11434;

/// Another listener on an app host (the same UI, APIs and guard, whatever engine is hosted);
/// dropping it stops accepting connections and lets its requests finish.
pub struct ExtraListener {
    pub addr: SocketAddr,
    app_host: Arc<AppHost>,
    _stop: oneshot::Sender<()>,
}

impl ExtraListener {
    /// Listen on `addr` too, serving `app_host`.
    pub async fn bind(
        app_host: &Arc<AppHost>,
        addr: SocketAddr,
    ) -> Result<ExtraListener, ServeError> {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| ServeError::Bind(addr, e))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let service = app_host_router(app_host.clone());
        tokio::spawn(async move {
            let served = axum::serve(listener, service).with_graceful_shutdown(async move {
                // A dropped sender stops it too.
                let _ = stopped.await;
            });
            if let Err(e) = served.await {
                tracing::warn!(%addr, "listener stopped: {e}");
            }
        });
        tracing::info!(%addr, "also serving");
        Ok(ExtraListener { addr, app_host: app_host.clone(), _stop: stop })
    }

    /// Whether this listener serves `app_host`.
    pub fn serves(&self, app_host: &Arc<AppHost>) -> bool {
        Arc::ptr_eq(&self.app_host, app_host)
    }
}

fn app_host_router(app_host: Arc<AppHost>) -> Router {
    ui::routes()
        .merge(conversations::routes())
        .merge(mcp::routes())
        .fallback(dispatch)
        .layer(axum::middleware::from_fn_with_state(app_host.clone(), guard::guard))
        .layer(axum::middleware::map_response(no_sniffing))
        .with_state(app_host)
}

/// Every answer, the guard's refusals included, is read as the type it says it is: a JSON
/// error echoing a request's text must never be sniffed into a page.
async fn no_sniffing(mut r: Response) -> Response {
    r.headers_mut().insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    r
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub app_host: Arc<AppHost>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Bind and start serving `engine`.
    pub async fn start(engine: Arc<Engine>, config: ServeConfig) -> Result<Server, ServeError> {
        let server = Server::bind(config.clone()).await?;
        server.host(engine, config)?;
        Ok(server)
    }

    /// Bind the listener with no engine yet: engine routes answer 503 until `host`.
    pub async fn bind(mut config: ServeConfig) -> Result<Server, ServeError> {
        let ip: IpAddr = match config.host.as_str() {
            "localhost" => IpAddr::from([127, 0, 0, 1]),
            h => h.parse().map_err(|_| ServeError::BadHost(h.to_string()))?,
        };
        if !ip.is_loopback() {
            if config.api_key.as_deref().is_none_or(str::is_empty) {
                return Err(ServeError::KeyRequired(config.host.clone()));
            }
            config.any_host = true;
        }
        let addr = SocketAddr::new(ip, config.port);
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| ServeError::Bind(addr, e))?;
        let addr = listener.local_addr().map_err(|e| ServeError::Bind(addr, e))?;
        let app_host = Arc::new(AppHost {
            hosted: RwLock::new(None),
            guard: RwLock::new(Arc::new(config)),
            control: RwLock::new(None),
            unavailable: RwLock::new(("engine_restarting", "The engine is starting".into())),
            conversations: RwLock::new(None),
            mcp: RwLock::new(None),
        });
        let guard = app_host.guard_config();
        app_host.keep_conversations_in(guard.conversations_dir.as_deref());
        app_host.mcp_from(guard.mcp_file.as_deref());
        let (stop, stopped) = oneshot::channel::<()>();
        let service = app_host_router(app_host.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, service)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        tracing::info!(%addr, "serving");
        Ok(Server { addr, app_host, stop: Some(stop), task })
    }

    /// Serve `engine` from now on (there must be none hosted).
    pub fn host(
        &self,
        engine: Arc<Engine>,
        mut config: ServeConfig,
    ) -> Result<Arc<App>, ServeError> {
        config.any_host = self.app_host.guard_config().any_host;
        let log = match &config.log_dir {
            Some(dir) => Some(
                RequestLog::open(dir, config.log_max_bytes, 3, config.log_text)
                    .map_err(ServeError::Log)?,
            ),
            None => None,
        };
        engine.start_background();
        let training = Training::new();
        engine.set_observer(Arc::new(training.clone()));
        let sampling = Mutex::new(config.sampling);
        let app = Arc::new(App {
            engine,
            config: config.clone(),
            metrics: Metrics::new(),
            log,
            sampling,
            training,
            next_id: AtomicU64::new(1),
            in_flight: Mutex::new(HashMap::new()),
            responses: Arc::default(),
        });
        self.app_host.keep_conversations_in(config.conversations_dir.as_deref());
        self.app_host.mcp_from(config.mcp_file.as_deref());
        *self.app_host.guard.write_now() = Arc::new(config);
        *self.app_host.hosted.write_now() = Some((app.clone(), router(app.clone())));
        Ok(app)
    }

    /// Stop routing to the current engine (new requests get a 503 saying `why`) and drain it:
    /// in-flight requests finish within `grace` or are cancelled, leases are returned.
    pub async fn unhost(&self, why: &str, grace: Duration) -> Option<Arc<App>> {
        self.app_host.set_unavailable(why);
        let app = self.app_host.hosted.write_now().take().map(|(a, _)| a)?;
        app.drain(grace).await;
        Some(app)
    }

    pub fn app(&self) -> Option<Arc<App>> {
        self.app_host.app()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting connections, let in-flight requests finish for up to the configured
    /// grace, then cancel what still runs (each generation stops within one step).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let grace = self.app_host.guard_config().shutdown_grace;
        if let Some(m) = self.app_host.mcp() {
            m.stop_all().await;
        }
        let mut task = self.task;
        let app = self.app_host.app();
        // Background work stops at its next chunk; its leases drain with the requests'.
        if let Some(app) = &app {
            app.engine.stop_background();
        }
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            let n = app.as_ref().map_or(0, |a| a.cancel_all());
            tracing::warn!(
                cancelled = n,
                "shutdown deadline passed; cancelling in-flight generations"
            );
            if tokio::time::timeout(Duration::from_secs(5), &mut task).await.is_err() {
                task.abort();
            }
        }
    }

    /// Serve until Ctrl-C (or SIGTERM), then shut down gracefully.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        eprintln!("perch: shutting down");
        self.shutdown().await;
    }
}

/// Ctrl-C, or SIGTERM where there is one.
pub async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
