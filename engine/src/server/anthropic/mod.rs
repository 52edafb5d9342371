//! Anthropic's Messages API: `/v1/messages` and `/v1/messages/count_tokens`, for Claude Code
//! and other Anthropic-SDK clients. A thin adapter like OpenAI's: a body is parsed into the
//! runtime's turn (`request`), the exchange runs it, its events are rendered back (`render`),
//! and errors come back in Anthropic's shape.

mod render;
pub mod request;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::{ApiError, Dialect};
use super::exchange::{self, Parsed, Route};
use super::App;
use crate::sync::LockExt;
use request::Endpoint;

const MESSAGES: Route = Route { name: "messages", id_prefix: "msg", prompt_param: "messages" };

/// What rendering needs besides the turn's events.
pub(super) struct RenderOptions {
    stop_sequences: Vec<String>,
    omit_thinking: bool,
}

pub async fn messages(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let parse = |bytes: &[u8], defaults: &_| {
        let r = request::parse(Endpoint::Messages, bytes, defaults)?;
        Ok(Parsed {
            stream: r.stream,
            turn: r.turn,
            render: RenderOptions {
                stop_sequences: r.stop_sequences,
                omit_thinking: r.omit_thinking,
            },
        })
    };
    match exchange::start(&app, &MESSAGES, body, parse).await {
        Ok(x) => {
            let keep_alive = app.config.sse_keep_alive;
            x.answer(|x| render::sse(x, keep_alive).into_response(), render::collect).await
        }
        Err(e) => e.into_response_as(Dialect::Anthropic),
    }
}

/// The prompt's length in tokens, as `/v1/messages` would render it (the model is not
/// loaded for it, and nothing is generated).
pub async fn count_tokens(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = async {
        let bytes =
            body.map_err(|r| ApiError::new(r.status(), "invalid_request_error", r.body_text()))?;
        let defaults = *app.sampling.locked();
        let parsed = tokio::task::spawn_blocking(move || {
            request::parse(Endpoint::CountTokens, &bytes, &defaults)
        })
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string())
        })??;
        let n = crate::runtime::count_prompt_tokens(&app.engine, parsed.turn)
            .await
            .map_err(|e| ApiError::engine(&e, "messages"))?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": n})).into_response())
    };
    answer.await.unwrap_or_else(|e| e.into_response_as(Dialect::Anthropic))
}
