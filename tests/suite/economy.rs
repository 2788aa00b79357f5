//! Economy mode over real sockets: with `[compaction] economy = true` (or a request's
//! `x-compaction-economy: on`), old tool outputs reach the upstream shortened, far below
//! the window, in chat completions, Responses and Messages alike; each output's form,
//! once shortened, is the same in every later request; the latest outputs arrive whole;
//! off (the default, or `x-compaction-economy: off`), the upstream gets the client's bytes.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use serde_json::{json, Value};
use support::{metrics, Mock, Proxy};

/// Economy with small batches, so that a short session settles several.
const ON: &str = "[compaction]\neconomy = true\neconomy_age = 2\neconomy_batch_tokens = 1000\n";
const SMALL: &str = "[compaction]\neconomy_age = 2\neconomy_batch_tokens = 1000\n";

/// The same file, read again and again.
fn file() -> String {
    (0..80)
        .map(|i| format!("pub fn handler_{i}(req: Request) -> Response {{ route({i}, req) }}\n"))
        .collect()
}

/// A test run: the same log every time.
fn log() -> String {
    let mut lines: Vec<String> = (0..60).map(|i| format!("test case_{i} ... ok")).collect();
    lines[20] = "test case_20 ... FAILED".into();
    lines.push("test result: FAILED. 59 passed; 1 failed; finished in 1.20s".into());
    lines.join("\n")
}

/// Turn `n`'s call and its output: reads of src/app.rs and test runs, in turn.
fn call(n: usize) -> (String, &'static str, Value, String) {
    let id = format!("call_{n}");
    if n.is_multiple_of(2) {
        (id, "read_file", json!({"path": "src/app.rs"}), file())
    } else {
        (id, "shell", json!({"command": "cargo test"}), log())
    }
}

fn chat_messages(turns: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Make the tests pass."}),
    ];
    for n in 0..turns {
        let (id, name, args, output) = call(n);
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
    }
    messages
}

fn chat(turns: usize) -> Value {
    json!({"model": "gpt-4o", "messages": chat_messages(turns)})
}

fn responses(turns: usize) -> Value {
    let mut input = vec![json!({"role": "user", "content": "Make the tests pass."})];
    for n in 0..turns {
        let (id, name, args, output) = call(n);
        input.push(
            json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": id,
            "name": name, "arguments": args.to_string()}),
        );
        input.push(json!({"type": "function_call_output", "call_id": id, "output": output}));
    }
    json!({"model": "gpt-4o", "instructions": "You are a coding agent.", "input": input, "store": false})
}

fn messages_api(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Make the tests pass."})];
    for n in 0..turns {
        let (id, name, args, output) = call(n);
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": name, "input": args}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}));
    }
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are a coding agent.",
        "messages": messages})
}

/// Posts `body` to `path`; returns the `x-compaction` header ("" when absent).
async fn post(proxy: &Proxy, path: &str, headers: &[(&str, &str)], body: &Value) -> String {
    let response = proxy.post(path, headers, body.to_string()).await;
    assert_eq!(response.status(), 200);
    support::x_compaction(&response)
}

/// Every text of `v` (strings anywhere in it), for looking outputs up in any dialect.
fn texts(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| texts(i, out)),
        Value::Object(map) => map.values().for_each(|i| texts(i, out)),
        _ => {}
    }
}

fn count(v: &Value, needle: &str) -> usize {
    let mut all = Vec::new();
    texts(v, &mut all);
    all.iter().filter(|t| t.as_str() == needle).count()
}

fn pointers(v: &Value) -> usize {
    let mut all = Vec::new();
    texts(v, &mut all);
    all.iter()
        .filter(|t| t.starts_with("[duplicate output of "))
        .count()
}

