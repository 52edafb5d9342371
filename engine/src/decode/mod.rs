//! Decoding: from a prompt's token ids to generated tokens. `request` holds what the loops
//! share, `output` where sampled tokens go; `generate` dispatches to plain pipelined decoding, `guided` (per-step host work:
//! logprobs, grammars) or `speculative` (drafts verified in one pass); `sampler` and `stop`
//! (stop strings) are theirs.
//! The KV cache is the model's state and lives in `model::kv_cache`.

pub mod batch;
pub mod constraint;
pub mod draft_setting;
pub mod generate;
pub mod guided;
pub mod output;
pub mod request;
pub mod sampler;
pub mod speculative;
pub mod stop;

pub use draft_setting::DraftSetting;
pub use generate::{generate, generate_from, generate_marked, generate_streaming};
pub use request::{
    context_room, AdapterRef, BatchShare, DraftMode, DraftStats, FinishReason, GenerateParams,
    Generation, TokenLogprob, TopLogprob,
};
pub use stop::StopMatcher;
