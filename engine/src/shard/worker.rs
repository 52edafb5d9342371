//! A rank after 0: joins the group, loads the layers rank 0 hands it and runs them for every
//! forward pass that comes round the ring, keeping their caches under rank 0's slot numbers.
//! It has no API of its own; it exits when rank 0 leaves or a neighbour is lost.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;

use super::group::Group;
use super::link::WIRE_VERSION;
use super::plan::{fingerprint, Plan};
use super::wire::{Forward, Kind, Message};
use super::{ShardConfig, ShardError};
use crate::model::kv_cache::KvCache;
use crate::model::layers::{load_blocks, PreNormBlock};
use crate::model::remote::SlotOp;
use crate::model::weights::Weights;
use crate::model::ModelConfig;
use crate::platform::ComputeDtype;

/// This rank's layers and their caches.
struct Part {
    /// First layer this rank runs, and the first any rank after 0 runs (slots on the wire
    /// are listed from there).
    first: usize,
    remote_first: usize,
    blocks: Vec<PreNormBlock>,
    caches: HashMap<(u32, u32), KvCache>,
}

/// Serve as rank `config.rank` for the model in `dir` until rank 0 leaves (Ok) or the group
/// is lost (Err).
pub fn run(config: &ShardConfig, dir: &Path, dtype: ComputeDtype) -> Result<(), ShardError> {
    crate::platform::tune_allocator();
    let group = Group::form(&config.hostfile, config.rank, config.join_timeout)?;
    eprintln!("perch: rank {} of {} joined; waiting for rank 0's plan", group.rank, group.size);
    let mut part: Option<Part> = None;
    loop {
        let msg = Message::recv_prev(&group)?;
        match msg.kind {
            Kind::Hello => {
                let reply = match hello(&group, dir, dtype, &msg.body) {
                    Ok((p, kib)) => {
                        eprintln!(
                            "perch: rank {} runs layers {}..{} ({} MiB of weights)",
                            group.rank,
                            p.first,
                            p.first + p.blocks.len(),
                            kib / 1024
                        );
                        part = Some(p);
                        let mut body = msg.body.clone();
                        body.push(kib.min(i32::MAX as u64) as i32);
                        if group.next() == 0 {
                            let kibs = body[body.len() - (group.size - 1)..].to_vec();
                            Message::new(Kind::Ready, kibs)
                        } else {
                            Message::new(Kind::Hello, body)
                        }
                    }
                    Err(why) => Message::error(&format!("rank {}: {why}", group.rank)),
                };
                reply.send_next(&group)?;
            }
            Kind::Forward => {
                let started = std::time::Instant::now();
                let out = match part.as_mut() {
                    Some(p) => forward(p, &msg).map_err(|e| format!("rank {}: {e}", group.rank)),
                    None => Err(format!("rank {}: a forward pass before the plan", group.rank)),
                };
                let reply = match out.and_then(|h| {
                    // Computed here, before it goes: the time on the wire stays apart.
                    h.eval().map_err(|e| format!("rank {}: {e}", group.rank))?;
                    Ok(h)
                }) {
                    Ok(h) => {
                        let us = started.elapsed().as_micros().min(i32::MAX as u128) as i32;
                        Message::forward(msg.body, h, msg.work_us.saturating_add(us))
                    }
                    Err(why) => Message::error(&why),
                };
                reply.send_next(&group)?;
                if let Some(p) = &part {
                    let _ = mlx_rs::transforms::eval(p.caches.values().flat_map(|c| c.state()));
                }
            }
            Kind::Error | Kind::Ping => msg.send_next(&group)?,
            Kind::Leave => {
                if group.next() != 0 {
                    msg.send_next(&group)?;
                }
                return Ok(());
            }
            Kind::Ready => {
                return Err(ShardError::Lost("a ready message reached a rank after 0".into()))
            }
        }
    }
}

