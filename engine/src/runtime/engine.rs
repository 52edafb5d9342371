//! The engine a server runs: the resident models (on one MLX thread), the gate in front of
//! them, leases, foreground accounting, load-time warmup and the warmup ladder.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use super::keep_alive::KeepAlive;
use super::ladder::{LadderConfig, LadderStatus, WarmupLadder};
use super::model_ref::ModelRef;
use super::observe::{LastTurn, TurnObserver};
use super::warmup::{warm_at_load, WarmupOutcome};
use super::worker::{MlxThread, WorkerWork};
use super::{Foreground, Gate, Lease, Leases};
use crate::decode::constraint::Grammars;
use crate::decode::{AdapterRef, DraftMode, DraftSetting};
use crate::error::{EngineError, Result};
use crate::model::encoder::Encoder;
use crate::model::{load_model_part, LoadedModel, ModelConfig, ModelKind, ModelPart};
use crate::platform::ComputeDtype;
use crate::prefix_cache::{PrefixCacheConfig, PrefixStats};
use crate::sync::{LockExt, RwLockExt};
use crate::tokenizer::Tokenizer;

/// User turns generating together unless the settings say otherwise.
pub const DEFAULT_MAX_BATCH: usize = 4;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub models_dir: PathBuf,
    /// The Hugging Face cache whose MLX models are offered in place (None: not scanned).
    pub hf_cache: Option<PathBuf>,
    /// Caps every model's context (None: each model's own).
    pub context_length: Option<usize>,
    /// Installed id or directory of the model loaded at start.
    pub model: String,
    /// What models compute in (f32 on Linux's CPU backend unless set).
    pub compute_dtype: ComputeDtype,
    /// Where drafts come from by default, resolved once for each model as it loads.
    pub draft: DraftSetting,
    /// Most tokens one turn may generate (`None`: up to the context).
    pub max_tokens_cap: Option<usize>,
    /// Requests that may wait for the gate; more get "busy".
    pub max_queue: usize,
    /// User turns generating at once, in one batch (docs/runtime.md §2); 1 is the solo
    /// engine, with drafts.
    pub max_batch: usize,
    /// Tokens one batch step feeds at most while a sequence decodes (`batch::STEP_TOKENS`).
    pub step_tokens: usize,
    /// Models resident at once; loading another evicts the least recently used.
    pub max_resident: usize,
    pub keep_alive: KeepAlive,
    /// Load-time MTP warmup (docs/runtime.md §4) and its deadline.
    pub load_warmup: bool,
    pub warmup_deadline: Duration,
    pub ladder: LadderConfig,
    /// The prefix cache's tiers (docs/prefix-cache.md).
    pub prefix_cache: PrefixCacheConfig,
    /// Names clients send (`claude-*`) mapped to installed models (docs/api-fields.md).
    pub model_aliases: super::ModelAliases,
    /// Tool calls a model writes outside its template's format (a ```json block, a bare
    /// object, another family's markup) are read back as calls when they are valid calls of
    /// an offered tool (docs/api-fields.md, "Tool calls").
    pub tool_call_recovery: bool,
    /// Run `model` split over the processes of a group, this one rank 0 (docs/sharding.md).
    pub shard: Option<crate::shard::ShardConfig>,
}

impl EngineConfig {
    pub fn catalog(&self) -> crate::catalog::Catalog {
        crate::catalog::Catalog {
            models_dir: self.models_dir.clone(),
            hf_cache: self.hf_cache.clone(),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            models_dir: crate::paths::models_dir(),
            hf_cache: None,
            context_length: None,
            model: crate::paths::DEFAULT_MODEL_ID.into(),
            compute_dtype: ComputeDtype::Auto,
            draft: DraftSetting::default(),
            max_tokens_cap: None,
            max_queue: 32,
            max_batch: DEFAULT_MAX_BATCH,
            step_tokens: super::batch::STEP_TOKENS,
            max_resident: 1,
            keep_alive: KeepAlive::For(Duration::from_secs(30 * 60)),
            load_warmup: true,
            warmup_deadline: Duration::from_secs(30),
            ladder: LadderConfig::default(),
            prefix_cache: PrefixCacheConfig::default(),
            model_aliases: super::ModelAliases::new(super::model_ref::ModelAliases::defaults())
                .unwrap_or_default(),
            tool_call_recovery: true,
            shard: None,
        }
    }
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
    /// A LoRA adapter applied on top (the request named `model+adapter`).
    pub adapter: Option<AdapterRef>,
    /// Where its turns' draft tokens come from unless a turn says otherwise (resolved from
    /// `EngineConfig::draft` when it loaded; none before).
    pub draft: DraftMode,
    /// Its vocabulary compiled for constrained decoding, on first use.
    pub grammars: Arc<Grammars>,
    /// A chat model or an encoder (what its `config.json` names).
    pub kind: ModelKind,
}

