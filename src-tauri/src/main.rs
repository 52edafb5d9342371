//! Perch's desktop shell. For now a window over `ui/`; the menu-bar icon, the in-process
//! engine server and the settings window come with the desktop-app issue. Logic belongs in
//! `perch-engine`, not here.

// No console window on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    let models_dir = perch_engine::paths::models_dir();
    eprintln!("perch: models in {}", models_dir.display());
    tauri::Builder::default()
        .run(tauri::generate_context!())
        .expect("error while running the Perch window");
}
