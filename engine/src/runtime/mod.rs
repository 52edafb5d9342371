//! The runtime between the server and the models (`docs/runtime.md` §1–§5): who is using
//! the engine (foreground accounting), who may generate now (the generation gate), what pins
//! a model (leases), and the background work that warms it (load-time MTP warmup, the
//! warmup ladder), and the one way a user's turn goes through them (`turn`) to the MLX
//! thread (`worker`), where the turns generating together form one batch (`batch`, stepped by `scheduler`).

pub mod batch;
pub mod embed;
pub mod engine;
pub mod event;
pub mod foreground;
pub mod gate;
pub mod keep_alive;
pub mod ladder;
pub mod lease;
pub mod model_ref;
pub mod observe;
pub mod pace;
mod prepare;
mod prepare_pool;
pub mod scheduler;
mod split;
pub mod turn;
pub mod warmup;
pub mod worker;

pub use embed::{Embed, EmbedInput, Embedded};
pub use engine::{Engine, EngineConfig, KeepAlive};
pub use foreground::{Foreground, ForegroundSnapshot, UserRequest};
pub use gate::{Gate, GateError, GatePermit, Ticket};
pub use ladder::{LadderConfig, LadderState, WarmupLadder, WarmupProfile};
pub use lease::{Lease, Leases};
pub use model_ref::{ModelAliases, ModelRef, ModelRefError};
pub use observe::{DecodeMode, LastTurn, TurnFinish, TurnMark, TurnObserver};
pub use turn::{
    count_prompt_tokens, Answer, Arrival, DraftChoice, Prompt, ResponseFormat, Turn, TurnEnd,
    TurnEvent, TurnHandle, Usage,
};
