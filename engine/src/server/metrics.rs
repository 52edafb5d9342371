//! `/metrics`: Prometheus text for user requests only (background work is never counted).

use std::sync::Mutex;

use crate::prefix_cache::PrefixSnapshot;
use crate::runtime::batch::BatchStats;
use crate::sync::LockExt;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<Labels, Counter>,
    tokens: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    ttft: Histogram,
    decode_rate: Histogram,
    queue_depth: Gauge,
    active: Gauge,
    prefix_tokens: Family<Labels, Counter>,
    prefix_bytes: Family<Labels, Gauge>,
    prefix_entries: Family<Labels, Gauge>,
    batch_steps: Family<Labels, Counter>,
    batch_size: Gauge,
    batch_slots: Gauge,
    embedding_inputs: Counter,
    tool_notes: Family<Labels, Counter>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("perch");
        let requests = Family::<Labels, Counter>::default();
        let tokens = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let ttft = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        let decode_rate = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        let queue_depth = Gauge::default();
        let active = Gauge::default();
        registry.register(
            "requests",
            "User requests by endpoint and HTTP status",
            requests.clone(),
        );
        registry.register(
            "tokens",
            "Tokens processed for users (prompt, completion)",
            tokens.clone(),
        );
        registry.register(
            "errors",
            "User requests that ended in an error, by error type",
            errors.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Request arrival to first token",
            ttft.clone(),
        );
        registry.register(
            "decode_tokens_per_second",
            "Decode speed of each completed generation",
            decode_rate.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for the generation gate",
            queue_depth.clone(),
        );
        registry.register("active_generations", "Generations running now", active.clone());
        let prefix_tokens = Family::<Labels, Counter>::default();
        let prefix_bytes = Family::<Labels, Gauge>::default();
        let prefix_entries = Family::<Labels, Gauge>::default();
        registry.register(
            "prefix_cache_tokens",
            "User prompt tokens the prefix cache supplied (hit) or that were prefilled (miss)",
            prefix_tokens.clone(),
        );
        registry.register(
            "prefix_cache_bytes",
            "Bytes the prefix cache holds, by tier (ram, disk)",
            prefix_bytes.clone(),
        );
        registry.register(
            "prefix_cache_entries",
            "States the prefix cache holds, by tier (ram, disk)",
            prefix_entries.clone(),
        );
        let batch_steps = Family::<Labels, Counter>::default();
        let (batch_size, batch_slots) = (Gauge::default(), Gauge::default());
        registry.register(
            "batch_steps",
            "Forward passes of the batch, by how many requests sampled a token in each \
             (sequences=\"17+\" counts every larger batch)",
            batch_steps.clone(),
        );
        registry.register(
            "batch_size",
            "Requests that sampled a token in the batch's last forward pass",
            batch_size.clone(),
        );
        registry.register(
            "batch_slots",
            "Requests in the batch now, decoding or prefilling",
            batch_slots.clone(),
        );
        let embedding_inputs = Counter::default();
        registry.register(
            "embedding_inputs",
            "Inputs embedded for users (their tokens count in perch_tokens{kind=\"embedding\"})",
            embedding_inputs.clone(),
        );
        let tool_notes = Family::<Labels, Counter>::default();
        registry.register(
            "tool_call_notes",
            "Answers whose tool calls were recovered from another format (kind=\"recovered\") \
             or repeated a call already answered (kind=\"repeated\")",
            tool_notes.clone(),
        );
        Metrics {
            tool_notes,
            embedding_inputs,
            batch_steps,
            batch_size,
            batch_slots,
            registry: Mutex::new(registry),
            requests,
            tokens,
            errors,
            ttft,
            decode_rate,
            queue_depth,
            active,
            prefix_tokens,
            prefix_bytes,
            prefix_entries,
        }
    }

    /// One generation's prompt: tokens reused from the prefix cache and tokens prefilled.
    pub fn prefix_cache(&self, hit: usize, miss: usize) {
        for (kind, n) in [("hit", hit), ("miss", miss)] {
            self.prefix_tokens.get_or_create(&vec![("kind".into(), kind.into())]).inc_by(n as u64);
        }
    }

    /// One answer's tool notes: formats recovered from, calls repeated.
    pub fn tool_notes(&self, recovered: usize, repeated: usize) {
        for (kind, n) in [("recovered", recovered), ("repeated", repeated)] {
            if n > 0 {
                self.tool_notes.get_or_create(&vec![("kind".into(), kind.into())]).inc();
            }
        }
    }

    pub fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&vec![
                ("endpoint".into(), endpoint.into()),
                ("status".into(), status.to_string()),
            ])
            .inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&vec![("type".into(), kind.into())]).inc();
    }

    pub fn generation(
        &self,
        prompt_tokens: usize,
        completion_tokens: usize,
        ttft_s: f64,
        decode_tok_s: Option<f64>,
    ) {
        self.tokens
            .get_or_create(&vec![("kind".into(), "prompt".into())])
            .inc_by(prompt_tokens as u64);
        self.tokens
            .get_or_create(&vec![("kind".into(), "completion".into())])
            .inc_by(completion_tokens as u64);
        self.ttft.observe(ttft_s);
        if let Some(r) = decode_tok_s {
            self.decode_rate.observe(r);
        }
    }

    /// One embedding request's inputs and their tokens.
    pub fn embedding(&self, inputs: usize, tokens: usize) {
        self.embedding_inputs.inc_by(inputs as u64);
        self.tokens.get_or_create(&vec![("kind".into(), "embedding".into())]).inc_by(tokens as u64);
    }

    pub fn render(
        &self,
        queue_depth: usize,
        active: usize,
        prefix: &PrefixSnapshot,
        batch: &BatchStats,
    ) -> String {
        let sizes = batch.steps_by_size();
        let last = sizes.len() - 1;
        for (n, steps) in sizes {
            let label = if n == last { format!("{n}+") } else { n.to_string() };
            let counter = self.batch_steps.get_or_create(&vec![("sequences".into(), label)]);
            // The batch counts on its own thread; this counter only catches up with it.
            counter.inc_by(steps.saturating_sub(counter.get()));
        }
        self.batch_size.set(batch.last_batch.load(std::sync::atomic::Ordering::Relaxed) as i64);
        self.batch_slots.set(batch.slots().len() as i64);
        self.queue_depth.set(queue_depth as i64);
        self.active.set(active as i64);
        for (tier, bytes, entries) in [
            ("ram", prefix.ram_bytes, prefix.ram_entries),
            ("disk", prefix.disk_bytes, prefix.disk_entries),
        ] {
            let label = vec![("tier".to_string(), tier.to_string())];
            self.prefix_bytes.get_or_create(&label).set(bytes as i64);
            self.prefix_entries.get_or_create(&label).set(entries as i64);
        }
        let mut out = String::new();
        let registry = self.registry.locked();
        encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
