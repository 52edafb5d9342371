//! Chat templates rendered in a child process with bounded memory, stack and time: a
//! downloaded template can build strings without bound (minijinja's fuel counts steps, not
//! bytes: `~` doubling reaches 256 MiB in a few dozen steps) or nest a value deeper than
//! the stack when it is printed, and either, rendered in the server's own process, aborts it.
//!
//! A program that serves untrusted templates (`perch`, the app) calls [`serve_if_asked`]
//! first thing in `main` and then [`install`] with its own executable; from then on every
//! [`ChatTemplate::render`](super::ChatTemplate::render) in the process goes to a pool of
//! workers, which are that same executable started with [`WORKER_ENV`] set. Where nothing
//! is installed (the library's own tests, embedders) templates render in-process, bounded
//! by fuel and output size only.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::template::{ChatMessage, ChatOptions, ChatTemplate, RenderElsewhere};
use crate::error::{EngineError, Result};
use crate::sync::LockExt;

/// Set in a worker's environment: the process renders templates from stdin and exits.
pub const WORKER_ENV: &str = "PERCH_TEMPLATE_WORKER";

/// Memory a worker may hold (its data segment: the heap and anonymous mappings). A 4 MiB
/// request body renders in a few tens of MiB; the libraries' own start-up takes some too.
pub const WORKER_MEMORY_BYTES: u64 = 1 << 30;
/// The rendering thread's stack: minijinja's own recursion stops at 500 levels, far within
/// it; printing a value nested deeper than this allows kills the worker, not the server.
pub const WORKER_STACK_BYTES: usize = 8 << 20;
/// Wall time for one render, past the fuel's fraction of a second (a single step can still
/// be slow: a huge string repeated or replaced).
pub const RENDER_TIMEOUT: Duration = Duration::from_secs(10);
/// Workers kept waiting between renders; more start when more render at once.
const IDLE_WORKERS: usize = 4;

static SANDBOX: OnceLock<Sandbox> = OnceLock::new();

/// Render every chat template of this process in workers started from `exe` (a program
/// whose `main` calls [`serve_if_asked`] first). Later calls change nothing.
pub fn install(exe: PathBuf) {
    let _ = SANDBOX.set(Sandbox { exe, idle: Mutex::new(Vec::new()) });
    if let Some(sandbox) = SANDBOX.get() {
        super::template::render_elsewhere(sandbox);
    }
}

/// [`install`] with this program's own executable (its `main` calls [`serve_if_asked`]).
pub fn install_self() {
    match std::env::current_exe() {
        Ok(exe) => install(exe),
        Err(e) => {
            tracing::warn!(error = %e, "templates render in-process: no path to this program")
        }
    }
}

/// In a worker (its environment has [`WORKER_ENV`]): bound this process, answer render
/// jobs from stdin until it closes, and exit. Elsewhere: return at once.
pub fn serve_if_asked() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    limit_memory(WORKER_MEMORY_BYTES);
    let worker = std::thread::Builder::new()
        .name("template-worker".into())
        .stack_size(WORKER_STACK_BYTES)
        .spawn(worker_loop)
        .expect("start the template worker's thread");
    let code = match worker.join() {
        Ok(Ok(())) => 0,
        _ => 1,
    };
    std::process::exit(code);
}

#[cfg(unix)]
fn limit_memory(bytes: u64) {
    let limit = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: bytes as libc::rlim_t };
    // SAFETY: setrlimit reads the struct it is given; failure leaves the limit as it was.
    unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) };
}

#[cfg(not(unix))]
fn limit_memory(_bytes: u64) {}

/// One render, as the server sends it to a worker.
#[derive(Serialize, Deserialize)]
struct Job {
    source: String,
    bos_token: String,
    eos_token: String,
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    tools: Vec<Value>,
    kwargs: Map<String, Value>,
}

/// A worker's answer: the text, or the error `render_here` gave.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Text(String),
    Failed(String),
    Rejected(String),
}

fn worker_loop() -> std::io::Result<()> {
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    while let Some(frame) = read_frame(&mut input)? {
        let reply = match serde_json::from_slice::<Job>(&frame) {
            Ok(job) => {
                let template = ChatTemplate {
                    source: job.source,
                    bos_token: job.bos_token,
                    eos_token: job.eos_token,
                };
                let options = ChatOptions { tools: job.tools, kwargs: job.kwargs };
                match template.render_here(&job.messages, job.add_generation_prompt, &options) {
                    Ok(text) => Reply::Text(text),
                    Err(EngineError::TemplateRejected(m)) => Reply::Rejected(m),
                    Err(EngineError::Template(m)) => Reply::Failed(m),
                    Err(e) => Reply::Failed(e.to_string()),
                }
            }
            Err(e) => Reply::Failed(format!("the worker could not read its job: {e}")),
        };
        let bytes = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
        write_frame(&mut output, &bytes)?;
    }
    Ok(())
}

