//! An incremental JSON checker for JSON mode: it accepts exactly the strings that can still
//! be extended to one JSON object (RFC 8259), so generation can refuse any token that would
//! make the output invalid, and knows when the object is complete.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    fn can_end(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Before the top-level object.
    Start,
    Value,
    /// In an object: a key or `}` (right after `{`), or a key (after `,`).
    KeyOrEnd,
    Key,
    Colon,
    /// In an array right after `[`: a value or `]`.
    ValueOrEnd,
    /// After a value inside a container: `,` or the closer.
    After,
    Str {
        key: bool,
        escape: bool,
        hex: u8,
    },
    Number(Num),
    Literal {
        word: &'static [u8],
        at: u8,
    },
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Container {
    Object,
    Array,
}

/// Nesting deeper than this is refused (a bound on the checker's memory).
const MAX_DEPTH: usize = 64;
/// Whitespace between tokens beyond this many characters in a row is refused: valid JSON,
/// but a model can otherwise pad forever instead of writing the object.
const MAX_WHITESPACE_RUN: usize = 16;

#[derive(Clone, Debug)]
pub struct JsonPrefix {
    state: State,
    stack: Vec<Container>,
    whitespace_run: usize,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix { state: State::Start, stack: Vec::new(), whitespace_run: 0 }
    }
}

impl JsonPrefix {
    pub fn new() -> JsonPrefix {
        JsonPrefix::default()
    }

    /// The whole object has been read.
    pub fn complete(&self) -> bool {
        self.state == State::Done
    }

    /// Feed `text`; false (and the state is then meaningless) if it cannot continue valid JSON.
    pub fn push_str(&mut self, text: &str) -> bool {
        text.chars().all(|c| self.push(c))
    }

    fn after_value(&mut self) {
        self.state = if self.stack.is_empty() { State::Done } else { State::After };
    }

    fn open(&mut self, c: Container) -> bool {
        if self.stack.len() >= MAX_DEPTH {
            return false;
        }
        self.stack.push(c);
        self.state = if c == Container::Object { State::KeyOrEnd } else { State::ValueOrEnd };
        true
    }

    fn close(&mut self, c: Container) -> bool {
        if self.stack.pop() != Some(c) {
            return false;
        }
        self.after_value();
        true
    }

