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
    place(Env::Is("PERCH_MODELS_DIR"), Base::Data, "models", ".perch/models")
}

/// Where the chat window keeps conversations: `$PERCH_DATA_DIR/conversations`, else the
/// platform data directory's (`~/Library/Application Support/dev.Perch.Perch/conversations`
/// on macOS, `~/.local/share/perch/conversations` on Linux).
pub fn conversations_dir() -> PathBuf {
    place(Env::Holds("PERCH_DATA_DIR"), Base::Data, "conversations", ".perch/conversations")
}

/// The chat's MCP servers file: `$PERCH_CONFIG_DIR/mcp.json`, else the platform config
/// directory's (beside `perch.toml`).
pub fn mcp_file() -> PathBuf {
    place(Env::Holds("PERCH_CONFIG_DIR"), Base::Config, "mcp.json", ".perch/mcp.json")
}

/// Where logs go (the request log among them): `$PERCH_LOG_DIR`, else the platform's
/// (`~/Library/Logs/...`-style cache directory on macOS, `~/.cache/perch/logs` on Linux).
pub fn log_dir() -> PathBuf {
    place(Env::Is("PERCH_LOG_DIR"), Base::Cache, "logs", ".perch/logs")
}

/// Where the prefix cache keeps states across restarts: `$PERCH_CACHE_DIR/prefix`, else the
/// platform cache directory's (`~/Library/Caches/dev.Perch.Perch/prefix` on macOS,
/// `~/.cache/perch/prefix` on Linux).
pub fn prefix_cache_dir() -> PathBuf {
    place(Env::Holds("PERCH_CACHE_DIR"), Base::Cache, "prefix", ".perch/cache/prefix")
}

/// Where the CPU backend keeps models' 8-bit host copies (`model/host_matrix/store.rs`):
/// `$PERCH_CACHE_DIR/host-copies`, else the platform cache directory's.
pub fn host_copy_dir() -> PathBuf {
    place(Env::Holds("PERCH_CACHE_DIR"), Base::Cache, "host-copies", ".perch/cache/host-copies")
}

/// The variable that moves a place: it names the place itself, or the folder holding it.
enum Env {
    Is(&'static str),
    Holds(&'static str),
}

/// Which of the platform's directories a place lives in.
enum Base {
    Data,
    Config,
    Cache,
}

/// `name` where the variable says, else in the platform's `base` directory, else (no home
/// directory at all) at `fallback`, relative to the working directory.
fn place(env: Env, base: Base, name: &str, fallback: &str) -> PathBuf {
    let from_env = match env {
        Env::Is(var) => std::env::var_os(var).map(PathBuf::from),
        Env::Holds(var) => std::env::var_os(var).map(|d| PathBuf::from(d).join(name)),
    };
    from_env.unwrap_or_else(|| {
        directories::ProjectDirs::from("dev", "Perch", "Perch")
            .map(|d| {
                match base {
                    Base::Data => d.data_dir(),
                    Base::Config => d.config_dir(),
                    Base::Cache => d.cache_dir(),
                }
                .join(name)
            })
            .unwrap_or_else(|| PathBuf::from(fallback))
    })
}
