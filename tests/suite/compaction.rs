//! Clients never notice a context overflow: a long agent session against an upstream
//! with a small window, refusing in several providers' shapes, gets a 200 on every
//! turn, and every request the upstream sees is a valid conversation.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use support::{client, metrics, Mock, Proxy};

const SYSTEM: &str = "You are a careful coding agent working in the repository at /srv/app. \
Use the tools to read files and run commands. Keep answers short.";

/// A client-side agent: it keeps the whole history and resends it every turn, as real
/// agents do, adding tool calls with large outputs as it works.
struct Agent {
    messages: Vec<Value>,
    stream: bool,
    max_tokens: Option<u64>,
}

impl Agent {
    fn new(stream: bool) -> Self {
        Self {
            messages: vec![json!({"role": "system", "content": SYSTEM})],
            stream,
            max_tokens: None,
        }
    }

    /// One turn: the user asks, the model (played by the agent) calls two tools in
    /// parallel whose large outputs come back, and the request goes upstream.
    fn turn(&mut self, n: usize) -> Value {
        self.messages
            .push(json!({"role": "user", "content": format!(
            "Turn {n}: the test test_module_{n} fails; find out why and fix src/module_{n}.rs.")}));
        let read = format!("call_{n}_read");
        let run = format!("call_{n}_run");
        self.messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": read, "type": "function", "function": {"name": "read_file",
                "arguments": json!({"path": format!("src/module_{n}.rs")}).to_string()}},
            {"id": run, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test test_module_{n}")}).to_string()}},
        ]}));
        let file: String = (0..60)
            .map(|line| format!("    let value_{line} = compute_{n}({line}); // line {line}\n"))
            .collect();
        let log = format!(
            "running 1 test\nerror[E0382]: borrow of moved value: `value_{n}`\n{}test result: FAILED\n",
            "   Compiling app v0.1.0 (/srv/app)\n".repeat(30)
        );
        self.messages
            .push(json!({"role": "tool", "tool_call_id": read, "content": file}));
        self.messages
            .push(json!({"role": "tool", "tool_call_id": run, "content": log}));
        let mut request =
            json!({"model": "mock-agent-model", "messages": self.messages, "stream": self.stream});
        if let Some(max) = self.max_tokens {
            request["max_tokens"] = json!(max);
        }
        request
    }

    fn answered(&mut self, reply: String) {
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
    }
}

/// Sends one request and returns the status, the `x-compaction` header and the reply.
async fn send(
    proxy: &Proxy,
    shape: &str,
    window: u64,
    request: &Value,
) -> (u16, Option<String>, String) {
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-mock", "window")
        .header("x-mock-shape", shape)
        .header("x-mock-window", window.to_string())
        .json(request)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let x = response
        .headers()
        .get("x-compaction")
        .map(|v| v.to_str().unwrap().to_owned());
    let streamed = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let text = if streamed {
        let mut stream = response.bytes_stream();
        let mut raw = Vec::new();
        while let Some(chunk) = stream.next().await {
            raw.extend_from_slice(&chunk.unwrap());
        }
        sse_text(&String::from_utf8(raw).unwrap())
    } else {
        let body = response.text().await.unwrap();
        match serde_json::from_str::<Value>(&body) {
            Ok(v) => v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or(&body)
                .to_owned(),
            Err(_) => body,
        }
    };
    (status, x, text)
}

fn sse_text(raw: &str) -> String {
    assert!(
        raw.ends_with("data: [DONE]\n\n"),
        "stream did not end with [DONE]: {raw}"
    );
    raw.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// Runs a session of `turns` turns and checks every turn got a 200 with the model's
/// answer to the latest user message, and the upstream never saw an invalid request.
async fn session(shape: &str, turns: usize, stream: bool, window: u64) -> Vec<Option<String>> {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let mut agent = Agent::new(stream);
    let mut headers = Vec::new();
    for n in 1..=turns {
        let request = agent.turn(n);
        let (status, x, reply) = send(&proxy, shape, window, &request).await;
        assert_eq!(
            status,
            200,
            "{shape} turn {n}: {reply}\n{x:?}\nlogs:\n{}",
            proxy.logs()
        );
        // The mock answers the last user message, so the reply proves it arrived verbatim.
        assert!(
            reply.contains(&format!("Turn {n}: the test test_module_{n} fails")),
            "turn {n}: {reply}"
        );
        agent.answered(reply);
        headers.push(x);
    }
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    for seen in mock.recorded() {
        let request: Value = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(
            request["messages"][0]["content"], SYSTEM,
            "the system prompt must stay verbatim"
        );
    }
    headers
}

fn applied(headers: &[Option<String>]) -> Vec<&str> {
    headers
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|h| h.starts_with("applied"))
        .collect()
}

