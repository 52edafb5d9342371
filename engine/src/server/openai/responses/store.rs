//! The Responses API's memory: recent responses by id, so `previous_response_id` can carry a
//! conversation on and `GET /v1/responses/{id}` can show one. In memory only, bounded by a
//! count and a byte budget, oldest out first; `store: false` keeps a response out of it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::chat::ChatMessage;
use crate::sync::LockExt;

/// At most this many responses are kept.
pub const MAX_RESPONSES: usize = 256;
/// And at most this many bytes of them (conversation text and response bodies, roughly).
pub const MAX_BYTES: usize = 64 << 20;

/// One finished response.
#[derive(Debug)]
pub struct Stored {
    /// The conversation so far, this response's output included, without `instructions`
    /// (OpenAI's rule: a follow-up's instructions replace them).
    pub conversation: Vec<ChatMessage>,
    /// The response object as it was answered.
    pub body: Value,
    /// The model that answered (a follow-up may name another).
    pub model: String,
}

impl Stored {
    fn bytes(&self) -> usize {
        let text: usize = self
            .conversation
            .iter()
            .map(|m| {
                m.content.len() + m.tool_calls.iter().map(|c| c.to_string().len()).sum::<usize>()
            })
            .sum();
        text + self.body.to_string().len()
    }
}

#[derive(Default)]
pub struct Store {
    entries: Mutex<VecDeque<(String, Arc<Stored>, usize)>>,
}

impl Store {
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.entries.locked().iter().find(|(k, ..)| k == id).map(|(_, s, _)| s.clone())
    }

    pub fn insert(&self, id: String, stored: Stored) {
        let size = stored.bytes();
        let mut entries = self.entries.locked();
        entries.retain(|(k, ..)| *k != id);
        entries.push_back((id, Arc::new(stored), size));
        let mut total: usize = entries.iter().map(|(.., b)| b).sum();
        while entries.len() > MAX_RESPONSES || (total > MAX_BYTES && entries.len() > 1) {
            if let Some((.., b)) = entries.pop_front() {
                total -= b;
            }
        }
    }

    pub fn remove(&self, id: &str) -> bool {
        let mut entries = self.entries.locked();
        let before = entries.len();
        entries.retain(|(k, ..)| k != id);
        entries.len() != before
    }

    pub fn len(&self) -> usize {
        self.entries.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(text: &str) -> Stored {
        Stored {
            conversation: vec![ChatMessage::new("user", text)],
            body: Value::Null,
            model: "m".into(),
        }
    }

    #[test]
    fn the_oldest_go_first_past_the_count() {
        let s = Store::default();
        for i in 0..MAX_RESPONSES + 3 {
            s.insert(format!("r{i}"), stored("hi"));
        }
        assert_eq!(s.len(), MAX_RESPONSES);
        assert!(s.get("r0").is_none() && s.get("r2").is_none());
        assert!(s.get("r3").is_some());
        assert!(s.remove("r3") && !s.remove("r3"));
    }

    #[test]
    fn the_byte_budget_holds() {
        let s = Store::default();
        let big = "x".repeat(MAX_BYTES / 3);
        for i in 0..5 {
            s.insert(format!("r{i}"), stored(&big));
        }
        assert_eq!(s.len(), 2, "three thirds of the budget do not fit with the bodies");
        assert!(s.get("r4").is_some() && s.get("r3").is_some());
    }
}
