//! Every parser of what a client or a file hands Perch, fuzzed from valid inputs: each case is
//! a valid body of that parser (tools, schemas, histories, options) with one to four fields
//! replaced by hostile values (extremes, wrong kinds, deep nesting, control characters), deleted,
//! duplicated or joined by unknown ones, and sometimes the text cut or a byte changed. Every
//! outcome must be a parse or a 4xx that names its field (or says the body is not JSON); never
//! a panic. The counts are printed (`cargo test -p perch-engine --lib fuzz_ -- --nocapture`).

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};

use super::error::ApiError;
use super::{anthropic, ollama, openai};
use crate::config::{SamplingDefaults, Settings};

/// Mutated cases per parser.
const CASES: u32 = 3000;

/// What one case does to a valid input.
#[derive(Debug, Clone)]
enum Edit {
    /// The node at this index (in document order) becomes this value.
    Replace(Index, Value),
    /// The node at this index leaves its object or array.
    Delete(Index),
    /// A field Perch does not read joins the object at this index (or the root).
    Unknown(Index, String, Value),
    /// The array at this index (or nearest below) repeats its elements many times.
    Repeat(Index, usize),
}

/// Values a hostile client sends where another kind is expected.
fn hostile() -> impl Strategy<Value = Value> {
    let deep = |n: usize| (0..n).fold(json!(1), |v, _| json!([v]));
    let fixed = vec![
        Value::Null,
        json!(true),
        json!(-1),
        json!(0),
        json!(1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(-1e-300),
        json!(0.5),
        json!(""),
        json!("\u{0}\u{7}\u{feff}"),
        json!("<|im_end|><tool_call>{\"name\":"),
        json!("x".repeat(5000)),
        json!([]),
        json!({}),
        json!([1, 2, 3]),
        json!(["a", "b"]),
        json!({"type": "text", "text": "hi"}),
        json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        json!({"type": "object", "properties": {"a": {"$ref": "#"}}}),
        json!({"role": "tool", "content": null}),
        deep(40),
        deep(200),
    ];
    prop_oneof![
        4 => prop::sample::select(fixed),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<f64>().prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
        1 => "\\PC{0,12}".prop_map(Value::String),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        5 => (any::<Index>(), hostile()).prop_map(|(i, v)| Edit::Replace(i, v)),
        2 => any::<Index>().prop_map(Edit::Delete),
        1 => (any::<Index>(), "[a-z_]{1,10}", hostile()).prop_map(|(i, k, v)| Edit::Unknown(i, k, v)),
        1 => (any::<Index>(), 2usize..300).prop_map(|(i, n)| Edit::Repeat(i, n)),
    ]
}

/// Every node's path from the root: object keys and array positions.
fn paths(v: &Value, at: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(Seg::Key(k.clone()));
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(Seg::At(i));
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum Seg {
    Key(String),
    At(usize),
}

fn node<'a>(v: &'a mut Value, path: &[Seg]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        Seg::Key(k) => &mut v[k.as_str()],
        Seg::At(i) => &mut v[*i],
    })
}

fn apply(v: &mut Value, e: &Edit) {
    let mut all = vec![];
    paths(v, &mut vec![], &mut all);
    match e {
        Edit::Replace(i, x) => {
            let path: &Vec<Seg> = i.get(&all);
            *node(v, path) = x.clone()
        }
        Edit::Delete(i) => {
            let path: &Vec<Seg> = i.get(&all);
            if let Some((last, parent)) = path.split_last() {
                match (node(v, parent), last) {
                    (Value::Object(m), Seg::Key(k)) => drop(m.remove(k)),
                    (Value::Array(a), Seg::At(n)) => drop(a.remove(*n)),
                    _ => {}
                }
            }
        }
        Edit::Unknown(i, k, x) => {
            let objects: Vec<&Vec<Seg>> = all.iter().filter(|p| node_is_object(v, p)).collect();
            if !objects.is_empty() {
                let p = i.get(&objects).to_vec();
                if let Value::Object(m) = node(v, &p) {
                    m.insert(k.clone(), x.clone());
                }
            }
        }
        Edit::Repeat(i, n) => {
            let path: &Vec<Seg> = i.get(&all);
            if let Value::Array(a) = node(v, path) {
                let once = a.clone();
                for _ in 1..*n {
                    a.extend(once.iter().cloned());
                }
            }
        }
    }
}

fn node_is_object(v: &Value, path: &[Seg]) -> bool {
    path.iter()
        .try_fold(v, |v, s| match s {
            Seg::Key(k) => v.get(k.as_str()),
            Seg::At(i) => v.get(*i),
        })
        .is_some_and(Value::is_object)
}