#[tokio::test]
async fn sixty_turn_session_openai_shape_non_streaming() {
    let headers = session("openai", 60, false, 6000).await;
    let applied = applied(&headers);
    assert!(!applied.is_empty());
    assert!(
        headers[0].is_none(),
        "the first, small turn must go through untouched"
    );
    // After the first overflow taught the proxy the window, it compacts before sending.
    assert!(
        applied.iter().any(|h| h.contains("trigger=error")),
        "{applied:?}"
    );
    assert!(
        applied
            .iter()
            .any(|h| h.contains("trigger=preflight") && h.contains("attempts=1")),
        "{applied:?}"
    );
}

#[tokio::test]
async fn sixty_turn_session_openai_shape_streaming() {
    let headers = session("openai", 60, true, 6000).await;
    assert!(!applied(&headers).is_empty());
}

#[tokio::test]
async fn sessions_in_other_providers_shapes() {
    for shape in ["vllm-old", "vllm-new", "llamacpp", "anthropic", "html413"] {
        let headers = session(shape, 20, false, 6000).await;
        assert!(
            !applied(&headers).is_empty(),
            "{shape}: nothing was compacted"
        );
    }
}

#[tokio::test]
async fn overflow_reported_in_the_first_event_of_a_200_stream() {
    let headers = session("sglang", 20, true, 6000).await;
    let applied = applied(&headers);
    assert!(
        applied.iter().any(|h| h.contains("trigger=error")),
        "{applied:?}"
    );
}

#[tokio::test]
async fn a_413_for_bytes_is_fixed_by_dropping_historical_images_first() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let image = |n: usize| {
        let data = format!("data:image/png;base64,{}", "QUJD".repeat(5_000 + n));
        json!({"type": "image_url", "image_url": {"url": data}})
    };
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for n in 0..5 {
        messages.push(json!({"role": "user", "content": [
            {"type": "text", "text": format!("Screenshot {n}: what changed?")}, image(n)]}));
        messages.push(
            json!({"role": "assistant", "content": format!("In screenshot {n} the header moved.")}),
        );
    }
    messages.push(json!({"role": "user", "content": "Turn 6: the test test_module_6 fails; summarise the screenshots."}));
    let request = json!({"model": "mock-agent-model", "messages": messages});
    // The mock's byte limit is three times the window: 45 KB, against a 100 KB request.
    let (status, x, reply) = send(&proxy, "html413", 15_000, &request).await;
    assert_eq!(status, 200, "{reply}\n{}", proxy.logs());
    assert!(x.unwrap().starts_with("applied; trigger=error;"));
    let sent = mock.last();
    assert!(sent.body.len() < 45_000);
    let sent: Value = serde_json::from_slice(&sent.body).unwrap();
    let images = sent.to_string().matches("data:image/png;base64").count();
    assert!(
        images <= 1,
        "{images} images still sent: only the most recent may stay"
    );
    assert_eq!(
        sent["messages"].as_array().unwrap().last().unwrap(),
        messages.last().unwrap()
    );
}

#[tokio::test]
async fn overflow_hidden_in_a_200_with_an_empty_length_stop() {
    let headers = session("vllm-empty-200", 12, false, 6000).await;
    assert!(!applied(&headers).is_empty());
}

#[tokio::test]
async fn output_cap_is_fixed_by_asking_for_fewer_tokens_first() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let mut agent = Agent::new(false);
    agent.max_tokens = Some(5000);
    let request = agent.turn(1);
    let (status, x, _) = send(&proxy, "vllm-old", 6000, &request).await;
    assert_eq!(status, 200);
    let x = x.expect("x-compaction");
    assert!(x.starts_with("applied; trigger=error; attempts=2;"), "{x}");
    let sent: Value = serde_json::from_slice(&mock.last().body).unwrap();
    assert!(sent["max_tokens"].as_u64().unwrap() < 5000);
    assert_eq!(
        sent["messages"], request["messages"],
        "the messages were not touched"
    );
}

