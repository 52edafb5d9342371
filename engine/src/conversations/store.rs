//! The conversations folder: `<id>.json` per conversation, written atomically and private
//! to the user. A file that does not read back (damaged, hand-edited, too large) is left
//! alone and reported, never overwritten or dropped from under the user.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::presets::Presets;
use super::{Conversation, ConversationId, Invalid};
use crate::sync::LockExt;

/// Largest conversation file read or written (attachments included).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error("there is no conversation `{0}`")]
    NotFound(ConversationId),
    #[error("conversation `{id}` was changed elsewhere (revision {stored}, this copy has {given}); reload it")]
    Conflict { id: ConversationId, stored: u64, given: u64 },
    #[error("conversation `{id}`'s file cannot be read back ({why}); it is left as it is in {}", .path.display())]
    Damaged { id: ConversationId, path: PathBuf, why: String },
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// One line of the list: what the sidebar shows and search finds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub id: ConversationId,
    pub title: String,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub revision: u64,
    pub model: String,
    pub messages: usize,
    /// Text around the search's first hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snippet: Option<String>,
}

pub struct Store {
    dir: PathBuf,
    /// One write at a time, so the revision check and the write are one step.
    writing: Mutex<()>,
    /// Each file's summary, by the file's length and modification time: the sidebar lists
    /// every few seconds, and a file that did not change is not read and parsed again.
    summaries: Mutex<HashMap<ConversationId, (u64, SystemTime, Summary)>>,
    presets: Presets,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Store {
    pub fn new(dir: PathBuf) -> Store {
        let presets = Presets::new(&dir);
        Store { dir, writing: Mutex::new(()), summaries: Mutex::new(HashMap::new()), presets }
    }

    /// The named presets kept in this folder.
    pub fn presets(&self) -> &Presets {
        &self.presets
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &ConversationId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn io(&self, path: &Path) -> impl Fn(std::io::Error) -> ConversationError + '_ {
        let path = path.to_path_buf();
        move |source| ConversationError::Io { path: path.clone(), source }
    }

    /// The conversation `id`, as stored.
    pub fn get(&self, id: &ConversationId) -> Result<Conversation, ConversationError> {
        let path = self.path(id);
        let damaged =
            |why: String| ConversationError::Damaged { id: id.clone(), path: path.clone(), why };
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConversationError::NotFound(id.clone()))
            }
            Err(e) => return Err(self.io(&path)(e)),
        };
        if meta.len() > MAX_FILE_BYTES {
            return Err(damaged(format!("{} bytes, more than {MAX_FILE_BYTES}", meta.len())));
        }
        let bytes = std::fs::read(&path).map_err(self.io(&path))?;
        let c: Conversation = serde_json::from_slice(&bytes).map_err(|e| damaged(e.to_string()))?;
        if &c.id != id {
            return Err(damaged(format!("it holds conversation `{}`", c.id)));
        }
        c.check().map_err(|e| damaged(e.to_string()))?;
        Ok(c)
    }

    /// Every conversation, newest first; with `query`, those whose title or messages hold
    /// it (case-insensitive), each with a snippet. Files that do not read back are listed
    /// in the second part, by id, so the user can see and delete them.
    pub fn list(
        &self,
        query: Option<&str>,
    ) -> Result<(Vec<Summary>, Vec<ConversationError>), ConversationError> {
        let needle = query.map(str::trim).filter(|q| !q.is_empty()).map(str::to_lowercase);
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
            Err(e) => return Err(self.io(&self.dir)(e)),
        };
        let (mut found, mut damaged) = (vec![], vec![]);
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
            let Ok(id) = ConversationId::parse(id) else { continue };
            // Unchanged since it was last read, and no search to run over its text.
            let stamp = entry.metadata().ok().and_then(|m| Some((m.len(), m.modified().ok()?)));
            if needle.is_none() {
                let cached = self.summaries.locked().get(&id).cloned();
                if let (Some((len, at, summary)), Some(stamp)) = (cached, stamp) {
                    if (len, at) == stamp {
                        found.push(summary);
                        continue;
                    }
                }
            }
            let c = match self.get(&id) {
                Ok(c) => c,
                Err(e @ ConversationError::Damaged { .. }) => {
                    damaged.push(e);
                    continue;
                }
                Err(ConversationError::NotFound(_)) => continue, // deleted meanwhile
                Err(e) => return Err(e),
            };
            let snippet = match &needle {
                Some(n) => match c.find(n) {
                    Some(s) => Some(s),
                    None => continue,
                },
                None => None,
            };
            let summary = Summary {
                id: c.id,
                title: c.title,
                created_ms: c.created_ms,
                updated_ms: c.updated_ms,
                revision: c.revision,
                model: c.settings.model,
                messages: c.messages.len(),
                snippet,
            };
            if let (None, Some((len, at))) = (&needle, stamp) {
                self.summaries.locked().insert(summary.id.clone(), (len, at, summary.clone()));
            }
            found.push(summary);
        }
        found.sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then_with(|| a.id.cmp(&b.id)));
        Ok((found, damaged))
    }

    /// Save `c`, which must carry the stored revision (0 for a new conversation); returns
    /// it as stored, with the next revision and the times set.
    pub fn put(&self, mut c: Conversation) -> Result<Conversation, ConversationError> {
        c.check()?;
        let _one = self.writing.locked();
        let stored = match self.get(&c.id) {
            Ok(s) => Some(s),
            Err(ConversationError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let stored_revision = stored.as_ref().map_or(0, |s| s.revision);
        if c.revision != stored_revision {
            return Err(ConversationError::Conflict {
                id: c.id,
                stored: stored_revision,
                given: c.revision,
            });
        }
        let now = now_ms();
        c.created_ms = stored
            .as_ref()
            .map_or(if c.created_ms == 0 { now } else { c.created_ms }, |s| s.created_ms);
        c.updated_ms = now.max(c.created_ms);
        c.revision = stored_revision + 1;
        self.write(&c)?;
        Ok(c)
    }

    /// Rename `id` (whatever its revision: a title never conflicts with an edit).
    pub fn rename(
        &self,
        id: &ConversationId,
        title: &str,
    ) -> Result<Conversation, ConversationError> {
        let _one = self.writing.locked();
        let mut c = self.get(id)?;
        c.title = title.to_string();
        c.check()?;
        c.revision += 1;
        c.updated_ms = now_ms().max(c.created_ms);
        self.write(&c)?;
        Ok(c)
    }

    /// Delete `id`; a damaged file may be deleted too (that is how the user gets rid of it).
    pub fn delete(&self, id: &ConversationId) -> Result<(), ConversationError> {
        let _one = self.writing.locked();
        let path = self.path(id);
        self.summaries.locked().remove(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ConversationError::NotFound(id.clone()))
            }
            Err(e) => Err(self.io(&path)(e)),
        }
    }

    /// Store conversations read from elsewhere as new ones: each gets a fresh id and
    /// revision, so an import never overwrites what is here.
    pub fn import(&self, list: Vec<Conversation>) -> Result<Vec<Conversation>, ConversationError> {
        // All are checked before any is written: an import lands whole or not at all.
        for c in &list {
            c.check()?;
        }
        let mut out = vec![];
        for mut c in list {
            c.id = ConversationId::random();
            c.revision = 0;
            out.push(self.put(c)?);
        }
        Ok(out)
    }

    fn write(&self, c: &Conversation) -> Result<(), ConversationError> {
        crate::private_files::create_dir_all(&self.dir).map_err(self.io(&self.dir))?;
        let bytes = serde_json::to_vec_pretty(c).expect("a conversation serializes");
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(super::invalid(
                "messages",
                format!(
                    "the conversation would take {} bytes, more than {MAX_FILE_BYTES}",
                    bytes.len()
                ),
            )
            .into());
        }
        let path = self.path(&c.id);
        self.summaries.locked().remove(&c.id);
        crate::private_files::write_atomic(&path, &bytes).map_err(self.io(&path))
    }
}
