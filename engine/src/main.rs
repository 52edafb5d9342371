//! `perch`: the headless command line of Perch's engine.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use perch_engine::chat::ChatMessage;
use perch_engine::model;
use perch_engine::paths::{models_dir, DEFAULT_MODEL_ID};
use perch_engine::{bench, SamplingParams};

#[derive(Parser)]
#[command(name = "perch", version, about = "Run local language models on MLX")]
struct Cli {
    /// Where installed models live (default: the platform data directory; env PERCH_MODELS_DIR).
    #[arg(long, global = true)]
    models_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: `serve`'s many options make it large, which costs nothing here.
#[allow(clippy::large_enum_variant)]
/// The settings' defaults (`Settings::default`, the one place for them), which `perch
/// serve`'s flags share.
fn defaults() -> perch_engine::config::Settings {
    perch_engine::config::Settings::default()
}

// Parsed once per process; boxing the large `serve` variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Generate text for a prompt and stream it to stdout.
    Run {
        /// Installed model id or a model directory.
        #[arg(long, short)]
        model: Option<String>,
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        /// Sampling temperature; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        top_k: u32,
        #[arg(long, default_value_t = 0.0)]
        min_p: f32,
        #[arg(long, default_value_t = 1.0)]
        repetition_penalty: f32,
        #[arg(long)]
        seed: Option<u64>,
        /// Stop before this text (repeatable).
        #[arg(long)]
        stop: Vec<String>,
        /// Send the prompt as is, without the model's chat template.
        #[arg(long)]
        raw: bool,
        /// Speculative decoding: none, lookup (prompt lookup), mtp, mtp:DEPTH (1-3) or auto
        /// (MTP when the model has a head, else lookup).
        #[arg(long, default_value = "none")]
        draft: perch_engine::decode::DraftSetting,
        /// Print token counts and speeds to stderr when done.
        #[arg(long, short)]
        verbose: bool,
        prompt: String,
    },
    /// Serve the OpenAI-compatible API (and /health, /metrics) on loopback.
    Serve {
        /// Run from a settings file (TOML, as the desktop app does): the other options are
        /// ignored, the file is watched, and an edit restarts the engine in-process. Also
        /// serves the control API (/api/*) the UI's settings and models pages use.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Installed model id or a model directory (default: the default model).
        #[arg(long, short)]
        model: Option<String>,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = perch_engine::server::DEFAULT_PORT)]
        port: u16,
        /// Require `Authorization: Bearer KEY` (mandatory when --host is not loopback; env
        /// PERCH_API_KEY).
        #[arg(long, env = "PERCH_API_KEY")]
        api_key: Option<String>,
        /// Web origin allowed to call the API from a browser (repeatable).
        #[arg(long, value_parser = perch_engine::config::parse_origin)]
        allow_origin: Vec<String>,
        /// Extra Host name requests may use besides localhost/127.0.0.1/::1 (repeatable).
        #[arg(long)]
        allow_host: Vec<String>,
        /// Speculative decoding for every request: auto, none, lookup, mtp, mtp:N.
        #[arg(long, default_value_t = defaults().draft)]
        draft: perch_engine::decode::DraftSetting,
        /// Requests that may wait for their turn; more get 429.
        #[arg(long, default_value_t = 32)]
        max_queue: usize,
        /// Requests generating at once, in one batch (1: one at a time, with drafts).
        #[arg(long, alias = "max-batch", default_value_t = perch_engine::runtime::engine::DEFAULT_MAX_BATCH)]
        parallel: usize,
        /// Most tokens a batch step feeds while a request streams (a long prompt joins this
        /// many a step).
        #[arg(long, default_value_t = perch_engine::runtime::batch::STEP_TOKENS)]
        step_tokens: usize,
        /// Largest request body in bytes.
        #[arg(long, default_value_t = 4 << 20)]
        max_body: usize,
        /// Most tokens one request may generate (default: up to the model's context).
        #[arg(long)]
        max_tokens_cap: Option<usize>,
        /// Request log directory (default: the platform log directory); `none` disables it.
        #[arg(long)]
        log_dir: Option<String>,
        /// Also log prompt and completion text.
        #[arg(long)]
        log_text: bool,
        /// Where the chat window keeps conversations (default: the platform data directory);
        /// `none`: not kept.
        #[arg(long)]
        conversations_dir: Option<String>,
        /// The MCP servers file for the chat's tools (default: `mcp.json` in the platform
        /// config directory); `none`: no MCP tools.
        #[arg(long)]
        mcp_file: Option<String>,
        /// Seconds an unused model stays loaded (0: unload after each request, -1: never).
        #[arg(long, default_value_t = defaults().keep_alive_s, allow_hyphen_values = true)]
        keep_alive: i64,
        /// Background warmup ladder: default ([512, 2560] tokens), turbo, off.
        #[arg(long, default_value_t = defaults().warmup_profile)]
        ladder: perch_engine::runtime::WarmupProfile,
        /// Quiet seconds after a request before the ladder may run.
        #[arg(long, default_value_t = defaults().idle_grace_s)]
        idle_grace: f64,
        /// Tokens per ladder prefill chunk (the longest a user waits for the ladder).
        #[arg(long, default_value_t = defaults().ladder_chunk)]
        ladder_chunk: usize,
        /// Interruptions of one rung that end the ladder.
        #[arg(long, default_value_t = defaults().ladder_max_interruptions)]
        ladder_max_interruptions: u32,
        /// Seconds the load-time MTP warmup may take before it is cancelled.
        #[arg(long, default_value_t = defaults().warmup_deadline_s)]
        warmup_deadline: f64,
        /// Skip the load-time MTP warmup.
        #[arg(long)]
        no_load_warmup: bool,
        /// Leave tool calls written outside the template's format (a ```json block, a bare
        /// object, another family's markup) as text.
        #[arg(long)]
        no_tool_call_recovery: bool,
        /// Prefix cache in memory, MiB (0: off).
        #[arg(long, default_value_t = defaults().prefix_cache_mb)]
        prefix_cache_mb: u64,
        /// Prefix cache on disk, MiB (0: off); it survives restarts.
        #[arg(long, default_value_t = defaults().prefix_cache_disk_mb)]
        prefix_cache_disk_mb: u64,
        /// Where the disk tier lives (default: the platform cache directory's `prefix`).
        #[arg(long)]
        prefix_cache_dir: Option<PathBuf>,
        /// Answer a model name clients send with an installed model: PATTERN=MODEL, `*` in the
        /// pattern matches anything, MODEL `default` is --model (repeatable; on top of
        /// `claude-*=default` and `gpt-*=default`).
        #[arg(long, value_name = "PATTERN=MODEL")]
        model_alias: Vec<String>,
        /// Run the model split by layers over several processes, one per line of this MLX
        /// ring hostfile (JSON: one list of "ip:port" per rank); needs --rank. Rank 0 serves
        /// the API; the others only run their layers (docs/sharding.md).
        #[arg(long, requires = "rank")]
        hostfile: Option<PathBuf>,
        /// This process's rank in --hostfile.
        #[arg(long, requires = "hostfile")]
        rank: Option<usize>,
        /// Seconds forming the group may wait for every rank before giving up.
        #[arg(long, default_value_t = 120.0)]
        join_timeout: f64,
    },
    /// Import a GGUF file as an installed model (MLX layout), or install a model folder
    /// (a sentence encoder in the sentence-transformers layout) as it is.
    Import {
        file: PathBuf,
        /// Model id (directory name); default: the file name.
        #[arg(long)]
        name: Option<String>,
        /// Re-quantize to MLX affine 4 or 8 bit, or `none` to keep dequantized weights.
        #[arg(long, default_value = "none")]
        quantize: String,
        /// Storage dtype of dequantized weights and quantization scales: bf16 or f32.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// Replace an installed model with the same id.
        #[arg(long)]
        overwrite: bool,
    },
    /// List installed models.
    Models {
        #[arg(long)]
        json: bool,
    },
    /// Measure prefill and decode speed, time to first token and peak memory.
    Bench {
        #[arg(long, short)]
        model: Option<String>,
        /// Measurements per figure (the median is reported).
        #[arg(long, default_value_t = 1)]
        runs: usize,
        #[arg(long, default_value_t = 128)]
        decode_tokens: usize,
        /// Print only the JSON report.
        #[arg(long)]
        json: bool,
        /// Compare speculative decoding with plain decoding instead: none, lookup, mtp,
        /// mtp:DEPTH or auto.
        #[arg(long)]
        draft: Option<perch_engine::decode::DraftSetting>,
        /// Prompt for --draft (default: a code-editing prompt for lookup, the bench passage
        /// otherwise).
        #[arg(long)]
        prompt: Option<String>,
        /// A scenario instead: `first-request` (TTFT of a request 0.5 s after start with the
        /// warmup ladder on vs off; decode rate after the ladder vs cold), `constrained`
        /// (decode under a JSON schema vs without, and the grammar's mask cost per token;
        /// --decode-tokens bounds the answer, at least 256), `batch` (one decode step of 1, 2,
        /// 4 and 8 sequences at once: step time and aggregate rate; --decode-tokens steps).
        #[arg(long)]
        scenario: Option<String>,
        /// For `--scenario batch`: the batch sizes to time.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        batch_sizes: Vec<usize>,
    },
}

