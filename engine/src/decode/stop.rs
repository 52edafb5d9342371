//! Stop strings: found across token boundaries, holding back only text that may yet start one.

/// Finds stop strings across token boundaries, holding back only the text that could still
/// turn out to be the start of one.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// Add text; returns what is safe to emit and whether a stop string was found (text from
    /// the stop string on is dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        if self.matched.is_some() {
            return (String::new(), true);
        }
        self.pending.push_str(piece);
        // The earliest match wins; at one position, the longest stop string.
        let found = self
            .stops
            .iter()
            .filter_map(|s| {
                self.pending.find(s.as_str()).map(|at| (at, std::cmp::Reverse(s.len()), s))
            })
            .min();
        if let Some((at, _, stop)) = found {
            let out = self.pending[..at].to_string();
            self.matched = Some(stop.clone());
            self.pending.clear();
            return (out, true);
        }
        let hold = self.longest_partial_suffix();
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Whether a stop string was found.
    pub fn hit(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that was found.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// The generation ended without a stop string: what was held back is output after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of some stop string.
    fn longest_partial_suffix(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for stop in &self.stops {
            for len in (1..stop.len().min(p.len() + 1)).rev() {
                if len <= best {
                    break;
                }
                if p.is_char_boundary(p.len() - len)
                    && stop.is_char_boundary(len)
                    && p.ends_with(&stop[..len])
                {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn feed(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut out = String::new();
        for p in pieces {
            let (ready, hit) = m.push(p);
            out.push_str(&ready);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_pieces_is_cut_exactly() {
        assert_eq!(feed(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
        assert_eq!(feed(&["\n\n"], &["one\n", "\ntwo"]), ("one".into(), true));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(feed(&["zz", "b"], &["a", "bzz"]), ("a".into(), true));
        // Which one matched is kept (Anthropic's `stop_sequence`).
        let mut m = StopMatcher::new(&["zz".into(), "b".into(), "bz".into()]);
        m.push("a");
        m.push("bzz");
        assert_eq!(m.matched(), Some("bz"));
    }

    #[test]
    fn only_a_possible_prefix_is_held_back() {
        let mut m = StopMatcher::new(&["STOP".into()]);
        assert_eq!(m.push("hello S"), ("hello ".into(), false));
        assert_eq!(m.push("T"), ("".into(), false));
        // "STx" can no longer become "STOP": released at once.
        assert_eq!(m.push("x"), ("STx".into(), false));
        assert_eq!(m.push("plain"), ("plain".into(), false));
    }

    #[test]
    fn held_text_comes_out_when_generation_ends() {
        assert_eq!(feed(&["STOP"], &["the ST"]), ("the ST".into(), false));
    }

    #[test]
    fn multibyte_stop_strings_and_text() {
        assert_eq!(feed(&["🐦"], &["café ", "\u{1F426}", " after"]), ("café ".into(), true));
        assert_eq!(feed(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
    }
}