impl ModelInfo {
    /// The id requests use: the model's, or `model+adapter`.
    pub fn served_id(&self) -> String {
        match &self.adapter {
            Some(a) => format!("{}+{}", self.id, a.name),
            None => self.id.clone(),
        }
    }
}

/// A loaded model's state outside the MLX thread.
pub(super) struct Resident {
    pub info: ModelInfo,
    pub last_used: Instant,
    /// A request's `keep_alive` for this model, over the engine's own until it unloads.
    pub keep_alive: Option<KeepAlive>,
    pub mtp_warm: Arc<AtomicBool>,
    warmup: Arc<Mutex<WarmupOutcome>>,
    ladder: Arc<WarmupLadder>,
    /// Being unloaded: it gives no new leases (a request for it waits and loads it again).
    unloading: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadedSnapshot {
    pub id: String,
    /// `chat` or `embedding`.
    pub kind: &'static str,
    pub architecture: String,
    pub context_length: usize,
    pub mtp: bool,
    pub mtp_warm: bool,
    pub load_time_warmup: WarmupOutcome,
    pub leases: usize,
    pub idle_s: f64,
    /// Waiting for its leases to end before it is unloaded.
    pub unloading: bool,
}

/// Embedding work since the engine started, for /health and /metrics.
#[derive(Debug, Default)]
pub struct EmbedStats {
    pub requests: std::sync::atomic::AtomicU64,
    pub inputs: std::sync::atomic::AtomicU64,
    pub tokens: std::sync::atomic::AtomicU64,
}

pub struct Engine {
    pub config: EngineConfig,
    pub foreground: Arc<Foreground>,
    pub gate: Arc<Gate>,
    pub leases: Arc<Leases>,
    pub started: Instant,
    /// Loads every model and runs every generation, warmup and training window.
    pub mlx: MlxThread,
    /// What the prefix cache (on the MLX thread) has done and holds.
    pub prefix: Arc<PrefixStats>,
    /// What the batch (on the MLX thread) runs and has run.
    pub batch: Arc<super::batch::BatchStats>,
    /// Embedding requests served (`runtime::embed`).
    pub embeddings: EmbedStats,
    /// Where every prompt is rendered and tokenized, a bounded number at once.
    pub(super) preparing: Arc<super::prepare_pool::Preparing>,
    /// Least recently used first.
    resident: Mutex<Vec<Resident>>,
    known: Mutex<HashMap<String, ModelInfo>>,
    /// One load or unload changes the resident models at a time. Never held while waiting
    /// for leases: an eviction waiting for a long turn would stall every other load and unload.
    load_lock: tokio::sync::Mutex<()>,
    /// Notified each time a model leaves the resident list.
    unloaded: tokio::sync::Notify,
    /// Models loading now (for /health).
    loading: Mutex<Vec<String>>,
    /// The last ladder started, for /health.
    ladder: Mutex<Arc<WarmupLadder>>,
    /// Hears of every user turn and of unloads (training, docs/training.md).
    observer: RwLock<Option<Arc<dyn TurnObserver>>>,
    /// The last finished turn, for the tray and /health.
    pub(super) last_turn: Mutex<Option<LastTurn>>,
    /// The group a sharded model runs on (`config.shard`), with the model's directory.
    shard: Option<(Arc<crate::shard::Link>, PathBuf)>,
}

/// How often an idle sharded model's ring is pinged.
const SHARD_PING_EVERY: Duration = Duration::from_secs(2);

impl Engine {
    /// Whether user turns generate together (`max_batch` above 1).
    pub fn batched(&self) -> bool {
        self.config.max_batch > 1
    }

