//! The field tables of the docs, generated from the request types' schemas: each field with
//! where it is read, its kind and bounds, and its doc comment; a test per protocol keeps the
//! docs in step (`check_doc`, `UPDATE_DOCS=1` to rewrite).

use serde_json::Value;

/// The tables of fields honoured and ignored on purpose over bodies named by `on` (a field in
/// all of them, with the same schema, says "all"), and the refused ones: `refused` says those
/// no type declares, then come the fields a type declares to refuse them (`x-perch: refused`).
pub fn tables(bodies: &[(&str, &Value)], refused: &str) -> String {
    let several = bodies.len() > 1;
    let mut honoured = String::from(if several {
        "| field | on | value | notes |\n| --- | --- | --- | --- |\n"
    } else {
        "| field | value | notes |\n| --- | --- | --- |\n"
    });
    let mut ignored = String::new();
    let mut declined = String::new();
    let mut rows: Vec<(&str, Vec<&str>, &Value)> = vec![];
    for (on, s) in bodies {
        for (name, p) in s["properties"].as_object().into_iter().flatten() {
            match rows.iter_mut().find(|(n, _, q)| n == name && *q == p) {
                Some(row) => row.1.push(on),
                None => rows.push((name, vec![on], p)),
            }
        }
    }
    for (name, on, p) in rows {
        let on = if on.len() == bodies.len() && several { "all".into() } else { on.join(", ") };
        let notes = p["description"].as_str().unwrap_or("").replace('\n', " ");
        match p["x-perch"].as_str() {
            Some("ignored") => ignored += &format!("| `{name}` | {notes} |\n"),
            Some("refused") => declined += &format!("- `{name}` ({on}): {notes}\n"),
            _ if several => honoured += &format!("| `{name}` | {on} | {} | {notes} |\n", value(p)),
            _ => honoured += &format!("| `{name}` | {} | {notes} |\n", value(p)),
        }
    }
    let mut out = format!("### Honoured\n\n{honoured}\n### Refused by name\n\n{refused}.\n");
    if !declined.is_empty() {
        out += &format!("\n{declined}");
    }
    if !ignored.is_empty() {
        out += &format!(
            "\n### Accepted and ignored on purpose\n\n| field | notes |\n| --- | --- |\n{ignored}"
        );
    }
    out
}

/// A field's kind and bounds, in a few words, as its schema says them.
fn value(p: &Value) -> String {
    // An optional `oneOf` comes as `anyOf: [the schema, null]`.
    let p = match &p["anyOf"] {
        Value::Array(alts) => alts.iter().find(|a| a["nullable"] != true).unwrap_or(p),
        _ => p,
    };
    let kind = match (&p["type"], &p["oneOf"]) {
        (Value::String(t), _) => t.clone(),
        (_, Value::Array(alts)) => {
            let mut kinds: Vec<&str> = alts.iter().filter_map(|a| a["type"].as_str()).collect();
            kinds.dedup();
            kinds.join(" or ")
        }
        _ => "any".into(),
    };
    let (lo, hi) = (&p["minimum"], &p["maximum"]);
    let open = p["exclusiveMinimum"] == true;
    match (lo.is_null(), hi.is_null(), &p["enum"]) {
        (_, _, Value::Array(e)) => e
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(", "),
        (false, false, _) if open => format!("{kind} in ({lo}, {hi}]"),
        (false, false, _) => format!("{kind} from {lo} to {hi}"),
        (false, true, _) => format!("{kind} ≥ {lo}"),
        _ => kind,
    }
}

/// Fails unless `docs/{doc}`'s section `name` (between `<!-- fields: name -->` and
/// `<!-- fields end: name -->`) is `tables`; with `UPDATE_DOCS` set it rewrites it first.
#[cfg(test)]
pub fn check_doc(doc: &str, name: &str, tables: &str) {
    let path = format!("{}/../docs/{doc}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) =
        (format!("<!-- fields: {name} -->\n"), format!("<!-- fields end: {name} -->"));
    let (head, rest) = text.split_once(&begin).expect("the generated section's start marker");
    let (_, tail) = rest.split_once(&end).expect("the generated section's end marker");
    let want = format!("{head}{begin}{tables}{end}{tail}");
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    assert!(text == want, "docs/{doc} is behind the request types: run with UPDATE_DOCS=1");
}
