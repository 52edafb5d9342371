//! A tagged JSON call read as it streams: once `{"name": "…", "arguments": {` has arrived the
//! call's name is known, and its arguments can go out as they are generated; `ValueEnd` finds
//! where the arguments object ends (strings and escapes accounted for).

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

pub(super) fn head(text: &str) -> Head {
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
    step!(lit(&mut i, "\"arguments\""));
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
