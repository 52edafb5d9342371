//! Chat templates: a model's Jinja template (Hugging Face's format) rendered with minijinja,
//! with the work and the text a downloaded template may produce bounded.

use serde::Serialize;

use crate::error::{EngineError, Result};

/// One message of a conversation, as templates see it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A model's chat template and the special-token texts it may use.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    pub source: String,
    pub bos_token: String,
    pub eos_token: String,
}

impl ChatTemplate {
    /// Render `messages` through the model's chat template, ending with the assistant's
    /// turn opened when `add_generation_prompt`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        // Hugging Face templates call Python string methods (.strip(), .startswith(), ...).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| -> String {
            // Templates use this for "today's date" in system prompts; a fixed-format UTC date.
            let _ = fmt;
            let days = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() / 86_400)
                .unwrap_or(0);
            civil_date(days as i64)
        });
        // Templates come with downloaded models: bound the work (every instruction costs fuel;
        // real templates spend a few thousand per message) and the text they write.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template("chat", &self.source).map_err(|e| EngineError::Template(e.to_string()))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let mut out = CappedWriter(Vec::new());
        env.get_template("chat")
            .and_then(|t| t.render_captured_to(ctx, &mut out).map(drop))
            .map_err(|e| match e.kind() {
                minijinja::ErrorKind::OutOfFuel => EngineError::Template(format!(
                    "the template ran past its budget of {TEMPLATE_FUEL} steps"
                )),
                minijinja::ErrorKind::WriteFailure => EngineError::Template(format!(
                    "the template wrote more than {TEMPLATE_MAX_OUTPUT} bytes"
                )),
                _ => EngineError::Template(e.to_string()),
            })?;
        String::from_utf8(out.0).map_err(|e| EngineError::Template(e.to_string()))
    }
}

/// "26 Nov 2026" from days since the Unix epoch (Howard Hinnant's civil-from-days).
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!("{d:02} {} {y}", MONTHS[(m - 1) as usize])
}

/// Instructions a chat template may run per render (minijinja fuel): thousands of messages'
/// worth for real templates, a fraction of a second of work.
const TEMPLATE_FUEL: u64 = 20_000_000;
/// Bytes a chat template may write per render: far past any context window's text.
const TEMPLATE_MAX_OUTPUT: usize = 64 << 20;

/// A writer that refuses to grow past `TEMPLATE_MAX_OUTPUT`.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > TEMPLATE_MAX_OUTPUT {
            return Err(std::io::Error::other("template output too large"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
