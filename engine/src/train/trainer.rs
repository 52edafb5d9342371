//! The training state that lives on the MLX thread: the adapter's parameters, AdamW's moments,
//! the data and where the run is in it. A window asks it for a few batches of work; it never
//! touches the base weights.

use std::rc::Rc;

use mlx_rs::builder::Builder;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::optimizers::{AdamW, AdamWBuilder, Optimizer};
use mlx_rs::transforms::{eval, value_and_grad_with_argnums};
use mlx_rs::{Array, Dtype};

use super::data::{shuffle, Sample};
use crate::error::{EngineError, Result};
use crate::model::lora::{Lora, LoraSpec, ProjectionDims, Target};
use crate::model::{Architecture, LoadedModel};

/// What a run trains and how.
#[derive(Debug, Clone)]
pub struct TrainSetup {
    pub lora: LoraSpec,
    pub train: Vec<Sample>,
    pub eval: Vec<Sample>,
    pub epochs: usize,
    pub batch_size: usize,
    pub learning_rate: f32,
    pub weight_decay: f32,
    pub seed: u64,
}

/// Where the run is: a baseline eval, then each epoch's training followed by its eval.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Eval { epoch: usize, at: usize },
    Train { epoch: usize, at: usize },
    Done,
}

/// What one window's work did.
#[derive(Debug, Default, Clone)]
pub struct WorkReport {
    /// (loss, target tokens) of each training batch.
    pub batches: Vec<(f32, usize)>,
    /// An epoch's eval finished: (epoch, mean eval loss); epoch 0 is the untrained baseline.
    pub eval: Option<(usize, Option<f32>)>,
    /// An epoch's training finished: (epoch, mean train loss).
    pub epoch_trained: Option<(usize, f32)>,
    pub finished: bool,
}

pub struct Trainer {
    pub model: String,
    setup: TrainSetup,
    dims: ProjectionDims,
    slots: Vec<(usize, Target)>,
    params: Vec<Array>,
    keys: Vec<Rc<str>>,
    opt: AdamW,
    order: Vec<usize>,
    phase: Phase,
    /// Running sums for the phase in progress: (loss · tokens, tokens).
    sums: (f64, usize),
}

impl Trainer {
    pub fn new(model: &LoadedModel, setup: TrainSetup) -> Result<Trainer> {
        let dims = model.net.projection_dims();
        let slots = setup.lora.slots(&dims)?;
        let params = Lora::init_params(&setup.lora, &dims, &slots, setup.seed)?;
        let keys = (0..params.len()).map(|i| Rc::from(format!("p{i}"))).collect();
        let opt = AdamWBuilder::new(setup.learning_rate)
            .weight_decay(setup.weight_decay)
            .build()
            .map_err(|e| EngineError::Internal(format!("{e:?}")))?;
        let order = (0..setup.train.len()).collect();
        Ok(Trainer {
            model: model.id.clone(),
            dims,
            slots,
            params,
            keys,
            opt,
            order,
            phase: Phase::Eval { epoch: 0, at: 0 },
            sums: (0.0, 0),
            setup,
        })
    }

