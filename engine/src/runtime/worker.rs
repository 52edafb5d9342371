//! The MLX thread and the jobs it runs. MLX keeps its streams per thread, so one thread loads
//! every model and runs every generation, warmup and training window; callers hand it jobs.
//! It knows the models and their adapters, nothing of the engine around it or of training:
//! a long job (a training run) keeps its state in `Worker::job_state`.

use std::any::Any;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::SystemTime;

use futures_util::future::BoxFuture;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::eval;
use tokio::sync::oneshot;

use super::batch::{Batch, BatchStats};
use super::ladder::RungWork;
use super::warmup::{prompt_of_length, WarmupWork};
use crate::decode::request::token_array;
use crate::decode::{generate, AdapterRef, DraftMode, GenerateParams};
use crate::error::{EngineError, Result};
use crate::model::encoder::Encoder;
use crate::model::kv_cache::KvCache;
use crate::model::lora::Lora;
use crate::model::LoadedModel;
use crate::prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixStats};
use crate::sync::LockExt;

/// What the MLX thread owns.
pub struct Worker {
    pub models: HashMap<String, LoadedModel>,
    /// The sentence encoders loaded (embedding models, `model::encoder`).
    pub encoders: HashMap<String, Encoder>,
    /// A warmup ladder's rung in progress.
    pub scratch: Option<Scratch>,
    /// State a long job keeps here between its tasks (a training run's trainer): one at a
    /// time, owned by whoever put it there.
    pub job_state: Option<Box<dyn Any>>,
    /// Adapters loaded for serving, by directory, with the file time they were read at.
    adapters: HashMap<PathBuf, (Option<SystemTime>, Lora)>,
    /// KV states of earlier user turns, for the next ones to start from.
    pub prefix: PrefixCache,
    /// The user turns generating together (continuous batching, `runtime::batch`).
    pub(crate) batch: Batch,
    /// This thread's own way in, for a job that comes back behind the others (a batch tick).
    own: Weak<Sender>,
}

