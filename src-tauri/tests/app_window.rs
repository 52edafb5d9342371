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

/// A home for one app run: models (`chat`, and `mtp` when asked), a settings file, and the
/// environment that keeps the app's files out of the user's home.
struct Sandbox {
    tmp: tempfile::TempDir,
    config: PathBuf,
}

impl Sandbox {
    fn new(models: &[&str], extra: &str) -> Sandbox {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("models");
        for id in models {
            std::fs::create_dir_all(dir.join(id)).unwrap();
            for f in std::fs::read_dir(fixture_dir("qwen3-mtp")).unwrap() {
                let f = f.unwrap().path();
                std::fs::copy(&f, dir.join(id).join(f.file_name().unwrap())).unwrap();
            }
        }
        let config = tmp.path().join("config/perch.toml");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        let text = format!("models_dir = \"{}\"\ndefault_model = \"chat\"\nwarmup_profile = \"off\"\nload_warmup = false\nscan_hf_cache = false\ndraft = \"none\"\n{extra}\n", dir.display());
        std::fs::write(&config, text).unwrap();
        Sandbox { tmp, config }
    }

    /// `xvfb-run dbus-run-session -- <args>` with the sandbox's environment.
    fn run(&self, args: &[&str]) -> std::process::Output {
        let t = self.tmp.path();
        let out = Command::new("xvfb-run")
            .args(["-a", "-s", "-screen 0 1280x900x24", "dbus-run-session", "--"])
            .args(args)
            .env("PERCH_CONFIG", &self.config)
            .env("PERCH_LOG_DIR", t.join("logs"))
            .env("PERCH_DTYPE", "f32")
            // The app's data (window state, single-instance lock) stays out of the user's home.
            .env("XDG_DATA_HOME", t.join("data"))
            .env("XDG_CONFIG_HOME", t.join("xdg-config"))
            .env("XDG_CACHE_HOME", t.join("cache"))
            // Autostart entries go under $HOME/.config/autostart.
            .env("HOME", t.join("home"))
            .output()
            .expect("xvfb-run and dbus-run-session (scripts/setup-ui installs them)");
        println!("{}", String::from_utf8_lossy(&out.stdout));
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        out
    }
}

fn arg(p: &std::path::Path) -> String {
    p.display().to_string()
}

// Xvfb, tauri-driver and WebKitWebDriver are Linux tools; on macOS the app is checked by hand.
#[cfg(target_os = "linux")]
#[test]
fn the_desktop_app_opens_its_chat_window_and_answers() {
    let app = PathBuf::from(env!("CARGO_BIN_EXE_perch-app"));
    let sandbox = Sandbox::new(&["chat"], "port = 0\nlaunch_at_login = true");
    let driver = std::env::var("TAURI_DRIVER").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        let installed = PathBuf::from(home).join(".cargo/bin/tauri-driver");
        if installed.exists() {
            installed.display().to_string()
        } else {
            "tauri-driver".into()
        }
    });
    std::env::set_var("TAURI_DRIVER", driver);
    let out = sandbox.run(&[
        "node",
        &arg(&root().join("tests/ui/app.mjs")),
        &arg(&app),
        &arg(&root().join("target/test-artifacts/app")),
    ]);
    assert!(out.status.success(), "the desktop app check failed");
    // `launch_at_login = true` in the settings: the app registered itself (XDG autostart).
    let autostart: Vec<_> = std::fs::read_dir(sandbox.tmp.path().join("home/.config/autostart"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        autostart.iter().any(|p| p.extension().is_some_and(|e| e == "desktop")),
        "no autostart entry: {autostart:?}"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn the_menu_bar_icon_opens_its_menu_picks_a_model_and_quits() {
    let app = PathBuf::from(env!("CARGO_BIN_EXE_perch-app"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sandbox = Sandbox::new(&["chat", "mtp"], &format!("port = {port}"));
    let out = sandbox.run(&[
        "python3",
        &arg(&root().join("tests/ui/tray.py")),
        &arg(&app),
        &port.to_string(),
        &arg(&root().join("target/test-artifacts/app")),
    ]);
    assert!(out.status.success(), "the tray check failed (screens in target/test-artifacts/app/)");
}
