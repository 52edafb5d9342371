//! The value types of a typed request body's fields (`Num`, `Int`, `Flag`, `Text`, `Json`):
//! each reads one JSON value, refuses a wrong kind or a value out of its bounds, and describes
//! itself to `/openapi.json` with the same bounds, so a bound is written once, in the field's
//! type (`Num<0, 2>` is "a number from 0 to 2"). `typed_fields` reads a body into such a type
//! and words a refusal as its protocol does, with the field's path.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{Deserializer, Error};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::body::kind;
use super::error::ApiError;

/// What a field type refuses, before a protocol words it (`Words`).
#[derive(Debug, Serialize, Deserialize)]
enum Refusal {
    /// The wrong JSON kind: what the field takes ("a number") and what came ("a string").
    Kind { want: String, got: String },
    /// A number outside the field's bounds (above `lo` only, when `open`).
    Range { lo: i64, hi: i64, open: bool, integer: bool, got: String },
}

/// Ahead of a `Refusal` in a serde error (whose custom errors are text), so `typed_fields`
/// can tell the field types' refusals from serde's own errors and read them back.
const MARK: char = '\u{1f}';

impl Refusal {
    fn into_error<E: Error>(self) -> E {
        E::custom(format!("{MARK}{}", serde_json::to_string(&self).unwrap_or_default()))
    }

    fn read(message: &str) -> Option<Refusal> {
        serde_json::from_str(message.strip_prefix(MARK)?).ok()
    }
}

/// How a protocol words a refusal: OpenAI's and Ollama's "`temperature` must be from 0 to 2;
/// got 3", Anthropic's "temperature: must be in [0, 1]; got 2".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Words {
    OpenAi,
    Anthropic,
}

impl Words {
    fn say(self, field: &str, r: &Refusal) -> ApiError {
        let head = match self {
            Words::OpenAi => format!("`{field}` must be"),
            Words::Anthropic => format!("{field}: must be"),
        };
        match r {
            Refusal::Kind { want, got } => {
                ApiError::invalid(field, format!("{head} {want}; got {got}")).code("invalid_type")
            }
            Refusal::Range { lo, hi, integer: true, got, .. } => {
                ApiError::invalid(field, format!("{head} an integer from {lo} to {hi}; got {got}"))
            }
            Refusal::Range { lo, hi, open, got, .. } => {
                let range = match (self, open) {
                    (_, true) => format!("in ({lo}, {hi}]"),
                    (Words::OpenAi, false) => format!("from {lo} to {hi}"),
                    (Words::Anthropic, false) => format!("in [{lo}, {hi}]"),
                };
                ApiError::invalid(field, format!("{head} {range}; got {got}"))
            }
        }
    }
}

/// The fields of `map` read as `T`, a body type whose fields are `server::field` types: a
/// wrong kind or a value out of bounds is refused by its path (`options.top_k`), worded as
/// the protocol words it. The caller has checked the field names.
pub fn typed_fields<T: serde::de::DeserializeOwned>(
    map: Map<String, Value>,
    words: Words,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { "body" } else { &path };
        let inner = e.inner().to_string();
        match Refusal::read(&inner) {
            Some(r) => words.say(param, &r),
            None => ApiError::invalid(param, inner),
        }
    })
}

fn wrong_kind<E: Error>(want: &str, v: &Value) -> E {
    Refusal::Kind { want: want.into(), got: kind(v).into() }.into_error()
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
        Err(Refusal::Range { lo: LO, hi: HI, open: OPEN, integer: false, got: x.to_string() }
            .into_error())
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
            Some(x) => Err(Refusal::Range {
                lo: LO,
                hi: HI,
                open: false,
                integer: true,
                got: x.to_string(),
            }
            .into_error()),
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

/// An object, kept as sent.
#[derive(Debug, Clone)]
pub struct Object(pub Map<String, Value>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Object(o) => Ok(Object(o)),
            v => Err(wrong_kind("an object", &v)),
        }
    }
}

impl JsonSchema for Object {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Object".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "object" })
    }
}

/// Declares the hand-written schemas of `Json` fields: `Name => {json};`.
macro_rules! described {
    ($($(#[$m:meta])* $name:ident => $schema:tt;)*) => {$(
        $(#[$m])*
        pub struct $name;
        impl $crate::server::field::Described for $name {
            const NAME: &'static str = stringify!($name);
            fn schema() -> serde_json::Value {
                serde_json::json!($schema)
            }
        }
    )*};
}
pub(crate) use described;

described! {
    /// `keep_alive` (Ollama's, on every protocol): seconds or a duration (`"5m"`).
    KeepAlive => {"oneOf": [
        {"type": "number"},
        {"type": "string", "pattern": "^-?[0-9.]+(ns|us|ms|s|m|h)?([0-9.]+(ns|us|ms|s|m|h))*$"}
    ]};
}

/// A body type's OpenAPI 3.0 schema, generated from it once per process.
pub fn schema_for<T: JsonSchema + 'static>() -> &'static Value {
    static SCHEMAS: std::sync::Mutex<Vec<(std::any::TypeId, &'static Value)>> =
        std::sync::Mutex::new(Vec::new());
    let id = std::any::TypeId::of::<T>();
    let mut known = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = known.iter().find(|(t, _)| *t == id) {
        return s;
    }
    let generated =
        schemars::generate::SchemaSettings::openapi3().into_generator().into_root_schema_for::<T>();
    let mut v = generated.to_value();
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
    }
    // A handful of body types, each leaked once: they live as long as the process.
    let s: &'static Value = Box::leak(Box::new(v));
    known.push((id, s));
    s
}

/// The check every typed body gets before it is read: a field `refused` names (even `null`,
/// where a protocol says so) is its 400; any other field the type's `schema` does not declare
/// is `unknown`'s 400 unless it is `null`, which counts as absent. Then the `null` fields
/// leave the map.
pub fn check_fields(
    map: &mut Map<String, Value>,
    schema: &Value,
    refused: impl Fn(&str, &Value) -> Option<ApiError>,
    unknown: impl Fn(&str) -> ApiError,
) -> Result<(), ApiError> {
    let declared = schema["properties"].as_object();
    for (key, v) in map.iter() {
        if let Some(e) = refused(key, v) {
            return Err(e);
        }
        if !v.is_null() && !declared.is_some_and(|d| d.contains_key(key)) {
            return Err(unknown(key));
        }
    }
    map.retain(|_, v| !v.is_null());
    Ok(())
}
