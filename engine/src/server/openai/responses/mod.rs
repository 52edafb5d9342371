//! OpenAI's Responses API: `POST /v1/responses` (Codex and the newer OpenAI SDK paths),
//! `GET` and `DELETE /v1/responses/{id}`. A thin adapter like chat completions: `request`
//! reads a body into the runtime's turn, the exchange runs it, `render` answers with output
//! items, and `store` keeps recent responses for `previous_response_id`.

mod render;
pub mod request;
pub mod store;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::server::error::ApiError;
use crate::server::exchange::{self, Parsed, Route};
use crate::server::App;
use render::RenderOptions;

const RESPONSES: Route = Route { name: "responses", id_prefix: "resp", prompt_param: "input" };

pub async fn create(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let store = app.responses.clone();
    let parse = move |bytes: &[u8], defaults: &_| {
        let r = request::parse(bytes, defaults, &store)?;
        let render = RenderOptions {
            store: r.store.then_some(store),
            conversation: r.conversation,
            echo: r.echo,
            logprobs: r.logprobs,
        };
        Ok(Parsed { stream: r.stream, turn: r.turn, render })
    };
    match exchange::start(&app, &RESPONSES, body, parse).await {
        Ok(x) => {
            let keep_alive = app.config.sse_keep_alive;
            x.answer(|x| render::sse(x, keep_alive).into_response(), render::collect).await
        }
        Err(e) => e.into_response(),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError {
        param: Some("response_id".into()),
        code: Some("not_found"),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "Response with id '{id}' not found (only stored responses are kept, in memory)"
            ),
        )
    }
}

pub async fn retrieve(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.responses.get(&id) {
        Some(s) => Json(s.body.clone()).into_response(),
        None => not_found(&id).into_response(),
    }
}

pub async fn delete(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if app.responses.remove(&id) {
        Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
    } else {
        not_found(&id).into_response()
    }
}