    pub fn finished(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Up to `batches` batches of whatever comes next (training or eval).
    pub fn work(
        &mut self,
        model: &LoadedModel,
        batches: usize,
        cancel: &dyn Fn() -> bool,
    ) -> Result<WorkReport> {
        let mut report = WorkReport::default();
        let bs = self.setup.batch_size;
        for _ in 0..batches {
            if cancel() {
                break;
            }
            match self.phase {
                Phase::Done => break,
                Phase::Eval { epoch, at } => {
                    let end = (at + bs).min(self.setup.eval.len());
                    if at < end {
                        let batch: Vec<&Sample> = self.setup.eval[at..end].iter().collect();
                        let (loss, n) = self.eval_batch(model.net.as_ref(), &batch)?;
                        self.sums = (self.sums.0 + loss as f64 * n as f64, self.sums.1 + n);
                    }
                    if end >= self.setup.eval.len() {
                        let mean =
                            (self.sums.1 > 0).then(|| (self.sums.0 / self.sums.1 as f64) as f32);
                        report.eval = Some((epoch, mean));
                        self.sums = (0.0, 0);
                        self.phase = if epoch >= self.setup.epochs {
                            Phase::Done
                        } else {
                            self.start_epoch(epoch + 1)
                        };
                        // One eval per window: its result is reported before more work starts.
                        break;
                    }
                    self.phase = Phase::Eval { epoch, at: end };
                }
                Phase::Train { epoch, at } => {
                    let end = (at + bs).min(self.order.len());
                    let batch: Vec<&Sample> =
                        self.order[at..end].iter().map(|&i| &self.setup.train[i]).collect();
                    let arrays = batch_arrays(&batch)?;
                    let (loss, n) = self.train_batch(model.net.as_ref(), arrays)?;
                    report.batches.push((loss, n));
                    self.sums = (self.sums.0 + loss as f64 * n as f64, self.sums.1 + n);
                    if end >= self.order.len() {
                        report.epoch_trained =
                            Some((epoch, (self.sums.0 / self.sums.1.max(1) as f64) as f32));
                        self.sums = (0.0, 0);
                        self.phase = Phase::Eval { epoch, at: 0 };
                    } else {
                        self.phase = Phase::Train { epoch, at: end };
                    }
                }
            }
        }
        report.finished = self.finished();
        Ok(report)
    }

    fn start_epoch(&mut self, epoch: usize) -> Phase {
        shuffle(&mut self.order, self.setup.seed.wrapping_add(epoch as u64));
        Phase::Train { epoch, at: 0 }
    }

    fn train_batch(
        &mut self,
        net: &dyn Architecture,
        (inputs, targets, mask, n): BatchArrays,
    ) -> Result<(f32, usize)> {
        let (spec, dims, slots) = (&self.setup.lora, &self.dims, &self.slots);
        let loss_fn =
            |params: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
                let lora = Lora::from_params(spec, dims, slots, params);
                masked_loss(net, Some(&lora), &inputs, &targets, &mask)
                    .map(|l| vec![l])
                    .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))
            };
        let argnums: Vec<i32> = (0..self.params.len() as i32).collect();
        let mut step = value_and_grad_with_argnums(loss_fn, &argnums[..]);
        let (values, grads) = step(&self.params)?;
        for ((key, grad), param) in self.keys.iter().zip(&grads).zip(self.params.iter_mut()) {
            self.opt.update_single(key, grad, param)?;
        }
        let state = self.opt.state.values().flat_map(|(m, v)| [m, v]);
        eval(self.params.iter().chain(state).chain(values.iter()))?;
        Ok((values[0].item_cast::<f32>(), n))
    }

    fn eval_batch(&self, net: &dyn Architecture, batch: &[&Sample]) -> Result<(f32, usize)> {
        let (inputs, targets, mask, n) = batch_arrays(batch)?;
        let lora = Lora::from_params(&self.setup.lora, &self.dims, &self.slots, &self.params);
        let loss = masked_loss(net, Some(&lora), &inputs, &targets, &mask)?;
        eval([&loss])?;
        Ok((loss.item_cast::<f32>(), n))
    }

    /// Save the adapter as it is now.
    pub fn save(&self, dir: &std::path::Path, meta: serde_json::Value) -> Result<()> {
        Lora::save(dir, &self.setup.lora, &self.dims, &self.slots, &self.params, meta)
    }
}

/// Inputs, targets and loss mask of a padded batch ([B, L−1] each) and its target count.
type BatchArrays = (Array, Array, Array, usize);

fn batch_arrays(batch: &[&Sample]) -> Result<BatchArrays> {
    let len = batch.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
    if len < 2 {
        return Err(EngineError::InvalidRequest(
            "a training sample needs at least two tokens".into(),
        ));
    }
    let (b, l) = (batch.len(), len - 1);
    let mut inputs = vec![0i32; b * l];
    let mut targets = vec![0i32; b * l];
    let mut mask = vec![0f32; b * l];
    let mut n = 0;
    for (r, s) in batch.iter().enumerate() {
        for i in 0..s.tokens.len() - 1 {
            inputs[r * l + i] = s.tokens[i] as i32;
            targets[r * l + i] = s.tokens[i + 1] as i32;
            if s.loss[i + 1] {
                mask[r * l + i] = 1.0;
                n += 1;
            }
        }
    }
    let shape = [b as i32, l as i32];
    Ok((
        Array::from_slice(&inputs, &shape),
        Array::from_slice(&targets, &shape),
        Array::from_slice(&mask, &shape),
        n,
    ))
}

/// Mean cross-entropy over the masked targets: logsumexp(logits) − logit of the target.
pub fn masked_loss(
    net: &dyn Architecture,
    lora: Option<&Lora>,
    inputs: &Array,
    targets: &Array,
    mask: &Array,
) -> Result<Array> {
    // Gradients flow through MLX's graph only: no host products (model/host_matrix.rs).
    let _graph = crate::model::host_matrix::graph_only();
    let mut caches = net.new_caches();
    let h = net.hidden_with(inputs, &mut caches, lora)?;
    let logits = net.graph_logits(&h)?.as_dtype(Dtype::Float32)?;
    let lse = logits.logsumexp_axis(-1, false)?;
    let picked = logits.take_along_axis(targets.expand_dims(-1)?, -1)?;
    let picked = picked.index((.., .., 0));
    let ce = lse.subtract(picked)?.multiply(mask)?;
    Ok(ce.sum(None)?.divide(mlx_rs::ops::maximum(mask.sum(None)?, Array::from_f32(1.0))?)?)
}
