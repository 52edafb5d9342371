//! Decode steps with the residual stream on the host (CPU backend): a block whose
//! MLP reads host copies also adds its residuals and applies its norms on the host, so MLX
//! runs at most the attention between the host products: one hand-over per layer, not three
//! (none where the attention runs on the host too, `host_decode_attention`).
//! A batch's step is a few such rows, one per sequence, each normed on its own
//! (four Qwen2.5-0.5B sequences went from 151 to 118-122 ms a step, eight from 269 to 211-218).
//!
//! Each hand-over evaluates a small MLX graph: a Qwen2.5-0.5B step of 50 to 57 ms spent 13
//! to 15 ms in those evaluations, 10 to 11 ms once the norms and additions moved here.

use mlx_rs::{Array, Dtype};

use crate::error::Result;

/// `x`'s values as f32, evaluating whatever MLX still owes for it.
pub fn values(x: &Array) -> Result<Vec<f32>> {
    let x = x.as_dtype(Dtype::Float32)?;
    x.eval()?;
    Ok(x.as_slice::<f32>().to_vec())
}

/// `v` as an array shaped and typed like `like`.
pub fn array(v: &[f32], like: &Array) -> Result<Array> {
    Ok(Array::from_slice(v, like.shape()).as_dtype(like.dtype())?)
}

pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// RMS norm as MLX's `fast::rms_norm` defines it: `x * rsqrt(mean(x²) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (mean + eps).sqrt();
    x.iter().zip(weight).map(|(x, w)| x * r * w).collect()
}

/// A gated MLP's middle: `act(gate) * up`, with SiLU or (Gemma) the tanh GELU.
pub fn gated(gelu: bool, gate: &[f32], up: &[f32]) -> Vec<f32> {
    match gelu {
        true => gate.iter().zip(up).map(|(&g, &u)| gelu_tanh(g) * u).collect(),
        false => gate.iter().zip(up).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect(),
    }
}

/// GELU with the tanh approximation, as `nn::gelu_approximate` computes it.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::fast;

    #[test]
    fn the_host_norm_is_mlx_s() {
        let x: Vec<f32> = (0..896).map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0).collect();
        let w: Vec<f32> = (0..896).map(|i| 0.5 + (i % 7) as f32 / 10.0).collect();
        let want = fast::rms_norm(
            Array::from_slice(&x, &[1, 1, 896]),
            Some(&Array::from_slice(&w, &[896])),
            1e-6,
        )
        .unwrap();
        let want = values(&want).unwrap();
        let got = rms_norm(&x, &w, 1e-6);
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "host norm differs from MLX's by {worst:e}");
    }
}
