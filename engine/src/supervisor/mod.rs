//! Runs the engine from the settings file and restarts it in-process when the file changes
//! (docs/settings.md): validate first; an invalid file leaves the running engine serving and says why;
//! a valid one drains the old engine (requests finish or are cancelled after a deadline,
//! leases return), then starts the new one behind the same listener. Fields that need no
//! restart (sampling defaults, the default model, launch at login) apply live.

mod control;
mod menu;
mod pull;
mod watch;

pub use menu::{TrayMenu, TrayModel};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::config::{ConfigError, Settings};
use crate::download::Downloads;
use crate::runtime::Engine;
use crate::server::{ServeConfig, ServeError, Server};
use crate::sync::LockExt;

/// How long in-flight requests may run on a restart before they are cancelled.
pub const RESTART_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Starting,
    Running,
    Restarting,
    /// No engine: the settings cannot run (see `config_error` / `message`).
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigProblem {
    pub message: String,
    pub field: Option<String>,
}

impl From<&ConfigError> for ConfigProblem {
    fn from(e: &ConfigError) -> Self {
        ConfigProblem { message: e.to_string(), field: e.field().map(String::from) }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub phase: Phase,
    /// One line for people: what the engine is doing.
    pub message: String,
    /// The settings file's problem, while it has one (the engine keeps the last good ones).
    pub config_error: Option<ConfigProblem>,
    pub url: String,
    pub config_path: PathBuf,
    /// A model being loaded by a live change, until it is ready.
    pub loading: Option<String>,
    pub restarts: u64,
    /// Where Perch also answers on Ollama's port (the `ollama_port` setting).
    pub ollama_url: Option<String>,
    /// Why it does not, when the setting asks for it.
    pub ollama_port_error: Option<String>,
}

pub struct Supervisor {
    path: PathBuf,
    log_dir: Option<PathBuf>,
    server: tokio::sync::Mutex<Option<Server>>,
    /// The listener's app host, readable without waiting for a restart to finish.
    app_host: Mutex<Option<Arc<crate::server::AppHost>>>,
    /// The settings the engine runs with (None until a valid file has been applied).
    applied: Mutex<Option<Settings>>,
    /// The listener on Ollama's port, while the setting asks for one and the port was free.
    ollama_listener: tokio::sync::Mutex<Option<crate::server::ExtraListener>>,
    status: Mutex<Status>,
    /// One change (reload, save, restart) at a time.
    changes: tokio::sync::Mutex<()>,
    pub downloads: Arc<Downloads>,
    watcher: Mutex<Option<watch::Watcher>>,
    /// The runtime `start` ran on: the watcher's task runs there, whoever calls `watch`.
    runtime: tokio::runtime::Handle,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.locked()
}

impl Supervisor {
    /// Bind the listener and start the engine the settings file describes (writing the
    /// defaults first if there is no file). Returns once the UI and control API are up; the
    /// model loads in the background (`status().phase` says when it is running).
    pub async fn start(
        path: &Path,
        log_dir: Option<PathBuf>,
    ) -> Result<Arc<Supervisor>, ServeError> {
        if !path.exists() {
            if let Err(e) = Settings::default().save(path) {
                tracing::warn!("cannot write default settings: {e}");
            }
        }
        let loaded = Settings::load(path);
        let serve = match &loaded {
            Ok(s) => ServeConfig::from_settings(s, log_dir.clone()),
            // Serve the UI where the user expects it, so they can fix the file there, guarded
            // by the key the file holds (never the defaults' lack of one).
            Err(_) => ServeConfig::from_settings(
                &Settings::salvage(&std::fs::read_to_string(path).unwrap_or_default()),
                None,
            ),
        };
        let server = Server::bind(serve).await?;
        let url = server.url();
        let sup = Arc::new(Supervisor {
            path: path.to_path_buf(),
            log_dir,
            downloads: Downloads::new(),
            server: tokio::sync::Mutex::new(None),
            app_host: Mutex::new(Some(server.app_host.clone())),
            applied: Mutex::new(None),
            status: Mutex::new(Status {
                phase: Phase::Starting,
                message: "Starting the engine".into(),
                config_error: None,
                url,
                config_path: path.to_path_buf(),
                loading: None,
                restarts: 0,
                ollama_url: None,
                ollama_port_error: None,
            }),
            ollama_listener: tokio::sync::Mutex::new(None),
            changes: tokio::sync::Mutex::new(()),
            watcher: Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
        });
        server.app_host.set_control(control::router(Arc::downgrade(&sup), pull::routes()));
        *sup.server.lock().await = Some(server);
        match loaded {
            Ok(settings) => {
                let s = sup.clone();
                tokio::spawn(async move {
                    let _change = s.changes.lock().await;
                    s.launch(settings, None).await;
                    s.sync_ollama_port().await;
                });
            }
            Err(e) => sup.reject(&e, "No engine: the settings file has a problem"),
        }
        Ok(sup)
    }

