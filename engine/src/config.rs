//! The settings file (`perch.toml`) the desktop app and `perch serve --config` run from: what
//! it holds, how it is checked, and which changes need an engine restart (docs/settings.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::decode::DraftSetting;
use crate::runtime::batch::MAX_BATCH;
use crate::runtime::{EngineConfig, KeepAlive, LadderConfig, ModelAliases, WarmupProfile};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("{path} is not valid TOML: {message}")]
    Syntax { path: String, message: String },
    #[error("`{field}`: {message}")]
    Invalid { field: String, message: String },
}

impl ConfigError {
    /// The setting at fault, when one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Sampling used when a request leaves a field out. Applied live, without a restart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        // OpenAI's defaults, so clients that omit them get what they expect elsewhere.
        SamplingDefaults { temperature: 1.0, top_p: 1.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Where installed models live (empty: the platform data directory).
    pub models_dir: String,
    /// Where the chat window keeps its conversations (empty: the platform data directory).
    pub conversations_dir: String,
    /// The MCP servers file the chat's tools come from (empty: `mcp.json` in the platform
    /// config directory), in Claude Desktop's format.
    pub mcp_file: String,
    /// The model loaded at start and offered first in the chat window.
    pub default_model: String,
    /// Loopback port of the API and the chat UI (0: any free port).
    pub port: u16,
    /// When set, API calls need `Authorization: Bearer <key>`.
    pub api_key: String,
    /// Web origins (scheme://host:port) whose pages may call the API.
    pub allowed_origins: Vec<String>,
    /// Most tokens of context per request (0: each model's own limit).
    pub context_length: usize,
    /// Background warmup ladder: `default`, `turbo` or `off`.
    pub warmup_profile: WarmupProfile,
    /// Quiet seconds after a request before background warmup may run.
    pub idle_grace_s: f64,
    /// Tokens per warmup-ladder prefill chunk: the longest a user waits for the ladder.
    pub ladder_chunk: usize,
    /// Interruptions of one rung that end the ladder (docs/runtime.md §5).
    pub ladder_max_interruptions: u32,
    /// Seconds the load-time MTP warmup may take before it is cancelled (docs/runtime.md §4).
    pub warmup_deadline_s: f64,
    /// Warm the MTP head right after a model loads (docs/runtime.md §4).
    pub load_warmup: bool,
    /// Speculative decoding: `auto`, `none`, `lookup`, `mtp`, `mtp:N` (used at `max_batch` 1).
    pub draft: DraftSetting,
    /// Requests generating at once, in one batch (1: one at a time, with drafts).
    pub max_batch: usize,
    /// Most tokens one batch step feeds while a request is streaming: a long prompt joins
    /// this many tokens a step, so running streams never wait longer than one such step.
    pub step_tokens: usize,
    /// Seconds an unused model stays loaded (0: unload after each request, -1: never).
    pub keep_alive_s: i64,
    /// Also write prompts and completions to the request log.
    pub log_text: bool,
    /// Start Perch when the user logs in (the desktop app applies it).
    pub launch_at_login: bool,
    /// Also answer on Ollama's port (11434, loopback) when it is free, for tools that
    /// hard-code it.
    pub ollama_port: bool,
    /// Offer MLX models found in the Hugging Face cache, in place.
    pub scan_hf_cache: bool,
    /// Where model downloads come from (empty: `$HF_ENDPOINT`, else huggingface.co).
    pub hub_endpoint: String,
    /// Prefix cache in memory, in MiB (0: off): earlier turns' keys and values, reused by
    /// requests that start with the same tokens.
    pub prefix_cache_mb: u64,
    /// Prefix cache on disk (the platform cache directory), in MiB (0: off); it survives
    /// restarts.
    pub prefix_cache_disk_mb: u64,
    pub sampling: SamplingDefaults,
    /// Model names clients send, mapped to installed models: `"claude-*" = "default"` answers
    /// Claude Code's model names with the default model (docs/settings.md).
    pub model_aliases: std::collections::BTreeMap<String, String>,
    /// Read tool calls a model writes outside its template's format (a ```json block, a bare
    /// object, another family's markup) as calls, when they validate against the tool.
    pub tool_call_recovery: bool,
}

impl Default for Settings {
    /// Every setting's default, the one place for them: `perch serve`'s flags default to
    /// these too, and the runtime's own (ladder, keep-alive, warmup deadline) are read here.
    fn default() -> Self {
        let (engine, ladder) = (EngineConfig::default(), LadderConfig::default());
        Settings {
            models_dir: String::new(),
            conversations_dir: String::new(),
            mcp_file: String::new(),
            default_model: crate::paths::DEFAULT_MODEL_ID.into(),
            port: crate::paths::DEFAULT_PORT,
            api_key: String::new(),
            allowed_origins: vec![],
            context_length: 0,
            warmup_profile: WarmupProfile::default(),
            idle_grace_s: ladder.idle_grace.as_secs_f64(),
            ladder_chunk: ladder.chunk,
            ladder_max_interruptions: ladder.max_interruptions,
            warmup_deadline_s: engine.warmup_deadline.as_secs_f64(),
            load_warmup: true,
            draft: DraftSetting::default(),
            max_batch: crate::runtime::engine::DEFAULT_MAX_BATCH,
            step_tokens: crate::runtime::batch::STEP_TOKENS,
            keep_alive_s: engine.keep_alive.as_setting(),
            log_text: false,
            launch_at_login: false,
            ollama_port: false,
            scan_hf_cache: true,
            hub_endpoint: String::new(),
            prefix_cache_mb: 2048,
            prefix_cache_disk_mb: 8192,
            sampling: SamplingDefaults::default(),
            model_aliases: ModelAliases::defaults().into_iter().collect(),
            tool_call_recovery: engine.tool_call_recovery,
        }
    }
}

fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into() }
}

