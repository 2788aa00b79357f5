//! OpenTelemetry traces, opt-in (`telemetry.otlp_endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`): one span per request on the compaction path, named
//! "{api} {model}" with the GenAI semantic conventions and the compaction as attributes,
//! and a child span per upstream attempt and per summariser call. Spans are kept in memory
//! while the request runs and handed, once ended, to a background task that exports them
//! in batches over OTLP/HTTP (protobuf, encoded here: the few messages a trace needs).
//!
//! Exporting never slows or fails a request: the hand-over is a bounded channel (a span
//! that finds it full is dropped and counted), the export has a timeout, and its errors
//! are logged once, not per batch.
//!
//! The request's span travels with its task ([`scope`]): the loop's upstream attempts,
//! the summariser and the compaction's report find it there without it being passed
//! along. Work outside the request's task (a compaction prepared ahead, in the
//! background) records no span.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use memchr::memmem::Finder;
use tokio::sync::mpsc;

use crate::body::{self, Ending, ProxyBody, Watcher};
use crate::compaction_report::XCompaction;
use crate::config::OtlpEndpoint as Endpoint;
use crate::upstream::Upstream;
use crate::usage_scan::UsageScan;

/// Spans waiting for export; more are dropped.
const QUEUE: usize = 4096;
/// Spans in one export request at most.
const BATCH: usize = 512;
/// How long the exporter waits for more spans before sending what it has.
const LINGER: Duration = Duration::from_millis(200);
/// One export request, connection included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter's side the requests see.
pub struct Telemetry {
    sender: mpsc::Sender<SpanData>,
    /// The exporter, until the first span starts it (a runtime is needed).
    exporter: Mutex<Option<Exporter>>,
    counters: Arc<ExportCounters>,
    /// The upstream's provider, for `gen_ai.provider.name`.
    provider: String,
}

impl Telemetry {
    /// Spans go to `endpoint` through `collector`, a client of the endpoint's origin.
    pub fn new(endpoint: Endpoint, collector: Upstream, upstream_base_url: &str) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let counters = Arc::new(ExportCounters::default());
        Self {
            sender,
            exporter: Mutex::new(Some(Exporter {
                endpoint,
                collector,
                receiver,
                failing: AtomicBool::new(false),
                counters: Arc::clone(&counters),
            })),
            counters,
            provider: provider(upstream_base_url),
        }
    }

    /// The exporter's counters, as Prometheus text appended to `out`.
    pub fn render(&self, out: &mut String) {
        let c = &self.counters;
        for (name, help, value) in [
            (
                "compaction_proxy_trace_spans_exported_total",
                "Spans the OTLP receiver accepted.",
                &c.exported,
            ),
            (
                "compaction_proxy_trace_spans_dropped_total",
                "Spans dropped: the export queue was full, or the receiver failed them.",
                &c.dropped,
            ),
            (
                "compaction_proxy_trace_export_failures_total",
                "Export requests that failed (unreachable, timed out, or refused).",
                &c.failures,
            ),
        ] {
            let value = value.load(Ordering::Relaxed);
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
            ));
        }
    }

    fn submit(&self, span: SpanData) {
        self.start_exporter();
        if self.sender.try_send(span).is_err()
            && self.counters.dropped.fetch_add(1, Ordering::Relaxed) == 0
        {
            tracing::warn!("trace export queue full: spans are being dropped");
        }
    }

    fn start_exporter(&self) {
        let Ok(mut slot) = self.exporter.lock() else {
            return;
        };
        if slot.is_some() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                if let Some(exporter) = slot.take() {
                    handle.spawn(exporter.run());
                }
            }
        }
    }

    /// The span of one client request of `api` for `model`, its parent taken from the
    /// client's `traceparent` when it sent one.
    pub fn request(self: &Arc<Self>, api: &str, model: &str, headers: &HeaderMap) -> RequestSpan {
        let parent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(traceparent);
        let (trace_id, parent) = match parent {
            Some((trace, span)) => (trace, Some(span)),
            None => (random::<16>(), None),
        };
        let mut span = SpanData::new(trace_id, parent, format!("{api} {model}"), SpanKind::Server);
        span.str("gen_ai.operation.name", "chat");
        span.str("gen_ai.provider.name", &self.provider);
        span.str("gen_ai.request.model", model);
        span.str("compaction_proxy.api", api);
        RequestSpan(Arc::new(RequestInner {
            telemetry: Arc::clone(self),
            span: Mutex::new(Some(span)),
        }))
    }
}

