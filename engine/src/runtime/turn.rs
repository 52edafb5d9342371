//! One user turn, whatever protocol it came in by: arrival, the prompt, lease, gate, the
//! generation on the MLX thread, and typed events out (docs/runtime.md §1–§3). Protocol
//! adapters parse a body into a `Turn` and render its `TurnEvent`s; the CLI, benchmarks and
//! tests run the same path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::engine::{Engine, ModelInfo};
pub use super::event::{Answer, TurnEnd, TurnEvent, Usage};
use super::model_ref::ModelRef;
use super::observe::{DecodeMode, LastTurn, TurnFinish};
use super::prepare::{prepare, Asked, Prepared};
pub use super::prepare::{Prompt, ResponseFormat};
pub use super::prepare_pool::PREPARE_DEADLINE;
use super::scheduler::{self, Joining};
use super::split::Split;
use super::{GateError, GatePermit, Lease, UserRequest};
use crate::chat::{Tool, ToolChoice, ToolNote};
use crate::decode::sampler::SamplingParams;
use crate::decode::{
    context_room, generate_marked, DraftMode, GenerateParams, Generation, TokenLogprob,
};
use crate::error::{EngineError, Result};
use crate::prefix_cache::CacheKey;
use crate::sync::LockExt;

/// Whether a turn uses draft tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum DraftChoice {
    /// What the model was loaded with (`EngineConfig::draft`).
    #[default]
    ModelDefault,
    Off,
    Use(DraftMode),
}

/// One request, parsed: everything the runtime needs and nothing about its wire format.
#[derive(Debug, Clone)]
pub struct Turn {
    pub model: ModelRef,
    pub prompt: Prompt,
    /// As asked; `EngineConfig::max_tokens_cap` and the context cut it further.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// `Some(n)`: each token's log-probability and the n most likely alternatives.
    pub logprobs: Option<usize>,
    pub response_format: ResponseFormat,
    pub draft: DraftChoice,
    /// Keep going past end-of-sequence (benchmarks need a fixed length).
    pub ignore_eos: bool,
    /// Functions the model may call (chat prompts only), and whether it must.
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// `false`: at most one call per answer.
    pub parallel_tool_calls: bool,
    /// Chat template keyword arguments (`reasoning_effort`, `enable_thinking`, …).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// How long the model stays loaded after this turn (`None`: the engine's setting).
    pub keep_alive: Option<super::KeepAlive>,
}

impl Turn {
    pub fn new(model: ModelRef, prompt: Prompt) -> Turn {
        Turn {
            model,
            prompt,
            max_tokens: None,
            sampling: SamplingParams::default(),
            stop: vec![],
            logprobs: None,
            response_format: ResponseFormat::Text,
            draft: DraftChoice::ModelDefault,
            ignore_eos: false,
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            template_kwargs: Default::default(),
            keep_alive: None,
        }
    }
}

/// What the observer of a turn's end sees (request logs, metrics), before the turn's client
/// does and before the next turn may start.
pub struct TurnRecord<'a> {
    pub model: &'a ModelInfo,
    pub prompt: &'a [u32],
    pub result: &'a Result<Generation>,
    /// Arrival to the first token, when there was one.
    pub ttft: Option<Duration>,
    pub drafts_off: Option<&'a str>,
    /// Tool calls read from another format, calls repeating answered ones.
    pub tool_notes: &'a [ToolNote],
}

/// A user who has arrived (docs/runtime.md §1: stamped before anything else is done with
/// the request); the turn starts from here.
pub struct Arrival {
    engine: Arc<Engine>,
    user: UserRequest,
    at: Instant,
}

