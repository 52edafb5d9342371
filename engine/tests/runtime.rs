//! The runtime's policies (docs/runtime.md §1–§5) against faked model work — rungs whose chunks take a
//! known time — and one integration run on a real fixture model.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use perch_engine::error::Result;
use perch_engine::runtime::ladder::{LadderConfig, LadderState, RungWork, WarmupLadder};
use perch_engine::runtime::{Foreground, Gate, GatePermit, Leases, WarmupProfile};

/// Rungs whose every chunk and step takes `step`, logging what ran and when.
struct FakeRungs {
    step: Duration,
    log: Mutex<Vec<(Instant, String)>>,
    chunks: AtomicUsize,
    steps: AtomicUsize,
}

impl FakeRungs {
    fn new(step_ms: u64) -> Arc<FakeRungs> {
        Arc::new(FakeRungs {
            step: Duration::from_millis(step_ms),
            log: Mutex::new(vec![]),
            chunks: AtomicUsize::new(0),
            steps: AtomicUsize::new(0),
        })
    }

    fn record(&self, what: String) {
        self.log.lock().unwrap().push((Instant::now(), what));
    }

    fn events(&self) -> Vec<(Instant, String)> {
        self.log.lock().unwrap().clone()
    }
}

impl RungWork for FakeRungs {
    fn prefill_chunk(
        &self,
        rung: usize,
        start: usize,
        _len: usize,
    ) -> BoxFuture<'static, Result<()>> {
        self.chunks.fetch_add(1, Ordering::SeqCst);
        self.record(format!("chunk {rung}@{start}"));
        let step = self.step;
        Box::pin(async move {
            tokio::time::sleep(step).await;
            Ok(())
        })
    }

    fn decode_step(&self) -> BoxFuture<'static, Result<()>> {
        self.steps.fetch_add(1, Ordering::SeqCst);
        let step = self.step;
        Box::pin(async move {
            tokio::time::sleep(step).await;
            Ok(())
        })
    }

    fn end_rung(&self) -> BoxFuture<'static, ()> {
        self.record("end".into());
        Box::pin(async {})
    }
}

struct Setup {
    fg: Arc<Foreground>,
    gate: Arc<Gate>,
    leases: Arc<Leases>,
    work: Arc<FakeRungs>,
    ladder: Arc<WarmupLadder>,
}

/// Two rungs of two chunks each (chunk 100 tokens), 2 decode steps, `step_ms` per step.
fn setup(grace: Duration, step_ms: u64) -> Setup {
    setup_rungs(vec![200, 400], grace, step_ms)
}

/// `rungs` in chunks of 100 tokens, 2 decode steps, `step_ms` per step.
fn setup_rungs(rungs: Vec<usize>, grace: Duration, step_ms: u64) -> Setup {
    let cfg = LadderConfig {
        rungs,
        chunk: 100,
        decode_tokens: 2,
        idle_grace: grace,
        max_interruptions: 3,
        enabled: true,
    };
    Setup {
        fg: Arc::new(Foreground::new()),
        gate: Arc::new(Gate::new(8, 1)),
        leases: Leases::new(),
        work: FakeRungs::new(step_ms),
        ladder: WarmupLadder::new(cfg, "m", 4096),
    }
}

impl Setup {
    fn start(&self) -> tokio::task::JoinHandle<()> {
        let work: Arc<dyn RungWork> = self.work.clone();
        tokio::spawn(self.ladder.clone().run(
            work,
            "m".into(),
            self.fg.clone(),
            self.gate.clone(),
            self.leases.clone(),
        ))
    }

    async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    fn chunks(&self) -> usize {
        self.work.chunks.load(Ordering::SeqCst)
    }

    /// Rungs that began: took the gate and a lease (each ends with `end_rung`, also one that
    /// yielded before its first chunk).
    fn rungs_begun(&self) -> usize {
        self.work.events().iter().filter(|(_, e)| e == "end").count()
    }

    /// Held: no rung has started (not even one that yielded at once).
    fn held(&self) {
        let st = self.ladder.status();
        assert_eq!(self.rungs_begun(), 0, "a rung began while the ladder should hold");
        assert_eq!(
            (self.chunks(), st.interruptions, st.state),
            (0, 0, LadderState::Waiting),
            "the ladder did not hold"
        );
    }

