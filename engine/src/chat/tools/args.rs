//! A call read as it streams: once its head has arrived (`{"name": "…", "arguments": {` in
//! tagged JSON, `name[ARGS]{` in Mistral's newer form, `…<｜tool▁sep｜>name\n```json\n{` in
//! DeepSeek's) the call's name is known, and its arguments can go out as they are generated;
//! `ValueEnd` finds where the arguments object ends (strings and escapes accounted for), and
//! `tail` what closes the call and whether another follows in the same section.

use super::ToolFormat;

const DS_CALL: &str = "<｜tool▁call▁begin｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";

/// What the start of a call body says so far.
#[derive(Debug, PartialEq)]
pub(super) enum Head {
    /// A prefix of `{"name": "…", "arguments": ` and nothing else yet.
    NeedMore,
    /// Not in that shape (another key order, arguments as a string, …): read it whole.
    No,
    /// The name, and where the arguments object starts.
    Yes { name: String, args_at: usize },
}

/// The head of the next call in `format`, at the start of `text`.
pub(super) fn head(format: ToolFormat, text: &str) -> Head {
    let start = text.len() - text.trim_start().len();
    let rest = &text[start..];
    let shifted = |h: Head, by: usize| match h {
        Head::Yes { name, args_at } => Head::Yes { name, args_at: args_at + by },
        h => h,
    };
    match format {
        ToolFormat::TaggedCall => json_head(text),
        // A list: `[` before the first call (`,` before the others is taken by `tail`).
        ToolFormat::Mistral => match rest.strip_prefix('[') {
            Some(r) => shifted(json_head(r), start + 1),
            None if rest.is_empty() => Head::NeedMore,
            None => shifted(json_head(rest), start),
        },
        ToolFormat::MistralArgs => match rest.find("[ARGS]") {
            Some(at) => {
                let name = rest[..at].split("[CALL_ID]").next().unwrap_or("").trim();
                shifted(object_at(rest, at + "[ARGS]".len(), name), start)
            }
            // A name is short: past that, this is no head Perch can stream.
            None if rest.len() < 128 && !rest.contains(['{', '\n']) => Head::NeedMore,
            None => Head::No,
        },
        ToolFormat::DeepSeek | ToolFormat::DeepSeekV31 => {
            let Some(r) = rest.strip_prefix(DS_CALL) else {
                return if DS_CALL.starts_with(rest) { Head::NeedMore } else { Head::No };
            };
            let Some(sep) = r.find(DS_SEP) else {
                return if r.len() < 64 { Head::NeedMore } else { Head::No };
            };
            let at = start + DS_CALL.len();
            let after = sep + DS_SEP.len();
            if r[..sep].trim() != "function" {
                // V3.1: `name<｜tool▁sep｜>{…}`.
                return shifted(object_at(r, after, r[..sep].trim()), at);
            }
            // V3/R1: `function<｜tool▁sep｜>name\n```json\n{…}\n````.
            let Some(nl) = r[after..].find('\n') else {
                return if r.len() - after < 128 { Head::NeedMore } else { Head::No };
            };
            let name = r[after..after + nl].trim();
            let fence = after + nl + 1;
            let opening = "```json";
            let tail = &r[fence..];
            if tail.len() < opening.len() {
                return if opening.starts_with(tail) { Head::NeedMore } else { Head::No };
            }
            match tail.strip_prefix(opening) {
                Some(_) => shifted(object_at(r, fence + opening.len(), name), at),
                None => Head::No,
            }
        }
        ToolFormat::PythonTag | ToolFormat::Generic => Head::No,
    }
}

/// `name`'s arguments object, starting at `at` in `text` after optional whitespace.
fn object_at(text: &str, at: usize, name: &str) -> Head {
    let lead = text[at..].len() - text[at..].trim_start().len();
    let valid =
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    match text[at + lead..].chars().next() {
        _ if !valid => Head::No,
        None => Head::NeedMore,
        Some('{') => Head::Yes { name: name.to_string(), args_at: at + lead },
        Some(_) => Head::No,
    }
}

/// After a call's arguments: what closes it.
#[derive(Debug, PartialEq)]
pub(super) enum Tail {
    /// Not all of it has arrived.
    NeedMore,
    /// The call (and its section) ended after this many bytes.
    Over(usize),
    /// Another call of the same section starts after this many bytes.
    Next(usize),
}

