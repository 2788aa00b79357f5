//! The proxy in front of a real model server: llama.cpp's `llama-server` with
//! SmolLM2-135M-Instruct, one slot of 2,048 tokens. A 20-turn chat session, some turns
//! streamed, outgrows that window twice over; every turn must be answered, the
//! session must have been compacted with the model itself asked for summaries, each of
//! its answers accepted or rejected for a stated reason, and no request of any kind,
//! the summariser's included, refused by the server for its length.
//!
//! `scripts/setup-llama.sh` installs the server and the model (cached outside the
//! checkout) and prints their paths; `scripts/test.sh` passes them in
//! `COMPACTION_PROXY_LLAMA_SERVER` and `COMPACTION_PROXY_LLAMA_MODEL` and runs this test
//! on its own, after the rest of the suite, as it needs the CPU. Without those variables
//! the test says so and passes, unless `COMPACTION_PROXY_REQUIRE_LLAMA` is set.
//!
//! Between the proxy and the server sits a recording pass-through (the tap): it tells the
//! summariser's calls from the client's by their system prompt and keeps, for each call,
//! the server's status and what it answered. The figures and the evidence are printed at
//! the end, whether the test passes or not.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use support::{client, metrics, tempdir, x_compaction, Proxy};
use tokio::net::TcpListener;

const WINDOW: u32 = 2048;
const TURNS: usize = 20;
/// The cap on every client answer: the model's time goes to reading, not writing.
const MAX_TOKENS: u32 = 48;
const MODEL: &str = "smollm2";
const SYSTEM: &str = "You are a concise assistant helping an engineer move a billing \
service to a new host. Answer in one or two short sentences.";

/// How the summariser's system prompt opens (`src/summarize/prompt.md`; the test checks).
const SUMMARISER_OPENING: &str = "You are writing a checkpoint";

/// The server and the model, from the environment; `None` (the test passes, saying why)
/// when they are not given, unless `COMPACTION_PROXY_REQUIRE_LLAMA` is set.
fn installed() -> Option<(PathBuf, PathBuf)> {
    let server = std::env::var_os("COMPACTION_PROXY_LLAMA_SERVER").map(PathBuf::from);
    let model = std::env::var_os("COMPACTION_PROXY_LLAMA_MODEL").map(PathBuf::from);
    let problem = match (&server, &model) {
        (Some(s), Some(m)) if s.is_file() && m.is_file() => return Some((s.clone(), m.clone())),
        (Some(s), Some(m)) => format!(
            "COMPACTION_PROXY_LLAMA_SERVER={} or COMPACTION_PROXY_LLAMA_MODEL={} is not a file",
            s.display(),
            m.display()
        ),
        _ => "COMPACTION_PROXY_LLAMA_SERVER and COMPACTION_PROXY_LLAMA_MODEL are not set".into(),
    };
    support::Needs::Llama.missing(
        &problem,
        "run scripts/setup-llama.sh and export the paths it prints",
    )
}

