//! What a request must pass before any handler runs: a `Host` that names this machine (DNS
//! rebinding), an `Origin` that is allowed (CORS; cross-site pages may not even start a
//! generation), and the API key when one is set. The static pages need no key (they ask for
//! it); requests that change the app (`/perch/` writes, Ollama's pull and delete) come only from Perch's own pages, with
//! JSON bodies.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::{ApiError, Dialect};
use super::AppHost;

/// Whether `host` (a Host header: name or address, optional port) is this machine by a
/// loopback name, or one of the configured names.
pub fn host_allowed(host: &str, extra: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                n
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    matches!(name.as_str(), "localhost" | "127.0.0.1" | "::1")
        || name.ends_with(".localhost")
        || extra.iter().any(|e| e.eq_ignore_ascii_case(&name))
}

/// Perch's own pages: the engine's UI, same origin. The desktop app's windows load that UI
/// from the engine over HTTP, so they are the same origin too; `tauri://localhost` and
/// `http://tauri.localhost` are not Perch's (every Tauri app's pages have them) and are trusted
/// only when configured like any other origin.
fn own_origin(origin: &str, headers: &HeaderMap) -> bool {
    let own =
        headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(|h| format!("http://{h}"));
    own.as_deref() == Some(origin)
}

/// The origins whose pages may call the API: Perch's own and the configured ones.
fn origin_allowed(origin: &str, headers: &HeaderMap, allowed: &[String]) -> bool {
    own_origin(origin, headers) || allowed.iter().any(|a| a == origin)
}

/// A request that changes the app: settings, models, downloads (the control API's writes,
/// Ollama's pull and delete among them).
fn control_write(req: &Request) -> bool {
    super::is_control(req.uri().path())
        && matches!(*req.method(), Method::POST | Method::PUT | Method::DELETE | Method::PATCH)
}

/// Why a control write's body is refused: anything but JSON (a cross-site form or a
/// `text/plain` beacon needs no CORS preflight), or a body without a type.
fn body_refusal(headers: &HeaderMap) -> Option<String> {
    match headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("")) {
        Some(t)
            if t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json") =>
        {
            None
        }
        Some(t) => Some(format!("Content-Type `{t}` is not accepted here: send application/json")),
        None => {
            let empty = headers.get(header::TRANSFER_ENCODING).is_none()
                && headers
                    .get(header::CONTENT_LENGTH)
                    .is_none_or(|l| l.to_str().ok().and_then(|l| l.parse::<u64>().ok()) == Some(0));
            (!empty).then(|| "A body needs `Content-Type: application/json`".to_string())
        }
    }
}

/// The UI's static files: served without the key (the page then asks for it).
fn static_page(req: &Request) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD) && super::ui::serves(req.uri().path())
}

/// The key as OpenAI's clients send it (`Authorization: Bearer`) or Anthropic's (`x-api-key`).
fn key_ok(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given =
        bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok())).unwrap_or("");
    // Constant time in the key's content (the length may show; it is not secret).
    given.len() == key.len() && bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

pub async fn guard(State(app_host): State<Arc<AppHost>>, req: Request, next: Next) -> Response {
    let config = app_host.guard_config();
    let dialect = Dialect::of_path(req.uri().path());
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !config.any_host && !host_allowed(host, &config.allowed_hosts) {
        let e = ApiError::new(StatusCode::FORBIDDEN, "permission_error", format!("Host `{host}` is not allowed: use 127.0.0.1 or localhost, or add the name to the allowed hosts")).code("host_not_allowed");
        return e.into_response_as(dialect);
    }
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()).map(String::from);
    if let Some(o) = &origin {
        if !origin_allowed(o, headers, &config.allowed_origins) {
            let e = ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                format!("Origin `{o}` is not allowed to use this API (configure allowed origins)"),
            )
            .code("origin_not_allowed");
            return e.into_response_as(dialect);
        }
        if req.method() == Method::OPTIONS {
            return cors(StatusCode::NO_CONTENT.into_response(), o);
        }
        // Conversations are the user's private data: no other page reads them either.
        let path = req.uri().path();
        let private =
            path.starts_with(super::conversations::PREFIX) || path.starts_with(super::mcp::PREFIX);
        if (control_write(&req) || private) && !own_origin(o, headers) {
            let e = ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                format!("Origin `{o}` may use the API but not change Perch's settings or models, nor read its conversations or tools"),
            )
            .code("origin_not_allowed");
            return cors(e.into_response_as(dialect), o);
        }
    }
    if control_write(&req) {
        if let Some(why) = body_refusal(headers) {
            let e = ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", why)
                .code("unsupported_media_type");
            return e.into_response_as(dialect);
        }
    }
    if let Some(key) = config.api_key.as_ref().filter(|_| !static_page(&req)) {
        if !key_ok(headers, key) {
            let e = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "A valid API key is required: `Authorization: Bearer <key>` or `x-api-key: <key>`",
            )
            .code("invalid_api_key");
            return e.into_response_as(dialect);
        }
    }
    let response = next.run(req).await;
    match origin {
        Some(o) => cors(response, &o),
        None => response,
    }
}

fn cors(mut r: Response, origin: &str) -> Response {
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, x-api-key, anthropic-version, anthropic-beta",
        ),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_pass_and_others_do_not() {
        for ok in ["127.0.0.1:7342", "localhost", "LOCALHOST:80", "[::1]:7342", "app.localhost:1"] {
            assert!(host_allowed(ok, &[]), "{ok}");
        }
        for bad in
            ["evil.com", "evil.com:7342", "127.0.0.1.evil.com", "", "[::2]:1", "localhost.evil.com"]
        {
            assert!(!host_allowed(bad, &[]), "{bad}");
        }
        assert!(host_allowed("mymac.local:7342", &["mymac.local".into()]));
    }

    #[test]
    fn api_keys_must_match_exactly() {
        let mut h = HeaderMap::new();
        assert!(!key_ok(&h, "k1"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert!(key_ok(&h, "k1"));
        assert!(!key_ok(&h, "k10"));
        assert!(!key_ok(&h, "k2"));
    }
}