/// A length-prefixed frame, or `None` at a clean end of input.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 8];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut frame = vec![0u8; u64::from_le_bytes(len) as usize];
    r.read_exact(&mut frame)?;
    Ok(Some(frame))
}

fn write_frame(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)?;
    w.flush()
}

/// The pool of workers one process renders through.
pub(crate) struct Sandbox {
    exe: PathBuf,
    idle: Mutex<Vec<Worker>>,
}

impl RenderElsewhere for Sandbox {
    /// Render in a worker; a worker that dies or runs late is killed and the render is a
    /// template error saying which bound it met.
    fn render(
        &self,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String> {
        let job = Job {
            source: template.source.clone(),
            bos_token: template.bos_token.clone(),
            eos_token: template.eos_token.clone(),
            messages: messages.to_vec(),
            add_generation_prompt,
            tools: options.tools.clone(),
            kwargs: options.kwargs.clone(),
        };
        let frame = serde_json::to_vec(&job).map_err(|e| EngineError::Template(e.to_string()))?;
        let taken = self.idle.locked().pop();
        let mut worker = match taken {
            Some(w) => w,
            None => Worker::start(&self.exe)?,
        };
        match worker.call(&frame, Instant::now() + RENDER_TIMEOUT) {
            Ok(reply) => {
                let mut idle = self.idle.locked();
                if idle.len() < IDLE_WORKERS {
                    idle.push(worker);
                }
                drop(idle);
                match reply {
                    Reply::Text(text) => Ok(text),
                    Reply::Failed(m) => Err(EngineError::Template(m)),
                    Reply::Rejected(m) => Err(EngineError::TemplateRejected(m)),
                }
            }
            Err(end) => Err(EngineError::Template(worker.ended(end))),
        }
    }
}

/// How a call to a worker went wrong.
enum End {
    Late,
    Io(std::io::Error),
}

/// One running worker process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
}

impl Worker {
    fn start(exe: &std::path::Path) -> Result<Worker> {
        let mut child = Command::new(exe)
            .env(WORKER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                EngineError::Template(format!(
                    "could not start a template worker ({}): {e}",
                    exe.display()
                ))
            })?;
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        Ok(Worker { child, stdin, stdout })
    }

    fn call(&mut self, frame: &[u8], deadline: Instant) -> std::result::Result<Reply, End> {
        // The worker reads the whole job before it writes, so writing first cannot deadlock.
        write_frame(&mut self.stdin, frame).map_err(End::Io)?;
        let mut len = [0u8; 8];
        read_by(&mut self.stdout, &mut len, deadline)?;
        let mut reply = vec![0u8; u64::from_le_bytes(len) as usize];
        read_by(&mut self.stdout, &mut reply, deadline)?;
        serde_json::from_slice(&reply).map_err(|e| End::Io(std::io::Error::other(e)))
    }

    /// Kill the worker and say what ended it, from its own last words where it left any.
    fn ended(mut self, end: End) -> String {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        let mut last_words = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut last_words);
        }
        match end {
            End::Late => format!(
                "the template ran past its {} s budget and was stopped",
                RENDER_TIMEOUT.as_secs()
            ),
            _ if last_words.contains("overflowed its stack") => format!(
                "the template nested deeper than its renderer's {} MiB stack and was stopped",
                WORKER_STACK_BYTES >> 20
            ),
            _ if last_words.contains("memory allocation") => format!(
                "the template needed more than its renderer's {} MiB of memory and was stopped",
                WORKER_MEMORY_BYTES >> 20
            ),
            End::Io(e) => {
                let how = status.map_or_else(|| "ended".to_string(), |s| s.to_string());
                format!("the template's renderer died ({how}): {e}")
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing stdin ends a worker's loop; a killed or finished one is reaped here.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fill `buf` from a worker's stdout, giving up at `deadline`.
fn read_by(r: &mut ChildStdout, buf: &mut [u8], deadline: Instant) -> std::result::Result<(), End> {
    let mut at = 0;
    while at < buf.len() {
        wait_readable(r, deadline)?;
        match r.read(&mut buf[at..]) {
            Ok(0) => return Err(End::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(End::Io(e)),
        }
    }
    Ok(())
}

#[cfg(unix)]
fn wait_readable(r: &ChildStdout, deadline: Instant) -> std::result::Result<(), End> {
    use std::os::fd::AsRawFd;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(End::Late);
        }
        let mut fd = libc::pollfd { fd: r.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one pollfd, owned here, for the duration of the call.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            n if n > 0 => return Ok(()),
            0 => {}
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(End::Io(e));
                }
            }
        }
    }
}

#[cfg(not(unix))]
fn wait_readable(_r: &ChildStdout, _deadline: Instant) -> std::result::Result<(), End> {
    Ok(())
}
