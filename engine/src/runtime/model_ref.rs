//! A model as requests name it: an installed model, optionally with one LoRA adapter trained
//! on it (`base+adapter`). Parsed once, at the edge, so nothing splits strings on `+` later.

use std::fmt;
use std::str::FromStr;

pub use crate::error::ModelRefError;

/// Longest model reference accepted. Installed ids are directory names (and Hugging Face repo
/// ids, `org/name`, at most 96 characters on the hub); adapter names are at most 64.
pub const MAX_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRef {
    pub base: String,
    pub adapter: Option<String>,
}

impl ModelRef {
    pub fn base(id: impl Into<String>) -> ModelRef {
        ModelRef { base: id.into(), adapter: None }
    }
}

impl FromStr for ModelRef {
    type Err = ModelRefError;

    fn from_str(s: &str) -> Result<ModelRef, ModelRefError> {
        if s.is_empty() {
            return Err(ModelRefError::Empty);
        }
        if s.len() > MAX_LEN {
            return Err(ModelRefError::TooLong { len: s.len(), max: MAX_LEN });
        }
        let Some((base, adapter)) = s.split_once('+') else {
            return Ok(ModelRef::base(s));
        };
        if adapter.contains('+') {
            return Err(ModelRefError::Stacked);
        }
        if base.is_empty() || adapter.is_empty() {
            return Err(ModelRefError::EmptyPart);
        }
        Ok(ModelRef { base: base.into(), adapter: Some(adapter.into()) })
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.adapter {
            Some(a) => write!(f, "{}+{a}", self.base),
            None => f.write_str(&self.base),
        }
    }
}

/// Names clients send for models Perch does not have, mapped to installed ones: coding agents
/// ask for `claude-sonnet-4-5` or `gpt-5` whatever the server holds. Patterns are names with
/// `*` standing for any run of characters; an exact pattern wins over globs, and a longer
/// glob over a shorter one. The target `default` is the default model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelAliases(Vec<(String, String)>);

/// The target that means "the default model".
pub const DEFAULT_TARGET: &str = "default";
/// At most this many aliases (each lookup tries them all).
pub const MAX_ALIASES: usize = 64;

impl ModelAliases {
    /// Checked aliases, or why they cannot be used (naming the pattern).
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<ModelAliases, String> {
        let mut out: Vec<(String, String)> = vec![];
        for (pattern, target) in pairs {
            if pattern.is_empty()
                || pattern.len() > MAX_LEN
                || pattern.chars().any(char::is_control)
            {
                return Err(format!(
                    "alias pattern `{pattern}` must be 1 to {MAX_LEN} printable characters"
                ));
            }
            if target != DEFAULT_TARGET {
                target.parse::<ModelRef>().map_err(|e| format!("alias `{pattern}`: {e}"))?;
            }
            out.push((pattern, target));
        }
        if out.len() > MAX_ALIASES {
            return Err(format!("at most {MAX_ALIASES} aliases, not {}", out.len()));
        }
        // Exact names first, then globs from the longest (the most specific) down.
        out.sort_by_key(|(p, _)| (p.contains('*'), std::cmp::Reverse(p.len())));
        Ok(ModelAliases(out))
    }

    /// What a fresh install maps: Anthropic's and OpenAI's model names, to the default model.
    pub fn defaults() -> Vec<(String, String)> {
        ["claude-*", "gpt-*"].iter().map(|p| (p.to_string(), DEFAULT_TARGET.to_string())).collect()
    }

    /// The target `name` is mapped to, if any.
    pub fn lookup(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(p, _)| glob(p, name)).map(|(_, t)| t.as_str())
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters (greedy with
/// backtracking to the last star: linear in practice, quadratic at worst, and both are short).
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_match_exact_names_before_globs_and_longer_globs_first() {
        let a = ModelAliases::new([
            ("claude-*".to_string(), "default".to_string()),
            ("claude-haiku-*".to_string(), "gemma".to_string()),
            ("claude-haiku-4-5".to_string(), "qwen+fast".to_string()),
        ])
        .unwrap();
        assert_eq!(a.lookup("claude-sonnet-4-5-20250929"), Some("default"));
        assert_eq!(a.lookup("claude-haiku-3"), Some("gemma"));
        assert_eq!(a.lookup("claude-haiku-4-5"), Some("qwen+fast"));
        assert_eq!(a.lookup("claud"), None);
        assert_eq!(a.lookup("gpt-5"), None);
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXXbYYbc"));
        assert!(!glob("a*b*c", "aXXbYYb"));
        assert!(glob("*-mini", "gpt-4o-mini"));
        assert!(ModelAliases::new([("x".into(), "a+b+c".into())]).is_err());
        assert!(ModelAliases::new([("".into(), "default".into())]).is_err());
    }

    #[test]
    fn parses_and_prints() {
        let r: ModelRef = "qwen3+cycle".parse().unwrap();
        assert_eq!((r.base.as_str(), r.adapter.as_deref()), ("qwen3", Some("cycle")));
        assert_eq!(r.to_string(), "qwen3+cycle");
        assert_eq!("org/model".parse::<ModelRef>().unwrap(), ModelRef::base("org/model"));
    }

    #[test]
    fn refuses_what_it_cannot_mean() {
        assert_eq!("".parse::<ModelRef>(), Err(ModelRefError::Empty));
        assert_eq!("a+b+c".parse::<ModelRef>(), Err(ModelRefError::Stacked));
        assert_eq!("a+".parse::<ModelRef>(), Err(ModelRefError::EmptyPart));
        assert_eq!("+b".parse::<ModelRef>(), Err(ModelRefError::EmptyPart));
        // The id that overflowed the stack once per `+`: refused by length, in one step.
        let plus = "+".repeat(300_000);
        assert_eq!(
            plus.parse::<ModelRef>(),
            Err(ModelRefError::TooLong { len: 300_000, max: MAX_LEN })
        );
        assert_eq!("+".repeat(MAX_LEN).parse::<ModelRef>(), Err(ModelRefError::Stacked));
    }
}
