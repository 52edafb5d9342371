//! Perch's desktop shell: a menu-bar icon over the engine. The engine, its loopback server
//! and the settings file's restarts all run in-process through `perch_engine::supervisor`;
//! the windows load the engine's own UI over HTTP. Nothing here decides anything a test of
//! the engine could not see.

// No console window on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use perch_engine::config::Settings;
use perch_engine::supervisor::{Phase, Status, Supervisor};
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::{AppHandle, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder};
use tauri_plugin_autostart::ManagerExt as _;
use tauri_plugin_clipboard_manager::ClipboardExt as _;

const TRAY_ID: &str = "main";

struct Shell {
    sup: Arc<Supervisor>,
    /// What the tray menu shows now, so it is rebuilt only when something changed.
    shown: Mutex<String>,
}

/// Open (or bring forward) the chat or settings window. Windows load the engine's UI from its
/// own origin, so the UI needs no IPC and behaves as it does in a browser.
fn show_window(app: &AppHandle, label: &str) {
    if let Some(w) = app.get_webview_window(label) {
        let _ = w.show();
        let _ = w.unminimize();
        let _ = w.set_focus();
        return;
    }
    let sup = &app.state::<Shell>().sup;
    let hash = if label == "settings" { "#settings" } else { "#chat" };
    let Ok(url) = format!("{}/{hash}", sup.url()).parse() else { return };
    let (title, w, h) = if label == "settings" { ("Perch Settings", 640.0, 720.0) } else { ("Perch", 900.0, 640.0) };
    if let Err(e) = WebviewWindowBuilder::new(app, label, WebviewUrl::External(url)).title(title).inner_size(w, h).build() {
        tracing::error!("cannot open the {label} window: {e}");
    }
}

fn status_line(status: &Status) -> String {
    match status.phase {
        Phase::Running => status.loading.as_ref().map_or_else(|| status.message.clone(), |m| format!("Loading {m}…")),
        _ => status.message.clone(),
    }
}

/// The tray menu: status, models (checked: the default one), windows, API URL, quit.
fn build_menu(app: &AppHandle, key: &mut String) -> tauri::Result<Menu<tauri::Wry>> {
    let shell = app.state::<Shell>();
    let status = shell.sup.status();
    let settings = shell.sup.settings();
    let models = settings.as_ref().map(|s| s.catalog().list()).unwrap_or_default();
    let default = settings.as_ref().map(|s| s.default_model.clone()).unwrap_or_default();
    let rate = tauri::async_runtime::block_on(async {
        let app = shell.sup.app().await?;
        let last = app.last_request.lock().ok()?.clone()?;
        Some(format!(" · {:.1} tok/s", last.get("decode_tok_s")?.as_f64()?))
    });
    let memory = tauri::async_runtime::block_on(shell.sup.app()).and_then(|_| mlx_memory()).map(|b| format!(" · {:.0} MB", b as f64 / 1e6)).unwrap_or_default();
    let mut line = format!("{}{}{}", status_line(&status), rate.unwrap_or_default(), memory);
    if let Some(e) = &status.config_error {
        line = format!("Settings problem: {}", e.message);
    }
    *key = format!("{line}|{default}|{:?}|{}", status.loading, models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>().join(","));
    let menu = Menu::new(app)?;
    menu.append(&MenuItem::with_id(app, "status", line, false, None::<&str>)?)?;
    menu.append(&PredefinedMenuItem::separator(app)?)?;
    for m in &models {
        let loading = status.loading.as_deref() == Some(m.id.as_str());
        let text = if loading { format!("{} (loading…)", m.id) } else { m.id.clone() };
        menu.append(&CheckMenuItem::with_id(app, format!("model:{}", m.id), text, true, m.id == default, None::<&str>)?)?;
    }
    if models.is_empty() {
        menu.append(&MenuItem::with_id(app, "no-models", "No models installed", false, None::<&str>)?)?;
    }
    menu.append(&PredefinedMenuItem::separator(app)?)?;
    menu.append(&MenuItem::with_id(app, "chat", "Open Chat", true, None::<&str>)?)?;
    menu.append(&MenuItem::with_id(app, "settings", "Settings…", true, None::<&str>)?)?;
    menu.append(&MenuItem::with_id(app, "copy-url", format!("Copy API URL ({}/v1)", status.url), true, None::<&str>)?)?;
    menu.append(&PredefinedMenuItem::separator(app)?)?;
    menu.append(&MenuItem::with_id(app, "quit", "Quit Perch", true, None::<&str>)?)?;
    Ok(menu)
}

