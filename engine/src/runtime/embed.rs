//! An embedding request, the same for every protocol: its inputs tokenized off the async
//! threads and held to the encoder's length (cut or refused, as the request says), the
//! encoder pinned by a lease like any model, and one job on the MLX thread. That job never
//! waits behind a whole chat generation: the batch steps one step at a time and lets queued
//! jobs in between (`scheduler::tick`). It takes no place at the generation gate, and it is a
//! user's request to the foreground accounting, so background warmup yields to it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::engine::ModelInfo;
use super::model_ref::ModelRef;
use super::turn::Arrival;
use super::KeepAlive;
use crate::error::{EngineError, Result};
use crate::model::encoder::EncoderSpec;
use crate::model::ModelKind;

/// Inputs one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// One input: text, or token ids of the model's vocabulary (special tokens are added to both).
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// What to embed.
#[derive(Debug, Clone)]
pub struct Embed {
    pub model: ModelRef,
    pub inputs: Vec<EmbedInput>,
    /// Cut an input longer than the encoder takes to its length (else refuse the request).
    pub truncate: bool,
    /// The vector length asked for; only the encoder's own can be honoured.
    pub dimensions: Option<usize>,
    pub keep_alive: Option<KeepAlive>,
}

/// The vectors, in input order.
#[derive(Debug, Clone)]
pub struct Embedded {
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    /// Tokens encoded, special tokens included, after any cut.
    pub tokens: usize,
    /// Pinning the encoder (its load, when it was not resident).
    pub load: Duration,
    /// From arrival to the vectors.
    pub total: Duration,
}

impl Arrival {
    /// Embed `req`'s inputs: the encoder's vectors, or why not (a field named).
    pub async fn embed(self, req: Embed) -> Result<Embedded> {
        let (engine, mut user, at) = self.into_parts();
        if req.inputs.is_empty() {
            return Err(field("input", "`input` is empty: give a string or a list of them".into()));
        }
        if req.inputs.len() > MAX_INPUTS {
            return Err(field(
                "input",
                format!("{} inputs; a request holds at most {MAX_INPUTS}", req.inputs.len()),
            ));
        }
        let (info, spec, ids) = {
            let engine = engine.clone();
            let pool = engine.preparing.clone();
            pool.run(move || {
                let info = engine.resolve(&req.model)?;
                let spec = encoder_of(&info)?;
                if let Some(d) = req.dimensions.filter(|&d| d != spec.dims) {
                    return Err(field(
                        "dimensions",
                        format!(
                            "`{}` makes vectors of {} dimensions and was not trained to be cut \
                             shorter, so `dimensions` {d} cannot be honoured",
                            info.id, spec.dims
                        ),
                    ));
                }
                let ids = req
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(i, input)| tokens_of(&info, &spec, i, input, req.truncate))
                    .collect::<Result<Vec<_>>>()?;
                Ok((info, spec, ids))
            })
            .await?
        };
        let leasing = Instant::now();
        let lease = engine.lease_model(&info.id).await?;
        let load = leasing.elapsed();
        engine.set_keep_alive(&info.id, req.keep_alive);
        user.start();
        let tokens = ids.iter().map(Vec::len).sum::<usize>();
        let inputs = ids.len();
        let id = info.id.clone();
        let rx = engine.mlx.submit(move |w| {
            let encoder = w
                .encoders
                .get(&id)
                .ok_or_else(|| EngineError::Internal(format!("encoder `{id}` is not loaded")))?;
            encoder.embed(&ids)
        })?;
        let vectors = rx
            .await
            .map_err(|_| EngineError::Internal("embedding failed on the MLX thread".into()))??;
        drop(lease);
        debug_assert!(vectors.iter().all(|v| v.len() == spec.dims));
        let stats = &engine.embeddings;
        stats.requests.fetch_add(1, Ordering::Relaxed);
        stats.inputs.fetch_add(inputs as u64, Ordering::Relaxed);
        stats.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        Ok(Embedded { model: info.served_id(), vectors, tokens, load, total: at.elapsed() })
    }
}

fn field(field: &'static str, msg: String) -> EngineError {
    EngineError::BadField { field, msg }
}

/// The encoder's spec, or the refusal of a model that makes no embeddings.
fn encoder_of(info: &ModelInfo) -> Result<EncoderSpec> {
    if info.adapter.is_some() {
        return Err(field(
            "model",
            format!("`{}`: adapters apply to chat models", info.served_id()),
        ));
    }
    match &info.kind {
        ModelKind::Embedding(spec) => Ok(spec.clone()),
        ModelKind::Chat => Err(field(
            "model",
            format!(
                "`{}` is a chat model without an embedding head; name an embedding model (the \
                 model lists mark them as kind `embedding`)",
                info.id
            ),
        )),
    }
}

/// Input `i` as the encoder reads it: special tokens around the content, cut to the
/// encoder's length when `truncate`, else refused when longer.
fn tokens_of(
    info: &ModelInfo,
    spec: &EncoderSpec,
    i: usize,
    input: &EmbedInput,
    truncate: bool,
) -> Result<Vec<u32>> {
    let mut content = match input {
        EmbedInput::Text(t) => info.tokenizer.encode(t, false)?,
        EmbedInput::Tokens(ids) => {
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
                return Err(field(
                    "input",
                    format!(
                        "input {i}: token id {bad} is outside the model's vocabulary (0 to {})",
                        info.vocab_size - 1
                    ),
                ));
            }
            ids.clone()
        }
    };
    let room = spec.max_tokens.saturating_sub(info.tokenizer.specials_added()?);
    if content.len() > room {
        if !truncate {
            return Err(field(
                "input",
                format!(
                    "input {i} has {} tokens; `{}` takes at most {room} (its {} less the special \
                     tokens)",
                    content.len(),
                    info.id,
                    spec.max_tokens
                ),
            ));
        }
        content.truncate(room);
    }
    info.tokenizer.with_specials(&content)
}
