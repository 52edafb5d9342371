//! Compiles the chat UI into the engine: every file `scripts/setup-ui` built into `ui/dist`
//! (Vite's output, from the lock file), listed with its type in `$OUT_DIR/ui_files.rs`.
//! Without a build the engine serves one page saying how to make it, so `cargo build` works
//! on a fresh clone and the API is unaffected.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn mime(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let dist = manifest.join("../ui/dist");
    // A directory is watched as a whole: a new build reruns this script.
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = vec![];
    walk(&dist, &mut files);
    files.sort();
    let mut code = String::from("pub const FILES: &[(&str, &str, &[u8])] = &[\n");
    let built = files.iter().any(|f| f.ends_with("index.html"));
    if built {
        for f in &files {
            let rel = f.strip_prefix(&dist).unwrap().to_string_lossy().replace('\\', "/");
            let route = if rel == "index.html" { "/".to_string() } else { format!("/{rel}") };
            let _ = writeln!(
                code,
                "    ({route:?}, {:?}, include_bytes!({:?})),",
                mime(f),
                f.canonicalize().unwrap().display().to_string()
            );
        }
    } else {
        println!(
            "cargo:warning=ui/dist is not built: the engine will serve a page asking for scripts/setup-ui"
        );
        code.push_str(
            "    (\"/\", \"text/html; charset=utf-8\", b\"<!doctype html><title>Perch</title><p>Perch's chat UI is not built into this binary. Run <code>scripts/setup-ui</code>, then build Perch again. The API at <code>/v1</code> works without it.</p>\"),\n",
        );
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("ui_files.rs");
    std::fs::write(out, code).unwrap();
}
