//! Counters exposed at `GET /metrics` in the Prometheus text format. Plain atomics: the
//! request path pays a relaxed increment per event and nothing else.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::checkpoint::cache::Health;
use crate::checkpoint::Checkpoints;
use crate::compaction_report::Trigger;
use crate::dialect::Dialect;
use crate::engine::SummarySource;

/// The summary sources counted: a compaction without a summary counts none.
const SOURCES: [SummarySource; 4] = [
    SummarySource::Llm,
    SummarySource::Fallback,
    SummarySource::Cache,
    SummarySource::CachedFallback,
];

/// Upper bounds (seconds) of the compaction-time histogram: compaction work is
/// expected in the sub-millisecond to tens-of-milliseconds range.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Why a summariser answer was not used: the `reason` label of
/// `compaction_proxy_summarizer_rejected_total` (the summariser tells its checks' findings
/// in these terms, so every reason it can give has its counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    Empty,
    Truncated,
    Refusal,
    Structure,
    Echo,
    NoContent,
    Short,
    DroppedFacts,
}

impl Rejection {
    /// Every reason, in the order the metrics list them (each at its own index).
    pub const ALL: [Rejection; 8] = [
        Rejection::Empty,
        Rejection::Truncated,
        Rejection::Refusal,
        Rejection::Structure,
        Rejection::Echo,
        Rejection::NoContent,
        Rejection::Short,
        Rejection::DroppedFacts,
    ];

    /// The label in metrics and log lines.
    pub fn label(self) -> &'static str {
        match self {
            Rejection::Empty => "empty",
            Rejection::Truncated => "truncated",
            Rejection::Refusal => "refusal",
            Rejection::Structure => "structure",
            Rejection::Echo => "echo",
            Rejection::NoContent => "no-content",
            Rejection::Short => "short",
            Rejection::DroppedFacts => "dropped-facts",
        }
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    upstream_attempts: AtomicU64,
    /// Connections the upstream switched to another protocol (101), relayed since.
    upgrades: AtomicU64,
    /// Codex Responses WebSockets the proxy terminated and carried over HTTP.
    websockets_bridged: AtomicU64,
    /// `response.create` frames carried over HTTP on those connections.
    websocket_responses: AtomicU64,
    compactions: [AtomicU64; Trigger::ALL.len()],
    /// Requests whose completion cap was lowered to fit the window, by trigger.
    output_lowered: [AtomicU64; Trigger::ALL.len()],
    /// Requests rewritten, by API: chat completions, the Responses API.
    compactions_by_api: [AtomicU64; Dialect::ALL.len()],
    summaries: [AtomicU64; SOURCES.len()],
    tokens_saved: AtomicU64,
    /// Requests economy mode shortened, and the tokens it took off them (apart from
    /// compaction's: economy acts far below the window, on every request).
    economy_requests: AtomicU64,
    economy_tokens_saved: AtomicU64,
    /// Summariser calls that gave a usable summary (`[0]`) or did not (`[1]`).
    summarizer_calls: [AtomicU64; 2],
    /// Summariser answers rejected, by reason.
    summarizer_rejected: [AtomicU64; Rejection::ALL.len()],
    /// Summaries not asked for: the summariser's window cannot hold its prompt and turns.
    summarizer_skipped: AtomicU64,
    compaction_time: Histogram,
    /// `malloc_trim` calls, each after a fall in load.
    memory_trims: AtomicU64,
}

