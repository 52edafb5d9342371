//! What differs between macOS (Metal) and Linux (CPU wheel): the compute dtype and one
//! missing symbol.

use mlx_rs::Dtype;

/// The dtype activations and dense weights are computed in, as chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ComputeDtype {
    /// The platform's best (below), unless `PERCH_DTYPE=f32|bf16|f16|native` says otherwise.
    #[default]
    Auto,
    F32,
    Bf16,
    F16,
    /// The weights file's own dtype.
    Native,
}

impl std::str::FromStr for ComputeDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => ComputeDtype::Auto,
            "f32" | "float32" => ComputeDtype::F32,
            "bf16" | "bfloat16" => ComputeDtype::Bf16,
            "f16" | "float16" => ComputeDtype::F16,
            "native" => ComputeDtype::Native,
            other => {
                return Err(format!("`{other}` is not a dtype (auto, f32, bf16, f16, native)"))
            }
        })
    }
}

impl ComputeDtype {
    /// The dtype for weights stored as `file_dtype`.
    ///
    /// On Apple Silicon the file's dtype (bf16/f16) is fastest. On the Linux CPU backend MLX's
    /// bf16 and f16 kernels bypass BLAS and are ~40x slower than f32 over OpenBLAS
    /// (shared/MEASUREMENTS.md), so `Auto` widens to f32 at load there.
    pub fn resolve(self, file_dtype: Dtype) -> Dtype {
        let choice = match self {
            ComputeDtype::Auto => std::env::var("PERCH_DTYPE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(ComputeDtype::Auto),
            explicit => explicit,
        };
        match choice {
            ComputeDtype::F32 => Dtype::Float32,
            ComputeDtype::Bf16 => Dtype::Bfloat16,
            ComputeDtype::F16 => Dtype::Float16,
            ComputeDtype::Native => file_dtype,
            ComputeDtype::Auto if cfg!(target_os = "macos") => file_dtype,
            ComputeDtype::Auto => Dtype::Float32,
        }
    }
}

/// mlx-rs seeds its default random state with Apple's `mach_approximate_time`, which only
/// exists on Darwin. On Linux we provide it from the monotonic clock.
#[cfg(not(target_os = "macos"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Keep glibc from handing every large freed buffer back to the kernel at once. By default
/// a free of more than 128 KiB unmaps it (or trims the heap) and the next buffer of that size
/// faults in and zeroes fresh pages. The encoder's passes allocate and free buffers of a few
/// megabytes at every layer. On a 2-core AMD EPYC (avx512f; OpenBLAS on its Haswell
/// kernels) that churn was page faults, zeroing and `munmap` in the profile, and one
/// `/v1/embeddings` request of `scripts/bench-embeddings`' 256 sentences took 920–973 ms
/// (medians of 7) with glibc's defaults against 748–776 ms with these two settings, set
/// through `GLIBC_TUNABLES`; the LLM's prefill and decode in `scripts/bench_shard.py` did not
/// move. Freed memory above the heap's top beyond 128 MiB still goes back, and unloads call
/// `malloc_trim(0)`, which returns all of it. Called once per process; a no-op elsewhere than glibc.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes thresholds glibc reads on later calls.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
            }
        });
    }
}

/// The process's peak resident set size.
///
/// On Linux this is `VmHWM`, which starts afresh at exec; `getrusage`'s `ru_maxrss` keeps the
/// peak of whatever process image ran before, so a child of a big parent would report the
/// parent's peak.
pub fn peak_rss_bytes() -> u64 {
    if cfg!(target_os = "linux") {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        return status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
    }
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    // macOS reports bytes.
    usage.ru_maxrss as u64
}

/// Bytes MLX holds in arrays now (its buffer cache not counted).
pub fn active_memory_bytes() -> Option<u64> {
    mlx_rs::memory::active_memory().ok().map(|b| b as u64)
}

/// Whether process `pid` is running (on Unix: signal 0 reaches it, or it exists but is
/// another user's). Elsewhere: assumed alive, so nothing of a live process is ever removed.
pub fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else { return true };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}
