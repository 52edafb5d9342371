//! MCP tools for the chat window: the servers file (`config.rs`) and the engine as their
//! client (`client.rs`). The chat asks the user before each call; see docs/chat-ui.md.

pub mod client;
pub mod config;

pub use client::{CallResult, Manager, McpError, ToolInfo};
pub use config::McpConfig;