impl Metrics {
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests received so far: the memory trimmer's measure of load.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn memory_trim(&self) {
        self.memory_trims.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upstream_attempt(&self) {
        self.upstream_attempts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upgrade(&self) {
        self.upgrades.fetch_add(1, Ordering::Relaxed);
    }

    pub fn websocket_bridged(&self) {
        self.websockets_bridged.fetch_add(1, Ordering::Relaxed);
    }

    pub fn websocket_response(&self) {
        self.websocket_responses.fetch_add(1, Ordering::Relaxed);
    }

    pub fn compaction(&self, trigger: Trigger) {
        self.compactions[trigger as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A rewritten request of the API `dialect` speaks.
    pub fn compaction_of_api(&self, dialect: Dialect) {
        self.compactions_by_api[dialect as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn output_lowered(&self, trigger: Trigger) {
        self.output_lowered[trigger as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn summary(&self, source: SummarySource) {
        if let Some(i) = SOURCES.iter().position(|s| *s == source) {
            self.summaries[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn tokens_saved(&self, tokens: u64) {
        self.tokens_saved.fetch_add(tokens, Ordering::Relaxed);
    }

    /// One summariser call made, and whether it gave a usable summary.
    pub fn economy(&self, tokens_saved: u64) {
        self.economy_requests.fetch_add(1, Ordering::Relaxed);
        self.economy_tokens_saved
            .fetch_add(tokens_saved, Ordering::Relaxed);
    }

    pub fn summarizer_call(&self, ok: bool) {
        self.summarizer_calls[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
    }

    /// A summariser answer that was not usable, for `reason`. The call counts as a
    /// failed one too.
    pub fn summarizer_rejected(&self, reason: Rejection) {
        self.summarizer_call(false);
        self.summarizer_rejected[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A summary not asked for, because no call could fit the summariser's window.
    pub fn summarizer_skipped(&self) {
        self.summarizer_skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// Time spent compacting, excluding any summariser call.
    pub fn compaction_time(&self, elapsed: Duration) {
        self.compaction_time.observe(elapsed.as_secs_f64());
    }

    /// The counters as Prometheus text; `cache` is the checkpoint stores, when on, and
    /// `stale_retries` the upstream client's count (it lives in the client, which counts
    /// where it retries).
    pub fn render(&self, cache: Option<&Checkpoints>, stale_retries: u64) -> String {
        let mut out = String::with_capacity(2048);
        self.render_traffic(&mut out, stale_retries);
        self.render_compactions(&mut out);
        self.render_summarizer(&mut out);
        if let Some(cache) = cache {
            render_cache(&mut out, cache);
        }
        out
    }

    /// Requests in and out, and connections switched to other protocols.
    fn render_traffic(&self, out: &mut String, stale_retries: u64) {
        counter(
            out,
            "compaction_proxy_requests_total",
            "Requests received from clients, own endpoints excluded.",
            self.requests.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_upstream_attempts_total",
            "Requests sent to the upstream, retries included.",
            self.upstream_attempts.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_upstream_stale_retries_total",
            "Requests sent again on a new upstream connection after a reused one closed before answering.",
            stale_retries,
        );
        counter(
            out,
            "compaction_proxy_upgrades_total",
            "Connections the upstream switched to another protocol (WebSocket), relayed byte for byte.",
            self.upgrades.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_websocket_bridged_total",
            "Codex Responses WebSocket connections the proxy answered itself, each response carried over HTTP.",
            self.websockets_bridged.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_websocket_responses_total",
            "response.create frames on bridged WebSockets, each sent upstream as POST .../responses.",
            self.websocket_responses.load(Ordering::Relaxed),
        );
    }

    /// What compaction did, and what the process gave back to the OS.
    fn render_compactions(&self, out: &mut String) {
        labelled(
            out,
            "compaction_proxy_compactions_total",
            "Chat requests the proxy compacted, by what triggered it.",
            "trigger",
            Trigger::ALL.map(|t| (t.as_str(), &self.compactions[t as usize])),
        );
        labelled(
            out,
            "compaction_proxy_compactions_by_api_total",
            "Requests the proxy rewrote, by the API they speak (chat completions or responses).",
            "api",
            Dialect::ALL.map(|d| (d.as_str(), &self.compactions_by_api[d as usize])),
        );
        labelled(
            out,
            "compaction_proxy_output_lowered_total",
            "Chat requests whose completion cap (max_tokens) the proxy lowered to fit the window, by what triggered it.",
            "trigger",
            Trigger::ALL.map(|t| (t.as_str(), &self.output_lowered[t as usize])),
        );
        labelled(
            out,
            "compaction_proxy_summaries_total",
            "Summaries used in compactions, by source.",
            "source",
            [0, 1, 2, 3].map(|i| (SOURCES[i].as_str(), &self.summaries[i])),
        );
        counter(
            out,
            "compaction_proxy_tokens_saved_total",
            "Prompt tokens removed by compaction (by the proxy's own count).",
            self.tokens_saved.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_economy_requests_total",
            "Requests economy mode shortened (old tool outputs made shorter), compaction events aside.",
            self.economy_requests.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_economy_tokens_saved_total",
            "Prompt tokens economy mode removed (by the proxy's own count), apart from compaction's tokens_saved.",
            self.economy_tokens_saved.load(Ordering::Relaxed),
        );
        counter(
            out,
            "compaction_proxy_memory_trims_total",
            "Times the freed heap was returned to the OS (malloc_trim, glibc builds), each after a fall in load.",
            self.memory_trims.load(Ordering::Relaxed),
        );
    }

    /// The summariser's calls, and the time compaction takes besides them.
    fn render_summarizer(&self, out: &mut String) {
        labelled(
            out,
            "compaction_proxy_summarizer_calls_total",
            "Summariser calls made by the proxy, by outcome (error: HTTP error, timeout, or an answer rejected).",
            "outcome",
            [
                ("ok", &self.summarizer_calls[0]),
                ("error", &self.summarizer_calls[1]),
            ],
        );
        labelled(
            out,
            "compaction_proxy_summarizer_rejected_total",
            "Summariser answers rejected before use, by reason (empty, truncated by its cap, refusal, without the checkpoint's headings, repeating the prompt, nothing under the headings, too short for what it replaces).",
            "reason",
            Rejection::ALL.iter().map(|r| r.label()).zip(&self.summarizer_rejected),
        );
        counter(
            out,
            "compaction_proxy_summarizer_skipped_total",
            "Summaries not asked for because the summariser's window cannot hold its prompt and any turns (the digest is used).",
            self.summarizer_skipped.load(Ordering::Relaxed),
        );
        self.compaction_time.render(
            out,
            "compaction_proxy_compaction_seconds",
            "Time spent compacting a request, excluding the summariser call.",
        );
    }
}

/// What the checkpoint stores hold and did: preparations, the store's health, its size.
fn render_cache(out: &mut String, cache: &Checkpoints) {
    if let Some(prepared) = cache.prepared.as_ref() {
        header(
            out,
            "compaction_proxy_prepared_total",
            "Compactions prepared ahead in the background, by fate: made, used by a compaction event, or wasted (dropped unused).",
            "counter",
        );
        for (fate, count) in prepared.fates() {
            let _ = writeln!(
                out,
                "compaction_proxy_prepared_total{{fate=\"{}\"}} {count}",
                fate.as_str()
            );
        }
    }
    render_store(out, cache);
    let (checkpoints, bytes) = cache.held();
    gauge(
        out,
        "compaction_proxy_cache_checkpoints",
        "Conversation checkpoints held by the summary cache: in memory, or in the embedded store's file; with Redis, this process's copies in memory.",
        checkpoints,
    );
    gauge(
        out,
        "compaction_proxy_cache_bytes",
        "Estimated bytes held by the summary cache (bounded by cache.max_bytes).",
        bytes,
    );
}

/// A fixed-bucket histogram; the sum is kept in microseconds to stay an integer.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, seconds: f64) {
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
        );
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A counter with one label, every value of the label listed (zeros included, so
/// dashboards see the series before the first event).
fn labelled<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    series: impl IntoIterator<Item = (&'a str, &'a AtomicU64)>,
) {
    header(out, name, help, "counter");
    for (value, count) in series {
        let count = count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
    }
}

/// The checkpoint store's lookups, errors and state, by backend.
fn render_store(out: &mut String, cache: &Checkpoints) {
    header(
        out,
        "compaction_proxy_store_lookups_total",
        "Checkpoint lookups by store backend (the configured one, and memory while a shared store is out of reach) and result.",
        "counter",
    );
    for (backend, counters) in cache.counters() {
        for (result, n) in [("hit", &counters.hits), ("miss", &counters.misses)] {
            let _ = writeln!(
                out,
                "compaction_proxy_store_lookups_total{{backend=\"{}\",result=\"{result}\"}} {}",
                backend.as_str(),
                n.load(Ordering::Relaxed)
            );
        }
    }
    header(
        out,
        "compaction_proxy_store_errors_total",
        "Failed or timed-out operations of the checkpoint store, by backend; each was served from memory instead.",
        "counter",
    );
    let backend = cache.backend().as_str();
    let errors = cache
        .counters()
        .next()
        .map_or(0, |(_, c)| c.errors.load(Ordering::Relaxed));
    let _ = writeln!(
        out,
        "compaction_proxy_store_errors_total{{backend=\"{backend}\"}} {errors}"
    );
    header(
        out,
        "compaction_proxy_store_up",
        "1 while the checkpoint store answers, 0 during an outage (requests are then served from memory).",
        "gauge",
    );
    let up = u8::from(cache.health() == Health::Up);
    let _ = writeln!(
        out,
        "compaction_proxy_store_up{{backend=\"{backend}\"}} {up}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: usize) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejection_stands_at_its_own_index() {
        for (i, reason) in Rejection::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i, "{}", reason.label());
        }
    }

    #[test]
    fn renders_prometheus_counters() {
        let metrics = Metrics::default();
        metrics.request();
        metrics.request();
        metrics.upstream_attempt();
        metrics.compaction(Trigger::Error);
        metrics.summary(SummarySource::Fallback);
        metrics.tokens_saved(1200);
        metrics.economy(300);
        metrics.summarizer_call(false);
        metrics.summarizer_rejected(Rejection::Echo);
        metrics.summarizer_skipped();
        let text = metrics.render(None, 0);
        assert!(text.contains("compaction_proxy_summarizer_rejected_total{reason=\"echo\"} 1\n"));
        assert!(text.contains("compaction_proxy_summarizer_rejected_total{reason=\"short\"} 0\n"));
        assert!(text.contains("compaction_proxy_summarizer_skipped_total 1\n"));
        assert!(text.contains("compaction_proxy_summarizer_calls_total{outcome=\"ok\"} 0\n"));
        assert!(text.contains("compaction_proxy_summarizer_calls_total{outcome=\"error\"} 2\n"));
        assert!(text.contains(
            "# TYPE compaction_proxy_requests_total counter\ncompaction_proxy_requests_total 2\n"
        ));
        assert!(text.contains("compaction_proxy_upstream_attempts_total 1\n"));
        assert!(text.contains("compaction_proxy_compactions_total{trigger=\"error\"} 1\n"));
        assert!(text.contains("compaction_proxy_compactions_total{trigger=\"preflight\"} 0\n"));
        assert!(text.contains("compaction_proxy_output_lowered_total{trigger=\"preflight\"} 0\n"));
        assert!(text.contains("compaction_proxy_compactions_by_api_total{api=\"responses\"} 0\n"));
        assert!(text.contains("compaction_proxy_summaries_total{source=\"fallback\"} 1\n"));
        assert!(text.contains("compaction_proxy_tokens_saved_total 1200\n"));
        assert!(text.contains("compaction_proxy_economy_requests_total 1\n"));
        assert!(text.contains("compaction_proxy_economy_tokens_saved_total 300\n"));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let metrics = Metrics::default();
        metrics.compaction_time(Duration::from_micros(300));
        metrics.compaction_time(Duration::from_millis(20));
        let text = metrics.render(None, 0);
        assert!(text.contains("compaction_proxy_compaction_seconds_bucket{le=\"0.0001\"} 0\n"));
        assert!(text.contains("compaction_proxy_compaction_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("compaction_proxy_compaction_seconds_bucket{le=\"0.025\"} 2\n"));
        assert!(text.contains("compaction_proxy_compaction_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("compaction_proxy_compaction_seconds_count 2\n"));
        assert!(text.contains("compaction_proxy_compaction_seconds_sum 0.0203\n"));
    }
}
