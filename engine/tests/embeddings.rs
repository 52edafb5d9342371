//! Embeddings with a real encoder, all-MiniLM-L6-v2 (scripts/fetch-minilm), over real HTTP:
//! Perch's vectors against sentence-transformers' (tests/fixtures/embeddings, written by
//! scripts/make-embedding-goldens.py) on ASCII, accents, CJK, emoji, empty and long inputs,
//! the same ranking on a small retrieval set, the official openai and ollama clients
//! unchanged, every refusal naming its field, and an embedding served while a chat
//! generation runs, beside the chat model (never evicting it).

mod common;

use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use common::*;
use perch_engine::server::ServeConfig;
use serde_json::{json, Value};

const ENCODER: &str = "all-minilm-l6-v2";

fn minilm() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/minilm").join(ENCODER);
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    assert!(std::env::var_os("CI").is_none(), "CI must fetch the encoder (scripts/fetch-minilm)");
    eprintln!("SKIPPED: all-MiniLM-L6-v2 missing (run scripts/fetch-minilm)");
    None
}

fn golden_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/embeddings/minilm-golden.json")
}

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(golden_file()).unwrap()).unwrap()
}

/// A models directory holding the qwen3 fixture (the chat model) and the encoder (linked).
fn models(encoder: &std::path::Path) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    install_fixture("qwen3", &tmp.path().join("qwen3"));
    std::os::unix::fs::symlink(encoder, tmp.path().join(ENCODER)).unwrap();
    tmp
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// The index of the best document for each query.
fn ranking(queries: &[Vec<f32>], docs: &[Vec<f32>]) -> Vec<Vec<usize>> {
    queries
        .iter()
        .map(|q| {
            let mut order: Vec<usize> = (0..docs.len()).collect();
            order.sort_by(|&a, &b| cos(q, &docs[b]).total_cmp(&cos(q, &docs[a])));
            order
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_match_sentence_transformers_and_every_refusal_names_its_field() {
    let Some(encoder) = minilm() else { return };
    let dir = models(&encoder);
    let s = serve(engine_config(dir.path(), "qwen3"), ServeConfig::default()).await;
    let g = golden();
    let corpus = strings(&g["corpus"]);
    let ids: Vec<usize> =
        g["corpus_ids"].as_array().unwrap().iter().map(|l| l.as_array().unwrap().len()).collect();
    let want: Vec<Vec<f32>> = g["corpus_vectors"].as_array().unwrap().iter().map(floats).collect();
    let long = corpus.len() - 1;
    assert_eq!(ids[long], 256, "the goldens' long input is cut at the encoder's length");

    // OpenAI: every input but the long one (OpenAI refuses what is too long).
    let (status, r) =
        post(&s, "/v1/embeddings", json!({"model": ENCODER, "input": corpus[..long]})).await;
    assert_eq!(status, 200, "{r}");
    for (i, d) in r["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["index"], i);
        let v = floats(&d["embedding"]);
        assert_eq!(v.len(), 384);
        let c = cos(&v, &want[i]);
        assert!(c >= 0.9999, "input {i} ({:?}): cosine {c}", corpus[i]);
    }
    assert_eq!(r["usage"]["prompt_tokens"], ids[..long].iter().sum::<usize>());
    assert_eq!(r["model"], ENCODER);
    // Ollama cuts the long one (truncate defaults to true) where sentence-transformers does.
    let (status, o) =
        post(&s, "/api/embed", json!({"model": ENCODER, "input": [corpus[long]]})).await;
    assert_eq!(status, 200, "{o}");
    let c = cos(&floats(&o["embeddings"][0]), &want[long]);
    assert!(c >= 0.9999, "the long input, cut: cosine {c}");
    assert_eq!(o["prompt_eval_count"], 256);

    // The same ranking on a small retrieval set.
    let embed = |xs: Vec<String>| {
        let s = &s;
        async move {
            let (_, r) = post(s, "/v1/embeddings", json!({"model": ENCODER, "input": xs})).await;
            r["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| floats(&d["embedding"]))
                .collect::<Vec<_>>()
        }
    };
    let (q, d) = (embed(strings(&g["queries"])).await, embed(strings(&g["docs"])).await);
    let vecs = |k: &str| g[k].as_array().unwrap().iter().map(floats).collect::<Vec<_>>();
    assert_eq!(ranking(&q, &d), ranking(&vecs("query_vectors"), &vecs("doc_vectors")));

    // base64 is the floats' bytes; token ids (without the special tokens) embed as the text.
    // Each is compared with the same input alone: a batch of other widths rounds differently.
    let (_, alone) =
        post(&s, "/v1/embeddings", json!({"model": ENCODER, "input": corpus[1]})).await;
    let alone = floats(&alone["data"][0]["embedding"]);
    let (_, b) = post(
        &s,
        "/v1/embeddings",
        json!({"model": ENCODER, "input": corpus[1], "encoding_format": "base64"}),
    )
    .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> =
        bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(decoded, alone);
    let content: Vec<u64> =
        g["corpus_ids"][1].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let inner = &content[1..content.len() - 1];
    let (status, t) = post(&s, "/v1/embeddings", json!({"model": ENCODER, "input": [inner]})).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(floats(&t["data"][0]["embedding"]), alone);
    let (_, t) = post(&s, "/v1/embeddings", json!({"model": ENCODER, "input": inner})).await;
    assert_eq!(floats(&t["data"][0]["embedding"]), alone);
    // The encoder's own length is an honoured `dimensions`.
    let (status, _) =
        post(&s, "/v1/embeddings", json!({"model": ENCODER, "input": "x", "dimensions": 384}))
            .await;
    assert_eq!(status, 200);

    // Refusals, each naming its field.
    let too_many: Vec<&str> = vec!["a"; 2049];
    for (body, param) in [
        (json!({"model": ENCODER, "input": corpus[long]}), "input"),
        (json!({"model": ENCODER, "input": "x", "dimensions": 100}), "dimensions"),
        (json!({"model": ENCODER, "input": "x", "dimensions": 0}), "dimensions"),
        (json!({"model": ENCODER, "input": "x", "encoding_format": "hex"}), "encoding_format"),
        (json!({"model": ENCODER, "input": "x", "temperature": 1}), "temperature"),
        (json!({"model": ENCODER, "input": []}), "input"),
        (json!({"model": ENCODER, "input": [1, "a"]}), "input"),
        (json!({"model": ENCODER, "input": [[]]}), "input"),
        (json!({"model": ENCODER, "input": [30522]}), "input"),
        (json!({"model": ENCODER, "input": [-1]}), "input"),
        (json!({"model": ENCODER, "input": too_many}), "input"),
        (json!({"model": ENCODER}), "input"),
        (json!({"input": "x"}), "model"),
        (json!({"model": "qwen3", "input": "x"}), "model"),
        (json!({"model": "qwen3+none", "input": "x"}), "model"),
    ] {
        let (status, e) = post(&s, "/v1/embeddings", body.clone()).await;
        assert!(status == 400 || status == 404, "{body}: {status} {e}");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
    }
    // A chat request to the encoder is refused by its `model`, on every protocol.
    let chat = json!({"model": ENCODER, "messages": [{"role": "user", "content": "hi"}]});
    let (status, e) = post(&s, "/v1/chat/completions", chat).await;
    assert_eq!((status, e["error"]["param"].clone()), (400, json!("model")), "{e}");
    let (status, e) =
        post(&s, "/api/generate", json!({"model": ENCODER, "prompt": "hi", "stream": false})).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("embedding model"), "{e}");
    for (body, says) in [
        (json!({"model": ENCODER, "input": corpus[long], "truncate": false}), "input"),
        (
            json!({"model": ENCODER, "input": "x", "options": {"temperature": 0.5}}),
            "options.temperature",
        ),
        (json!({"model": ENCODER, "input": "x", "truncate": "yes"}), "truncate"),
        (json!({"model": ENCODER, "input": 3}), "input"),
        (json!({"model": "qwen3", "input": "x"}), "embedding head"),
    ] {
        let (status, e) = post(&s, "/api/embed", body.clone()).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert!(e["error"].as_str().unwrap().contains(says), "{body}: {e}");
    }
    // Hardware hints are accepted on purpose, as on /api/chat; the legacy route embeds too.
    let (status, _) = post(
        &s,
        "/api/embed",
        json!({"model": ENCODER, "input": "x", "options": {"num_thread": 2}}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, l) = post(&s, "/api/embeddings", json!({"model": ENCODER, "prompt": corpus[0]})).await;
    assert!(cos(&floats(&l["embedding"]), &want[0]) >= 0.9999, "{l}");

    // Listed as an embedding model; counted by /health and /metrics.
    let (_, models) = get(&s, "/v1/models").await;
    let entry = models["data"].as_array().unwrap().iter().find(|m| m["id"] == ENCODER).cloned();
    assert_eq!(entry.map(|m| m["kind"].clone()), Some(json!("embedding")));
    let (_, show) = post(&s, "/api/show", json!({"model": ENCODER})).await;
    assert_eq!(show["capabilities"], json!(["embedding"]));
    let (_, h) = get(&s, "/health").await;
    assert!(h["embeddings"]["requests"].as_u64().unwrap() >= 8, "{}", h["embeddings"]);
    assert_eq!(h["model"]["id"], "qwen3", "the chat model is still the one served");
    assert_eq!(h["leases"]["total"], 0, "a lease was left behind");
    let metrics =
        client().get(format!("{}/metrics", s.url())).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("perch_requests_total{endpoint=\"embeddings\",status=\"400\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("perch_embedding_inputs_total"), "{metrics}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_is_served_while_a_chat_generation_runs_beside_it() {
    let Some(encoder) = minilm() else { return };
    let dir = models(&encoder);
    // One model of each kind may be resident: the encoder gets a room of its own.
    let cfg = perch_engine::runtime::EngineConfig {
        max_resident: 1,
        ..engine_config(dir.path(), "qwen3")
    };
    let s = serve(cfg, ServeConfig::default()).await;
    // The fixture runs on to its cap from this prompt (tests/server.rs uses it the same way).
    let long = json!({"model": "qwen3", "prompt": "The quick brown fox", "max_tokens": 1500, "temperature": 0, "stream": true});
    let mut chat =
        client().post(format!("{}/v1/completions", s.url())).json(&long).send().await.unwrap();
    assert_eq!(chat.status(), 200);
    chat.chunk().await.unwrap().expect("the generation's first event");
    let (status, r) =
        post(&s, "/v1/embeddings", json!({"model": ENCODER, "input": "hello world"})).await;
    assert_eq!(status, 200, "{r}");
    let (_, h) = get(&s, "/health").await;
    assert_eq!(h["slots"].as_array().map(Vec::len), Some(1), "the generation ended first: {h}");
    let ids: Vec<&str> =
        h["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&"qwen3") && ids.contains(&ENCODER), "both stay resident: {ids:?}");
    assert_eq!(h["leases"]["by_model"][ENCODER].as_u64().unwrap_or(0), 0, "{}", h["leases"]);
    drop(chat);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_and_ollama_clients_embed_unchanged() {
    let Some(encoder) = minilm() else { return };
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/venv/bin/python");
    let has = Command::new(&python).args(["-c", "import openai, ollama"]).output();
    if !has.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the clients (scripts/setup-peers)"
        );
        eprintln!("SKIPPED: the openai and ollama clients are not installed in .deps/venv");
        return;
    }
    let dir = models(&encoder);
    let s = serve(engine_config(dir.path(), "qwen3"), ServeConfig::default()).await;
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/api/embeddings_clients.py");
    let args = [
        script.display().to_string(),
        s.url(),
        ENCODER.to_string(),
        golden_file().display().to_string(),
    ];
    let out =
        tokio::task::spawn_blocking(move || Command::new(python).args(args).output().unwrap())
            .await
            .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "the client script failed:\n{text}");
    s.shutdown().await;
}
