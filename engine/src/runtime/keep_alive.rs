//! How long an unused model stays loaded: the engine's setting, and a request's own
//! `keep_alive` in Ollama's forms (`"5m"`, `"1h30m"`, `"0"`, `-1`, seconds as a number).

use std::time::Duration;

use serde_json::Value;

/// How long an unused model stays loaded (Ollama's keep_alive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    For(Duration),
    /// Unload as soon as no request uses it.
    UnloadWhenIdle,
    Forever,
}

/// The longest finite keep-alive a request may ask for (a year); longer reads as forever.
const MAX_SECS: f64 = 365.0 * 86_400.0;

impl KeepAlive {
    /// Seconds: -1 forever, 0 unload after each request.
    pub fn from_secs(s: i64) -> KeepAlive {
        match s {
            s if s < 0 => KeepAlive::Forever,
            0 => KeepAlive::UnloadWhenIdle,
            s => KeepAlive::For(Duration::from_secs(s as u64)),
        }
    }

    /// As the `keep_alive_s` setting writes it (`from_secs` read back).
    pub fn as_setting(&self) -> i64 {
        match self {
            KeepAlive::For(d) => d.as_secs().max(1) as i64,
            KeepAlive::UnloadWhenIdle => 0,
            KeepAlive::Forever => -1,
        }
    }

    fn from_secs_f64(s: f64) -> KeepAlive {
        match s {
            s if !(0.0..=MAX_SECS).contains(&s) => KeepAlive::Forever,
            0.0 => KeepAlive::UnloadWhenIdle,
            s => KeepAlive::For(Duration::from_secs_f64(s)),
        }
    }

    /// A request's `keep_alive`: a number of seconds, or a duration string as Ollama reads
    /// them (`"300"`, `"5m"`, `"1h30m"`, `"500ms"`, `"-1"`); negative is forever, zero is
    /// "unload when this request is done".
    pub fn from_request(v: &Value) -> Result<KeepAlive, String> {
        let bad = || {
            format!(
                "`keep_alive` must be seconds or a duration such as \"5m\", \"1h\", \"0\" or \"-1\"; got {v}"
            )
        };
        match v {
            Value::Number(n) => {
                n.as_f64().filter(|s| s.is_finite()).map(Self::from_secs_f64).ok_or_else(bad)
            }
            Value::String(s) => parse_duration(s.trim()).map(Self::from_secs_f64).ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

/// Go's duration syntax (what Ollama parses), or a bare number of seconds.
fn parse_duration(s: &str) -> Option<f64> {
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    if let Ok(n) = s.parse::<f64>() {
        return n.is_finite().then_some(n);
    }
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Some(sign * total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ollamas_forms_are_read() {
        let k = |v: Value| KeepAlive::from_request(&v);
        assert_eq!(k(json!("5m")), Ok(KeepAlive::For(Duration::from_secs(300))));
        assert_eq!(k(json!("1h30m")), Ok(KeepAlive::For(Duration::from_secs(5400))));
        assert_eq!(k(json!("500ms")), Ok(KeepAlive::For(Duration::from_millis(500))));
        assert_eq!(k(json!(120)), Ok(KeepAlive::For(Duration::from_secs(120))));
        assert_eq!(k(json!("0")), Ok(KeepAlive::UnloadWhenIdle));
        assert_eq!(k(json!(0)), Ok(KeepAlive::UnloadWhenIdle));
        assert_eq!(k(json!("-1")), Ok(KeepAlive::Forever));
        assert_eq!(k(json!(-1)), Ok(KeepAlive::Forever));
        assert_eq!(k(json!("-1m")), Ok(KeepAlive::Forever));
        assert_eq!(k(json!(1e300)), Ok(KeepAlive::Forever));
        for bad in [json!("soon"), json!("5x"), json!(""), json!(true), json!([1]), json!("1e999")]
        {
            assert!(k(bad.clone()).is_err(), "{bad}");
        }
    }
}
