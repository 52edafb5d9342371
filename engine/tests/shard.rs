//! Pipeline sharding on loopback: real `perch serve` processes joined by MLX's ring backend.
//! Two and three ranks answer greedily exactly as one process does (with the prefix cache,
//! batched requests and prompt-lookup drafts), on the fixtures and on the default model; a
//! rank killed mid-answer fails that answer and every later request, promptly, and /health
//! says why; a rank that never joins or holds another model is a clear error at start, and
//! until then rank 0 answers 503 saying the group is forming.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn perch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_perch"))
}

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A hostfile of `n` loopback ranks in MLX's ring format.
fn hostfile(dir: &Path, n: usize) -> PathBuf {
    let ranks: Vec<Vec<String>> =
        (0..n).map(|_| vec![format!("127.0.0.1:{}", free_port())]).collect();
    let path = dir.join(format!("hosts-{n}.json"));
    std::fs::write(&path, serde_json::to_string(&ranks).unwrap()).unwrap();
    path
}

/// Processes killed when dropped; `url` is rank 0's API (or the lone process's).
struct Procs {
    children: Vec<Child>,
    url: String,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `perch serve` of `model`, as rank 0 of `hosts` when given (the other ranks started first),
/// with `extra` flags on rank 0. Waits for rank 0 to serve.
fn start(model: &Path, hosts: Option<(&Path, usize)>, extra: &[&str]) -> Procs {
    let mut children = vec![];
    if let Some((file, n)) = hosts {
        for rank in 1..n {
            let child = perch()
                .args(["serve", "--model"])
                .arg(model)
                .arg("--hostfile")
                .arg(file)
                .args(["--rank", &rank.to_string(), "--join-timeout", "60"])
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            children.push(child);
        }
    }
    let mut rank0 = perch();
    // Quiet and self-contained: no request log, ladder, conversations, MCP or disk cache.
    let quiet = "--port 0 --log-dir none --ladder off --conversations-dir none --mcp-file none \
                 --prefix-cache-disk-mb 0";
    rank0.args(["serve", "--model"]).arg(model).args(quiet.split_whitespace());
    if let Some((file, _)) = hosts {
        rank0.arg("--hostfile").arg(file).args(["--rank", "0", "--join-timeout", "60"]);
    }
    let mut child = rank0.args(extra).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut said = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.split(" at ").nth(1).filter(|_| line.contains("serving")) {
                let _ = tx.send(Ok(at.trim().trim_end_matches("/v1").to_string()));
            }
            said.push_str(&line);
            said.push('\n');
        }
        let _ = tx.send(Err(said));
    });
    children.push(child);
    let url = match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(Ok(url)) => url,
        other => panic!("rank 0 did not serve: {other:?}"),
    };
    Procs { children, url }
}

async fn post(url: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new().post(format!("{url}{path}")).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn health(url: &str) -> Value {
    reqwest::get(format!("{url}/health")).await.unwrap().json().await.unwrap()
}

/// Greedy completions of `prompts` (all at once when `together`), as text and cached tokens.
async fn answers(url: &str, model: &str, prompts: &[&str], together: bool) -> Vec<(String, u64)> {
    let one = |p: String| {
        let url = url.to_string();
        let body = json!({"model": model, "prompt": p, "max_tokens": 24, "temperature": 0});
        async move {
            let (status, v) = post(&url, "/v1/completions", body).await;
            assert_eq!(status, 200, "{v}");
            let text = v["choices"][0]["text"].as_str().unwrap().to_string();
            (text, v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0))
        }
    };
    if together {
        futures_util::future::join_all(prompts.iter().map(|p| one(p.to_string()))).await
    } else {
        let mut out = vec![];
        for p in prompts {
            out.push(one(p.to_string()).await);
        }
        out
    }
}

