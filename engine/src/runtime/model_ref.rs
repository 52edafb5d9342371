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

#[cfg(test)]
mod tests {
    use super::*;

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
