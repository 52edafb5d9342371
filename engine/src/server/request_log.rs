//! The request log: one JSON line per user request in a size-capped, rotating file
//! (`requests.jsonl`, then `.1`, `.2`, ...). Prompt and completion text only when asked.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use file_rotate::compression::Compression;
use file_rotate::suffix::AppendCount;
use file_rotate::{ContentLimit, FileRotate};
use serde::Serialize;

use crate::decode::{BatchShare, DraftStats};
use crate::sync::LockExt;

#[derive(Debug, Clone, Serialize, Default)]
pub struct RequestRecord {
    pub id: String,
    pub time_unix: f64,
    pub endpoint: String,
    pub model: String,
    pub stream: bool,
    pub status: u16,
    pub prompt_tokens: usize,
    /// Prompt tokens the prefix cache supplied (not prefilled).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_s: Option<f64>,
    pub prefill_tok_s: Option<f64>,
    pub decode_tok_s: Option<f64>,
    pub finish_reason: Option<String>,
    pub draft: Option<DraftStats>,
    /// Why the model's drafts were not used for this request (a constrained answer, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafts_off: Option<String>,
    /// Formats tool calls were read from besides the template's own (`fenced-json`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls_recovered: Option<Vec<String>>,
    /// Calls repeating ones the conversation made and a tool answered: `name; earlier=N`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeated_tool_calls: Option<Vec<String>>,
    /// The batch it ran in: sequences per step, on average and at most (none: alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchShare>,
    /// An embedding request's inputs (its tokens are `prompt_tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<usize>,
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
}

pub struct RequestLog {
    file: Mutex<FileRotate<AppendCount>>,
    pub with_text: bool,
}

impl RequestLog {
    /// `max_bytes` per file, `keep` rotated files besides the current one.
    pub fn open(
        dir: &Path,
        max_bytes: usize,
        keep: usize,
        with_text: bool,
    ) -> std::io::Result<RequestLog> {
        crate::private_files::create_dir_all(dir)?;
        let file = FileRotate::new(
            dir.join("requests.jsonl"),
            AppendCount::new(keep),
            ContentLimit::BytesSurpassed(max_bytes),
            Compression::None,
            #[cfg(unix)]
            Some({
                use std::os::unix::fs::OpenOptionsExt;
                let mut o = std::fs::OpenOptions::new();
                o.read(true).create(true).append(true).mode(0o600);
                o
            }),
        );
        // FileRotate swallows open errors; say so now rather than log nothing later.
        let path = dir.join("requests.jsonl");
        if !path.exists() {
            return Err(std::io::Error::other(format!("cannot create {}", path.display())));
        }
        Ok(RequestLog { file: Mutex::new(file), with_text })
    }

    pub fn write(&self, record: &RequestRecord) {
        let Ok(mut line) = serde_json::to_vec(record) else { return };
        line.push(b'\n');
        let mut f = self.file.locked();
        if let Err(e) = f.write_all(&line).and_then(|_| f.flush()) {
            tracing::warn!(error = %e, "could not write the request log");
        }
    }
}