    /// Start the MLX thread and load the configured model on it. Background work (load-time
    /// warmup, the ladder, keep-alive) starts with `start_background`.
    pub fn start(config: EngineConfig) -> Result<Engine> {
        crate::platform::tune_allocator();
        // An id the catalog offers keeps that id (a cached repo's snapshot directory is named
        // by its commit); a directory is named by its last component.
        let (dir, id) = match config.catalog().resolve(&config.model) {
            Some(dir) => (dir, config.model.clone()),
            None => {
                let dir = crate::model::resolve(&config.model, &config.models_dir)?;
                let id = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
                (dir, id)
            }
        };
        let prefix = Arc::new(PrefixStats::default());
        let batch = Arc::new(super::batch::BatchStats::default());
        let mut engine = Engine {
            gate: Arc::new(Gate::new(config.max_queue, config.max_batch)),
            foreground: Arc::new(Foreground::new()),
            leases: Leases::new(),
            started: Instant::now(),
            mlx: MlxThread::start(
                config.prefix_cache.clone(),
                prefix.clone(),
                (batch.clone(), config.step_tokens),
            )?,
            prefix,
            batch,
            embeddings: Default::default(),
            preparing: Arc::new(super::prepare_pool::Preparing::new(
                super::prepare_pool::PREPARE_AT_ONCE,
                config.max_queue,
            )),
            resident: Mutex::new(Vec::new()),
            known: Mutex::new(HashMap::new()),
            load_lock: tokio::sync::Mutex::new(()),
            unloaded: tokio::sync::Notify::new(),
            loading: Mutex::new(Vec::new()),
            ladder: Mutex::new(WarmupLadder::disabled()),
            observer: RwLock::new(None),
            last_turn: Mutex::new(None),
            shard: None,
            config,
        };
        let (draft, dtype) = (engine.config.draft, engine.config.compute_dtype);
        if let Some(shard) = engine.config.shard.clone() {
            // Formed on the MLX thread: it sends arrays, and the model's passes will too.
            let at = dir.clone();
            let link = engine.mlx.run(move |_| crate::shard::Link::form(&shard, &at, dtype))?;
            engine.shard = Some((link, dir.clone()));
        }
        let part = engine.part_for(&dir);
        let info = engine.mlx.run(move |w| {
            let mut model = load_model_part(&dir, dtype, &part)?;
            model.id = id;
            let info = ModelInfo { draft: draft.mode(&model), ..info_of(&model) };
            w.models.insert(model.id.clone(), model);
            Ok(info)
        })?;
        engine.publish(engine.capped(info));
        engine.mlx.run(|_| {
            super::worker::release_freed_memory();
            Ok(())
        })?;
        Ok(engine)
    }

    /// The part of the model in `dir` this process holds: the ends, when it is the sharded
    /// model (its other layers stay loaded on the other ranks however often it reloads here).
    fn part_for(&self, dir: &Path) -> ModelPart {
        match &self.shard {
            Some((link, at)) if at == dir => ModelPart::Ends(link.clone()),
            _ => ModelPart::Whole,
        }
    }

    /// The sharded model's group, for /health.
    pub fn shard_health(&self) -> Option<crate::shard::ShardHealth> {
        self.shard.as_ref().map(|(link, _)| link.health())
    }

    /// Tell the other ranks of a sharded model that this one is stopping.
    pub fn leave_shard_group(&self) {
        if let Some((link, _)) = &self.shard {
            let link = link.clone();
            let _ = self.mlx.run(move |_| {
                link.leave();
                Ok(())
            });
        }
    }

    /// Tell `observer` of every user turn and unload from now on (one at a time).
    pub fn set_observer(&self, observer: Arc<dyn TurnObserver>) {
        *self.observer.write_now() = Some(observer);
    }

    pub(super) fn observer(&self) -> Option<Arc<dyn TurnObserver>> {
        self.observer.read_now().clone()
    }

    /// The last finished turn.
    pub fn last_turn(&self) -> Option<LastTurn> {
        self.last_turn.locked().clone()
    }

    fn capped(&self, mut info: ModelInfo) -> ModelInfo {
        if let Some(cap) = self.config.context_length {
            info.context_length = info.context_length.min(cap);
        }
        info
    }

    fn publish(&self, info: ModelInfo) {
        let ladder = WarmupLadder::new(self.config.ladder.clone(), &info.id, info.context_length);
        self.known.locked().insert(info.id.clone(), info.clone());
        self.resident.locked().push(Resident {
            info,
            last_used: Instant::now(),
            keep_alive: None,
            mtp_warm: Arc::new(AtomicBool::new(false)),
            warmup: Arc::new(Mutex::new(WarmupOutcome::NotApplicable)),
            ladder,
            unloading: false,
        });
    }