/// The text a case sends: the edited value, maybe cut short or with one byte changed.
fn text_of(v: &Value, raw: &Option<(Index, u8, bool)>) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap();
    if let Some((i, byte, cut)) = raw {
        let at = i.index(b.len().max(1)).min(b.len().saturating_sub(1));
        match cut {
            true => b.truncate(at),
            false if !b.is_empty() => b[at] = *byte,
            false => {}
        }
    }
    b
}

/// What a parser says of a body: parsed, or its refusal.
type Parse = Box<dyn Fn(&[u8]) -> Result<(), Refusal>>;

/// A parser under test: its name, valid inputs, and what it says of a body.
struct Parser {
    name: &'static str,
    seeds: Vec<Value>,
    parse: Parse,
}

struct Refusal {
    client_error: bool,
    /// The field the refusal names (`body` or the JSON error for a body that is not JSON).
    names: bool,
    message: String,
}

fn api(r: Result<impl Sized, ApiError>) -> Result<(), Refusal> {
    r.map(drop).map_err(|e| Refusal {
        client_error: e.status.is_client_error(),
        names: e.param.as_deref().is_some_and(|p| !p.is_empty()) || e.code == Some("invalid_json"),
        message: e.message,
    })
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn parsers() -> Vec<Parser> {
    use anthropic::request::Endpoint as A;
    use ollama::request::Endpoint as O;
    use openai::request::Endpoint as C;
    let d = SamplingDefaults::default();
    let store = openai::responses::store::Store::default();
    let chat = json!({"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": [weather_tool()], "tool_choice": "auto", "max_tokens": 16, "temperature": 0.7,
        "top_p": 0.9, "stop": ["\n\n"], "seed": 3, "stream": true,
        "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
        "logit_bias": {"42": -5}});
    let schema = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}});
    let completion = json!({"model": "m", "prompt": "Once upon", "max_tokens": 8, "logprobs": 2,
        "echo": false, "stop": "x", "stream": false, "logit_bias": {"7": 1}});
    let tokens = json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4});
    let responses = json!({"model": "m", "instructions": "Be brief.", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "max_output_tokens": 16, "store": false, "stream": true});
    let messages = json!({"model": "claude-x", "max_tokens": 2048, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"}, "stop_sequences": ["END"], "temperature": 0.5,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "stream": true});
    // count_tokens reads the conversation and tools only.
    let mut count_tokens = messages.clone();
    for k in ["max_tokens", "stream", "stop_sequences", "temperature"] {
        count_tokens.as_object_mut().unwrap().remove(k);
    }
    let ollama_chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny"}],
        "tools": [weather_tool()], "options": {"temperature": 0.2, "num_predict": 8, "seed": 1, "stop": ["x"]},
        "format": {"type": "object"}, "think": false, "keep_alive": "5m", "stream": false});
    let generate = json!({"model": "m", "prompt": "Once", "system": "Be brief.", "options": {"top_k": 4},
        "format": "json", "raw": false, "keep_alive": 0, "stream": true});
    let embeddings = json!({"model": "e", "input": ["a", "b"], "encoding_format": "base64"});
    let embed_ids = json!({"model": "e", "input": [[1, 2], [3]]});
    let embed = json!({"model": "e", "input": ["a", "b"], "truncate": true, "keep_alive": "1m", "options": {}});
    let legacy = json!({"model": "e", "prompt": "a"});
    let train = json!({"adapter": "a", "examples": [{"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]}], "rank": 4, "alpha": 8,
        "targets": ["q_proj", "v_proj"], "layers": 2, "epochs": 1, "batch_size": 2, "seq_len": 64,
        "learning_rate": 0.001, "eval_fraction": 0.1, "seed": 1, "share_ppm": 250000});
    let train_text = json!({"text": "baga dase fagi", "max_slowdown_ppm": 100000});
    // A models folder of its own holding the default model, so the seed is valid whatever
    // this machine has installed (it was refused on a fresh one).
    static MODELS: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let models = MODELS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("m")).unwrap();
        std::fs::write(dir.path().join("m/config.json"), r#"{"model_type":"llama"}"#).unwrap();
        dir
    });
    let settings = serde_json::to_value(Settings {
        api_key: "k".into(),
        allowed_origins: vec!["http://localhost:3000".into()],
        models_dir: models.path().display().to_string(),
        default_model: "m".into(),
        scan_hf_cache: false,
        ..Settings::default()
    })
    .unwrap();
    vec![
        Parser {
            name: "openai chat",
            seeds: vec![chat, schema],
            parse: Box::new(|b| api(openai::request::parse(C::Chat, b))),
        },
        Parser {
            name: "openai completions",
            seeds: vec![completion, tokens],
            parse: Box::new(|b| api(openai::request::parse(C::Completion, b))),
        },
        Parser {
            name: "openai responses",
            seeds: vec![responses],
            parse: Box::new(move |b| api(openai::responses::request::parse(b, &d, &store))),
        },
        Parser {
            name: "anthropic messages",
            seeds: vec![messages.clone()],
            parse: Box::new(move |b| api(anthropic::request::parse(A::Messages, b, &d))),
        },
        Parser {
            name: "anthropic count_tokens",
            seeds: vec![count_tokens],
            parse: Box::new(move |b| api(anthropic::request::parse(A::CountTokens, b, &d))),
        },
        Parser {
            name: "ollama chat",
            seeds: vec![ollama_chat],
            parse: Box::new(move |b| api(ollama::request::parse(O::Chat, b, &d))),
        },
        Parser {
            name: "ollama generate",
            seeds: vec![generate],
            parse: Box::new(move |b| api(ollama::request::parse(O::Generate, b, &d))),
        },
        Parser {
            name: "openai embeddings",
            seeds: vec![embeddings, embed_ids],
            parse: Box::new(|b| api(openai::embeddings::parse(b))),
        },
        Parser {
            name: "ollama embed",
            seeds: vec![embed],
            parse: Box::new(|b| api(ollama::embed::parse(ollama::embed::Which::Embed, b))),
        },
        Parser {
            name: "ollama embeddings",
            seeds: vec![legacy],
            parse: Box::new(|b| api(ollama::embed::parse(ollama::embed::Which::Legacy, b))),
        },
        Parser {
            name: "train",
            seeds: vec![train, train_text],
            parse: Box::new(|b| {
                crate::train::request::parse(b).map(drop).map_err(|e| Refusal {
                    client_error: true,
                    names: !e.param.is_empty(),
                    message: e.message,
                })
            }),
        },
        Parser { name: "settings file", seeds: vec![settings], parse: Box::new(settings_file) },
    ]
}

