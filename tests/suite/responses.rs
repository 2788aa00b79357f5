//! Clients of the Responses API (`POST /v1/responses`: Codex, the Agents SDK, the AI SDK's
//! `openai()`) survive sessions longer than their model's window, as chat clients do: the
//! proxy compacts the `input` items on the same path, writes back the client's own items
//! (reasoning with the call it preceded, unknown item types whole), leaves `instructions`
//! alone, summarises in the client's dialect, and passes server-side conversations
//! (`previous_response_id`) through untouched.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use compaction_proxy::dialect::responses::validate;
use compaction_proxy::engine::MARKER;
use serde_json::{json, Value};
use support::{metrics, post_json, Mock, Proxy, CANNED_SUMMARY};

const MODEL: &str = "mock-agent-model";
const INSTRUCTIONS: &str = "You are a coding agent. Use the tools; keep answers short.";

fn proxy(mock: &Mock, window: Option<u64>) -> Proxy {
    let config = window.map_or(String::new(), |w| {
        format!("[[models]]\nmatch = \"{MODEL}\"\ncontext_window = {w}\n")
    });
    Proxy::start(&mock.url("/v1"), &config)
}

/// One turn of an agent as the Responses API has it: the user asks, the model reasons,
/// calls a tool and a hosted web search, the output comes back, the model answers.
fn turn(n: usize) -> Vec<Value> {
    let id = format!("call_{n}");
    let log = format!(
        "running test_{n}\nerror[E0382]: borrow of moved value\n{}test result: FAILED\n",
        "   Compiling app v0.1.0 (/srv/app)\n".repeat(40)
    );
    vec![
        json!({"role": "user", "content": format!("turn {n}: fix test_{n}")}),
        json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": [], "encrypted_content": "gAAAA".repeat(20)}),
        json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": id, "name": "shell",
            "arguments": json!({"command": format!("cargo test test_{n}")}).to_string()}),
        json!({"type": "function_call_output", "call_id": id, "output": log}),
        json!({"type": "web_search_call", "id": format!("ws_{n}"), "status": "completed",
            "action": {"type": "search", "query": format!("E0382 test_{n}")}}),
        json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
            "content": [{"type": "output_text", "text": format!("Fixed test_{n}."), "annotations": []}]}),
    ]
}

fn request(input: &[Value], stream: bool) -> Value {
    json!({"model": MODEL, "instructions": INSTRUCTIONS, "input": input, "stream": stream,
        "store": false, "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]})
}

/// Sends one request; returns the status, `x-compaction` and the text the client read.
async fn send(proxy: &Proxy, shape: &str, window: u64, body: &Value) -> (u16, String, String) {
    let window = window.to_string();
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", shape),
        ("x-mock-window", window.as_str()),
    ];
    post_json(proxy, "/v1/responses", &headers, body).await
}

fn sent(mock: &Mock) -> Value {
    serde_json::from_slice(&mock.last().body).unwrap()
}

#[tokio::test]
async fn a_long_responses_session_never_dies_of_its_length() {
    for stream in [false, true] {
        let mock = Mock::start().await;
        let proxy = proxy(&mock, Some(3000));
        let mut input = Vec::new();
        for n in 0..30 {
            let mut items = turn(n);
            let answer = items.pop().unwrap();
            input.extend(items);
            let (status, x, text) = send(&proxy, "responses", 9000, &request(&input, stream)).await;
            assert_eq!(status, 200, "turn {n}: {x}\n{text}");
            assert!(text.contains("MOCK-RESPONSE"), "turn {n}: {text}");
            let got = sent(&mock);
            let items = got["input"].as_array().unwrap();
            validate(items).unwrap_or_else(|e| panic!("turn {n}: {e}"));
            assert_eq!(got["instructions"], INSTRUCTIONS);
            // The turn in progress reaches the model whole: its call and its output.
            let last = &input[input.len() - 3..];
            for item in last {
                assert!(items.contains(item), "turn {n}: {item} lost ({x})");
            }
            // Every reasoning item kept still goes with the call after it.
            for (i, item) in items.iter().enumerate() {
                if item["type"] == "reasoning" {
                    assert_eq!(items[i + 1]["type"], "function_call", "turn {n}");
                }
            }
            input.push(answer);
        }
        assert!(mock.state.violations.lock().unwrap().is_empty());
        let got = sent(&mock);
        assert!(
            got.to_string().contains(MARKER),
            "the session was never compacted"
        );
        assert!(
            got.to_string().contains("web_search_call"),
            "hosted calls kept whole"
        );
        let metrics = metrics(&proxy).await;
        assert!(
            !metrics.contains("compaction_proxy_compactions_by_api_total{api=\"responses\"} 0\n"),
            "{metrics}"
        );
    }
}

#[tokio::test]
async fn the_summary_is_asked_for_in_the_responses_dialect() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, Some(3000));
    let mut input = Vec::new();
    for n in 0..30 {
        input.extend(turn(n));
    }
    input.push(json!({"role": "user", "content": "and now the last one"}));
    let (status, x, _) = send(&proxy, "responses", 9000, &request(&input, false)).await;
    assert_eq!(status, 200, "{x}");
    assert!(x.contains("summary=llm"), "{x}");
    let call: Value = serde_json::from_slice(&mock.summaries()[0].body).unwrap();
    assert_eq!(call["stream"], true);
    assert!(
        call["input"].is_array() && call["instructions"].is_string(),
        "{call}"
    );
    let got = sent(&mock);
    assert!(CANNED_SUMMARY.contains("MOCK-CHECKPOINT"));
    assert!(got.to_string().contains("MOCK-CHECKPOINT"));
    assert_eq!(
        got["input"].as_array().unwrap().last().unwrap(),
        input.last().unwrap()
    );
}

