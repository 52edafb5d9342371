//! Chat templates: a model's Jinja template (Hugging Face's format) rendered with minijinja,
//! with the work and the text a downloaded template may produce bounded.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// One message of a conversation, as templates see it (the fields Hugging Face templates
/// read; absent ones are left out, as a client's dict would leave them out).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's calls: `{"id", "type": "function", "function": {"name", "arguments"}}`
    /// with `arguments` an object (templates `tojson` it), as transformers expects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    /// A tool result's call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: vec![],
            tool_call_id: None,
            name: None,
        }
    }
}

/// What a chat is rendered with besides its messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// Tool definitions as the client sent them (`{"type": "function", "function": …}`).
    pub tools: Vec<Value>,
    /// Template keyword arguments (`enable_thinking`, `reasoning_effort`, …).
    pub kwargs: Map<String, Value>,
}

/// A model's chat template and the special-token texts it may use.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    pub source: String,
    pub bos_token: String,
    pub eos_token: String,
}

/// A renderer outside this process: `chat::sandbox`'s worker pool registers itself here, so
/// the template knows only that one exists, not how it works (and the modules stay acyclic).
pub(crate) trait RenderElsewhere: Send + Sync {
    fn render(
        &self,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String>;
}

static ELSEWHERE: std::sync::OnceLock<&'static dyn RenderElsewhere> = std::sync::OnceLock::new();

/// Render every template of this process through `renderer` from now on (the first call wins).
pub(crate) fn render_elsewhere(renderer: &'static dyn RenderElsewhere) {
    let _ = ELSEWHERE.set(renderer);
}

impl ChatTemplate {
    /// Render `messages` through the model's chat template, ending with the assistant's
    /// turn opened when `add_generation_prompt`: in a bounded worker process where the
    /// program installed one (`chat::sandbox`, through [`render_elsewhere`]), else here.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String> {
        match ELSEWHERE.get() {
            Some(renderer) => renderer.render(self, messages, add_generation_prompt, options),
            None => self.render_here(messages, add_generation_prompt, options),
        }
    }

    /// `render` in this process: its steps and its output are bounded, the memory its
    /// intermediate values take and the depth they nest are not.
    pub(crate) fn render_here(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String> {
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        // transformers renders with jinja2's trim_blocks and lstrip_blocks: a block tag eats
        // the newline after it and the indentation before it.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python's `is iterable`: none and undefined are not (minijinja iterates them as
        // empty), so `tools is iterable and tools | length > 0` holds off without tools.
        env.add_test("iterable", |v: minijinja::Value| {
            !v.is_none() && !v.is_undefined() && v.try_iter().is_ok()
        });
        // Hugging Face templates call Python string methods (.strip(), .startswith(), ...).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg.clone())
                    .with_source(Raised(msg)))
            },
        );
        env.add_function("strftime_now", |fmt: String| -> String {
            // Templates use this for "today's date" in system prompts (UTC).
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            strftime(&fmt, secs as i64)
        });
        // Python's json.dumps, as transformers' `tojson` calls it: `", "` and `": "`
        // separators, non-ASCII kept, keys in their order, optional indent.
        env.add_filter("tojson", super::pyjson::tojson);
        // Templates come with downloaded models: bound the work (every instruction costs fuel;
        // real templates spend a few thousand per message) and the text they write.
        env.set_fuel(Some(TEMPLATE_FUEL));
        let source = without_generation_tags(&self.source);
        env.add_template("chat", &source).map_err(|e| EngineError::Template(e.to_string()))?;
        // Keyword arguments first, so a `messages` or `tools` among them cannot replace the
        // real ones.
        let kwargs = minijinja::Value::from_serialize(&options.kwargs);
        let tools = (!options.tools.is_empty()).then_some(&options.tools);
        // An assistant turn that only calls tools has no content: clients send null, and
        // templates test `content is none` to choose how to write the calls. A template that
        // cannot take a null (it adds `message['content']` to a string) gets "" instead, on a
        // second try, as llama.cpp's template engine does once it finds a template needs it.
        let calls_only = |m: &ChatMessage| m.content.is_empty() && !m.tool_calls.is_empty();
        let as_values = |null: bool| -> Vec<Value> {
            messages
                .iter()
                .map(|m| {
                    let mut v = serde_json::to_value(m).unwrap_or_default();
                    if null && calls_only(m) {
                        v["content"] = Value::Null;
                    }
                    v
                })
                .collect()
        };
        let template =
            env.get_template("chat").map_err(|e| EngineError::Template(e.to_string()))?;
        let render = |null| {
            self.render_with(&template, as_values(null), tools, add_generation_prompt, &kwargs)
        };
        match render(true) {
            Err(EngineError::Template(_)) if messages.iter().any(calls_only) => render(false),
            other => other,
        }
    }

    /// One rendering of `messages` (as template values) with the template's context.
    fn render_with(
        &self,
        template: &minijinja::Template<'_, '_>,
        messages: Vec<Value>,
        tools: Option<&Vec<Value>>,
        add_generation_prompt: bool,
        kwargs: &minijinja::Value,
    ) -> Result<String> {
        let kwargs = kwargs.clone();
        let ctx = minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            ..kwargs
        };
        let mut out = CappedWriter(Vec::new());
        template.render_captured_to(ctx, &mut out).map(drop).map_err(|e| match e.kind() {
            minijinja::ErrorKind::OutOfFuel => EngineError::Template(format!(
                "the template ran past its budget of {TEMPLATE_FUEL} steps"
            )),
            minijinja::ErrorKind::WriteFailure => EngineError::Template(format!(
                "the template wrote more than {TEMPLATE_MAX_OUTPUT} bytes"
            )),
            _ => match raised(&e) {
                Some(msg) => EngineError::TemplateRejected(msg),
                None => EngineError::Template(e.to_string()),
            },
        })?;
        String::from_utf8(out.0).map_err(|e| EngineError::Template(e.to_string()))
    }
}