fn main() -> ExitCode {
    // A template worker started by this program itself: it renders and exits here.
    perch_engine::chat::sandbox::serve_if_asked();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PERCH_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    perch_engine::chat::sandbox::install_self();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perch: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A model that is not installed, and how to install one.
fn not_installed(e: perch_engine::EngineError, dir: &std::path::Path) -> anyhow::Error {
    anyhow::anyhow!("{e}\n  models directory: {}\n  run `scripts/setup` to install the default model, or pass --model PATH", dir.display())
}

fn load(spec: Option<String>, dir: &std::path::Path) -> anyhow::Result<perch_engine::LoadedModel> {
    let spec = spec.unwrap_or_else(|| DEFAULT_MODEL_ID.to_string());
    let path = model::resolve(&spec, dir).map_err(|e| not_installed(e, dir))?;
    Ok(model::load_model(&path)?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let dir = cli.models_dir.unwrap_or_else(models_dir);
    match cli.command {
        Command::Run {
            model,
            max_tokens,
            temp,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            seed,
            stop,
            raw,
            draft,
            verbose,
            prompt,
        } => {
            use perch_engine::runtime::{
                Arrival, Engine, EngineConfig, KeepAlive, LadderConfig, Prompt, Turn, TurnEvent,
            };
            let spec = model.unwrap_or_else(|| DEFAULT_MODEL_ID.to_string());
            model::resolve(&spec, &dir).map_err(|e| not_installed(e, &dir))?;
            // The same turn a server runs, on an engine of one model without background work.
            let config = EngineConfig {
                models_dir: dir.clone(),
                model: spec,
                draft,
                keep_alive: KeepAlive::Forever,
                load_warmup: false,
                ladder: LadderConfig { enabled: false, ..Default::default() },
                ..Default::default()
            };
            let engine = std::sync::Arc::new(Engine::start(config)?);
            let info = engine.loaded().ok_or_else(|| anyhow::anyhow!("no model loaded"))?;
            let prompt = if !raw && info.tokenizer.has_chat_template() {
                Prompt::Messages(vec![ChatMessage::new("user", prompt)])
            } else {
                Prompt::Text(prompt)
            };
            let sampling = SamplingParams {
                temperature: temp,
                top_p,
                top_k,
                min_p,
                repetition_penalty,
                seed,
                ..Default::default()
            };
            let turn = Turn {
                max_tokens: Some(max_tokens),
                sampling,
                stop,
                ..Turn::new(info.id.parse()?, prompt)
            };
            let mut out = std::io::stdout().lock();
            let end = tokio::runtime::Runtime::new()?.block_on(async {
                let mut turn = Arrival::now(&engine).start(turn).await?;
                while let Some(ev) = turn.next().await {
                    match ev {
                        TurnEvent::Delta { text, .. } => {
                            let _ = out.write_all(text.as_bytes());
                            let _ = out.flush();
                        }
                        // `perch run` offers no tools.
                        TurnEvent::ToolCall(_)
                        | TurnEvent::ToolCallStart { .. }
                        | TurnEvent::ToolCallArgs { .. } => {}
                        // Reasoning goes to stderr, so stdout is the answer alone.
                        TurnEvent::Reasoning { text } => eprint!("{text}"),
                        TurnEvent::End(end) => return Ok(*end),
                        TurnEvent::Failed(e) => return Err(e),
                    }
                }
                Err(perch_engine::EngineError::Internal("the turn ended without a result".into()))
            })?;
            let g = end.generation;
            let _ = writeln!(out);
            if verbose {
                eprintln!(
                    "prompt {} tok, {:.1} tok/s | generated {} tok, {:.1} tok/s | ttft {:.3} s | finish {:?}",
                    g.prompt_tokens,
                    g.prefill_tokens_per_sec(),
                    g.tokens.len(),
                    g.decode_tokens_per_sec(),
                    g.ttft.as_secs_f64(),
                    g.finish_reason
                );
                if let Some(s) = &g.draft {
                    eprintln!(
                        "draft {}: acceptance {:.3}, accepted/drafted by depth {:?} / {:?}, {} bonus, {} verify calls",
                        s.mode, s.acceptance_rate, s.accepted_by_depth, s.drafted_by_depth, s.bonus_tokens, s.verify_calls
                    );
                }
            }
        }
        Command::Import { file, name, quantize, dtype, overwrite } => {
            use perch_engine::gguf::import::{import, ImportOptions, Quantize, StoreDtype};
            let quantize = match quantize.as_str() {
                "none" => Quantize::None,
                "4" => Quantize::Bits(4),
                "8" => Quantize::Bits(8),
                other => anyhow::bail!("--quantize must be 4, 8 or none, not `{other}`"),
            };
            let dtype = match dtype.as_str() {
                "bf16" => StoreDtype::Bf16,
                "f32" => StoreDtype::F32,
                other => anyhow::bail!("--dtype must be bf16 or f32, not `{other}`"),
            };
            // A model folder (a sentence encoder, or a Hugging Face-layout model) is checked
            // to load, then copied in as it is.
            let dir = if file.is_dir() {
                perch_engine::install::install_folder(&file, &dir, name.as_deref(), overwrite)?
            } else {
                import(&file, &dir, &ImportOptions { name, quantize, dtype, overwrite })?
            };
            println!("{}", dir.display());
        }
        Command::Serve { config: Some(_), hostfile: Some(_), .. } => {
            // The settings file has no sharding settings yet; running unsharded would drop
            // the flag silently.
            anyhow::bail!("--hostfile runs without --config (a sharded model is set by flags)");
        }
        Command::Serve { config: Some(path), .. } => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async move {
                let log_dir = Some(perch_engine::paths::log_dir());
                let sup = perch_engine::supervisor::Supervisor::start(&path, log_dir).await?;
                sup.watch()?;
                eprintln!(
                    "perch: settings {}; UI and API at {}/ (the model loads in the background)",
                    path.display(),
                    sup.url()
                );
                perch_engine::server::wait_for_signal().await;
                eprintln!("perch: shutting down");
                sup.shutdown().await;
                anyhow::Ok(())
            })?;
        }
        Command::Serve {
            config: None,
            model,
            host,
            port,
            api_key,
            allow_origin,
            allow_host,
            draft,
            max_queue,
            parallel,
            step_tokens,
            max_body,
            max_tokens_cap,
            log_dir,
            log_text,
            conversations_dir,
            mcp_file,
            keep_alive,
            ladder,
            idle_grace,
            ladder_chunk,
            ladder_max_interruptions,
            warmup_deadline,
            no_load_warmup,
            no_tool_call_recovery,
            prefix_cache_mb,
            prefix_cache_disk_mb,
            prefix_cache_dir,
            model_alias,
            hostfile,
            rank,
            join_timeout,
        } => {
            use perch_engine::runtime::{Engine, EngineConfig};
            use perch_engine::server::{ServeConfig, Server};
            let spec = model.unwrap_or_else(|| DEFAULT_MODEL_ID.to_string());
            let model_dir = model::resolve(&spec, &dir).map_err(|e| not_installed(e, &dir))?;
            anyhow::ensure!(
                join_timeout.is_finite() && (1.0..=86_400.0).contains(&join_timeout),
                "--join-timeout must be 1 to 86400 seconds, not {join_timeout}"
            );
            let shard = match (hostfile, rank) {
                (Some(hostfile), Some(rank)) => Some(perch_engine::shard::ShardConfig {
                    hostfile,
                    rank,
                    join_timeout: std::time::Duration::from_secs_f64(join_timeout),
                }),
                _ => None,
            };
            if let Some(shard) = shard.as_ref().filter(|s| s.rank > 0) {
                // A rank after 0 serves no API: it runs its layers until rank 0 leaves.
                let dtype = perch_engine::platform::ComputeDtype::Auto;
                perch_engine::shard::worker::run(shard, &model_dir, dtype)?;
                eprintln!("perch: rank 0 left; rank {} stops", shard.rank);
                return Ok(());
            }
            let mut config = EngineConfig {
                models_dir: dir.clone(),
                model: spec,
                draft,
                max_queue,
                max_batch: parallel,
                step_tokens,
                max_tokens_cap,
                shard,
                ..Default::default()
            };
            anyhow::ensure!(
                (1..=perch_engine::runtime::batch::MAX_BATCH).contains(&parallel),
                "--parallel must be 1 to {} requests, not {parallel}",
                perch_engine::runtime::batch::MAX_BATCH
            );
            anyhow::ensure!(
                (8..=8192).contains(&step_tokens),
                "--step-tokens must be 8 to 8192 tokens, not {step_tokens}"
            );
            config.keep_alive = perch_engine::runtime::KeepAlive::from_secs(keep_alive);
            config.load_warmup = !no_load_warmup;
            config.tool_call_recovery = !no_tool_call_recovery;
            config.ladder = perch_engine::runtime::LadderConfig::profile(ladder);
            let seconds = |name: &str, v: f64, min: f64| {
                anyhow::ensure!(
                    v.is_finite() && (min..=86_400.0).contains(&v),
                    "--{name} must be {min} to 86400 seconds, not {v}"
                );
                Ok(std::time::Duration::from_secs_f64(v))
            };
            config.ladder.idle_grace = seconds("idle-grace", idle_grace, 0.0)?;
            config.warmup_deadline = seconds("warmup-deadline", warmup_deadline, 0.1)?;
            anyhow::ensure!(ladder_chunk >= 1, "--ladder-chunk must be at least 1");
            anyhow::ensure!(
                ladder_max_interruptions >= 1,
                "--ladder-max-interruptions must be at least 1"
            );
            config.ladder.chunk = ladder_chunk;
            config.ladder.max_interruptions = ladder_max_interruptions;
            config.prefix_cache = perch_engine::prefix_cache::PrefixCacheConfig {
                ram_bytes: usize::try_from(prefix_cache_mb << 20)?,
                disk_bytes: prefix_cache_disk_mb << 20,
                disk_dir: Some(
                    prefix_cache_dir.unwrap_or_else(perch_engine::paths::prefix_cache_dir),
                ),
                block: perch_engine::prefix_cache::PrefixCacheConfig::block_for(api_key.is_some()),
            };
            let mut aliases: std::collections::BTreeMap<String, String> =
                perch_engine::runtime::ModelAliases::defaults().into_iter().collect();
            for a in &model_alias {
                let (p, m) = a.split_once('=').ok_or_else(|| {
                    anyhow::anyhow!("--model-alias must be PATTERN=MODEL, not `{a}`")
                })?;
                aliases.insert(p.to_string(), m.to_string());
            }
            config.model_aliases = perch_engine::runtime::ModelAliases::new(aliases)
                .map_err(|e| anyhow::anyhow!("--model-alias: {e}"))?;
            let engine_config = config;
            let log_dir = match log_dir.as_deref() {
                Some("none") => None,
                Some(d) => Some(PathBuf::from(d)),
                None => Some(perch_engine::paths::log_dir()),
            };
            let config = ServeConfig {
                host,
                port,
                api_key,
                allowed_origins: allow_origin,
                allowed_hosts: allow_host,
                max_body_bytes: max_body,
                log_dir: log_dir.clone(),
                log_text,
                conversations_dir: match conversations_dir.as_deref() {
                    Some("none") => None,
                    Some(d) => Some(PathBuf::from(d)),
                    None => Some(perch_engine::paths::conversations_dir()),
                },
                mcp_file: match mcp_file.as_deref() {
                    Some("none") => None,
                    Some(f) => Some(PathBuf::from(f)),
                    None => Some(perch_engine::paths::mcp_file()),
                },
                ..Default::default()
            };
            let rt = tokio::runtime::Runtime::new()?;
            let engine = rt.block_on(async {
                // Listen first: while the model loads (and a shard group forms, up to its
                // join timeout) clients get a 503 that says so, not a refused connection.
                let server = Server::bind(config.clone()).await?;
                let loading = match &engine_config.shard {
                    Some(s) => format!(
                        "The model `{}` is loading and its shard group is forming (every rank \
                         must join within {} s)",
                        engine_config.model,
                        s.join_timeout.as_secs_f64()
                    ),
                    None => format!("The model `{}` is loading", engine_config.model),
                };
                server.app_host.set_starting(loading);
                eprintln!(
                    "perch: listening on {}; loading {} (503 until it is ready)",
                    server.url(),
                    engine_config.model
                );
                let engine =
                    tokio::task::spawn_blocking(move || Engine::start(engine_config)).await??;
                let engine = std::sync::Arc::new(engine);
                server.host(engine.clone(), config)?;
                let id =
                    server.app().and_then(|a| a.engine.loaded()).map(|m| m.id).unwrap_or_default();
                eprintln!("perch: serving {id} at {}/v1", server.url());
                if let Some(d) = log_dir {
                    eprintln!("perch: request log in {}", d.display());
                }
                server.run_until_signal().await;
                anyhow::Ok(engine)
            })?;
            engine.leave_shard_group();
        }
        Command::Models { json } => {
            // Installed models and, in place, the Hugging Face cache's.
            let models = perch_engine::catalog::Catalog {
                models_dir: dir.clone(),
                hf_cache: perch_engine::catalog::hf_cache_dir(),
            }
            .list();
            if json {
                println!("{}", serde_json::to_string_pretty(&models)?);
            } else if models.is_empty() {
                println!("no models installed in {}", dir.display());
            } else {
                for m in models {
                    println!(
                        "{:<32} {:<9} {:<12} {:>8.1} MB  ctx {:<7} {:<10} {}",
                        m.id,
                        m.kind,
                        m.architecture,
                        m.size_bytes as f64 / 1e6,
                        m.context_length.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
                        m.format,
                        if m.source == perch_engine::catalog::Source::HfCache {
                            "(Hugging Face cache)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        Command::Bench {
            model,
            runs,
            decode_tokens,
            json,
            draft,
            prompt,
            scenario,
            batch_sizes,
        } => {
            if scenario.as_deref() == Some("constrained") {
                let model = load(model, &dir)?;
                let r = bench::constrained::run(&model, runs, decode_tokens.max(256))?;
                if !json {
                    print!("{}", r.table());
                }
                println!("{}", serde_json::to_string(&r)?);
                return Ok(());
            }
            if scenario.as_deref() == Some("batch") {
                let model = load(model, &dir)?;
                let r = bench::batch::run(&model, &batch_sizes, decode_tokens.clamp(8, 256))?;
                if !json {
                    print!("{}", r.table());
                }
                println!("{}", serde_json::to_string(&r)?);
                return Ok(());
            }
            if let Some(scenario) = scenario {
                anyhow::ensure!(
                    scenario == "first-request",
                    "unknown scenario `{scenario}` (first-request, constrained, batch)"
                );
                let spec = model.unwrap_or_else(|| DEFAULT_MODEL_ID.to_string());
                let config = perch_engine::runtime::EngineConfig {
                    models_dir: dir.clone(),
                    model: spec,
                    ..Default::default()
                };
                let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
                let r = rt.block_on(bench::first_request(config, 128, 16))?;
                if !json {
                    println!(
                        "model {}  ladder {:?} (chunk {})\nTTFT of a request 0.5 s after start: ladder off {:.3} s, on {:.3} s (one warming chunk {:.3} s)\n\
                         decode tok/s of the first 3 requests: cold engine {:.1}, after the ladder {:.1} (ladder took {:.1} s)",
                        r.model, r.ladder_rungs, r.ladder_chunk, r.ttft_ladder_off_s, r.ttft_ladder_on_s, r.warming_chunk_s, r.decode_cold_tok_s, r.decode_warm_tok_s, r.ladder_seconds
                    );
                }
                println!("{}", serde_json::to_string(&r)?);
                return Ok(());
            }
            let model = load(model, &dir)?;
            if let Some(draft) = draft {
                let mode = draft.mode(&model);
                let text = prompt.unwrap_or_else(|| match mode {
                    perch_engine::decode::DraftMode::Lookup { .. } => bench::CODE_EDIT.to_string(),
                    _ => bench::PASSAGE.to_string(),
                });
                let ids = model.tokenizer.encode(&text, true)?;
                let report = bench::run_draft(&model, &ids, mode, runs, decode_tokens)?;
                if !json {
                    print!("{}", report.table());
                }
                println!("{}", serde_json::to_string(&report)?);
                return Ok(());
            }
            let report = bench::run(&model, runs, decode_tokens)?;
            if !json {
                print!("{}", report.table());
            }
            println!("{}", serde_json::to_string(&report)?);
        }
    }
    Ok(())
}
