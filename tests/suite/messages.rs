//! Clients of Anthropic's Messages API (`POST /v1/messages?beta=true`: Claude Code, the
//! Anthropic SDKs) survive sessions longer than their model's window, as chat clients
//! do: the proxy compacts `messages` on the same path and writes back the client's own
//! blocks (thinking with its signature, server tool blocks, `system` messages, breakpoints
//! on what is kept), leaves the top-level `system` byte for byte, recovers from each of
//! Anthropic's refusals, and leaves a conversation the provider compacts itself to the
//! provider.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use compaction_proxy::engine::MARKER;
use serde_json::{json, Value};
use support::{client, metrics, x_compaction, Mock, Proxy, Recorded};

const MODEL: &str = "claude-opus-5-5";
const BETAS: &str = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01";
const KEY: &str = "sk-ant-test-key";

fn proxy(mock: &Mock) -> Proxy {
    Proxy::start(&mock.url(""), "")
}

/// The top-level `system` as Claude Code sends it: three text blocks, two breakpoints.
fn system() -> Value {
    json!([
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "You are an interactive agent that helps users with software engineering tasks.", "cache_control": {"type": "ephemeral"}},
    ])
}

/// The `system` messages Claude Code opens `messages` with; the first carries its own
/// fields and the third breakpoint.
fn instructions() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": [{"type": "text", "text": "<env>Working directory: /srv/app</env>"}],
            "output_config": {"effort": "medium"}, "cache_control": {"type": "ephemeral"}}),
        json!({"role": "system", "content": "Deferred tools: WebFetch, NotebookEdit"}),
    ]
}

/// One turn of Claude Code: the user asks, the model thinks and runs a command, its
/// output comes back with a reminder, the model thinks and answers.
fn turn(n: usize) -> [Value; 4] {
    let id = format!("toolu_{n:04}");
    let log = format!(
        "running test_{n}\nerror[E0382]: borrow of moved value\n{}test result: FAILED\n",
        "   Compiling app v0.1.0 (/srv/app)\n".repeat(40)
    );
    [
        json!({"role": "user", "content": [{"type": "text", "text": format!("turn {n}: fix test_{n}")}]}),
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("Run test_{n} first."), "signature": format!("sig-a-{n}")},
            {"type": "text", "text": "Running the test."},
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": format!("cargo test test_{n}")}}]}),
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": log},
            {"type": "text", "text": "<system-reminder>The task list is empty.</system-reminder>"}]}),
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The clone fixes it.", "signature": format!("sig-b-{n}")},
            {"type": "text", "text": format!("Fixed test_{n}.")}]}),
    ]
}

/// A request as Claude Code builds it, with its rolling breakpoint on the last block.
fn request(messages: &[Value], stream: bool) -> Value {
    let mut messages = messages.to_vec();
    let last = messages.last_mut().unwrap();
    let blocks = last["content"].as_array_mut().unwrap();
    blocks.last_mut().unwrap()["cache_control"] = json!({"type": "ephemeral"});
    json!({"model": MODEL, "max_tokens": 128000, "stream": stream, "messages": messages,
        "system": system(), "tools": [
            {"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object",
                "properties": {"command": {"type": "string"}}}},
            {"name": "DeferredToolPlaceholder", "description": "", "input_schema": {"type": "object"}, "defer_loading": true}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"s\"}"}})
}

/// What the client got: status, `x-compaction`, the body as read.
struct Answer {
    status: u16,
    x: String,
    text: String,
}

async fn post(proxy: &Proxy, path: &str, shape: &str, window: u64, body: &[u8]) -> Answer {
    let response = client()
        .post(proxy.url(path))
        .header("x-mock", "window")
        .header("x-mock-shape", shape)
        .header("x-mock-window", window.to_string())
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", BETAS)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let x = x_compaction(&response);
    Answer {
        status,
        x,
        text: response.text().await.unwrap(),
    }
}

