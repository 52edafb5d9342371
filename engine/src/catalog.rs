//! Which models the engine may serve: those installed in the models directory, and MLX /
//! Hugging Face-layout models already in the Hugging Face cache (`~/.cache/huggingface/hub`),
//! offered in place without copying.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// The file Perch writes into every model folder it installs (imports, downloads): only such
/// folders may be deleted through the API, wherever the models directory points.
pub const INSTALLED_MARKER: &str = ".perch-installed";

/// Mark `dir` as installed by Perch.
pub fn mark_installed(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join(INSTALLED_MARKER), MARKER_TEXT)
}

const MARKER_TEXT: &str = "installed by Perch; safe to delete from its UI\n";

/// Mark `dir` as downloaded by Perch from hub repository `repo`: the installed id is only the
/// repository's name, so a later download of another organisation's model of the same name
/// must be told apart from this one.
pub fn mark_downloaded(dir: &Path, repo: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(INSTALLED_MARKER), format!("{MARKER_TEXT}{SOURCE_LINE}{repo}\n"))
}

const SOURCE_LINE: &str = "source: ";

/// The hub repository an installed model was downloaded from (`None`: imported, copied in, or
/// not Perch's).
pub fn downloaded_from(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(INSTALLED_MARKER)).ok()?;
    text.lines().find_map(|l| l.strip_prefix(SOURCE_LINE)).map(str::to_string)
}

/// Whether Perch installed `dir` (and may delete it).
pub fn installed_by_perch(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) && dir.join(INSTALLED_MARKER).is_file()
}

#[derive(Debug, Clone)]
pub struct Catalog {
    pub models_dir: PathBuf,
    /// The hub cache to scan, if any.
    pub hf_cache: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Installed,
    HfCache,
}

#[derive(Debug, Clone, Serialize)]
pub struct CatalogModel {
    /// Installed: the directory name. Cache: the hub repo id (`org/name`).
    pub id: String,
    pub path: PathBuf,
    pub source: Source,
    pub architecture: String,
    /// `chat`, or `embedding` for a sentence encoder (`model::ModelKind`).
    pub kind: &'static str,
    /// `mlx 4-bit`, `mlx bf16`, … from the config and weights.
    pub format: String,
    pub context_length: Option<u64>,
    pub size_bytes: u64,
}

/// The hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(p).join("hub"));
    }
    directories::BaseDirs::new().map(|b| b.home_dir().join(".cache/huggingface/hub"))
}

fn read_config(dir: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).ok()?).ok()
}

/// Bytes of the files in `dir` (symlinks followed: cache snapshots link into `blobs/`).
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn describe(id: String, dir: &Path, source: Source, cfg: &Value) -> CatalogModel {
    let format = match cfg.get("quantization").and_then(|q| q.get("bits")).and_then(Value::as_u64) {
        Some(bits) => format!("mlx {bits}-bit"),
        None => format!("mlx {}", cfg.get("torch_dtype").and_then(Value::as_str).unwrap_or("f32")),
    };
    let architecture = cfg.get("model_type").and_then(Value::as_str).unwrap_or("?").to_string();
    let kind = if crate::model::encoder::is_encoder(&architecture) { "embedding" } else { "chat" };
    CatalogModel {
        id,
        path: dir.to_path_buf(),
        source,
        kind,
        architecture,
        format,
        context_length: cfg.get("max_position_embeddings").and_then(Value::as_u64),
        size_bytes: dir_size(dir),
    }
}

/// A snapshot the engine can load: a config of a supported architecture, safetensors weights
/// and a tokenizer.
fn loadable(dir: &Path, cfg: &Value) -> bool {
    let arch = cfg.get("model_type").and_then(Value::as_str).unwrap_or("");
    let files: Vec<String> = std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    let encoder =
        crate::model::encoder::is_encoder(arch) && files.iter().any(|f| f == "modules.json");
    (encoder || crate::model::SUPPORTED_ARCHITECTURES.split(", ").any(|a| a == arch))
        && files.iter().any(|f| f.ends_with(".safetensors"))
        && files.iter().any(|f| f == "tokenizer.json")
}

