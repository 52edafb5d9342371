//! The chat window's conversations, kept by the engine as the user's data: typed, checked
//! as a tree of messages (branches from edits and regenerations), one JSON file each
//! (`store.rs`), exported and imported as JSON or Markdown (`markdown.rs`); named presets of
//! a chat's settings beside them (`presets.rs`).

pub mod markdown;
pub mod presets;
mod store;

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

pub use store::{ConversationError, Store, Summary, MAX_FILE_BYTES};

/// Most messages one conversation may hold (every branch counted).
pub const MAX_MESSAGES: usize = 20_000;
/// Longest title kept, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest id (a conversation's or a message's), in bytes.
pub const MAX_ID_BYTES: usize = 64;

/// A conversation's name on disk and in URLs: 1 to 64 of `A-Z a-z 0-9 - _`, so that it can
/// never name a path outside the folder.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConversationId(String);

impl ConversationId {
    pub fn parse(s: &str) -> Result<ConversationId, String> {
        if is_id(s) && !RESERVED.contains(&s) {
            Ok(ConversationId(s.to_string()))
        } else {
            Err(format!(
                "`{}` is not a conversation id (1 to {MAX_ID_BYTES} of A-Z a-z 0-9 - _)",
                s.chars().take(80).collect::<String>()
            ))
        }
    }

    /// A new id nobody chose.
    pub fn random() -> ConversationId {
        ConversationId(crate::config::random_key())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ConversationId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        ConversationId::parse(&s)
    }
}

impl From<ConversationId> for String {
    fn from(id: ConversationId) -> String {
        id.0
    }
}

impl std::fmt::Display for ConversationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Names the routes take for themselves (`/perch/conversations/export`, `.../import`,
/// `.../presets`; the folder's `presets.json` is no conversation).
const RESERVED: [&str; 3] = ["export", "import", "presets"];

fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_BYTES
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conversation {
    pub id: ConversationId,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub created_ms: u64,
    #[serde(default)]
    pub updated_ms: u64,
    /// Raised by every save. A save naming an older revision is refused: another window
    /// changed the conversation since this one read it.
    #[serde(default)]
    pub revision: u64,
    #[serde(default)]
    pub settings: ChatSettings,
    /// Every message of every branch; each names its parent, which comes before it.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// The last message of the branch shown.
    #[serde(default)]
    pub current: Option<String>,
}

/// What the chat sends with each turn of this conversation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatSettings {
    pub model: String,
    pub system: String,
    /// f64, as JSON numbers are: an f32 would come back as 0.30000001192092896.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<u32>,
    /// MCP tools offered to the model.
    pub tools: ToolUse,
}

/// Whether a chat offers MCP tools, and whether the first answer after each question must
/// call one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolUse {
    #[default]
    #[serde(rename = "")]
    Off,
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "required")]
    Required,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn heading(self) -> &'static str {
        match self {
            Role::System => "System",
            Role::User => "User",
            Role::Assistant => "Assistant",
            Role::Tool => "Tool",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub id: String,
    #[serde(default)]
    pub parent: Option<String>,
    pub role: Role,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reasoning: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool's result: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Text files the user attached; their text goes to the model with the message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    /// Why this answer failed, in plain words (the answer is then not sent back to a model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub created_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    #[serde(default)]
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    pub name: String,
    pub text: String,
}

/// What an answer cost, as the chat measured it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Stats {
    pub model: String,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub ttft_ms: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// The user stopped it.
    pub stopped: bool,
}

/// A conversation that breaks a rule, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{field}`: {message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid { field: field.into(), message: message.into() }
}

impl Conversation {
    /// An empty conversation with a fresh id.
    pub fn new(title: &str) -> Conversation {
        Conversation {
            id: ConversationId::random(),
            title: title.to_string(),
            created_ms: 0,
            updated_ms: 0,
            revision: 0,
            settings: ChatSettings::default(),
            messages: vec![],
            current: None,
        }
    }

    /// The rules a stored conversation keeps: a bounded title, unique message ids, every
    /// parent an earlier message (so the messages form a tree), the shown branch's end one
    /// of them.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.title.chars().count() > MAX_TITLE_CHARS {
            return Err(invalid("title", format!("longer than {MAX_TITLE_CHARS} characters")));
        }
        if self.messages.len() > MAX_MESSAGES {
            return Err(invalid("messages", format!("more than {MAX_MESSAGES} messages")));
        }
        let mut seen = HashSet::new();
        for (i, m) in self.messages.iter().enumerate() {
            if !is_id(&m.id) {
                return Err(invalid(
                    format!("messages[{i}].id"),
                    format!("must be 1 to {MAX_ID_BYTES} of A-Z a-z 0-9 - _"),
                ));
            }
            if let Some(p) = &m.parent {
                if !seen.contains(p.as_str()) {
                    return Err(invalid(
                        format!("messages[{i}].parent"),
                        format!("`{p}` is not an earlier message of this conversation"),
                    ));
                }
            }
            if !seen.insert(m.id.as_str()) {
                return Err(invalid(format!("messages[{i}].id"), format!("`{}` twice", m.id)));
            }
        }
        if let Some(c) = &self.current {
            if !seen.contains(c.as_str()) {
                return Err(invalid(
                    "current",
                    format!("`{c}` is not a message of this conversation"),
                ));
            }
        }
        Ok(())
    }

    /// The branch shown: from the first message down to `current` (the last message when
    /// `current` is not set).
    pub fn branch(&self) -> Vec<&Message> {
        let Some(end) = self.current.as_deref().or(self.messages.last().map(|m| m.id.as_str()))
        else {
            return vec![];
        };
        let mut out = vec![];
        let mut at = Some(end);
        // Parents come earlier (checked), so this walk ends; the bound guards unchecked input.
        while let Some(id) = at.filter(|_| out.len() <= self.messages.len()) {
            let Some(m) = self.messages.iter().find(|m| m.id == id) else { break };
            out.push(m);
            at = m.parent.as_deref();
        }
        out.reverse();
        out
    }

    /// Whether `needle` (lowercase) occurs in the title or any message (attachments too); returns a short
    /// piece of text around the first hit.
    pub fn find(&self, needle: &str) -> Option<String> {
        if self.title.to_lowercase().contains(needle) {
            return Some(self.title.clone());
        }
        self.messages.iter().find_map(|m| {
            snippet(&m.content, needle)
                .or_else(|| m.attachments.iter().find_map(|a| snippet(&a.text, needle)))
        })
    }
}

/// Up to ~40 characters either side of `needle` (lowercase) in `text`.
fn snippet(text: &str, needle: &str) -> Option<String> {
    let lower = text.to_lowercase();
    let at = lower.find(needle)?;
    // Lowercasing can change byte lengths; map the hit back by characters.
    let before = lower[..at].chars().count();
    let chars: Vec<char> = text.chars().collect();
    let start = before.saturating_sub(40);
    let end = (before + needle.chars().count() + 40).min(chars.len());
    let mut s: String = chars[start..end].iter().collect();
    if start > 0 {
        s.insert(0, '…');
    }
    if end < chars.len() {
        s.push('…');
    }
    Some(s)
}

#[cfg(test)]
mod tests;
