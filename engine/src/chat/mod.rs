//! Conversations: the messages a chat holds and the model's chat template that turns them
//! into a prompt. Tool-call formats and reasoning parsers belong here too.

mod pyjson;
pub mod reasoning;
pub mod sandbox;
pub mod template;
pub mod tools;

pub use reasoning::{Part, ThinkSplitter};
pub use template::{ChatMessage, ChatOptions, ChatTemplate};
pub use tools::{
    answered_calls, CallSplitter, Forced, ForcedGrammar, Foreign, Piece, Recovery, Tool, ToolCall,
    ToolChoice, ToolFormat, ToolNote,
};