#[tokio::test]
async fn an_overflow_reported_in_the_stream_is_retried_before_the_client_sees_a_byte() {
    let mock = Mock::start().await;
    // No window known: only the upstream's own failure can tell.
    let proxy = proxy(&mock, None);
    let mut input = Vec::new();
    for n in 0..14 {
        input.extend(turn(n));
    }
    input.push(json!({"role": "user", "content": "and now the last one"}));
    let (status, x, text) = send(&proxy, "responses-stream", 9000, &request(&input, true)).await;
    assert_eq!(status, 200);
    assert!(x.starts_with("applied; trigger=error;"), "{x}");
    assert!(!text.contains("response.failed"), "{text}");
    assert!(text.contains("response.completed"), "{text}");
}

#[tokio::test]
async fn a_conversation_the_upstream_holds_passes_untouched() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, Some(6000));
    let mut input = Vec::new();
    for n in 0..14 {
        input.extend(turn(n));
    }
    let mut body = request(&input, false);
    body["previous_response_id"] = json!("resp_earlier");
    let (status, x, text) = send(&proxy, "responses", 9000, &body).await;
    assert_eq!(status, 400, "the upstream's own answer");
    assert!(text.contains("exceeds the context window"), "{text}");
    assert_eq!(x, "", "no compaction was tried");
    assert_eq!(sent(&mock), body);
}

/// An upstream that counts more than the proxy and says no numbers: when the excess was
/// the requested completion, the proxy learns a window below prompt and completion
/// together (not below the prompt alone), and asks for fewer completion tokens rather
/// than failing.
#[tokio::test]
async fn an_overflow_without_numbers_lowers_the_completion_cap_and_succeeds() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, Some(6000));
    let input = vec![
        json!({"role": "user", "content": "Summarise these notes: ".to_string() + &"notes about the build ".repeat(450)}),
    ];
    let mut body = request(&input, false);
    body["max_output_tokens"] = json!(5000);
    for round in 0..3 {
        let (status, x, text) = send(&proxy, "responses", 6000, &body).await;
        assert_eq!(status, 200, "round {round}: {x}\n{text}");
        assert!(x.contains("output=5000->"), "round {round}: {x}");
        let got = sent(&mock);
        assert_eq!(got["input"], body["input"], "the conversation is untouched");
    }
}

/// Pi's shape on the Responses API (issue 28): the window is unknown, every request asks
/// for 16,384 output tokens, the window is 7,583 and the refusal names no numbers. The
/// answer's room goes down before the conversation does (with three calls, to its floor at
/// once), and every turn of a growing session is answered within the attempt budget, its
/// conversation sent whole while it fits.
#[tokio::test]
async fn a_cap_refused_without_numbers_goes_down_until_the_answer_fits() {
    const WINDOW: u64 = 7_583;
    let mock = Mock::start().await;
    let proxy = proxy(&mock, None);
    let mut input = vec![
        json!({"role": "user", "content": "Review these notes: ".to_string() + &"notes about the build ".repeat(480)}),
    ];
    for n in 0..4 {
        let mut body = request(&input, false);
        body["max_output_tokens"] = json!(16_384);
        let (status, x, text) = send(&proxy, "responses", WINDOW, &body).await;
        assert_eq!(status, 200, "turn {n}: {x}\n{text}");
        assert!(x.contains("output=16384->"), "turn {n}: {x}");
        if n == 0 {
            assert!(x.contains("attempts=2"), "turn {n}: {x}");
            assert!(x.contains("output=16384->1024"), "turn {n}: {x}");
            assert_eq!(
                sent(&mock)["input"],
                body["input"],
                "the conversation is whole"
            );
        }
        input.push(
            json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
            "content": [{"type": "output_text", "text": "Noted.", "annotations": []}]}),
        );
        input.push(json!({"role": "user", "content": format!("And point {n}?")}));
    }
}

/// The same refusal without numbers when the conversation, not the cap, is what does not
/// fit, and the window is unknown: the cap goes to its floor, then the last call the
/// budget allows sends the conversation compacted as far as it goes, and it is answered
/// within the three calls.
#[tokio::test]
async fn a_conversation_refused_without_numbers_is_answered_within_the_budget() {
    const WINDOW: u64 = 5_000;
    let mock = Mock::start().await;
    let proxy = proxy(&mock, None);
    let mut input: Vec<Value> = (0..16).flat_map(turn).collect();
    input.push(json!({"role": "user", "content": "Now fix the last one."}));
    let mut body = request(&input, false);
    body["max_output_tokens"] = json!(16_384);
    let (status, x, text) = send(&proxy, "responses", WINDOW, &body).await;
    assert_eq!(status, 200, "{x}\n{text}");
    assert!(x.contains("attempts=3"), "{x}");
    assert!(x.contains("output=16384->"), "{x}");
    let got = sent(&mock);
    assert!(validate(got["input"].as_array().unwrap()).is_ok(), "{got}");
    assert!(support::mock_tokens(&got) + 1_024 <= WINDOW, "{x}");
}