    pub(super) fn with_resident<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Resident) -> T,
    ) -> Option<T> {
        let mut r = self.resident.locked();
        r.iter_mut().find(|m| m.info.id == id).map(f)
    }

    /// Start background work for the models loaded so far, and the keep-alive reaper.
    pub fn start_background(self: &Arc<Self>) {
        let ids: Vec<String> = self.resident.locked().iter().map(|m| m.info.id.clone()).collect();
        for id in ids {
            let lease = self.leases.acquire(&id);
            let engine = self.clone();
            tokio::spawn(async move { engine.after_load(&id, lease).await });
        }
        let engine = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(engine) = engine.upgrade() else { return };
                engine.reap_idle().await;
            }
        });
        if let Some((link, _)) = &self.shard {
            // A rank lost while nothing runs shows in /health within a few seconds.
            let (engine, link) = (Arc::downgrade(self), link.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(SHARD_PING_EVERY).await;
                    let Some(engine) = engine.upgrade() else { return };
                    let link = link.clone();
                    let rx = engine.mlx.submit(move |_| {
                        link.ping_if_quiet(SHARD_PING_EVERY);
                        Ok(())
                    });
                    drop(engine);
                    if let Ok(rx) = rx {
                        let _ = rx.await;
                    }
                }
            });
        }
    }

    /// After a model is published: load-time warmup (awaited, bounded), then the ladder in
    /// the background. `lease` pins the model from publication to the warmup's end.
    async fn after_load(self: Arc<Self>, id: &str, lease: Lease) {
        let Some((info, warm, outcome, ladder)) = self.with_resident(id, |m| {
            (m.info.clone(), m.mtp_warm.clone(), m.warmup.clone(), m.ladder.clone())
        }) else {
            return;
        };
        if info.kind != ModelKind::Chat {
            // An encoder has no warmup and no ladder: its passes are short and whole.
            drop(lease);
            return;
        }
        let result = if !info.has_mtp {
            drop(lease);
            WarmupOutcome::NotApplicable
        } else if !self.config.load_warmup {
            drop(lease);
            WarmupOutcome::Disabled
        } else {
            let work = WorkerWork::new(&self.mlx, id);
            warm_at_load(&work, id, &self.gate, lease, self.config.warmup_deadline, &warm).await
        };
        *outcome.locked() = result;
        *self.ladder.locked() = ladder.clone();
        let work: Arc<dyn super::ladder::RungWork> = Arc::new(WorkerWork::new(&self.mlx, id));
        let (fg, gate, leases, id) =
            (self.foreground.clone(), self.gate.clone(), self.leases.clone(), id.to_string());
        tokio::spawn(ladder.run(work, id, fg, gate, leases));
    }

    /// The most recently used resident model (`None` once keep-alive unloaded them all).
    pub fn loaded(&self) -> Option<ModelInfo> {
        // The chat model: an encoder loaded beside it is not what the app serves chats with.
        let r = self.resident.locked();
        r.iter().rev().find(|m| m.info.kind == ModelKind::Chat).map(|m| m.info.clone())
    }

    pub fn resident_ids(&self) -> Vec<String> {
        self.resident.locked().iter().map(|m| m.info.id.clone()).collect()
    }

    pub fn resident_snapshot(&self) -> Vec<LoadedSnapshot> {
        let r = self.resident.locked();
        r.iter()
            .map(|m| LoadedSnapshot {
                id: m.info.id.clone(),
                kind: m.info.kind.name(),
                architecture: m.info.architecture.clone(),
                context_length: m.info.context_length,
                mtp: m.info.has_mtp,
                mtp_warm: m.mtp_warm.load(Ordering::SeqCst),
                load_time_warmup: *m.warmup.locked(),
                leases: self.leases.count(&m.info.id),
                idle_s: m.last_used.elapsed().as_secs_f64(),
                unloading: m.unloading,
            })
            .collect()
    }

    pub fn ladder_status(&self) -> LadderStatus {
        self.ladder.locked().status()
    }

    /// The model a request names: a resident one, or an installed id (never a path: a
    /// request must not make the engine read arbitrary directories). `model+adapter` names
    /// a LoRA adapter trained on that model.
    pub fn model_info(&self, id: &str) -> Result<ModelInfo> {
        self.resolve(&id.parse()?)
    }

    /// `model_info` for a reference parsed already.
    pub fn resolve(&self, r: &ModelRef) -> Result<ModelInfo> {
        let info = match self.base_info(&r.base) {
            // A name a client sends for a model Perch does not have (`claude-sonnet-4-5`):
            // answered by the model its alias names, which the response then names.
            Err(EngineError::ModelNotFound(_)) if r.adapter.is_none() => {
                match self.config.model_aliases.lookup(&r.base) {
                    Some(super::model_ref::DEFAULT_TARGET) => self.base_info(&self.config.model)?,
                    Some(target) => {
                        let target: ModelRef = target.parse()?;
                        let info = self.base_info(&target.base)?;
                        return self.with_adapter(info, &target);
                    }
                    None => return Err(EngineError::ModelNotFound(r.base.clone())),
                }
            }
            other => other?,
        };
        self.with_adapter(info, r)
    }

    fn with_adapter(&self, info: ModelInfo, r: &ModelRef) -> Result<ModelInfo> {
        let Some(name) = &r.adapter else { return Ok(info) };
        let dir = crate::model::lora::adapter_dir(&self.config.models_dir, &info.id, name);
        if !crate::model::lora::valid_name(name) || !dir.join("adapters.safetensors").is_file() {
            return Err(EngineError::ModelNotFound(r.to_string()));
        }
        Ok(ModelInfo { adapter: Some(AdapterRef { name: name.clone(), dir }), ..info })
    }

    fn base_info(&self, id: &str) -> Result<ModelInfo> {
        if let Some(info) = self.known.locked().get(id) {
            return Ok(info.clone());
        }
        let Some(dir) = self.config.catalog().resolve(id) else {
            return Err(EngineError::ModelNotFound(id.to_string()));
        };
        let info = self.capped(probe(&dir, id)?);
        self.known.locked().insert(id.to_string(), info.clone());
        Ok(info)
    }

    /// A lease on model `id`, loading it first if needed (evicting the least recently used
    /// model once its leases reach zero when `max_resident` are loaded).
    pub async fn lease_model(self: &Arc<Self>, id: &str) -> Result<Lease> {
        if let Some(lease) = self.lease_if_resident(id) {
            return Ok(lease);
        }
        let info = self.model_info(id)?;
        // The load and its warmup belong to the engine, not to the request that asked: they
        // run to their end (published, warmed, ladder started) even if that client hangs up,
        // and a later request finds the model resident.
        let (engine, owned) = (self.clone(), id.to_string());
        tokio::spawn(async move { engine.load(owned, info).await })
            .await
            .map_err(|e| EngineError::Internal(format!("loading stopped: {e}")))?
    }

    /// Ids of the models loading now.
    pub fn loading(&self) -> Vec<String> {
        self.loading.locked().clone()
    }

    async fn load(self: Arc<Self>, id: String, info: ModelInfo) -> Result<Lease> {
        let id = id.as_str();
        self.loading.locked().push(id.to_string());
        let loading = Loading(&self.loading, id);
        let guard = loop {
            // Registered before the checks, so an unload ending in between is not missed.
            let unloaded = self.unloaded.notified();
            tokio::pin!(unloaded);
            unloaded.as_mut().enable();
            let guard = self.load_lock.lock().await;
            if let Some(lease) = self.lease_if_resident(id) {
                return Ok(lease);
            }
            let room = {
                let r = self.resident.locked();
                // Encoders and chat models have a room each: an embedding request never
                // evicts the chat model (nor waits for its generation to end).
                let kin: Vec<&Resident> =
                    r.iter().filter(|m| m.info.kind.name() == info.kind.name()).collect();
                if r.iter().any(|m| m.info.id == id) {
                    // Being unloaded: load it anew once that unload is done.
                    Err(None)
                } else if kin.len() < self.config.max_resident.max(1) {
                    Ok(())
                } else {
                    // Every resident model being unloaded already: wait for one to go.
                    Err(kin.iter().find(|m| !m.unloading).map(|m| m.info.id.clone()))
                }
            };
            match room {
                Ok(()) => break guard,
                Err(Some(victim)) => {
                    drop(guard);
                    tracing::info!(evict = %victim, load = %id, "evicting the least recently used model");
                    self.unload_if(&victim, |_, _| true).await?;
                }
                Err(None) => {
                    drop(guard);
                    unloaded.await;
                }
            }
        };
        let dir = info.dir.clone();
        let (model_id, draft) = (id.to_string(), self.config.draft);
        let dtype = self.config.compute_dtype;
        let part = self.part_for(&dir);
        let rx = self.mlx.submit(move |w| {
            if let ModelKind::Embedding(_) = info.kind {
                let mut encoder = Encoder::load(&dir, dtype)?;
                encoder.id = model_id.clone();
                w.encoders.insert(model_id, encoder);
                return Ok(info);
            }
            // A model's weights need the memory more than cached prompts do: the prefix
            // cache gives its RAM back first (its disk tier stays).
            w.prefix.clear_ram();
            let mut model = load_model_part(&dir, dtype, &part)?;
            model.id = model_id;
            let info = ModelInfo { draft: draft.mode(&model), ..info_of(&model) };
            w.models.insert(model.id.clone(), model);
            Ok(info)
        })?;
        let loaded = rx
            .await
            .map_err(|_| EngineError::Internal("loading failed on the MLX thread".into()))??;
        let loaded = self.capped(ModelInfo { id: id.to_string(), ..loaded });
        self.publish(loaded);
        // The probe's tokenizer is dropped with `known`'s old entry: hand back what the load
        // left free (before the warmup's first task on the MLX thread).
        drop(self.mlx.submit(|_| {
            super::worker::release_freed_memory();
            Ok(())
        }));
        drop(loading);
        // Leased from publication through the warmup (docs/runtime.md §3).
        let warm_lease = self.leases.acquire(id);
        let lease = self.leases.acquire(id);
        drop(guard);
        self.clone().after_load(id, warm_lease).await;
        Ok(lease)
    }

    /// A lease on `id` if it is loaded now (background work uses this: it never loads a model).
    pub fn lease_if_resident(&self, id: &str) -> Option<Lease> {
        let mut r = self.resident.locked();
        let at = r.iter().position(|m| m.info.id == id && !m.unloading)?;
        let mut m = r.remove(at);
        m.last_used = Instant::now();
        r.push(m);
        Some(self.leases.acquire(id))
    }

    /// Unload `id` once its leases reach zero. The unload belongs to the engine: once begun
    /// (the model gives no new leases) it runs to its end even if the caller goes away.
    pub async fn unload(self: &Arc<Self>, id: &str) -> Result<()> {
        let (engine, id) = (self.clone(), id.to_string());
        tokio::spawn(async move { engine.unload_if(&id, |_, _| true).await.map(drop) })
            .await
            .map_err(|e| EngineError::Internal(format!("unloading stopped: {e}")))?
    }

    /// Unload `id` if `still` holds for it, checked under the load lock together with
    /// marking it unloading (so no lease is handed out in between): from then on it gives no
    /// new leases; the wait for the ones held runs with the load lock released, and the
    /// unload itself under it. True if `id` is gone when this returns (unloaded here or by an
    /// unload already under way, which this waits for); false if it was not resident or
    /// `still` said no.
    async fn unload_if(
        &self,
        id: &str,
        still: impl Fn(&Engine, &Resident) -> bool,
    ) -> Result<bool> {
        let unloaded = self.unloaded.notified();
        tokio::pin!(unloaded);
        unloaded.as_mut().enable();
        let guard = self.load_lock.lock().await;
        let ladder = {
            let mut r = self.resident.locked();
            match r.iter_mut().find(|m| m.info.id == id) {
                None => return Ok(false),
                Some(m) if m.unloading => None,
                Some(m) if !still(self, m) => return Ok(false),
                Some(m) => {
                    m.unloading = true;
                    Some(m.ladder.clone())
                }
            }
        };
        drop(guard);
        let Some(ladder) = ladder else {
            // Another unload of it is under way: done when it is gone.
            while self.resident.locked().iter().any(|m| m.info.id == id) {
                unloaded.as_mut().await;
                unloaded.set(self.unloaded.notified());
                unloaded.as_mut().enable();
            }
            return Ok(true);
        };
        ladder.stop();
        if let Some(o) = self.observer() {
            o.stop(Some(id), "the model is being unloaded");
        }
        self.leases.released(Some(id)).await;
        let _guard = self.load_lock.lock().await;
        let owned = id.to_string();
        let freed = match self.mlx.submit(move |w| {
            w.unload(&owned);
            Ok(())
        }) {
            Ok(rx) => rx.await.unwrap_or_else(|_| {
                Err(EngineError::Internal("unloading failed on the MLX thread".into()))
            }),
            Err(e) => Err(e),
        };
        // Off the list however that went (a stopped MLX thread holds no model): a model left
        // marked unloading would make every load of it wait for good.
        self.resident.locked().retain(|m| m.info.id != id);
        self.unloaded.notify_waiters();
        freed?;
        tracing::info!(model = id, "unloaded");
        Ok(true)
    }

    /// From now on, `id` stays loaded for `keep_alive` after its last use (`None`: the
    /// engine's own). Every turn sets it, with its request's `keep_alive` or none, as Ollama
    /// does; `UnloadWhenIdle` unloads the model once its requests end.
    pub fn set_keep_alive(&self, id: &str, keep_alive: Option<KeepAlive>) {
        self.with_resident(id, |m| m.keep_alive = keep_alive);
    }

    /// Whether `m` has been idle past its keep-alive, with no lease held.
    fn idle_due(&self, m: &Resident) -> bool {
        let due = match m.keep_alive.unwrap_or(self.config.keep_alive) {
            KeepAlive::Forever => false,
            KeepAlive::UnloadWhenIdle => true,
            KeepAlive::For(d) => m.last_used.elapsed() >= d,
        };
        due && self.leases.count(&m.info.id) == 0
    }

    /// Unload models idle past their keep-alive. Each is judged again as its unload begins
    /// (under the load lock, which another load may hold for a while): a model used in
    /// between stays.
    async fn reap_idle(&self) {
        let idle: Vec<String> = self
            .resident
            .locked()
            .iter()
            .filter(|m| !m.unloading && self.idle_due(m))
            .map(|m| m.info.id.clone())
            .collect();
        for id in idle {
            if let Err(e) = self.unload_if(&id, Engine::idle_due).await {
                tracing::warn!(error = %e, model = %id, "keep-alive unload failed");
            }
        }
    }

    /// At quit: stop background work and wait up to `within` for every lease; false if some
    /// were still held (the caller then cancels what runs).
    pub async fn drain(&self, within: Duration) -> bool {
        self.stop_background();
        self.leases.drain(None, within).await
    }

    /// Stop every ladder at its next chunk boundary (shutdown, restart).
    pub fn stop_background(&self) {
        for m in self.resident.locked().iter() {
            m.ladder.stop();
        }
        if let Some(o) = self.observer() {
            o.stop(None, "the engine is stopping");
        }
    }
}

