//! The MCP servers file, in the format Claude Desktop and LM Studio use:
//! `{"mcpServers": {"name": {"command", "args", "env"}}}` for a local server spoken to over
//! stdio, `{"url", "headers"}` for one over streamable HTTP. `alwaysAllow` lists the tools
//! the chat calls without asking; `tools` (Perch's) limits which of a server's tools are
//! offered. Fields Perch does not use are refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    #[serde(rename = "mcpServers", default)]
    pub servers: BTreeMap<String, ServerSpec>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServerSpec {
    /// `stdio` or `http` / `streamable-http`, when the file says; else read from the fields.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub always_allow: Vec<String>,
    /// Perch's own key: the tools offered to the model (absent: all the server has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

/// How a server is reached, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String>, cwd: Option<String> },
    Http { url: String, headers: BTreeMap<String, String> },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{field}`: {message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

fn invalid(field: String, message: impl Into<String>) -> Invalid {
    Invalid { field, message: message.into() }
}

impl ServerSpec {
    pub fn transport(&self, name: &str) -> Result<Transport, Invalid> {
        let at = |f: &str| format!("mcpServers.{name}.{f}");
        let kind = self.kind.as_deref().map(str::to_ascii_lowercase);
        match (kind.as_deref(), &self.command, &self.url) {
            (None | Some("stdio"), Some(command), None) if !command.trim().is_empty() => {
                if !self.headers.is_empty() {
                    return Err(invalid(at("headers"), "headers go with `url`, not `command`"));
                }
                Ok(Transport::Stdio {
                    command: command.clone(),
                    args: self.args.clone(),
                    env: self.env.clone(),
                    cwd: self.cwd.clone(),
                })
            }
            (
                None | Some("http") | Some("streamable-http") | Some("streamablehttp"),
                None,
                Some(url),
            ) => {
                let ok = url.starts_with("http://") || url.starts_with("https://");
                if !ok {
                    return Err(invalid(at("url"), format!("`{url}` is not an http(s) URL")));
                }
                if !self.args.is_empty() || !self.env.is_empty() || self.cwd.is_some() {
                    return Err(invalid(
                        at("url"),
                        "args, env and cwd go with `command`, not `url`",
                    ));
                }
                for (k, v) in &self.headers {
                    if axum::http::HeaderName::from_bytes(k.as_bytes()).is_err()
                        || axum::http::HeaderValue::from_str(v).is_err()
                    {
                        return Err(invalid(at("headers"), format!("`{k}` is not a valid header")));
                    }
                }
                Ok(Transport::Http { url: url.clone(), headers: self.headers.clone() })
            }
            (Some(k), _, _)
                if !matches!(k, "stdio" | "http" | "streamable-http" | "streamablehttp") =>
            {
                Err(invalid(at("type"), format!("`{k}` is not a transport (stdio, http)")))
            }
            (_, Some(_), Some(_)) => Err(invalid(at("url"), "give `command` or `url`, not both")),
            _ => Err(invalid(
                at("command"),
                "a server needs `command` (stdio) or `url` (streamable HTTP)",
            )),
        }
    }
}

impl McpConfig {
    /// Parse and check the file's text: every server has a transport, names are usable as
    /// tool-name prefixes.
    pub fn parse(text: &str) -> Result<McpConfig, Invalid> {
        if text.trim().is_empty() {
            return Ok(McpConfig::default());
        }
        let de = &mut serde_json::Deserializer::from_str(text);
        let config: McpConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            invalid(if path == "." { "mcpServers".into() } else { path }, e.inner().to_string())
        })?;
        for (name, spec) in &config.servers {
            if name.is_empty()
                || name.len() > 32
                || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(
                    format!("mcpServers.{name}"),
                    "a server's name is 1 to 32 of A-Z a-z 0-9 - _ (it prefixes its tools' names)",
                ));
            }
            spec.transport(name)?;
        }
        Ok(config)
    }

    pub fn read(path: &Path) -> Result<McpConfig, Invalid> {
        match std::fs::read_to_string(path) {
            Ok(text) => McpConfig::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(McpConfig::default()),
            Err(e) => Err(invalid("file".into(), format!("{}: {e}", path.display()))),
        }
    }

    pub fn to_text(&self) -> String {
        serde_json::to_string_pretty(self).expect("serializes") + "\n"
    }
}
