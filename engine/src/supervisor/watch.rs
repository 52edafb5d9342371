//! Watches the settings file and calls back once a burst of changes has settled. The
//! directory is watched, not the file: editors save by writing a new file and renaming it.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};

pub struct Watcher {
    _inner: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watcher {
    pub fn new<F, Fut>(
        runtime: &tokio::runtime::Handle,
        file: &Path,
        settle: Duration,
        on_change: F,
    ) -> notify::Result<Watcher>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        std::fs::create_dir_all(&dir).map_err(notify::Error::io)?;
        let name = file.file_name().map(|n| n.to_os_string());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut inner =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event {
                    if event.kind.is_access() {
                        return;
                    }
                    if event.paths.iter().any(|p| p.file_name().map(|n| n.to_os_string()) == name) {
                        let _ = tx.send(());
                    }
                }
            })?;
        inner.watch(&dir, RecursiveMode::NonRecursive)?;
        let task = runtime.spawn(async move {
            while rx.recv().await.is_some() {
                // Debounce: wait until the file has been quiet for `settle`.
                loop {
                    match tokio::time::timeout(settle, rx.recv()).await {
                        Ok(Some(())) => continue,
                        Ok(None) => return,
                        Err(_) => break,
                    }
                }
                on_change().await;
            }
        });
        Ok(Watcher { _inner: inner, task })
    }
}
