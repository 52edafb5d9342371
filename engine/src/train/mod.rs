//! Training while serving (SPEC §6). So far: the per-turn slowdown receipt; the LoRA trainer,
//! its windows and pacing, and the `/train` API come with the rest of the training issue.

pub mod receipt;

pub use receipt::{Receipt, ReceiptSummary, TurnOutcome};