/// Check rank 0's hello against this rank's model and load this rank's layers; returns the
/// part and the KiB of weights it holds.
fn hello(
    group: &Group,
    dir: &Path,
    dtype: ComputeDtype,
    body: &[i32],
) -> Result<(Part, u64), String> {
    if body.first() != Some(&WIRE_VERSION) {
        return Err(format!("rank 0 speaks another version of Perch (wire {:?})", body.first()));
    }
    let ours = fingerprint(dir).map_err(|e| e.to_string())?;
    if body.get(1..9) != Some(&ours[..]) {
        return Err(format!(
            "its model ({}) is not rank 0's (config.json or weight files differ)",
            dir.display()
        ));
    }
    let n = body.get(9).and_then(|&n| usize::try_from(n).ok()).unwrap_or(0);
    let plan = body
        .get(10..10 + n)
        .and_then(Plan::from_words)
        .filter(|p| p.ranks() == group.size)
        .ok_or("rank 0's plan does not fit this group")?;
    let range = plan.range(group.rank);
    let cfg = ModelConfig::read(dir).map_err(|e| e.to_string())?;
    let architecture = cfg.str("model_type").map_err(|e| e.to_string())?.to_string();
    let shape = crate::model::stack_shape(&cfg, &architecture)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("a `{architecture}` model cannot be sharded"))?;
    if shape.layers as usize != plan.layers() {
        return Err(format!(
            "rank 0 planned {} layers, the model has {}",
            plan.layers(),
            shape.layers
        ));
    }
    let tag = format!("layers {}..{} of {}", range.start, range.end, plan.layers());
    let load = || -> crate::error::Result<(Vec<PreNormBlock>, u64, bool)> {
        let mut w = Weights::load_part(dir, dtype, Some(tag.clone()))?;
        let prefixes: Vec<String> = range.clone().map(|i| format!("model.layers.{i}.")).collect();
        let bytes = w.stored_bytes(|n| prefixes.iter().any(|p| n.starts_with(p)));
        let blocks = load_blocks(&cfg, &mut w, &shape, range.clone())?;
        let (recovered, _, saved) = w.save_host_copies();
        Ok((blocks, bytes, recovered > 0 && saved))
    };
    let (mut blocks, bytes, again) = load().map_err(|e| e.to_string())?;
    if again {
        // As `load_model_part`: a second load reads the host copies just written and leaves
        // the f32 weights they came from unread.
        drop(blocks);
        let _ = mlx_rs::memory::clear_cache();
        blocks = load().map_err(|e| e.to_string())?.0;
    }
    let part =
        Part { first: range.start, remote_first: plan.starts[1], blocks, caches: HashMap::new() };
    Ok((part, bytes / 1024))
}

fn forward(part: &mut Part, msg: &Message) -> Result<Array, String> {
    let f = Forward::from_words(&msg.body).ok_or("a forward pass that does not parse")?;
    let mut h = msg.hidden.clone().ok_or("a forward pass without hidden states")?;
    let mine = part.first as u32..(part.first + part.blocks.len()) as u32;
    for op in &f.ops {
        match *op {
            SlotOp::Clone { layer, from, to } if mine.contains(&layer) => {
                let copy =
                    part.caches.get(&(layer, from)).ok_or("a copy of an unknown slot")?.clone();
                part.caches.insert((layer, to), copy);
            }
            SlotOp::Trim { layer, slot, n } if mine.contains(&layer) => {
                let cache =
                    part.caches.get_mut(&(layer, slot)).ok_or("a trim of an unknown slot")?;
                cache.trim(n as i32);
            }
            SlotOp::Free { layer, slot } if mine.contains(&layer) => {
                part.caches.remove(&(layer, slot));
            }
            _ => {}
        }
    }
    for (i, block) in part.blocks.iter().enumerate() {
        let layer = (part.first + i) as u32;
        let column = part.first + i - part.remote_first;
        let mut taken = Vec::with_capacity(f.slots.len());
        for seq in &f.slots {
            let &(slot, offset) = seq.get(column).ok_or("a forward pass missing a layer's slot")?;
            let cache = part.caches.remove(&(layer, slot)).unwrap_or_default();
            if cache.offset() != offset {
                return Err(format!(
                    "layer {layer} slot {slot} holds {} positions, rank 0 expects {offset}",
                    cache.offset()
                ));
            }
            taken.push((slot, cache));
        }
        let mut refs: Vec<&mut KvCache> = taken.iter_mut().map(|(_, c)| c).collect();
        let out = block.forward(&h, &mut refs, &f.lens, None);
        for (slot, cache) in taken {
            part.caches.insert((layer, slot), cache);
        }
        h = out.map_err(|e| e.to_string())?;
    }
    Ok(h)
}
