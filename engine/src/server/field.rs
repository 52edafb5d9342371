//! The value types of a typed request body's fields (`Num`, `Int`, `Flag`, `Text`, `Json`):
//! each reads one JSON value, refuses a wrong kind or a value out of its bounds in the words
//! every endpoint uses, and describes itself to `/openapi.json` with the same bounds, so a
//! bound is written once, in the field's type (`Num<0, 2>` is "a number from 0 to 2").
//! `typed_fields` reads a body into such a type and adds the field's path to the words.

use std::borrow::Cow;
use std::fmt::Display;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{Deserialize, Deserializer, Error};
use serde_json::{Map, Value};

use super::body::kind;
use super::error::ApiError;

/// Between a refusal's code and its words in a serde error, so that the code survives serde
/// (whose custom errors are text) and `typed_fields` can give it back to the `ApiError`.
const SEP: char = '\u{1f}';

fn refuse<E: Error>(code: &str, words: impl Display) -> E {
    E::custom(format!("{code}{SEP}{words}"))
}

/// A serde error's code and words, as `refuse` wrote them; `None` for serde's own errors.
fn split(message: &str) -> Option<(&'static str, &str)> {
    let (code, words) = message.split_once(SEP)?;
    let code =
        ["invalid_type", "invalid_value", "unsupported_value"].into_iter().find(|c| *c == code)?;
    Some((code, words))
}

/// The fields of `map` read as `T`, a body type whose fields are `server::field` types: a
/// wrong kind or a value out of bounds is refused by its path (`stream_options`), in the
/// field type's words and with its code. The caller has checked the field names.
pub fn typed_fields<T: serde::de::DeserializeOwned>(
    map: Map<String, Value>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { "body" } else { &path };
        let inner = e.inner().to_string();
        match split(&inner) {
            Some((code, words)) => {
                ApiError::invalid(param, format!("`{param}` {words}")).code(code)
            }
            None => ApiError::invalid(param, inner),
        }
    })
}

fn wrong_kind<E: Error>(want: &str, v: &Value) -> E {
    refuse("invalid_type", format!("must be {want}; got {}", kind(v)))
}

/// A number from `LO` to `HI` (above `LO` when `OPEN`), checked as given and as the `f32`
/// the sampler uses (1e-50 is above 0, its `f32` is not).
#[derive(Debug, Clone, Copy)]
pub struct Num<const LO: i64, const HI: i64, const OPEN: bool = false>(pub f64);

impl<const LO: i64, const HI: i64, const OPEN: bool> Num<LO, HI, OPEN> {
    fn within(x: f64) -> bool {
        let above = if OPEN { x > LO as f64 } else { x >= LO as f64 };
        above && x <= HI as f64
    }

    pub fn get(v: Option<Self>, default: f32) -> f32 {
        v.map_or(default, |n| n.0 as f32)
    }
}

impl<'de, const LO: i64, const HI: i64, const OPEN: bool> Deserialize<'de> for Num<LO, HI, OPEN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let x = v.as_f64().ok_or_else(|| wrong_kind("a number", &v))?;
        if Self::within(x) && Self::within(x as f32 as f64) {
            return Ok(Num(x));
        }
        let range = if OPEN { format!("in ({LO}, {HI}]") } else { format!("from {LO} to {HI}") };
        Err(refuse("invalid_value", format!("must be {range}; got {x}")))
    }
}

impl<const LO: i64, const HI: i64, const OPEN: bool> JsonSchema for Num<LO, HI, OPEN> {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        format!("Num_{LO}_{HI}_{OPEN}").into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut s = json_schema!({ "type": "number", "minimum": LO, "maximum": HI });
        if OPEN {
            // OpenAPI 3.0's form: a flag beside `minimum`.
            s.insert("exclusiveMinimum".into(), true.into());
        }
        s
    }
}

/// An integer from `LO` to `HI`.
#[derive(Debug, Clone, Copy)]
pub struct Int<const LO: i64 = { i64::MIN }, const HI: i64 = { i64::MAX }>(pub i64);

impl<'de, const LO: i64, const HI: i64> Deserialize<'de> for Int<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        match v.as_i64() {
            Some(x) if (LO..=HI).contains(&x) => Ok(Int(x)),
            Some(x) => Err(refuse(
                "invalid_value",
                format!("must be an integer from {LO} to {HI}; got {x}"),
            )),
            None => Err(wrong_kind("an integer", &v)),
        }
    }
}

impl<const LO: i64, const HI: i64> JsonSchema for Int<LO, HI> {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        format!("Int_{LO}_{HI}").into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut s = json_schema!({ "type": "integer" });
        if LO != i64::MIN {
            s.insert("minimum".into(), LO.into());
        }
        if HI != i64::MAX {
            s.insert("maximum".into(), HI.into());
        }
        s
    }
}

/// A boolean.
#[derive(Debug, Clone, Copy)]
pub struct Flag(pub bool);

impl Flag {
    pub fn get(v: Option<Flag>) -> bool {
        v.is_some_and(|f| f.0)
    }
}

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(b) => Ok(Flag(b)),
            v => Err(wrong_kind("a boolean", &v)),
        }
    }
}

impl JsonSchema for Flag {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Flag".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "boolean" })
    }
}

/// A string.
#[derive(Debug, Clone)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Text(s)),
            v => Err(wrong_kind("a string", &v)),
        }
    }
}

impl JsonSchema for Text {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Text".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string" })
    }
}

/// A field whose JSON its own parser reads (messages, tools, formats): the value as sent,
/// described to `/openapi.json` by the schema `S` names.
pub struct Json<S>(pub Value, std::marker::PhantomData<S>);

impl<S> std::fmt::Debug for Json<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl<S> Json<S> {
    pub fn value(v: &Option<Self>) -> Option<&Value> {
        v.as_ref().map(|j| &j.0)
    }
}

impl<'de, S> Deserialize<'de> for Json<S> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Json(Value::deserialize(d)?, std::marker::PhantomData))
    }
}

/// The schema of a `Json` field, written by hand where a parser of its own reads the field.
pub trait Described {
    const NAME: &'static str;
    fn schema() -> Value;
}

impl<S: Described> JsonSchema for Json<S> {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        S::NAME.into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        Schema::try_from(S::schema()).expect("a hand-written schema is an object")
    }
}

/// Accepted and ignored on purpose: any JSON.
pub struct Ignored;

impl Described for Ignored {
    const NAME: &'static str = "Ignored";
    fn schema() -> Value {
        serde_json::json!({})
    }
}
