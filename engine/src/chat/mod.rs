//! Conversations: the messages a chat holds and the model's chat template that turns them
//! into a prompt. Tool-call formats and reasoning parsers belong here too.

pub mod template;

pub use template::{ChatMessage, ChatTemplate};
