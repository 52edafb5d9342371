//! Installing a model folder from disk (a sentence encoder in the sentence-transformers
//! layout, or any Hugging Face-layout model Perch loads) into the models directory: checked
//! to load first, copied file by file into a staging folder, then renamed into place, so a
//! failed copy leaves nothing half-installed. `perch import DIR` uses it; GGUF files go
//! through `gguf::import` instead.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::model::encoder::{is_encoder, Encoder};
use crate::model::{load_model_as, ModelConfig};
use crate::platform::ComputeDtype;

/// Copy `src` to `models_dir/name` (default: `src`'s folder name) after loading it once.
pub fn install_folder(
    src: &Path,
    models_dir: &Path,
    name: Option<&str>,
    overwrite: bool,
) -> Result<PathBuf> {
    let name = match name {
        Some(n) => n.to_string(),
        None => src.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string(),
    };
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
        return Err(EngineError::InvalidRequest(format!(
            "`{name}` is not a model id (a folder name)"
        )));
    }
    // Loaded before anything is written: a folder that does not load is never installed.
    let cfg = ModelConfig::read(src)?;
    if is_encoder(cfg.str("model_type")?) {
        Encoder::load(src, ComputeDtype::Auto)?;
    } else {
        load_model_as(src, ComputeDtype::Auto)?;
    }
    let dest = models_dir.join(&name);
    if dest.exists() && !overwrite {
        return Err(EngineError::InvalidRequest(format!(
            "{} exists; pass --overwrite to replace it",
            dest.display()
        )));
    }
    let staging = models_dir.join(format!(".{name}.partial"));
    let _ = std::fs::remove_dir_all(&staging);
    let copied = copy_tree(src, &staging, 0)
        .and_then(|()| crate::catalog::mark_installed(&staging).map_err(EngineError::io(&staging)));
    if let Err(e) = copied {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(EngineError::io(&dest))?;
    }
    std::fs::rename(&staging, &dest).map_err(EngineError::io(&dest))?;
    Ok(dest)
}

/// Plain files and folders (two levels: `1_Pooling/config.json`); links are followed only to
/// files, and anything else is skipped.
fn copy_tree(src: &Path, dest: &Path, depth: usize) -> Result<()> {
    std::fs::create_dir_all(dest).map_err(EngineError::io(dest))?;
    for entry in std::fs::read_dir(src).map_err(EngineError::io(src))? {
        let entry = entry.map_err(EngineError::io(src))?;
        let (from, to) = (entry.path(), dest.join(entry.file_name()));
        let meta = std::fs::metadata(&from).map_err(EngineError::io(&from))?;
        if meta.is_file() {
            std::fs::copy(&from, &to).map_err(EngineError::io(&to))?;
        } else if meta.is_dir()
            && depth == 0
            && !entry.file_name().to_string_lossy().starts_with('.')
        {
            copy_tree(&from, &to, depth + 1)?;
        }
    }
    Ok(())
}
