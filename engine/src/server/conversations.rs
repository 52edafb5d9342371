//! `/perch/conversations`: the chat window's conversations, kept by the engine so the app
//! window and a browser tab share them and they outlive a cleared webview. Served beside
//! the UI (through restarts and without a settings file), private to Perch's own pages.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::AppHost;
use crate::conversations::presets::{Preset, PresetError};
use crate::conversations::{
    markdown, ChatSettings, Conversation, ConversationError, ConversationId, Store, MAX_FILE_BYTES,
};

/// The prefix these routes answer under (the guard keeps them to Perch's own pages).
pub const PREFIX: &str = "/perch/conversations";

pub fn routes() -> Router<Arc<AppHost>> {
    Router::new()
        .route(PREFIX, get(list))
        .route("/perch/conversations/export", get(export_all))
        .route("/perch/conversations/import", axum::routing::post(import))
        .route("/perch/conversations/presets", get(presets))
        .route("/perch/conversations/presets/{name}", put(save_preset).delete(remove_preset))
        .route("/perch/conversations/{id}", get(read).put(save).patch(rename).delete(remove))
        .route("/perch/conversations/{id}/export", get(export_one))
        // A conversation with its attachments, plus room for the JSON around it.
        .layer(DefaultBodyLimit::max(MAX_FILE_BYTES as usize + (1 << 20)))
}

fn store(host: &AppHost) -> Result<Arc<Store>, ApiError> {
    host.conversations().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "This server keeps no conversations (`perch serve --conversations-dir DIR`, or the desktop app)",
        )
        .code("conversations_off")
    })
}

fn refusal(e: ConversationError) -> ApiError {
    let message = e.to_string();
    match e {
        ConversationError::NotFound(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
                .code("conversation_not_found")
        }
        ConversationError::Conflict { .. } => {
            ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message).code("conflict")
        }
        ConversationError::Damaged { .. } => {
            ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message)
                .code("conversation_damaged")
        }
        ConversationError::Invalid(i) => ApiError::invalid(&i.field, message),
        ConversationError::Io { .. } => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
        }
    }
}

fn id_of(raw: &str) -> Result<ConversationId, ApiError> {
    ConversationId::parse(raw).map_err(|m| ApiError::invalid("id", m))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    q: Option<String>,
}

async fn list(
    State(host): State<Arc<AppHost>>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let store = store(&host)?;
    let (data, damaged) = tokio::task::spawn_blocking(move || store.list(query.q.as_deref()))
        .await
        .map_err(|_| stopped())?
        .map_err(refusal)?;
    let damaged: Vec<_> = damaged
        .into_iter()
        .map(|e| match &e {
            ConversationError::Damaged { id, .. } => json!({"id": id, "message": e.to_string()}),
            _ => json!({"message": e.to_string()}),
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data, "damaged": damaged})).into_response())
}

async fn read(
    State(host): State<Arc<AppHost>>,
    Path(id): Path<String>,
) -> Result<Json<Conversation>, ApiError> {
    let (store, id) = (store(&host)?, id_of(&id)?);
    blocking(move || store.get(&id)).await.map(Json)
}