#[tokio::test]
async fn a_huge_max_tokens_on_a_short_prompt_is_lowered_before_sending_not_compacted() {
    let mock = Mock::start().await;
    let config = "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = 6000\n";
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let mut agent = Agent::new(false);
    agent.max_tokens = Some(5500);
    let request = agent.turn(1);
    for turn in 0..3 {
        let (status, x, _) = send(&proxy, "vllm-old", 6000, &request).await;
        assert_eq!(status, 200);
        let x = x.expect("x-compaction");
        // The window is known: the lossless fix goes out with the first call, every time,
        // and the header says what changed (nothing but the completion cap).
        assert!(
            x.starts_with("applied; trigger=preflight; attempts=1; messages=5->5; summary=none;"),
            "turn {turn}: {x}"
        );
        let (before, after) = x.split("output=").nth(1).unwrap().split_once("->").unwrap();
        assert_eq!(before, "5500");
        assert!(after.parse::<u64>().unwrap() < 5500, "{x}");
    }
    let recorded = mock.recorded();
    assert_eq!(recorded.len(), 3, "one upstream call per request");
    let sent: Value = serde_json::from_slice(&recorded[0].body).unwrap();
    assert_eq!(sent["messages"], request["messages"], "no message touched");
    assert!(sent["max_tokens"].as_u64().unwrap() < 5500);
    let metrics = metrics(&proxy).await;
    assert!(metrics.contains("compaction_proxy_output_lowered_total{trigger=\"preflight\"} 3\n"));
    assert!(metrics.contains("compaction_proxy_compactions_total{trigger=\"preflight\"} 3\n"));
    assert!(metrics.contains("compaction_proxy_summaries_total{source=\"fallback\"} 0\n"));
}

#[tokio::test]
async fn a_request_that_cannot_fit_gets_the_upstreams_own_error() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[log]\nlevel = \"debug\"\n");
    // The latest user message alone is bigger than the window.
    let request = json!({"model": "mock-agent-model", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "word ".repeat(20_000)},
    ]});
    let (status, x, body) = send(&proxy, "openai", 1000, &request).await;
    assert_eq!(status, 400);
    let x = x.unwrap_or_else(|| panic!("no x-compaction; logs:\n{}", proxy.logs()));
    assert!(x.starts_with("failed;"), "{x}");
    assert!(
        body.contains("maximum context length is 1000 tokens"),
        "{body}"
    );
    assert!(mock.recorded().len() <= 3);
}

#[tokio::test]
async fn non_overflow_errors_pass_through_after_one_call() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    for status in [400u16, 401, 403, 404, 429, 500, 503] {
        let before = mock.recorded().len();
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .header("x-mock", "error")
            .header("x-mock-status", status.to_string())
            .json(&Agent::new(false).turn(1))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert!(response.headers().get("x-compaction").is_none());
        assert_eq!(mock.recorded().len(), before + 1, "status {status}");
    }
}

#[tokio::test]
async fn client_disconnect_during_a_retry_stops_further_upstream_calls() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[upstream]\nidle_timeout_ms = 60000\n");
    let mut agent = Agent::new(false);
    let mut request = Value::Null;
    for n in 1..=10 {
        request = agent.turn(n);
    }
    // Every call is refused after 400 ms; the client gives up at 800 ms, while the
    // proxy waits on its second attempt (sent once the first refusal is compacted, well
    // before then even on a loaded machine). A third call would start after 900 ms.
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-mock", "window")
        .header("x-mock-shape", "openai")
        .header("x-mock-window", "10")
        .header("x-mock-delay-ms", "400")
        .timeout(Duration::from_millis(800))
        .json(&request)
        .send()
        .await;
    assert!(response.is_err(), "the client was meant to give up first");
    let calls = mock.recorded().len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        mock.recorded().len(),
        calls,
        "the proxy kept calling the upstream after the client left"
    );
    assert!(
        calls < 3,
        "{calls} calls: the client should have left before the last attempt"
    );
}

/// `x-compaction: off` on a request turns compaction off for it: the upstream gets the
/// client's bytes and answers for itself, and never sees the header. Any other value is
/// only taken off.
#[tokio::test]
async fn a_request_can_turn_compaction_off_for_itself() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(
        &mock.url("/v1"),
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = 3000\n",
    );
    let mut agent = Agent::new(false);
    for n in 0..5 {
        agent.turn(n);
    }
    let request = json!({"model": "mock-agent-model", "messages": agent.messages});
    let bytes = serde_json::to_vec(&request).unwrap();
    let send = |value: &'static str| {
        client()
            .post(proxy.url("/v1/chat/completions"))
            .header("x-mock", "window")
            .header("x-mock-shape", "openai")
            .header("x-mock-window", "3000")
            .header("x-compaction", value)
            .header("content-type", "application/json")
            .body(bytes.clone())
            .send()
    };
    let response = send("off").await.unwrap();
    assert_eq!(response.status(), 400, "the upstream's own refusal");
    assert!(response.headers().get("x-compaction").is_none());
    let sent = mock.last();
    assert_eq!(sent.body, bytes);
    assert!(sent.headers.get("x-compaction").is_none());

    let response = send("on").await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["x-compaction"]
        .to_str()
        .unwrap()
        .starts_with("applied"));
    assert!(mock.last().headers.get("x-compaction").is_none());
}

