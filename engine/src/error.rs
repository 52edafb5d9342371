//! Typed engine errors. The CLI and the server turn these into user-facing messages.

use std::path::PathBuf;

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("model `{0}` not found (looked for an installed model id and for a directory)")]
    ModelNotFound(String),

    #[error("{0}")]
    InvalidModel(#[from] ModelRefError),

    #[error("{file}: {msg}")]
    Config { file: PathBuf, msg: String },

    #[error("unsupported architecture `{0}`; supported: {1}")]
    UnknownArchitecture(String, &'static str),

    #[error("{file}: tensor `{tensor}` is missing")]
    MissingTensor { file: PathBuf, tensor: String },

    #[error("{file}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { file: PathBuf, tensor: String, found: Vec<i32>, expected: Vec<i32> },

    #[error("{file}: {msg}")]
    BadWeights { file: PathBuf, msg: String },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    Template(String),

    /// The chat template refused the conversation (its `raise_exception`).
    #[error("the model's chat template refused this conversation: {0}")]
    TemplateRejected(String),

    #[error("invalid request: {0}")]
    InvalidRequest(String),

    #[error("the prompt is empty")]
    EmptyPrompt,

    /// A request field this model cannot honour (named, so protocols can point at it).
    #[error("{msg}")]
    BadField { field: &'static str, msg: String },

    #[error("This model's maximum context length is {context_length} tokens. However, your prompt has {prompt_tokens} tokens.")]
    ContextOverflow { context_length: usize, prompt_tokens: usize },

    #[error("token id {token} is outside the model's vocabulary (0 to {})", vocab - 1)]
    TokenOutOfVocabulary { token: u32, vocab: usize },

    /// The gate's queue is full: `0` requests may wait (a policy that never queues) or that many do.
    #[error("The engine is busy: {0} requests are already waiting. Retry shortly.")]
    Busy(usize),

    #[error("preparing the prompt (chat template, tokenizer) took longer than {0} s")]
    PrepareDeadline(u64),

    /// A sharded model's group could not be formed or a rank refused its part.
    #[error("shard group: {0}")]
    ShardSetup(String),

    /// A rank of a sharded model is gone: nothing more is served until the group restarts.
    #[error("the sharded model is unavailable: {0}")]
    ShardLost(String),

    /// A broken invariant inside the engine (a bug, not bad input).
    #[error("internal error: {0}")]
    Internal(String),

    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

impl EngineError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| EngineError::Io { path, source }
    }
}

/// Why a `model` field is no usable model reference (`runtime::ModelRef`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelRefError {
    #[error("`model` is empty")]
    Empty,
    #[error("`model` is {len} bytes long; model ids are at most {max}")]
    TooLong { len: usize, max: usize },
    #[error("`model` names more than one adapter; adapters do not stack (use `model+adapter`)")]
    Stacked,
    #[error("`model` has an empty model or adapter name around `+`")]
    EmptyPart,
}
