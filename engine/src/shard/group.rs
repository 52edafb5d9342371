//! The process group, through MLX's own distributed backend (mlx-c's `mlx_distributed_*`;
//! mlx-rs does not wrap them): forming it from a hostfile, and sending and receiving arrays
//! between neighbouring ranks. Every call here blocks until the bytes have moved.
//!
//! MLX's ring backend busy-polls its socket while a receive is pending: a rank waiting for
//! the next pass kept a core at 94% (measured on an idle two-rank group, `top`). So each
//! message is announced on a doorbell first (a plain blocking TCP connection from each rank
//! to the next, one byte per message), and a rank sleeps on its doorbell before it asks MLX
//! for the arrays, which by then are on their way. The arrays only ever go through MLX.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use mlx_rs::{Array, Dtype, Stream};

use super::ShardError;

/// The backend: MLX's ring over TCP, which every build has (JACCL needs Thunderbolt RDMA).
const BACKEND: &str = "ring";

/// A formed group; this process is `rank` of `size`.
pub struct Group {
    raw: Raw,
    pub rank: usize,
    pub size: usize,
    /// The doorbell from the previous rank, and to the next.
    bell_in: Mutex<TcpStream>,
    bell_out: Mutex<TcpStream>,
}

impl Group {
    /// Join the group `hostfile` describes (MLX's ring format: one list of "ip:port" per
    /// rank) as `rank`. MLX waits for every rank without a bound, so the wait runs on a thread
    /// of its own and gives up after `timeout` (that thread stays behind, blocked, until the
    /// process exits).
    pub fn form(hostfile: &Path, rank: usize, timeout: Duration) -> Result<Group, ShardError> {
        let hosts = super::Hostfile::read(hostfile)?;
        let size = hosts.ranks.len();
        if rank >= size {
            return Err(ShardError::Setup(format!(
                "--rank {rank} is outside {} ({size} ranks)",
                hostfile.display()
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
                let _ = tx.send((status, Raw(res)));
            })
            .map_err(|e| ShardError::Setup(format!("cannot start the join thread: {e}")))?;
        let (status, raw) = rx.recv_timeout(timeout).map_err(|_| {
            ShardError::Setup(format!(
                "not every rank of {} joined within {} s: start `perch serve --hostfile … \
                 --rank N` for each other rank",
                hostfile.display(),
                timeout.as_secs()
            ))
        })?;
        if status != 0 || raw.0.ctx.is_null() {
            return Err(ShardError::Setup(format!(
                "MLX could not form the group of {} (is another process on this rank's port?)",
                hostfile.display()
            )));
        }
        // SAFETY: `raw` is a live group.
        let (got_rank, got_size) = unsafe {
            (mlx_sys::mlx_distributed_group_rank(raw.0), mlx_sys::mlx_distributed_group_size(raw.0))
        };
        if got_rank as usize != rank || got_size as usize != size {
            return Err(ShardError::Setup(format!(
                "MLX formed rank {got_rank} of {got_size}, expected {rank} of {size}"
            )));
        }
        let addr = |r: usize| hosts.ranks[r][0].parse::<SocketAddr>().ok();
        let (Some(mine), Some(next)) = (addr(rank), addr((rank + 1) % size)) else {
            return Err(ShardError::Setup("a hostfile address is not ip:port".into()));
        };
        let (bell_in, bell_out) = doorbells(&raw, rank, size, mine, next, timeout)?;
        Ok(Group { raw, rank, size, bell_in: Mutex::new(bell_in), bell_out: Mutex::new(bell_out) })
    }

    /// The rank after this one around the ring (activations flow this way).
    pub fn next(&self) -> usize {
        (self.rank + 1) % self.size
    }

    /// The rank before this one.
    pub fn prev(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// Announce a message to the next rank.
    pub fn ring_next(&self) -> Result<(), ShardError> {
        let mut bell = self.bell_out.lock().unwrap_or_else(|p| p.into_inner());
        bell.write_all(&[1])
            .map_err(|e| ShardError::Lost(format!("ringing rank {}: {e}", self.next())))
    }

    /// Sleep until the previous rank announces a message.
    pub fn await_prev(&self) -> Result<(), ShardError> {
        let mut bell = self.bell_in.lock().unwrap_or_else(|p| p.into_inner());
        let mut byte = [0u8];
        match bell.read(&mut byte) {
            Ok(1) => Ok(()),
            Ok(_) => Err(ShardError::Lost(format!(
                "rank {} closed its connection (the process is gone)",
                self.prev()
            ))),
            Err(e) => Err(ShardError::Lost(format!("waiting for rank {}: {e}", self.prev()))),
        }
    }

    /// Send `x` to rank `dst` (a neighbour) and wait until it has gone.
    pub fn send(&self, x: &Array, dst: usize) -> Result<(), ShardError> {
        send(&self.raw, x, dst)
    }

    /// Receive an array of `shape` and `dtype` from rank `src` (a neighbour).
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array, ShardError> {
        recv(&self.raw, shape, dtype, src)
    }
}

/// Each rank listens on an ephemeral port of its own address and tells the previous rank
/// which, through MLX; then it connects to the next rank's doorbell and accepts the previous
/// rank's. Returns (from the previous rank, to the next).
fn doorbells(
    raw: &Raw,
    rank: usize,
    size: usize,
    mine: SocketAddr,
    next: SocketAddr,
    timeout: Duration,
) -> Result<(TcpStream, TcpStream), ShardError> {
    let setup = |what: &str, e: std::io::Error| ShardError::Setup(format!("{what}: {e}"));
    let listener = TcpListener::bind((mine.ip(), 0)).map_err(|e| setup("doorbell", e))?;
    let port = listener.local_addr().map_err(|e| setup("doorbell", e))?.port();
    let (prev_rank, next_rank) = ((rank + size - 1) % size, (rank + 1) % size);
    send(raw, &Array::from_slice(&[port as i32], &[1]), prev_rank)?;
    let next_port = recv(raw, &[1], Dtype::Int32, next_rank)?.as_slice::<i32>()[0];
    let next = SocketAddr::new(next.ip(), u16::try_from(next_port).unwrap_or(0));
    let out = TcpStream::connect_timeout(&next, timeout)
        .map_err(|e| setup("connecting to the next rank's doorbell", e))?;
    let (inp, _) =
        listener.accept().map_err(|e| setup("accepting the previous rank's doorbell", e))?;
    for s in [&out, &inp] {
        s.set_nodelay(true).map_err(|e| setup("doorbell", e))?;
    }
    Ok((inp, out))
}

fn send(raw: &Raw, x: &Array, dst: usize) -> Result<(), ShardError> {
    let stream = Stream::cpu();
    // SAFETY: `res` is written by the call and then owned by the Array; `x`, the group and
    // the stream are live handles.
    let sent = unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status =
            mlx_sys::mlx_distributed_send(&mut res, x.as_ptr(), dst as i32, raw.0, stream.as_ptr());
        let array = Array::from_ptr(res);
        if status != 0 {
            return Err(ShardError::Lost(format!("MLX refused to send to rank {dst}")));
        }
        array
    };
    sent.eval().map_err(|e| ShardError::Lost(format!("sending to rank {dst}: {}", what(&e))))
}

fn recv(raw: &Raw, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array, ShardError> {
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
            raw.0,
            stream.as_ptr(),
        );
        let array = Array::from_ptr(res);
        if status != 0 {
            return Err(ShardError::Lost(format!("MLX refused to receive from rank {src}")));
        }
        array
    };
    got.eval().map_err(|e| ShardError::Lost(format!("receiving from rank {src}: {}", what(&e))))?;
    Ok(got)
}

/// MLX's message without the C++ source location mlx-c appends (" at /path/file.cpp:N").
fn what(e: &mlx_rs::error::Exception) -> &str {
    let w = e.what();
    w.split(" at /").next().unwrap_or(w)
}

/// MLX's group handle, freed when dropped.
struct Raw(mlx_sys::mlx_distributed_group);

// SAFETY: the handle is to MLX's C++ group object, which MLX itself uses from its stream
// threads; Perch sends through it from one thread at a time (the MLX thread on rank 0, the
// worker loop elsewhere).
unsafe impl Send for Raw {}
unsafe impl Sync for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        if !self.0.ctx.is_null() {
            // SAFETY: the group is live and dropped once.
            unsafe {
                mlx_sys::mlx_distributed_group_free(self.0);
            }
        }
    }
}
