//! The chat and settings UI (`ui/`, built by Vite into `ui/dist`), compiled into the binary
//! so `perch serve` and the desktop app serve the same pages from the engine's own origin.

use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::AppHost;

mod built {
    // `(route, type, bytes)` for each file of `ui/dist`, written by `engine/build.rs`.
    include!(concat!(env!("OUT_DIR"), "/ui_files.rs"));
}
use built::FILES;

/// The pages' Content-Security-Policy. The app's windows load the UI from the engine over
/// HTTP, so `tauri.conf.json`'s CSP never applies to it: this header is the backstop should
/// the markdown renderer ever let markup through (no inline script, nothing from elsewhere,
/// no framing, requests to this origin only).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// Whether `path` is one of the UI's files.
pub fn serves(path: &str) -> bool {
    FILES.iter().any(|(p, _, _)| *p == path)
}

pub fn routes() -> Router<Arc<AppHost>> {
    FILES.iter().fold(Router::new(), |r, &(path, mime, body)| {
        r.route(
            path,
            get(move || async move {
                // The pages must not be framed by another site (clickjacking the settings).
                (
                    [
                        (header::CONTENT_TYPE, mime),
                        (header::X_FRAME_OPTIONS, "DENY"),
                        (header::CONTENT_SECURITY_POLICY, CSP),
                        (header::CACHE_CONTROL, "no-cache"),
                    ],
                    body,
                )
                    .into_response()
            }),
        )
    })
}
