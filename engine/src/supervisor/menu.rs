//! What the menu-bar icon shows, decided here so it is tested with the engine; the shell only
//! draws it.

use serde::Serialize;

use super::{Phase, Supervisor};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrayModel {
    pub id: String,
    pub label: String,
    /// The default model (the one the chat window and the picker use).
    pub checked: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrayMenu {
    /// Model, speed of the last request, memory; or what the engine is doing; or the
    /// settings problem.
    pub status_line: String,
    pub models: Vec<TrayModel>,
    pub api_url: String,
}

impl Supervisor {
    pub fn tray_menu(&self) -> TrayMenu {
        let status = self.status();
        let settings = self.settings();
        let default = settings.as_ref().map(|s| s.default_model.clone()).unwrap_or_default();
        let models = settings
            .as_ref()
            .map(|s| s.catalog().list())
            .unwrap_or_default()
            .into_iter()
            // The picker chooses the chat model; an encoder is never one.
            .filter(|m| m.kind == "chat")
            .map(|m| {
                let loading = status.loading.as_deref() == Some(m.id.as_str());
                TrayModel {
                    label: if loading { format!("{} (loading…)", m.id) } else { m.id.clone() },
                    checked: m.id == default,
                    id: m.id,
                }
            })
            .collect();
        let mut line = match (&status.phase, &status.loading) {
            (Phase::Running, Some(id)) => format!("Loading {id}…"),
            (Phase::Running, None) => {
                let app = self.app();
                let model = app
                    .as_ref()
                    .and_then(|a| a.engine.loaded())
                    .map(|m| m.id)
                    .unwrap_or_else(|| "no model".into());
                let rate = app
                    .as_ref()
                    .and_then(|a| a.engine.last_turn()?.decode_tok_s)
                    .map(|r| format!(" · {r:.1} tok/s"))
                    .unwrap_or_default();
                let memory = crate::platform::active_memory_bytes()
                    .map(|b| format!(" · {}", human_bytes(b)))
                    .unwrap_or_default();
                let running = app
                    .as_ref()
                    .map(|a| {
                        // User requests only: background work holding the gate is not one.
                        let fg = a.engine.foreground.snapshot();
                        running_label(fg.foreground_active, a.engine.config.max_batch)
                    })
                    .unwrap_or_default();
                format!("{model}{running}{rate}{memory}")
            }
            _ => status.message.clone(),
        };
        if let Some(problem) = &status.config_error {
            line = format!("Settings problem: {}", problem.message);
        }
        TrayMenu { status_line: line, models, api_url: format!("{}/v1", status.url) }
    }
}

/// How many requests are generating now, out of the batch's slots (nothing when idle).
fn running_label(running: usize, slots: usize) -> String {
    match running {
        0 => String::new(),
        n => format!(" · {n} of {slots} running"),
    }
}

fn human_bytes(b: u64) -> String {
    match b as f64 {
        x if x >= 1e9 => format!("{:.1} GB", x / 1e9),
        x if x >= 10e6 => format!("{:.0} MB", x / 1e6),
        x => format!("{:.1} MB", x / 1e6),
    }
}
