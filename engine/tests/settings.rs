//! The settings file and in-process restarts (docs/settings.md), through the supervisor the desktop app
//! and `perch serve --config` use: hand edits picked up by the watcher, invalid edits that keep
//! the old engine serving, graceful restarts with requests in flight, live fields applied
//! without a restart, and the control API's checks — all over real loopback HTTP.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use perch_engine::supervisor::{Phase, Supervisor};
use serde_json::{json, Value};

struct Setup {
    _tmp: tempfile::TempDir,
    config: PathBuf,
    models: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    for (name, id) in [("qwen3", "chat"), (MTP_FIXTURE, "mtp")] {
        install_fixture(name, &models.join(id));
    }
    let config = tmp.path().join("config/perch.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, settings_text(&models, "draft = \"none\"")).unwrap();
    Setup { _tmp: tmp, config, models }
}

fn settings_text(models: &Path, extra: &str) -> String {
    format!(
        "models_dir = \"{}\"\ndefault_model = \"chat\"\nport = 0\nwarmup_profile = \"off\"\nload_warmup = false\nscan_hf_cache = false\n{extra}\n",
        models.display()
    )
}

async fn wait_for(
    sup: &Supervisor,
    what: &str,
    f: impl Fn(&perch_engine::supervisor::Status) -> bool,
) {
    let t = Instant::now();
    while !f(&sup.status()) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {:?}",
            sup.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn running(s: &Setup) -> Arc<Supervisor> {
    let sup = Supervisor::start(&s.config, None).await.unwrap();
    sup.watch().unwrap();
    wait_for(&sup, "the engine to run", |st| st.phase == Phase::Running).await;
    sup
}

async fn chat(url: &str) -> (u16, Value) {
    call(url, reqwest::Method::POST, "/v1/chat/completions", Some(json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hand_edits_restart_the_engine_and_invalid_ones_keep_it_serving() {
    let s = setup();
    let sup = running(&s).await;
    let url = sup.url();
    assert_eq!(chat(&url).await.0, 200);
    assert_eq!(get(&url, "/health").await.1["draft"], "none");

    // A hand edit (plain write, as an editor would) is picked up and restarts the engine.
    std::fs::write(&s.config, settings_text(&s.models, "draft = \"lookup\"")).unwrap();
    wait_for(&sup, "the restart", |st| st.restarts == 1 && st.phase == Phase::Running).await;
    assert_eq!(
        get(&url, "/health").await.1["draft"],
        "lookup",
        "the new engine runs the new settings"
    );
    assert_eq!(chat(&url).await.0, 200);

    // An invalid edit is reported and the old engine keeps serving.
    std::fs::write(&s.config, settings_text(&s.models, "draft = \"bogus\"")).unwrap();
    wait_for(&sup, "the rejection", |st| st.config_error.is_some()).await;
    let st = sup.status();
    assert_eq!(st.config_error.as_ref().unwrap().field.as_deref(), Some("draft"), "{st:?}");
    assert_eq!((st.restarts, st.phase), (1, Phase::Running));
    assert_eq!(chat(&url).await.0, 200, "still serving");
    assert_eq!(get(&url, "/health").await.1["draft"], "lookup");
    let (_, cfg) = get(&url, "/perch/config").await;
    assert_eq!(cfg["error"]["field"], "draft", "{cfg}");
    let menu = sup.tray_menu();
    assert!(
        menu.status_line.starts_with("Settings problem: `draft`"),
        "the tray says so too: {menu:?}"
    );

    // Broken TOML too.
    std::fs::write(&s.config, "port = \n").unwrap();
    wait_for(&sup, "the syntax error", |st| {
        st.config_error.as_ref().is_some_and(|e| e.message.contains("TOML"))
    })
    .await;
    assert_eq!(chat(&url).await.0, 200);

    // Fixed: the error clears; these settings differ from the running ones, so it restarts.
    std::fs::write(&s.config, settings_text(&s.models, "draft = \"none\"")).unwrap();
    wait_for(&sup, "the fix", |st| {
        st.config_error.is_none() && st.restarts == 2 && st.phase == Phase::Running
    })
    .await;
    assert_eq!(get(&url, "/health").await.1["draft"], "none");
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_lets_the_request_in_flight_finish_and_answers_others_with_a_clear_503() {
    let s = setup();
    let sup = running(&s).await;
    let url = sup.url();
    let body = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500, "stream": true});
    let resp =
        client().post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    let reader = tokio::spawn(async move {
        let mut text = String::from_utf8_lossy(&first).into_owned();
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(
                &chunk.expect("the stream is not cut by the restart"),
            ));
        }
        text
    });
    let saver = {
        let (sup, models) = (sup.clone(), s.models.clone());
        tokio::spawn(async move {
            let mut new = perch_engine::config::Settings::parse(
                &settings_text(&models, "draft = \"lookup\""),
                Path::new("x"),
            )
            .unwrap();
            new.port = 0;
            sup.save(new).await.unwrap()
        })
    };
    wait_for(&sup, "the restart to begin", |st| st.phase == Phase::Restarting).await;
    // While the old engine drains, new requests are told why, with Retry-After.
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "engine_restarting", "{e}");
    // The status the UI and tray poll answers at once during the restart.
    let t = Instant::now();
    let (code, st) = get(&url, "/perch/status").await;
    assert_eq!((code, st["phase"].as_str()), (200, Some("restarting")), "{st}");
    assert!(t.elapsed() < Duration::from_millis(500), "status took {:?}", t.elapsed());
    let text = reader.await.unwrap();
    assert!(
        text.contains("\"finish_reason\":\"length\"")
            || text.contains("\"finish_reason\":\"stop\""),
        "the stream ran to its end: {}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
    assert!(saver.await.unwrap(), "the save restarted the engine");
    wait_for(&sup, "the new engine", |st| st.phase == Phase::Running && st.restarts == 1).await;
    assert_eq!(chat(&url).await.0, 200);
    assert_eq!(
        get(&url, "/health").await.1["leases"]["total"],
        0,
        "no lease leaked across the restart"
    );
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_settings_api_checks_fields_and_applies_live_ones_without_a_restart() {
    let s = setup();
    let sup = running(&s).await;
    let url = sup.url();
    let (code, cfg) = get(&url, "/perch/config").await;
    assert_eq!(code, 200);
    let settings = cfg["settings"].clone();
    let before = std::fs::read(&s.config).unwrap();

    for (field, value, param) in [
        ("port", json!(80), "port"),
        ("draft", json!("mtp:9"), "draft"),
        ("default_model", json!("missing"), "default_model"),
        ("allowed_origins", json!(["example.com"]), "allowed_origins"),
    ] {
        let mut bad = settings.clone();
        bad[field] = value;
        let (code, e) = call(&url, reqwest::Method::PUT, "/perch/config", Some(bad)).await;
        assert_eq!(code, 400, "{field}: {e}");
        assert_eq!(e["error"]["param"], param, "{e}");
        assert_eq!(e["error"]["code"], "invalid_setting");
    }
    let mut typo = settings.clone();
    typo["prot"] = json!(1);
    assert_eq!(call(&url, reqwest::Method::PUT, "/perch/config", Some(typo)).await.0, 400);
    assert_eq!(std::fs::read(&s.config).unwrap(), before, "a refused change leaves the file alone");

    // Sampling defaults apply live; requests that omit temperature now get greedy output.
    let mut live = settings.clone();
    live["sampling"]["temperature"] = json!(0.0);
    let (code, r) = call(&url, reqwest::Method::PUT, "/perch/config", Some(live.clone())).await;
    assert_eq!((code, &r["restarted"]), (200, &json!(false)), "{r}");
    assert_eq!(sup.status().restarts, 0);
    let a = chat(&url).await.1["choices"][0]["message"]["content"].clone();
    let b = chat(&url).await.1["choices"][0]["message"]["content"].clone();
    assert_eq!(a, b, "temperature 0 by default: the same answer twice");
    let line = sup.tray_menu().status_line;
    assert!(
        // MLX's active memory is the whole test process's (other tests load models beside
        // this one), so the unit is whichever the figure needs.
        line.starts_with("chat · ")
            && line.contains(" tok/s · ")
            && (line.ends_with(" MB") || line.ends_with(" GB")),
        "model, last speed, memory: {line}"
    );
    assert!(std::fs::read_to_string(&s.config).unwrap().contains("temperature = 0.0"));

    // Picking another model (the tray's picker) loads it without a restart.
    let (code, r) =
        call(&url, reqwest::Method::POST, "/perch/models/select", Some(json!({"id": "mtp"}))).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(sup.status().restarts, 0);
    let (_, h) = get(&url, "/health").await;
    assert_eq!(h["model"]["id"], "mtp", "{h}");
    // The tray: both models, the picked one checked; the status line names it.
    let menu = sup.tray_menu();
    let checks: Vec<(&str, bool)> =
        menu.models.iter().map(|m| (m.id.as_str(), m.checked)).collect();
    assert_eq!(checks, [("chat", false), ("mtp", true)], "{menu:?}");
    assert!(menu.status_line.starts_with("mtp"), "{menu:?}");
    assert_eq!(menu.api_url, format!("{url}/v1"));
    let (code, e) =
        call(&url, reqwest::Method::POST, "/perch/models/select", Some(json!({"id": "nope"})))
            .await;
    assert_eq!((code, &e["error"]["param"]), (400, &json!("default_model")), "{e}");

    // Models: listed with size and format; the default cannot be deleted, another can.
    let (_, list) = get(&url, "/perch/models").await;
    let ids: Vec<&str> =
        list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["chat", "mtp"]);
    assert!(
        list["data"][0]["size_bytes"].as_u64().unwrap() > 100_000
            && list["data"][0]["format"].is_string()
    );
    let (code, e) = call(&url, reqwest::Method::DELETE, "/perch/models/mtp", Some(json!({}))).await;
    assert_eq!((code, &e["error"]["code"]), (400, &json!("model_in_use")), "{e}");
    call(&url, reqwest::Method::POST, "/perch/models/select", Some(json!({"id": "chat"}))).await;
    // A folder Perch did not install (this one was copied in by hand) is never deleted.
    let (code, e) = call(&url, reqwest::Method::DELETE, "/perch/models/mtp", Some(json!({}))).await;
    assert_eq!((code, &e["error"]["code"]), (400, &json!("not_installed_by_perch")), "{e}");
    assert!(s.models.join("mtp/config.json").exists());
    perch_engine::catalog::mark_installed(&s.models.join("mtp")).unwrap();
    let (code, _) = call(&url, reqwest::Method::DELETE, "/perch/models/mtp", Some(json!({}))).await;
    assert_eq!(code, 200);
    assert!(!s.models.join("mtp").exists());

    // The control API sits behind the same guard as the engine's.
    let r = client()
        .get(format!("{url}/perch/config"))
        .header("Host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = client()
        .put(format!("{url}/perch/config"))
        .header("Origin", "https://evil.example")
        .json(&live)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // A new port: the listener moves, the old port closes.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut moved = live.clone();
    moved["port"] = json!(free);
    let t = Instant::now();
    let (code, r) = call(&url, reqwest::Method::PUT, "/perch/config", Some(moved)).await;
    assert_eq!(code, 200, "{r}");
    assert!(t.elapsed() < Duration::from_secs(5), "moving the port took {:?}", t.elapsed());
    assert_eq!(
        r["status"]["url"],
        format!("http://127.0.0.1:{free}"),
        "the answer says where the engine went: {r}"
    );
    let new_url = format!("http://127.0.0.1:{free}");
    assert_eq!(sup.url(), new_url);
    assert_eq!(chat(&new_url).await.0, 200);
    let t = Instant::now();
    while reqwest::get(format!("{url}/health")).await.is_ok() {
        assert!(t.elapsed() < Duration::from_secs(3), "the old port still answers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_at_start_serves_the_ui_and_says_why() {
    let s = setup();
    std::fs::write(&s.config, settings_text(&s.models, "draft = \"nope\"")).unwrap();
    let sup = Supervisor::start(&s.config, None).await.unwrap();
    let st = sup.status();
    assert_eq!(st.phase, Phase::Failed);
    assert_eq!(st.config_error.unwrap().field.as_deref(), Some("draft"));
    let url = sup.url();
    let r = reqwest::get(format!("{url}/")).await.unwrap();
    assert_eq!(r.status(), 200);
    // The windows load the pages over HTTP, where tauri.conf.json's CSP does not reach.
    let csp = r.headers().get("content-security-policy").map(|v| v.to_str().unwrap().to_string());
    let csp = csp.expect("the UI is served without a Content-Security-Policy");
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(r.text().await.unwrap().contains("<title>Perch</title>"));
    let r = reqwest::get(format!("{url}/v1/models")).await.unwrap();
    assert_eq!(
        r.headers().get("x-content-type-options").map(|v| v.as_bytes()),
        Some(&b"nosniff"[..])
    );
    let (code, e) = chat(&url).await;
    assert_eq!((code, &e["error"]["code"]), (503, &json!("engine_restarting")), "{e}");
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_imported_through_the_api_becomes_an_installed_model() {
    let Some(gguf) = gemma_gguf() else { return };
    let s = setup();
    let sup = running(&s).await;
    let url = sup.url();
    let (code, e) = call(
        &url,
        reqwest::Method::POST,
        "/perch/models/import",
        Some(json!({"path": "/nonexistent/model.gguf"})),
    )
    .await;
    assert_eq!((code, &e["error"]["param"]), (400, &json!("path")), "{e}");
    let (code, e) =
        call(&url, reqwest::Method::POST, "/perch/models/import", Some(json!({}))).await;
    assert_eq!((code, &e["error"]["param"]), (400, &json!("path")), "{e}");
    let (code, r) = call(
        &url,
        reqwest::Method::POST,
        "/perch/models/import",
        Some(json!({"path": gguf, "name": "gemma-imported"})),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["id"], "gemma-imported");
    let (_, list) = get(&url, "/perch/models").await;
    let m = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "gemma-imported")
        .cloned()
        .expect("listed");
    assert_eq!(
        (m["architecture"].as_str(), m["source"].as_str()),
        (Some("gemma3_text"), Some("installed")),
        "{m}"
    );
    assert!(m["size_bytes"].as_u64().unwrap() > 100_000_000, "{m}");
    // What Perch imported, Perch may delete.
    let (code, r) =
        call(&url, reqwest::Method::DELETE, "/perch/models/gemma-imported", Some(json!({}))).await;
    assert_eq!(code, 200, "{r}");
    assert!(!s.models.join("gemma-imported").exists());
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_length_setting_caps_every_request() {
    let s = setup();
    std::fs::write(&s.config, settings_text(&s.models, "draft = \"none\"\ncontext_length = 64"))
        .unwrap();
    let sup = running(&s).await;
    let url = sup.url();
    let long = "word ".repeat(100);
    let (code, e) = call(
        &url,
        reqwest::Method::POST,
        "/v1/chat/completions",
        Some(json!({"model": "chat", "messages": [{"role": "user", "content": long}]})),
    )
    .await;
    assert_eq!((code, &e["error"]["code"]), (400, &json!("context_length_exceeded")), "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("maximum context length is 64 tokens"),
        "{e}"
    );
    // A short prompt may only fill what is left of the 64 tokens.
    let (code, r) = call(&url, reqwest::Method::POST, "/v1/chat/completions", Some(json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}))).await;
    assert_eq!(code, 200, "{r}");
    let used = r["usage"]["prompt_tokens"].as_u64().unwrap()
        + r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(used <= 64, "{r}");
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_never_dropped_shown_or_cleared_by_omission() {
    let s = setup();
    let with_key =
        |extra: &str| settings_text(&s.models, &format!("api_key = \"sekrit\"\n{extra}"));
    let authed = |m: reqwest::Method, url: String| client().request(m, url).bearer_auth("sekrit");

    // A file that fails its checks at start (its default model was deleted) once fell back to
    // the defaults, which have no key: the control API answered anyone.
    std::fs::write(
        &s.config,
        with_key("").replace("default_model = \"chat\"", "default_model = \"deleted\""),
    )
    .unwrap();
    let sup = Supervisor::start(&s.config, None).await.unwrap();
    assert_eq!(sup.status().phase, Phase::Failed);
    let url = sup.url();
    assert_eq!(get(&url, "/perch/status").await.0, 401, "served without the file's key");
    assert_eq!(
        authed(reqwest::Method::GET, format!("{url}/perch/status")).send().await.unwrap().status(),
        200
    );
    sup.shutdown().await;

    // Running with a key: GET shows whether one is set, never the key itself.
    std::fs::write(&s.config, with_key("draft = \"none\"")).unwrap();
    let sup = Supervisor::start(&s.config, None).await.unwrap();
    wait_for(&sup, "the engine to run", |st| st.phase == Phase::Running).await;
    let url = sup.url();
    let cfg: Value = authed(reqwest::Method::GET, format!("{url}/perch/config"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&cfg["api_key_set"], &cfg["settings"]["api_key"]),
        (&json!(true), &json!("")),
        "{cfg}"
    );
    assert!(!cfg.to_string().contains("sekrit"), "{cfg}");

    // A body naming one field changes that field; the key, models directory and the rest stay.
    // (An empty key is what the settings page sends when its password field is left empty.)
    for body in [json!({"draft": "lookup"}), json!({"draft": "lookup", "api_key": ""})] {
        let r = authed(reqwest::Method::PUT, format!("{url}/perch/config"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let file = perch_engine::config::Settings::load(&s.config).unwrap();
        assert_eq!(
            (file.api_key.as_str(), file.draft.to_string(), file.models_dir.as_str()),
            ("sekrit", "lookup".to_string(), s.models.to_str().unwrap())
        );
        assert_eq!(file.default_model, "chat");
    }
    wait_for(&sup, "the restart", |st| st.phase == Phase::Running).await;
    assert_eq!(get(&sup.url(), "/perch/config").await.0, 401, "still guarded after the change");
    // A typo is still refused by name, and the file is left alone.
    let before = std::fs::read(&s.config).unwrap();
    let r = authed(reqwest::Method::PUT, format!("{}/perch/config", sup.url()))
        .json(&json!({"drfat": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(std::fs::read(&s.config).unwrap(), before);
    sup.shutdown().await;
}

#[test]
fn an_empty_settings_file_is_an_error_not_the_defaults() {
    // What a write cut short by a power loss leaves; the defaults would drop the key.
    for text in ["", "\n  \n"] {
        let e = perch_engine::config::Settings::parse(text, Path::new("perch.toml")).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_load_without_the_key_and_only_perchs_own_pages_change_settings() {
    let s = setup();
    let extra =
        "draft = \"none\"\napi_key = \"sekrit\"\nallowed_origins = [\"http://localhost:5173\"]";
    std::fs::write(&s.config, settings_text(&s.models, extra)).unwrap();
    let sup = running(&s).await;
    let url = sup.url();
    // The pages load without the key (they ask for it); the API still needs it.
    let html = client().get(format!("{url}/")).send().await.unwrap().text().await.unwrap();
    // The built page's script and style (Vite names them by content) and the icon.
    let assets: Vec<&str> =
        html.split('"').filter(|p| p.starts_with("/assets/") || *p == "/icon.png").collect();
    assert!(assets.iter().any(|a| a.ends_with(".js")), "no script in {html}");
    assert!(assets.iter().any(|a| a.ends_with(".css")), "no style in {html}");
    for page in assets {
        let r = client().get(format!("{url}{page}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{page}");
    }
    assert_eq!(get(&url, "/v1/models").await.0, 401);
    assert_eq!(get(&url, "/perch/status").await.0, 401);
    let write = |origin: Option<&str>, content_type: Option<&str>, body: &'static str| {
        let mut r =
            client().post(format!("{url}/perch/models/select")).bearer_auth("sekrit").body(body);
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        if let Some(t) = content_type {
            r = r.header("Content-Type", t);
        }
        r.send()
    };
    let own = url.clone();
    let json_type = Some("application/json");
    let select = r#"{"id":"chat"}"#;
    // An origin allowed to use the API may not change Perch itself; Perch's own page may.
    let r = write(Some("http://localhost:5173"), json_type, select).await.unwrap();
    assert_eq!(r.status(), 403);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "origin_not_allowed", "{e}");
    assert_eq!(write(Some(&own), json_type, select).await.unwrap().status(), 200);
    // Every Tauri app's pages have these origins: they are not Perch's own (its windows load
    // the UI from the engine, the origin above).
    for other_app in ["tauri://localhost", "http://tauri.localhost"] {
        let r = write(Some(other_app), json_type, select).await.unwrap();
        assert_eq!(r.status(), 403, "{other_app} changed Perch's settings");
    }
    // The allowed origin still reads and generates.
    let r = client()
        .get(format!("{url}/v1/models"))
        .bearer_auth("sekrit")
        .header("Origin", "http://localhost:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Bodies that need no CORS preflight (a form, text/plain) are refused, as is a typeless one.
    for t in [Some("text/plain"), Some("application/x-www-form-urlencoded"), None] {
        let r = write(None, t, select).await.unwrap();
        assert_eq!(r.status(), 415, "{t:?}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "unsupported_media_type", "{e}");
    }
    assert_eq!(
        write(None, Some("application/json; charset=utf-8"), select).await.unwrap().status(),
        200
    );
    // A write without a body needs no type (the page's cancel buttons send none).
    let r = client().post(format!("{url}/perch/downloads/999/cancel")).bearer_auth("sekrit").send();
    assert_ne!(r.await.unwrap().status(), 415);
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_saved_with_a_change_that_cannot_start_is_still_required() {
    let s = setup();
    // A model whose weights are damaged: the file's checks pass, the engine cannot load it.
    let broken = s.models.join("broken");
    install_fixture("qwen3", &broken);
    let weights = broken.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 3]).unwrap();
    let sup = running(&s).await;
    let url = sup.url();
    assert_eq!(get(&url, "/perch/status").await.0, 200, "no key yet");
    std::fs::write(
        &s.config,
        settings_text(&s.models, "draft = \"none\"\napi_key = \"sekrit\"")
            .replace("default_model = \"chat\"", "default_model = \"broken\""),
    )
    .unwrap();
    wait_for(&sup, "the failed start and the fallback", |st| {
        st.config_error.is_some() && st.phase == Phase::Running
    })
    .await;
    // The engine fell back to the old model, but not to the old (keyless) guard.
    assert_eq!(get(&url, "/perch/status").await.0, 401, "served without the saved key");
    let r = client().get(format!("{url}/v1/models")).bearer_auth("sekrit").send().await.unwrap();
    assert_eq!(r.status(), 200);
    sup.shutdown().await;
}
