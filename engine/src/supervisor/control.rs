//! The control API the UI uses besides `/v1`, under `/perch/`: status, settings, models,
//! downloads (and Ollama's pull and delete, in `pull`). Same listener, same guard (Host,
//! Origin, key) as the engine's API.

use std::sync::{Arc, Weak};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::Supervisor;
use crate::config::{ConfigError, Settings};
use crate::download::DownloadError;
use crate::server::error::ApiError;

pub(super) type S = State<Weak<Supervisor>>;

/// The control routes, with `more` (Ollama's pull and delete, from `pull`, which uses this
/// module's helpers) under the same state and fallback.
pub fn router(sup: Weak<Supervisor>, more: Router<Weak<Supervisor>>) -> Router {
    Router::new()
        .route("/perch/status", get(status))
        .route("/perch/config", get(get_config).put(put_config))
        .route("/perch/models", get(models))
        .route("/perch/models/select", post(select))
        .route("/perch/models/import", post(import))
        .route("/perch/models/{*id}", axum::routing::delete(delete_model))
        .route("/perch/downloads", get(downloads).post(start_download))
        .route("/perch/downloads/{id}/cancel", post(cancel_download))
        .merge(more)
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "No such control endpoint",
            )
            .code("not_found")
        })
        .with_state(sup)
}

fn gone() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable", "Perch is shutting down")
}

fn config_error(e: &ConfigError) -> ApiError {
    match e {
        ConfigError::Invalid { field, message } => {
            ApiError::invalid(field, format!("`{field}`: {message}")).code("invalid_setting")
        }
        e => ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", e.to_string())
            .code("invalid_setting"),
    }
}

type Reply = Result<Response, ApiError>;

pub(super) fn live(sup: Weak<Supervisor>) -> Result<Arc<Supervisor>, ApiError> {
    sup.upgrade().ok_or_else(gone)
}

fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("Invalid body: {e}"),
        )
        .code("invalid_json")
    })
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a str, ApiError> {
    v.get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::invalid(name, format!("`{name}` is required (a string)")))
}

async fn status(State(sup): S) -> Reply {
    let sup = live(sup)?;
    let mut v = serde_json::to_value(sup.status()).unwrap_or_default();
    if let Some(app) = sup.app() {
        v["model"] = json!(app.engine.loaded().map(|m| m.id));
        v["foreground"] =
            serde_json::to_value(app.engine.foreground.snapshot()).unwrap_or_default();
        v["last_request"] = json!(app.engine.last_turn());
        v["memory_bytes"] = json!(crate::platform::active_memory_bytes());
    }
    v["default_model"] = json!(sup.settings().map(|s| s.default_model));
    Ok(Json(v).into_response())
}

/// What runs, or while the engine is still starting (nothing applied yet) what the file says:
/// a download or import asked for then still goes where the settings say, not to the
/// platform's defaults.
pub(super) fn current_settings(sup: &Supervisor) -> Settings {
    sup.settings().or_else(|| Settings::load(sup.config_path()).ok()).unwrap_or_default()
}

async fn get_config(State(sup): S) -> Reply {
    let sup = live(sup)?;
    // The file as it is now (it may hold a hand edit that was rejected), and what runs.
    let file = Settings::load(sup.config_path());
    let shown = match (&file, sup.settings()) {
        (Ok(s), _) => s.clone(),
        (Err(_), Some(applied)) => applied,
        (Err(_), None) => Settings::default(),
    };
    // The key never leaves the file: the page learns whether one is set.
    let api_key_set = !shown.api_key.is_empty();
    let shown = Settings { api_key: String::new(), ..shown };
    Ok(Json(json!({
        "path": sup.config_path(),
        "settings": shown,
        "api_key_set": api_key_set,
        "defaults": Settings::default(),
        "error": file.as_ref().err().map(|e| json!({"message": e.to_string(), "field": e.field()})),
    }))
    .into_response())
}

async fn put_config(State(sup): S, bytes: Bytes) -> Reply {
    let sup = live(sup)?;
    let patch: Value = body(&bytes)?;
    let Value::Object(patch) = patch else {
        return Err(ApiError::invalid("body", "the body must be a JSON object of settings")
            .code("invalid_setting"));
    };
    // Laid over the file as it is (or, when a hand edit broke it, what runs): a body naming
    // one field changes that field, never the others, and never the key by leaving it out.
    let current =
        Settings::load(sup.config_path()).ok().or_else(|| sup.settings()).unwrap_or_default();
    let settings = current.patched(patch).map_err(|e| config_error(&e))?;
    let restarted = sup.save(settings).await.map_err(|e| config_error(&e))?;
    Ok(Json(json!({"restarted": restarted, "status": sup.status()})).into_response())
}