    /// Watch the settings file; hand edits apply like the settings window's (debounced).
    pub fn watch(self: &Arc<Self>) -> notify::Result<()> {
        let weak = Arc::downgrade(self);
        let w = watch::Watcher::new(
            &self.runtime,
            &self.path,
            Duration::from_millis(300),
            move || {
                let weak = weak.clone();
                async move {
                    if let Some(s) = weak.upgrade() {
                        s.reload().await;
                    }
                }
            },
        )?;
        *lock(&self.watcher) = Some(w);
        Ok(())
    }

    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }

    pub fn config_path(&self) -> &Path {
        &self.path
    }

    /// The settings in force.
    pub fn settings(&self) -> Option<Settings> {
        lock(&self.applied).clone()
    }

    pub fn url(&self) -> String {
        lock(&self.status).url.clone()
    }

    /// The engine being served now (None while restarting or failed). Never waits.
    pub fn app(&self) -> Option<Arc<crate::server::App>> {
        lock(&self.app_host).as_ref().and_then(|f| f.app())
    }

    fn set(&self, f: impl FnOnce(&mut Status)) {
        f(&mut lock(&self.status));
    }

    fn reject(&self, e: &ConfigError, no_engine: &str) {
        tracing::warn!("settings rejected: {e}");
        let running = lock(&self.applied).is_some();
        self.set(|s| {
            s.config_error = Some(e.into());
            if !running {
                s.phase = Phase::Failed;
                s.message = no_engine.into();
            }
        });
    }

    /// Re-read the file and apply it.
    pub async fn reload(&self) {
        let _change = self.changes.lock().await;
        match Settings::load(&self.path) {
            Ok(new) => self.apply(new).await,
            Err(e) => self.reject(&e, "No engine: the settings file has a problem"),
        }
    }

    /// Check and write new settings (from the settings window), then apply them. Invalid
    /// settings are refused and the file is left as it was. Returns whether the engine
    /// restarts.
    pub async fn save(&self, new: Settings) -> Result<bool, ConfigError> {
        let _change = self.changes.lock().await;
        new.validate()?;
        new.save(&self.path)?;
        let restart = lock(&self.applied).as_ref().is_none_or(|old| old.needs_restart(&new));
        self.apply(new).await;
        Ok(restart)
    }

    /// Make `id` the default model and load it (the tray's model picker).
    pub async fn select_model(&self, id: &str) -> Result<(), ConfigError> {
        let mut s = match self.settings() {
            Some(s) => s,
            None => Settings::load(&self.path)?,
        };
        s.default_model = id.to_string();
        self.save(s).await.map(|_| ())
    }

    async fn apply(&self, new: Settings) {
        self.set(|s| s.config_error = None);
        let old = self.settings();
        match old {
            Some(old) if old == new => {}
            Some(old) if !old.needs_restart(&new) => self.apply_live(&old, new).await,
            old => {
                self.launch(new, old).await;
            }
        }
        self.sync_ollama_port().await;
    }

