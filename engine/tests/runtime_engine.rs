//! The runtime on a real fixture model: the warmup ladder yielding to a user request, leases
//! holding off eviction and unload, the timed drain, keep-alive.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use perch_engine::decode::Generation;
use perch_engine::runtime::{
    Arrival, Engine, EngineConfig, KeepAlive, LadderConfig, LadderState, Prompt, Turn,
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
    // Long rungs in small chunks on the fixture, so a request surely lands mid-rung.
    let ladder = LadderConfig {
        rungs: vec![1536, 1900],
        chunk: 128,
        decode_tokens: 4,
        idle_grace: Duration::ZERO,
        max_interruptions: 8,
        enabled: true,
    };
    let engine = Arc::new(Engine::start(config(ladder.clone())).unwrap());
    let prompt: Vec<u32> = golden("qwen3").prompt_ids;
    // Baseline on a quiet engine first (ladder not started yet), and the time of one chunk
    // at the rung's depth: a 128-token prompt after 1400 cached... approximated by a
    // 1536-token prefill / 12 chunks.
    let mut quiet = Duration::MAX;
    for _ in 0..3 {
        quiet = quiet.min(request(&engine, "qwen3", prompt.clone(), 1).await.1);
    }
    let long: Vec<u32> = prompt.iter().copied().cycle().take(1536).collect();
    let (g, _) = request(&engine, "qwen3", long, 1).await;
    let chunk = g.ttft / 12;
    engine.start_background();
    while engine.ladder_status().state != LadderState::Running {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(chunk / 2).await;
    let (_, busy) = request(&engine, "qwen3", prompt.clone(), 1).await;
    let st = engine.ladder_status();
    println!(
        "TTFT quiet {:.1} ms, during a rung {:.1} ms; one chunk ~{:.1} ms; ladder {:?}, {} interruption(s)",
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
    let engine = Arc::new(Engine::start(config(LadderConfig::profile("off").unwrap())).unwrap());
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
        ..config(LadderConfig::profile("off").unwrap())
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
    let cfg =
        |ladder| EngineConfig { model: MTP_FIXTURE.into(), draft: "mtp".into(), ..config(ladder) };
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
    let engine = Arc::new(Engine::start(cfg(LadderConfig::profile("off").unwrap())).unwrap());
    engine.start_background();
    let m = wait_for(engine.clone()).await;
    assert_eq!((m.load_time_warmup, m.mtp_warm), (WarmupOutcome::Warm, true));
    assert_eq!(engine.leases.total(), 0);
    assert_eq!(engine.foreground.snapshot().requests_completed, 0, "the warmup counted as a user");

    // Busy gate: skipped, still cold; the first real MTP request warms it.
    let engine = Arc::new(Engine::start(cfg(LadderConfig::profile("off").unwrap())).unwrap());
    let user = engine.gate.try_acquire().unwrap();
    engine.start_background();
    let m = wait_for(engine.clone()).await;
    assert_eq!((m.load_time_warmup, m.mtp_warm), (WarmupOutcome::SkippedBusy, false));
    drop(user);
    let prompt = golden(MTP_FIXTURE).prompt_ids;
    let (g, _) = request(&engine, MTP_FIXTURE, prompt, 8).await;
    assert_eq!(g.draft.unwrap().mode, "mtp");
    assert!(
        engine.resident_snapshot()[0].mtp_warm,
        "the first MTP request did not mark the model warm"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_finishes_for_the_engine_when_its_client_leaves() {
    use perch_engine::runtime::warmup::WarmupOutcome;
    let _serial = SERIAL.lock().await;
    let ladder =
        LadderConfig { idle_grace: Duration::ZERO, ..LadderConfig::profile("default").unwrap() };
    let cfg = EngineConfig { draft: "mtp".into(), ..config(ladder) };
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
    let engine = Arc::new(Engine::start(config(LadderConfig::profile("off").unwrap())).unwrap());
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
        draft: "mtp".into(),
        load_warmup,
        ..config(LadderConfig::profile("off").unwrap())
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