const PROMPTS: &[&str] = &[
    "The quick brown fox jumps over",
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_and_three_ranks_answer_as_one_process_does() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::fixture_dir("qwen3");
    let alone = start(&model, None, &[]);
    let want = answers(&alone.url, "qwen3", PROMPTS, false).await;
    let want_json = constrained(&alone.url, "qwen3").await;
    let want_lookup = {
        let lookup = start(&model, None, &["--parallel", "1", "--draft", "lookup"]);
        answers(&lookup.url, "qwen3", PROMPTS, false).await
    };
    drop(alone);
    // Two ranks, batching (the default): one by one, then all three at once.
    let two = start(&model, Some((&hostfile(tmp.path(), 2), 2)), &[]);
    let got = answers(&two.url, "qwen3", PROMPTS, false).await;
    assert_eq!(strip(&got), strip(&want), "two ranks, one request at a time");
    assert!(got[1].1 > 0, "the second prompt reused the first's cache: {got:?}");
    let together = answers(&two.url, "qwen3", PROMPTS, true).await;
    assert_eq!(strip(&together), strip(&want), "two ranks, three requests in one batch");
    assert_eq!(constrained(&two.url, "qwen3").await, want_json, "constrained to a JSON object");
    let h = health(&two.url).await;
    assert_eq!(h["shard"]["state"], "ready", "{h}");
    assert_eq!(h["shard"]["ranks"], 2);
    assert!(h["shard"]["traffic"]["passes"].as_u64().unwrap() > 24, "{h}");
    drop(two);
    // Three ranks, one at a time with prompt-lookup drafts (their rejections trim the other
    // ranks' caches).
    // The prefix cache is off here: rank 0 holds no layer, so a state it kept would cost it
    // nothing locally, but its ranks hold keys and values for it and count against the budget.
    let three = start(
        &model,
        Some((&hostfile(tmp.path(), 3), 3)),
        &["--parallel", "1", "--draft", "lookup", "--prefix-cache-mb", "0"],
    );
    let got = answers(&three.url, "qwen3", PROMPTS, false).await;
    assert_eq!(strip(&got), strip(&want_lookup), "three ranks with lookup drafts");
    assert!(got.iter().all(|(_, cached)| *cached == 0), "a cache of 0 MiB kept a state: {got:?}");
    assert_eq!(strip(&want_lookup), strip(&want), "drafts change no greedy answer");
    let h = health(&three.url).await;
    assert_eq!(h["shard"]["layer_starts"], json!([0, 0, 1, 2]), "{h}");
}

