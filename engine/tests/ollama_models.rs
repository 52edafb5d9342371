//! Ollama's `/api/pull` and `/api/delete` through the supervisor (the desktop app's and
//! `perch serve --config`'s control API) against a local hub on loopback: a pull streams
//! NDJSON progress and installs a model `/api/tags` then lists; pulling it again succeeds at
//! once; a missing repository is an `{"error"}`; delete removes only what Perch installed and
//! never the default model. Perch's own control API answers under `/perch/`. The
//! `ollama_port` setting adds a listener on 11434, live, and takes it away again.

mod common;

use std::time::{Duration, Instant};

use common::hub::{hub, REPO};
use common::*;
use perch_engine::supervisor::{Phase, Supervisor};
use serde_json::{json, Value};

/// POST (or DELETE) `body` to `path`: the status and each NDJSON line.
async fn lines(method: reqwest::Method, url: &str, body: Value) -> (u16, Vec<Value>) {
    let r = client().request(method, url).json(&body).send().await.unwrap();
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    let lines = text.lines().filter(|l| !l.is_empty()).map(|l| serde_json::from_str(l).unwrap());
    (code, lines.collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_installs_with_progress_and_delete_removes() {
    let (_hub, hub_url) = hub().await;
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    install_fixture("qwen3", &models.join("chat"));
    let config = tmp.path().join("perch.toml");
    std::fs::write(
        &config,
        format!(
            "models_dir = \"{}\"\ndefault_model = \"chat\"\nport = 0\nwarmup_profile = \"off\"\nload_warmup = false\nscan_hf_cache = false\nhub_endpoint = \"{hub_url}\"\nollama_port = true\n",
            models.display()
        ),
    )
    .unwrap();
    let sup = Supervisor::start(&config, None).await.unwrap();
    let t = Instant::now();
    while sup.status().phase != Phase::Running {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", sup.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = sup.url();
    assert_eq!(get(&url, "/perch/status").await.0, 200, "the control API is under /perch/");
    let (code, e) = get(&url, "/api/status").await;
    assert_eq!(code, 404, "/api/ is Ollama's: {e}");
    assert!(e["error"].is_string(), "in Ollama's shape: {e}");

    let pull = format!("{url}/api/pull");
    let (code, progress) = lines(reqwest::Method::POST, &pull, json!({"model": REPO})).await;
    assert_eq!(code, 200);
    assert_eq!(progress.last().unwrap(), &json!({"status": "success"}), "{progress:?}");
    assert!(
        progress.iter().any(|l| l["completed"].as_u64().is_some() && l["total"].as_u64() > Some(0)),
        "byte counts along the way: {progress:?}"
    );
    assert!(models.join("tiny-qwen3/config.json").is_file());
    let (_, tags) = get(&url, "/api/tags").await;
    let names: Vec<&str> =
        tags["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert!(names.iter().any(|n| n.starts_with("tiny-qwen3")), "{names:?}");

    // Installed already: success at once, streamed or not.
    let (code, again) =
        lines(reqwest::Method::POST, &pull, json!({"model": REPO, "stream": false})).await;
    assert_eq!((code, again), (200, vec![json!({"status": "success"})]));
    // The same name from another organisation is not what is installed.
    let other = json!({"model": "someone-else/tiny-qwen3"});
    let (code, e) = lines(reqwest::Method::POST, &pull, other).await;
    assert_eq!(code, 400, "{e:?}");
    assert!(e[0]["error"].as_str().unwrap().contains("already installed from"), "{e:?}");

    // A repository the hub lacks: an error line in the stream, a 500 without it.
    let (code, missing) =
        lines(reqwest::Method::POST, &pull, json!({"model": "nobody/nothing"})).await;
    assert_eq!(code, 200);
    assert!(
        missing.last().unwrap()["error"].as_str().is_some_and(|e| e.contains("not found")),
        "{missing:?}"
    );
    let (code, missing) =
        lines(reqwest::Method::POST, &pull, json!({"model": "nobody/nothing", "stream": false}))
            .await;
    assert_eq!(code, 500);
    assert!(missing[0]["error"].is_string(), "{missing:?}");
    let (code, bad) = lines(reqwest::Method::POST, &pull, json!({"model": "llama3.2"})).await;
    assert_eq!(code, 400, "not a hub repository id: {bad:?}");
    assert!(bad[0]["error"].as_str().unwrap().contains("repository id"), "{bad:?}");
    let (code, bad) = lines(reqwest::Method::POST, &pull, json!({"model": REPO, "frob": 1})).await;
    assert_eq!(code, 400, "{bad:?}");

    // Delete: never the default model; then the pulled one, once.
    let delete = format!("{url}/api/delete");
    let (code, e) = lines(reqwest::Method::DELETE, &delete, json!({"model": "chat"})).await;
    assert_eq!(code, 400, "{e:?}");
    assert!(e[0]["error"].as_str().unwrap().contains("default model"), "{e:?}");
    let (code, _) =
        lines(reqwest::Method::DELETE, &delete, json!({"model": "tiny-qwen3:latest"})).await;
    assert_eq!(code, 200);
    assert!(!models.join("tiny-qwen3").exists());
    let (code, e) = lines(reqwest::Method::DELETE, &delete, json!({"model": "tiny-qwen3"})).await;
    assert_eq!(code, 404, "{e:?}");

    // Ollama's port: answered while the setting is on (when nothing else holds the port).
    let t = Instant::now();
    while sup.status().ollama_url.is_none() && sup.status().ollama_port_error.is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", sup.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let st = sup.status();
    let ollama = "http://127.0.0.1:11434";
    match (&st.ollama_url, &st.ollama_port_error) {
        (Some(u), None) => {
            assert_eq!(u, ollama);
            let (code, v) = get(&ollama.to_string(), "/api/version").await;
            assert_eq!(code, 200, "{v}");
            let off = json!({"ollama_port": false});
            let (code, r) = call(&url, reqwest::Method::PUT, "/perch/config", Some(off)).await;
            assert_eq!((code, &r["restarted"]), (200, &json!(false)), "applied live: {r}");
            assert_eq!(sup.status().ollama_url, None);
            // It stops accepting as soon as its task sees the signal.
            let t = Instant::now();
            while client().get(format!("{ollama}/api/version")).send().await.is_ok() {
                assert!(t.elapsed() < Duration::from_secs(5), "the listener never closed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        (None, Some(why)) => {
            // Something else (an Ollama) holds the port: said, not fatal.
            assert!(why.contains("11434"), "{why}");
            eprintln!("port 11434 is taken here; checked only that the status says so");
        }
        other => panic!("ollama_port set: {other:?}"),
    }
    sup.shutdown().await;
}
