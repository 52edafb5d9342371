//! `/train`: start a LoRA training run on the loaded model, read its status (docs/training.md fields
//! and the per-turn receipt), and pause, resume or cancel it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::App;
use crate::train::run::StartError;
use crate::train::{request, Run};

type Reply = Result<Response, ApiError>;

fn status_of(app: &App, run: &Run) -> Response {
    Json(run.status(&app.training)).into_response()
}

fn no_run() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "invalid_request_error",
        "No training run is active (start one with POST /train)",
    )
    .code("no_training_run")
}

pub async fn start(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Reply {
    let bytes =
        body.map_err(|r| ApiError::new(r.status(), "invalid_request_error", r.body_text()))?;
    let req = request::parse(&bytes).map_err(|e| ApiError::invalid(&e.param, e.to_string()))?;
    match app.training.start(&app.engine, req).await {
        Ok(run) => Ok((StatusCode::CREATED, Json(run.status(&app.training))).into_response()),
        Err(e @ StartError::Busy(_)) => {
            Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
                .code("training_running"))
        }
        Err(StartError::Field(e)) => Err(ApiError::invalid(&e.param, e.to_string())),
        Err(StartError::Engine(e)) => Err(e.into()),
    }
}

pub async fn status(State(app): State<Arc<App>>) -> Reply {
    Ok(match app.training.current() {
        Some(run) => status_of(&app, &run),
        None => Json(json!({"state": "idle"})).into_response(),
    })
}

fn active(app: &App) -> Result<Arc<Run>, ApiError> {
    app.training.current().filter(|r| r.is_active()).ok_or_else(no_run)
}

pub async fn cancel(State(app): State<Arc<App>>) -> Reply {
    let run = active(&app)?;
    run.stop("cancelled through the API");
    Ok(status_of(&app, &run))
}

pub async fn pause(State(app): State<Arc<App>>) -> Reply {
    let run = active(&app)?;
    run.pause();
    Ok(status_of(&app, &run))
}

pub async fn resume(State(app): State<Arc<App>>) -> Reply {
    let run = active(&app)?;
    run.resume();
    Ok(status_of(&app, &run))
}
