//! Perch's engine: loads MLX / Hugging Face-layout models and generates text with them.
//!
//! The desktop shell and the `perch` CLI are thin users of this library; nothing here knows
//! about Tauri.

pub mod bench;
pub mod catalog;
pub mod config;
pub mod download;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod guided;
pub mod json_prefix;
pub mod kv_cache;
pub mod model;
pub mod paths;
pub mod platform;
pub mod runtime;
pub mod sampler;
pub mod server;
pub mod speculative;
pub mod supervisor;
pub mod tokenizer;
pub mod train;

pub use error::{EngineError, Result};
pub use generate::{generate, FinishReason, GenerateParams, Generation};
pub use model::{load_model, LoadedModel};
pub use sampler::SamplingParams;
