//! The desktop app (the `perch-app` binary cargo builds for this test) in a real window under
//! Xvfb and a D-Bus session, driven by tauri-driver + WebKitWebDriver (`tests/ui/app.mjs`): the chat window opens on the engine's UI and answers. The app runs
//! with its own settings file and a fixture model; a screenshot goes to
//! `target/test-artifacts/app/`.

#![cfg_attr(not(target_os = "linux"), allow(unused))]

use std::path::PathBuf;
use std::process::Command;

fn fixture_dir(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

// Xvfb, tauri-driver and WebKitWebDriver are Linux tools; on macOS the app is checked by hand.
#[cfg(target_os = "linux")]
#[test]
fn the_desktop_app_opens_its_chat_window_and_answers() {
    let app = PathBuf::from(env!("CARGO_BIN_EXE_perch-app"));
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(models.join("chat")).unwrap();
    for f in std::fs::read_dir(fixture_dir("qwen3-mtp")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, models.join("chat").join(f.file_name().unwrap())).unwrap();
    }
    let config = tmp.path().join("config/perch.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(
        &config,
        format!("models_dir = \"{}\"\ndefault_model = \"chat\"\nport = 0\nwarmup_profile = \"off\"\nload_warmup = false\nscan_hf_cache = false\ndraft = \"none\"\nlaunch_at_login = true\n", models.display()),
    )
    .unwrap();
    let driver = std::env::var("TAURI_DRIVER").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        let installed = PathBuf::from(home).join(".cargo/bin/tauri-driver");
        if installed.exists() { installed.display().to_string() } else { "tauri-driver".into() }
    });
    let out = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1280x900x24", "dbus-run-session", "--", "node"])
        .arg(root().join("tests/ui/app.mjs"))
        .arg(&app)
        .arg(root().join("target/test-artifacts/app"))
        .env("TAURI_DRIVER", driver)
        .env("PERCH_CONFIG", &config)
        .env("PERCH_LOG_DIR", tmp.path().join("logs"))
        .env("PERCH_DTYPE", "f32")
        // The app's data (window state, single-instance lock) stays out of the user's home.
        .env("XDG_DATA_HOME", tmp.path().join("data"))
        .env("XDG_CONFIG_HOME", tmp.path().join("xdg-config"))
        // Autostart entries go under $HOME/.config/autostart.
        .env("HOME", tmp.path().join("home"))
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .expect("xvfb-run, dbus-run-session and node (scripts/setup-ui installs them)");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the desktop app check failed");
    // `launch_at_login = true` in the settings: the app registered itself (XDG autostart).
    let autostart: Vec<_> = std::fs::read_dir(tmp.path().join("home/.config/autostart")).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    assert!(autostart.iter().any(|p| p.extension().is_some_and(|e| e == "desktop")), "no autostart entry: {autostart:?}");
}
