//! `/perch/mcp`: the MCP servers file and the chat window's tool calls. Served beside the UI
//! and only to Perch's own pages (the guard); the page asks the user before each call it
//! sends here (docs/chat-ui.md).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppHost;
use crate::mcp::{Manager, McpConfig, McpError};

pub const PREFIX: &str = "/perch/mcp";

pub fn routes() -> Router<Arc<AppHost>> {
    Router::new()
        .route(PREFIX, get(show).put(save))
        .route("/perch/mcp/tools", get(tools))
        .route("/perch/mcp/call", post(call))
        .route("/perch/mcp/allow", post(allow))
}

fn manager(host: &AppHost) -> Result<Arc<Manager>, ApiError> {
    host.mcp().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "This server runs no MCP tools (the desktop app, or `perch serve --mcp-file FILE`)",
        )
        .code("mcp_off")
    })
}

fn refusal(e: McpError) -> ApiError {
    let message = e.to_string();
    match e {
        McpError::Config(i) => ApiError::invalid(&i.field, message).code("invalid_mcp_config"),
        McpError::UnknownServer(_) | McpError::UnknownTool { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message).code("mcp_not_found")
        }
        McpError::Disabled(_) | McpError::Start { .. } | McpError::Call { .. } => {
            ApiError::new(StatusCode::BAD_GATEWAY, "mcp_error", message).code("mcp_server_failed")
        }
    }
}

async fn describe(m: &Manager) -> Value {
    let text = std::fs::read_to_string(m.path()).unwrap_or_default();
    let running = m.running().await;
    let (servers, error) = match McpConfig::parse(&text) {
        Ok(c) => (
            c.servers
                .iter()
                .map(|(name, s)| {
                    json!({"name": name, "transport": if s.url.is_some() { "http" } else { "stdio" },
                           "disabled": s.disabled, "always_allow": s.always_allow,
                           "running": running.contains(name)})
                })
                .collect::<Vec<_>>(),
            None,
        ),
        Err(e) => (vec![], Some(json!({"param": e.field, "message": e.to_string()}))),
    };
    json!({"path": m.path(), "text": text, "servers": servers, "error": error})
}

async fn show(State(host): State<Arc<AppHost>>) -> Result<Json<Value>, ApiError> {
    let m = manager(&host)?;
    Ok(Json(describe(&m).await))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Save {
    text: String,
}

/// Replace the file with `text` once it checks; servers restart when next needed.
async fn save(State(host): State<Arc<AppHost>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let m = manager(&host)?;
    let Save { text } = super::body::typed(&body)?;
    McpConfig::parse(&text).map_err(|e| refusal(e.into()))?;
    write(&m, text.as_bytes())?;
    m.stop_all().await;
    Ok(Json(describe(&m).await))
}

fn write(m: &Manager, bytes: &[u8]) -> Result<(), ApiError> {
    let io = |e: std::io::Error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("{}: {e}", m.path().display()),
        )
    };
    if let Some(dir) = m.path().parent() {
        crate::private_files::create_dir_all(dir).map_err(io)?;
    }
    crate::private_files::write_atomic(m.path(), bytes).map_err(io)
}

async fn tools(State(host): State<Arc<AppHost>>) -> Result<Json<Value>, ApiError> {
    let m = manager(&host)?;
    let (tools, errors) = m.tools().await.map_err(refusal)?;
    let errors: Vec<_> = errors.iter().map(|e| json!({"message": e.to_string()})).collect();
    Ok(Json(json!({"tools": tools, "errors": errors})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    server: String,
    tool: String,
    #[serde(default)]
    arguments: serde_json::Map<String, Value>,
}

async fn call(State(host): State<Arc<AppHost>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let m = manager(&host)?;
    let c: Call = super::body::typed(&body)?;
    let r = m.call(&c.server, &c.tool, c.arguments).await.map_err(refusal)?;
    Ok(Json(json!({"text": r.text, "is_error": r.is_error})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Allow {
    server: String,
    tool: String,
}

/// "Always allow this tool": written into the file's `alwaysAllow`.
async fn allow(State(host): State<Arc<AppHost>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let m = manager(&host)?;
    let a: Allow = super::body::typed(&body)?;
    let mut config = m.config().map_err(refusal)?;
    let spec = config
        .servers
        .get_mut(&a.server)
        .ok_or_else(|| refusal(McpError::UnknownServer(a.server.clone())))?;
    if !spec.always_allow.contains(&a.tool) {
        spec.always_allow.push(a.tool.clone());
    }
    write(&m, config.to_text().as_bytes())?;
    m.stop_all().await; // the tool lists carry the permission
    Ok(Json(describe(&m).await))
}
