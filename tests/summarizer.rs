//! The LLM summariser in the compaction path: a long session against a small window gets
//! an LLM-written checkpoint (`summary=llm`); any summariser failure still gives the client
//! its answer with the deterministic summary (`summary=fallback`); secrets never reach the
//! summariser; long middles are summarised in chunks; a failure cools the summariser down.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::{metrics, post_chat, Mock, Proxy, CANNED_SUMMARY};

const API_KEY: &str = "sk-proj-Xq7LmN2pR9sT4vW8yZ1aB3cD5eF6gH0jK2lM4nP6qR8sT0uV";
const PASSWORD: &str = "Tr0ub4dor-and-3-horses";
/// The upstream's window, in the mock's tokens; the proxy is told the same.
const WINDOW: u64 = 6000;

/// An agent session of `turns` rounds (a request, two tool calls with long outputs, a
/// reply) with secrets planted in the third round, ending on a new user request.
fn session(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for n in 0..turns {
        let ask = if n == 2 {
            format!("Turn {n}: deploy with OPENAI_API_KEY={API_KEY} and the db url postgres://app:{PASSWORD}@db/app, password={PASSWORD}")
        } else {
            format!("Turn {n}: the test test_module_{n} fails; fix src/module_{n}.rs.")
        };
        messages.push(json!({"role": "user", "content": ask}));
        let (read, run) = (format!("call_{n}_read"), format!("call_{n}_run"));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": read, "type": "function", "function": {"name": "read_file",
                "arguments": json!({"path": format!("src/module_{n}.rs")}).to_string()}},
            {"id": run, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test test_module_{n}")}).to_string()}},
        ]}));
        let file: String = (0..40)
            .map(|line| format!("    let value_{line} = compute_{n}({line}); // line {line}\n"))
            .collect();
        messages.push(json!({"role": "tool", "tool_call_id": read, "content": file}));
        messages.push(json!({"role": "tool", "tool_call_id": run,
            "content": format!("error[E0382]: borrow of moved value: `value_{n}`\n{}", "   Compiling app\n".repeat(20))}));
        messages.push(json!({"role": "assistant", "content": format!("Fixed module {n}: the value is cloned before the move.")}));
    }
    messages.push(json!({"role": "user", "content": "Now run the whole test suite and report."}));
    json!({"model": "mock-agent-model", "messages": messages})
}

/// A proxy that knows the upstream's window, with `summarizer` settings added.
fn proxy(mock: &Mock, summarizer: &str) -> Proxy {
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[summarizer]\n{summarizer}\n"
    );
    Proxy::start(&mock.url("/v1"), &config)
}

/// Sends `request` with the summariser behaving as `summary` says; returns the status and
/// the `x-compaction` header.
async fn send(proxy: &Proxy, summary: &str, request: &Value) -> (u16, String) {
    let window = WINDOW.to_string();
    let headers = [
        ("authorization", "Bearer client-key"),
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window.as_str()),
        ("x-mock-summary", summary),
    ];
    post_chat(proxy, &headers, request).await
}

fn bodies(recorded: &[support::Recorded]) -> Vec<Value> {
    recorded
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

#[tokio::test]
async fn the_llm_checkpoint_replaces_the_middle_and_never_sees_a_secret() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "context_window = 128000");
    let (status, x) = send(&proxy, "ok", &session(30)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}");

    let calls = mock.summaries();
    // The summariser's window holds the whole middle: one call.
    assert_eq!(calls.len(), 1);
    let text = String::from_utf8_lossy(&calls[0].body);
    assert!(
        text.contains("Turn 2: deploy with OPENAI_API_KEY=[REDACTED"),
        "{text}"
    );
    for call in &calls {
        let text = String::from_utf8_lossy(&call.body);
        assert!(
            !text.contains(API_KEY) && !text.contains(PASSWORD),
            "{text}"
        );
        assert_eq!(call.uri, "/v1/chat/completions");
        assert_eq!(call.headers["authorization"], "Bearer client-key");
    }
    let body: Value = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(body["stream"], true);
    assert_eq!(body["model"], "mock-agent-model");

    let sent = mock.last();
    let sent = String::from_utf8_lossy(&sent.body);
    assert!(sent.contains("MOCK-CHECKPOINT"), "{sent}");
    assert!(mock.state.violations.lock().unwrap().is_empty());
    let metrics = metrics(&proxy).await;
    assert!(metrics.contains("compaction_proxy_summaries_total{source=\"llm\"} 1\n"));
    let ok = format!(
        "compaction_proxy_summarizer_calls_total{{outcome=\"ok\"}} {}\n",
        calls.len()
    );
    assert!(metrics.contains(&ok), "{metrics}");
    // The summariser's calls are not the client's attempts.
    let attempts = format!(
        "compaction_proxy_upstream_attempts_total {}\n",
        mock.recorded().len()
    );
    assert!(metrics.contains(&attempts), "{metrics}");
}

