//! Products of many vectors with a host copy (prefill chunks, speculative verification, a head
//! over many positions): each band of rows is widened to f32 in a buffer that stays in the
//! CPU's cache and multiplied by OpenBLAS's `cblas_sgemm`, the routine MLX's own f32 matmul
//! calls on this backend. So prefill keeps its speed while the f32 weights are never loaded:
//! MLX reads safetensors lazily, and nothing else asks for them.
//!
//! Widening costs one pass over the 8-bit copy per product, small beside the sgemm's work once
//! a product has more than a few vectors (`FEW`); below that the copy's own dot-product loop
//! (`HostMatrix::product`) is the faster one. `cblas_sgemm` is found in the process at run time
//! (libmlx.so brings it); where it is missing, the f32 weights serve these products as before.

use std::ffi::c_int;
use std::sync::OnceLock;

use super::{pool, HostMatrix};

/// Up to this many vectors a product reads the 8-bit copy directly (four at a time). Eight is
/// a full batch's decode step: through sgemm (widening, OpenBLAS's packing, its threads'
/// yields on two cores) eight Qwen2.5-0.5B sequences took 410 ms a step, through the copy's
/// own loop 269 ms (`perch bench --scenario batch`, 2-core Xeon).
pub const FEW: usize = 8;

/// Weights widened per band: 4 MiB of f32, so a band stays in cache between its widening and
/// the sgemm that reads it.
const BAND: usize = 1 << 20;

type Sgemm = unsafe extern "C" fn(
    order: c_int,
    trans_a: c_int,
    trans_b: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
);

// CBLAS's enumerations (cblas.h).
const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// `cblas_sgemm` as loaded in this process, if any library brought it.
fn sgemm() -> Option<Sgemm> {
    static FOUND: OnceLock<Option<Sgemm>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT searches the libraries already loaded; the name is
        // a NUL-terminated literal. A non-null result is cblas_sgemm, whose C signature is
        // the `Sgemm` type above (32-bit integers, checked below: an ILP64 build is refused).
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cblas_sgemm".as_ptr()) };
        if f.is_null() {
            tracing::info!("cblas_sgemm not found: products of many vectors read the f32 weights");
            return None;
        }
        if let Some(why) = wide_integers(openblas_config().as_deref(), library_of(f).as_deref()) {
            // Called with 32-bit sizes, a 64-bit-integer BLAS reads garbage in their upper
            // halves: the f32 weights serve these products instead.
            tracing::warn!("cblas_sgemm takes 64-bit integers ({why}): not used");
            return None;
        }
        Some(unsafe { std::mem::transmute::<*mut libc::c_void, Sgemm>(f) })
    })
}

/// Why the loaded BLAS takes 64-bit integers (an ILP64 build), or `None` for the 32-bit
/// interface the `Sgemm` type declares. OpenBLAS says so in its build configuration
/// (`USE64BITINT`); other BLASes are known by their library's name (`libopenblas64`,
/// `libblas64`, `mkl_intel_ilp64`, ...).
pub(crate) fn wide_integers(
    openblas_config: Option<&str>,
    library: Option<&str>,
) -> Option<String> {
    if let Some(config) = openblas_config.filter(|c| c.contains("USE64BITINT")) {
        return Some(format!("OpenBLAS built with USE64BITINT: {config}"));
    }
    let name = library?.rsplit('/').next()?.to_ascii_lowercase();
    let wide =
        ["blas64", "ilp64", "lapack64"].iter().any(|m| name.contains(m)) || name.contains("64_");
    wide.then(|| format!("library {name}"))
}

/// OpenBLAS's build configuration, if OpenBLAS is loaded.
fn openblas_config() -> Option<String> {
    // SAFETY: as in `sgemm`; `openblas_get_config` takes nothing and returns a pointer to a
    // static NUL-terminated string.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"openblas_get_config".as_ptr()) };
    if f.is_null() {
        return None;
    }
    let get = unsafe {
        std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> *const libc::c_char>(f)
    };
    let text = get();
    (!text.is_null())
        .then(|| unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned())
}

/// The file of the loaded library that holds `symbol`.
fn library_of(symbol: *mut libc::c_void) -> Option<String> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and fills `info`; dli_fname, when set,
    // points at a NUL-terminated path owned by the loader.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    Some(unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// Whether products of more than `FEW` vectors can run here.
pub fn available() -> bool {
    sgemm().is_some()
}

/// A row-major matrix operand for `sgemm_rows`: `rows` rows of `cols` values, each row
/// starting `stride` values after the one before.
pub(crate) struct Rows<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl Rows<'_> {
    fn fits(&self) -> bool {
        self.cols <= self.stride
            && (self.rows == 0 || (self.rows - 1) * self.stride + self.cols <= self.data.len())
    }
}