/// A running `llama-server`, stopped (by its own process id) when dropped.
struct Llama {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Llama {
    async fn start(server: &Path, model: &Path) -> Self {
        // A free port: bound, read, released for the server (loopback, a moment's race).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = tempdir().join("llama-server.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(server)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-c", &WINDOW.to_string(), "-np", "1", "-t", "1"])
            .args(["--jinja", "--alias", MODEL, "--no-webui"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start llama-server");
        let mut llama = Self { child, port, log };
        llama.wait_healthy().await;
        llama
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("llama-server exited ({status}):\n{}", self.log_tail());
            }
            let health = client().get(self.url("/health")).send().await;
            if health.is_ok_and(|r| r.status() == StatusCode::OK) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("llama-server not healthy in 120 s:\n{}", self.log_tail());
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One upstream call as the tap saw it.
#[derive(Debug, Clone, Default)]
struct TapCall {
    /// Order of arrival, from 1.
    n: usize,
    summariser: bool,
    messages: usize,
    max_tokens: Option<u64>,
    status: u16,
    millis: u128,
    /// The answer came to its end (`[DONE]`, or a whole JSON body), whether or not the
    /// proxy read on to the end of the stream.
    complete: bool,
    /// The prompt's and the answer's lengths in the server's own tokens, when reported.
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    /// Why the model stopped (`stop`, or `length` at `max_tokens` or the window's end).
    finish_reason: Option<String>,
    /// The response body as the server sent it.
    body: String,
}

impl TapCall {
    /// The server refused the request for its length: llama.cpp's
    /// `exceed_context_size_error` (400, "request (N tokens) exceeds the available context
    /// size (M tokens), try increasing it", or "input (N tokens) is larger than the max
    /// context size"), or an OpenAI-style `context_length_exceeded`.
    fn context_error(&self) -> bool {
        let body = self.body.to_ascii_lowercase();
        [
            "exceed_context_size",
            "exceeds the available context size",
            "is larger than the max context size",
            "context_length_exceeded",
        ]
        .iter()
        .any(|needle| body.contains(needle))
    }

    /// The text the model wrote: the JSON answer's content or the streamed deltas joined.
    fn text(&self) -> String {
        if let Ok(v) = serde_json::from_str::<Value>(&self.body) {
            return v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
        sse_events(&self.body)
            .filter_map(|e| {
                e["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }
}

/// The JSON events of a server-sent-events body (`[DONE]` and comments left out).
fn sse_events(body: &str) -> impl Iterator<Item = Value> + '_ {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
}

/// Records a call when its answer has been passed on, or abandoned by the proxy.
struct Pending {
    call: TapCall,
    started: Instant,
    body: Vec<u8>,
    calls: Arc<Mutex<Vec<TapCall>>>,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut call = std::mem::take(&mut self.call);
        call.millis = self.started.elapsed().as_millis();
        call.body = String::from_utf8_lossy(&self.body).into_owned();
        let json = serde_json::from_str::<Value>(&call.body).ok();
        let events: Vec<Value> = json.into_iter().chain(sse_events(&call.body)).collect();
        call.finish_reason = events
            .iter()
            .find_map(|e| e["choices"][0]["finish_reason"].as_str().map(str::to_owned));
        call.complete = call.status == 200
            && (call.finish_reason.is_some() || call.body.contains("data: [DONE]"));
        // The usage when asked for, else llama.cpp's timings (prompt read = cached + new).
        call.prompt_tokens = events.iter().find_map(|v| {
            v["usage"]["prompt_tokens"].as_u64().or_else(|| {
                let t = &v["timings"];
                Some(t["cache_n"].as_u64()? + t["prompt_n"].as_u64()?)
            })
        });
        call.completion_tokens = events.iter().find_map(|v| {
            v["usage"]["completion_tokens"]
                .as_u64()
                .or_else(|| v["timings"]["predicted_n"].as_u64())
        });
        self.calls.lock().unwrap().push(call);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

type TapBody = UnsyncBoxBody<Bytes, reqwest::Error>;

/// A recording pass-through on loopback in front of `upstream`: answers stream through
/// as they come and are kept whole.
struct Tap {
    addr: std::net::SocketAddr,
    calls: Arc<Mutex<Vec<TapCall>>>,
    in_flight: Arc<AtomicUsize>,
}

impl Tap {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(AtomicUsize::new(0));
        let (kept, flying) = (Arc::clone(&calls), Arc::clone(&in_flight));
        tokio::spawn(async move {
            let forwarder = reqwest::Client::builder().no_proxy().build().unwrap();
            while let Ok((stream, _)) = listener.accept().await {
                let (forwarder, upstream) = (forwarder.clone(), upstream.clone());
                let (kept, flying, arrived) =
                    (Arc::clone(&kept), Arc::clone(&flying), Arc::clone(&arrived));
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let pending = Pending {
                            call: TapCall {
                                n: arrived.fetch_add(1, Ordering::SeqCst) + 1,
                                ..TapCall::default()
                            },
                            started: Instant::now(),
                            body: Vec::new(),
                            calls: Arc::clone(&kept),
                            in_flight: Arc::clone(&flying),
                        };
                        flying.fetch_add(1, Ordering::SeqCst);
                        forward(forwarder.clone(), upstream.clone(), pending, req)
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            calls,
            in_flight,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn calls(&self) -> Vec<TapCall> {
        let mut calls = self.calls.lock().unwrap().clone();
        calls.sort_by_key(|c| c.n);
        calls
    }

    /// Waits (at most `limit`) until no call is in flight: a compaction the proxy
    /// prepares in the background may still be asking the summariser.
    async fn settle(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn forward(
    client: reqwest::Client,
    upstream: String,
    mut pending: Pending,
    req: Request<Incoming>,
) -> Result<Response<TapBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if let Ok(request) = serde_json::from_slice::<Value>(&body) {
        pending.call.summariser = request["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with(SUMMARISER_OPENING));
        pending.call.messages = request["messages"].as_array().map_or(0, Vec::len);
        pending.call.max_tokens = request["max_tokens"]
            .as_u64()
            .or_else(|| request["max_completion_tokens"].as_u64());
    }
    let mut headers = parts.headers.clone();
    for hop in ["host", "connection", "content-length", "transfer-encoding"] {
        headers.remove(hop);
    }
    let sent = client
        .request(parts.method, format!("{upstream}{}", parts.uri))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream_response = match sent {
        Ok(r) => r,
        Err(e) => {
            pending.call.status = 502;
            pending.body = format!("tap: upstream unreachable: {e}").into_bytes();
            let mut response = Response::new(
                Full::new(Bytes::from(pending.body.clone()))
                    .map_err(|n| match n {})
                    .boxed_unsync(),
            );
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            return Ok(response);
        }
    };
    pending.call.status = upstream_response.status().as_u16();
    let mut response = Response::builder().status(upstream_response.status());
    for (name, value) in upstream_response.headers() {
        if !matches!(
            name.as_str(),
            "connection" | "content-length" | "transfer-encoding"
        ) {
            response = response.header(name, value);
        }
    }
    let chunks = upstream_response.bytes_stream();
    let teed =
        futures_util::stream::unfold((chunks, pending), |(mut chunks, mut pending)| async move {
            let chunk = chunks.next().await?;
            if let Ok(bytes) = &chunk {
                pending.body.extend_from_slice(bytes);
            }
            Some((chunk.map(Frame::data), (chunks, pending)))
        });
    Ok(response.body(StreamBody::new(teed).boxed_unsync()).unwrap())
}

/// The user's turn `n` (from 1): the early turns state facts and constraints, every turn
/// brings a block of tool output and asks a short question (about 220 of the model's
/// tokens in all).
fn user_turn(n: usize) -> String {
    let opening = match n {
        1 => {
            "We are moving the billing service from host bill-old-3 to bill-new-7. \
              Constraints: keep the public API in billing/api.py unchanged, the database \
              is PostgreSQL 15 at db-billing-02:5432, and nothing may restart between \
              09:00 and 17:00 UTC."
        }
        2 => {
            "More facts: the service account is svc-billing, the config lives in \
              /etc/billing/billing.toml, and the invoice queue is invoices-v2 with 4 \
              consumers. The rollback plan is to point DNS back at bill-old-3."
        }
        3 => {
            "Decision from the team: we migrate the cron jobs last, after the queue \
              consumers; the deadline is Friday 28 November."
        }
        _ => "Here is the latest output.",
    };
    let services = [
        "invoice-worker",
        "ledger-sync",
        "tax-export",
        "dunning",
        "receipts",
    ];
    let mut log = String::new();
    for line in 0..5 {
        let k = n * 11 + line;
        let service = services[k % services.len()];
        let _ = writeln!(
            log,
            "step {n}.{line}: {service} on bill-new-7 checked {} rows in {} ms, {} warnings, status {}",
            (k * 7919) % 100_000,
            (k * 37) % 900 + 40,
            k % 4,
            if k.is_multiple_of(6) { "retrying" } else { "ok" }
        );
    }
    format!("Turn {n}. {opening}\n\n{log}\nWhich of these services should I look at next, and why?")
}

/// What the proxy answered one client turn.
struct Turn {
    n: usize,
    stream: bool,
    status: u16,
    x_compaction: String,
    millis: u128,
    reply: String,
    error: String,
}

/// Sends turn `n` of the session; returns what came back (the reply empty on an error).
async fn send_turn(proxy: &Proxy, messages: &[Value], n: usize, stream: bool) -> Turn {
    let started = Instant::now();
    let mut body = json!({
        "model": MODEL,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.3,
        "stream": stream,
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .timeout(Duration::from_secs(600))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let x = x_compaction(&response);
    let text = response.text().await.unwrap_or_default();
    let (reply, error) = if status != 200 {
        (String::new(), text)
    } else if stream {
        let events: Vec<Value> = sse_events(&text).collect();
        let reply = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect::<String>();
        let error = events
            .iter()
            .find(|e| e.get("error").is_some())
            .map(Value::to_string)
            .or_else(|| (!text.contains("data: [DONE]")).then(|| "stream without [DONE]".into()))
            .unwrap_or_default();
        (reply, error)
    } else {
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => match v["choices"][0]["message"]["content"].as_str() {
                Some(reply) => (reply.to_owned(), String::new()),
                None => (String::new(), format!("no message content: {text}")),
            },
            Err(e) => (String::new(), format!("not JSON ({e}): {text}")),
        }
    };
    Turn {
        n,
        stream,
        status,
        x_compaction: x,
        millis: started.elapsed().as_millis(),
        reply,
        error,
    }
}

/// The value of the metric line `name` (with its labels) in a `/metrics` text; 0 when absent.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `compaction_proxy_summarizer_rejected_total{reason="..."}` by reason.
fn rejections(text: &str) -> BTreeMap<String, u64> {
    let prefix = "compaction_proxy_summarizer_rejected_total{reason=\"";
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (reason, value) = rest.split_once("\"}")?;
            let value = value.trim().parse::<f64>().ok()? as u64;
            Some((reason.to_owned(), value))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn figure(n: Option<u64>) -> String {
    n.map_or("-".into(), |n| n.to_string())
}

fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &flat[..at]),
        None => flat,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_turns_at_2048_tokens_against_llama_server_and_smollm2() {
    let Some((server, model)) = installed() else {
        return;
    };
    // The tap tells the summariser's calls by their opening: it must still be the prompt's.
    assert!(include_str!("../../src/summarize/prompt.md").starts_with(SUMMARISER_OPENING));
    let started = Instant::now();
    let llama = Llama::start(&server, &model).await;
    let tap = Tap::start(llama.url("")).await;
    let config = format!(
        "[[models]]\nmatch = \"{MODEL}\"\ncontext_window = {WINDOW}\n\n\
         # The summariser is the same server (the default); a 2-core machine shares one\n\
         # slot between it and the client's turns, so a call may wait behind a turn.\n\
         # After an answer it rejects, the proxy waits 20 s (not 60) before asking\n\
         # again, so that this short session asks several times.\n\
         [summarizer]\ntimeout_ms = 180000\ncooldown_ms = 20000\n"
    );
    let proxy = Proxy::start(&format!("{}/v1", tap.url()), &config);

    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    let mut turns = Vec::new();
    for n in 1..=TURNS {
        messages.push(json!({"role": "user", "content": user_turn(n)}));
        // Streamed on even turns, plain JSON on odd ones.
        let turn = send_turn(&proxy, &messages, n, n % 2 == 0).await;
        eprintln!(
            "turn {n:2} {} {} {:6} ms  {}",
            if turn.stream { "stream" } else { "json  " },
            turn.status,
            turn.millis,
            turn.x_compaction
        );
        let reply = if turn.reply.trim().is_empty() {
            "(no answer)".to_owned()
        } else {
            turn.reply.clone()
        };
        messages.push(json!({"role": "assistant", "content": reply}));
        turns.push(turn);
    }
    tap.settle(Duration::from_secs(240)).await;
    // The proxy counts a summariser call once it has read the answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = metrics(&proxy).await;
    let wall = started.elapsed();
    let calls = tap.calls();
    let logs = proxy.logs();

    // The evidence, printed before any assertion so that a failure is easy to read.
    let mut report = String::from("\n== upstream calls (tap)\n");
    for c in &calls {
        let what = if c.summariser { "summariser" } else { "client" };
        let detail = if c.status != 200 {
            one_line(&c.body, 300)
        } else if c.summariser {
            format!("answer: {}", one_line(&c.text(), 160))
        } else {
            String::new()
        };
        let _ = writeln!(
            report,
            "#{:<3} {what:10} {} {:>6} ms  messages {:2}  max_tokens {:>4}  tokens in/out {:>4}/{:<4} {:6} {}{}",
            c.n,
            c.status,
            c.millis,
            c.messages,
            figure(c.max_tokens),
            figure(c.prompt_tokens),
            figure(c.completion_tokens),
            c.finish_reason.as_deref().unwrap_or("-"),
            if c.status == 200 && !c.complete {
                "(incomplete) "
            } else {
                ""
            },
            detail
        );
    }
    report.push_str("\n== client turns\n");
    for t in &turns {
        let _ = writeln!(
            report,
            "turn {:2} {} status {} {:>6} ms  x-compaction: {}  {}",
            t.n,
            if t.stream { "stream" } else { "json  " },
            t.status,
            t.millis,
            if t.x_compaction.is_empty() {
                "-"
            } else {
                &t.x_compaction
            },
            if t.error.is_empty() {
                format!("reply: {}", one_line(&t.reply, 80))
            } else {
                format!("error: {}", one_line(&t.error, 300))
            }
        );
    }
    report.push_str("\n== proxy metrics\n");
    for line in metrics.lines().filter(|l| {
        [
            "compaction_proxy_summar",
            "compaction_proxy_compactions",
            "compaction_proxy_prepared",
            "compaction_proxy_output_lowered",
            "compaction_proxy_upstream_attempts",
        ]
        .iter()
        .any(|name| l.starts_with(name))
    }) {
        let _ = writeln!(report, "{line}");
    }
    report.push_str("\n== proxy log lines about the summariser\n");
    for line in logs.lines().filter(|l| l.contains("summariser")) {
        let _ = writeln!(report, "{line}");
    }

    let summariser: Vec<&TapCall> = calls.iter().filter(|c| c.summariser).collect();
    let answered = summariser.iter().filter(|c| c.complete).count() as u64;
    let overflows: Vec<&TapCall> = calls.iter().filter(|c| c.context_error()).collect();
    let compactions: Vec<&Turn> = turns
        .iter()
        .filter(|t| t.x_compaction.starts_with("applied"))
        .collect();
    let accepted = metric(
        &metrics,
        "compaction_proxy_summarizer_calls_total{outcome=\"ok\"}",
    );
    let failed = metric(
        &metrics,
        "compaction_proxy_summarizer_calls_total{outcome=\"error\"}",
    );
    let llm_summaries = metric(&metrics, "compaction_proxy_summaries_total{source=\"llm\"}");
    let rejected = rejections(&metrics);
    let rejected_total: u64 = rejected.values().sum();
    let rejected_logged = logs
        .lines()
        .filter(|l| l.contains("summariser answer rejected"))
        .collect::<Vec<_>>();
    let ok_turns = turns
        .iter()
        .filter(|t| t.status == 200 && t.error.is_empty())
        .count();

    let _ = writeln!(
        report,
        "\n== figures\n\
         client turns answered 200:           {ok_turns}/{TURNS}\n\
         compactions (x-compaction applied):  {} (summary=llm in {})\n\
         upstream calls:                      {} ({} for the client, {} for the summariser)\n\
         summariser answers received whole:   {answered}\n\
         summariser calls ok / error (proxy): {accepted} / {failed}\n\
         summaries used from the model:       {llm_summaries}\n\
         summariser answers rejected:         {rejected_total} {rejected:?}\n\
         upstream context-length errors:      {} ({} of them summariser calls)\n\
         wall time:                           {:.0} s",
        compactions.len(),
        compactions
            .iter()
            .filter(|t| t.x_compaction.contains("summary=llm"))
            .count(),
        calls.len(),
        calls.len() - summariser.len(),
        summariser.len(),
        overflows.len(),
        overflows.iter().filter(|c| c.summariser).count(),
        wall.as_secs_f64()
    );
    eprintln!("{report}");
    drop(proxy);
    drop(llama);

    let failed_turns: Vec<usize> = turns
        .iter()
        .filter(|t| t.status != 200 || !t.error.is_empty())
        .map(|t| t.n)
        .collect();
    assert!(
        failed_turns.is_empty(),
        "client turns not answered well: {failed_turns:?} (see the report above)"
    );
    assert!(
        overflows.is_empty(),
        "the server refused {} upstream calls for their length: {:?}",
        overflows.len(),
        overflows.iter().map(|c| c.n).collect::<Vec<_>>()
    );
    assert!(
        !compactions.is_empty(),
        "the session was never compacted: no x-compaction header says applied"
    );
    assert!(
        !summariser.is_empty(),
        "the proxy never asked the summariser"
    );
    // Every answer the model gave the summariser was either taken or turned down with a
    // reason: the proxy's accepted calls and its reasoned rejections add up to the
    // answers the server finished.
    assert_eq!(
        accepted + rejected_total,
        answered,
        "summariser answers: {answered} received whole, {accepted} accepted, \
         {rejected_total} rejected with a reason ({rejected:?}): the rest were dropped \
         without one"
    );
    assert!(
        rejected.keys().all(|r| !r.trim().is_empty()),
        "a rejection without a reason: {rejected:?}"
    );
    assert_eq!(
        rejected_logged.len() as u64,
        rejected_total,
        "each rejection logs \"summariser answer rejected\": {rejected_logged:#?}"
    );
    assert!(
        rejected_logged.iter().all(|l| l.contains("reason=")),
        "a rejection logged without its reason: {rejected_logged:#?}"
    );
}