/// A summariser that fails as `behaviour` says still gives the client its answer.
async fn falls_back(behaviour: &str) {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "timeout_ms = 300");
    let (status, x) = send(&proxy, behaviour, &session(30)).await;
    assert_eq!(status, 200, "{behaviour}: {}", proxy.logs());
    assert!(x.contains("summary=fallback"), "{behaviour}: {x}");
    assert!(!mock.summaries().is_empty(), "{behaviour}");
    let sent = mock.last();
    assert!(!String::from_utf8_lossy(&sent.body).contains("MOCK-CHECKPOINT"));
    let metrics = metrics(&proxy).await;
    assert!(
        metrics.contains("compaction_proxy_summaries_total{source=\"fallback\"} 1\n"),
        "{behaviour}: {metrics}"
    );
    assert!(
        metrics.contains("compaction_proxy_summarizer_calls_total{outcome=\"error\"} 1\n"),
        "{behaviour}: {metrics}"
    );
    assert!(proxy.logged("summariser failed"), "{behaviour}");
}

#[tokio::test]
async fn a_summariser_500_falls_back() {
    falls_back("500").await;
}

#[tokio::test]
async fn a_summariser_401_falls_back() {
    falls_back("401").await;
}

#[tokio::test]
async fn a_silent_summariser_times_out_and_falls_back() {
    falls_back("silent").await;
}

#[tokio::test]
async fn an_empty_summary_falls_back() {
    falls_back("empty").await;
}

#[tokio::test]
async fn a_refusal_falls_back() {
    falls_back("refusal").await;
}

#[tokio::test]
async fn a_middle_longer_than_the_summarisers_window_is_summarised_in_chunks() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "context_window = 3000");
    let (status, x) = send(&proxy, "ok", &session(40)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}");
    let calls = bodies(&mock.summaries());
    assert!(calls.len() >= 2, "{} calls", calls.len());
    let first = calls[0]["messages"][1]["content"].as_str().unwrap();
    assert!(first.starts_with("<turns>"), "{first}");
    for call in &calls[1..] {
        let user = call["messages"][1]["content"].as_str().unwrap();
        assert!(
            user.starts_with(&format!(
                "<previous-checkpoint>\n{}",
                CANNED_SUMMARY.lines().next().unwrap()
            )),
            "{user}"
        );
    }
}

#[tokio::test]
async fn after_a_failure_the_summariser_cools_down() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "");
    let (status, x) = send(&proxy, "500", &session(30)).await;
    assert_eq!((status, x.contains("summary=fallback")), (200, true), "{x}");
    let failed = mock.summaries().len();
    // Another conversation: the first one's checkpoint would spare it any summary.
    let mut other = session(31);
    other["messages"][0]["content"] = json!("You are another coding agent.");
    let (status, x) = send(&proxy, "ok", &other).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=fallback"), "{x}");
    assert_eq!(mock.summaries().len(), failed);
}

#[tokio::test]
async fn a_disabled_summariser_is_never_called() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "enabled = false");
    let (status, x) = send(&proxy, "ok", &session(30)).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=fallback"), "{x}");
    assert!(mock.summaries().is_empty());
}

#[tokio::test]
async fn a_failing_summariser_model_falls_back_to_the_requests_model() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "model = \"summary-model\"\ncontext_window = 128000");
    let (status, x) = send(&proxy, "500-for:summary-model", &session(30)).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=llm"), "{x}");
    let models: Vec<Value> = bodies(&mock.summaries())
        .into_iter()
        .map(|b| b["model"].clone())
        .collect();
    assert_eq!(models, [json!("summary-model"), json!("mock-agent-model")]);
}
