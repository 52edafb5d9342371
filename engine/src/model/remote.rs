//! Layers that run in other processes (pipeline sharding, `crate::shard`): what the model
//! code sees of their caches (the trait they run behind is `layers::RemoteLayers`). A remote
//! layer's cache here holds only a slot number and an offset; the keys and values live with
//! the rank that runs the layer, which repeats every clone, trim and drop of the slot (queued
//! here, sent before the next forward pass).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// What a rank must repeat on its copy of a slot, in the order rank 0 did it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOp {
    /// `to` starts as a copy of `from` (both layer `layer`'s).
    Clone { layer: u32, from: u32, to: u32 },
    /// Forget the last `n` positions.
    Trim { layer: u32, slot: u32, n: u32 },
    /// The slot is gone.
    Free { layer: u32, slot: u32 },
}

/// Slot numbers and the operations not yet sent, shared by every remote cache of one model.
#[derive(Default)]
pub struct SlotBook {
    next: AtomicU32,
    pending: Mutex<Vec<SlotOp>>,
}

impl SlotBook {
    fn push(&self, op: SlotOp) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// The operations queued since the last call, oldest first.
    pub fn take_pending(&self) -> Vec<SlotOp> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn fresh(&self) -> u32 {
        // Slot 0 is never handed out, so a zero on the wire is visibly wrong.
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A remote layer's cache slot as rank 0 holds it.
pub struct RemoteSlot {
    pub slot: u32,
    pub layer: u32,
    /// Bytes the other rank holds per cached position (keys and values), so that rank 0's
    /// prefix cache counts what its entries keep alive there against its budget.
    pub bytes_per_position: usize,
    book: Arc<SlotBook>,
}

impl RemoteSlot {
    pub fn new(layer: u32, bytes_per_position: usize, book: &Arc<SlotBook>) -> RemoteSlot {
        RemoteSlot { slot: book.fresh(), layer, bytes_per_position, book: book.clone() }
    }

    pub(super) fn trimmed(&self, n: i32) {
        if n > 0 {
            self.book.push(SlotOp::Trim { layer: self.layer, slot: self.slot, n: n as u32 });
        }
    }
}

impl Clone for RemoteSlot {
    fn clone(&self) -> RemoteSlot {
        let to = self.book.fresh();
        self.book.push(SlotOp::Clone { layer: self.layer, from: self.slot, to });
        RemoteSlot {
            slot: to,
            layer: self.layer,
            bytes_per_position: self.bytes_per_position,
            book: self.book.clone(),
        }
    }
}

impl Drop for RemoteSlot {
    fn drop(&mut self) {
        self.book.push(SlotOp::Free { layer: self.layer, slot: self.slot });
    }
}
