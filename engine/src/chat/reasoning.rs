//! Reasoning read out of an answer: what a thinking model writes between `<think>` and
//! `</think>` goes to `reasoning_content`, never to `content`. Whether to look is the
//! template's to say (it writes `<think>` itself); a prompt that ends inside an open `<think>`
//! (templates that open it for the model) starts the answer in reasoning. Works on streamed
//! text: a tail that may be the start of a marker is held back until it is known.

use super::tools::partial_suffix;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// What the splitter lets out.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// At the start: the answer may open with `<think>` (after whitespace).
    Start,
    Thinking,
    /// Just after `</think>`: the blank lines that separate reasoning from the answer are
    /// layout, not content.
    AfterThinking,
    Answer,
}

pub struct ThinkSplitter {
    state: State,
    held: String,
}

impl ThinkSplitter {
    /// A splitter for a chat rendered with `template` into `prompt`; `None` when the template
    /// knows no reasoning markers.
    pub fn for_prompt(template: &str, prompt: &str) -> Option<ThinkSplitter> {
        if !template.contains(OPEN) && !template.contains(CLOSE) {
            return None;
        }
        let open = prompt.rfind(OPEN).is_some_and(|o| prompt.rfind(CLOSE).is_none_or(|c| c < o));
        Some(ThinkSplitter {
            state: if open { State::Thinking } else { State::Start },
            held: String::new(),
        })
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// The answer has ended: everything held.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        out
    }

    fn drain(&mut self, out: &mut Vec<Part>, end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let start = self.held.trim_start();
                    if let Some(rest) = start.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(start) && !end {
                        return;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        emit(out, Part::Reasoning(self.held[..at].to_string()));
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::AfterThinking;
                    }
                    None => {
                        let keep = if end { 0 } else { partial_suffix(&self.held, CLOSE) };
                        let text: String = self.held.drain(..self.held.len() - keep).collect();
                        emit(out, Part::Reasoning(text));
                        return;
                    }
                },
                State::AfterThinking => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() && !end {
                        self.held.clear();
                        return;
                    }
                    self.held = trimmed.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    let text = std::mem::take(&mut self.held);
                    emit(out, Part::Content(text));
                    return;
                }
            }
        }
    }
}

fn emit(out: &mut Vec<Part>, part: Part) {
    match &part {
        Part::Reasoning(t) | Part::Content(t) if t.is_empty() => {}
        _ => out.push(part),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}";

    /// Every two-way split and char-by-char feeding give the same (reasoning, content).
    fn split(prompt: &str, text: &str) -> (String, String) {
        let run = |pieces: &[&str]| {
            let mut s = ThinkSplitter::for_prompt(QWEN3, prompt).unwrap();
            let mut parts = Vec::new();
            for p in pieces {
                parts.extend(s.push(p));
            }
            parts.extend(s.finish());
            let (mut r, mut c) = (String::new(), String::new());
            for p in parts {
                match p {
                    Part::Reasoning(t) => r.push_str(&t),
                    Part::Content(t) => c.push_str(&t),
                }
            }
            (r, c)
        };
        let whole = run(&[text]);
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(run(&[&text[..i], &text[i..]]), whole, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(run(&chars.iter().map(String::as_str).collect::<Vec<_>>()), whole);
        whole
    }

    #[test]
    fn thinking_goes_to_reasoning_and_never_to_content() {
        let (r, c) =
            split("<|im_start|>assistant\n", "<think>\nLet me add: 2+2=4.\n</think>\n\nIt is 4.");
        assert_eq!((r.as_str(), c.as_str()), ("\nLet me add: 2+2=4.\n", "It is 4."));
        // The template opened it in the prompt.
        let (r, c) = split("<|im_start|>assistant\n<think>\n", "2+2=4 </thi nope</think>4");
        assert_eq!((r.as_str(), c.as_str()), ("2+2=4 </thi nope", "4"));
        // Thinking switched off: the prompt holds a closed block; all is content.
        let (r, c) = split("assistant\n<think>\n\n</think>\n\n", "<thin is not a tag; 4");
        assert_eq!((r.as_str(), c.as_str()), ("", "<thin is not a tag; 4"));
        // Cut off while thinking: what came is reasoning, nothing leaks.
        let (r, c) = split("assistant\n", "<think>still going </thi");
        assert_eq!((r.as_str(), c.as_str()), ("still going </thi", ""));
    }

    #[test]
    fn templates_without_markers_get_no_splitter() {
        assert!(ThinkSplitter::for_prompt("{{ messages }}", "<think>").is_none());
    }
}
