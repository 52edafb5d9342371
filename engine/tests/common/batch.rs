//! Driving `decode::batch` directly, as the scheduler does: sequences joining at given steps,
//! cancelled at others, and greedy continuations of several prompts decoded together and
//! compared with a reference under teacher forcing (the batched twin of `greedy_departures`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use perch_engine::decode::batch::{step, Sequence};
use perch_engine::decode::TokenLogprob;
use perch_engine::{GenerateParams, Generation, LoadedModel};

use super::Departure;

/// One sequence of a batch test: its prompt, settings, the step it joins at, and the step
/// its client cancels at.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub joins_at: usize,
    pub cancel_at: Option<usize>,
}

/// Run `jobs` through `decode::batch` with `budget` tokens a step, joining and cancelling as
/// each says: each one's generation and the text its callback saw.
pub fn run_batch(model: &LoadedModel, jobs: &[Job], budget: usize) -> Vec<(Generation, String)> {
    let texts: Vec<Arc<Mutex<String>>> = jobs.iter().map(|_| Arc::default()).collect();
    let cancels: Vec<Arc<AtomicBool>> = jobs.iter().map(|_| Arc::default()).collect();
    let mut seqs: Vec<Option<Sequence>> = jobs.iter().map(|_| None).collect();
    let mut done: Vec<Option<Generation>> = jobs.iter().map(|_| None).collect();
    for n in 0..100_000 {
        for (i, job) in jobs.iter().enumerate() {
            if job.joins_at == n {
                let text = texts[i].clone();
                let on_piece =
                    Box::new(move |t: &str, _: &[TokenLogprob]| text.lock().unwrap().push_str(t));
                let s = Sequence::new(
                    model,
                    job.prompt.clone(),
                    job.params.clone(),
                    None,
                    cancels[i].clone(),
                    on_piece,
                );
                seqs[i] = Some(s.unwrap());
            }
            if job.cancel_at == Some(n) {
                cancels[i].store(true, Ordering::Relaxed);
            }
        }
        let mut live: Vec<&mut Sequence> = seqs.iter_mut().flatten().collect();
        if !live.is_empty() {
            step(model, &mut live, budget).unwrap();
        }
        for i in 0..jobs.len() {
            if seqs[i].as_ref().is_some_and(|s| s.ended()) {
                let (g, _, _) = seqs[i].take().unwrap().finish();
                done[i] = Some(g.unwrap());
            }
        }
        if done.iter().all(Option::is_some) {
            let texts = texts.iter().map(|t| t.lock().unwrap().clone());
            return done.into_iter().map(Option::unwrap).zip(texts).collect();
        }
    }
    panic!("the batch never finished");
}

/// Greedy continuations of `prompts` (`lens[i]` tokens each, EOS ignored) decoded together in
/// one batch, one sequence joining per step so that prompts are prefilled between the
/// others' decode steps, `budget` tokens a step as the scheduler feeds them.
pub fn batch_greedy(
    model: &LoadedModel,
    prompts: &[Vec<u32>],
    lens: &[usize],
    budget: usize,
) -> Vec<Vec<u32>> {
    let jobs: Vec<Job> = prompts
        .iter()
        .zip(lens)
        .enumerate()
        .map(|(i, (p, &n))| Job {
            prompt: p.clone(),
            params: GenerateParams { max_tokens: n, ignore_eos: true, ..Default::default() },
            joins_at: i,
            cancel_at: None,
        })
        .collect();
    run_batch(model, &jobs, budget).into_iter().map(|(g, _)| g.tokens).collect()
}

/// `greedy_departures` for several prompts decoded together: each prompt's continuation,
/// decoded in a batch, compared with `references[i]`; at a departure that sequence restarts
/// from `prompt + reference[..=at]` in the next batch (with every other one still departing),
/// so each position is compared on the reference's own context.
pub fn batched_departures(
    model: &LoadedModel,
    prompts: &[Vec<u32>],
    references: &[Vec<u32>],
    budget: usize,
) -> Vec<Vec<Departure>> {
    let mut departures: Vec<Vec<Departure>> = prompts.iter().map(|_| vec![]).collect();
    let mut from = vec![0; prompts.len()];
    let mut live: Vec<usize> = (0..prompts.len()).filter(|&i| !references[i].is_empty()).collect();
    while !live.is_empty() {
        let contexts: Vec<Vec<u32>> =
            live.iter().map(|&i| [&prompts[i][..], &references[i][..from[i]]].concat()).collect();
        let lens: Vec<usize> = live.iter().map(|&i| references[i].len() - from[i]).collect();
        let ours = batch_greedy(model, &contexts, &lens, budget);
        let mut next = vec![];
        for (&i, got) in live.iter().zip(&ours) {
            let theirs = &references[i][from[i]..];
            if let Some(k) = got.iter().zip(theirs).position(|(a, b)| a != b) {
                departures[i].push(Departure { at: from[i] + k, ours: got[k], theirs: theirs[k] });
                from[i] += k + 1;
                if from[i] < references[i].len() {
                    next.push(i);
                }
            }
        }
        live = next;
    }
    departures
}