fn mlx_memory() -> Option<u64> {
    perch_engine::server::active_memory_bytes()
}

fn refresh_tray(app: &AppHandle) {
    let mut key = String::new();
    let menu = match build_menu(app, &mut key) {
        Ok(m) => m,
        Err(e) => return tracing::warn!("tray menu: {e}"),
    };
    let shell = app.state::<Shell>();
    let mut shown = shell.shown.lock().unwrap_or_else(|e| e.into_inner());
    if *shown == key {
        return;
    }
    *shown = key;
    if let Some(tray) = app.tray_by_id(TRAY_ID) {
        let _ = tray.set_menu(Some(menu));
        let _ = tray.set_tooltip(Some(format!("Perch — {}", shell.sup.status().message)));
    }
}

fn on_menu(app: &AppHandle, id: &str) {
    let sup = app.state::<Shell>().sup.clone();
    match id {
        "chat" => show_window(app, "chat"),
        "settings" => show_window(app, "settings"),
        "copy-url" => {
            let _ = app.clipboard().write_text(format!("{}/v1", sup.url()));
        }
        "quit" => {
            // The engine drains first: in-flight requests finish (or are cancelled at the
            // deadline) and leases return before the process goes.
            tauri::async_runtime::block_on(sup.shutdown());
            app.exit(0);
        }
        _ => {
            if let Some(model) = id.strip_prefix("model:") {
                let model = model.to_string();
                let app = app.clone();
                tauri::async_runtime::spawn(async move {
                    if let Err(e) = sup.select_model(&model).await {
                        tracing::warn!("cannot select {model}: {e}");
                    }
                    app.state::<Shell>().shown.lock().unwrap_or_else(|e| e.into_inner()).clear();
                });
            }
        }
    }
}

/// Keep "launch at login" in step with the settings.
fn apply_autostart(app: &AppHandle, settings: Option<&Settings>) {
    let Some(want) = settings.map(|s| s.launch_at_login) else { return };
    let auto = app.autolaunch();
    if auto.is_enabled().unwrap_or(!want) != want {
        let r = if want { auto.enable() } else { auto.disable() };
        if let Err(e) = r {
            tracing::warn!("launch at login: {e}");
        }
    }
}

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())).init();
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_single_instance::init(|app, _args, _cwd| show_window(app, "chat")))
        .plugin(tauri_plugin_autostart::init(tauri_plugin_autostart::MacosLauncher::LaunchAgent, None))
        .plugin(tauri_plugin_clipboard_manager::init())
        .setup(|app| {
            // A menu-bar app: no Dock icon.
            #[cfg(target_os = "macos")]
            app.set_activation_policy(tauri::ActivationPolicy::Accessory);
            let path = Settings::default_path();
            let sup = tauri::async_runtime::block_on(Supervisor::start(&path, Some(perch_engine::paths::log_dir())))?;
            sup.watch()?;
            tracing::info!(config = %path.display(), url = %sup.url(), "Perch started");
            app.manage(Shell { sup, shown: Mutex::new(String::new()) });
            let handle = app.handle().clone();
            app.on_menu_event(move |app, event| on_menu(app, event.id().as_ref()));
            if let Some(tray) = app.tray_by_id(TRAY_ID) {
                let _ = tray.set_show_menu_on_left_click(true);
            }
            refresh_tray(&handle);
            // The status line and model list follow the engine.
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let h = handle.clone();
                let _ = handle.run_on_main_thread(move || {
                    refresh_tray(&h);
                    apply_autostart(&h, h.state::<Shell>().sup.settings().as_ref());
                });
            });
            // First launch, and any launch on a desktop without a menu bar convention: the
            // chat window is where the user starts.
            if std::env::var_os("PERCH_NO_WINDOW").is_none() {
                show_window(app.handle(), "chat");
            }
            Ok(())
        })
        .build(tauri::generate_context!())
        .expect("error while building Perch");
    app.run(|_app, event| {
        // Closing the last window leaves Perch in the menu bar; only Quit exits.
        if let RunEvent::ExitRequested { api, code: None, .. } = event {
            api.prevent_exit();
        }
    });
}
