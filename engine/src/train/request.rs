//! `POST /train`'s body, checked field by field so every refusal names its field.

use serde_json::{Map, Value};

use super::data::{Example, TrainData};
use super::pacing::Pacing;
use crate::model::lora::{valid_name, LoraSpec, TARGETS};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    pub param: String,
    pub message: String,
}

fn bad(param: &str, message: impl Into<String>) -> FieldError {
    FieldError { param: param.into(), message: message.into() }
}

pub struct TrainRequest {
    /// The model to adapt (`None`: the loaded one).
    pub model: Option<String>,
    pub adapter: String,
    pub data: TrainData,
    pub lora: LoraSpec,
    pub epochs: usize,
    pub batch_size: usize,
    pub seq_len: usize,
    pub learning_rate: f32,
    pub weight_decay: f32,
    pub eval_fraction: f64,
    pub seed: u64,
    /// Batches per window: the unit of work serving may have to wait for.
    pub window_batches: usize,
    pub pacing: Pacing,
}

const FIELDS: &[&str] = &[
    "model",
    "adapter",
    "text",
    "examples",
    "rank",
    "alpha",
    "targets",
    "layers",
    "epochs",
    "batch_size",
    "seq_len",
    "learning_rate",
    "weight_decay",
    "eval_fraction",
    "seed",
    "window_batches",
    "share_ppm",
    "max_slowdown_ppm",
];

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn int(&self, key: &str, default: i64, min: i64, max: i64) -> Result<i64, FieldError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_i64() {
                Some(n) if (min..=max).contains(&n) => Ok(n),
                Some(n) => Err(bad(key, format!("must be between {min} and {max}, not {n}"))),
                None => Err(bad(key, "must be an integer")),
            },
        }
    }

    fn float(&self, key: &str, default: f64, min: f64, max: f64) -> Result<f64, FieldError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= min && x <= max => Ok(x),
                Some(x) => Err(bad(key, format!("must be between {min} and {max}, not {x}"))),
                None => Err(bad(key, "must be a number")),
            },
        }
    }

    fn string(&self, key: &str) -> Result<Option<String>, FieldError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(key, "must be a string")),
        }
    }
}

/// Messages in one chat example.
pub const MAX_MESSAGES: usize = 256;
/// Bytes of message text in one chat example.
pub const MAX_EXAMPLE_BYTES: usize = 256 << 10;