/// With the window configured, the upstream's way of counting is learned from the usage
/// of its ordinary answers, before any refusal: a session that grows into a window the
/// upstream counts a third more tightly than the proxy's estimate is compacted ahead of
/// its first overflow, never after it.
#[tokio::test]
async fn the_upstreams_count_is_learned_before_its_first_refusal() {
    const WINDOW: u64 = 4096;
    let mock = Mock::start().await;
    let config = format!("[[models]]\nmatch = \"local-model\"\ncontext_window = {WINDOW}\n");
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let window = WINDOW.to_string();
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", "llamacpp"),
        ("x-mock-window", window.as_str()),
    ];
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut marks = Vec::new();
    for turn in 0..24 {
        // Plain prose: the mock's count runs well above the proxy's estimate on it.
        let ask = format!(
            "Turn {turn}: {}",
            "please keep the notes about the garden and the weather in mind. ".repeat(12)
        );
        messages.push(json!({"role": "user", "content": ask}));
        let request = json!({"model": "local-model", "max_tokens": 64, "messages": messages});
        let (status, x) = support::post_chat(&proxy, &headers, &request).await;
        assert_eq!(status, 200, "turn {turn}: {x}\n{}", proxy.logs());
        marks.push(x);
        messages.push(json!({"role": "assistant", "content": format!("Noted, turn {turn}.")}));
    }
    assert!(
        marks.iter().any(|x| x.contains("trigger=preflight")),
        "{marks:#?}"
    );
    assert!(
        marks.iter().all(|x| !x.contains("trigger=error")),
        "an overflow reached the upstream: {marks:#?}"
    );
}

/// A request that cannot fit with its first exchange kept loses that exchange to the
/// summary: the summariser is shown it, so a rule the user added right after the task and
/// the agent's first choice reach the checkpoint a model writes, not only the digest.
/// (A text agent's shape: its observations come back as user messages, the user's
/// rule among them.)
#[tokio::test]
async fn the_summariser_is_shown_the_first_exchange_a_request_cannot_keep() {
    const WINDOW: u64 = 6000;
    const RULE: &str = "Never edit config/ledger_lock_5521.yaml, the auditors pin it.";
    const CHOICE: &str = "Going ahead with polars_7730 for the totals.";
    let mock = Mock::start().await;
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[summarizer]\ncontext_window = 128000\n"
    );
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let prose = |n: usize, words: usize| {
        format!("Step {n} notes: ") + &"the totals look plausible so far ".repeat(words)
    };
    let mut messages = vec![
        json!({"role": "system", "content": "You are an agent that writes and runs Python."}),
        json!({"role": "user", "content": "Total the invoices in data/invoices.csv by month, one row per month with the \
             count of invoices and the sum of their amounts, and write the table to out/totals.md."}),
        json!({"role": "user", "content": RULE}),
        json!({"role": "assistant", "content": format!("{CHOICE} {}", prose(0, 400))}),
    ];
    for n in 1..6 {
        messages.push(json!({"role": "user", "content": format!("exitcode: 0 (execution succeeded)\nCode output: month {n} total 1{n}00.00")}));
        messages.push(json!({"role": "assistant", "content": prose(n, 60)}));
    }
    messages.push(
        json!({"role": "user", "content": format!("Now the yearly report. {}", prose(9, 120))}),
    );
    let request = json!({"model": "mock-agent-model", "messages": messages});
    let (status, x) = support::window_turn(&proxy, "Bearer k", WINDOW, "ok", 0, &request).await;
    assert_eq!(status, 200, "{x}\n{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}");
    let sent: Value = serde_json::from_slice(&mock.last().body).unwrap();
    let kept = sent["messages"].as_array().unwrap();
    assert!(
        !kept
            .iter()
            .any(|m| m["content"].as_str().is_some_and(|c| c.starts_with(CHOICE))),
        "the first exchange was kept: {x}\n{sent}"
    );
    let shown: String = mock
        .summaries()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert!(shown.contains("ledger_lock_5521"), "{shown}");
    assert!(shown.contains("polars_7730"), "{shown}");
}
