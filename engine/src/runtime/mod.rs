//! The runtime between the server and the models (`../shared/SPEC.md` §1–§5): who is using
//! the engine (foreground accounting), who may generate now (the generation gate), and the
//! loaded model.

pub mod engine;
pub mod foreground;
pub mod gate;

pub use engine::{Engine, EngineConfig};
pub use foreground::{Foreground, ForegroundSnapshot, UserRequest};
pub use gate::{Gate, GateError, GatePermit, Policy};
