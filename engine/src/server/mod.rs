//! The loopback HTTP API: OpenAI-compatible endpoints, `/health`, `/metrics`, the request
//! log, and the limits that keep a local engine safe (loopback by default, Host and Origin
//! checks, optional API key, bounded queue and body size).

pub mod error;
pub mod guard;
mod handlers;
pub mod metrics;
pub mod request;
pub mod request_log;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::runtime::Engine;
use metrics::Metrics;
use request_log::RequestLog;

/// Perch's default port: clear of Ollama (11434), LM Studio (1234) and the usual dev servers
/// (3000, 5000, 5173, 8000, 8080, 8888).
pub const DEFAULT_PORT: u16 = 7342;

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
    /// Most tokens one request may generate (`None`: up to the context).
    pub max_tokens_cap: Option<usize>,
    /// Where `requests.jsonl` goes; `None`: no request log.
    pub log_dir: Option<PathBuf>,
    pub log_text: bool,
    pub log_max_bytes: usize,
    /// At shutdown, how long in-flight requests may take before they are cancelled.
    pub shutdown_grace: Duration,
    /// Bound to a non-loopback address (with a key): any Host header is accepted.
    pub any_host: bool,
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
            max_tokens_cap: None,
            log_dir: None,
            log_text: false,
            log_max_bytes: 10 << 20,
            shutdown_grace: Duration::from_secs(10),
            any_host: false,
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

/// Shared by every handler.
pub struct App {
    pub engine: Arc<Engine>,
    pub config: ServeConfig,
    pub metrics: Metrics,
    pub log: Option<RequestLog>,
    next_id: AtomicU64,
    /// Cancellation flags of the generations in flight, for shutdown.
    in_flight: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

impl App {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn cancel_all(&self) -> usize {
        let map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        map.values().for_each(|c| c.store(true, Ordering::Relaxed));
        map.len()
    }
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{*id}", get(handlers::model))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/openapi.json", get(handlers::openapi))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard::guard))
        // Bodies are read as bytes with this cap; the handlers turn the rejection into a 413.
        .layer(DefaultBodyLimit::max(app.config.max_body_bytes))
        .with_state(app)
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub app: Arc<App>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Bind and start serving `engine`.
    pub async fn start(engine: Arc<Engine>, mut config: ServeConfig) -> Result<Server, ServeError> {
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
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| ServeError::Bind(addr, e))?;
        let addr = listener.local_addr().map_err(|e| ServeError::Bind(addr, e))?;
        let log = match &config.log_dir {
            Some(dir) => Some(RequestLog::open(dir, config.log_max_bytes, 3, config.log_text).map_err(ServeError::Log)?),
            None => None,
        };
        engine.start_background();
        let app = Arc::new(App { engine, config, metrics: Metrics::new(), log, next_id: AtomicU64::new(1), in_flight: Mutex::new(HashMap::new()) });
        let (stop, stopped) = oneshot::channel::<()>();
        let service = router(app.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, service).with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
        });
        tracing::info!(%addr, "serving");
        Ok(Server { addr, app, stop: Some(stop), task })
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
        let grace = self.app.config.shutdown_grace;
        let mut task = self.task;
        // Background work stops at its next chunk; its leases drain with the requests'.
        self.app.engine.stop_background();
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            let n = self.app.cancel_all();
            tracing::warn!(cancelled = n, "shutdown deadline passed; cancelling in-flight generations");
            if tokio::time::timeout(Duration::from_secs(5), &mut task).await.is_err() {
                task.abort();
            }
        }
    }

    /// Serve until Ctrl-C (or SIGTERM), then shut down gracefully.
    pub async fn run_until_signal(self) {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        eprintln!("perch: shutting down");
        self.shutdown().await;
    }
}