impl Catalog {
    pub fn installed(&self) -> Vec<CatalogModel> {
        let Ok(entries) = std::fs::read_dir(&self.models_dir) else { return vec![] };
        let mut out: Vec<CatalogModel> = entries
            .filter_map(|e| e.ok())
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let dir = e.path();
                let cfg = read_config(&dir)?;
                Some(describe(
                    e.file_name().to_string_lossy().into_owned(),
                    &dir,
                    Source::Installed,
                    &cfg,
                ))
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Loadable models in the hub cache, each at the snapshot `refs/main` names (else the
    /// newest snapshot).
    pub fn hf_cached(&self) -> Vec<CatalogModel> {
        let Some(cache) = &self.hf_cache else { return vec![] };
        let Ok(entries) = std::fs::read_dir(cache) else { return vec![] };
        let mut out = vec![];
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(repo) = name.strip_prefix("models--") else { continue };
            let id = repo.replacen("--", "/", 1);
            let Some(snapshot) = snapshot_of(&e.path()) else { continue };
            let Some(cfg) = read_config(&snapshot) else { continue };
            if loadable(&snapshot, &cfg) {
                out.push(describe(id, &snapshot, Source::HfCache, &cfg));
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Installed models first: an installed id shadows a cached repo of the same name.
    pub fn list(&self) -> Vec<CatalogModel> {
        let mut out = self.installed();
        for m in self.hf_cached() {
            if !out.iter().any(|o| o.id == m.id) {
                out.push(m);
            }
        }
        out
    }

    /// The directory of model `id`, if the catalog offers it (never an arbitrary path).
    pub fn resolve(&self, id: &str) -> Option<PathBuf> {
        if id.is_empty() || id.starts_with('.') || id.contains("..") || id.contains('\\') {
            return None;
        }
        if !id.contains('/') {
            let dir = self.models_dir.join(id);
            return dir.join("config.json").exists().then_some(dir);
        }
        self.hf_cached().into_iter().find(|m| m.id == id).map(|m| m.path)
    }
}

fn snapshot_of(repo_dir: &Path) -> Option<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo_dir.join("refs/main")) {
        // A commit hash names a folder in `snapshots/`; anything else (`..`, a path) could
        // point outside the cache and is ignored.
        let rev = rev.trim();
        let plain = !rev.is_empty()
            && rev != "."
            && rev != ".."
            && rev.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        let dir = snapshots.join(rev);
        if plain && dir.is_dir() {
            return Some(dir);
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_installed_and_cached_models_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let models = root.path().join("models");
        std::fs::create_dir_all(models.join("mine")).unwrap();
        std::fs::write(
            models.join("mine/config.json"),
            r#"{"model_type":"qwen3","quantization":{"bits":4}}"#,
        )
        .unwrap();
        let cache = root.path().join("hub");
        let repo = cache.join("models--mlx-community--Tiny-4bit");
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123").unwrap();
        std::fs::write(repo.join("blobs/w"), vec![0u8; 1000]).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(repo.join("blobs/w"), snap.join("model.safetensors")).unwrap();
        std::fs::write(snap.join("config.json"), r#"{"model_type":"llama"}"#).unwrap();
        std::fs::write(snap.join("tokenizer.json"), "{}").unwrap();
        // Not loadable: a GGUF-only repo and an unsupported architecture.
        std::fs::create_dir_all(cache.join("models--x--gguf/snapshots/1")).unwrap();
        let other = cache.join("models--x--bert/snapshots/1");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("config.json"), r#"{"model_type":"bert"}"#).unwrap();
        std::fs::write(other.join("model.safetensors"), "").unwrap();
        std::fs::write(other.join("tokenizer.json"), "").unwrap();

        let c = Catalog { models_dir: models.clone(), hf_cache: Some(cache) };
        let ids: Vec<_> = c.list().into_iter().map(|m| (m.id, m.source, m.format)).collect();
        assert_eq!(
            ids,
            vec![
                ("mine".into(), Source::Installed, "mlx 4-bit".into()),
                ("mlx-community/Tiny-4bit".into(), Source::HfCache, "mlx f32".into())
            ]
        );
        assert_eq!(c.resolve("mlx-community/Tiny-4bit"), Some(snap.clone()));
        assert!(
            c.hf_cached()[0].size_bytes >= 1000,
            "sizes follow the snapshot's links into blobs/"
        );
        assert_eq!(c.resolve("mine"), Some(models.join("mine")));
        for bad in ["x/bert", "../models/mine", "", ".hidden", "/etc"] {
            assert_eq!(c.resolve(bad), None, "{bad}");
        }
        // A `refs/main` that climbs out of the cache (here to the installed model) is ignored;
        // the newest snapshot is used instead.
        for escape in ["../../../models/mine", "/etc", "..", "abc123/../../../../models/mine"] {
            std::fs::write(repo.join("refs/main"), escape).unwrap();
            assert_eq!(c.resolve("mlx-community/Tiny-4bit"), Some(snap.clone()), "{escape}");
        }
    }
}