async fn models(State(sup): S) -> Reply {
    let sup = live(sup)?;
    let Some(settings) = sup.settings().or_else(|| Settings::load(sup.config_path()).ok()) else {
        return Ok(Json(json!({"data": [], "models_dir": null})).into_response());
    };
    let loaded = sup.app().map(|app| app.engine.resident_ids()).unwrap_or_default();
    let catalog = settings.catalog();
    let data: Vec<Value> = catalog
        .list()
        .into_iter()
        .map(|m| {
            let mut v = serde_json::to_value(&m).unwrap_or_default();
            v["loaded"] = json!(loaded.contains(&m.id));
            v["default"] = json!(m.id == settings.default_model);
            v
        })
        .collect();
    Ok(Json(json!({"data": data, "models_dir": catalog.models_dir, "hf_cache": catalog.hf_cache}))
        .into_response())
}

async fn select(State(sup): S, bytes: Bytes) -> Reply {
    let sup = live(sup)?;
    let v: Value = body(&bytes)?;
    let id = field(&v, "id")?.to_string();
    let catalog = sup.settings().map(|s| s.catalog());
    if catalog
        .and_then(|c| c.list().into_iter().find(|m| m.id == id))
        .is_some_and(|m| m.kind != "chat")
    {
        return Err(ApiError::invalid(
            "id",
            format!("`{id}` is an embedding model; the default model is the one that chats"),
        ));
    }
    sup.select_model(&id).await.map_err(|e| config_error(&e))?;
    Ok(Json(json!({"default_model": id, "status": sup.status()})).into_response())
}

async fn delete_model(State(sup): S, Path(id): Path<String>) -> Reply {
    delete_installed(&*live(sup)?, &id).await?;
    Ok(Json(json!({"id": id, "deleted": true})).into_response())
}

/// Unload and delete an installed model, if Perch installed it and it is not the default.
pub(super) async fn delete_installed(sup: &Supervisor, id: &str) -> Result<(), ApiError> {
    let settings = sup.settings().ok_or_else(gone)?;
    if id == settings.default_model {
        return Err(ApiError::invalid(
            "id",
            format!("`{id}` is the default model; pick another default before deleting it"),
        )
        .code("model_in_use"));
    }
    // Models in the Hugging Face cache belong to the hub's tools, not to Perch.
    let m = settings
        .catalog()
        .installed()
        .into_iter()
        .find(|m| m.id == id)
        .ok_or_else(|| ApiError::model_not_found(id))?;
    // The models directory can point anywhere: only folders Perch installed are deleted.
    if !crate::catalog::installed_by_perch(&m.path) {
        return Err(ApiError::invalid(
            "id",
            format!(
                "`{id}` was not installed by Perch (no {} in {}); remove that folder yourself",
                crate::catalog::INSTALLED_MARKER,
                m.path.display()
            ),
        )
        .code("not_installed_by_perch"));
    }
    if let Some(app) = sup.app() {
        app.engine.unload(id).await?;
    }
    tokio::fs::remove_dir_all(&m.path).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("cannot delete {}: {e}", m.path.display()),
        )
    })
}

async fn import(State(sup): S, bytes: Bytes) -> Reply {
    let sup = live(sup)?;
    let v: Value = body(&bytes)?;
    let path = std::path::PathBuf::from(field(&v, "path")?);
    if !path.is_file() || path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Err(ApiError::invalid("path", format!("{} is not a .gguf file", path.display())));
    }
    let name = v.get("name").and_then(Value::as_str).map(String::from);
    let models_dir = current_settings(&sup).models_dir();
    let opts = crate::gguf::import::ImportOptions {
        name,
        quantize: crate::gguf::import::Quantize::None,
        dtype: crate::gguf::import::StoreDtype::Bf16,
        overwrite: false,
    };
    let dir =
        tokio::task::spawn_blocking(move || crate::gguf::import::import(&path, &models_dir, &opts))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    format!("import failed: {e}"),
                )
            })?
            .map_err(|e| ApiError::invalid("path", e.to_string()).code("import_failed"))?;
    Ok(Json(json!({"id": dir.file_name().map(|n| n.to_string_lossy()), "path": dir}))
        .into_response())
}

async fn downloads(State(sup): S) -> Reply {
    Ok(Json(json!({"data": live(sup)?.downloads.list()})).into_response())
}

async fn start_download(State(sup): S, bytes: Bytes) -> Reply {
    let sup = live(sup)?;
    let v: Value = body(&bytes)?;
    let repo = field(&v, "repo")?.trim().to_string();
    let settings = current_settings(&sup);
    let revision = v.get("revision").and_then(Value::as_str);
    match sup.downloads.start(&repo, revision, &settings.hub_endpoint(), &settings.models_dir()) {
        Ok(job) => Ok((StatusCode::ACCEPTED, Json(job)).into_response()),
        Err(
            e @ (DownloadError::AlreadyRunning(_)
            | DownloadError::AlreadyInstalled(_)
            | DownloadError::NameTaken { .. }),
        ) => Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
            .code("conflict")),
        Err(e) => Err(ApiError::invalid("repo", e.to_string())),
    }
}

async fn cancel_download(State(sup): S, Path(id): Path<u64>) -> Reply {
    if !live(sup)?.downloads.cancel(id) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("No download {id}"),
        )
        .code("not_found"));
    }
    Ok(Json(json!({"id": id, "cancelling": true})).into_response())
}

// Handlers share the supervisor across tasks.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Arc<Supervisor>>();
};
