//! Background model work on the MLX thread: the load-time MTP warmup's hidden generations and
//! the warmup ladder's rungs. None of it goes through the foreground accounting, the request
//! log or the metrics.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::eval;
use tokio::sync::oneshot;

use super::engine::{Engine, Worker};
use super::ladder::RungWork;
use super::warmup::WarmupWork;
use crate::decode::common::token_array;
use crate::decode::{generate, DraftMode, GenerateParams};
use crate::error::{EngineError, Result};
use crate::model::kv_cache::KvCache;

/// A ladder rung in progress: its caches live on the MLX thread between chunks.
pub(crate) struct Scratch {
    pub model: String,
    caches: Vec<KvCache>,
    tokens: Vec<u32>,
    last: Option<u32>,
}

/// Model work for background tasks on one model of an engine.
pub(crate) struct WorkerWork {
    engine: Weak<Engine>,
    model: String,
}

impl WorkerWork {
    pub fn new(engine: &Arc<Engine>, model: &str) -> WorkerWork {
        WorkerWork { engine: Arc::downgrade(engine), model: model.to_string() }
    }

    fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Worker, &str) -> Result<T> + Send + 'static,
    ) -> oneshot::Receiver<Result<T>> {
        let model = self.model.clone();
        let sent = match self.engine.upgrade() {
            Some(engine) => engine.on_worker_async(move |w| f(w, &model)),
            None => Err(EngineError::Internal("the engine is gone".into())),
        };
        sent.unwrap_or_else(|e| {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(e));
            rx
        })
    }

    fn submit_boxed(
        &self,
        f: impl FnOnce(&mut Worker, &str) -> Result<()> + Send + 'static,
    ) -> BoxFuture<'static, Result<()>> {
        let rx = self.submit(f);
        Box::pin(async move {
            rx.await.map_err(|_| EngineError::Internal("background task dropped".into()))?
        })
    }
}

fn model_of<'w>(
    models: &'w std::collections::HashMap<String, crate::model::LoadedModel>,
    id: &str,
) -> Result<&'w crate::model::LoadedModel> {
    models.get(id).ok_or_else(|| EngineError::Internal(format!("model `{id}` is not loaded")))
}

impl WarmupWork for WorkerWork {
    fn start(&self, _model: &str, cancel: Arc<AtomicBool>) -> oneshot::Receiver<Result<()>> {
        self.submit(move |w, id| {
            let model = model_of(&w.models, id)?;
            // docs/runtime.md §4.1: a 2-token plain bootstrap, then ~8 MTP tokens on a prompt of 24+.
            let prompt = super::warmup::prompt_of_length(model, 32)?;
            let plain = GenerateParams { max_tokens: 2, ignore_eos: true, ..Default::default() };
            generate(model, &prompt, &plain, Some(&cancel), |_| {})?;
            let mtp = GenerateParams { max_tokens: 8, draft: DraftMode::Mtp { depth: 1 }, ..plain };
            generate(model, &prompt, &mtp, Some(&cancel), |_| {})?;
            Ok(())
        })
    }
}

impl RungWork for WorkerWork {
    fn prefill_chunk(
        &self,
        rung: usize,
        start: usize,
        len: usize,
    ) -> BoxFuture<'static, Result<()>> {
        self.submit_boxed(move |w, id| {
            let model = model_of(&w.models, id)?;
            let fresh = start == 0
                || w.scratch.as_ref().is_none_or(|s| s.model != id || s.tokens.len() != rung);
            if fresh {
                let tokens = super::warmup::prompt_of_length(model, rung)?;
                w.scratch = Some(Scratch {
                    model: id.to_string(),
                    caches: model.net.new_caches(),
                    tokens,
                    last: None,
                });
            }
            let s = w.scratch.as_mut().unwrap();
            let end = (start + len).min(s.tokens.len());
            let logits = model.forward(&token_array(&s.tokens[start..end]), &mut s.caches)?;
            if end == s.tokens.len() {
                let y = argmax_axis(logits.index((.., -1, ..)), -1, None)?;
                eval([&y])?;
                s.last = Some(
                    y.try_item_cast::<u32>().map_err(|e| EngineError::Internal(e.to_string()))?,
                );
            } else {
                eval(s.caches.iter().flat_map(|c| c.state()))?;
            }
            Ok(())
        })
    }

    fn decode_step(&self) -> BoxFuture<'static, Result<()>> {
        self.submit_boxed(move |w, id| {
            let model = model_of(&w.models, id)?;
            let s = w
                .scratch
                .as_mut()
                .filter(|s| s.model == id)
                .ok_or_else(|| EngineError::Internal("no rung in progress".into()))?;
            let last =
                s.last.ok_or_else(|| EngineError::Internal("decode before prefill".into()))?;
            let logits = model.forward(&token_array(&[last]), &mut s.caches)?;
            let y = argmax_axis(logits.index((.., -1, ..)), -1, None)?;
            eval([&y])?;
            s.last =
                Some(y.try_item_cast::<u32>().map_err(|e| EngineError::Internal(e.to_string()))?);
            Ok(())
        })
    }

    fn end_rung(&self) -> BoxFuture<'static, ()> {
        let rx = self.submit(|w, _| {
            w.scratch = None;
            Ok(())
        });
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}
