//! Python's `json.dumps` for chat templates: transformers gives templates a `tojson` filter
//! that calls it (`", "` and `": "` separators, non-ASCII kept, keys in insertion order,
//! optional `indent`), and a prompt must match it byte for byte (minijinja's own filter is
//! compact and HTML-escapes).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `x | tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        Some(v) => Some(" ".repeat(usize::try_from(v).unwrap_or(0).min(64))),
    };
    let (item, key) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            (a.as_str().unwrap_or(", ").to_string(), b.as_str().unwrap_or(": ").to_string())
        }
        // Python drops the space after commas when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let opts = Opts {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
        ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write(&mut out, &value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

struct Opts {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    ascii: bool,
}

fn newline(out: &mut String, opts: &Opts, depth: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write(out: &mut String, v: &Value, opts: &Opts, depth: usize) -> Result<(), Error> {
    if depth > 128 {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: nested too deeply"));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => number(out, v),
        ValueKind::String => string(out, v.as_str().unwrap_or(""), opts.ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item);
                }
                newline(out, opts, depth + 1);
                write(out, x, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item);
                }
                newline(out, opts, depth + 1);
                match k.as_str() {
                    Some(s) => string(out, s, opts.ascii),
                    // Python writes non-string keys as strings.
                    None => string(out, &k.to_string(), opts.ascii),
                }
                out.push_str(&opts.key);
                write(out, &v.get_item(k)?, opts, depth + 1)?;
            }
            newline(out, opts, depth);
            out.push('}');
        }
        _ => string(out, &v.to_string(), opts.ascii),
    }
    Ok(())
}

fn number(out: &mut String, v: &Value) {
    // minijinja writes integers without a point and floats with one (or as inf/NaN).
    let shown = v.to_string();
    if shown.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        out.push_str(&shown);
        return;
    }
    let x = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    } else if x == x.trunc() && x.abs() < 1e16 {
        out.push_str(&format!("{x:.1}"));
    } else {
        // Python's repr: shortest round-trip digits, exponent from 1e16 and below 1e-4.
        let s = format!("{x:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        if (-5..16).contains(&exp) {
            out.push_str(&x.to_string());
        } else {
            let sign = if exp < 0 { '-' } else { '+' };
            out.push_str(&format!("{mant}e{sign}{:02}", exp.abs()));
        }
    }
}

fn string(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