/// `gen_ai.provider.name` from the upstream's host: the well-known names for the
/// well-known APIs, else the host.
fn provider(base_url: &str) -> String {
    let host = base_url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .unwrap_or_default();
    let known = [
        ("api.openai.com", "openai"),
        ("api.anthropic.com", "anthropic"),
        ("openai.azure.com", "azure.ai.openai"),
        ("api.mistral.ai", "mistral_ai"),
        ("api.groq.com", "groq"),
        ("api.deepseek.com", "deepseek"),
        ("api.x.ai", "x_ai"),
        ("generativelanguage.googleapis.com", "gcp.gemini"),
    ];
    known
        .iter()
        .find(|(h, _)| host == *h || host.ends_with(&format!(".{h}")))
        .map_or(host.clone(), |(_, name)| (*name).to_owned())
}

/// `00-{trace id}-{span id}-{flags}`.
fn traceparent(value: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut parts = value.trim().split('-');
    let (version, trace, span) = (parts.next()?, parts.next()?, parts.next()?);
    if version != "00" {
        return None;
    }
    let trace: [u8; 16] = hex(trace)?.try_into().ok()?;
    let span: [u8; 8] = hex(span)?.try_into().ok()?;
    (trace != [0; 16] && span != [0; 8]).then_some((trace, span))
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn random<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    if ring::rand::SystemRandom::new().fill(&mut out).is_err() {
        // Not secret, only unique: the clock will do.
        let t = now().to_le_bytes();
        for (i, b) in out.iter_mut().enumerate() {
            *b = t[i % 8] ^ (i as u8);
        }
    }
    out
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[derive(Clone, Copy)]
enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

#[derive(Clone)]
enum Value {
    Str(String),
    Int(i64),
}

/// A span as exported.
struct SpanData {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: String,
    kind: SpanKind,
    start: u64,
    end: u64,
    attributes: Vec<(&'static str, Value)>,
    /// Set on failure: the status is then an error with this message.
    error: Option<String>,
}

impl SpanData {
    fn new(trace_id: [u8; 16], parent: Option<[u8; 8]>, name: String, kind: SpanKind) -> Self {
        Self {
            trace_id,
            span_id: random(),
            parent,
            name,
            kind,
            start: now(),
            end: 0,
            attributes: Vec::new(),
            error: None,
        }
    }

    fn str(&mut self, key: &'static str, value: &str) {
        self.set(key, Value::Str(value.to_owned()));
    }

    fn int(&mut self, key: &'static str, value: u64) {
        self.set(key, Value::Int(i64::try_from(value).unwrap_or(i64::MAX)));
    }

    fn set(&mut self, key: &'static str, value: Value) {
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.attributes.push((key, value)),
        }
    }

    fn failed(&mut self, error_type: &str) {
        self.str("error.type", error_type);
        self.error = Some(error_type.to_owned());
    }
}

struct RequestInner {
    telemetry: Arc<Telemetry>,
    /// Taken when the span ends, so it is exported once.
    span: Mutex<Option<SpanData>>,
}

/// A request's span, shared by what the request does; exported when it ends (or is
/// dropped unended, as when the client goes away mid-answer).
#[derive(Clone)]
pub struct RequestSpan(Arc<RequestInner>);

impl Drop for RequestInner {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.get_mut().ok().and_then(Option::take) {
            span.end = now();
            self.telemetry.submit(span);
        }
    }
}

impl RequestSpan {
    fn with(&self, f: impl FnOnce(&mut SpanData)) {
        if let Ok(mut guard) = self.0.span.lock() {
            if let Some(span) = guard.as_mut() {
                f(span);
            }
        }
    }

    /// Ends the span now.
    pub fn end(&self) {
        let span = self.0.span.lock().ok().and_then(|mut s| s.take());
        if let Some(mut span) = span {
            span.end = now();
            self.0.telemetry.submit(span);
        }
    }

    /// The request failed before an answer: `error_type` names how.
    pub fn failed(&self, error_type: &str) {
        self.with(|s| s.failed(error_type));
    }

