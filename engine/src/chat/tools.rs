//! Tools a request offers the model, and its tool calls read back out of the generated text in
//! the markup its chat template taught it. The format is chosen from the template's own text
//! (what it shows the model), never from the model's name, after llama.cpp's chat parsers.
//! `CallSplitter` works on streamed text: anything that may still become a call's markup is
//! held back, so markup never reaches `content`.

use serde_json::Value;

pub use forced::{dumps_layout, Forced, ForcedGrammar};
pub use recover::{answered_calls, Foreign, Recovery, ToolNote};

/// A function the client offers (OpenAI's `tools[].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// `{"type": "function", "function": {...}}` as the client sent it: templates render it.
    pub definition: Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    #[default]
    Auto,
    /// No call: the tools are not shown to the model and its text is never read as calls.
    None,
    /// At least one call.
    Required,
    /// A call to this function.
    Named(String),
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON object, as text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// How a model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>` (Hermes, Qwen 2.5/3) or, inside
    /// the same tags, `<function=name><parameter=p>v</parameter></function>` (Qwen3-Coder,
    /// Qwen 3.5).
    TaggedCall,
    /// `[TOOL_CALLS][{"name": …, "arguments": …}, …]` to the end (Mistral v3, Nemo).
    Mistral,
    /// `[TOOL_CALLS]name[ARGS]{…}`, repeated (Mistral Small 3.2, Devstral, Ministral 3).
    MistralArgs,
    /// `<|python_tag|>{"name": …, "parameters": …}` to the end (Llama 3.x).
    PythonTag,
    /// `<｜tool▁calls▁begin｜>` with `function<｜tool▁sep｜>name` and a ```json block per
    /// call, to `<｜tool▁calls▁end｜>` (DeepSeek V3, R1 and its distills).
    DeepSeek,
    /// The same markers around `name<｜tool▁sep｜>{…}` (DeepSeek V3.1).
    DeepSeekV31,
    /// No markup known: an answer that is one JSON object `{"name", "arguments"}` naming an
    /// offered tool is a call.
    Generic,
}

impl ToolFormat {
    /// The format a chat template teaches, from the markers in its source.
    pub fn of_template(source: &str) -> ToolFormat {
        if source.contains("<tool_call>") {
            ToolFormat::TaggedCall
        } else if source.contains("[TOOL_CALLS]") && source.contains("[ARGS]") {
            ToolFormat::MistralArgs
        } else if source.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if source.contains("<|python_tag|>") {
            ToolFormat::PythonTag
        } else if source.contains("tool▁calls▁begin") && source.contains("```json") {
            ToolFormat::DeepSeek
        } else if source.contains("tool▁calls▁begin") {
            ToolFormat::DeepSeekV31
        } else {
            ToolFormat::Generic
        }
    }

    /// Calls written as a bare `{"name", …}` object are this format's own: the generic
    /// format has no markup, and Llama 3.x writes custom tools' calls without its tag.
    fn writes_bare_calls(self) -> bool {
        matches!(self, ToolFormat::Generic | ToolFormat::PythonTag)
    }

    /// The text that opens a call, and the one that closes it (`None`: the call runs to the
    /// end of the answer).
    fn markers(self) -> Option<(&'static str, Option<&'static str>)> {
        match self {
            ToolFormat::TaggedCall => Some(("<tool_call>", Some("</tool_call>"))),
            ToolFormat::Mistral | ToolFormat::MistralArgs => Some(("[TOOL_CALLS]", None)),
            ToolFormat::PythonTag => Some(("<|python_tag|>", None)),
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV31 => {
                Some(("<｜tool▁calls▁begin｜>", Some("<｜tool▁calls▁end｜>")))
            }
            ToolFormat::Generic => None,
        }
    }

    /// The text that ends one call, when a turn may make only one.
    pub fn call_end(self) -> Option<&'static str> {
        match self {
            ToolFormat::TaggedCall => Some("</tool_call>"),
            _ => None,
        }
    }
}

/// What the splitter lets out.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    /// A whole call.
    Call(ToolCall),
    /// A call whose arguments follow as `CallArgs` (streamed as they are generated).
    CallHead {
        id: String,
        name: String,
    },
    /// The next part of the last `CallHead`'s arguments (JSON text).
    CallArgs(String),
}

