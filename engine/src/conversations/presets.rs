//! Named chat presets (a system prompt, sampling, tools, optionally a model), kept beside the
//! conversations in `presets.json` so every window offers the same ones. Written atomically;
//! a file that does not read back is reported and left alone, never overwritten.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{invalid, ChatSettings, Invalid};
use crate::sync::LockExt;

/// The file's name in the conversations folder ("presets" is no conversation id).
pub const FILE: &str = "presets.json";
/// Most presets kept.
pub const MAX_PRESETS: usize = 100;
/// Longest preset name, in characters.
pub const MAX_NAME_CHARS: usize = 60;
/// Largest presets file read.
const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    #[error("there is no preset `{0}`")]
    NotFound(String),
    #[error("the presets file cannot be read back ({why}); it is left as it is in {}", .path.display())]
    Damaged { path: PathBuf, why: String },
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    pub name: String,
    /// What choosing the preset sets; an empty `model` keeps the chat's model.
    pub settings: ChatSettings,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    presets: Vec<Preset>,
}

/// A preset's name as given: trimmed, 1 to 60 characters, no control characters.
pub fn check_name(name: &str) -> Result<String, Invalid> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid("name", format!("must be 1 to {MAX_NAME_CHARS} characters")));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid("name", "must not hold control characters"));
    }
    Ok(name.to_string())
}

pub struct Presets {
    path: PathBuf,
    /// One change at a time: read, change and write are one step.
    writing: Mutex<()>,
}

impl Presets {
    pub fn new(dir: &Path) -> Presets {
        Presets { path: dir.join(FILE), writing: Mutex::new(()) }
    }

    /// Every preset, by name.
    pub fn list(&self) -> Result<Vec<Preset>, PresetError> {
        let damaged = |why: String| PresetError::Damaged { path: self.path.clone(), why };
        let io = |source| PresetError::Io { path: self.path.clone(), source };
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(io(e)),
        };
        if meta.len() > MAX_FILE_BYTES {
            return Err(damaged(format!("{} bytes, more than {MAX_FILE_BYTES}", meta.len())));
        }
        let file: File = serde_json::from_slice(&std::fs::read(&self.path).map_err(io)?)
            .map_err(|e| damaged(e.to_string()))?;
        for p in &file.presets {
            check_name(&p.name).map_err(|e| damaged(format!("preset `{}`: {e}", p.name)))?;
        }
        Ok(file.presets)
    }

    /// Keep `preset`, replacing the one of the same name (case aside); returns them all.
    pub fn put(&self, mut preset: Preset) -> Result<Vec<Preset>, PresetError> {
        preset.name = check_name(&preset.name)?;
        let _one = self.writing.locked();
        let mut all = self.list()?;
        let key = preset.name.to_lowercase();
        if let Some(same) = all.iter_mut().find(|p| p.name.to_lowercase() == key) {
            *same = preset;
        } else if all.len() >= MAX_PRESETS {
            let why = format!("there are {MAX_PRESETS} presets already; delete one first");
            return Err(invalid("name", why).into());
        } else {
            all.push(preset);
        }
        all.sort_by_key(|p| p.name.to_lowercase());
        self.write(&all)?;
        Ok(all)
    }

    /// Delete the preset `name` (case aside); returns those left.
    pub fn delete(&self, name: &str) -> Result<Vec<Preset>, PresetError> {
        let _one = self.writing.locked();
        let mut all = self.list()?;
        let before = all.len();
        all.retain(|p| p.name.to_lowercase() != name.trim().to_lowercase());
        if all.len() == before {
            return Err(PresetError::NotFound(name.to_string()));
        }
        self.write(&all)?;
        Ok(all)
    }

    fn write(&self, all: &[Preset]) -> Result<(), PresetError> {
        let io = |source| PresetError::Io { path: self.path.clone(), source };
        if let Some(dir) = self.path.parent() {
            crate::private_files::create_dir_all(dir).map_err(io)?;
        }
        let bytes =
            serde_json::to_vec_pretty(&File { presets: all.to_vec() }).expect("presets serialize");
        crate::private_files::write_atomic(&self.path, &bytes).map_err(io)
    }
}