async fn send(proxy: &Proxy, shape: &str, window: u64, body: &Value) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap();
    post(proxy, "/v1/messages?beta=true", shape, window, &bytes).await
}

fn body_of(recorded: &Recorded) -> Value {
    serde_json::from_slice(&recorded.body).unwrap()
}

/// The client's credentials, versions and betas, and its query, reached the upstream.
fn passed_through(recorded: &Recorded) {
    let header = |name: &str| recorded.headers[name].to_str().unwrap();
    assert_eq!(header("x-api-key"), KEY);
    assert_eq!(header("anthropic-version"), "2023-06-01");
    assert_eq!(header("anthropic-beta"), BETAS);
    assert_eq!(recorded.uri, "/v1/messages?beta=true");
}

/// The mock's tokens of a whole history, to show it outgrew the window.
fn history_tokens(messages: &[Value]) -> u64 {
    support::anthropic::tokens(&request(messages, false))
}

#[tokio::test]
async fn a_long_claude_code_session_never_dies_of_its_length() {
    const WINDOW: u64 = 6000;
    for (stream, shape) in [(false, "anthropic"), (true, "anthropic-stream")] {
        let mock = Mock::start().await;
        let proxy = proxy(&mock);
        let mut messages = instructions();
        let mut refused_and_recovered = 0;
        let mut llm = 0;
        for n in 0..30 {
            let [ask, call, results, answer] = turn(n);
            messages.extend([ask, call, results]);
            let sent = request(&messages, stream);
            let got = send(&proxy, shape, WINDOW, &sent).await;
            assert_eq!(got.status, 200, "turn {n}: {}\n{}", got.x, got.text);
            assert!(got.text.contains("MOCK-MESSAGE"), "turn {n}: {}", got.text);
            if got.x.contains("trigger=error") {
                refused_and_recovered += 1;
            }
            if got.x.contains("summary=llm") {
                llm += 1;
            }
            let last = mock.last();
            passed_through(&last);
            let up = body_of(&last);
            // The top-level `system`, byte for byte, and every field but `messages`.
            let system = serde_json::to_string(&sent["system"]).unwrap();
            assert!(
                String::from_utf8_lossy(&last.body).contains(&system),
                "turn {n}"
            );
            for (key, value) in sent.as_object().unwrap() {
                if key != "messages" && key != "max_tokens" {
                    assert_eq!(&up[key], value, "turn {n}: {key}");
                }
            }
            // Claude Code's 128000 completion tokens do not fit a small window: lowered.
            assert!(up["max_tokens"].as_u64().unwrap() <= 128000);
            // The `system` messages in place; the turn in progress whole, thinking and
            // breakpoint included.
            let kept = up["messages"].as_array().unwrap();
            let ours = sent["messages"].as_array().unwrap();
            assert_eq!(kept[..2], ours[..2], "turn {n}");
            assert_eq!(
                kept[kept.len() - 2..],
                ours[ours.len() - 2..],
                "turn {n}: {}",
                got.x
            );
            messages.push(answer);
        }
        assert!(history_tokens(&messages) > 3 * WINDOW);
        assert!(
            refused_and_recovered >= 1,
            "the window was never learned from a refusal"
        );
        let violations = mock.state.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "{violations:?}");
        assert!(
            mock.recorded()
                .iter()
                .any(|r| String::from_utf8_lossy(&r.body).contains(MARKER)),
            "the session was never compacted"
        );
        let metrics = metrics(&proxy).await;
        assert!(
            !metrics.contains("compaction_proxy_compactions_by_api_total{api=\"messages\"} 0\n"),
            "{metrics}"
        );
        // The summaries were written by the model, asked in the client's own dialect, on
        // its own path, with its own credentials and version.
        assert!(llm >= 1, "no summary was the model's: {}", proxy.logs());
        let summaries = mock.summaries();
        assert!(!summaries.is_empty());
        for call in &summaries {
            assert_eq!(call.uri, "/v1/messages?beta=true");
            passed_through(call);
            let body = body_of(call);
            assert!(body["system"]
                .as_str()
                .unwrap()
                .starts_with("You are writing a checkpoint"));
            assert!(
                compaction_proxy::dialect::messages::validate(&body).is_ok(),
                "{body}"
            );
        }
    }
}