/// Takes `id` off the loading list when the load ends, however it ends.
struct Loading<'a>(&'a Mutex<Vec<String>>, &'a str);

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        self.0.locked().retain(|m| m != self.1);
    }
}

pub(crate) fn info_of(model: &LoadedModel) -> ModelInfo {
    ModelInfo {
        id: model.id.clone(),
        dir: model.dir.clone(),
        architecture: model.architecture.clone(),
        context_length: model.context_length,
        vocab_size: model.vocab_size,
        has_mtp: model.mtp.is_some(),
        tokenizer: model.tokenizer.clone(),
        adapter: None,
        draft: DraftMode::None,
        grammars: Arc::default(),
        kind: ModelKind::Chat,
    }
}

/// An installed model's tokenizer and limits, without loading its weights.
fn probe(dir: &Path, id: &str) -> Result<ModelInfo> {
    let cfg = ModelConfig::read(dir)?;
    let tokenizer = Arc::new(Tokenizer::load(dir, &cfg.token_ids("eos_token_id"))?);
    let architecture = cfg.str("model_type")?.to_string();
    let kind = match crate::model::encoder::is_encoder(&architecture) {
        true => ModelKind::Embedding(crate::model::encoder::EncoderSpec::read(dir, &cfg)?),
        false => ModelKind::Chat,
    };
    let context_length = match &kind {
        ModelKind::Embedding(spec) => spec.max_tokens,
        ModelKind::Chat => cfg.int_or("max_position_embeddings", 4096)? as usize,
    };
    Ok(ModelInfo {
        id: id.to_string(),
        dir: dir.to_path_buf(),
        architecture,
        context_length,
        vocab_size: cfg.int("vocab_size")? as usize,
        has_mtp: false,
        tokenizer,
        adapter: None,
        draft: DraftMode::None,
        grammars: Arc::default(),
        kind,
    })
}

// The server shares one engine between its tasks.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
};