    /// Listen on Ollama's port while the applied settings ask for it (and the port is free),
    /// on the app host that serves now (a new port means a new app host).
    async fn sync_ollama_port(&self) {
        let want = self.settings().is_some_and(|s| s.ollama_port);
        let app_host = lock(&self.app_host).clone();
        let mut listener = self.ollama_listener.lock().await;
        let keep = match (&*listener, &app_host) {
            (Some(l), Some(f)) => want && l.serves(f),
            _ => false,
        };
        if !keep {
            // Dropped first: the port is free again before it is bound anew.
            *listener = None;
        }
        let (mut url, mut error) = (listener.as_ref().map(|l| format!("http://{}", l.addr)), None);
        if want && listener.is_none() {
            if let Some(app_host) = app_host {
                let ip = self.server.lock().await.as_ref().map(|s| s.addr.ip());
                let addr = std::net::SocketAddr::new(
                    ip.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1])),
                    crate::server::OLLAMA_PORT,
                );
                match crate::server::ExtraListener::bind(&app_host, addr).await {
                    Ok(l) => {
                        url = Some(format!("http://{}", l.addr));
                        *listener = Some(l);
                    }
                    Err(e) => {
                        tracing::warn!("{e}");
                        error = Some(format!("{e} (is Ollama running?)"));
                    }
                }
            }
        }
        self.set(|s| {
            s.ollama_url = url;
            s.ollama_port_error = error;
        });
    }

    async fn apply_live(&self, old: &Settings, new: Settings) {
        let app = self.app();
        if let Some(app) = &app {
            *lock(&app.sampling) = new.sampling;
        }
        *lock(&self.applied) = Some(new.clone());
        if old.default_model != new.default_model {
            if let Some(app) = app {
                let id = new.default_model.clone();
                self.set(|s| {
                    s.loading = Some(id.clone());
                    s.message = format!("Loading {id}…");
                });
                let result = app.engine.lease_model(&id).await;
                self.set(|s| {
                    s.loading = None;
                    s.message = match &result {
                        Ok(_) => format!("Serving {id}"),
                        Err(e) => format!("Could not load {id}: {e}"),
                    };
                });
            }
        }
    }

    /// (Re)start the engine with `new`; on failure go back to `old` if there is one.
    async fn launch(&self, new: Settings, old: Option<Settings>) {
        let mut guard = self.server.lock().await;
        let Some(server) = guard.as_mut() else { return };
        // A new port is bound before the old engine goes, so a busy port changes nothing.
        let mut moved: Option<Server> = None;
        if new.port != 0 && new.port != server.addr.port() {
            match Server::bind(ServeConfig::from_settings(&new, self.log_dir.clone())).await {
                Ok(s) => {
                    s.app_host.set_control(server.app_host.control_router());
                    moved = Some(s);
                }
                Err(e) => {
                    let e = ConfigError::Invalid { field: "port".into(), message: e.to_string() };
                    return self.reject(&e, "No engine");
                }
            }
        }
        if old.is_some() {
            let busy = server.app().map_or(0, |a| {
                let f = a.engine.foreground.snapshot();
                f.foreground_active + f.foreground_queued
            });
            self.set(|s| {
                s.phase = Phase::Restarting;
                s.message = format!("Restarting the engine: finishing {busy} request(s)");
            });
            let old_app = server
                .unhost(
                    "The engine is restarting to apply new settings; try again in a moment",
                    RESTART_GRACE,
                )
                .await;
            // The old engine (and its model memory) goes before the new one loads.
            drop(old_app);
        }
        if let Some(new_server) = moved {
            let old_server = std::mem::replace(server, new_server);
            *lock(&self.app_host) = Some(server.app_host.clone());
            // In the background: the request that asked for this move is still on the old
            // listener, and its graceful shutdown would wait for it.
            tokio::spawn(old_server.shutdown());
            let url = server.url();
            self.set(|s| s.url = url);
        }
        self.set(|s| {
            s.phase = if old.is_some() { Phase::Restarting } else { Phase::Starting };
            s.message = format!("Loading {}…", new.default_model);
        });
        server.app_host.set_unavailable(format!(
            "The engine is loading {}; try again in a moment",
            new.default_model
        ));
        let config = new.engine_config();
        let started = tokio::task::spawn_blocking(move || Engine::start(config)).await;
        let started = match started {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the engine panicked while starting: {e}")),
        };
        let hosted = started.and_then(|engine| {
            server
                .host(Arc::new(engine), ServeConfig::from_settings(&new, self.log_dir.clone()))
                .map_err(|e| e.to_string())
        });
        match hosted {
            Ok(_) => {
                *lock(&self.applied) = Some(new.clone());
                self.set(|s| {
                    s.phase = Phase::Running;
                    s.message = format!("Serving {}", new.default_model);
                    if old.is_some() {
                        s.restarts += 1;
                    }
                });
                tracing::info!(model = %new.default_model, "engine running");
            }
            Err(e) => {
                tracing::error!("the engine could not start: {e}");
                server.app_host.set_unavailable(format!("The engine could not start: {e}"));
                let problem = ConfigError::Invalid {
                    field: "default_model".into(),
                    message: format!("the engine could not start with these settings: {e}"),
                };
                drop(guard);
                match old {
                    Some(old) => {
                        *lock(&self.applied) = None;
                        Box::pin(self.launch(old.guarded_as(&new), None)).await;
                        self.set(|s| s.config_error = Some((&problem).into()));
                    }
                    None => {
                        *lock(&self.applied) = None;
                        self.reject(&problem, &format!("No engine: {e}"));
                    }
                }
            }
        }
    }

    /// Stop watching, drain the engine and close the listener.
    pub async fn shutdown(&self) {
        lock(&self.watcher).take();
        self.ollama_listener.lock().await.take();
        self.downloads.cancel_all();
        if let Some(server) = self.server.lock().await.take() {
            server.shutdown().await;
        }
    }
}
