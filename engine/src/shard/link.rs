//! Rank 0's side of a sharded model: forms the group, hands each rank its layers, and runs
//! the layers after its own by sending the hidden states round the ring. Once a rank is
//! lost, every later pass is refused at once with the reason (no request waits on a rank
//! that is gone); the group serves again when its processes are restarted.

use std::path::Path;
use std::sync::{Arc, Mutex};

use mlx_rs::Array;

use super::group::Group;
use super::plan::{fingerprint, Plan};
use super::wire::{Forward, Kind, Message};
use super::{ShardConfig, ShardError, ShardHealth};
use crate::error::{EngineError, Result};
use crate::model::kv_cache::KvCache;
use crate::model::layers::RemoteLayers;
use crate::model::remote::SlotBook;
use crate::model::weights::Weights;
use crate::model::ModelConfig;
use crate::platform::ComputeDtype;
use crate::sync::LockExt;

/// How much stored weight rank 0's tokenizer (with the server and runtime beside it) weighs
/// in the plan, per byte of tokenizer.json (see `Link::form`).
const RANK0_TOKENIZER_WEIGHT: u64 = 8;

/// The version of the messages; a rank speaking another refuses the hello.
pub const WIRE_VERSION: i32 = 1;

pub struct Link {
    group: Mutex<Group>,
    plan: Plan,
    book: Arc<SlotBook>,
    /// Weight bytes each rank holds, as stored (rank 0's by the plan, the others' as they
    /// reported them).
    weight_bytes: Vec<u64>,
    /// Why the group stopped serving, once it has.
    lost: Mutex<Option<String>>,
    traffic: Mutex<Traffic>,
    /// Keys and values per position of one layer, in elements (kv heads × head dim × 2).
    kv_elements: usize,
    /// When the ring last carried a pass or a ping.
    last_pass: Mutex<std::time::Instant>,
}

/// What the passes round the ring cost, for /health and `scripts/bench-shard`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Traffic {
    pub passes: u64,
    /// Tokens the passes carried.
    pub tokens: u64,
    /// Bytes of hidden states sent from rank 0 (the same come back).
    pub hidden_bytes: u64,
    /// Rank 0's time from sending a pass to having its answer.
    pub wait_s: f64,
    /// Of that, the other ranks' computing; the rest is the wire (and MLX's send/receive).
    pub remote_compute_s: f64,
}

impl Link {
    /// Form the group of `config` (this process is rank 0), plan the layers of the model in
    /// `dir` and have every other rank load its own; returns once all have.
    pub fn form(config: &ShardConfig, dir: &Path, dtype: ComputeDtype) -> Result<Arc<Link>> {
        if config.rank != 0 {
            return Err(EngineError::Internal("the link is rank 0's".into()));
        }
        let cfg = ModelConfig::read(dir)?;
        let architecture = cfg.str("model_type")?.to_string();
        let Some(shape) = crate::model::stack_shape(&cfg, &architecture)? else {
            return Err(EngineError::InvalidRequest(format!(
                "a `{architecture}` model runs in one process: sharding runs llama, qwen2 and qwen3"
            )));
        };
        let layers = shape.layers as usize;
        // Planning reads only the tensors' shapes (MLX loads them lazily), and no host copies.
        let weights = Weights::tensors_of(dir, dtype)?;
        let layer_bytes: Vec<u64> = (0..layers)
            .map(|i| weights.stored_bytes(|n| n.starts_with(&format!("model.layers.{i}."))))
            .collect();
        let extra = weights.stored_bytes(|_| true) - layer_bytes.iter().sum::<u64>();
        drop(weights);
        // Rank 0 alone also holds the tokenizer, the server and the runtime. Measured here
        // (scripts/bench-shard, Qwen2.5-Coder 0.5B, 2 ranks holding 1,268 and 1,253 MB of
        // stored weights): rank 0 resident 559-564 MiB, rank 1 529 MiB. Host copies keep
        // about 1/3 of the stored f32 bytes, so those ~30 MiB weigh as ~90 MB of stored
        // weights: about 8x Qwen2.5's tokenizer.json (11.4 MB), the part that grows with
        // the model's vocabulary. Charged to rank 0 so the plan balances resident memory.
        let tokenizer = std::fs::metadata(dir.join("tokenizer.json")).map_or(0, |m| m.len());
        let plan_extra = extra + RANK0_TOKENIZER_WEIGHT * tokenizer;
        let group = Group::form(&config.hostfile, 0, config.join_timeout).map_err(shard)?;
        let plan = Plan::balance(&layer_bytes, plan_extra, group.size).map_err(shard)?;
        let mut hello = vec![WIRE_VERSION];
        hello.extend(fingerprint(dir).map_err(shard)?);
        hello.push(plan.starts.len() as i32);
        hello.extend(plan.words());
        Message::new(Kind::Hello, hello).send_next(&group).map_err(shard)?;
        let ready = Message::recv_prev(&group).map_err(shard)?;
        let kib = match ready.kind {
            Kind::Ready if ready.body.len() == group.size - 1 => ready.body,
            Kind::Error => return Err(shard(ShardError::Setup(ready.text()))),
            _ => {
                return Err(shard(ShardError::Setup(
                    "a rank answered the hello out of step".into(),
                )))
            }
        };
        let rank0 = extra + layer_bytes[plan.range(0)].iter().sum::<u64>();
        let mut weight_bytes = vec![rank0];
        weight_bytes.extend(kib.iter().map(|&k| k.max(0) as u64 * 1024));
        tracing::info!(ranks = group.size, starts = ?plan.starts, ?weight_bytes, "shard group formed");
        Ok(Arc::new(Link {
            group: Mutex::new(group),
            plan,
            book: Arc::new(SlotBook::default()),
            weight_bytes,
            lost: Mutex::new(None),
            traffic: Mutex::new(Traffic::default()),
            last_pass: Mutex::new(std::time::Instant::now()),
            kv_elements: 2 * (shape.attention.kv_heads * shape.attention.head_dim) as usize,
        }))
    }