async fn save(
    State(host): State<Arc<AppHost>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Conversation>, ApiError> {
    let (store, id) = (store(&host)?, id_of(&id)?);
    let c: Conversation = super::body::typed(&body)?;
    if c.id != id {
        return Err(ApiError::invalid("id", format!("`{}` in the body, `{id}` in the path", c.id)));
    }
    blocking(move || store.put(c)).await.map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rename {
    title: String,
}

async fn rename(
    State(host): State<Arc<AppHost>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Conversation>, ApiError> {
    let (store, id) = (store(&host)?, id_of(&id)?);
    let r: Rename = super::body::typed(&body)?;
    blocking(move || store.rename(&id, &r.title)).await.map(Json)
}

async fn remove(
    State(host): State<Arc<AppHost>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (store, id) = (store(&host)?, id_of(&id)?);
    let shown = id.to_string();
    blocking(move || store.delete(&id)).await?;
    Ok(Json(json!({"id": shown, "deleted": true})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportQuery {
    format: Option<String>,
}

/// A file to save: its name from the title, kept to safe characters.
fn download(name: &str, ext: &str, mime: &'static str, body: String) -> Response {
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(60)
        .collect();
    let safe = if safe.trim_matches('-').is_empty() { "conversation".into() } else { safe };
    (
        [
            (header::CONTENT_TYPE, mime.to_string()),
            (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{safe}.{ext}\"")),
        ],
        body,
    )
        .into_response()
}

async fn export_one(
    State(host): State<Arc<AppHost>>,
    Path(id): Path<String>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let (store, id) = (store(&host)?, id_of(&id)?);
    let c = blocking(move || store.get(&id)).await?;
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(download(
            &c.title,
            "json",
            "application/json",
            serde_json::to_string_pretty(&c).expect("serializes"),
        )),
        "markdown" | "md" => {
            Ok(download(&c.title, "md", "text/markdown; charset=utf-8", markdown::export(&c)))
        }
        other => Err(ApiError::invalid(
            "format",
            format!("`{other}` is not an export format (json, markdown)"),
        )),
    }
}

async fn export_all(State(host): State<Arc<AppHost>>) -> Result<Response, ApiError> {
    let store = store(&host)?;
    let all = blocking(move || {
        let (list, _) = store.list(None)?;
        list.iter().map(|s| store.get(&s.id)).collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let body = serde_json::to_string_pretty(&json!({"conversations": all})).expect("serializes");
    Ok(download("perch-conversations", "json", "application/json", body))
}

/// What an import carries: one of our exports (a conversation, or every conversation),
/// or Markdown.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Import {
    conversations: Option<Vec<Conversation>>,
    conversation: Option<Conversation>,
    markdown: Option<String>,
}

async fn import(State(host): State<Arc<AppHost>>, body: Bytes) -> Result<Response, ApiError> {
    let store = store(&host)?;
    let i: Import = super::body::typed(&body)?;
    let list = match (i.conversations, i.conversation, i.markdown) {
        (Some(list), None, None) => list,
        (None, Some(c), None) => vec![c],
        (None, None, Some(md)) => {
            vec![markdown::import(&md).map_err(|e| ApiError::invalid(&e.field, e.to_string()))?]
        }
        _ => {
            return Err(ApiError::invalid(
                "body",
                "send exactly one of `conversations`, `conversation`, `markdown`",
            ))
        }
    };
    let stored = blocking(move || store.import(list)).await?;
    let ids: Vec<_> = stored.iter().map(|c| json!({"id": c.id, "title": c.title})).collect();
    Ok((StatusCode::CREATED, Json(json!({"imported": ids}))).into_response())
}

// ---- Presets: named settings for a chat, shared by every window ----------------------

fn preset_refusal(e: PresetError) -> ApiError {
    let message = e.to_string();
    match e {
        PresetError::NotFound(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
                .code("preset_not_found")
        }
        PresetError::Damaged { .. } => {
            ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message)
                .code("presets_damaged")
        }
        PresetError::Invalid(i) => ApiError::invalid(&i.field, message),
        PresetError::Io { .. } => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
        }
    }
}

async fn preset_call(
    host: &AppHost,
    f: impl FnOnce(&Store) -> Result<Vec<Preset>, PresetError> + Send + 'static,
) -> Result<Json<serde_json::Value>, ApiError> {
    let store = store(host)?;
    let all = tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|_| stopped())?
        .map_err(preset_refusal)?;
    Ok(Json(json!({"presets": all})))
}

async fn presets(State(host): State<Arc<AppHost>>) -> Result<Json<serde_json::Value>, ApiError> {
    preset_call(&host, |s| s.presets().list()).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresetBody {
    settings: ChatSettings,
}

async fn save_preset(
    State(host): State<Arc<AppHost>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let b: PresetBody = super::body::typed(&body)?;
    preset_call(&host, move |s| s.presets().put(Preset { name, settings: b.settings })).await
}

async fn remove_preset(
    State(host): State<Arc<AppHost>>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    preset_call(&host, move |s| s.presets().delete(&name)).await
}

/// Run a store call off the async threads (it reads and syncs files).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ConversationError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|_| stopped())?.map_err(refusal)
}

fn stopped() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the conversation store stopped before answering",
    )
}