/// A chat request constrained to a JSON object.
async fn constrained(url: &str, model: &str) -> Value {
    let body = json!({"model": model, "max_tokens": 24, "temperature": 0,
                      "response_format": {"type": "json_object"},
                      "messages": [{"role": "user", "content": "A JSON object, please"}]});
    let (status, v) = post(url, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["message"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_drafts_and_a_cancelled_stream_leave_the_ranks_in_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::fixture_dir(common::MTP_FIXTURE);
    let flags = ["--parallel", "1", "--draft", "mtp"];
    let want = {
        let alone = start(&model, None, &flags);
        answers(&alone.url, "qwen3-mtp", PROMPTS, false).await
    };
    let two = start(&model, Some((&hostfile(tmp.path(), 2), 2)), &flags);
    let h = health(&two.url).await;
    assert_eq!(h["mtp"]["present"], true, "rank 0 holds the MTP head: {h}");
    // A stream the client drops after its first chunk: its sequence is cancelled between
    // passes, and the ranks' caches must stay in step for what follows.
    let body = json!({"model": "qwen3-mtp", "prompt": PROMPTS[0], "max_tokens": 1500,
                      "temperature": 0, "stream": true});
    let mut stream = reqwest::Client::new()
        .post(format!("{}/v1/completions", two.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    stream.chunk().await.unwrap();
    drop(stream);
    let got = answers(&two.url, "qwen3-mtp", PROMPTS, false).await;
    assert_eq!(strip(&got), strip(&want), "two ranks with MTP drafts after a cancelled stream");
    assert_eq!(health(&two.url).await["shard"]["state"], "ready");
}

fn strip(a: &[(String, u64)]) -> Vec<&str> {
    a.iter().map(|(t, _)| t.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_mid_answer_fails_it_and_every_later_request_promptly() {
    let tmp = tempfile::tempdir().unwrap();
    let mut group = start(&common::fixture_dir("qwen2"), Some((&hostfile(tmp.path(), 2), 2)), &[]);
    let url = group.url.clone();
    // The fixture repeats " break" after this prompt, never its end token.
    let body = json!({"model": "qwen2", "prompt": "The quick brown fox jumps over",
                      "max_tokens": 1500, "temperature": 0, "stream": true});
    let mut stream = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data:"), "{first:?}");
    group.children[0].kill().unwrap();
    let started = Instant::now();
    let mut rest = String::new();
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(60), stream.chunk())
        .await
        .expect("the stream hung")
    {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.contains("unavailable") && rest.contains("error"), "the stream ended: {rest}");
    assert!(!rest.contains("\"finish_reason\":\"length\""), "it cannot have finished: {rest}");
    let h = health(&url).await;
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["shard"]["state"], "lost", "{h}");
    assert!(h["shard"]["reason"].as_str().unwrap().contains("rank 1"), "{h}");
    let (status, v) =
        post(&url, "/v1/completions", json!({"model": "qwen2", "prompt": "hi", "max_tokens": 4}))
            .await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "shard_unavailable", "{v}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(health(&url).await["leases"]["total"], 0, "no lease outlives the failure");

    // Lost while idle: rank 0's ping finds it, and /health says so before any request.
    let mut idle = start(&common::fixture_dir("qwen2"), Some((&hostfile(tmp.path(), 2), 2)), &[]);
    assert_eq!(health(&idle.url).await["shard"]["state"], "ready");
    idle.children[0].kill().unwrap();
    let since = Instant::now();
    let state = loop {
        let h = health(&idle.url).await;
        if h["shard"]["state"] == "lost" || since.elapsed() > Duration::from_secs(20) {
            break h["shard"].clone();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(state["state"], "lost", "20 s after the kill: {state}");
}

/// Rank 0's exit and what it said, within `bound`.
fn exit_of(mut cmd: Command, bound: Duration) -> (bool, String) {
    let started = Instant::now();
    let out = cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(out.wait_with_output());
    });
    let out = rx.recv_timeout(bound).expect("rank 0 neither served nor exited").unwrap();
    assert!(started.elapsed() < bound);
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_rank_that_never_joins_or_holds_another_model_is_a_clear_error_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hostfile(tmp.path(), 2);
    let mut rank0 = perch();
    rank0.args(["serve", "--port", "0", "--model"]).arg(common::fixture_dir("qwen2"));
    rank0.arg("--hostfile").arg(&hosts).args(["--rank", "0", "--join-timeout", "2"]);
    let (ok, said) = exit_of(rank0, Duration::from_secs(30));
    assert!(!ok && said.contains("not every rank") && said.contains("within 2 s"), "{said}");

    let hosts = hostfile(tmp.path(), 2);
    let mut other = perch()
        .args(["serve", "--model"])
        .arg(common::fixture_dir("llama"))
        .arg("--hostfile")
        .arg(&hosts)
        .args(["--rank", "1"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut rank0 = perch();
    rank0.args(["serve", "--port", "0", "--log-dir", "none", "--model"]);
    rank0.arg(common::fixture_dir("qwen2")).arg("--hostfile").arg(&hosts).args(["--rank", "0"]);
    let (ok, said) = exit_of(rank0, Duration::from_secs(60));
    let _ = other.kill();
    let _ = other.wait();
    assert!(
        !ok && said.contains("rank 1: its model") && said.contains("is not rank 0's"),
        "{said}"
    );
}

/// While rank 0 waits for a rank that never joins, it already listens: /health and the API
/// answer 503 `engine_starting` saying the group is forming, and when the join timeout ends
/// rank 0 exits with the clear error (no hang, no refused connection before that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_group_forms_rank_0_answers_503_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hostfile(tmp.path(), 2);
    let mut rank0 = perch();
    rank0.args(["serve", "--port", "0", "--log-dir", "none", "--model"]);
    rank0.arg(common::fixture_dir("qwen2")).arg("--hostfile").arg(&hosts);
    rank0.args(["--rank", "0", "--join-timeout", "8"]);
    let started = Instant::now();
    let mut child = rank0.stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let url = loop {
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("rank 0 said nothing");
        if let Some(rest) = line.strip_prefix("perch: listening on ") {
            break rest.split(';').next().unwrap().to_string();
        }
    };
    let r = reqwest::get(format!("{url}/health")).await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "engine_starting", "{e}");
    let says = e["error"]["message"].as_str().unwrap();
    assert!(says.contains("shard group is forming") && says.contains("within 8 s"), "{says}");
    let chat = json!({"model": "qwen2", "messages": [{"role": "user", "content": "hi"}]});
    let (status, e) = post(&url, "/v1/chat/completions", chat).await;
    assert_eq!((status, &e["error"]["code"]), (503, &json!("engine_starting")), "{e}");
    // Then the join timeout ends it, with the reason.
    let mut said = String::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        said.push_str(&line);
        said.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(!status.success() && said.contains("not every rank"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_on_two_ranks_answers_as_one_process_with_half_the_weights_each() {
    use perch_engine::gguf::import::{import, ImportOptions, Quantize, StoreDtype};
    let Some(gguf) = common::qwen_gguf() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let opts = ImportOptions {
        name: Some("qwen".into()),
        quantize: Quantize::None,
        dtype: StoreDtype::F32,
        overwrite: true,
    };
    let model = import(&gguf, tmp.path(), &opts).unwrap();
    let chat = |n: usize| {
        json!({"model": "qwen", "max_tokens": n, "temperature": 0, "messages": [
            {"role": "user", "content": "Write a Python function that reverses a string."}]})
    };
    let alone = start(&model, None, &[]);
    let (status, want) = post(&alone.url, "/v1/chat/completions", chat(32)).await;
    assert_eq!(status, 200, "{want}");
    drop(alone);
    let two = start(&model, Some((&hostfile(tmp.path(), 2), 2)), &[]);
    let (status, got) = post(&two.url, "/v1/chat/completions", chat(32)).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["choices"][0]["message"], want["choices"][0]["message"]);
    let h = health(&two.url).await;
    let bytes: Vec<u64> = h["shard"]["weight_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    let total: u64 = bytes.iter().sum();
    for (rank, b) in bytes.iter().enumerate() {
        assert!(*b as f64 <= 0.6 * total as f64, "rank {rank} holds {b} of {total} bytes");
    }
}