/// transformers' `{% generation %}…{% endgeneration %}` marks the assistant's text for
/// training masks and renders as its body; minijinja has no such tag, so each becomes an
/// always-true `if` block with the same whitespace control.
fn without_generation_tags(source: &str) -> std::borrow::Cow<'_, str> {
    if !source.contains("generation") {
        return source.into();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(close) = tag.find("%}") else {
            rest = tag;
            break;
        };
        let inner = tag[2..close].trim_matches('-').trim();
        let (l, r) = (tag[2..].starts_with('-'), tag[..close].ends_with('-'));
        let (l, r) = (if l { "-" } else { "" }, if r { "-" } else { "" });
        match inner {
            "generation" => out.push_str(&format!("{{%{l} if true {r}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{l} endif {r}%}}")),
            _ => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out.into()
}

#[cfg(test)]
#[test]
fn generation_tags_render_as_their_body() {
    let t = ChatTemplate {
        source: "{% for m in messages %}[{%- generation -%} {{ m.content }} {%- endgeneration %}]{% endfor %}{% if x %}{%".into(),
        bos_token: String::new(),
        eos_token: String::new(),
    };
    assert_eq!(without_generation_tags(&t.source), "{% for m in messages %}[{%- if true -%} {{ m.content }} {%- endif %}]{% endfor %}{% if x %}{%");
    let t = ChatTemplate { source: t.source.trim_end_matches("{% if x %}{%").into(), ..t };
    assert_eq!(
        t.render(&[ChatMessage::new("user", "hi")], true, &ChatOptions::default()).unwrap(),
        "[hi]"
    );
}

/// A turn that only calls tools reaches the template with `content` none (what templates test
/// to write the calls), and, for a template that adds the content to a string and so fails on
/// none (the test fixtures' Qwen-style one; an agent's every tool turn), with "" on a second
/// try, where it was a 500 before.
#[cfg(test)]
#[test]
fn a_template_that_cannot_take_a_null_content_gets_an_empty_one() {
    let template = |source: &str| ChatTemplate {
        source: source.into(),
        bos_token: String::new(),
        eos_token: String::new(),
    };
    let call = serde_json::json!({"id": "c1", "type": "function",
        "function": {"name": "read", "arguments": {"path": "a"}}});
    let turns = [
        ChatMessage::new("user", "read a"),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") },
    ];
    let o = ChatOptions::default();
    let adds =
        template("{% for m in messages %}{{ m['role'] + ':' + m['content'] + ';' }}{% endfor %}");
    assert_eq!(adds.render(&turns, false, &o).unwrap(), "user:read a;assistant:;");
    let tests =
        template("{% for m in messages %}{{ m.role }}={{ m.content is none }};{% endfor %}");
    assert_eq!(tests.render(&turns, false, &o).unwrap(), "user=False;assistant=True;");
    // A template that fails for another reason still fails.
    assert!(template("{{ messages[0]['content'] + 1 }}").render(&turns, false, &o).is_err());
}

/// What a template's `raise_exception` said: the template refuses the conversation (roles out
/// of order, a tool result without its call), which is the request's fault, not the model's.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raised(e: &minijinja::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        cause = c.source();
    }
    None
}

/// The parts of C's strftime that chat templates use (`%d %b %Y`, `%Y-%m-%d`, `%B`, `%A`,
/// …), for a UTC time; an unknown directive is written as is.
fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let (y, m, d) = civil(days);
    let sod = secs.rem_euclid(86_400);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] =
        ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month = MONTHS[(m - 1) as usize];
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&d.to_string());
            }
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('j') => out.push_str(&format!("{:03}", days - days_from_civil(y, 1, 1) + 1)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) from days since the Unix epoch (Howard Hinnant's civil-from-days).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
