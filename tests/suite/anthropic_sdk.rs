//! The official `anthropic` Python SDK, unmodified, pointed at the proxy as its users
//! point it anywhere (`ANTHROPIC_BASE_URL`, the proxy without `/v1`; a dummy key), lives
//! through an agent session that outgrows its model's window several times: with tools
//! and without streaming, and streamed with extended thinking, whose signed blocks must
//! reach the upstream as the model wrote them.
//!
//! The SDK lives in the virtualenv made by `scripts/setup-clients.sh`. Without it these
//! tests say so and pass, unless `COMPACTION_PROXY_REQUIRE_CLIENTS` is set (as
//! `scripts/test.sh` and CI do), in which case a missing SDK fails.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use compaction_proxy::engine::MARKER;
use serde_json::{json, Value};
use support::{metrics, Mock, Proxy};

/// The mock's window, in its tokens, as `tests/clients/anthropic_sdk_session.py` sets it.
const WINDOW: u64 = 6000;

/// Whose key the upstream gets.
#[derive(Clone, Copy)]
enum Keys {
    /// The SDK's own, as it sent it.
    Clients,
    /// Sidecar mode: the SDK presents one of the proxy's client keys, which stays with
    /// the proxy; the upstream gets the proxy's key, where Anthropic reads it.
    Sidecar,
}

/// A finished session: the mock and proxy it ran against, and the script's report.
struct Session {
    mock: Mock,
    proxy: Proxy,
    report: Value,
}

/// Runs `tests/clients/anthropic_sdk_session.py` in `mode` against a proxy in front of a
/// fresh mock, and checks what every session must show: each turn completed without an
/// error reaching the SDK, the history it holds outgrew the window several times, the
/// upstream refused at least one request and received no invalid one, and the proxy
/// compacted (as its `x-compaction` header told the SDK, and its metrics count).
async fn session(python: PathBuf, mode: &str, shape: &str, keys: Keys) -> Session {
    let mock = Mock::start().await;
    let (proxy, key) = match keys {
        Keys::Clients => (Proxy::start(&mock.url(""), ""), "sk-ant-dummy"),
        Keys::Sidecar => {
            let config =
                "[upstream]\napi_key_env = \"UPSTREAM_KEY\"\n[auth]\nkeys_env = \"CLIENT_KEYS\"\n";
            let env = HashMap::from([("UPSTREAM_KEY", "sk-ant-upstream"), ("CLIENT_KEYS", "ck-1")]);
            (Proxy::start_with_env(&mock.url(""), config, &env), "ck-1")
        }
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/anthropic_sdk_session.py"
    );
    // A fresh HOME: no credentials profile of the machine's for the SDK to discover.
    let home = support::tempdir();
    let output = tokio::process::Command::from(Command::new(python))
        .args([script, mode])
        .env("ANTHROPIC_BASE_URL", proxy.url(""))
        .env("HOME", &home)
        .env("MOCK_SHAPE", shape)
        .env("SDK_API_KEY", key)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("no error seen by the SDK"),
        "{mode} session failed:\n{stdout}\n{stderr}\nproxy logs:\n{}",
        proxy.logs()
    );
    let report: Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("REPORT "))
        .map(|r| serde_json::from_str(r).unwrap())
        .expect("the script's report");
    eprintln!(
        "anthropic {}: {mode}: {} turns, {} requests, {} compacted",
        report["sdk"], report["turns"], report["requests"], report["compacted"]
    );

    let history = report["history_chars"].as_u64().unwrap() / 3;
    assert!(
        history > 3 * WINDOW,
        "the history ({history} tokens) should outgrow the window several times"
    );
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    let recorded = mock.recorded();
    // The session's requests and the proxy's own summariser calls alike.
    for request in recorded.iter().chain(&mock.summaries()) {
        assert_eq!(request.uri, "/v1/messages");
        assert!(request.headers.contains_key("anthropic-version"));
        let header = |name: &str| request.headers.get(name).map(|v| v.to_str().unwrap());
        match keys {
            // As the SDK sent it: 2.x sends its key as a bearer token.
            Keys::Clients => assert_eq!(header("authorization"), Some("Bearer sk-ant-dummy")),
            Keys::Sidecar => {
                assert_eq!(header("x-api-key"), Some("sk-ant-upstream"));
                assert_eq!(header("authorization"), None);
            }
        }
    }
    assert!(report["compacted"].as_u64().unwrap() >= 2, "{report}");
    let metrics = metrics(&proxy).await;
    let compactions = count(
        &metrics,
        "compaction_proxy_compactions_by_api_total{api=\"messages\"}",
    );
    assert!(compactions >= 2, "{metrics}");
    assert!(
        count(
            &metrics,
            "compaction_proxy_compactions_total{trigger=\"error\"}"
        ) >= 1,
        "no overflow was recovered from: {metrics}"
    );
    Session {
        mock,
        proxy,
        report,
    }
}