/// A history of `turns` finished turns and a new question.
fn long_history(turns: usize) -> Vec<Value> {
    let mut messages = instructions();
    for n in 0..turns {
        messages.extend(turn(n));
    }
    messages.push(
        json!({"role": "user", "content": [{"type": "text", "text": "and now the last one"}]}),
    );
    messages
}

#[tokio::test]
async fn every_refusal_of_a_long_prompt_is_recovered_from_anthropic_s_and_compatible_servers() {
    let messages = long_history(12);
    assert!(history_tokens(&messages) > 6000);
    for (shape, stream) in [
        ("anthropic", false),
        ("anthropic-stream", true),
        ("anthropic-413", false),
        // Anthropic-compatible servers' own wordings.
        ("llamacpp", false),
        ("vllm-new", true),
        ("litellm", false),
    ] {
        // A proxy of its own for each shape: one that knew the window would not wait
        // for the refusal.
        let mock = Mock::start().await;
        let proxy = proxy(&mock);
        let got = send(&proxy, shape, 4000, &request(&messages, stream)).await;
        assert_eq!(got.status, 200, "{shape}: {}\n{}", got.x, got.text);
        assert!(got.x.contains("trigger=error"), "{shape}: {}", got.x);
        let recorded = mock.recorded();
        assert!(recorded.len() > 1, "{shape}: no refusal was seen");
        recorded.iter().for_each(passed_through);
        assert!(mock.state.violations.lock().unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_max_tokens_too_large_for_the_window_is_lowered_before_anything_is_cut() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let messages = long_history(2);
    let sent = request(&messages, true);
    let got = send(&proxy, "anthropic-max-tokens", 20_000, &sent).await;
    assert_eq!(got.status, 200, "{}\n{}", got.x, got.text);
    assert!(got.x.contains("output=128000->"), "{}", got.x);
    let up = body_of(&mock.last());
    assert!(up["max_tokens"].as_u64().unwrap() < 20_000);
    assert_eq!(
        up["messages"], sent["messages"],
        "the conversation as it was"
    );
}

#[tokio::test]
async fn a_conversation_the_provider_compacts_is_left_to_the_provider() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let mut asks_for_compaction = request(&long_history(12), false);
    asks_for_compaction["context_management"]["edits"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}}));
    let mut compacted_before = request(&long_history(12), false);
    compacted_before["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .insert(
            0,
            json!({"type": "compaction", "content": "What happened before."}),
        );
    for body in [asks_for_compaction, compacted_before] {
        let bytes = serde_json::to_vec_pretty(&body).unwrap();
        let got = post(&proxy, "/v1/messages?beta=true", "anthropic", 4000, &bytes).await;
        assert_eq!(got.status, 400);
        assert!(got.text.contains("prompt is too long"), "{}", got.text);
        assert_eq!(got.x, "", "the proxy did nothing");
        assert_eq!(mock.last().body, bytes, "forwarded as the client's bytes");
        passed_through(&mock.last());
    }
}

#[tokio::test]
async fn counting_tokens_and_batches_pass_through() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let body = serde_json::to_vec(&request(&long_history(12), false)).unwrap();
    for path in [
        "/v1/messages/count_tokens?beta=true",
        "/v1/messages/batches",
    ] {
        let response = client()
            .post(proxy.url(path))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(x_compaction(&response), "");
        assert_eq!(response.bytes().await.unwrap(), body, "{path}");
        assert_eq!(mock.last().uri, path);
    }
}