/// How the current call is being read.
#[derive(Debug)]
enum Stream {
    /// Its head has not shown yet whether it can be streamed.
    Undecided,
    Args(args::ValueEnd),
    Whole,
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

enum Streamed {
    /// More text is needed.
    Wait,
    /// The call is over; go on after it.
    Closed,
    /// Not streamable: read the body whole.
    Whole,
}

/// Splits streamed text into content and calls.
pub struct CallSplitter {
    format: ToolFormat,
    /// Text seen but not yet let out.
    held: String,
    /// Inside a call's markup (after its opening marker).
    in_call: bool,
    calls: usize,
    /// A prefix of the answer the prompt already wrote (a forced call's start).
    id_seed: u64,
    /// An answer that opens with a bare JSON object is held to its end: some formats write
    /// calls bare (`writes_bare_calls`), and small models often drop their template's markup
    /// and write just the call (a recovery). Decided once, at the end.
    bare_hold: bool,
    tool_names: Vec<String>,
    stream: Stream,
    /// Calls past this many are dropped (`parallel_tool_calls: false` allows one).
    max_calls: usize,
    /// Calls written in other formats are read back (`recover::Recovery`), when set.
    recovery: Option<Recovery>,
    /// The openings of those other formats' markup.
    foreign: Vec<recover::Marker>,
    /// Inside one of them (its opening still held).
    reading: Option<recover::Marker>,
    /// Calls the conversation already made and a tool answered.
    answered: Vec<(String, Value)>,
    /// The call being streamed: its name and its arguments so far.
    streaming: Option<(String, String)>,
    notes: Vec<ToolNote>,
}

impl CallSplitter {
    /// The format this splitter reads.
    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// `forced`: the start of the answer that the prompt already holds (it opens a call).
    pub fn new(format: ToolFormat, tool_names: Vec<String>, forced: Option<&str>) -> Self {
        let id_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut s = CallSplitter {
            format,
            held: String::new(),
            in_call: false,
            calls: 0,
            id_seed,
            bare_hold: format.writes_bare_calls(),
            tool_names,
            stream: Stream::Undecided,
            max_calls: usize::MAX,
            recovery: None,
            foreign: vec![],
            reading: None,
            answered: vec![],
            streaming: None,
            notes: vec![],
        };
        if let Some(f) = forced {
            let out = s.push(f);
            debug_assert!(out.is_empty(), "a forced prefix opens a call");
        }
        s
    }

    /// At most one call is let out (`parallel_tool_calls: false`): formats without an end
    /// marker per call cannot stop the answer after the first, so later ones are dropped.
    pub fn one_call(mut self) -> Self {
        self.max_calls = 1;
        self
    }

    /// Also read calls the model writes in another format than its template's, when they
    /// call an offered tool with valid arguments (`recover`).
    pub fn recovering(mut self, recovery: Recovery) -> Self {
        self.foreign = recover::markers(self.format.markers().map(|m| m.0));
        self.recovery = Some(recovery);
        self.bare_hold = self.held.is_empty() && self.calls == 0;
        self
    }

    /// Note calls identical to these (name, arguments), made earlier in the conversation and
    /// answered by a tool (`recover::answered_calls`).
    pub fn after_calls(mut self, answered: Vec<(String, Value)>) -> Self {
        self.answered = answered;
        self
    }

    /// What was noticed so far: recoveries, repeated calls.
    pub fn notes(&self) -> &[ToolNote] {
        &self.notes
    }

    /// Feed generated text; returns what can be let out now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// The answer has ended: everything left.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        out
    }

    fn next_id(&mut self) -> String {
        self.calls += 1;
        // Unique within a server's life and unlikely to repeat across restarts.
        let mix = self.id_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.calls as u64;
        format!("call_{mix:016x}{:02}", self.calls)
    }

    fn emit(&mut self, out: &mut Vec<Piece>, name: String, arguments: String) {
        if self.calls < self.max_calls {
            self.check_repeat(&name, &arguments);
            let id = self.next_id();
            out.push(Piece::Call(ToolCall { id, name, arguments }));
        }
    }