    /// Until `n` prefill chunks have begun.
    async fn until_chunks(&self, n: usize) {
        within(async {
            while self.chunks() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    }
}

/// A request that was served (queued, then ended): what the grace is measured from.
fn served(fg: &Arc<Foreground>) {
    let mut user = fg.arrive();
    user.queue();
}

/// A user's turn at the gate, waiting behind whoever holds it.
async fn wait_for_turn(gate: &Gate) -> GatePermit {
    gate.enter().expect("the queue has room").wait().await
}

/// Every wait in these tests is bounded: a broken guard fails, it does not hang.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.expect("timed out")
}

#[tokio::test]
async fn a_genuinely_idle_fresh_engine_warms_every_rung_and_stamps_nothing() {
    let s = setup(Duration::from_secs(90), 2);
    within(s.start()).await.unwrap();
    let st = s.ladder.status();
    assert_eq!(st.state, LadderState::Done);
    assert_eq!(st.rungs_done, vec![200, 400]);
    assert_eq!(s.chunks(), 2 + 4);
    // Background work is invisible to the foreground figures.
    let fg = s.fg.snapshot();
    assert_eq!(
        (fg.requests_completed, fg.seconds_since_last_request, fg.seconds_since_last_arrival),
        (0, None, None)
    );
    assert_eq!(s.leases.total(), 0, "every rung's lease is released");
}

#[tokio::test]
async fn holds_while_a_request_is_generating() {
    let s = setup(Duration::from_secs(90), 2);
    let mut user = s.fg.arrive();
    user.queue();
    user.start();
    let run = s.start();
    s.settle().await;
    s.held();
    drop(user);
    // Now a request has completed: the 90 s grace applies, so it still holds.
    s.settle().await;
    s.held();
    run.abort();
}

/// With grace 0, the ladder holds while `user` is live and runs to the end once it ends.
async fn holds_until_the_request_ends(s: Setup, user: perch_engine::runtime::UserRequest) {
    let run = s.start();
    s.settle().await;
    s.held();
    drop(user);
    within(run).await.unwrap();
    assert_eq!(s.ladder.status().state, LadderState::Done);
}

#[tokio::test]
async fn holds_at_idle_grace_zero_while_a_request_is_live() {
    let s = setup(Duration::ZERO, 2);
    served(&s.fg); // one request already completed: grace 0 would admit at once
    let mut user = s.fg.arrive();
    user.queue();
    user.start();
    holds_until_the_request_ends(s, user).await;
}

#[tokio::test]
async fn holds_while_a_request_is_queued() {
    let s = setup(Duration::ZERO, 2);
    let mut user = s.fg.arrive();
    user.queue();
    holds_until_the_request_ends(s, user).await;
}

#[tokio::test]
async fn holds_between_a_requests_arrival_and_its_start() {
    let s = setup(Duration::ZERO, 2);
    let user = s.fg.arrive(); // parsing, tokenizing: not queued yet
    holds_until_the_request_ends(s, user).await;
}

#[tokio::test]
async fn the_next_rung_does_not_park_for_the_grace_again() {
    // A request completed 300 ms before the ladder may run; its rungs then run back to back.
    let s = setup(Duration::from_millis(300), 5);
    served(&s.fg);
    let t0 = Instant::now();
    within(s.start()).await.unwrap();
    let ev = s.work.events();
    let first = ev.iter().find(|(_, e)| e == "chunk 200@0").unwrap().0;
    let end_first = ev.iter().find(|(_, e)| e == "end").unwrap().0;
    let second = ev.iter().find(|(_, e)| e == "chunk 400@0").unwrap().0;
    assert!(first - t0 >= Duration::from_millis(300), "the first rung ignored the grace");
    let gap = second - end_first;
    println!("gap between rungs: {:.1} ms", gap.as_secs_f64() * 1e3);
    assert!(
        gap < Duration::from_millis(150),
        "the second rung parked for {gap:?}: a rung stamped the foreground"
    );
}

#[tokio::test]
async fn a_running_rung_yields_within_one_chunk() {
    let s = setup(Duration::ZERO, 40);
    let run = s.start();
    // Let the ladder get into its first rung, then a user arrives and queues for the gate.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(s.ladder.status().state, LadderState::Running);
    let before = s.chunks();
    let arrived = Instant::now();
    let mut user = s.fg.arrive();
    user.queue();
    let permit = within(wait_for_turn(&s.gate)).await;
    let waited = arrived.elapsed();
    user.start();
    println!(
        "user waited {:.0} ms for a warming rung (one chunk = 40 ms)",
        waited.as_secs_f64() * 1e3
    );
    assert!(waited <= Duration::from_millis(40 + 30), "waited {waited:?}, more than one chunk");
    assert_eq!(s.chunks(), before, "a chunk started after the user arrived");
    assert_eq!(s.ladder.status().interruptions, 1);
    drop(permit);
    drop(user);
    within(run).await.unwrap();
    assert_eq!(
        s.ladder.status().rungs_done,
        vec![200, 400],
        "the interrupted rung went back to the head of the queue"
    );
}

#[tokio::test]
async fn a_rung_interrupted_too_often_abandons_the_ladder() {
    let s = setup(Duration::ZERO, 30);
    let run = s.start();
    for _ in 0..3 {
        within(async {
            while s.ladder.status().state != LadderState::Running {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        let mut user = s.fg.arrive();
        user.queue();
        let p = within(wait_for_turn(&s.gate)).await;
        user.start();
        drop(p);
    }
    within(run).await.unwrap();
    let st = s.ladder.status();
    assert_eq!((st.state, st.interruptions), (LadderState::AbandonedBusy, 3));
}

#[test]
fn rungs_past_the_context_are_dropped_and_profiles_parse() {
    let l = WarmupLadder::new(LadderConfig::profile(WarmupProfile::Turbo), "m", 4000);
    assert_eq!(l.status().rungs_left, vec![512, 1024, 2048, 2560]);
    assert_eq!(
        WarmupLadder::new(LadderConfig::profile(WarmupProfile::Off), "m", 4000).status().state,
        LadderState::Disabled
    );
    assert!("warp".parse::<WarmupProfile>().unwrap_err().contains("`warp`"));
}

/// Wait until the ladder is in a rung with at least one chunk of it done.
async fn mid_rung(s: &Setup) {
    within(async {
        while s.ladder.status().state != LadderState::Running {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    // One chunk is 30 ms: 45 ms in, the rung has done work a user would make it lose.
    tokio::time::sleep(Duration::from_millis(45)).await;
}

/// A real turn: arrives, queues for the gate, generates, ends.
async fn turn(s: &Setup) {
    let mut user = s.fg.arrive();
    user.queue();
    let p = within(wait_for_turn(&s.gate)).await;
    user.start();
    drop(p);
}

#[tokio::test]
async fn the_interruption_cap_counts_per_rung() {
    let s = setup(Duration::ZERO, 30);
    let run = s.start();
    // Two interruptions of each rung (the cap is 3): each rung still gets warmed.
    for rung in [200, 400] {
        for _ in 0..2 {
            mid_rung(&s).await;
            turn(&s).await;
        }
        within(async {
            while !s.ladder.status().rungs_done.contains(&rung) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    }
    within(run).await.unwrap();
    let st = s.ladder.status();
    assert_eq!((st.state, st.interruptions), (LadderState::Done, 4));
}

#[tokio::test]
async fn arrivals_that_never_queue_do_not_count_as_interruptions() {
    let s = setup(Duration::ZERO, 30);
    let run = s.start();
    // Five bodies that fail to parse (or clients that leave before queueing), mid-rung: the
    // rung yields to each, but none is a turn that could abandon the ladder.
    for _ in 0..5 {
        mid_rung(&s).await;
        let arrival = s.fg.arrive();
        tokio::time::sleep(Duration::from_millis(40)).await;
        drop(arrival);
    }
    within(run).await.unwrap();
    let st = s.ladder.status();
    assert_eq!((st.state, st.interruptions, st.rungs_done), (LadderState::Done, 0, vec![200, 400]));
}

#[tokio::test]
async fn a_rung_yields_between_its_prefill_chunks() {
    // One rung of eight chunks: the user arrives during the second, far from the decode
    // steps, so only the check between chunks can stop it.
    let s = setup_rungs(vec![800], Duration::ZERO, 30);
    let run = s.start();
    s.until_chunks(2).await;
    let mut user = s.fg.arrive();
    user.queue();
    let permit = within(wait_for_turn(&s.gate)).await;
    user.start();
    assert_eq!(s.chunks(), 2, "the rung's prefill went on past the chunk in flight");
    assert_eq!(s.work.steps.load(Ordering::SeqCst), 0, "a decode step ran for a warmup");
    drop(permit);
    drop(user);
    within(run).await.unwrap();
    let st = s.ladder.status();
    assert_eq!((st.state, st.interruptions, st.rungs_done), (LadderState::Done, 1, vec![800]));
}

#[tokio::test]
async fn a_running_rung_yields_to_a_request_still_arriving() {
    // The request is still being read (never queued, it holds no gate): the rung must stop
    // at its next chunk boundary all the same, and stay stopped while the body is parsed.
    let s = setup_rungs(vec![800], Duration::ZERO, 30);
    let run = s.start();
    s.until_chunks(2).await;
    let arrival = s.fg.arrive();
    tokio::time::sleep(Duration::from_millis(150)).await; // five chunks' time
    assert_eq!(s.chunks(), 2, "the rung kept prefilling while a request was arriving");
    assert_eq!(s.ladder.status().state, LadderState::Waiting);
    drop(arrival); // it failed to parse: no turn, so no interruption counted
    within(run).await.unwrap();
    let st = s.ladder.status();
    assert_eq!((st.state, st.interruptions, st.rungs_done), (LadderState::Done, 0, vec![800]));
}