fn body_of(recorded: &support::Recorded) -> Value {
    serde_json::from_slice(&recorded.body).unwrap()
}

/// The value of the metric line `name`.
fn count(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

#[tokio::test]
async fn a_tool_loop_with_messages_create_never_sees_an_overflow() {
    let Some(python) = support::python_with("anthropic") else {
        return;
    };
    let Session { mock, .. } = session(python, "tools", "anthropic", Keys::Clients).await;
    // The last request is the last turn's tool result, after a summary of the start.
    let last = body_of(&mock.last());
    let messages = last["messages"].as_array().unwrap();
    assert!(last.to_string().contains(MARKER), "{last}");
    let results = &messages.last().unwrap()["content"][0];
    assert_eq!(results["type"], "tool_result");
    assert!(results["content"]
        .as_str()
        .unwrap()
        .contains("no method named `frobnicate` found (turn 16)"));
}

#[tokio::test]
async fn a_streamed_session_with_extended_thinking_keeps_every_kept_thinking_block() {
    let Some(python) = support::python_with("anthropic") else {
        return;
    };
    // Refused in the stream itself (an `error` event in a 200), and for a prompt and
    // `max_tokens` together over the window: the proxy then lowers `max_tokens`, which
    // must stay above the thinking budget.
    for shape in ["anthropic-stream", "anthropic-max-tokens"] {
        let session = session(python.clone(), "thinking-stream", shape, Keys::Clients).await;
        thinking_blocks_went_back_as_received(&session, shape);
    }
}

/// Every answer the SDK received opened with a signed thinking block; all but the last
/// went back in the history. The last request carries some of them, each as the SDK
/// received it and in the order received, ending with the turn in progress's; the others
/// went with the turns the proxy summarised.
fn thinking_blocks_went_back_as_received(session: &Session, shape: &str) {
    let as_received = |r: &Value| json!({"type": "thinking", "thinking": r["thinking"], "signature": r["signature"]});
    let received: Vec<Value> = session.report["thinking"]
        .as_array()
        .unwrap()
        .iter()
        .map(as_received)
        .collect();
    let sent_back = &received[..received.len() - 1];
    let last = session.mock.last();
    let raw = String::from_utf8_lossy(&last.body);
    let body = body_of(&last);
    let kept: Vec<&Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter(|b| b["type"] == "thinking")
        .collect();
    assert!(
        !kept.is_empty() && kept.len() < sent_back.len(),
        "{shape}: {} of {} thinking blocks kept\nproxy logs:\n{}",
        kept.len(),
        sent_back.len(),
        session.proxy.logs()
    );
    let mut in_order = sent_back.iter();
    for block in &kept {
        assert!(
            in_order.any(|r| r == *block),
            "{shape}: {block}: not received, or out of order"
        );
        // In the bytes too: the thinking and its signature, escaped as they came.
        for field in ["thinking", "signature"] {
            assert!(
                raw.contains(&format!("\"{field}\":{}", block[field])),
                "{shape}"
            );
        }
    }
    assert_eq!(
        kept.last(),
        sent_back.last().as_ref(),
        "{shape}: the turn in progress's"
    );
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024}),
        "{shape}"
    );
}

#[tokio::test]
async fn in_sidecar_mode_the_upstream_gets_the_proxys_key_where_anthropic_reads_it() {
    let Some(python) = support::python_with("anthropic") else {
        return;
    };
    session(python, "tools", "anthropic", Keys::Sidecar).await;
}

/// The mock's checks above are only as good as its rejections: a thinking block altered
/// on its way back, a tool loop whose calling turn lost its thinking, and a thinking
/// budget not below `max_tokens` are refused as the API refuses them, and recorded.
#[tokio::test]
async fn the_mock_refuses_thinking_the_api_would_refuse() {
    let mock = Mock::start().await;
    let thinking = "Answer 1: what next?";
    let signed = json!({"type": "thinking", "thinking": thinking,
        "signature": support::anthropic::signature(thinking)});
    let altered = json!({"type": "thinking", "thinking": "Answer 1: what next",
        "signature": support::anthropic::signature(thinking)});
    let call = json!({"type": "tool_use", "id": "toolu_1", "name": "read_log", "input": {}});
    let loop_with = |assistant: Vec<Value>, budget: u64| {
        json!({"model": "m", "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": budget},
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": assistant},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}]})
    };
    let cases = [
        (loop_with(vec![signed.clone(), call.clone()], 1024), 200),
        (loop_with(vec![altered, call.clone()], 1024), 400),
        (loop_with(vec![call.clone()], 1024), 400),
        (loop_with(vec![signed, call], 2048), 400),
    ];
    for (request, status) in cases {
        let response = support::client()
            .post(mock.url("/v1/messages"))
            .header("x-mock", "window")
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{request}");
    }
    assert_eq!(mock.state.violations.lock().unwrap().len(), 3);
}
