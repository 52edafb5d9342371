//! The process group, through MLX's own distributed backend (mlx-c's `mlx_distributed_*`;
//! mlx-rs does not wrap them): forming it from a hostfile, and sending and receiving arrays
//! between neighbouring ranks. Every call here blocks until the bytes have moved.

use std::ffi::CString;
use std::path::Path;
use std::time::Duration;

use mlx_rs::{Array, Dtype, Stream};

use super::ShardError;

/// The backend: MLX's ring over TCP, which every build has (JACCL needs Thunderbolt RDMA).
const BACKEND: &str = "ring";

/// A formed group; this process is `rank` of `size`.
pub struct Group {
    raw: mlx_sys::mlx_distributed_group,
    pub rank: usize,
    pub size: usize,
}

// SAFETY: the group is a handle to MLX's C++ group object, which MLX itself uses from its
// stream threads; Perch sends through it from one thread at a time (the MLX thread on rank
// 0, the worker loop elsewhere).
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

impl Group {
    /// Join the group `hostfile` describes (MLX's ring format: one list of "ip:port" per
    /// rank) as `rank`. MLX waits for every rank without a bound, so the wait runs on a thread
    /// of its own and gives up after `timeout` (that thread stays behind, blocked, until the
    /// process exits).
    pub fn form(hostfile: &Path, rank: usize, timeout: Duration) -> Result<Group, ShardError> {
        let hosts = super::Hostfile::read(hostfile)?;
        if rank >= hosts.ranks.len() {
            return Err(ShardError::Setup(format!(
                "--rank {rank} is outside {} ({} ranks)",
                hostfile.display(),
                hosts.ranks.len()
            )));
        }
        let backend = CString::new(BACKEND).unwrap_or_default();
        // SAFETY: a plain query with a valid C string.
        if !unsafe { mlx_sys::mlx_distributed_is_available(backend.as_ptr()) } {
            return Err(ShardError::Setup("this MLX build has no ring backend".into()));
        }
        // MLX's ring backend reads its rank and hostfile from the environment; this runs
        // before any other thread of ours reads the environment.
        std::env::set_var("MLX_HOSTFILE", hostfile);
        std::env::set_var("MLX_RANK", rank.to_string());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("shard-join".into())
            .spawn(move || {
                // SAFETY: `res` is written by the call; the backend name outlives it.
                let mut res = unsafe { mlx_sys::mlx_distributed_group_new() };
                let status =
                    unsafe { mlx_sys::mlx_distributed_init(&mut res, true, backend.as_ptr()) };
                let _ = tx.send((status, RawGroup(res)));
            })
            .map_err(|e| ShardError::Setup(format!("cannot start the join thread: {e}")))?;
        let (status, RawGroup(raw)) = rx.recv_timeout(timeout).map_err(|_| {
            ShardError::Setup(format!(
                "not every rank of {} joined within {} s: start `perch serve --hostfile … \
                 --rank N` for each other rank",
                hostfile.display(),
                timeout.as_secs()
            ))
        })?;
        if status != 0 || raw.ctx.is_null() {
            return Err(ShardError::Setup(format!(
                "MLX could not form the group of {} (is another process on this rank's port?)",
                hostfile.display()
            )));
        }
        // SAFETY: `raw` is a live group.
        let (got_rank, size) = unsafe {
            (mlx_sys::mlx_distributed_group_rank(raw), mlx_sys::mlx_distributed_group_size(raw))
        };
        if got_rank as usize != rank || size as usize != hosts.ranks.len() {
            return Err(ShardError::Setup(format!(
                "MLX formed rank {got_rank} of {size}, expected {rank} of {}",
                hosts.ranks.len()
            )));
        }
        Ok(Group { raw, rank, size: size as usize })
    }

    /// The rank after this one around the ring (activations flow this way).
    pub fn next(&self) -> usize {
        (self.rank + 1) % self.size
    }

    /// The rank before this one.
    pub fn prev(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// Send `x` to rank `dst` (a neighbour) and wait until it has gone.
    pub fn send(&self, x: &Array, dst: usize) -> Result<(), ShardError> {
        let stream = Stream::cpu();
        // SAFETY: `res` is written by the call and then owned by the Array; `x`, the group
        // and the stream are live handles.
        let sent = unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let status = mlx_sys::mlx_distributed_send(
                &mut res,
                x.as_ptr(),
                dst as i32,
                self.raw,
                stream.as_ptr(),
            );
            let array = Array::from_ptr(res);
            if status != 0 {
                return Err(ShardError::Lost(format!("MLX refused to send to rank {dst}")));
            }
            array
        };
        sent.eval().map_err(|e| ShardError::Lost(format!("sending to rank {dst}: {}", what(&e))))
    }

    /// Receive an array of `shape` and `dtype` from rank `src` (a neighbour).
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array, ShardError> {
        let stream = Stream::cpu();
        // SAFETY: as in `send`; `shape` outlives the call.
        let got = unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let status = mlx_sys::mlx_distributed_recv(
                &mut res,
                shape.as_ptr(),
                shape.len(),
                dtype as u32 as mlx_sys::mlx_dtype,
                src as i32,
                self.raw,
                stream.as_ptr(),
            );
            let array = Array::from_ptr(res);
            if status != 0 {
                return Err(ShardError::Lost(format!("MLX refused to receive from rank {src}")));
            }
            array
        };
        got.eval()
            .map_err(|e| ShardError::Lost(format!("receiving from rank {src}: {}", what(&e))))?;
        Ok(got)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: the group is live and dropped once.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.raw);
        }
    }
}

/// MLX's message without the C++ source location mlx-c appends (" at /path/file.cpp:N").
fn what(e: &mlx_rs::error::Exception) -> &str {
    let w = e.what();
    w.split(" at /").next().unwrap_or(w)
}

/// A group handle crossing from the join thread.
struct RawGroup(mlx_sys::mlx_distributed_group);
// SAFETY: see `Group`.
unsafe impl Send for RawGroup {}