    /// A call equal to answered ones (same name, same arguments as JSON) is noted.
    fn check_repeat(&mut self, name: &str, arguments: &str) {
        if self.answered.is_empty() {
            return;
        }
        let Ok(args) = serde_json::from_str::<Value>(arguments) else { return };
        let earlier = self.answered.iter().filter(|(n, a)| n == name && *a == args).count();
        if earlier > 0 {
            self.notes.push(ToolNote::Repeated { name: name.to_string(), earlier });
        }
    }

    /// The first opening in the held text: the template's own (`None` in the pair) or
    /// another format's.
    fn next_opening(&self, native: Option<&str>) -> Option<(usize, Option<recover::Marker>)> {
        let mine = native.and_then(|open| self.held.find(open)).map(|at| (at, None));
        let theirs =
            self.foreign.iter().filter_map(|m| self.held.find(m.open).map(|at| (at, Some(*m))));
        mine.into_iter().chain(theirs).min_by_key(|(at, _)| *at)
    }

    /// The longest held tail that may still become an opening.
    fn opening_tail(&self, native: Option<&str>) -> usize {
        let opens = native.into_iter().chain(self.foreign.iter().map(|m| m.open));
        opens.map(|open| partial_suffix(&self.held, open)).max().unwrap_or(0)
    }

    /// Inside another format's call (its opening at the start of the held text): `false`
    /// while more text is needed, else the text went out as calls or as the content it was.
    fn read_foreign(&mut self, out: &mut Vec<Piece>, m: recover::Marker, end: bool) -> bool {
        let from = m.open.len();
        let span = match m.close {
            recover::Close::At(close) => {
                self.held[from..].find(close).map(|at| (from + at, from + at + close.len()))
            }
            recover::Close::Object => {
                let mut value = args::ValueEnd::default();
                let n = value.feed(&self.held);
                value.done.then_some((n, n))
            }
            recover::Close::End => None,
        };
        let (body_end, after) = match span {
            Some(s) => s,
            None if end => (self.held.len(), self.held.len()),
            None => return false,
        };
        let text: String = self.held.drain(..after).collect();
        self.reading = None;
        let body = &text[m.body_at.min(body_end)..body_end];
        let calls = self.recovery.as_mut().and_then(|r| r.calls(m.kind, body));
        match calls {
            Some(calls) if self.calls < self.max_calls => {
                self.notes.push(ToolNote::Recovered(m.kind));
                tracing::info!(
                    format = m.kind.name(),
                    "a tool call was read from text outside the template's format"
                );
                for (name, arguments) in calls {
                    self.emit(out, name, arguments);
                }
            }
            _ => push_content(out, &text, false),
        }
        true
    }

    fn drain(&mut self, out: &mut Vec<Piece>, end: bool) {
        if self.bare_hold && self.hold_bare(out, end) {
            return;
        }
        let native = self.format.markers();
        loop {
            if let Some(m) = self.reading {
                if !self.read_foreign(out, m, end) {
                    return;
                }
                continue;
            }
            if !self.in_call {
                match self.next_opening(native.map(|n| n.0)) {
                    Some((at, Some(m))) => {
                        let before: String = self.held.drain(..at).collect();
                        push_content(out, &before, self.calls > 0);
                        self.reading = Some(m);
                        continue;
                    }
                    Some((at, None)) => {
                        let open = native.map_or(0, |n| n.0.len());
                        let before: String = self.held.drain(..at + open).collect();
                        push_content(out, &before[..at], self.calls > 0);
                        self.in_call = true;
                        self.stream = Stream::Undecided;
                    }
                    None => {
                        // Hold back a tail that may be the start of an opening.
                        let keep = if end { 0 } else { self.opening_tail(native.map(|n| n.0)) };
                        let cut = self.held.len() - keep;
                        // Whitespace after a call is layout unless words follow it: wait.
                        if !end && self.calls > 0 && self.held[..cut].trim().is_empty() {
                            return;
                        }
                        let text: String = self.held.drain(..cut).collect();
                        push_content(out, &text, self.calls > 0);
                        return;
                    }
                }
            }
            let Some((open, close)) = native else { return };
            match self.stream_call(out, close, end) {
                Streamed::Wait => return,
                Streamed::Closed => continue,
                Streamed::Whole => {}
            }
            let body_end = match close {
                Some(c) => self.held.find(c).map(|at| (at, at + c.len())),
                None => None,
            };
            match body_end {
                Some((at, after)) => {
                    let body: String = self.held[..at].to_string();
                    self.held.drain(..after);
                    self.in_call = false;
                    self.emit_calls(out, &body, open, close);
                }
                None if end => {
                    let body = std::mem::take(&mut self.held);
                    self.in_call = false;
                    self.emit_calls(out, &body, open, close);
                    return;
                }
                None => return,
            }
        }
    }