/// `c = alpha * a · b` (or `a · bᵀ` when `b_transposed`) by OpenBLAS, `c` row-major with rows
/// `ldc` apart. False when no sgemm is loaded. Panics when an operand is shorter than its
/// shape says or the shapes do not chain: the checks that make the call below sound.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_rows(
    alpha: f32,
    a: Rows,
    b: Rows,
    b_transposed: bool,
    c: &mut [f32],
    ldc: usize,
) -> bool {
    let Some(sgemm) = sgemm() else { return false };
    let (m, k) = (a.rows, a.cols);
    let n = if b_transposed { b.rows } else { b.cols };
    assert!(a.fits() && b.fits(), "an sgemm operand shorter than its shape");
    assert_eq!(k, if b_transposed { b.cols } else { b.rows }, "sgemm shapes do not chain");
    assert!(n <= ldc && (m == 0 || (m - 1) * ldc + n <= c.len()), "an sgemm output too short");
    if m == 0 || n == 0 {
        return true;
    }
    let int = |v: usize| c_int::try_from(v).expect("an sgemm size over 2^31");
    // SAFETY: every operand holds the rows its shape and stride describe (asserted above), and
    // `c` the m rows of n values, ldc apart, that the call writes.
    unsafe {
        sgemm(
            ROW_MAJOR,
            NO_TRANS,
            if b_transposed { TRANS } else { NO_TRANS },
            int(m),
            int(n),
            int(k),
            alpha,
            a.data.as_ptr(),
            int(a.stride),
            b.data.as_ptr(),
            int(b.stride),
            0.0,
            c.as_mut_ptr(),
            int(ldc),
        );
    }
    true
}

impl HostMatrix {
    /// `x @ W.T` for `l` vectors of `cols` values side by side (row-major [l, cols]): [l, rows].
    /// `None` when no sgemm is loaded (see `available`).
    pub(super) fn gemm(&self, x: &[f32], l: usize) -> Option<Vec<f32>> {
        let sgemm = sgemm()?;
        let (rows, cols) = (self.rows, self.cols);
        let band = (BAND / cols).clamp(1, rows);
        let mut out = vec![0f32; l * rows];
        let mut wide = vec![0f32; band * cols];
        for first in (0..rows).step_by(band) {
            let n = band.min(rows - first);
            self.widen(first, &mut wide[..n * cols]);
            // SAFETY: x holds l*cols values, `wide` n*cols, and `out` has l rows of `rows`
            // values of which columns first..first+n are written (ldc = rows). Sizes fit c_int:
            // matrices come from safetensors shapes checked at load, far below 2^31 per side.
            unsafe {
                sgemm(
                    ROW_MAJOR,
                    NO_TRANS,
                    TRANS,
                    l as c_int,
                    n as c_int,
                    cols as c_int,
                    1.0,
                    x.as_ptr(),
                    cols as c_int,
                    wide.as_ptr(),
                    cols as c_int,
                    0.0,
                    out.as_mut_ptr().add(first),
                    rows as c_int,
                );
            }
        }
        Some(out)
    }

    /// Rows `first..` of the matrix as f32 values into `into` (whole rows), on the pool.
    fn widen(&self, first: usize, into: &mut [f32]) {
        let per = (into.len() / self.cols).div_ceil(pool().current_num_threads()) * self.cols;
        pool().scope(|s| {
            for (i, part) in into.chunks_mut(per).enumerate() {
                let at = first * self.cols + i * per;
                s.spawn(move |_| self.widen_values(at, part));
            }
        });
    }

    /// Values `at..at + into.len()` in row-major order (`at` starts a block): `offset + step * q`,
    /// as `gather` writes them. A multiply, then an add (never fused), so every CPU and both
    /// loops compute the same values.
    fn widen_values(&self, at: usize, into: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was just detected on this CPU.
            return unsafe { self.widen_avx2(at, into) };
        }
        self.widen_plain(at, into);
    }

    /// Eight values at a time: bytes widened to i32, converted, multiplied by the block's step
    /// and added to its offset.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn widen_avx2(&self, at: usize, into: &mut [f32]) {
        use std::arch::x86_64::*;
        let b = self.block;
        let q = &self.quants[at..at + into.len()];
        for ((o, q), blk) in into.chunks_exact_mut(b).zip(q.chunks_exact(b)).zip(at / b..) {
            let (d, m) = (_mm256_set1_ps(self.scales[blk]), _mm256_set1_ps(self.offsets[blk]));
            for k in (0..b).step_by(8) {
                // SAFETY: k + 8 <= b for both slices (blocks are 16 or 32 wide).
                let qi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.as_ptr().add(k).cast()));
                let v = _mm256_add_ps(m, _mm256_mul_ps(d, _mm256_cvtepi32_ps(qi)));
                _mm256_storeu_ps(o.as_mut_ptr().add(k), v);
            }
        }
    }

    fn widen_plain(&self, at: usize, into: &mut [f32]) {
        let b = self.block;
        let q = &self.quants[at..at + into.len()];
        for ((o, q), blk) in into.chunks_exact_mut(b).zip(q.chunks_exact(b)).zip(at / b..) {
            let (d, m) = (self.scales[blk], self.offsets[blk]);
            for (o, &q) in o.iter_mut().zip(q) {
                *o = m + d * q as f32;
            }
        }
    }
}