#[tokio::test]
async fn chat_sessions_send_old_repeats_as_pointers_and_each_form_stays_put() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), ON);
    let turns = 12;
    let mut last_header = String::new();
    for t in 1..=turns {
        last_header = post(&proxy, "/v1/chat/completions", &[], &chat(t)).await;
    }
    let sent: Vec<Value> = mock
        .recorded()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(sent.len(), turns);
    let last = &sent[turns - 1];
    // The latest read and the latest run arrive whole; the outputs of all but the latest
    // few turns are pointers to later copies.
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2 + 2 * turns);
    assert_eq!(messages[messages.len() - 1]["content"], log());
    assert_eq!(messages[messages.len() - 3]["content"], file());
    for turn in 0..turns - 4 {
        let text = messages[3 + 2 * turn]["content"].as_str().unwrap();
        assert!(
            text.starts_with("[duplicate output of "),
            "turn {turn}: {text}"
        );
    }
    assert!(
        last_header.starts_with("applied; trigger=economy;"),
        "{last_header}"
    );
    assert!(last_header.contains("; economy="), "{last_header}");
    // Decided once: a message the upstream saw shortened is sent the same way later.
    for pair in sent.windows(2) {
        let (before, after) = (&pair[0]["messages"], &pair[1]["messages"]);
        for (i, b) in before.as_array().unwrap().iter().enumerate() {
            let original = &chat_messages(turns)[i];
            assert!(
                b == &after[i] || b == original,
                "messages[{i}] changed twice"
            );
        }
    }
    let m = metrics(&proxy).await;
    let shortened = sent.iter().filter(|s| pointers(s) > 0).count();
    let requests = format!("compaction_proxy_economy_requests_total {shortened}\n");
    assert!(m.contains(&requests), "{m}");
    assert!(
        !m.contains("compaction_proxy_economy_tokens_saved_total 0\n"),
        "{m}"
    );
    // Economy is no compaction event.
    assert!(m.contains("compaction_proxy_compactions_total{trigger=\"preflight\"} 0\n"));
}

#[tokio::test]
async fn off_by_default_the_upstream_gets_the_client_s_bytes() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), SMALL);
    let body = chat(12).to_string();
    let response = proxy.post("/v1/chat/completions", &[], body.clone()).await;
    assert!(response.headers().get("x-compaction").is_none());
    assert_eq!(mock.last().body, body.as_bytes());
    // Turned on for one request, by its header, which the upstream never sees.
    let headers = [("x-compaction-economy", "on")];
    let x = post(&proxy, "/v1/chat/completions", &headers, &chat(12)).await;
    assert!(x.contains("economy="), "{x}");
    let sent = mock.last();
    assert!(sent.headers.get("x-compaction-economy").is_none());
    assert!(pointers(&serde_json::from_slice(&sent.body).unwrap()) > 0);
}

#[tokio::test]
async fn the_header_turns_economy_off_for_one_request() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), ON);
    let body = chat(12).to_string();
    let headers = [("x-compaction-economy", "off")];
    let response = proxy
        .post("/v1/chat/completions", &headers, body.clone())
        .await;
    assert!(response.headers().get("x-compaction").is_none());
    assert_eq!(mock.last().body, body.as_bytes());
}

#[tokio::test]
async fn responses_and_messages_are_economized_alike() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), ON);
    for (path, body) in [
        ("/v1/responses", responses(12)),
        ("/v1/messages", messages_api(12)),
    ] {
        let x = post(&proxy, path, &[], &body).await;
        assert!(x.contains("economy="), "{path}: {x}");
        let sent: Value = serde_json::from_slice(&mock.last().body).unwrap();
        assert!(count(&sent, &file()) >= 1, "{path}: {sent}");
        assert!(count(&sent, &log()) >= 1, "{path}: {sent}");
        assert!(pointers(&sent) >= 6, "{path}: {sent}");
        // Nothing else of the client's request changed: its items, in number and kind.
        let key = if path.ends_with("responses") {
            "input"
        } else {
            "messages"
        };
        let kinds = |v: &Value| -> Vec<String> {
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| format!("{}/{}", i["type"], i["role"]))
                .collect()
        };
        assert_eq!(kinds(&sent), kinds(&body), "{path}");
    }
}

/// Economy and compaction together: a session that outgrows a small window even with its
/// repeats shortened is compacted as well, every request the upstream gets is valid, and
/// the latest output reaches it whole.
#[tokio::test]
async fn economy_and_compaction_keep_a_session_under_a_small_window() {
    let mock = Mock::start().await;
    let config = format!("{ON}[[models]]\nmatch = \"gpt-4o\"\ncontext_window = 4000\n");
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", "4000"),
    ];
    let mut marks = Vec::new();
    for t in 1..=16 {
        marks.push(post(&proxy, "/v1/chat/completions", &headers, &chat(t)).await);
    }
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    // Compaction events report their own tokens, and economy's beside them.
    let both = |x: &&String| x.contains("trigger=preflight") && x.contains("; economy=");
    assert!(marks.iter().any(|x| both(&x)), "{marks:?}");
    let last: Value = serde_json::from_slice(&mock.last().body).unwrap();
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages[messages.len() - 1]["content"], log());
}
