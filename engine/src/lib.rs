//! Perch's engine: loads MLX / Hugging Face-layout models and generates text with them.
//!
//! The desktop shell and the `perch` CLI are thin users of this library; nothing here knows
//! about Tauri.

pub mod bench;
pub mod catalog;
pub mod chat;
pub mod checked_file;
pub mod config;
pub mod conversations;
pub mod decode;
pub mod download;
pub mod error;
pub mod gguf;
pub mod install;
pub mod mcp;
pub mod model;
pub mod paths;
pub mod platform;
pub mod prefix_cache;
pub mod private_files;
pub mod runtime;
pub mod server;
pub mod shard;
pub mod supervisor;
pub mod sync;
pub mod tokenizer;
pub mod train;

pub use decode::sampler::SamplingParams;
pub use decode::{generate, FinishReason, GenerateParams, Generation};
pub use error::{EngineError, Result};
pub use model::{load_model, load_model_as, LoadedModel};