    pub fn health(&self) -> ShardHealth {
        let lost = self.lost.locked().clone();
        ShardHealth {
            state: if lost.is_some() { "lost" } else { "ready" },
            ranks: self.plan.ranks(),
            layer_starts: self.plan.starts.clone(),
            weight_bytes: self.weight_bytes.clone(),
            reason: lost,
            traffic: self.traffic.locked().clone(),
        }
    }

    /// Tell the other ranks rank 0 is stopping, so they exit rather than wait.
    pub fn leave(&self) {
        if self.lost.locked().is_some() {
            return;
        }
        let group = self.group.locked();
        let _ = Message::new(Kind::Leave, vec![]).send_next(&group);
        *self.lost.locked() = Some("rank 0 left".into());
    }

    /// Send a ping round the ring while no pass has for `quiet`, so a rank lost while idle
    /// shows in /health before the next request finds it. Runs on the MLX thread.
    pub fn ping_if_quiet(&self, quiet: std::time::Duration) {
        if self.lost.locked().is_some() || self.last_pass.locked().elapsed() < quiet {
            return;
        }
        let group = self.group.locked();
        let answer = Message::new(Kind::Ping, vec![])
            .send_next(&group)
            .and_then(|_| Message::recv_prev(&group));
        *self.last_pass.locked() = std::time::Instant::now();
        match answer {
            Ok(m) if m.kind == Kind::Ping => {}
            Ok(_) => drop(self.lose("the last rank answered a ping out of step".into())),
            Err(e) => drop(self.lose(reason(e))),
        }
    }

    fn refuse_if_lost(&self) -> Result<()> {
        match self.lost.locked().as_ref() {
            Some(why) => Err(EngineError::ShardLost(why.clone())),
            None => Ok(()),
        }
    }

    fn lose(&self, why: String) -> EngineError {
        tracing::error!(why, "shard group lost");
        *self.lost.locked() = Some(why.clone());
        EngineError::ShardLost(why)
    }
}

fn reason(e: ShardError) -> String {
    match e {
        ShardError::Setup(m) | ShardError::Lost(m) => m,
    }
}

fn shard(e: ShardError) -> EngineError {
    match e {
        ShardError::Setup(m) => EngineError::ShardSetup(m),
        ShardError::Lost(m) => EngineError::ShardLost(m),
    }
}

impl RemoteLayers for Link {
    fn first(&self) -> usize {
        self.plan.starts[1]
    }

    fn count(&self) -> usize {
        self.plan.layers() - self.first()
    }

    fn forward(&self, h: &Array, seqs: &mut [&mut [KvCache]], lens: &[i32]) -> Result<Array> {
        self.refuse_if_lost()?;
        let (first, count) = (self.first(), self.count());
        let ops = self.book.take_pending();
        let per_position = self.kv_elements * h.item_size();
        let slots = seqs
            .iter_mut()
            .map(|caches| {
                (first..first + count)
                    .map(|l| {
                        let slot = caches[l].remote_slot(l as u32, per_position, &self.book);
                        (slot, caches[l].offset())
                    })
                    .collect()
            })
            .collect();
        let body = Forward { lens: lens.to_vec(), slots, ops }.words();
        let group = self.group.locked();
        // The pass's own input is computed first, so the wait below is the ring's alone.
        h.eval()?;
        let started = std::time::Instant::now();
        let message = Message::forward(body, h.clone(), 0);
        message.send_next(&group).map_err(|e| self.lose(reason(e)))?;
        let back = Message::recv_prev(&group).map_err(|e| self.lose(reason(e)))?;
        if back.kind == Kind::Error {
            return Err(self.lose(back.text()));
        }
        let out = match (back.kind, back.hidden) {
            (Kind::Forward, Some(out)) if out.shape() == h.shape() => out,
            _ => return Err(self.lose("the last rank answered out of step".into())),
        };
        let mut t = self.traffic.locked();
        t.passes += 1;
        t.tokens += lens.iter().map(|&n| n as u64).sum::<u64>();
        t.hidden_bytes += h.nbytes() as u64;
        t.wait_s += started.elapsed().as_secs_f64();
        t.remote_compute_s += back.work_us as f64 / 1e6;
        drop(t);
        *self.last_pass.locked() = std::time::Instant::now();
        for (caches, &n) in seqs.iter_mut().zip(lens) {
            for cache in &mut caches[first..first + count] {
                cache.advance_remote(n);
            }
        }
        Ok(out)
    }
}