    /// A call whose head (`args::head`) names an offered tool: its name goes out at once and
    /// its arguments as they arrive; then what closes it, and whether another call of the same
    /// section follows (Mistral's list, DeepSeek's calls). Anything else is read whole.
    fn stream_call(&mut self, out: &mut Vec<Piece>, close: Option<&str>, end: bool) -> Streamed {
        if self.stream == Stream::Undecided {
            match args::head(self.format, &self.held) {
                args::Head::NeedMore if !end => return Streamed::Wait,
                args::Head::Yes { name, args_at }
                    if self.tool_names.contains(&name) && self.calls < self.max_calls =>
                {
                    self.held.drain(..args_at);
                    let id = self.next_id();
                    self.streaming = Some((name.clone(), String::new()));
                    out.push(Piece::CallHead { id, name });
                    self.stream = Stream::Args(args::ValueEnd::default());
                }
                _ => self.stream = Stream::Whole,
            }
        }
        let Stream::Args(value) = &mut self.stream else { return Streamed::Whole };
        if !value.done {
            let n = value.feed(&self.held);
            let part: String = self.held.drain(..n).collect();
            if !part.is_empty() {
                if let Some((_, args)) = &mut self.streaming {
                    args.push_str(&part);
                }
                out.push(Piece::CallArgs(part));
            }
            if !value.done && !end {
                return Streamed::Wait;
            }
        }
        let tail = args::tail(self.format, &self.held, close);
        if tail != args::Tail::NeedMore || end {
            if let Some((name, args)) = self.streaming.take() {
                self.check_repeat(&name, &args);
            }
        }
        match tail {
            args::Tail::NeedMore if !end => return Streamed::Wait,
            args::Tail::NeedMore => {
                self.held.clear();
                self.in_call = false;
            }
            args::Tail::Over(n) => {
                self.held.drain(..n);
                self.in_call = false;
            }
            args::Tail::Next(n) => {
                self.held.drain(..n);
                self.stream = Stream::Undecided;
            }
        }
        Streamed::Closed
    }

    /// A call's body becomes calls; a body that is no call is let out as the text it was.
    fn emit_calls(&mut self, out: &mut Vec<Piece>, body: &str, open: &str, close: Option<&str>) {
        match parse_body(self.format, body) {
            Some(calls) if !calls.is_empty() => {
                for (name, arguments) in calls {
                    self.emit(out, name, arguments);
                }
            }
            _ => {
                let text = format!("{open}{body}{}", close.unwrap_or(""));
                push_content(out, &text, false);
            }
        }
    }

    /// While the answer may be a bare call: `true` when the text is held (or became calls).
    fn hold_bare(&mut self, out: &mut Vec<Piece>, end: bool) -> bool {
        let start = self.held.trim_start();
        if start.is_empty() && !end {
            return true;
        }
        if !start.starts_with('{') {
            self.bare_hold = false;
            return false;
        }
        if !end {
            return true;
        }
        self.bare_hold = false;
        let Some(calls) = recover::json_calls(start.trim_end()) else { return false };
        let offered = match &mut self.recovery {
            // The format's own calls: named tools are enough.
            _ if self.format.writes_bare_calls() => {
                calls.iter().all(|(n, _)| self.tool_names.contains(n))
            }
            Some(r) => calls.iter().all(|(n, a)| r.accepts(n, a)),
            None => false,
        };
        if calls.is_empty() || !offered {
            return false;
        }
        if !self.format.writes_bare_calls() {
            self.notes.push(ToolNote::Recovered(Foreign::BareJson));
        }
        self.held.clear();
        for (name, arguments) in calls {
            self.emit(out, name, arguments);
        }
        true
    }
}