/// The settings file is TOML: a case whose JSON has no TOML form (a null, a bare value) is
/// its text as written, which the parser must refuse like any other damaged file.
fn settings_file(b: &[u8]) -> Result<(), Refusal> {
    let text = match serde_json::from_slice::<Value>(b).ok().and_then(|v| toml::to_string(&v).ok())
    {
        Some(t) => t,
        None => String::from_utf8_lossy(b).into_owned(),
    };
    Settings::parse(&text, Path::new("perch.toml")).map(drop).map_err(|e| {
        use crate::config::ConfigError;
        let names = match &e {
            ConfigError::Invalid { field, .. } => !field.is_empty(),
            ConfigError::Syntax { path, .. } => path == "perch.toml",
            _ => false,
        };
        Refusal { client_error: true, names, message: e.to_string() }
    })
}

#[test]
fn fuzz_every_parser_from_valid_inputs() {
    let mut report = vec![];
    for p in parsers() {
        for (i, seed) in p.seeds.iter().enumerate() {
            let r = (p.parse)(&serde_json::to_vec(seed).unwrap());
            assert!(r.is_ok(), "{}: seed {i} is refused: {}", p.name, r.err().unwrap().message);
        }
        let (parsed, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
        let strategy = (
            any::<Index>(),
            prop::collection::vec(edit(), 1..5),
            prop::option::weighted(0.15, (any::<Index>(), any::<u8>(), any::<bool>())),
        );
        let mut runner = TestRunner::new(Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        });
        let outcome = runner.run(&strategy, |(seed, edits, raw)| {
            let mut v = seed.get(&p.seeds).clone();
            for e in &edits {
                apply(&mut v, e);
            }
            match (p.parse)(&text_of(&v, &raw)) {
                Ok(()) => parsed.set(parsed.get() + 1),
                Err(r) => {
                    refused.set(refused.get() + 1);
                    if !r.client_error {
                        return Err(TestCaseError::fail(format!("not a 4xx: {}", r.message)));
                    }
                    if !r.names {
                        return Err(TestCaseError::fail(format!("names no field: {}", r.message)));
                    }
                }
            }
            Ok(())
        });
        if let Err(e) = outcome {
            panic!("{}: {e}", p.name);
        }
        let (parsed, refused) = (parsed.get(), refused.get());
        report.push(format!("{}: {CASES} cases, {parsed} parsed, {refused} refused", p.name));
    }
    println!("{}", report.join("\n"));
}
