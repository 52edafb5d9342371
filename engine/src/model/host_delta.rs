//! The gated delta recurrence (`gated_delta`) on the host, for the CPU backend: MLX runs the
//! same loop as about seven small operations per token and layer, each costing more in
//! scheduling than its arithmetic; here a token is one pass over each head's state.
//! Off where `host_matrix::enabled` is (macOS, `PERCH_NO_HOST_HEAD`).

use mlx_rs::Array;

use crate::error::Result;

/// The arrays' values as f32, row-major (the inputs are views: slices, repeats), evaluated
/// together: one hand-over from MLX per call, not one per input.
fn values<const N: usize>(xs: [&Array; N]) -> Result<[Vec<f32>; N]> {
    let flat = xs
        .iter()
        .map(|x| Ok(x.as_dtype(mlx_rs::Dtype::Float32)?.contiguous()?))
        .collect::<Result<Vec<Array>>>()?;
    mlx_rs::transforms::eval(flat.iter())?;
    Ok(std::array::from_fn(|i| flat[i].as_slice::<f32>().to_vec()))
}

/// Inputs of one call, as MLX arrays: `q`, `k` [B, L, H, Dk] (q/k already L2-normed, scaled,
/// repeated to the value heads), `v` [B, L, H, Dv], `beta` and `decay` [B, L, H], `state`
/// [B, H, Dv, Dk] f32.
#[derive(Clone, Copy)]
pub struct DeltaInputs<'a> {
    pub q: &'a Array,
    pub k: &'a Array,
    pub v: &'a Array,
    pub beta: &'a Array,
    pub decay: &'a Array,
    pub state: &'a Array,
}

/// The outputs [B, L, H, Dv] (f32), the state after the last token, and, when `snapshots`,
/// the state before each token (`RecurrentState`'s history).
pub fn run(x: DeltaInputs, snapshots: bool) -> Result<(Array, Array, Vec<Array>)> {
    let (sq, sv) = (x.q.shape(), x.v.shape());
    let (b, l, h, dk, dv) =
        (sq[0] as usize, sq[1] as usize, sq[2] as usize, sq[3] as usize, sv[3] as usize);
    // A state restored from a file that does not fit the layer is an error, never an
    // out-of-bounds read.
    let fits = x.k.shape() == sq
        && sv[..3] == sq[..3]
        && [x.beta.shape(), x.decay.shape()].iter().all(|s| *s == &sq[..3])
        && x.state.shape() == [sq[0], sq[2], sv[3], sq[3]];
    if !fits {
        return Err(crate::error::EngineError::Internal(format!(
            "linear attention: a recurrent state of shape {:?} does not fit the layer",
            x.state.shape()
        )));
    }
    let [q, k, v, beta, decay, mut state] = values([x.q, x.k, x.v, x.beta, x.decay, x.state])?;
    let mut y = vec![0f32; b * l * h * dv];
    let mut kept = Vec::new();
    let state_shape = x.state.shape().to_vec();
    for t in 0..l {
        if snapshots {
            kept.push(Array::from_slice(&state, &state_shape));
        }
        for bi in 0..b {
            for hi in 0..h {
                let row = (bi * l + t) * h + hi;
                let (qr, kr) = (&q[row * dk..][..dk], &k[row * dk..][..dk]);
                let vr = &v[row * dv..][..dv];
                let (g, strength) = (decay[row], beta[row]);
                let s = &mut state[(bi * h + hi) * dv * dk..][..dv * dk];
                let out = &mut y[row * dv..][..dv];
                for (i, si) in s.chunks_exact_mut(dk).enumerate() {
                    // Decay, recall what the state holds for this key, move it towards the
                    // value by the delta rule, then read it with the query.
                    let mut recalled = 0f32;
                    for (sij, &kj) in si.iter_mut().zip(kr) {
                        *sij *= g;
                        recalled += *sij * kj;
                    }
                    let delta = (vr[i] - recalled) * strength;
                    let mut read = 0f32;
                    for ((sij, &kj), &qj) in si.iter_mut().zip(kr).zip(qr) {
                        *sij += kj * delta;
                        read += *sij * qj;
                    }
                    out[i] = read;
                }
            }
        }
    }
    let y = Array::from_slice(&y, &[b as i32, l as i32, h as i32, dv as i32]);
    Ok((y, Array::from_slice(&state, &state_shape), kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    /// The recurrence in MLX operations, token by token, as `gated_delta` runs it on Metal.
    fn reference(x: &DeltaInputs) -> (Array, Array) {
        let mut state = x.state.clone();
        let mut ys = vec![];
        for t in 0..x.q.shape()[1] {
            let at = |a: &Array| a.index((.., t, ..));
            let kt = at(x.k).expand_dims(2).unwrap();
            state = state.multiply(at(x.decay).expand_dims_axes(&[2, 3]).unwrap()).unwrap();
            let recalled = state.multiply(&kt).unwrap().sum_axis(-1, None).unwrap();
            let delta = at(x.v).subtract(&recalled).unwrap();
            let delta = delta.multiply(at(x.beta).expand_dims(2).unwrap()).unwrap();
            state = state.add(kt.multiply(delta.expand_dims(3).unwrap()).unwrap()).unwrap();
            let qt = at(x.q).expand_dims(2).unwrap();
            ys.push(state.multiply(qt).unwrap().sum_axis(-1, None).unwrap());
        }
        (mlx_rs::ops::stack(&ys, 1).unwrap(), state)
    }

    #[test]
    fn the_host_recurrence_is_mlx_s() {
        let (b, l, h, dk, dv) = (2, 5, 3, 8, 4);
        let r = |shape: &[i32], seed: u64| {
            let key = mlx_rs::random::key(seed).unwrap();
            mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap()
        };
        let unit = |a: Array| mlx_rs::nn::sigmoid(a).unwrap();
        let (q, k, v) = (r(&[b, l, h, dk], 1), r(&[b, l, h, dk], 2), r(&[b, l, h, dv], 3));
        let (beta, decay) = (unit(r(&[b, l, h], 4)), unit(r(&[b, l, h], 5)));
        let state = r(&[b, h, dv, dk], 6);
        let x = DeltaInputs { q: &q, k: &k, v: &v, beta: &beta, decay: &decay, state: &state };
        let (want_y, want_state) = reference(&x);
        let (y, s, kept) = run(x, true).unwrap();
        let worst = |a: &Array, b: &Array| {
            let [a, b] = values([a, b]).unwrap();
            a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
        };
        assert!(worst(&y, &want_y) < 1e-5, "outputs differ by {}", worst(&y, &want_y));
        assert!(worst(&s, &want_state) < 1e-5, "states differ by {}", worst(&s, &want_state));
        assert_eq!(kept.len(), l as usize);
        assert!(worst(&kept[0], &state) == 0.0, "the first snapshot is the state before");
        let small = r(&[b, h, dv, dk - 1], 7);
        let x = DeltaInputs { state: &small, ..x };
        assert!(run(x, false).is_err(), "a state of the wrong shape was read");
    }
}