    fn begin_value(&mut self, c: char) -> bool {
        match c {
            '{' => self.open(Container::Object),
            '[' => self.open(Container::Array),
            '"' => {
                self.state = State::Str { key: false, escape: false, hex: 0 };
                true
            }
            '-' => {
                self.state = State::Number(Num::Minus);
                true
            }
            '0' => {
                self.state = State::Number(Num::Zero);
                true
            }
            '1'..='9' => {
                self.state = State::Number(Num::Int);
                true
            }
            't' | 'f' | 'n' => {
                let word: &'static [u8] = match c {
                    't' => b"true",
                    'f' => b"false",
                    _ => b"null",
                };
                self.state = State::Literal { word, at: 1 };
                true
            }
            _ => false,
        }
    }

    pub fn push(&mut self, c: char) -> bool {
        let ws = matches!(c, ' ' | '\t' | '\n' | '\r');
        if !matches!(self.state, State::Str { .. }) {
            self.whitespace_run = if ws { self.whitespace_run + 1 } else { 0 };
            if self.whitespace_run > MAX_WHITESPACE_RUN {
                return false;
            }
        }
        match self.state {
            State::Start => ws || (c == '{' && self.open(Container::Object)),
            State::Done => ws,
            State::Value => ws || self.begin_value(c),
            State::ValueOrEnd => {
                ws || (c == ']' && self.close(Container::Array))
                    || (c != ']' && self.begin_value(c))
            }
            State::KeyOrEnd | State::Key => {
                if ws {
                    return true;
                }
                if c == '}' && self.state == State::KeyOrEnd {
                    return self.close(Container::Object);
                }
                if c == '"' {
                    self.state = State::Str { key: true, escape: false, hex: 0 };
                    return true;
                }
                false
            }
            State::Colon => {
                if c == ':' {
                    self.state = State::Value;
                }
                ws || c == ':'
            }
            State::After => match (c, self.stack.last()) {
                _ if ws => true,
                (',', Some(Container::Object)) => {
                    self.state = State::Key;
                    true
                }
                (',', Some(Container::Array)) => {
                    self.state = State::Value;
                    true
                }
                ('}', _) => self.close(Container::Object),
                (']', _) => self.close(Container::Array),
                _ => false,
            },
            State::Str { key, escape, hex } => {
                if hex > 0 {
                    if !c.is_ascii_hexdigit() {
                        return false;
                    }
                    self.state = State::Str { key, escape: false, hex: hex - 1 };
                    return true;
                }
                if escape {
                    return match c {
                        '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => {
                            self.state = State::Str { key, escape: false, hex: 0 };
                            true
                        }
                        'u' => {
                            self.state = State::Str { key, escape: false, hex: 4 };
                            true
                        }
                        _ => false,
                    };
                }
                match c {
                    '"' => {
                        if key {
                            self.state = State::Colon;
                        } else {
                            self.after_value();
                        }
                        true
                    }
                    '\\' => {
                        self.state = State::Str { key, escape: true, hex: 0 };
                        true
                    }
                    c if (c as u32) < 0x20 => false,
                    _ => true,
                }
            }
            State::Literal { word, at } => {
                if word.get(at as usize) != Some(&(c as u32 as u8)) || !c.is_ascii() {
                    return false;
                }
                if at as usize + 1 == word.len() {
                    self.after_value();
                } else {
                    self.state = State::Literal { word, at: at + 1 };
                }
                true
            }
            State::Number(n) => {
                let next = match (n, c) {
                    (Num::Minus, '0') => Some(Num::Zero),
                    (Num::Minus, '1'..='9') => Some(Num::Int),
                    (Num::Int, '0'..='9') => Some(Num::Int),
                    (Num::Zero | Num::Int, '.') => Some(Num::Dot),
                    (Num::Dot | Num::Frac, '0'..='9') => Some(Num::Frac),
                    (Num::Zero | Num::Int | Num::Frac, 'e' | 'E') => Some(Num::E),
                    (Num::E, '+' | '-') => Some(Num::ESign),
                    (Num::E | Num::ESign | Num::Exp, '0'..='9') => Some(Num::Exp),
                    _ => None,
                };
                match next {
                    Some(n) => {
                        self.state = State::Number(n);
                        true
                    }
                    // The number ended; the character belongs to what follows it.
                    None if n.can_end() => {
                        self.after_value();
                        self.push(c)
                    }
                    None => false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(s: &str) -> bool {
        JsonPrefix::new().push_str(s)
    }

    fn complete(s: &str) -> bool {
        let mut j = JsonPrefix::new();
        j.push_str(s) && j.complete()
    }

    #[test]
    fn whole_objects_are_complete() {
        for s in [
            "{}",
            " {\"a\": 1}\n",
            r#"{"a":[1,-2.5e+3,0,true,false,null,"x\"y\u00e9"],"b":{"c":{}},"d":[]}"#,
            r#"{"emoji":"🐦","n":-0.0E1}"#,
        ] {
            assert!(complete(s), "{s}");
            // And every prefix is accepted but (but the last) incomplete.
            for (i, _) in s.char_indices() {
                assert!(accepts(&s[..i]), "prefix {:?}", &s[..i]);
            }
        }
    }

    #[test]
    fn invalid_continuations_are_refused() {
        for s in [
            "[1]",
            "\"x\"",
            "1",
            "{a",
            "{\"a\" 1",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":tru}",
            "{\"a\":[1 2]}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\n\"}",
            "{}}",
            "{]",
            "{\"a\":-}",
        ] {
            assert!(!accepts(s), "{s:?} is not the start of a JSON object");
        }
        assert!(!accepts("{} x"), "nothing but whitespace after the object");
        assert!(accepts("{\"a\": 12"), "a number may go on");
        assert!(!complete("{\"a\": 12"));
    }

    #[test]
    fn whitespace_padding_is_bounded() {
        assert!(accepts(&format!("{}{{", " ".repeat(16))));
        assert!(!accepts(&" ".repeat(17)));
        assert!(
            accepts(&format!("{{\"a\": \"{}\"}}", " ".repeat(100))),
            "inside strings anything goes"
        );
    }

    #[test]
    fn nesting_is_bounded() {
        assert!(accepts(&format!("{{\"a\":{}", "[".repeat(60))));
        assert!(!accepts(&format!("{{\"a\":{}", "[".repeat(70))));
    }
}
