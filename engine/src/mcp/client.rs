//! The engine as an MCP client (the official Rust SDK, `rmcp`): servers start when the chat
//! first asks for tools, each call is bounded in time, and a server that crashes, hangs or
//! sends garbage becomes an error message naming it, never a fault of the engine. Dropping
//! the manager (the app quitting) stops every server it started.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Mutex;

use super::config::{McpConfig, Transport};

/// How long a server may take to start and answer `initialize`.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one tool call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Most text a tool's result passes to the model, in bytes.
pub const MAX_RESULT_BYTES: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("there is no MCP server `{0}` in the MCP servers file")]
    UnknownServer(String),
    #[error("MCP server `{0}` is disabled in the MCP servers file")]
    Disabled(String),
    #[error("MCP server `{server}` has no tool `{tool}`")]
    UnknownTool { server: String, tool: String },
    #[error("MCP server `{server}` did not start: {why}")]
    Start { server: String, why: String },
    #[error("MCP server `{server}` failed the call to `{tool}`: {why}")]
    Call { server: String, tool: String, why: String },
    #[error("MCP servers file: {0}")]
    Config(#[from] super::config::Invalid),
}

/// A tool as the chat offers it to the model.
#[derive(Debug, Clone, Serialize)]
pub struct ToolInfo {
    pub server: String,
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// Called without asking the user (`alwaysAllow` in the file).
    pub always_allowed: bool,
}

/// A tool's answer, as text for the model.
#[derive(Debug, Clone, Serialize)]
pub struct CallResult {
    pub text: String,
    /// The tool said it failed (the model still sees why).
    pub is_error: bool,
}

type Client = RunningService<RoleClient, ()>;

struct Running {
    client: Client,
    tools: Vec<ToolInfo>,
}

pub struct Manager {
    path: PathBuf,
    running: Mutex<HashMap<String, Arc<Running>>>,
    /// One start at a time per server; different servers start side by side.
    starting: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Raised by `stop_all`: a start that began before it does not keep its server.
    generation: std::sync::atomic::AtomicU64,
    start_timeout: Duration,
    call_timeout: Duration,
}

impl Manager {
    pub fn new(path: PathBuf) -> Manager {
        Manager::with_timeouts(path, START_TIMEOUT, CALL_TIMEOUT)
    }

