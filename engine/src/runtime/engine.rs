//! The engine a server runs: the loaded model, the gate in front of it, foreground
//! accounting, and the tokenizers requests are checked with before they queue.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::{Foreground, Gate};
use crate::error::{EngineError, Result};
use crate::generate::{generate_streaming, DraftMode, GenerateParams, Generation, TokenLogprob};
use crate::model::{load_model, LoadedModel, ModelConfig};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub models_dir: PathBuf,
    /// Installed id or directory of the model loaded at start.
    pub model: String,
    /// `auto`, `none`, `lookup`, `mtp`, `mtp:N` (see `DraftMode::parse`).
    pub draft: String,
    /// Requests that may wait for the gate; more get "busy".
    pub max_queue: usize,
}

/// What requests need to know about a model before it is their turn to run it.
#[derive(Clone)]
pub struct ModelInfo {
    pub id: String,
    pub dir: PathBuf,
    pub architecture: String,
    pub context_length: usize,
    pub vocab_size: usize,
    pub has_mtp: bool,
    pub tokenizer: Arc<Tokenizer>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadedSnapshot {
    pub id: String,
    pub architecture: String,
    pub context_length: usize,
    pub mtp: bool,
    pub draft: String,
}

/// Work for the MLX thread: it owns the loaded model.
type Task = Box<dyn FnOnce(&mut LoadedModel) + Send>;

pub struct Engine {
    pub config: EngineConfig,
    pub foreground: Arc<Foreground>,
    pub gate: Gate,
    pub started: Instant,
    /// MLX keeps its streams per thread, so one thread loads the model and runs every
    /// generation; callers hand it tasks (one at a time: they hold the gate).
    worker: Mutex<mpsc::Sender<Task>>,
    loaded: Mutex<ModelInfo>,
    known: Mutex<HashMap<String, ModelInfo>>,
}

impl Engine {
    /// Start the MLX thread, load the configured model on it, and get ready to serve it.
    pub fn start(config: EngineConfig) -> Result<Engine> {
        let dir = crate::model::resolve(&config.model, &config.models_dir)?;
        let (tx, rx) = mpsc::channel::<Task>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<ModelInfo>>();
        let draft = config.draft.clone();
        std::thread::Builder::new()
            .name("perch-mlx".into())
            .spawn(move || {
                let mut model = match load_model(&dir).and_then(|m| DraftMode::parse(&draft, &m).map(|_| m)) {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(info_of(&model)));
                while let Ok(task) = rx.recv() {
                    // A panicking task fails its own request (its reply channel drops), not
                    // the engine.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(&mut model))).is_err() {
                        tracing::error!("a generation panicked");
                    }
                }
            })
            .map_err(|e| EngineError::Internal(format!("cannot start the MLX thread: {e}")))?;
        let info = ready_rx.recv().map_err(|_| EngineError::Internal("the MLX thread died while loading".into()))??;
        Ok(Engine {
            gate: Gate::new(config.max_queue),
            foreground: Arc::new(Foreground::new()),
            started: Instant::now(),
            worker: Mutex::new(tx),
            known: Mutex::new(HashMap::from([(info.id.clone(), info.clone())])),
            loaded: Mutex::new(info),
            config,
        })
    }

    pub fn loaded(&self) -> ModelInfo {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn loaded_snapshot(&self) -> LoadedSnapshot {
        let m = self.loaded();
        LoadedSnapshot { id: m.id, architecture: m.architecture, context_length: m.context_length, mtp: m.has_mtp, draft: self.config.draft.clone() }
    }

    /// The model a request names: the loaded one, or an installed id (never a path: a request
    /// must not make the engine read arbitrary directories).
    pub fn model_info(&self, id: &str) -> Result<ModelInfo> {
        let loaded = self.loaded();
        if loaded.id == id {
            return Ok(loaded);
        }
        if let Some(info) = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            return Ok(info.clone());
        }
        let valid = !id.is_empty() && !id.starts_with('.') && !id.contains(['/', '\\']);
        let dir = self.config.models_dir.join(id);
        if !valid || !dir.join("config.json").exists() {
            return Err(EngineError::ModelNotFound(id.to_string()));
        }
        let info = probe(&dir, id)?;
        self.known.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), info.clone());
        Ok(info)
    }

    /// Generate with model `id` on the MLX thread, loading it in place of the current one if
    /// needed, and wait for the result. The caller holds the gate.
    pub fn generate_blocking(
        &self,
        id: &str,
        prompt: Vec<u32>,
        params: GenerateParams,
        cancel: Arc<AtomicBool>,
        mut on_piece: impl FnMut(&str, &[TokenLogprob]) + Send + 'static,
    ) -> Result<Generation> {
        let target = self.model_info(id)?;
        let default_draft = self.config.draft.clone();
        let (done, result) = mpsc::channel::<Result<(Generation, Option<ModelInfo>)>>();
        let task: Task = Box::new(move |model: &mut LoadedModel| {
            let run = || -> Result<(Generation, Option<ModelInfo>)> {
                let mut switched = None;
                if model.id != target.id {
                    tracing::info!(from = %model.id, to = %target.id, "switching models");
                    *model = load_model(&target.dir)?;
                    switched = Some(info_of(model));
                }
                let mut params = params;
                if params.draft == DraftMode::None && default_draft != "none" {
                    params.draft = DraftMode::parse(&default_draft, model).unwrap_or(DraftMode::None);
                }
                let g = generate_streaming(model, &prompt, &params, Some(&cancel), &mut on_piece)?;
                Ok((g, switched))
            };
            let _ = done.send(run());
        });
        self.worker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(task)
            .map_err(|_| EngineError::Internal("the MLX thread has stopped".into()))?;
        let (g, switched) = result.recv().map_err(|_| EngineError::Internal("the generation failed inside the engine (see the log)".into()))??;
        if let Some(info) = switched {
            *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = info;
        }
        Ok(g)
    }
}

fn info_of(model: &LoadedModel) -> ModelInfo {
    ModelInfo {
        id: model.id.clone(),
        dir: model.dir.clone(),
        architecture: model.architecture.clone(),
        context_length: model.context_length,
        vocab_size: model.vocab_size,
        has_mtp: model.mtp.is_some(),
        tokenizer: model.tokenizer.clone(),
    }
}

/// An installed model's tokenizer and limits, without loading its weights.
fn probe(dir: &Path, id: &str) -> Result<ModelInfo> {
    let cfg = ModelConfig::read(dir)?;
    let tokenizer = Arc::new(Tokenizer::load(dir, &cfg)?);
    Ok(ModelInfo {
        id: id.to_string(),
        dir: dir.to_path_buf(),
        architecture: cfg.str("model_type")?.to_string(),
        context_length: cfg.int_or("max_position_embeddings", 4096)? as usize,
        vocab_size: cfg.int("vocab_size")? as usize,
        has_mtp: false,
        tokenizer,
    })
}

// The server shares one engine between its tasks.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
};