/// Text between or after calls that is only whitespace is layout, not content.
fn push_content(out: &mut Vec<Piece>, text: &str, after_call: bool) {
    if text.is_empty() || (after_call && text.trim().is_empty()) {
        return;
    }
    match out.last_mut() {
        Some(Piece::Content(c)) => c.push_str(text),
        _ => out.push(Piece::Content(text.to_string())),
    }
}

/// The length of the longest tail of `text` that is a proper start of `marker` (held back
/// while streaming: it may become the marker).
pub(super) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// `{"name": …, "arguments"|"parameters": {…}}` → (name, arguments as JSON text).
fn parse_call_object(text: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(text)
        // A forced call's prompt opened an object whose closing brace the model may not write.
        .or_else(|_| serde_json::from_str(&format!("{text}}}")))
        .ok()?;
    call_of_value(&v)
}

fn call_of_value(v: &Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => Value::Object(Default::default()),
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(a) => a.clone(),
    };
    args.is_object().then(|| (name, args.to_string()))
}

fn parse_body(format: ToolFormat, body: &str) -> Option<Vec<(String, String)>> {
    let body = body.trim();
    match format {
        ToolFormat::TaggedCall if body.starts_with("<function=") => {
            parse_xml_call(body).map(|c| vec![c])
        }
        ToolFormat::TaggedCall | ToolFormat::Generic => parse_call_object(body).map(|c| vec![c]),
        ToolFormat::Mistral => {
            // The rest of a list whose first calls were streamed lacks its `[`.
            let v: Value = serde_json::from_str(body)
                .or_else(|_| serde_json::from_str(&format!("[{body}")))
                .ok()?;
            match v {
                Value::Array(list) => list.iter().map(call_of_value).collect(),
                v => call_of_value(&v).map(|c| vec![c]),
            }
        }
        // Several calls may be separated by `;`.
        ToolFormat::PythonTag => body.split(';').map(|c| parse_call_object(c.trim())).collect(),
        ToolFormat::MistralArgs if !body.starts_with('[') => parse_mistral_args(body),
        ToolFormat::MistralArgs => parse_body(ToolFormat::Mistral, body),
        ToolFormat::DeepSeek | ToolFormat::DeepSeekV31 => parse_deepseek(body),
    }
}

/// `<function=name>\n<parameter=p>\nvalue\n</parameter>\n</function>`: a value that parses as
/// JSON is that JSON, any other is a string.
fn parse_xml_call(body: &str) -> Option<(String, String)> {
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let mut args = serde_json::Map::new();
    loop {
        rest = rest.trim_start();
        if rest.starts_with("</function>") || rest.is_empty() {
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let (key, r) = r.split_once('>')?;
        let (value, r) = r.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let v = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
        args.insert(key.trim().to_string(), v);
        rest = r;
    }
    Some((name.trim().to_string(), Value::Object(args).to_string()))
}

/// `name[ARGS]{…}` (a `[CALL_ID]id` may follow the name), calls separated by `[TOOL_CALLS]`.
fn parse_mistral_args(body: &str) -> Option<Vec<(String, String)>> {
    body.split("[TOOL_CALLS]")
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (head, json) = part.split_once("[ARGS]")?;
            let name = head.split("[CALL_ID]").next()?.trim();
            let args: Value = serde_json::from_str(json.trim()).ok()?;
            (!name.is_empty() && args.is_object()).then(|| (name.to_string(), args.to_string()))
        })
        .collect()
}

/// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{…}\n```<｜tool▁call▁end｜>` (V3,
/// R1) or `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{…}<｜tool▁call▁end｜>` (V3.1), repeated.
fn parse_deepseek(body: &str) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    for part in body.split("<｜tool▁call▁begin｜>").skip(1) {
        let part = part.split("<｜tool▁call▁end｜>").next()?;
        let (head, rest) = part.split_once("<｜tool▁sep｜>")?;
        let (name, rest) = match head.trim() {
            "function" => rest.split_once('\n')?,
            name => (name, rest),
        };
        let json = rest.trim().trim_start_matches("```json").trim_end_matches("```").trim();
        let args: Value = serde_json::from_str(json).ok()?;
        if !args.is_object() {
            return None;
        }
        calls.push((name.trim().to_string(), args.to_string()));
    }
    Some(calls)
}

mod args;
mod forced;
mod recover;
#[cfg(test)]
mod tests;