pub fn parse(body: &[u8]) -> Result<TrainRequest, FieldError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad("body", format!("not valid JSON: {e}")))?;
    let Value::Object(map) = value else { return Err(bad("body", "must be a JSON object")) };
    if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, format!("unknown field (known: {})", FIELDS.join(", "))));
    }
    let f = Fields(&map);
    let model = f.string("model")?;
    let adapter = match f.string("adapter")? {
        Some(a) if valid_name(&a) => a,
        Some(_) => {
            return Err(bad(
                "adapter",
                "must be 1–64 letters, digits, `-`, `_` or `.`, not starting with `.`",
            ))
        }
        None => format!(
            "adapter-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        ),
    };
    let data = match (
        map.get("text").filter(|v| !v.is_null()),
        map.get("examples").filter(|v| !v.is_null()),
    ) {
        (Some(_), Some(_)) => return Err(bad("text", "give `text` or `examples`, not both")),
        (None, None) => {
            return Err(bad(
                "text",
                "training data is required: `text` (plain text) or `examples` (chats)",
            ))
        }
        (Some(Value::String(t)), None) if t.trim().is_empty() => {
            return Err(bad("text", "is empty"))
        }
        (Some(Value::String(t)), None) => TrainData::Text(t.clone()),
        (Some(_), None) => return Err(bad("text", "must be a string")),
        (None, Some(v)) => {
            let examples: Vec<Example> = serde_json::from_value(v.clone()).map_err(|e| {
                bad(
                    "examples",
                    format!("must be a list of {{\"messages\": [{{\"role\", \"content\"}}]}}: {e}"),
                )
            })?;
            if examples.is_empty() {
                return Err(bad("examples", "is empty"));
            }
            // Locating each assistant turn renders the chat up to it: work grows with the
            // square of a chat's length, so chats are capped.
            if let Some((i, e)) =
                examples.iter().enumerate().find(|(_, e)| e.messages.len() > MAX_MESSAGES)
            {
                return Err(bad(
                    "examples",
                    format!(
                        "examples[{i}] has {} messages; at most {MAX_MESSAGES} per example",
                        e.messages.len()
                    ),
                ));
            }
            if let Some((i, n)) = examples
                .iter()
                .map(|e| e.messages.iter().map(|m| m.content.len()).sum::<usize>())
                .enumerate()
                .find(|(_, n)| *n > MAX_EXAMPLE_BYTES)
            {
                return Err(bad(
                    "examples",
                    format!("examples[{i}] has {n} bytes of text; at most {MAX_EXAMPLE_BYTES}"),
                ));
            }
            TrainData::Examples(examples)
        }
    };
    let rank = f.int("rank", 8, 1, 256)?;
    let alpha = f.float("alpha", 16.0, 1e-6, 1e4)?;
    let targets = match map.get("targets") {
        None | Some(Value::Null) => {
            ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec()
        }
        Some(Value::Array(list)) if !list.is_empty() => {
            let mut out = Vec::new();
            for t in list {
                match t.as_str() {
                    Some(s) if TARGETS.contains(&s) => out.push(s.to_string()),
                    _ => {
                        return Err(bad(
                            "targets",
                            format!("unknown target {t} (one of {})", TARGETS.join(", ")),
                        ))
                    }
                }
            }
            out.dedup();
            out
        }
        Some(_) => {
            return Err(bad(
                "targets",
                format!("must be a non-empty list of {}", TARGETS.join(", ")),
            ))
        }
    };
    let layers = match map.get("layers") {
        None | Some(Value::Null) => None,
        Some(_) => Some(f.int("layers", 0, 1, 1024)? as usize),
    };
    let pacing = match (
        map.get("share_ppm").filter(|v| !v.is_null()),
        map.get("max_slowdown_ppm").filter(|v| !v.is_null()),
    ) {
        (Some(_), Some(_)) => {
            return Err(bad("max_slowdown_ppm", "give `share_ppm` or `max_slowdown_ppm`, not both"))
        }
        (None, Some(_)) => Pacing::MaxSlowdownPpm(f.int("max_slowdown_ppm", 0, 1, 999_999)? as u32),
        (Some(_), None) => Pacing::SharePpm(f.int("share_ppm", 0, 1, 1_000_000)? as u32),
        (None, None) => Pacing::default(),
    };
    Ok(TrainRequest {
        model,
        adapter,
        data,
        lora: LoraSpec { rank: rank as i32, alpha: alpha as f32, targets, layers },
        epochs: f.int("epochs", 3, 1, 1000)? as usize,
        batch_size: f.int("batch_size", 1, 1, 64)? as usize,
        seq_len: f.int("seq_len", 128, 16, 8192)? as usize,
        learning_rate: f.float("learning_rate", 1e-4, 1e-9, 1.0)? as f32,
        weight_decay: f.float("weight_decay", 0.0, 0.0, 1.0)? as f32,
        eval_fraction: f.float("eval_fraction", 0.1, 0.0, 0.5)?,
        seed: f.int("seed", 0, 0, i64::MAX)? as u64,
        window_batches: f.int("window_batches", 2, 1, 64)? as usize,
        pacing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> FieldError {
        parse(body.as_bytes()).err().unwrap_or_else(|| panic!("accepted {body}"))
    }

    #[test]
    fn defaults() {
        let r = parse(br#"{"text": "hello there"}"#).unwrap();
        assert_eq!(r.lora.rank, 8);
        assert_eq!(r.lora.targets, ["q_proj", "k_proj", "v_proj", "o_proj"]);
        assert_eq!(r.pacing, Pacing::SharePpm(250_000));
        assert!(r.adapter.starts_with("adapter-"));
        let r = parse(
            br#"{"text": "x", "max_slowdown_ppm": 100000, "targets": ["down_proj"], "rank": 4}"#,
        )
        .unwrap();
        assert_eq!(r.pacing, Pacing::MaxSlowdownPpm(100_000));
        assert_eq!(r.lora.targets, ["down_proj"]);
    }

    #[test]
    fn each_refusal_names_its_field() {
        assert_eq!(err(r#"{"text": "x", "rank": -4}"#).param, "rank");
        assert_eq!(
            err(r#"{"text": "x", "share_ppm": 1, "max_slowdown_ppm": 2}"#).param,
            "max_slowdown_ppm"
        );
        assert_eq!(err(r#"{"text": ""}"#).param, "text");
        assert_eq!(err(r#"{}"#).param, "text");
        assert_eq!(err(r#"{"examples": []}"#).param, "examples");
        assert_eq!(err(r#"{"examples": [{"messages": [{"role": "user"}]}]}"#).param, "examples");
        assert_eq!(err(r#"{"text": "x", "targets": ["qkv_proj"]}"#).param, "targets");
        assert_eq!(err(r#"{"text": "x", "targets": []}"#).param, "targets");
        assert_eq!(err(r#"{"text": "x", "adapter": "../evil"}"#).param, "adapter");
        assert_eq!(err(r#"{"text": "x", "learning_rate": "fast"}"#).param, "learning_rate");
        assert_eq!(err(r#"{"text": "x", "lr": 0.1}"#).param, "lr");
        assert_eq!(err(r#"{"text": "x", "max_slowdown_ppm": 1000000}"#).param, "max_slowdown_ppm");
        assert_eq!(err(r#"[1]"#).param, "body");
    }
}
