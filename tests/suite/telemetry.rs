//! OpenTelemetry traces, checked with a real OTLP/HTTP receiver on loopback
//! (`tests/clients/otlp_receiver.py`, which decodes the protobuf with the
//! `opentelemetry-proto` package): a request compacted after the upstream's refusal is
//! one span named "chat {model}" with the GenAI conventions and the compaction as
//! attributes, with a child per upstream attempt and per summariser call, in the trace the
//! client's `traceparent` names. And a receiver that is down or never answers neither
//! slows nor fails a request.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{client, Mock, Proxy};

const MODEL: &str = "mock-agent-model";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(python: &Path) -> Self {
        let out = support::tempdir().join("spans.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/otlp_receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();
        Self { child, port, out }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The spans received once `done` says they are all there (within ten seconds).
    async fn wait_for(&self, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A session of `turns` agent turns with large tool outputs, too long for a 3,000-token
/// window.
fn long_request(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for n in 0..turns {
        let id = format!("call_{n}");
        let output: String = (0..40)
            .map(|i| format!("test module_{n}::case_{i} ... ok (took {i} ms)\n"))
            .collect();
        messages.extend([
            json!({"role": "user", "content": format!("Turn {n}: run the tests of module {n}.")}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "run_command",
                    "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": output}),
        ]);
    }
    json!({"model": MODEL, "messages": messages})
}

async fn post(proxy: &Proxy, request: &Value, traceparent: Option<&str>) -> (u16, String) {
    let mut builder = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer k")
        .header("x-mock", "window")
        .header("x-mock-shape", "openai")
        .header("x-mock-window", "3000");
    if let Some(tp) = traceparent {
        builder = builder.header("traceparent", tp);
    }
    let response = builder.json(request).send().await.unwrap();
    let status = response.status().as_u16();
    let x = support::x_compaction(&response);
    response.bytes().await.unwrap();
    (status, x)
}

/// The OTLP receiver, and a proxy in front of `upstream` exporting to it, with `config`
/// before its `[telemetry]`; `None`, and the test is skipped, without Python's
/// OpenTelemetry protos.
fn traced(upstream: &str, config: &str) -> Option<(Receiver, Proxy)> {
    let python = support::python_with("opentelemetry.proto")?;
    let receiver = Receiver::start(&python);
    let config = format!(
        "{config}[telemetry]\notlp_endpoint = \"http://127.0.0.1:{}\"\n",
        receiver.port
    );
    let proxy = Proxy::start(upstream, &config);
    Some((receiver, proxy))
}

#[tokio::test]
async fn a_compacted_request_is_one_span_with_a_child_per_call() {
    let mock = Mock::start().await;
    let Some((receiver, proxy)) = traced(&mock.url("/v1"), "") else {
        return;
    };
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let (status, x) = post(&proxy, &long_request(12), Some(&traceparent)).await;
    assert_eq!(status, 200, "{x}");
    assert!(x.contains("trigger=error"), "{x}");

    let name = format!("chat {MODEL}");
    let spans = receiver
        .wait_for(|spans| spans.iter().any(|s| s["name"] == name.as_str()))
        .await;
    for span in &spans {
        println!("{span}");
    }
    let request = spans
        .iter()
        .find(|s| s["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no request span in {spans:#?}\n{}", proxy.logs()));
    assert_eq!(request["resource"]["service.name"], "compaction-proxy");
    assert_eq!(request["trace_id"], TRACE_ID, "the client's trace");
    assert_eq!(request["parent_span_id"], CLIENT_SPAN, "the client's span");
    assert_eq!(request["kind"], 2, "server");
    let a = &request["attributes"];
    assert_eq!(a["gen_ai.operation.name"], "chat");
    assert_eq!(a["gen_ai.provider.name"], "127.0.0.1");
    assert_eq!(a["gen_ai.request.model"], MODEL);
    assert_eq!(a["http.response.status_code"], 200);
    assert!(a["gen_ai.usage.input_tokens"].as_i64().unwrap() > 0, "{a}");
    assert_eq!(a["gen_ai.usage.output_tokens"], 5);
    assert_eq!(a["compaction.trigger"], "error");
    assert_eq!(a["compaction.summary"], "llm");
    let before = a["compaction.tokens_before"].as_i64().unwrap();
    let after = a["compaction.tokens_after"].as_i64().unwrap();
    assert!(0 < after && after < before, "{a}");
    assert!(a.get("error.type").is_none(), "{a}");

    let children: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parent_span_id"] == request["span_id"])
        .collect();
    for child in &children {
        assert_eq!(child["trace_id"], TRACE_ID);
        let (start, end) = (&child["start_time_unix_nano"], &child["end_time_unix_nano"]);
        assert!(start.as_u64() >= request["start_time_unix_nano"].as_u64());
        assert!(end.as_u64() <= request["end_time_unix_nano"].as_u64());
    }
    let attempts: Vec<&Value> = children
        .iter()
        .copied()
        .filter(|s| s["name"] == "upstream attempt")
        .collect();
    let codes: Vec<&Value> = attempts
        .iter()
        .map(|s| &s["attributes"]["http.response.status_code"])
        .collect();
    assert_eq!(codes, [&json!(400), &json!(200)], "{attempts:#?}");
    assert_eq!(attempts[0]["attributes"]["error.type"], "400");
    assert_eq!(attempts[0]["status"]["code"], "STATUS_CODE_ERROR");
    assert_eq!(attempts[1]["kind"], 3, "client");
    let summaries = children.iter().filter(|s| s["name"] == "summarise").count();
    assert_eq!(summaries, 1, "{children:#?}");
    assert_eq!(children.len(), 3, "{children:#?}");
    // The receiver wrote the spans before it answered the export: the count may lag.
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = support::metrics(&proxy).await;
        if metrics.contains("compaction_proxy_trace_spans_exported_total 4\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metrics.contains("compaction_proxy_trace_spans_exported_total 4\n"),
        "{metrics}"
    );
    assert!(metrics.contains("compaction_proxy_trace_spans_dropped_total 0\n"));
}

/// Requests through a proxy whose receiver is down, or accepts and never answers, are
/// answered as fast as without it; the failure is logged once.
#[tokio::test]
async fn a_dead_receiver_neither_slows_nor_fails_requests() {
    let mock = Mock::start().await;
    // Nothing listens on a port just freed.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_port = down.local_addr().unwrap().port();
    drop(down);
    // A listener that is never accepted from: connections open, nothing answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    for port in [down_port, silent_port] {
        let endpoint = format!("http://127.0.0.1:{port}");
        // The silent one through the standard variable.
        let proxy = if port == down_port {
            let config = format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n");
            Proxy::start(&mock.url("/v1"), &config)
        } else {
            let env = HashMap::from([("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
            Proxy::start_with_env(&mock.url("/v1"), "", &env)
        };
        for n in 0..20 {
            let started = Instant::now();
            let (status, x) = post(&proxy, &long_request(1 + n % 3), None).await;
            assert_eq!(status, 200, "{x}");
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "request {n} took {:?}",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        if port == down_port {
            assert!(proxy.logged("trace export failed"), "{}", proxy.logs());
            let failures = proxy.logs().matches("trace export failed").count();
            assert_eq!(failures, 1, "{}", proxy.logs());
            let metrics = support::metrics(&proxy).await;
            let line = metrics
                .lines()
                .find(|l| l.starts_with("compaction_proxy_trace_export_failures_total "))
                .unwrap();
            assert_ne!(
                line, "compaction_proxy_trace_export_failures_total 0",
                "{metrics}"
            );
        }
    }
    drop(silent);
}

/// The endpoint is validated at start, from the configuration and from the environment.
#[test]
fn an_endpoint_that_is_not_http_is_refused_at_start() {
    let dir = support::tempdir();
    let config = dir.join("proxy.toml");
    std::fs::write(
        &config,
        "[telemetry]\notlp_endpoint = \"grpc://collector:4317\"\n",
    )
    .unwrap();
    let message = support::refused_config(&config);
    assert!(message.contains("telemetry.otlp_endpoint"), "{message}");
}

/// A request the upstream never answers is a failed span that says why, for every API,
/// and so is its attempt.
#[tokio::test]
async fn a_failed_request_names_its_error() {
    let Some(python) = support::python_with("opentelemetry.proto") else {
        return;
    };
    let receiver = Receiver::start(&python);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}/v1", dead.local_addr().unwrap());
    drop(dead);
    let config = format!(
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:{}/\"\n",
        receiver.port
    );
    let proxy = Proxy::start(&upstream, &config);
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let messages = json!({"model": "claude-x", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    for (path, body) in [("/v1/chat/completions", chat), ("/v1/messages", messages)] {
        let response = client()
            .post(proxy.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 502, "{path}");
    }
    let spans = receiver
        .wait_for(|spans| spans.iter().filter(|s| s["kind"] == 2).count() == 2)
        .await;
    for name in ["chat m", "messages claude-x"] {
        let span = spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {spans:#?}"));
        assert_eq!(span["attributes"]["error.type"], "upstream_unreachable");
        assert_eq!(span["status"]["code"], "STATUS_CODE_ERROR");
        let attempt = spans
            .iter()
            .find(|s| s["parent_span_id"] == span["span_id"])
            .unwrap();
        assert_eq!(attempt["name"], "upstream attempt");
        assert_eq!(attempt["attributes"]["error.type"], "upstream_unreachable");
    }
}

/// Codex's own compaction requests (a Responses request ending in `compaction_trigger`,
/// and `POST /responses/compact`) answered by the proxy for an upstream that lacks them
/// are client requests like any other: a span each, with the refused attempt and the
/// summariser call under it.
#[tokio::test]
async fn a_codex_compaction_request_is_a_span_with_its_summariser_call() {
    let mock = Mock::start().await;
    let Some((receiver, proxy)) = traced(&mock.url("/v1"), "") else {
        return;
    };
    let input = json!([
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "make the build pass"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed src/main.rs."}]},
    ]);
    let mut trigger_input = input.as_array().unwrap().clone();
    trigger_input.push(json!({"type": "compaction_trigger"}));
    let requests = [
        (
            "/v1/responses",
            json!({"model": "gpt-5", "input": trigger_input, "store": false}),
        ),
        (
            "/v1/responses/compact",
            json!({"model": "gpt-5", "input": input}),
        ),
    ];
    for (path, body) in &requests {
        let response = client()
            .post(proxy.url(path))
            .header("x-mock", "window")
            .header("x-mock-window", "100000")
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        response.bytes().await.unwrap();
    }
    let name = "responses.compact gpt-5";
    let spans = receiver
        .wait_for(|spans| spans.iter().filter(|s| s["name"] == name).count() == 2)
        .await;
    let requests: Vec<&Value> = spans.iter().filter(|s| s["name"] == name).collect();
    assert_eq!(requests.len(), 2, "{spans:#?}\n{}", proxy.logs());
    let mut attempts = 0;
    for request in requests {
        assert_eq!(request["kind"], 2, "server");
        assert_eq!(request["attributes"]["gen_ai.request.model"], "gpt-5");
        let children: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_span_id"] == request["span_id"])
            .collect();
        let names: Vec<&Value> = children.iter().map(|s| &s["name"]).collect();
        assert!(names.contains(&&json!("summarise")), "{names:?}");
        attempts += names.iter().filter(|n| **n == "upstream attempt").count();
    }
    // The first request asks the upstream, which refuses the trigger; the second is
    // answered without asking again.
    assert_eq!(attempts, 1, "{spans:#?}");
}

/// A compaction prepared in the background, ahead of the turn that will need it, is in
/// the trace of the request that started it: a "prepare compaction" span under the
/// request's, with its summariser call under it, though it may end after the answer.
#[tokio::test]
async fn a_prepared_compaction_is_in_the_trace_of_the_request_that_started_it() {
    const WINDOW: u64 = 20_000;
    let mock = Mock::start().await;
    let models = format!("[[models]]\nmatch = \"{MODEL}\"\ncontext_window = {WINDOW}\n\n");
    let Some((receiver, proxy)) = traced(&mock.url("/v1"), &models) else {
        return;
    };
    // Past the prepare mark (75% of the window), short of the threshold (90%).
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for n in 0..13 {
        messages.push(json!({"role": "user", "content": format!("Turn {n}: fix module {n}.")}));
        let answer = format!("Module {n}: the fix and why it holds. ").repeat(80);
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    messages.push(json!({"role": "user", "content": "Turn 13: fix module 13."}));
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer k")
        .header("x-mock", "window")
        .header("x-mock-shape", "openai")
        .header("x-mock-window", WINDOW.to_string())
        .header("x-mock-summary", "ok")
        .header("x-mock-summary-delay-ms", "300")
        .json(&json!({"model": MODEL, "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        support::x_compaction(&response),
        "",
        "nothing compacted yet"
    );
    response.bytes().await.unwrap();

    let spans = receiver
        .wait_for(|spans| spans.iter().any(|s| s["name"] == "summarise"))
        .await;
    let find = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {spans:#?}\n{}", proxy.logs()))
    };
    let request = find(&format!("chat {MODEL}"));
    let prepare = find("prepare compaction");
    let summarise = find("summarise");
    assert_eq!(prepare["parent_span_id"], request["span_id"]);
    assert_eq!(prepare["trace_id"], request["trace_id"]);
    assert_eq!(summarise["parent_span_id"], prepare["span_id"]);
    assert_eq!(summarise["trace_id"], request["trace_id"]);
    // The request's own span holds no compaction: nothing was compacted in it.
    assert!(
        request["attributes"].get("compaction.trigger").is_none(),
        "{request:#}"
    );
}

/// Economy mode's work is on the request's span, apart from compaction's attributes.
#[tokio::test]
async fn economy_is_told_on_the_request_span() {
    let mock = Mock::start().await;
    let config = "[compaction]\neconomy = true\neconomy_age = 2\neconomy_batch_tokens = 500\n";
    let Some((receiver, proxy)) = traced(&mock.url("/v1"), config) else {
        return;
    };
    let mut request = long_request(12);
    // The same output every turn: all but the latest few become pointers.
    for m in request["messages"].as_array_mut().unwrap() {
        if m["role"] == "tool" {
            m["content"] = json!("the same output line\n".repeat(60));
        }
    }
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let x = support::x_compaction(&response);
    assert!(x.contains("; economy="), "{x}");
    response.bytes().await.unwrap();
    let name = format!("chat {MODEL}");
    let spans = receiver
        .wait_for(|spans| spans.iter().any(|s| s["name"] == name.as_str()))
        .await;
    let span = spans
        .iter()
        .find(|s| s["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no request span in {spans:#?}"));
    let a = &span["attributes"];
    let before = a["economy.tokens_before"].as_i64().unwrap();
    let after = a["economy.tokens_after"].as_i64().unwrap();
    assert!(0 < after && after < before, "{a}");
    assert!(a["economy.outputs"].as_i64().unwrap() > 0, "{a}");
    assert!(a.get("compaction.trigger").is_none(), "{a}");
}
