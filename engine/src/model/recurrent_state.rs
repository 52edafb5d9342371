//! What a linear-attention layer (gated DeltaNet, `gated_delta`) carries from one token to
//! the next in place of keys and values: the last few inputs of its short convolution and
//! the recurrent state. A recurrence cannot be cut back at an arbitrary position, so the
//! state after each token of the latest short call (a decode step, a draft's verification)
//! is kept, and rolling back within it is exact; anything further is refused, and the prefix
//! cache keeps states at prefill chunk ends instead (`decode::request::PrefillStates`).

use mlx_rs::Array;

/// Calls of at most this many tokens keep their per-token states for rollback: enough for
/// any draft Perch verifies (prompt lookup's longest draft, `kv_cache::SLIDING_SLACK`, plus
/// the token after it; kv_cache.rs asserts it). Longer calls are prefill chunks, which are
/// never rolled back and whose per-token states would cost a recurrent state's size per token.
pub const ROLLBACK_TOKENS: i32 = 33;

/// One layer's state: `conv` [B, kernel - 1, channels] (the convolution's last inputs) and
/// `ssm` [B, value_heads, value_dim, key_dim] (f32).
#[derive(Clone)]
pub struct RecurrentState {
    pub conv: Array,
    pub ssm: Array,
    /// The states before each token of the latest short call and after its last but one
    /// (`history[i]` is the state with `i` of its tokens seen), oldest first; empty after a
    /// long call.
    history: Vec<(Array, Array)>,
}

impl RecurrentState {
    pub fn new(conv: Array, ssm: Array) -> RecurrentState {
        RecurrentState { conv, ssm, history: vec![] }
    }

    /// The state after a call of `steps` tokens; `history` as described on the field (only
    /// kept when `steps <= ROLLBACK_TOKENS`).
    pub fn advance(&mut self, conv: Array, ssm: Array, steps: i32, history: Vec<(Array, Array)>) {
        self.conv = conv;
        self.ssm = ssm;
        self.history = if steps <= ROLLBACK_TOKENS { history } else { vec![] };
    }

    /// Whether the last `n` tokens can be forgotten.
    pub fn can_trim(&self, n: i32) -> bool {
        n == 0 || (n > 0 && n as usize <= self.history.len())
    }

    /// Forget the last `n` tokens; returns how many were forgotten (all or none).
    pub fn trim(&mut self, n: i32) -> i32 {
        if n <= 0 || !self.can_trim(n) {
            return 0;
        }
        let keep = self.history.len() - n as usize;
        let (conv, ssm) = self.history[keep].clone();
        self.history.truncate(keep);
        self.conv = conv;
        self.ssm = ssm;
        n
    }

    /// Arrays to evaluate so the state holds computed data.
    pub fn arrays(&self) -> Vec<&Array> {
        let history = self.history.iter().flat_map(|(c, s)| [c, s]);
        [&self.conv, &self.ssm].into_iter().chain(history).collect()
    }
}