impl Worker {
    /// Jobs waiting behind the one running.
    pub(crate) fn mlx_pending(&self) -> usize {
        self.own.upgrade().map_or(0, |s| s.pending.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Queue `task` behind the jobs waiting now.
    pub(crate) fn resubmit(&self, task: Task) -> Result<()> {
        match self.own.upgrade() {
            Some(sender) => send(&sender, task),
            None => Err(EngineError::Internal("the engine is gone".into())),
        }
    }

    pub fn model(&self, id: &str) -> Result<&LoadedModel> {
        model_of(&self.models, id)
    }

    /// `id` with `adapter` applied (or none), for one generation; `detach` takes it off.
    pub(crate) fn attach(
        &mut self,
        id: &str,
        adapter: Option<&AdapterRef>,
    ) -> Result<&mut LoadedModel> {
        let Worker { models, adapters, .. } = self;
        let model = models
            .get_mut(id)
            .ok_or_else(|| EngineError::Internal(format!("model `{id}` is not loaded")))?;
        model.adapter = match adapter {
            Some(a) => Some(adapter_for(adapters, model, a)?),
            None => None,
        };
        Ok(model)
    }

    /// Forget `id` (and every adapter, cheap to reread) and give the memory back.
    pub(crate) fn unload(&mut self, id: &str) {
        self.models.remove(id);
        self.encoders.remove(id);
        self.adapters.clear();
        self.prefix.forget(id);
        if self.scratch.as_ref().is_some_and(|s| s.model == id) {
            self.scratch = None;
        }
        release_freed_memory();
    }
}

/// The adapter at `a.dir` for `model`, read once and again when its file changes.
fn adapter_for(
    cache: &mut HashMap<PathBuf, (Option<SystemTime>, Lora)>,
    model: &LoadedModel,
    a: &AdapterRef,
) -> Result<Lora> {
    let file = a.dir.join("adapters.safetensors");
    let mtime = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
    if let Some((t, lora)) = cache.get(&a.dir) {
        if *t == mtime {
            return Ok(lora.clone());
        }
    }
    let lora = Lora::load(&a.dir, &model.net.projection_dims())?;
    cache.insert(a.dir.clone(), (mtime, lora.clone()));
    Ok(lora)
}

pub(crate) type Task = Box<dyn FnOnce(&mut Worker) + Send>;

/// The way in to the MLX thread, and how many jobs wait there (not counting the one running).
struct Sender {
    tx: Mutex<mpsc::Sender<Task>>,
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

/// The MLX thread: jobs go in, results come back on channels. Dropping it ends the thread
/// (after the job it is running) and joins it, so the models are freed before the owner is
/// gone, and never while the process is tearing MLX down.
pub struct MlxThread {
    sender: Arc<Sender>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl MlxThread {
    /// `batch`: what the batch reports (`runtime::batch`) and the tokens one of its steps
    /// feeds at most while a sequence decodes.
    pub fn start(
        prefix: PrefixCacheConfig,
        stats: Arc<PrefixStats>,
        batch: (Arc<BatchStats>, usize),
    ) -> Result<MlxThread> {
        let (tx, rx) = mpsc::channel::<Task>();
        let sender = Arc::new(Sender { tx: Mutex::new(tx), pending: Arc::default() });
        let own = Arc::downgrade(&sender);
        let thread = std::thread::Builder::new()
            .name("perch-mlx".into())
            .spawn(move || {
                let mut worker = Worker {
                    models: HashMap::new(),
                    encoders: HashMap::new(),
                    scratch: None,
                    job_state: None,
                    adapters: HashMap::new(),
                    prefix: PrefixCache::new(&prefix, stats),
                    batch: Batch::new(batch.1, batch.0),
                    own,
                };
                while let Ok(task) = rx.recv() {
                    // A panicking task fails its own request (its reply channel drops), not
                    // the engine.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(&mut worker)))
                        .is_err()
                    {
                        tracing::error!("a task on the MLX thread panicked");
                    }
                }
                // The owner is gone (a restart, or shutdown): give the models' memory back
                // rather than leave it in MLX's buffer cache.
                drop(worker);
                release_freed_memory();
            })
            .map_err(|e| EngineError::Internal(format!("cannot start the MLX thread: {e}")))?;
        Ok(MlxThread { sender, thread: Mutex::new(Some(thread)) })
    }

    /// Run `f` on the MLX thread and wait for its result (blocking: not from async code).
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Worker) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        send(&self.sender, Box::new(move |w| drop(tx.send(f(w)))))?;
        rx.recv().map_err(|_| {
            EngineError::Internal("a task failed on the MLX thread (see the log)".into())
        })?
    }

    /// Queue `f` on the MLX thread; the receiver yields its result.
    pub fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Worker) -> Result<T> + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<T>>> {
        submit(&self.sender, f)
    }

    /// Jobs queued behind the one running (for /health, and tests that must know a job of
    /// theirs is in line).
    pub fn pending(&self) -> usize {
        self.sender.pending.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn weak(&self) -> WeakMlx {
        WeakMlx(Arc::downgrade(&self.sender))
    }
}

impl MlxThread {
    /// Take no more jobs: the thread ends after the one it runs, and every later `run` or
    /// `submit` fails with an error (what a job meets once the engine is shutting down; tests
    /// use it to make the MLX thread fail on demand).
    pub fn close(&self) {
        // Closing the channel ends the thread's loop; it frees the models and returns.
        drop(std::mem::replace(&mut *self.sender.tx.locked(), mpsc::channel().0));
    }
}

impl Drop for MlxThread {
    fn drop(&mut self) {
        self.close();
        if let Some(thread) = self.thread.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// The MLX thread, held without keeping it alive.
pub(crate) struct WeakMlx(Weak<Sender>);

impl WeakMlx {
    pub fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Worker) -> Result<T> + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<T>>> {
        match self.0.upgrade() {
            Some(sender) => submit(&sender, f),
            None => Err(EngineError::Internal("the engine is gone".into())),
        }
    }
}

fn send(sender: &Sender, task: Task) -> Result<()> {
    use std::sync::atomic::Ordering;
    let pending = sender.pending.clone();
    pending.fetch_add(1, Ordering::SeqCst);
    let counted: Task = Box::new(move |w| {
        pending.fetch_sub(1, Ordering::SeqCst);
        task(w)
    });
    sender.tx.locked().send(counted).map_err(|_| {
        sender.pending.fetch_sub(1, Ordering::SeqCst);
        EngineError::Internal("the MLX thread has stopped".into())
    })
}

fn submit<T: Send + 'static>(
    sender: &Sender,
    f: impl FnOnce(&mut Worker) -> Result<T> + Send + 'static,
) -> Result<oneshot::Receiver<Result<T>>> {
    let (tx, rx) = oneshot::channel();
    send(sender, Box::new(move |w| drop(tx.send(f(w)))))?;
    Ok(rx)
}

/// Hand memory freed by an unloaded model back to the system: MLX keeps freed buffers in its
/// cache, and glibc keeps freed heap pages in the arena of the thread that used them (each
/// restarted engine has a new MLX thread, so nothing would reuse them). After a load too:
/// parsing tokenizer.json and the model's config, and the tokenizer a probe read before the
/// load, leave tens of megabytes free that the process would otherwise keep resident.
pub(crate) fn release_freed_memory() {
    let _ = mlx_rs::memory::clear_cache();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A ladder rung in progress: its caches live on the MLX thread between chunks.
pub struct Scratch {
    pub model: String,
    caches: Vec<KvCache>,
    tokens: Vec<u32>,
    last: Option<u32>,
}

/// Model work for background tasks on one model. It holds the MLX thread weakly: background
/// work never keeps a stopped engine's thread alive.
pub(crate) struct WorkerWork {
    mlx: WeakMlx,
    model: String,
}

impl WorkerWork {
    pub fn new(mlx: &MlxThread, model: &str) -> WorkerWork {
        WorkerWork { mlx: mlx.weak(), model: model.to_string() }
    }

    fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Worker, &str) -> Result<T> + Send + 'static,
    ) -> oneshot::Receiver<Result<T>> {
        let model = self.model.clone();
        self.mlx.submit(move |w| f(w, &model)).unwrap_or_else(|e| {
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
            let prompt = prompt_of_length(model, 32)?;
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
                let tokens = prompt_of_length(model, rung)?;
                w.scratch = Some(Scratch {
                    model: id.to_string(),
                    caches: model.net.new_caches(),
                    tokens,
                    last: None,
                });
            }
            let s = w.scratch.as_mut().unwrap();
            let end = (start + len).min(s.tokens.len());
            let tokens = token_array(&s.tokens[start..end]);
            if end == s.tokens.len() {
                let logits = model.last_logits(&tokens, &mut s.caches)?;
                let y = argmax_axis(logits.index((.., -1, ..)), -1, None)?;
                eval([&y])?;
                s.last = Some(
                    y.try_item_cast::<u32>().map_err(|e| EngineError::Internal(e.to_string()))?,
                );
            } else {
                model.hidden(&tokens, &mut s.caches)?;
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
