//! The runtime on a real fixture model: the warmup ladder yielding to a user request, leases
//! holding off eviction and unload, the timed drain, keep-alive.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use perch_engine::decode::Generation;
use perch_engine::runtime::{
    Arrival, Engine, EngineConfig, KeepAlive, LadderConfig, LadderState, Prompt, Turn,
    WarmupProfile,
};

fn config(ladder: LadderConfig) -> EngineConfig {
    EngineConfig { ladder, ..engine_config(&fixtures_models(), "qwen3") }
}

/// These tests time things and each runs its own engine: one at a time, so they do not
/// compete for the two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A user turn of exactly `max_tokens` tokens after `prompt`: its generation and its time to
/// first token from arrival.
async fn request(
    engine: &Arc<Engine>,
    model: &str,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (Generation, Duration) {
    let turn = Turn {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Turn::new(model.parse().unwrap(), Prompt::Tokens(prompt))
    };
    let end = Arrival::now(engine).run(turn).await.unwrap();
    (end.generation, end.ttft)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_request_waits_at_most_one_warming_chunk() {
    let _serial = SERIAL.lock().await;
    // A full-attention model, and the hybrid whose rungs run its recurrent layers.
    for name in ["qwen3", HYBRID_FIXTURE] {
        waits_at_most_one_warming_chunk(name).await;
    }
}

async fn waits_at_most_one_warming_chunk(name: &str) {
    // Long rungs in small chunks on the fixture, so a request surely lands mid-rung.
    let ladder = LadderConfig {
        rungs: vec![1536, 1900],
        chunk: 128,
        decode_tokens: 4,
        idle_grace: Duration::ZERO,
        max_interruptions: 8,
        enabled: true,
    };
    let cfg = EngineConfig { model: name.into(), ..config(ladder.clone()) };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    let prompt: Vec<u32> = golden(name).prompt_ids;
    // Baseline on a quiet engine first (ladder not started yet), and the time of one chunk
    // at the rung's depth: a 128-token prompt after 1400 cached... approximated by a
    // 1536-token prefill / 12 chunks.
    let mut quiet = Duration::MAX;
    for _ in 0..3 {
        quiet = quiet.min(request(&engine, name, prompt.clone(), 1).await.1);
    }
    let long: Vec<u32> = prompt.iter().copied().cycle().take(1536).collect();
    let (g, _) = request(&engine, name, long, 1).await;
    let chunk = g.ttft / 12;
    engine.start_background();
    while engine.ladder_status().state != LadderState::Running {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(chunk / 2).await;
    let (_, busy) = request(&engine, name, prompt.clone(), 1).await;
    let st = engine.ladder_status();
    println!(
        "{name}: TTFT quiet {:.1} ms, during a rung {:.1} ms; one chunk ~{:.1} ms; ladder {:?}, {} interruption(s)",
        quiet.as_secs_f64() * 1e3,
        busy.as_secs_f64() * 1e3,
        chunk.as_secs_f64() * 1e3,
        st.state,
        st.interruptions
    );
    assert!(st.interruptions >= 1, "the request did not interrupt the rung");
    assert!(
        busy <= quiet + chunk * 2 + Duration::from_millis(50),
        "TTFT {busy:?} vs quiet {quiet:?}: delayed by more than a chunk ({chunk:?})"
    );
    // The ladder resumes and finishes afterwards, and never counted as a user.
    let t = Instant::now();
    while engine.ladder_status().state != LadderState::Done {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "ladder stuck: {:?}",
            engine.ladder_status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.foreground.snapshot().requests_completed, 5);
    assert_eq!(engine.leases.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_and_unload_wait_for_leases_and_the_drain_is_timed() {
    let _serial = SERIAL.lock().await;
    let engine =
        Arc::new(Engine::start(config(LadderConfig::profile(WarmupProfile::Off))).unwrap());
    let held = engine.lease_model("qwen3").await.unwrap();
    // Loading another model (one resident at most) must wait for qwen3's lease.
    let load = tokio::spawn({
        let engine = engine.clone();
        async move { engine.lease_model("llama").await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!load.is_finished(), "evicted a leased model");
    assert_eq!(engine.resident_ids(), vec!["qwen3".to_string()]);
    // The timed drain gives up while the lease is held.
    let t = Instant::now();
    assert!(!engine.drain(Duration::from_millis(100)).await);
    assert!(t.elapsed() < Duration::from_millis(500));
    drop(held);
    tokio::time::timeout(Duration::from_secs(10), load).await.unwrap().unwrap().unwrap();
    assert_eq!(engine.resident_ids(), vec!["llama".to_string()]);
    // A generation on the newly loaded model works.
    let (g, _) = request(&engine, "llama", golden("llama").prompt_ids, 4).await;
    assert_eq!(g.tokens, golden("llama").greedy_tokens[..4].to_vec());
    // An explicit unload waits for a lease too.
    let held = engine.lease_model("llama").await.unwrap();
    let unload = tokio::spawn({
        let engine = engine.clone();
        async move { engine.unload("llama").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!unload.is_finished());
    drop(held);
    tokio::time::timeout(Duration::from_secs(5), unload).await.unwrap().unwrap().unwrap();
    assert!(engine.resident_ids().is_empty());
    assert!(engine.drain(Duration::from_millis(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_zero_unloads_after_each_request_and_reloads_on_demand() {
    let _serial = SERIAL.lock().await;
    let cfg = EngineConfig {
        keep_alive: KeepAlive::UnloadWhenIdle,
        ..config(LadderConfig::profile(WarmupProfile::Off))
    };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    engine.start_background();
    let g = golden("qwen3");
    let (a, _) = request(&engine, "qwen3", g.prompt_ids.clone(), 4).await;
    let t = Instant::now();
    while !engine.resident_ids().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(3), "not unloaded after the request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (b, _) = request(&engine, "qwen3", g.prompt_ids.clone(), 4).await;
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(KeepAlive::from_secs(-1), KeepAlive::Forever);
    assert_eq!(KeepAlive::from_secs(90), KeepAlive::For(Duration::from_secs(90)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_time_mtp_warmup_warms_or_leaves_it_to_the_first_request() {
    let _serial = SERIAL.lock().await;
    use perch_engine::runtime::warmup::WarmupOutcome;
    // The trained Qwen 3 head, and the hybrid's native head over its recurrent layers.
    for name in [MTP_FIXTURE, HYBRID_FIXTURE] {
        let cfg =
            // One at a time: MTP drafts are a solo engine's (a batch decodes without them).
            |ladder| EngineConfig {
                model: name.into(),
                draft: perch_engine::decode::DraftSetting::Mtp { depth: 1 },
                max_batch: 1,
                ..config(ladder)
            };
        let wait_for = |engine: Arc<Engine>| async move {
            let t = Instant::now();
            loop {
                let m = engine.resident_snapshot().remove(0);
                if m.load_time_warmup != WarmupOutcome::NotApplicable {
                    return m;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "warmup never ended");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        // Free gate: warm at load, and the warmup's lease is gone afterwards.
        let engine =
            Arc::new(Engine::start(cfg(LadderConfig::profile(WarmupProfile::Off))).unwrap());
        engine.start_background();
        let m = wait_for(engine.clone()).await;
        assert_eq!((m.load_time_warmup, m.mtp_warm), (WarmupOutcome::Warm, true));
        assert_eq!(engine.leases.total(), 0);
        assert_eq!(
            engine.foreground.snapshot().requests_completed,
            0,
            "the warmup counted as a user"
        );

        // Busy gate: skipped, still cold; the first real MTP request warms it.
        let engine =
            Arc::new(Engine::start(cfg(LadderConfig::profile(WarmupProfile::Off))).unwrap());
        let user = engine.gate.try_acquire().unwrap();
        engine.start_background();
        let m = wait_for(engine.clone()).await;
        assert_eq!((m.load_time_warmup, m.mtp_warm), (WarmupOutcome::SkippedBusy, false));
        drop(user);
        let prompt = golden(name).prompt_ids;
        let (g, _) = request(&engine, name, prompt, 8).await;
        assert_eq!(g.draft.unwrap().mode, "mtp");
        assert!(
            engine.resident_snapshot()[0].mtp_warm,
            "the first MTP request did not mark the model warm"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_finishes_for_the_engine_when_its_client_leaves() {
    use perch_engine::runtime::warmup::WarmupOutcome;
    let _serial = SERIAL.lock().await;
    let ladder = LadderConfig {
        idle_grace: Duration::ZERO,
        ..LadderConfig::profile(WarmupProfile::Default)
    };
    let cfg = EngineConfig {
        draft: perch_engine::decode::DraftSetting::Mtp { depth: 1 },
        ..config(ladder)
    };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    engine.start_background();
    // Hold the MLX thread, so the load below waits there, surely in progress.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let busy = engine.mlx.submit(move |_| Ok(held.recv().ok())).unwrap();
    // A client asks for the MTP model (not loaded) and hangs up while it loads.
    let turn = Turn {
        max_tokens: Some(4),
        ..Turn::new(MTP_FIXTURE.parse().unwrap(), Prompt::Tokens(golden(MTP_FIXTURE).prompt_ids))
    };
    let client = tokio::spawn(Arrival::now(&engine).run(turn));
    let t = Instant::now();
    while !engine.loading().contains(&MTP_FIXTURE.to_string()) {
        assert!(t.elapsed() < Duration::from_secs(10), "the load never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    release.send(()).unwrap();
    busy.await.unwrap().unwrap();
    // The engine still publishes the model, runs its load-time warmup to an outcome and starts
    // its ladder; nothing is left leased.
    loop {
        let m = engine.resident_snapshot().into_iter().find(|m| m.id == MTP_FIXTURE);
        let ladder = engine.ladder_status();
        if let Some(m) = m.filter(|m| m.load_time_warmup != WarmupOutcome::NotApplicable) {
            if ladder.model.as_deref() == Some(MTP_FIXTURE) && ladder.state != LadderState::Idle {
                assert_eq!(m.load_time_warmup, WarmupOutcome::Warm, "{m:?}");
                break;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "not published and warmed: {:?} {ladder:?}",
            engine.resident_snapshot()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(engine.loading().is_empty());
    engine.stop_background();
    assert!(engine.leases.drain(None, Duration::from_secs(10)).await, "a lease leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_being_evicted_gives_no_new_leases() {
    let _serial = SERIAL.lock().await;
    let engine =
        Arc::new(Engine::start(config(LadderConfig::profile(WarmupProfile::Off))).unwrap());
    engine.start_background();
    // A turn on qwen3 is in flight while another asks for the MTP model (one resident at a
    // time): qwen3 is evicted once that turn ends.
    let in_flight = engine.lease_if_resident("qwen3").unwrap();
    let loader = {
        let e = engine.clone();
        tokio::spawn(async move { e.lease_model(MTP_FIXTURE).await })
    };
    let t = Instant::now();
    while !engine.resident_snapshot().iter().any(|m| m.id == "qwen3" && m.unloading) {
        assert!(t.elapsed() < Duration::from_secs(10), "the eviction never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Meanwhile: no new lease on the model being evicted (it would be gone when used) ...
    assert!(engine.lease_if_resident("qwen3").is_none(), "a model being unloaded gave a lease");
    // ... and a turn for it waits, then gets it loaded back.
    let prompt = golden("qwen3").prompt_ids;
    let again = {
        let e = engine.clone();
        tokio::spawn(async move { request(&e, "qwen3", prompt, 4).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(in_flight);
    drop(loader.await.unwrap().unwrap());
    let (g, _) = again.await.unwrap();
    assert_eq!(g.tokens.len(), 4);
    assert_eq!(engine.resident_ids(), ["qwen3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_time_warmup_holds_a_lease_and_its_kill_switch_stops_it() {
    use perch_engine::runtime::warmup::WarmupOutcome;
    let _serial = SERIAL.lock().await;
    let cfg = |load_warmup| EngineConfig {
        model: MTP_FIXTURE.into(),
        draft: perch_engine::decode::DraftSetting::Mtp { depth: 1 },
        load_warmup,
        ..config(LadderConfig::profile(WarmupProfile::Off))
    };
    let outcome = |e: &Engine| e.resident_snapshot()[0].load_time_warmup;
    // The warmup pins its model: hold the MLX thread so it is surely mid-warmup.
    let engine = Arc::new(Engine::start(cfg(true)).unwrap());
    let (release, held) = std::sync::mpsc::channel::<()>();
    let busy = engine.mlx.submit(move |_| Ok(held.recv().ok())).unwrap();
    engine.start_background();
    let t = Instant::now();
    while !engine.gate.snapshot().busy {
        assert!(t.elapsed() < Duration::from_secs(10), "the warmup never took the gate");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(engine.leases.count(MTP_FIXTURE), 1, "the warmup runs without a lease");
    release.send(()).unwrap();
    busy.await.unwrap().unwrap();
    while outcome(&engine) == WarmupOutcome::NotApplicable {
        assert!(t.elapsed() < Duration::from_secs(10), "the warmup never ended");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(outcome(&engine), WarmupOutcome::Warm);
    assert_eq!(engine.leases.count(MTP_FIXTURE), 0);
    // The kill switch: no warmup at all, the model stays cold.
    let engine = Arc::new(Engine::start(cfg(false)).unwrap());
    engine.start_background();
    let t = Instant::now();
    while outcome(&engine) == WarmupOutcome::NotApplicable {
        assert!(t.elapsed() < Duration::from_secs(10), "no outcome recorded");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let m = engine.resident_snapshot().remove(0);
    assert_eq!((m.load_time_warmup, m.mtp_warm), (WarmupOutcome::Disabled, false));
}

/// Bounded waits: a broken rule fails here with `what`, it does not hang the test.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.unwrap_or_else(|_| panic!("{what}"))
}

/// Hold the MLX thread until the sender is used (or dropped): what a long job does. With
/// `first`, returns once the hold is running (the thread was idle), so `MlxThread::pending`
/// then counts only the jobs queued behind it; otherwise once it is queued.
async fn hold_mlx(
    engine: &Engine,
    first: bool,
) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = running.clone();
    let job = engine
        .mlx
        .submit(move |_| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(held.recv().ok())
        })
        .unwrap();
    if first {
        until("the hold never ran", || running.load(std::sync::atomic::Ordering::SeqCst)).await;
    }
    (release, tokio::spawn(async move { job.await.unwrap().unwrap().unwrap_or_default() }))
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_time_warmup_past_its_deadline_is_cancelled_and_the_load_goes_on() {
    use perch_engine::runtime::warmup::WarmupOutcome;
    let _serial = SERIAL.lock().await;
    let deadline = Duration::from_millis(300);
    let cfg = EngineConfig {
        draft: perch_engine::decode::DraftSetting::Mtp { depth: 1 },
        max_resident: 2,
        warmup_deadline: deadline,
        ..config(LadderConfig::profile(WarmupProfile::Off))
    };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    engine.start_background();
    let outcome = |e: &Engine| {
        e.resident_snapshot().into_iter().find(|m| m.id == MTP_FIXTURE).map(|m| m.load_time_warmup)
    };
    // The MTP model's load queues behind a held MLX thread...
    let (release_first, first) = hold_mlx(&engine, true).await;
    let loader = {
        let e = engine.clone();
        tokio::spawn(async move { e.lease_model(MTP_FIXTURE).await })
    };
    until("the load never queued", || engine.mlx.pending() >= 1).await;
    // ...and a second hold queues behind the load, so its warmup cannot run before the
    // deadline passes.
    let (release_second, second) = hold_mlx(&engine, false).await;
    // A second request for the model waits on the load lock meanwhile.
    let waiter = {
        let e = engine.clone();
        tokio::spawn(async move { e.lease_model(MTP_FIXTURE).await })
    };
    let loads = || engine.loading().iter().filter(|m| *m == MTP_FIXTURE).count();
    until("the second request never waited for the load", || loads() == 2).await;
    release_first.send(()).unwrap();
    first.await.unwrap();
    // The load publishes and lets go of the load lock before its warmup: the second request
    // has its lease while the warmup is still waiting.
    let early = within("the second request waited for the warmup", waiter).await.unwrap().unwrap();
    assert_eq!(outcome(&engine), Some(WarmupOutcome::NotApplicable), "the warmup already ended");
    // The deadline passes: the warmup is cancelled and the load finishes all the same, while
    // the MLX thread is still held (the load did not wait for the warmup's work).
    let t = Instant::now();
    let lease = within("the load hung on its warmup", loader).await.unwrap().unwrap();
    println!(
        "the load ended {:.0} ms after the model was published",
        t.elapsed().as_secs_f64() * 1e3
    );
    assert!(!second.is_finished(), "the MLX thread was released before the load ended");
    let m = engine.resident_snapshot().into_iter().find(|m| m.id == MTP_FIXTURE).unwrap();
    assert_eq!((m.load_time_warmup, m.mtp_warm), (WarmupOutcome::TimedOut, false));
    assert!(
        engine.gate.snapshot().waiting == 0 && !engine.gate.snapshot().busy,
        "the gate is held"
    );
    drop((lease, early));
    release_second.send(()).unwrap();
    second.await.unwrap();
    // The cancelled warmup stops when the thread reaches it; the model serves, nothing leaks.
    let (g, _) = request(&engine, MTP_FIXTURE, golden(MTP_FIXTURE).prompt_ids, 4).await;
    assert_eq!(g.tokens.len(), 4);
    engine.stop_background();
    assert!(engine.leases.drain(None, Duration::from_secs(10)).await, "a lease leaked");
}

/// What an observer heard of each turn's end.
#[derive(Default, Clone)]
struct Recorder(Arc<std::sync::Mutex<Vec<perch_engine::runtime::TurnFinish>>>);

struct Mark(Recorder);

impl perch_engine::runtime::TurnMark for Mark {
    fn finish(self: Box<Self>, f: perch_engine::runtime::TurnFinish) {
        self.0 .0.lock().unwrap().push(f);
    }
}

impl perch_engine::runtime::TurnObserver for Recorder {
    fn turn_begin(&self) -> Box<dyn perch_engine::runtime::TurnMark> {
        Box::new(Mark(self.clone()))
    }
    fn stop(&self, _: Option<&str>, _: &str) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_hears_each_turn_s_tokens_prefill_end_and_mode() {
    use perch_engine::decode::DraftMode;
    use perch_engine::runtime::{DecodeMode, DraftChoice};
    let _serial = SERIAL.lock().await;
    // One at a time, so a turn may draft (lookup); the batch's turns are plain or guided.
    let cfg = EngineConfig { max_batch: 1, ..config(LadderConfig::profile(WarmupProfile::Off)) };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    let recorder = Recorder::default();
    engine.set_observer(Arc::new(recorder.clone()));
    let prompt = golden("qwen3").prompt_ids;
    let turn = |f: fn(Turn) -> Turn| {
        f(Turn {
            max_tokens: Some(9),
            ignore_eos: true,
            ..Turn::new("qwen3".parse().unwrap(), Prompt::Tokens(prompt.clone()))
        })
    };
    let plain = turn(|t| t);
    let guided = turn(|t| Turn { logprobs: Some(2), ..t });
    let lookup = turn(|t| Turn { draft: DraftChoice::Use(DraftMode::lookup()), ..t });
    let mut ends = vec![];
    for t in [plain, guided, lookup] {
        ends.push(Arrival::now(&engine).run(t).await.unwrap().generation);
    }
    let heard = recorder.0.lock().unwrap().clone();
    assert_eq!(heard.len(), 3);
    for ((f, g), mode) in
        heard.iter().zip(&ends).zip([DecodeMode::Plain, DecodeMode::Guided, DecodeMode::Lookup])
    {
        assert_eq!(f.tokens_after_first, g.tokens.len() - 1, "decode steps");
        assert_eq!(f.prefill, g.ttft, "the prefill is the generation's time to its first token");
        assert_eq!(f.at, g.finished_at, "the end is stamped where the last token was made");
        assert_eq!(f.mode, mode, "{:?}", g.draft);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_spares_a_model_used_while_its_unload_waited_for_the_load_lock() {
    let _serial = SERIAL.lock().await;
    // Long enough that the load and its warmup after the use cannot reach it on a slow machine.
    let keep = Duration::from_secs(4);
    let cfg = EngineConfig {
        max_resident: 2,
        keep_alive: KeepAlive::For(keep),
        ..config(LadderConfig::profile(WarmupProfile::Off))
    };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    engine.start_background();
    // A load holds the load lock for as long as the MLX thread is held.
    let (release, held) = hold_mlx(&engine, true).await;
    let loader = {
        let e = engine.clone();
        tokio::spawn(async move { e.lease_model(MTP_FIXTURE).await })
    };
    until("the load never queued", || engine.mlx.pending() >= 1).await;
    // qwen3 goes idle past its keep-alive; the reaper finds it so and waits for the lock.
    tokio::time::sleep(keep + Duration::from_millis(700)).await;
    assert!(engine.resident_ids().contains(&"qwen3".to_string()));
    // Then a request uses it.
    drop(engine.lease_if_resident("qwen3").expect("qwen3 gives a lease"));
    release.send(()).unwrap();
    held.await.unwrap();
    drop(within("the load never ended", loader).await.unwrap().unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let q = engine.resident_snapshot().into_iter().find(|m| m.id == "qwen3");
    assert!(
        q.is_some_and(|m| !m.unloading),
        "a model used {:?} ago was unloaded by a keep-alive of {keep:?}",
        Duration::from_millis(300)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_waiting_for_leases_does_not_hold_other_unloads() {
    let _serial = SERIAL.lock().await;
    let cfg = EngineConfig { max_resident: 2, ..config(LadderConfig::profile(WarmupProfile::Off)) };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    engine.start_background();
    // qwen3 is in use by a long turn and is the least recently used; llama is idle.
    let held = engine.lease_model("qwen3").await.unwrap();
    drop(engine.lease_model("llama").await.unwrap());
    let loader = {
        let e = engine.clone();
        tokio::spawn(async move { e.lease_model(MTP_FIXTURE).await })
    };
    until("the eviction never started", || {
        engine.resident_snapshot().iter().any(|m| m.id == "qwen3" && m.unloading)
    })
    .await;
    // While the eviction waits for qwen3's turn, unloading llama goes ahead.
    within("an unload waited for an eviction's leases", engine.unload("llama")).await.unwrap();
    assert!(!engine.resident_ids().contains(&"llama".to_string()));
    drop(held);
    drop(within("the load never ended", loader).await.unwrap().unwrap());
    assert_eq!(engine.resident_ids(), [MTP_FIXTURE]);
    assert!(engine.leases.drain(None, Duration::from_secs(10)).await, "a lease leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_generate_together_each_as_it_would_alone() {
    let _serial = SERIAL.lock().await;
    let cfg = EngineConfig { max_batch: 2, ..config(LadderConfig::profile(WarmupProfile::Off)) };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    let g = golden("qwen3");
    let turn = |prompt: Vec<u32>, n: usize| Turn {
        max_tokens: Some(n),
        ignore_eos: true,
        ..Turn::new("qwen3".parse().unwrap(), Prompt::Tokens(prompt))
    };
    // A long turn is streaming ...
    let mut long = Arrival::now(&engine).start(turn(g.prompt_ids.clone(), 1900)).await.unwrap();
    within("the long turn's first text", long.next()).await.unwrap();
    assert!(engine.gate.try_acquire().is_none(), "background work took a slot beside a user");
    // ... and a short one runs beside it and ends first: it did not wait for the long one.
    let short =
        within("the short turn", Arrival::now(&engine).run(turn(g.prompt_ids[3..].to_vec(), 8)))
            .await
            .unwrap();
    let slots = engine.batch.slots();
    assert_eq!(slots.len(), 1, "the long turn is still in the batch: {slots:?}");
    assert_eq!(slots[0].state, "decode");
    assert_eq!(short.generation.batch.map(|b| b.max), Some(2), "the short turn ran alone");
    assert_eq!(engine.leases.count("qwen3"), 1);
    // Leaving frees the slot at the next step, and the lease with it.
    drop(long);
    until("the long turn's slot is freed", || engine.batch.slots().is_empty()).await;
    until("its lease is given back", || engine.leases.count("qwen3") == 0).await;
    assert!(engine.gate.try_acquire().is_some(), "the gate stayed taken");
    // What each decoded is what it decodes alone.
    let model = load_fixture("qwen3");
    let alone = |p: &[u32], n: usize| {
        let params =
            perch_engine::GenerateParams { max_tokens: n, ignore_eos: true, ..Default::default() };
        perch_engine::generate(&model, p, &params, None, |_| {}).unwrap().tokens
    };
    assert_eq!(short.generation.tokens, alone(&g.prompt_ids[3..], 8));
    let again = within("a turn after", Arrival::now(&engine).run(turn(g.prompt_ids.clone(), 12)))
        .await
        .unwrap();
    assert_eq!(again.generation.tokens, alone(&g.prompt_ids, 12));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_that_fails_leaves_the_batch_going() {
    let _serial = SERIAL.lock().await;
    // An adapter whose file is corrupt (a download cut short): the turn that names it fails
    // when its group steps; a base-model turn in the same batch goes on to its end.
    let (tmp, _) = copy_fixture("qwen3", "qwen3");
    let adapter = perch_engine::model::lora::adapter_dir(tmp.path(), "qwen3", "broken");
    std::fs::create_dir_all(&adapter).unwrap();
    std::fs::write(adapter.join("adapters.safetensors"), b"not a safetensors file").unwrap();
    let cfg = EngineConfig {
        max_batch: 2,
        ..EngineConfig {
            ladder: LadderConfig::profile(WarmupProfile::Off),
            ..engine_config(tmp.path(), "qwen3")
        }
    };
    let engine = Arc::new(Engine::start(cfg).unwrap());
    let g = golden("qwen3");
    let turn = |model: &str, n: usize| Turn {
        max_tokens: Some(n),
        ignore_eos: true,
        ..Turn::new(model.parse().unwrap(), Prompt::Tokens(g.prompt_ids.clone()))
    };
    let mut base = Arrival::now(&engine).start(turn("qwen3", 200)).await.unwrap();
    within("the base turn's first text", base.next()).await.unwrap();
    let broken =
        within("the broken turn", Arrival::now(&engine).run(turn("qwen3+broken", 8))).await;
    assert!(broken.is_err(), "a corrupt adapter generated");
    let end = within("the base turn's end", base.finish()).await;
    let end = end.unwrap_or_else(|e| panic!("the base turn was taken down with it: {e}"));
    assert_eq!(end.generation.tokens.len(), 200, "the base turn was taken down with it");
    assert_eq!(end.generation.tokens[..g.greedy_tokens.len()], g.greedy_tokens[..]);
    until("every lease given back", || engine.leases.total() == 0).await;
    assert!(engine.batch.slots().is_empty());
}