/// `T` from `de`, a value that fails its type (a bad `draft`, a string for a number) named
/// by its setting's path (`draft`, `sampling.top_p`); other failures (not TOML, not an
/// object) are `syntax`.
fn typed<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
    de: D,
    syntax: impl FnOnce(String) -> ConfigError,
) -> Result<T, ConfigError>
where
    D::Error: std::fmt::Display,
{
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let message = e.into_inner().to_string();
        match field.as_str() {
            "." | "" => syntax(message),
            _ => ConfigError::Invalid { field, message },
        }
    })
}

/// A web origin a setting or `--allow-origin` may allow: `scheme://host[:port]` over http(s).
/// `null` (sandboxed frames, `file:` pages: any of them) and paths are refused.
pub fn parse_origin(o: &str) -> Result<String, String> {
    let ok = (o.starts_with("http://") || o.starts_with("https://"))
        && !o.ends_with('/')
        && o.split("://").nth(1).is_some_and(|h| !h.is_empty() && !h.contains('/'));
    match ok {
        true => Ok(o.to_string()),
        false => Err(format!(
            "`{o}` is not an origin like http://localhost:3000 (scheme://host[:port], no path)"
        )),
    }
}

impl Settings {
    /// These settings, guarded at least as strictly as `file`'s: what the engine falls back
    /// to when `file` cannot start. The key the file names is required (or the old one, when
    /// the file names none), and only origins both allow may call: the listener never serves
    /// more openly than the settings file and `GET /perch/config` say.
    pub fn guarded_as(self, file: &Settings) -> Settings {
        let api_key = if file.api_key.is_empty() { self.api_key } else { file.api_key.clone() };
        let allowed_origins =
            self.allowed_origins.into_iter().filter(|o| file.allowed_origins.contains(o)).collect();
        Settings { api_key, allowed_origins, ..self }
    }
}

impl Settings {
    /// The platform's settings file (`$PERCH_CONFIG` overrides it).
    pub fn default_path() -> PathBuf {
        if let Some(p) = std::env::var_os("PERCH_CONFIG") {
            return PathBuf::from(p);
        }
        directories::ProjectDirs::from("dev", "Perch", "Perch")
            .map(|d| d.config_dir().join("perch.toml"))
            .unwrap_or_else(|| PathBuf::from(".perch/perch.toml"))
    }

