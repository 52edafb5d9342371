//! Perch's desktop shell: a menu-bar icon over the engine. The engine, its loopback server
//! and the settings file's restarts all run in-process through `perch_engine::supervisor`;
//! the windows load the engine's own UI over HTTP. Nothing here decides anything a test of
//! the engine could not see.

// No console window on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use perch_engine::config::Settings;
use perch_engine::supervisor::Supervisor;
use perch_engine::sync::LockExt;
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::{AppHandle, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder};
use tauri_plugin_autostart::ManagerExt as _;
use tauri_plugin_clipboard_manager::ClipboardExt as _;

const TRAY_ID: &str = "main";

struct Shell {
    sup: Arc<Supervisor>,
    shown: Mutex<ShownMenu>,
    /// The launch-at-login setting last applied.
    autostart: Mutex<Option<bool>>,
}

/// What the tray menu shows now.
#[derive(Default)]
struct ShownMenu {
    /// The models and API URL, as JSON: the menu is rebuilt when they change.
    structure: String,
    status_line: String,
    status_item: Option<MenuItem<tauri::Wry>>,
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
    let (title, w, h) = if label == "settings" {
        ("Perch Settings", 640.0, 720.0)
    } else {
        ("Perch", 900.0, 640.0)
    };
    if let Err(e) = WebviewWindowBuilder::new(app, label, WebviewUrl::External(url))
        .title(title)
        .inner_size(w, h)
        .build()
    {
        tracing::error!("cannot open the {label} window: {e}");
    }
}

/// Draw the engine's `TrayMenu`: status, models (checked: the default one), windows, API URL,
/// quit. The menu is rebuilt only when its items change; the status line is updated in place
/// (rebuilding a menu that is open would close it under the user's pointer).
fn refresh_tray(app: &AppHandle) {
    let shell = app.state::<Shell>();
    let model = shell.sup.tray_menu();
    let structure = serde_json::to_string(&(&model.models, &model.api_url)).unwrap_or_default();
    let mut shown = shell.shown.locked();
    if shown.structure == structure {
        if shown.status_line != model.status_line {
            if let Some(item) = &shown.status_item {
                let _ = item.set_text(&model.status_line);
            }
            if let Some(tray) = app.tray_by_id(TRAY_ID) {
                let _ = tray.set_tooltip(Some(format!("Perch — {}", model.status_line)));
            }
            shown.status_line = model.status_line;
        }
        return;
    }
    let build = || -> tauri::Result<(Menu<tauri::Wry>, MenuItem<tauri::Wry>)> {
        let menu = Menu::new(app)?;
        let status = MenuItem::with_id(app, "status", &model.status_line, false, None::<&str>)?;
        menu.append(&status)?;
        menu.append(&PredefinedMenuItem::separator(app)?)?;
        for m in &model.models {
            menu.append(&CheckMenuItem::with_id(
                app,
                format!("model:{}", m.id),
                &m.label,
                true,
                m.checked,
                None::<&str>,
            )?)?;
        }
        if model.models.is_empty() {
            menu.append(&MenuItem::with_id(
                app,
                "no-models",
                "No models installed",
                false,
                None::<&str>,
            )?)?;
        }
        menu.append(&PredefinedMenuItem::separator(app)?)?;
        menu.append(&MenuItem::with_id(app, "chat", "Open Chat", true, None::<&str>)?)?;
        menu.append(&MenuItem::with_id(app, "settings", "Settings…", true, None::<&str>)?)?;
        menu.append(&MenuItem::with_id(
            app,
            "copy-url",
            format!("Copy API URL ({})", model.api_url),
            true,
            None::<&str>,
        )?)?;
        menu.append(&PredefinedMenuItem::separator(app)?)?;
        menu.append(&MenuItem::with_id(app, "quit", "Quit Perch", true, None::<&str>)?)?;
        Ok((menu, status))
    };
    match (build(), app.tray_by_id(TRAY_ID)) {
        (Ok((menu, status)), Some(tray)) => {
            if let Err(e) = tray.set_menu(Some(menu)) {
                return tracing::warn!("tray menu: {e}");
            }
            let _ = tray.set_tooltip(Some(format!("Perch — {}", model.status_line)));
            *shown =
                ShownMenu { structure, status_line: model.status_line, status_item: Some(status) };
        }
        (Err(e), _) => tracing::warn!("tray menu: {e}"),
        (Ok(_), None) => {}
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
                    app.state::<Shell>()
                        .shown
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .structure
                        .clear();
                });
            }
        }
    }
}

/// After a port change, point the open windows at the engine's new address.
fn follow_port(app: &AppHandle) {
    let url = app.state::<Shell>().sup.url();
    for w in app.webview_windows().values() {
        let Ok(current) = w.url() else { continue };
        if current.as_str().starts_with(&url) || current.scheme() != "http" {
            continue;
        }
        let hash = current.fragment().map(|f| format!("#{f}")).unwrap_or_default();
        if let Ok(to) = format!("{url}/{hash}").parse() {
            let _ = w.navigate(to);
        }
    }
}

/// Keep "launch at login" in step with the settings.
fn apply_autostart(app: &AppHandle, settings: Option<&Settings>) {
    let Some(want) = settings.map(|s| s.launch_at_login) else { return };
    let shell = app.state::<Shell>();
    let mut applied = shell.autostart.locked();
    if *applied == Some(want) {
        return;
    }
    *applied = Some(want);
    let auto = app.autolaunch();
    if auto.is_enabled().unwrap_or(!want) != want {
        let r = if want { auto.enable() } else { auto.disable() };
        if let Err(e) = r {
            tracing::warn!("launch at login: {e}");
        }
    }
}

fn main() {
    // A template worker started by the app itself: it renders and exits here.
    perch_engine::chat::sandbox::serve_if_asked();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    perch_engine::chat::sandbox::install_self();
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_single_instance::init(|app, _args, _cwd| show_window(app, "chat")))
        .plugin(tauri_plugin_autostart::init(
            tauri_plugin_autostart::MacosLauncher::LaunchAgent,
            None,
        ))
        .plugin(tauri_plugin_clipboard_manager::init())
        .setup(|app| {
            // A menu-bar app: no Dock icon.
            #[cfg(target_os = "macos")]
            app.set_activation_policy(tauri::ActivationPolicy::Accessory);
            let path = Settings::default_path();
            let sup = tauri::async_runtime::block_on(Supervisor::start(
                &path,
                Some(perch_engine::paths::log_dir()),
            ))?;
            sup.watch()?;
            tracing::info!(config = %path.display(), url = %sup.url(), "Perch started");
            app.manage(Shell {
                sup,
                shown: Mutex::new(ShownMenu::default()),
                autostart: Mutex::new(None),
            });
            let handle = app.handle().clone();
            app.on_menu_event(move |app, event| on_menu(app, event.id().as_ref()));
            if let Some(tray) = app.tray_by_id(TRAY_ID) {
                let _ = tray.set_show_menu_on_left_click(true);
            }
            refresh_tray(&handle);
            // The status line and model list follow the engine.
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_millis(250));
                let h = handle.clone();
                let _ = handle.run_on_main_thread(move || {
                    refresh_tray(&h);
                    follow_port(&h);
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