    /// A manager with other bounds on starting a server and on one call.
    pub fn with_timeouts(path: PathBuf, start: Duration, call: Duration) -> Manager {
        Manager {
            path,
            running: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashMap::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
            start_timeout: start,
            call_timeout: call,
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn config(&self) -> Result<McpConfig, McpError> {
        Ok(McpConfig::read(&self.path)?)
    }

    /// Names of the servers running now.
    pub async fn running(&self) -> Vec<String> {
        self.running.lock().await.keys().cloned().collect()
    }

    /// Stop every server (their spec changed, or the app quits).
    pub async fn stop_all(&self) {
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let all: Vec<_> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        for r in all {
            if let Ok(r) = Arc::try_unwrap(r) {
                let _ = tokio::time::timeout(Duration::from_secs(5), r.client.cancel()).await;
            }
        }
    }

    /// Every enabled server's tools, starting servers as needed; servers that fail are
    /// reported beside the tools of the others.
    pub async fn tools(&self) -> Result<(Vec<ToolInfo>, Vec<McpError>), McpError> {
        let config = self.config()?;
        // Side by side: the first chat with tools waits for the slowest server, not the sum.
        let enabled = config.servers.iter().filter(|(_, spec)| !spec.disabled);
        let started =
            futures_util::future::join_all(enabled.map(|(name, _)| self.server(name, &config)))
                .await;
        let (mut tools, mut errors) = (vec![], vec![]);
        for r in started {
            match r {
                Ok(r) => tools.extend(r.tools.iter().cloned()),
                Err(e) => errors.push(e),
            }
        }
        Ok((tools, errors))
    }

    /// Call `tool` of `server` with `arguments` (a JSON object).
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> Result<CallResult, McpError> {
        let config = self.config()?;
        let r = self.server(server, &config).await?;
        if !r.tools.iter().any(|t| t.name == tool) {
            return Err(McpError::UnknownTool { server: server.into(), tool: tool.into() });
        }
        let fail = |why: String| McpError::Call { server: server.into(), tool: tool.into(), why };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = Some(arguments);
        let answer =
            tokio::time::timeout(self.call_timeout, r.client.peer().call_tool(params)).await;
        let result = match answer {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                // A transport that closed (the server exited) is started again next time.
                if r.client.is_closed() {
                    self.running.lock().await.remove(server);
                }
                return Err(fail(e.to_string()));
            }
            Err(_) => {
                return Err(fail(format!(
                    "no answer within {:.1} s",
                    self.call_timeout.as_secs_f64()
                )))
            }
        };
        let v = serde_json::to_value(&result).map_err(|e| fail(e.to_string()))?;
        Ok(result_text(&v))
    }

    async fn server(&self, name: &str, config: &McpConfig) -> Result<Arc<Running>, McpError> {
        let spec = config.servers.get(name).ok_or_else(|| McpError::UnknownServer(name.into()))?;
        if spec.disabled {
            return Err(McpError::Disabled(name.into()));
        }
        let live = |running: &HashMap<String, Arc<Running>>| {
            running.get(name).filter(|r| !r.client.is_closed()).cloned()
        };
        if let Some(r) = live(&*self.running.lock().await) {
            return Ok(r);
        }
        let slot = self.starting.lock().await.entry(name.to_string()).or_default().clone();
        let _one = slot.lock().await;
        // Started by another caller while this one waited.
        if let Some(r) = live(&*self.running.lock().await) {
            return Ok(r);
        }
        let generation = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        let start_err = |why: String| McpError::Start { server: name.into(), why };
        let transport = spec.transport(name)?;
        let started = tokio::time::timeout(self.start_timeout, start(transport)).await;
        let client = match started {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => return Err(start_err(why)),
            Err(_) => {
                return Err(start_err(format!(
                    "no answer within {:.1} s",
                    self.start_timeout.as_secs_f64()
                )))
            }
        };
        let listed = tokio::time::timeout(self.start_timeout, client.peer().list_all_tools()).await;
        let tools = match listed {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(start_err(format!("listing its tools: {e}"))),
            Err(_) => return Err(start_err("listing its tools took too long".into())),
        };
        let tools = tools
            .iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .map(|t| ToolInfo {
                server: name.into(),
                name: t["name"].as_str().unwrap_or("").to_string(),
                description: t["description"].as_str().unwrap_or("").to_string(),
                input_schema: t.get("inputSchema").cloned().unwrap_or(Value::Null),
                always_allowed: false,
            })
            .filter(|t| spec.tools.as_ref().is_none_or(|only| only.contains(&t.name)))
            .map(|mut t| {
                t.always_allowed = spec.always_allow.contains(&t.name);
                t
            })
            .collect();
        tracing::info!(server = name, "MCP server started");
        let mut running = self.running.lock().await;
        if self.generation.load(std::sync::atomic::Ordering::SeqCst) != generation {
            // Stopped (the file changed, or the app quits) while it started.
            drop(running);
            let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
            return Err(start_err("stopped while starting".into()));
        }
        let r = Arc::new(Running { client, tools });
        running.insert(name.to_string(), r.clone());
        Ok(r)
    }
}

async fn start(transport: Transport) -> Result<Client, String> {
    match transport {
        Transport::Stdio { command, args, env, cwd } => {
            let mut cmd = tokio::process::Command::new(&command);
            cmd.args(&args).envs(&env).kill_on_drop(true);
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            // The server's own log lines go to the engine's log, not its stdout (the protocol).
            cmd.stderr(std::process::Stdio::null());
            let child = TokioChildProcess::new(cmd).map_err(|e| format!("`{command}`: {e}"))?;
            ().serve(child).await.map_err(|e| e.to_string())
        }
        Transport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    axum::http::HeaderName::from_bytes(k.as_bytes()),
                    axum::http::HeaderValue::from_str(&v),
                ) {
                    custom.insert(k, v);
                }
            }
            let config =
                rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url)
                    .custom_headers(custom);
            let transport = StreamableHttpClientTransport::from_config(config);
            ().serve(transport).await.map_err(|e| e.to_string())
        }
    }
}

/// A tool result's content as text: text parts joined, other parts named, cut to
/// `MAX_RESULT_BYTES`.
fn result_text(v: &Value) -> CallResult {
    let mut parts = vec![];
    for c in v["content"].as_array().into_iter().flatten() {
        match c["type"].as_str() {
            Some("text") => parts.push(c["text"].as_str().unwrap_or("").to_string()),
            Some(kind) => parts.push(format!("[{kind} content]")),
            None => {}
        }
    }
    if parts.is_empty() {
        if let Some(s) = v.get("structuredContent") {
            parts.push(s.to_string());
        }
    }
    let mut text = parts.join("\n");
    if text.len() > MAX_RESULT_BYTES {
        let mut cut = MAX_RESULT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n[cut: the result was longer]");
    }
    CallResult { text, is_error: v["isError"].as_bool().unwrap_or(false) }
}