    /// Parse and check a settings file's text.
    pub fn parse(text: &str, path: &Path) -> Result<Settings, ConfigError> {
        // An empty file is what a write cut short by a power loss leaves behind; taking it
        // for the defaults would drop every setting, the API key among them.
        if text.trim().is_empty() {
            return Err(ConfigError::Syntax {
                path: path.display().to_string(),
                message: "the file is empty; Perch does not assume the defaults".into(),
            });
        }
        let syntax = |message| ConfigError::Syntax { path: path.display().to_string(), message };
        let de = toml::Deserializer::new(text);
        let s: Settings = typed(de, syntax)?;
        s.validate()?;
        Ok(s)
    }

    /// Read the file; a missing file means the defaults.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Settings::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Settings::default()),
            Err(e) => Err(ConfigError::Read(path.to_path_buf(), e)),
        }
    }

    /// Write atomically (a reader never sees half a file) and private to the user (it may hold
    /// the API key).
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let err = |e| ConfigError::Write(path.to_path_buf(), e);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let text = format!(
            "# Perch settings. Edit here or in the settings window; changes apply on save.\n{}",
            toml::to_string_pretty(self).expect("settings serialize")
        );
        crate::private_files::write_atomic(path, text.as_bytes()).map_err(err)
    }

    /// This file's settings with `patch` (a JSON object of settings) laid over them: fields
    /// the patch leaves out keep their values. The API key changes only when the patch names
    /// it with a value: `""` (what a form with an empty password field sends) keeps it, and
    /// `null` removes it.
    pub fn patched(
        &self,
        patch: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Settings, ConfigError> {
        use serde_json::Value;
        let mut v = serde_json::to_value(self).map_err(|e| invalid("body", e.to_string()))?;
        for (k, val) in patch {
            match (k.as_str(), val) {
                ("api_key", Value::String(s)) if s.is_empty() => {}
                ("api_key", Value::Null) => v["api_key"] = Value::from(""),
                (_, Value::Object(inner)) if v[&k].is_object() => {
                    for (ik, iv) in inner {
                        v[&k][ik] = iv;
                    }
                }
                (_, val) => v[&k] = val,
            }
        }
        let syntax = |message| ConfigError::Syntax { path: "the request body".into(), message };
        let s: Settings = typed(v, syntax)?;
        s.validate()?;
        Ok(s)
    }

    /// What a file that fails its checks still says about reaching Perch (port, API key,
    /// allowed origins), so that the UI can be served where the user expects it and a key in
    /// the file keeps guarding it. A file that is empty or not even TOML yields a random key:
    /// Perch fails closed rather than serving without the key the file may have held.
    pub fn salvage(text: &str) -> Settings {
        let table = toml::from_str::<toml::Table>(text).ok().filter(|_| !text.trim().is_empty());
        let Some(table) = table else {
            return Settings { api_key: random_key(), ..Settings::default() };
        };
        let d = Settings::default();
        Settings {
            port: table
                .get("port")
                .and_then(|p| p.as_integer())
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(d.port),
            api_key: match table.get("api_key") {
                None => String::new(),
                Some(toml::Value::String(k)) => k.clone(),
                Some(_) => random_key(),
            },
            allowed_origins: table
                .get("allowed_origins")
                .and_then(|o| o.as_array())
                .map(|o| o.iter().filter_map(|s| s.as_str().map(String::from)).collect())
                .unwrap_or_default(),
            ..d
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.idle_grace_s.is_finite() && (0.0..=86_400.0).contains(&self.idle_grace_s)) {
            return Err(invalid(
                "idle_grace_s",
                format!("must be 0 to 86400 seconds, not {}", self.idle_grace_s),
            ));
        }
        if !(16..=8192).contains(&self.ladder_chunk) {
            return Err(invalid(
                "ladder_chunk",
                format!("must be 16 to 8192 tokens, not {}", self.ladder_chunk),
            ));
        }
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            return Err(invalid(
                "max_batch",
                format!("must be 1 to {MAX_BATCH} requests, not {}", self.max_batch),
            ));
        }
        if !(8..=8192).contains(&self.step_tokens) {
            return Err(invalid(
                "step_tokens",
                format!("must be 8 to 8192 tokens, not {}", self.step_tokens),
            ));
        }
        if !(1..=1000).contains(&self.ladder_max_interruptions) {
            return Err(invalid(
                "ladder_max_interruptions",
                format!("must be 1 to 1000, not {}", self.ladder_max_interruptions),
            ));
        }
        if !(self.warmup_deadline_s.is_finite() && (0.1..=600.0).contains(&self.warmup_deadline_s))
        {
            return Err(invalid(
                "warmup_deadline_s",
                format!("must be 0.1 to 600 seconds, not {}", self.warmup_deadline_s),
            ));
        }
        if self.keep_alive_s < -1 {
            return Err(invalid(
                "keep_alive_s",
                format!(
                    "must be -1 (forever), 0 (unload when idle) or seconds, not {}",
                    self.keep_alive_s
                ),
            ));
        }
        if self.context_length != 0 && self.context_length < 64 {
            return Err(invalid(
                "context_length",
                format!(
                    "must be 0 (the model's own) or at least 64 tokens, not {}",
                    self.context_length
                ),
            ));
        }
        for (field, mb) in [
            ("prefix_cache_mb", self.prefix_cache_mb),
            ("prefix_cache_disk_mb", self.prefix_cache_disk_mb),
        ] {
            if mb > 1 << 20 {
                return Err(invalid(field, format!("must be 0 to 1048576 MiB, not {mb}")));
            }
        }
        if let Err(e) = ModelAliases::new(self.model_aliases.clone()) {
            return Err(invalid("model_aliases", e));
        }
        if self.port != 0 && self.port < 1024 {
            return Err(invalid(
                "port",
                format!("must be 1024 to 65535 (or 0 for any free port), not {}", self.port),
            ));
        }
        if self.api_key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("api_key", "must not contain spaces or control characters"));
        }
        for o in &self.allowed_origins {
            parse_origin(o).map_err(|m| invalid("allowed_origins", m))?;
        }
        for (field, v) in [("sampling.temperature", self.sampling.temperature)] {
            if !(0.0..=2.0).contains(&v) {
                return Err(invalid(field, format!("must be 0 to 2, not {v}")));
            }
        }
        if !(self.sampling.top_p > 0.0 && self.sampling.top_p <= 1.0) {
            return Err(invalid(
                "sampling.top_p",
                format!("must be in (0, 1], not {}", self.sampling.top_p),
            ));
        }
        if !self.hub_endpoint.is_empty()
            && !self.hub_endpoint.starts_with("http://")
            && !self.hub_endpoint.starts_with("https://")
        {
            return Err(invalid(
                "hub_endpoint",
                format!("must be an http(s) URL, not `{}`", self.hub_endpoint),
            ));
        }
        let models_dir = self.models_dir();
        if models_dir.exists() && !models_dir.is_dir() {
            return Err(invalid(
                "models_dir",
                format!("{} is not a directory", models_dir.display()),
            ));
        }
        if self.default_model.is_empty() {
            return Err(invalid("default_model", "must name an installed model"));
        }
        if self.catalog().resolve(&self.default_model).is_none() {
            return Err(invalid(
                "default_model",
                format!(
                    "`{}` is not installed in {} (see the models page)",
                    self.default_model,
                    models_dir.display()
                ),
            ));
        }
        Ok(())
    }

    pub fn models_dir(&self) -> PathBuf {
        if self.models_dir.is_empty() {
            crate::paths::models_dir()
        } else {
            PathBuf::from(&self.models_dir)
        }
    }

    pub fn conversations_dir(&self) -> PathBuf {
        if self.conversations_dir.is_empty() {
            crate::paths::conversations_dir()
        } else {
            PathBuf::from(&self.conversations_dir)
        }
    }

    pub fn mcp_file(&self) -> PathBuf {
        if self.mcp_file.is_empty() {
            crate::paths::mcp_file()
        } else {
            PathBuf::from(&self.mcp_file)
        }
    }

    pub fn catalog(&self) -> Catalog {
        Catalog {
            models_dir: self.models_dir(),
            hf_cache: if self.scan_hf_cache { crate::catalog::hf_cache_dir() } else { None },
        }
    }

    pub fn hub_endpoint(&self) -> String {
        if !self.hub_endpoint.is_empty() {
            return self.hub_endpoint.trim_end_matches('/').to_string();
        }
        std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string()
    }

    /// Whether going from `self` to `new` needs the engine restarted; the rest (sampling
    /// defaults, the default model, launch at login, Ollama's port) applies live.
    pub fn needs_restart(&self, new: &Settings) -> bool {
        let live = |s: &Settings| Settings {
            sampling: SamplingDefaults::default(),
            default_model: String::new(),
            launch_at_login: false,
            ollama_port: false,
            ..s.clone()
        };
        live(self) != live(new)
    }

    pub fn engine_config(&self) -> EngineConfig {
        let mut ladder = LadderConfig::profile(self.warmup_profile);
        ladder.idle_grace = Duration::from_secs_f64(self.idle_grace_s);
        ladder.chunk = self.ladder_chunk;
        ladder.max_interruptions = self.ladder_max_interruptions;
        EngineConfig {
            models_dir: self.models_dir(),
            hf_cache: self.catalog().hf_cache,
            model: self.default_model.clone(),
            draft: self.draft,
            max_batch: self.max_batch,
            step_tokens: self.step_tokens,
            keep_alive: KeepAlive::from_secs(self.keep_alive_s),
            load_warmup: self.load_warmup,
            warmup_deadline: Duration::from_secs_f64(self.warmup_deadline_s),
            context_length: (self.context_length > 0).then_some(self.context_length),
            ladder,
            prefix_cache: crate::prefix_cache::PrefixCacheConfig {
                ram_bytes: (self.prefix_cache_mb << 20) as usize,
                disk_bytes: self.prefix_cache_disk_mb << 20,
                disk_dir: Some(crate::paths::prefix_cache_dir()),
                block: crate::prefix_cache::PrefixCacheConfig::block_for(!self.api_key.is_empty()),
            },
            model_aliases: ModelAliases::new(self.model_aliases.clone()).unwrap_or_default(),
            tool_call_recovery: self.tool_call_recovery,
            ..EngineConfig::default()
        }
    }
}