    /// The status the client got; 4xx and 5xx mark the span failed.
    /// Economy mode's work on the request: the tokens of the outputs it shortened,
    /// before and after, apart from any compaction's.
    pub fn economy(&self, stats: &crate::engine::economy::EconomyStats) {
        self.with(|span| {
            span.int("economy.tokens_before", stats.tokens_before as u64);
            span.int("economy.tokens_after", stats.tokens_after as u64);
            span.int("economy.outputs", stats.changed() as u64);
        });
    }

    pub fn status(&self, status: u16) {
        self.with(|s| {
            s.int("http.response.status_code", u64::from(status));
            if status >= 400 {
                s.failed(&status.to_string());
            }
        });
    }

    /// A child span, started now.
    fn child(&self, name: &str, kind: SpanKind) -> Option<ChildSpan> {
        let guard = self.0.span.lock().ok()?;
        let parent = guard.as_ref()?;
        let span = SpanData::new(parent.trace_id, Some(parent.span_id), name.to_owned(), kind);
        Some(ChildSpan {
            span: Some(span),
            telemetry: Arc::clone(&self.0.telemetry),
        })
    }

    /// Ends the span when `body` ends, with the usage the answer reported.
    pub fn traced(self, answer: ProxyBody) -> ProxyBody {
        body::watched(
            answer,
            Traced {
                span: Some(self),
                usage: UsageScan::new(&*USAGE_KEYS),
            },
        )
    }
}

/// A child of the request's span, exported when ended or dropped.
pub struct ChildSpan {
    span: Option<SpanData>,
    telemetry: Arc<Telemetry>,
}

impl ChildSpan {
    pub fn status(&mut self, status: u16) {
        if let Some(span) = &mut self.span {
            span.int("http.response.status_code", u64::from(status));
            if status >= 400 {
                span.failed(&status.to_string());
            }
        }
    }

    pub fn failed(&mut self, error_type: &str) {
        if let Some(span) = &mut self.span {
            span.failed(error_type);
        }
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            span.end = now();
            self.telemetry.submit(span);
        }
    }
}

/// What a task's spans hang from: the client request it serves, or background work one
/// started (a preparation), which may go on after the request has ended.
#[derive(Clone)]
enum Parent {
    Request(RequestSpan),
    Background(Background),
}

/// Where a background task's spans go: under a span of the request that started it, in
/// that request's trace.
#[derive(Clone)]
pub struct Background {
    telemetry: Arc<Telemetry>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
}

tokio::task_local! {
    static CURRENT: Parent;
}

/// Runs `future` with `span` as its request's span.
pub async fn scope<F: Future>(span: RequestSpan, future: F) -> F::Output {
    CURRENT.scope(Parent::Request(span), future).await
}

/// Runs background work with its spans under `parent` (see [`background`]).
pub async fn in_background<F: Future>(parent: Background, future: F) -> F::Output {
    CURRENT.scope(Parent::Background(parent), future).await
}

/// A span `name` for background work the current request starts, and the parent its own
/// children take; `None` when the request is not traced.
pub fn background(name: &str) -> Option<(ChildSpan, Background)> {
    let span = child_of_current(name, SpanKind::Internal)?;
    let data = span.span.as_ref()?;
    let parent = Background {
        telemetry: Arc::clone(&span.telemetry),
        trace_id: data.trace_id,
        span_id: data.span_id,
    };
    Some((span, parent))
}

/// A child span of the current request's span ("upstream attempt", "summarise"), if the
/// request is traced.
pub fn child(name: &str) -> Option<ChildSpan> {
    let kind = if name == "summarise" {
        SpanKind::Internal
    } else {
        SpanKind::Client
    };
    child_of_current(name, kind)
}

fn child_of_current(name: &str, kind: SpanKind) -> Option<ChildSpan> {
    CURRENT
        .try_with(|parent| match parent {
            Parent::Request(span) => span.child(name, kind),
            Parent::Background(b) => Some(ChildSpan {
                span: Some(SpanData::new(
                    b.trace_id,
                    Some(b.span_id),
                    name.to_owned(),
                    kind,
                )),
                telemetry: Arc::clone(&b.telemetry),
            }),
        })
        .ok()
        .flatten()
}

