//! The `draft` setting and flag (`auto`, `none`, `lookup`, `mtp`, `mtp:DEPTH`), parsed once
//! where it enters (settings file, settings API, command line) and resolved per model when
//! that model loads: a bad value is refused by name there, never turned into plain decoding.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::request::{DraftMode, MAX_MTP_DEPTH};
use crate::model::LoadedModel;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DraftSetting {
    /// MTP when the model has a head, prompt lookup otherwise.
    #[default]
    Auto,
    None,
    Lookup,
    /// The MTP head chained `depth` times (1 to `MAX_MTP_DEPTH`).
    Mtp {
        depth: usize,
    },
}

impl DraftSetting {
    /// What a turn on `model` drafts with by default.
    pub fn mode(self, model: &LoadedModel) -> DraftMode {
        match self {
            DraftSetting::Auto => DraftMode::auto(model),
            DraftSetting::None => DraftMode::None,
            DraftSetting::Lookup => DraftMode::lookup(),
            DraftSetting::Mtp { depth } => DraftMode::Mtp { depth },
        }
    }
}

impl FromStr for DraftSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<DraftSetting, String> {
        let bad =
            || format!("must be auto, none, lookup, mtp or mtp:1..{MAX_MTP_DEPTH}, not `{s}`");
        Ok(match s {
            "auto" => DraftSetting::Auto,
            "none" => DraftSetting::None,
            "lookup" => DraftSetting::Lookup,
            "mtp" => DraftSetting::Mtp { depth: 1 },
            _ => match s.strip_prefix("mtp:").and_then(|d| d.parse::<usize>().ok()) {
                Some(depth) if (1..=MAX_MTP_DEPTH).contains(&depth) => DraftSetting::Mtp { depth },
                _ => return Err(bad()),
            },
        })
    }
}

impl fmt::Display for DraftSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DraftSetting::Auto => f.write_str("auto"),
            DraftSetting::None => f.write_str("none"),
            DraftSetting::Lookup => f.write_str("lookup"),
            DraftSetting::Mtp { depth: 1 } => f.write_str("mtp"),
            DraftSetting::Mtp { depth } => write!(f, "mtp:{depth}"),
        }
    }
}

impl TryFrom<String> for DraftSetting {
    type Error = String;
    fn try_from(s: String) -> Result<DraftSetting, String> {
        s.parse()
    }
}

impl From<DraftSetting> for String {
    fn from(d: DraftSetting) -> String {
        d.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_and_bad_ones_are_refused() {
        for s in ["auto", "none", "lookup", "mtp", "mtp:2", "mtp:3"] {
            assert_eq!(s.parse::<DraftSetting>().unwrap().to_string(), s);
        }
        assert_eq!("mtp:1".parse::<DraftSetting>(), Ok(DraftSetting::Mtp { depth: 1 }));
        for s in ["", "fast", "mtp:0", "mtp:9", "mtp:", "MTP", "lookup "] {
            let e = s.parse::<DraftSetting>().unwrap_err();
            assert!(e.contains(&format!("`{s}`")), "{e}");
        }
        let json: DraftSetting = serde_json::from_str("\"mtp:2\"").unwrap();
        assert_eq!(serde_json::to_string(&json).unwrap(), "\"mtp:2\"");
        assert!(serde_json::from_str::<DraftSetting>("\"mtp:7\"").is_err());
    }
}
