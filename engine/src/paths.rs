//! Where Perch keeps things on disk.

use std::path::PathBuf;

/// The id `perch run` / `perch serve` use when no model is named.
pub const DEFAULT_MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct";

/// The port the API listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7342;

/// The models directory: `$PERCH_MODELS_DIR`, else the platform data directory
/// (`~/Library/Application Support/dev.Perch.Perch/models` on macOS,
/// `~/.local/share/perch/models` on Linux).
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PERCH_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("dev", "Perch", "Perch")
        .map(|d| d.data_dir().join("models"))
        .unwrap_or_else(|| PathBuf::from(".perch/models"))
}

/// Where the chat window keeps conversations: `$PERCH_DATA_DIR/conversations`, else the
/// platform data directory's (`~/Library/Application Support/dev.Perch.Perch/conversations`
/// on macOS, `~/.local/share/perch/conversations` on Linux).
pub fn conversations_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PERCH_DATA_DIR") {
        return PathBuf::from(dir).join("conversations");
    }
    directories::ProjectDirs::from("dev", "Perch", "Perch")
        .map(|d| d.data_dir().join("conversations"))
        .unwrap_or_else(|| PathBuf::from(".perch/conversations"))
}

/// The chat's MCP servers file: `$PERCH_CONFIG_DIR/mcp.json`, else the platform config
/// directory's (beside `perch.toml`).
pub fn mcp_file() -> PathBuf {
    if let Some(dir) = std::env::var_os("PERCH_CONFIG_DIR") {
        return PathBuf::from(dir).join("mcp.json");
    }
    directories::ProjectDirs::from("dev", "Perch", "Perch")
        .map(|d| d.config_dir().join("mcp.json"))
        .unwrap_or_else(|| PathBuf::from(".perch/mcp.json"))
}

/// Where logs go (the request log among them): `$PERCH_LOG_DIR`, else the platform's
/// (`~/Library/Logs/...`-style cache directory on macOS, `~/.cache/perch/logs` on Linux).
pub fn log_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PERCH_LOG_DIR") {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("dev", "Perch", "Perch")
        .map(|d| d.cache_dir().join("logs"))
        .unwrap_or_else(|| PathBuf::from(".perch/logs"))
}

/// Where the prefix cache keeps states across restarts: `$PERCH_CACHE_DIR/prefix`, else the
/// platform cache directory's (`~/Library/Caches/dev.Perch.Perch/prefix` on macOS,
/// `~/.cache/perch/prefix` on Linux).
pub fn prefix_cache_dir() -> PathBuf {
    cache_subdir("prefix")
}

/// Where the CPU backend keeps models' 8-bit host copies (`model/host_matrix/store.rs`):
/// `$PERCH_CACHE_DIR/host-copies`, else the platform cache directory's.
pub fn host_copy_dir() -> PathBuf {
    cache_subdir("host-copies")
}

/// `name` under `$PERCH_CACHE_DIR`, else under the platform cache directory.
fn cache_subdir(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("PERCH_CACHE_DIR") {
        return PathBuf::from(dir).join(name);
    }
    directories::ProjectDirs::from("dev", "Perch", "Perch")
        .map(|d| d.cache_dir().join(name))
        .unwrap_or_else(|| PathBuf::from(".perch/cache").join(name))
}
