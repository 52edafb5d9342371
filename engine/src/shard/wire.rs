//! The messages that go round the ring. Each is a fixed header of int32 words (with the body
//! inside it when the body is short), then a longer body if there is one, then (for a forward
//! pass) the hidden states. MLX's receive needs the shape before the bytes, which is why the
//! header comes first and says how long the rest is.

use mlx_rs::{Array, Dtype};

use super::group::Group;
use super::ShardError;
use crate::model::remote::SlotOp;

/// Words in a header.
const HEADER: usize = 8;
/// Body words carried inside the header's array (a decode pass's fit: each array is a send
/// and a receive of its own, about a third of a hop's cost on loopback); a longer body
/// follows in an array of its own.
const INLINE: usize = 248;
/// Longest body accepted (a bound on what a confused peer can make us allocate).
const MAX_WORDS: i32 = 1 << 24;
/// Most hidden-state elements one message may carry (1 GiB of f32: a step of 8,192 tokens
/// on a model 32,768 wide), so a confused peer's shape cannot make MLX allocate without
/// bound.
const MAX_HIDDEN: i64 = 1 << 28;
/// Longest error text carried round the ring.
const MAX_ERROR_BYTES: usize = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Kind {
    /// Rank 0 → all: the plan and the model's fingerprint; each rank loads its layers and
    /// appends the weight KiB it holds.
    Hello = 1,
    /// The last rank → 0: every rank is loaded (the body: each one's weight KiB).
    Ready = 2,
    /// Run your layers on these hidden states (body: see `Forward`).
    Forward = 3,
    /// A rank could not do its part (body: the message, one byte a word).
    Error = 4,
    /// Rank 0 is stopping: pass it on and exit.
    Leave = 5,
    /// Rank 0 asks whether every rank is still there: pass it on.
    Ping = 6,
}

impl Kind {
    fn from_word(w: i32) -> Option<Kind> {
        Some(match w {
            1 => Kind::Hello,
            2 => Kind::Ready,
            3 => Kind::Forward,
            4 => Kind::Error,
            5 => Kind::Leave,
            6 => Kind::Ping,
            _ => return None,
        })
    }
}

/// One message.
pub struct Message {
    pub kind: Kind,
    pub body: Vec<i32>,
    /// [1, T, hidden] for a forward pass.
    pub hidden: Option<Array>,
    /// Microseconds the ranks this pass went through spent computing (so rank 0 can tell
    /// its wait apart from the time on the wire).
    pub work_us: i32,
}

impl Message {
    pub fn new(kind: Kind, body: Vec<i32>) -> Message {
        Message { kind, body, hidden: None, work_us: 0 }
    }

    pub fn forward(body: Vec<i32>, hidden: Array, work_us: i32) -> Message {
        Message { kind: Kind::Forward, body, hidden: Some(hidden), work_us }
    }

    /// An error message carrying `text`.
    pub fn error(text: &str) -> Message {
        let text: String = text.chars().take(MAX_ERROR_BYTES / 4).collect();
        Message::new(Kind::Error, text.bytes().map(i32::from).collect())
    }