/// What closes a call whose arguments object ended where `text` starts (`close`: the format's
/// section end marker).
pub(super) fn tail(format: ToolFormat, text: &str, close: Option<&str>) -> Tail {
    match format {
        // The rest of the object and the closing tag.
        ToolFormat::TaggedCall => match close.and_then(|c| text.find(c).map(|at| at + c.len())) {
            Some(n) => Tail::Over(n),
            None => Tail::NeedMore,
        },
        // The object ended the call; a next one opens with the marker again.
        ToolFormat::MistralArgs => Tail::Over(0),
        // `}` closes the call object, then `,` and another or `]`.
        ToolFormat::Mistral => {
            let t = text.trim_start();
            let Some(r) = t.strip_prefix('}') else {
                return if t.is_empty() {
                    Tail::NeedMore
                } else {
                    Tail::Over(text.len() - t.len())
                };
            };
            let r2 = r.trim_start();
            let at = text.len() - r2.len();
            match r2.chars().next() {
                None => Tail::NeedMore,
                Some(',') => Tail::Next(at + 1),
                Some(']') => Tail::Over(at + 1),
                Some(_) => Tail::Over(at),
            }
        }
        ToolFormat::DeepSeek | ToolFormat::DeepSeekV31 => {
            let Some(e) = text.find(DS_CALL_END) else { return Tail::NeedMore };
            let after = e + DS_CALL_END.len();
            let r = text[after..].trim_start();
            let at = text.len() - r.len();
            let section_end = close.unwrap_or("");
            if r.starts_with(DS_CALL) {
                Tail::Next(at)
            } else if !section_end.is_empty() && r.starts_with(section_end) {
                Tail::Over(at + section_end.len())
            } else if r.is_empty() || DS_CALL.starts_with(r) || section_end.starts_with(r) {
                Tail::NeedMore
            } else {
                Tail::Over(at)
            }
        }
        ToolFormat::PythonTag | ToolFormat::Generic => Tail::Over(0),
    }
}

/// `{"name": "…", "arguments"|"parameters": {` at the start of `text`.
fn json_head(text: &str) -> Head {
    let b = text.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Some(true): matched; Some(false): mismatch; None: the text ends inside it.
    let lit = |i: &mut usize, s: &str| -> Option<bool> {
        let n = s.len().min(b.len() - *i);
        if b[*i..*i + n] != s.as_bytes()[..n] {
            return Some(false);
        }
        *i += n;
        (n == s.len()).then_some(true)
    };
    macro_rules! step {
        ($m:expr) => {
            match $m {
                Some(true) => {}
                Some(false) => return Head::No,
                None => return Head::NeedMore,
            }
        };
    }
    ws(&mut i);
    step!(lit(&mut i, "{"));
    ws(&mut i);
    step!(lit(&mut i, "\"name\""));
    ws(&mut i);
    step!(lit(&mut i, ":"));
    ws(&mut i);
    step!(lit(&mut i, "\""));
    let start = i;
    while i < b.len() && b[i] != b'"' {
        if b[i] == b'\\' {
            return Head::No;
        }
        i += 1;
    }
    if i == b.len() {
        return Head::NeedMore;
    }
    let name = text[start..i].to_string();
    i += 1;
    ws(&mut i);
    step!(lit(&mut i, ","));
    ws(&mut i);
    let key = if b.get(i + 1) == Some(&b'p') { "\"parameters\"" } else { "\"arguments\"" };
    step!(lit(&mut i, key));
    ws(&mut i);
    step!(lit(&mut i, ":"));
    ws(&mut i);
    match b.get(i) {
        None => Head::NeedMore,
        Some(b'{') => Head::Yes { name, args_at: i },
        Some(_) => Head::No,
    }
}

/// Where a JSON object ends, fed in pieces.
#[derive(Debug, Default)]
pub(super) struct ValueEnd {
    depth: usize,
    in_string: bool,
    escape: bool,
    pub done: bool,
}

impl ValueEnd {
    /// How many bytes of `text` belong to the object (all of them unless it ends inside).
    pub fn feed(&mut self, text: &str) -> usize {
        for (at, c) in text.char_indices() {
            if self.done {
                return at;
            }
            match (self.in_string, self.escape, c) {
                (true, true, _) => self.escape = false,
                (true, false, '\\') => self.escape = true,
                (true, false, '"') => self.in_string = false,
                (true, false, _) => {}
                (false, _, '"') => self.in_string = true,
                (false, _, '{' | '[') => self.depth += 1,
                (false, _, '}' | ']') => {
                    self.depth = self.depth.saturating_sub(1);
                    self.done = self.depth == 0;
                }
                _ => {}
            }
        }
        text.len()
    }
}