/// The compaction, as attributes of the current request's span (background work's are
/// not the request's).
pub fn compaction(x: &XCompaction) {
    let _ = CURRENT.try_with(|parent| {
        let Parent::Request(s) = parent else {
            return;
        };
        s.with(|span| {
            span.str(
                "compaction.outcome",
                &format!("{:?}", x.outcome).to_lowercase(),
            );
            span.str("compaction.trigger", x.trigger.as_str());
            span.int("compaction.tokens_before", x.tokens_before);
            span.int("compaction.tokens_after", x.tokens_after);
            span.int("compaction.messages_before", x.messages_before as u64);
            span.int("compaction.messages_after", x.messages_after as u64);
            span.str("compaction.summary", x.summary.as_str());
            span.int("compaction.attempts", u64::from(x.attempts));
        });
    });
}

/// The answer's body, scanned for its usage; the request's span ends with it.
struct Traced {
    span: Option<RequestSpan>,
    /// The input (0) and output (1) counts.
    usage: UsageScan<2>,
}

/// Keys of the input (0) and output (1) counts, in every dialect's usage.
static USAGE_KEYS: std::sync::LazyLock<[(Finder<'static>, usize); 4]> =
    std::sync::LazyLock::new(|| {
        [
            (Finder::new(b"\"prompt_tokens\""), 0),
            (Finder::new(b"\"input_tokens\""), 0),
            (Finder::new(b"\"completion_tokens\""), 1),
            (Finder::new(b"\"output_tokens\""), 1),
        ]
    });

impl Watcher for Traced {
    fn frame(&mut self, data: &[u8]) {
        self.usage.scan(data);
    }

    fn end(&mut self, ending: Ending) {
        let Some(span) = self.span.take() else {
            return;
        };
        if ending == Ending::Failed {
            span.failed("body");
        }
        let [input, output] = self.usage.seen();
        span.with(|s| {
            if let Some(n) = input {
                s.int("gen_ai.usage.input_tokens", n);
            }
            if let Some(n) = output {
                s.int("gen_ai.usage.output_tokens", n);
            }
        });
        span.end();
    }
}

/// What the exporter did, for `/metrics`.
#[derive(Default)]
struct ExportCounters {
    exported: AtomicU64,
    dropped: AtomicU64,
    failures: AtomicU64,
}

/// The background task that sends the ended spans.
struct Exporter {
    counters: Arc<ExportCounters>,
    endpoint: Endpoint,
    collector: Upstream,
    receiver: mpsc::Receiver<SpanData>,
    /// The last export failed: the next failure is not logged again.
    failing: AtomicBool,
}

impl Exporter {
    async fn run(mut self) {
        while let Some(first) = self.receiver.recv().await {
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + LINGER;
            while batch.len() < BATCH {
                match tokio::time::timeout_at(deadline, self.receiver.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    _ => break,
                }
            }
            let body = encode(&batch);
            let sent =
                tokio::time::timeout(EXPORT_TIMEOUT, post(&self.collector, &self.endpoint, body))
                    .await;
            let result = sent.unwrap_or_else(|_| Err("timed out".to_owned()));
            let spans = batch.len() as u64;
            match result {
                Ok(()) => {
                    self.counters.exported.fetch_add(spans, Ordering::Relaxed);
                    if self.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("trace export recovered");
                    }
                }
                Err(e) => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    self.counters.dropped.fetch_add(spans, Ordering::Relaxed);
                    if !self.failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            endpoint = %self.endpoint.authority,
                            error = %e,
                            "trace export failed; spans are dropped until it recovers"
                        );
                    }
                }
            }
        }
    }
}

/// One OTLP/HTTP export: a POST through the collector's client, which keeps the
/// connection for the next one.
async fn post(collector: &Upstream, endpoint: &Endpoint, body: Vec<u8>) -> Result<(), String> {
    let uri = endpoint
        .path
        .parse::<http::Uri>()
        .map_err(|e| e.to_string())?;
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    let answer = collector
        .send(http::Method::POST, &uri, &headers, body::full(body))
        .await
        .map_err(|e| crate::cause::Chain(&e).to_string())?;
    let status = answer.status();
    // Read to its end, so the connection goes back to the pool.
    let _ = http_body_util::BodyExt::collect(answer.into_body()).await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {}", status.as_u16()))
    }
}