    /// The text of an error message.
    pub fn text(&self) -> String {
        let bytes: Vec<u8> = self.body.iter().map(|&w| w.clamp(0, 255) as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Send this message to the next rank round the ring, announcing it on the doorbell.
    pub fn send_next(&self, group: &Group) -> Result<(), ShardError> {
        let dst = group.next();
        group.ring_next()?;
        let (shape, dtype) = match &self.hidden {
            Some(h) => (h.shape().to_vec(), h.dtype() as u32 as i32),
            None => (vec![0, 0, 0], 0),
        };
        let fixed = [
            self.kind as i32,
            self.body.len() as i32,
            self.hidden.is_some() as i32,
            shape[0],
            shape[1],
            shape[2],
            dtype,
            self.work_us,
        ];
        let (head, rest) = pack(fixed, &self.body);
        group.send(&Array::from_slice(&head, &[head.len() as i32]), dst)?;
        if let Some(rest) = rest {
            group.send(&Array::from_slice(rest, &[rest.len() as i32]), dst)?;
        }
        if let Some(h) = &self.hidden {
            group.send(h, dst)?;
        }
        Ok(())
    }

    /// The next message from the previous rank (asleep on the doorbell until it comes).
    pub fn recv_prev(group: &Group) -> Result<Message, ShardError> {
        let src = group.prev();
        group.await_prev()?;
        let header = group.recv(&[(HEADER + INLINE) as i32], Dtype::Int32, src)?;
        let h: &[i32] = header.as_slice();
        let out_of_step = |why: &str| ShardError::Lost(format!("rank {src} sent {why}"));
        let kind = Kind::from_word(h[0]).ok_or_else(|| out_of_step("an unknown message"))?;
        if !header_fits(h) {
            return Err(out_of_step("a header out of bounds"));
        }
        let (words, has_hidden, shape, dtype) = (h[1], h[2] == 1, [h[3], h[4], h[5]], h[6]);
        let body = match inline_body(h) {
            Some(body) => body.to_vec(),
            None => group.recv(&[words], Dtype::Int32, src)?.as_slice::<i32>().to_vec(),
        };
        let hidden = if has_hidden {
            let dtype = u32::try_from(dtype)
                .ok()
                .and_then(|d| Dtype::try_from(d).ok())
                .ok_or_else(|| out_of_step("an unknown dtype"))?;
            Some(group.recv(&shape, dtype, src)?)
        } else {
            None
        };
        Ok(Message { kind, body, hidden, work_us: h[7].max(0) })
    }
}

/// Whether a header's lengths are within bounds: the body's words, each dimension of the
/// hidden states, and their element count (checked before MLX allocates for them).
pub fn header_fits(h: &[i32]) -> bool {
    let elements: i64 = h[3..6].iter().map(|&d| d as i64).product();
    (0..=MAX_WORDS).contains(&h[1])
        && h[3..6].iter().all(|&d| (0..=MAX_WORDS).contains(&d))
        && elements <= MAX_HIDDEN
}

/// The header's array for `fixed` and `body`, and the body when it goes in an array of its
/// own.
pub fn pack(fixed: [i32; HEADER], body: &[i32]) -> (Vec<i32>, Option<&[i32]>) {
    let mut head = fixed.to_vec();
    let inline = body.len() <= INLINE;
    if inline {
        head.extend(body);
    }
    head.resize(HEADER + INLINE, 0);
    (head, (!inline).then_some(body))
}

/// The body a header's array carries (`None`: it follows in an array of its own).
pub fn inline_body(head: &[i32]) -> Option<&[i32]> {
    let words = usize::try_from(head[1]).ok()?;
    (words <= INLINE).then(|| &head[HEADER..HEADER + words])
}

/// The body of a forward pass: the step's sequences, their remote caches, and the slot
/// operations rank 0 did since the last pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Forward {
    /// Tokens of each sequence in the step.
    pub lens: Vec<i32>,
    /// For each sequence, for each remote layer in order: (slot, positions it holds before
    /// this pass).
    pub slots: Vec<Vec<(u32, i32)>>,
    pub ops: Vec<SlotOp>,
}

impl Forward {
    pub fn words(&self) -> Vec<i32> {
        let per_seq = self.slots.first().map_or(0, |s| s.len());
        let mut w = vec![self.lens.len() as i32, per_seq as i32, self.ops.len() as i32];
        w.extend(&self.lens);
        for seq in &self.slots {
            for &(slot, offset) in seq {
                w.extend([slot as i32, offset]);
            }
        }
        for op in &self.ops {
            w.extend(match *op {
                SlotOp::Clone { layer, from, to } => [1, layer as i32, from as i32, to as i32],
                SlotOp::Trim { layer, slot, n } => [2, layer as i32, slot as i32, n as i32],
                SlotOp::Free { layer, slot } => [3, layer as i32, slot as i32, 0],
            });
        }
        w
    }

    pub fn from_words(w: &[i32]) -> Option<Forward> {
        let (seqs, per_seq, ops) = (
            usize::try_from(*w.first()?).ok()?,
            usize::try_from(*w.get(1)?).ok()?,
            usize::try_from(*w.get(2)?).ok()?,
        );
        let need = 3usize
            .checked_add(seqs)?
            .checked_add(seqs.checked_mul(per_seq)?.checked_mul(2)?)?
            .checked_add(ops.checked_mul(4)?)?;
        if w.len() != need {
            return None;
        }
        let lens = w[3..3 + seqs].to_vec();
        let mut at = 3 + seqs;
        let mut slots = Vec::with_capacity(seqs);
        for _ in 0..seqs {
            let seq = w[at..at + 2 * per_seq].chunks(2).map(|p| (p[0] as u32, p[1])).collect();
            slots.push(seq);
            at += 2 * per_seq;
        }
        let ops = w[at..]
            .chunks(4)
            .map(|o| {
                let (layer, a, b) = (o[1] as u32, o[2] as u32, o[3] as u32);
                Some(match o[0] {
                    1 => SlotOp::Clone { layer, from: a, to: b },
                    2 => SlotOp::Trim { layer, slot: a, n: b },
                    3 => SlotOp::Free { layer, slot: a },
                    _ => return None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Forward { lens, slots, ops })
    }
}