type OnEnd = Box<dyn FnOnce(&TurnRecord<'_>) + Send>;

impl Arrival {
    /// A user arrives at `engine` now.
    pub fn now(engine: &Arc<Engine>) -> Arrival {
        Arrival { engine: engine.clone(), user: engine.foreground.arrive(), at: Instant::now() }
    }

    /// The engine, the user's guard and the arrival time (for the other kinds of request,
    /// `embed`).
    pub(super) fn into_parts(self) -> (Arc<Engine>, UserRequest, Instant) {
        (self.engine, self.user, self.at)
    }

    /// A whole turn without a protocol (benchmarks, tests, the CLI): its end, or why it
    /// failed.
    pub async fn run(self, turn: Turn) -> Result<TurnEnd> {
        self.start(turn).await?.finish().await
    }

    pub async fn start(self, turn: Turn) -> Result<TurnHandle> {
        self.start_observed(turn, |_| {}).await
    }

    /// Prepare the prompt (off the async threads, with a deadline), pin the model, wait for
    /// the gate and start generating. `on_end` runs when the generation ends, before its
    /// client hears of it.
    pub async fn start_observed(
        self,
        turn: Turn,
        on_end: impl FnOnce(&TurnRecord<'_>) + Send + 'static,
    ) -> Result<TurnHandle> {
        let Arrival { engine, mut user, at } = self;
        let mut stop = turn.stop;
        let (info, Prepared { ids: prompt, calls, think, constraint }) = {
            let (engine, model) = (engine.clone(), turn.model.clone());
            let asked = Asked {
                prompt: turn.prompt,
                tools: turn.tools,
                choice: turn.tool_choice,
                kwargs: turn.template_kwargs,
                format: turn.response_format.clone(),
                parallel: turn.parallel_tool_calls,
                recover: engine.config.tool_call_recovery,
            };
            let parallel = turn.parallel_tool_calls;
            let pool = engine.preparing.clone();
            let r = pool
                .run(move || {
                    let info = chat_model(engine.resolve(&model)?)?;
                    let prepared = prepare(&info, asked)?;
                    Ok((info, prepared))
                })
                .await?;
            // One call at most: the answer ends where the first call does.
            if let (false, Some(s)) = (parallel, &r.1.calls) {
                stop.extend(s.format().call_end().map(String::from));
            }
            r
        };
        // The one clamp: what was asked, the server's cap, and the room the (possibly capped)
        // context leaves after the prompt.
        let cap = engine.config.max_tokens_cap.unwrap_or(usize::MAX);
        let room = context_room(prompt.len(), info.context_length)?;
        let mut params = GenerateParams {
            max_tokens: turn.max_tokens.unwrap_or(usize::MAX).min(cap).min(room),
            sampling: turn.sampling,
            stop,
            ignore_eos: turn.ignore_eos,
            logprobs: turn.logprobs,
            constraint,
            adapter: info.adapter.clone(),
            ..Default::default()
        };
        // Pin the model (loading it if needed) before queueing for the gate.
        let leasing = Instant::now();
        let lease = engine.lease_model(&info.id).await?;
        let load = leasing.elapsed();
        engine.set_keep_alive(&info.id, turn.keep_alive);
        let draft = match turn.draft {
            DraftChoice::ModelDefault => {
                engine.with_resident(&info.id, |m| m.info.draft.clone()).unwrap_or_default()
            }
            DraftChoice::Off => DraftMode::None,
            DraftChoice::Use(d) => d,
        };
        // Logprobs and grammars (json_object too) decode one token at a time on the host: drafts
        // are not used, and the response and the request log say so.
        let guided = [
            (params.constraint.is_some(), "the answer is decoded under a grammar"),
            (params.logprobs.is_some(), "logprobs"),
        ]
        .into_iter()
        .find_map(|(on, why)| on.then_some(why));
        // A batch verifies prompt-lookup drafts for a sequence decoding alone; MTP's head and
        // its cache are the solo engine's: above a batch of one an MTP turn decodes one token
        // per step, and says so the same way.
        let batched = (engine.batched() && matches!(draft, DraftMode::Mtp { .. }))
            .then_some("batched decoding (max_batch above 1)");
        let drafts_off = match (guided.or(batched), &draft) {
            (Some(why), d) if *d != DraftMode::None => Some(format!("drafts off: {why}")),
            _ => None,
        };
        params.draft = if guided.or(batched).is_some() { DraftMode::None } else { draft };
        // A full queue refuses the request before it counts as queued: a 429 is no turn.
        let ticket = engine.gate.enter().map_err(|GateError::QueueFull(n)| EngineError::Busy(n))?;
        user.queue();
        let permit = ticket.wait().await;
        user.start();
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::unbounded_channel();
        let tool_notes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handle = TurnHandle {
            model: info.served_id(),
            prompt_tokens: prompt.len(),
            drafts_off: drafts_off.clone(),
            tool_notes: tool_notes.clone(),
            events: rx,
            cancel: cancel.clone(),
        };
        let running = Running {
            engine,
            info,
            prompt,
            params,
            drafts_off,
            splitter: Split::new(think, calls),
            tool_notes,
            held: (permit, lease, user),
            arrived: at,
            load,
            cancel,
            on_end: Box::new(on_end),
        };
        tokio::task::spawn_blocking(move || running.run(tx));
        Ok(handle)
    }
}

/// The prompt's length in tokens as `turn` would render it, without generating (Anthropic's
/// `count_tokens`): the model's template and tokenizer, off the async threads and under the
/// same bounded pool and deadline as a turn's. The model need not be loaded.
pub async fn count_prompt_tokens(engine: &Arc<Engine>, turn: Turn) -> Result<usize> {
    let (engine, model) = (engine.clone(), turn.model);
    let asked = Asked {
        prompt: turn.prompt,
        tools: turn.tools,
        choice: turn.tool_choice,
        kwargs: turn.template_kwargs,
        format: turn.response_format,
        parallel: turn.parallel_tool_calls,
        recover: false,
    };
    let pool = engine.preparing.clone();
    pool.run(move || {
        let info = chat_model(engine.resolve(&model)?)?;
        Ok(prepare(&info, asked)?.ids.len())
    })
    .await
}

/// `info`, if it is a model that chats; an encoder is refused by name.
fn chat_model(info: ModelInfo) -> Result<ModelInfo> {
    match info.kind {
        crate::model::ModelKind::Chat => Ok(info),
        crate::model::ModelKind::Embedding(_) => Err(EngineError::BadField {
            field: "model",
            msg: format!(
                "`{}` is an embedding model: it serves /v1/embeddings and /api/embed, not chat \
                 or completions",
                info.id
            ),
        }),
    }
}

/// A started turn: its events, and its cancellation (dropping the handle cancels it; the
/// generation stops within one step).
pub struct TurnHandle {
    /// The id the turn's model is served as (`model` or `model+adapter`).
    pub model: String,
    pub prompt_tokens: usize,
    /// Why this turn decodes without the drafts its model would use, if it does.
    pub drafts_off: Option<String>,
    /// What the tool-call reader noticed (`ToolNote`), complete once the turn has ended.
    pub tool_notes: Arc<std::sync::Mutex<Vec<ToolNote>>>,
    events: mpsc::UnboundedReceiver<TurnEvent>,
    cancel: Arc<AtomicBool>,
}

impl TurnHandle {
    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<TurnEvent> {
        self.events.recv().await
    }

    /// The flag that cancels this turn (for a server's shutdown).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Wait for the end, passing over the deltas.
    pub async fn finish(mut self) -> Result<TurnEnd> {
        self.answer().await.map(|(_, end)| end)
    }

    /// The whole answer and the end, for a response that is not streamed.
    pub async fn answer(&mut self) -> Result<(Answer, TurnEnd)> {
        let mut answer = Answer::default();
        while let Some(ev) = self.next().await {
            if let Some(end) = answer.add(ev) {
                return end.map(|end| (answer, end));
            }
        }
        Err(EngineError::Internal("the turn ended without a result".into()))
    }
}

impl Drop for TurnHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// A turn past the gate, generating on a blocking thread. The permit, the lease and the user
/// guard live exactly as long as the generation does.
struct Running {
    engine: Arc<Engine>,
    info: ModelInfo,
    prompt: Vec<u32>,
    params: GenerateParams,
    /// Why drafts were not used, when the model would have used them.
    drafts_off: Option<String>,
    /// Reads tool calls out of the text (a turn that offered tools).
    splitter: Option<Split>,
    /// Where the splitter's notes go for the client's response.
    tool_notes: Arc<std::sync::Mutex<Vec<ToolNote>>>,
    held: (GatePermit, Lease, UserRequest),
    arrived: Instant,
    /// How long pinning the model took (its load, when it was not resident).
    load: Duration,
    cancel: Arc<AtomicBool>,
    on_end: OnEnd,
}

impl Running {
    fn run(self, tx: mpsc::UnboundedSender<TurnEvent>) {
        let Running {
            engine,
            info,
            prompt,
            params,
            drafts_off,
            splitter,
            tool_notes,
            held,
            arrived,
            load,
            cancel,
            on_end,
        } = self;
        let started = Instant::now();
        let splitter = Arc::new(std::sync::Mutex::new(splitter));
        let (pieces, split) = (tx.clone(), splitter.clone());
        let result = generate(&engine, &info.id, prompt.clone(), params, cancel, move |t, l| {
            match split.locked().as_mut() {
                Some(sp) => sp.push(&pieces, t, l),
                None => {
                    let _ =
                        pieces.send(TurnEvent::Delta { text: t.to_string(), logprobs: l.to_vec() });
                }
            }
        });
        let notes = match splitter.locked().as_mut() {
            Some(sp) => {
                sp.finish(&tx);
                sp.notes().to_vec()
            }
            None => vec![],
        };
        tool_notes.locked().clone_from(&notes);
        let ttft = result.as_ref().ok().map(|g| started - arrived + g.ttft);
        if let (Ok(g), Some(ttft)) = (&result, ttft) {
            *engine.last_turn.locked() = Some(LastTurn {
                model: info.id.clone(),
                completion_tokens: g.tokens.len(),
                decode_tok_s: (g.tokens.len() > 1).then(|| g.decode_tokens_per_sec()),
                ttft_s: ttft.as_secs_f64(),
            });
        }
        on_end(&TurnRecord {
            model: &info,
            prompt: &prompt,
            result: &result,
            ttft,
            drafts_off: drafts_off.as_deref(),
            tool_notes: &notes,
        });
        // The turn has ended for the engine before its client can see it end: the next one
        // may start, and /health already counts this one.
        drop(held);
        let _ = tx.send(match result {
            Ok(g) => TurnEvent::End(Box::new(TurnEnd {
                finish_reason: g.finish_reason,
                usage: Usage {
                    prompt_tokens: prompt.len(),
                    completion_tokens: g.tokens.len(),
                    cached_tokens: g.cached_tokens,
                },
                ttft: ttft.unwrap_or_default(),
                load,
                generation: g,
            })),
            Err(e) => TurnEvent::Failed(e),
        });
    }
}

/// Generate with resident model `id` on the MLX thread and wait: one user turn, reported to
/// the observer (the training receipt, docs/training.md). The caller holds a lease on `id`
/// and the gate.
fn generate(
    engine: &Engine,
    id: &str,
    prompt: Vec<u32>,
    params: GenerateParams,
    cancel: Arc<AtomicBool>,
    on_piece: impl FnMut(&str, &[TokenLogprob]) + Send + 'static,
) -> Result<Generation> {
    let warm = engine.with_resident(id, |m| {
        m.last_used = Instant::now();
        m.mtp_warm.clone()
    });
    let owned = id.to_string();
    let guided = params.constraint.is_some() || params.logprobs.is_some();
    // The turn starts before the MLX thread takes it: a window running now delays it.
    let mark = engine.observer().map(|o| o.turn_begin());
    let (g, to_disk) = if engine.batched() {
        batched(engine, owned, prompt, params, cancel, Box::new(on_piece))?
    } else {
        solo(engine, owned, prompt, params, cancel, on_piece)?
    };
    // Copying the states out for the disk tier is a job of its own behind this one, so the
    // answer does not wait for it.
    let (key, to_disk) = to_disk;
    if !to_disk.is_empty() {
        let _ = engine.mlx.submit(move |w| {
            for state in &to_disk {
                w.prefix.persist(&key, state);
            }
            Ok(())
        });
    }
    if let Some(mark) = mark {
        mark.finish(TurnFinish {
            tokens_after_first: g.tokens.len().saturating_sub(1),
            prefill: g.ttft,
            at: g.finished_at,
            mode: DecodeMode::of(guided, g.draft.as_ref().map(|d| d.mode.as_str())),
            batch: g.batch.map_or(1, |b| b.mean.round() as usize),
        });
    }
    // A real MTP generation pays the cold costs a skipped load-time warmup left.
    if g.draft.as_ref().is_some_and(|d| d.mode == "mtp") {
        if let Some(w) = warm {
            w.store(true, Ordering::SeqCst);
        }
    }
    Ok(g)
}

/// What a generation hands back: itself, and the states its caches leave for the disk tier.
type Generated = (Generation, (CacheKey, Vec<crate::model::kv_cache::KvState>));

/// The turn as one job of the MLX thread (`max_batch` 1: the solo engine, with drafts).
fn solo(
    engine: &Engine,
    owned: String,
    prompt: Vec<u32>,
    params: GenerateParams,
    cancel: Arc<AtomicBool>,
    mut on_piece: impl FnMut(&str, &[TokenLogprob]) + Send + 'static,
) -> Result<Generated> {
    engine.mlx.run(move |w| {
        let model = w.model(&owned)?;
        let key = CacheKey::of(model, params.adapter.as_ref().map(|a| a.dir.as_path()));
        let mtp = matches!(params.draft, DraftMode::Mtp { .. }) && model.mtp.is_some();
        let from = w.prefix.lookup(&key, &prompt, mtp);
        let model = w.attach(&owned, params.adapter.as_ref())?;
        // The adapter applies to this generation only; background work never sees it.
        let g = generate_marked(model, &prompt, &params, Some(&cancel), from, &mut on_piece);
        model.adapter = None;
        let (g, state, marks) = g?;
        let to_disk = w.prefix.keep_turn(&key, state, marks, g.cached_tokens);
        Ok((g, (key, to_disk)))
    })
}

/// The turn as a sequence of the batch: it joins on the MLX thread and this thread waits for
/// its end (its text streams through `on_piece` meanwhile).
fn batched(
    engine: &Engine,
    model: String,
    prompt: Vec<u32>,
    params: GenerateParams,
    cancel: Arc<AtomicBool>,
    on_piece: crate::decode::batch::OnPiece,
) -> Result<Generated> {
    let (done, finished) = std::sync::mpsc::channel();
    let joining = Joining { model, prompt, params, cancel, on_piece };
    engine.mlx.run(move |w| {
        scheduler::join(w, joining, done);
        Ok(())
    })?;
    let f = finished.recv().map_err(|_| {
        EngineError::Internal("the batch dropped a sequence (see the log)".into())
    })??;
    Ok((f.generation, (f.key, f.to_disk)))
}