/// The protobuf encoding of the few OTLP messages a trace export needs.
mod proto {
    pub fn varint(buf: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        buf.push(v as u8);
    }

    fn tag(buf: &mut Vec<u8>, field: u32, wire: u8) {
        varint(buf, (u64::from(field) << 3) | u64::from(wire));
    }

    pub fn bytes(buf: &mut Vec<u8>, field: u32, data: &[u8]) {
        tag(buf, field, 2);
        varint(buf, data.len() as u64);
        buf.extend_from_slice(data);
    }

    pub fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
        tag(buf, field, 0);
        varint(buf, v);
    }

    pub fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
        tag(buf, field, 1);
        buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn message(buf: &mut Vec<u8>, field: u32, f: impl FnOnce(&mut Vec<u8>)) {
        let mut inner = Vec::new();
        f(&mut inner);
        bytes(buf, field, &inner);
    }
}

/// `KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue { string_value = 1; int_value = 3 }`.
fn key_value(buf: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    proto::message(buf, field, |kv| {
        proto::bytes(kv, 1, key.as_bytes());
        proto::message(kv, 2, |any| match value {
            Value::Str(s) => proto::bytes(any, 1, s.as_bytes()),
            Value::Int(i) => proto::uint(any, 3, *i as u64),
        });
    });
}

/// `ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1 }`, one
/// resource (this service) and one scope (this crate).
fn encode(spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::new();
    proto::message(&mut out, 1, |rs| {
        // Resource { attributes = 1 }
        proto::message(rs, 1, |res| {
            let name = Value::Str("compaction-proxy".into());
            key_value(res, 1, "service.name", &name);
            let version = Value::Str(env!("CARGO_PKG_VERSION").into());
            key_value(res, 1, "service.version", &version);
        });
        // ScopeSpans { scope = 1; spans = 2 }
        proto::message(rs, 2, |ss| {
            proto::message(ss, 1, |scope| {
                proto::bytes(scope, 1, b"compaction-proxy");
                proto::bytes(scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
            });
            for span in spans {
                proto::message(ss, 2, |s| encode_span(s, span));
            }
        });
    });
    out
}

/// `Span { trace_id = 1; span_id = 2; parent_span_id = 4; name = 5; kind = 6;
/// start_time_unix_nano = 7; end_time_unix_nano = 8; attributes = 9; status = 15 }`,
/// `Status { message = 2; code = 3 }`.
fn encode_span(buf: &mut Vec<u8>, span: &SpanData) {
    proto::bytes(buf, 1, &span.trace_id);
    proto::bytes(buf, 2, &span.span_id);
    if let Some(parent) = &span.parent {
        proto::bytes(buf, 4, parent);
    }
    proto::bytes(buf, 5, span.name.as_bytes());
    proto::uint(buf, 6, span.kind as u64);
    proto::fixed64(buf, 7, span.start);
    proto::fixed64(buf, 8, span.end.max(span.start));
    for (key, value) in &span.attributes {
        key_value(buf, 9, key, value);
    }
    if let Some(message) = &span.error {
        proto::message(buf, 15, |st| {
            proto::bytes(st, 2, message.as_bytes());
            proto::uint(st, 3, 2);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers() {
        assert_eq!(provider("https://api.openai.com/v1"), "openai");
        assert_eq!(provider("https://api.anthropic.com"), "anthropic");
        assert_eq!(provider("http://127.0.0.1:8000/v1"), "127.0.0.1");
    }

    #[test]
    fn traceparents() {
        let (t, s) =
            traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t[0], 0x4b);
        assert_eq!(s[7], 0xb7);
        assert!(traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
        assert!(traceparent("garbage").is_none());
    }

    #[test]
    fn varints() {
        let mut b = Vec::new();
        proto::varint(&mut b, 300);
        assert_eq!(b, [0xac, 0x02]);
    }

    #[test]
    fn usage_is_found_across_frames() {
        let body = br#"{"usage":{"prompt_tokens":4096,"completion_tokens":12}}"#;
        for k in 0..=body.len() {
            let mut usage = UsageScan::<2>::new(&*USAGE_KEYS);
            usage.scan(&body[..k]);
            usage.scan(&body[k..]);
            assert_eq!(usage.seen(), [Some(4096), Some(12)], "split at {k}");
        }
    }
}