/// 128 random bits as hex, from the OS (a key nobody knows).
pub(crate) fn random_key() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        // No /dev/urandom: std's per-process random hash keys.
        use std::hash::{BuildHasher, Hasher};
        for chunk in b.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::Settings as S;

    #[test]
    fn a_fallback_is_guarded_as_the_file_says() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let old =
            S { api_key: "".into(), allowed_origins: o(&["http://a", "http://b"]), ..S::default() };
        let file = S { api_key: "new".into(), allowed_origins: o(&["http://b"]), ..S::default() };
        let f = old.clone().guarded_as(&file);
        assert_eq!((f.api_key.as_str(), f.allowed_origins), ("new", o(&["http://b"])));
        // A file that drops the key does not drop it before a start with it succeeds.
        let keyed = S { api_key: "old".into(), ..old };
        assert_eq!(keyed.guarded_as(&S::default()).api_key, "old");
    }

    use super::*;

    fn with_model() -> (tempfile::TempDir, Settings) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("m")).unwrap();
        std::fs::write(dir.path().join("m/config.json"), r#"{"model_type":"llama"}"#).unwrap();
        let s = Settings {
            models_dir: dir.path().display().to_string(),
            default_model: "m".into(),
            scan_hf_cache: false,
            ..Settings::default()
        };
        (dir, s)
    }

    #[test]
    fn round_trips_and_rejects_what_it_cannot_run() {
        let (dir, s) = with_model();
        s.validate().unwrap();
        let path = dir.path().join("perch.toml");
        s.save(&path).unwrap();
        assert_eq!(Settings::load(&path).unwrap(), s);
        let bad = |edit: &dyn Fn(&mut Settings), field: &str| {
            let mut t = s.clone();
            edit(&mut t);
            assert_eq!(t.validate().unwrap_err().field(), Some(field), "{t:?}");
        };
        bad(&|t| t.port = 80, "port");
        bad(&|t| t.keep_alive_s = -5, "keep_alive_s");
        bad(&|t| t.idle_grace_s = f64::NAN, "idle_grace_s");
        bad(&|t| t.default_model = "missing".into(), "default_model");
        bad(&|t| t.allowed_origins = vec!["localhost:3000".into()], "allowed_origins");
        bad(&|t| t.sampling.top_p = 0.0, "sampling.top_p");
        bad(&|t| t.context_length = 10, "context_length");
        bad(&|t| t.ladder_chunk = 0, "ladder_chunk");
        bad(&|t| t.ladder_max_interruptions = 0, "ladder_max_interruptions");
        bad(&|t| t.max_batch = 0, "max_batch");
        bad(&|t| t.max_batch = MAX_BATCH + 1, "max_batch");
        bad(&|t| t.step_tokens = 1, "step_tokens");
        bad(&|t| t.warmup_deadline_s = -1.0, "warmup_deadline_s");
        let typo = Settings::parse("prot = 1234\n", &path).unwrap_err();
        assert!(typo.to_string().contains("prot"), "{typo}");
        // Typed settings are refused where they are read, named by their path, in the file
        // and in the settings API's patch alike.
        for (text, field) in [
            ("draft = \"mtp:9\"\n", "draft"),
            ("draft = \"fast\"\n", "draft"),
            ("warmup_profile = \"fast\"\n", "warmup_profile"),
            ("[sampling]\ntop_p = \"high\"\n", "sampling.top_p"),
        ] {
            let e = Settings::parse(text, &path).unwrap_err();
            assert_eq!(e.field(), Some(field), "{text}: {e}");
            let patch: toml::Table = toml::from_str(text).unwrap();
            let patch = serde_json::to_value(patch).unwrap().as_object().unwrap().clone();
            let e = s.patched(patch).unwrap_err();
            assert_eq!(e.field(), Some(field), "{text}: {e}");
        }
        let e = Settings::parse("draft = \"fast\"\n", &path).unwrap_err().to_string();
        assert!(e.contains("`draft`") && e.contains("`fast`"), "{e}");
    }

    /// The runtime's defaults are the ones docs/runtime.md states.
    #[test]
    fn the_runtime_defaults_are_the_documented_ones() {
        let e = Settings::default().engine_config();
        let l = &e.ladder;
        assert_eq!(
            (l.enabled, l.rungs.clone(), l.chunk, l.decode_tokens, l.max_interruptions),
            (true, vec![512, 2560], 256, 8, 8)
        );
        assert_eq!(
            (l.idle_grace, e.warmup_deadline),
            (Duration::from_secs(90), Duration::from_secs(30))
        );
        assert!(e.load_warmup);
        assert_eq!(e.keep_alive, KeepAlive::For(Duration::from_secs(30 * 60)));
        assert_eq!(Settings::default().keep_alive_s, 1800);
        assert_eq!(LadderConfig::profile(WarmupProfile::Turbo).rungs, LadderConfig::TURBO);
    }

    #[test]
    fn only_engine_fields_need_a_restart() {
        let (_dir, s) = with_model();
        let mut t = s.clone();
        t.sampling.temperature = 0.2;
        t.launch_at_login = true;
        t.default_model = "other".into();
        assert!(!s.needs_restart(&t));
        t.draft = DraftSetting::None;
        assert!(s.needs_restart(&t));
    }

    #[test]
    fn with_a_key_the_prefix_cache_reuses_whole_blocks() {
        let (_dir, s) = with_model();
        let keyed = Settings { api_key: "k".repeat(32), ..s.clone() };
        let open = Settings { api_key: String::new(), ..s };
        assert_eq!(keyed.engine_config().prefix_cache.block, crate::prefix_cache::SHARED_BLOCK);
        assert_eq!(open.engine_config().prefix_cache.block, 1);
    }
}
