//! Agents keep working through compaction, and strict providers accept what it makes:
//! every rewritten request opens with the user and alternates, the turn in progress keeps
//! its tool results (cut to fit at worst, never replaced whole), the task survives, an
//! oversized `max_tokens` is lowered before the first call, and a body limit (413) after a
//! preflight compaction still leads to a smaller request.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use compaction_proxy::engine::{validate_strict, MARKER};
use serde_json::{json, Value};
use support::{metrics, post_chat, Mock, Proxy};

const MODEL: &str = "mock-agent-model";

fn config(window: u64) -> String {
    format!("[[models]]\nmatch = \"{MODEL}\"\ncontext_window = {window}\n")
}

/// One request through `proxy` to a mock upstream with `window` (its own tokens),
/// refusing like OpenAI; returns the status and `x-compaction`.
async fn send(proxy: &Proxy, window: u64, request: &Value) -> (u16, String) {
    let window = window.to_string();
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window.as_str()),
    ];
    post_chat(proxy, &headers, request).await
}

fn listing(word: &str) -> String {
    (1..=240)
        .map(|i| format!("{word} {i} of a long listing, padded with some words\n"))
        .collect()
}

fn call(id: &str, command: &str) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
        "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}}]})
}

fn result(id: &str, output: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": output})
}

fn last_sent(mock: &Mock) -> Value {
    serde_json::from_slice(&mock.last().body).unwrap()
}

/// The reproduction of the agents' loops: a turn with two large tool results, the
/// newest of which fits. It reaches the model whole; the older one becomes a pointer to
/// it; no empty summary is invented.
#[tokio::test]
async fn the_newest_result_of_the_turn_reaches_the_model_whole() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), &config(7000));
    let out = listing("output line");
    let request = json!({"model": MODEL, "messages": [
        {"role": "user", "content": "please use the tool 2 times"},
        call("call_1", "seq 1 240"), result("call_1", &out),
        call("call_2", "seq 1 240"), result("call_2", &out),
    ]});
    let (status, x) = send(&proxy, 9000, &request).await;
    assert_eq!(status, 200, "{x}");
    assert!(
        x.starts_with("applied; trigger=preflight; attempts=1;"),
        "{x}"
    );
    assert!(x.contains("summary=none"), "{x}");
    let sent = last_sent(&mock);
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    assert_eq!(messages[4]["content"], out, "the newest result is whole");
    assert!(messages[2]["content"]
        .as_str()
        .unwrap()
        .starts_with("[duplicate output of bash command=seq 1 240: identical to a later result"));
    assert!(!sent.to_string().contains(MARKER), "no summary of nothing");
    let metrics = metrics(&proxy).await;
    assert!(metrics.contains("compaction_proxy_summaries_total{source=\"fallback\"} 0\n"));
}

/// An agent's large system prompt and tools leave little room: the turn's only result is
/// kept whole by giving the answer less room (the request's `max_tokens` lowered to what
/// fits), never replaced by a placeholder.
#[tokio::test]
async fn a_big_system_prompt_takes_room_from_the_answer_not_from_the_turn() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), &config(16_000));
    let out = listing("output line");
    let request = json!({"model": MODEL, "max_tokens": 65_536, "messages": [
        {"role": "system", "content": "Rules: be careful. ".repeat(1800)},
        {"role": "user", "content": "please use the tool"},
        call("call_1", "seq 1 240"), result("call_1", &out),
    ]});
    let (status, x) = send(&proxy, 40_000, &request).await;
    assert_eq!(status, 200, "{x}");
    assert!(x.contains("output=65536->"), "{x}");
    let sent = last_sent(&mock);
    assert_eq!(sent["messages"], request["messages"], "{x}");
    let cap = sent["max_tokens"].as_u64().unwrap();
    assert!((256..16_000).contains(&cap), "{cap}");
}

/// When even the turn's own result cannot fit, it is cut to what fits, its beginning and
/// end kept and the cut said, rather than replaced by a one-line placeholder.
#[tokio::test]
async fn a_result_too_big_for_the_window_is_cut_to_fit_keeping_its_ends() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), &config(3000));
    let out = listing("output line");
    let request = json!({"model": MODEL, "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "list the files"},
        call("call_1", "ls -R"), result("call_1", &out),
    ]});
    let (status, x) = send(&proxy, 6000, &request).await;
    assert_eq!(status, 200, "{x}");
    let sent = last_sent(&mock);
    let kept = sent["messages"][3]["content"].as_str().unwrap();
    assert!(kept.starts_with("output line 1 of"), "{kept}");
    assert!(kept.ends_with("output line 240 of a long listing, padded with some words\n"));
    assert!(kept.contains("characters omitted by compaction"), "{kept}");
}

/// A long agent session against a strict upstream (user first, turns alternating, tool
/// calls paired): every request it receives passes the strict validator, the task is
/// there verbatim every time, and each turn's own results reach it whole. Also without a
/// system prompt, and with a context message appended after the results, as OpenClaw does.
#[tokio::test]
async fn strict_templates_accept_every_compacted_request_of_a_long_session() {
    for (system, injected) in [(true, false), (false, false), (true, true)] {
        let mock = Mock::start().await;
        let proxy = Proxy::start(&mock.url("/v1"), &config(5000));
        let task = "Fix the flaky test in tests/net.rs; never modify config/prod.yaml.";
        let mut history = Vec::new();
        if system {
            history.push(json!({"role": "system", "content": "You are a coding agent."}));
        }
        for n in 0..14 {
            let prompt = if n == 0 {
                task.to_string()
            } else {
                format!("turn {n}: keep going")
            };
            history.push(json!({"role": "user", "content": prompt}));
            let id = format!("call_{n}");
            history.push(call(&id, &format!("cargo test --test net_{n}")));
            let out = format!(
                "test net_{n} ... FAILED\n{}",
                "   Compiling app v0.1.0\n".repeat(60)
            );
            history.push(result(&id, &out));
            let mut request = json!({"model": MODEL, "messages": history});
            if injected {
                request["messages"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"role": "user", "content": "<<<context: no active sessions>>>"}));
            }
            let (status, x) = send(&proxy, 7000, &request).await;
            assert_eq!(status, 200, "turn {n}: {x}");
            let sent = last_sent(&mock);
            let messages = sent["messages"].as_array().unwrap();
            validate_strict(messages).unwrap_or_else(|e| panic!("turn {n} ({x}): {e}"));
            let text = sent.to_string();
            assert!(text.contains(task), "turn {n}: the task is gone ({x})");
            assert!(
                messages.iter().any(|m| m["content"] == out),
                "turn {n}: the turn's own result is gone ({x})"
            );
            history.push(json!({"role": "assistant", "content": format!("done with turn {n}")}));
        }
        assert!(mock.state.violations.lock().unwrap().is_empty());
        let compacted = metrics(&proxy).await;
        assert!(
            !compacted.contains("compaction_proxy_compactions_total{trigger=\"preflight\"} 0\n"),
            "the session never needed compacting"
        );
    }
}

/// A body limit in front of a known model: the request compacted before the first call
/// is still too many bytes, and the 413 shrinks it further within the attempts allowed.
#[tokio::test]
async fn a_413_after_a_preflight_compaction_shrinks_the_request_further() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), &config(8000));
    let mut messages = vec![json!({"role": "system", "content": "You are an agent."})];
    for n in 0..30 {
        messages.push(
            json!({"role": "user", "content": format!("step {n}: {}", "details ".repeat(80))}),
        );
        messages.push(
            json!({"role": "assistant", "content": format!("done {n}: {}", "notes ".repeat(80))}),
        );
    }
    messages.push(json!({"role": "user", "content": "finish"}));
    let request = json!({"model": MODEL, "messages": messages});
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", "html413"),
        // The nginx in front takes at most three bytes per token of this: 11.7 KB, under
        // what the preflight compaction sends (12 KB let it through once a short summary's
        // frame took 110 bytes less).
        ("x-mock-window", "3900"),
    ];
    let (status, x) = post_chat(&proxy, &headers, &request).await;
    assert_eq!(status, 200, "{x}");
    assert!(x.starts_with("applied; trigger=preflight;"), "{x}");
    let attempts: u32 = x.split("attempts=").nth(1).unwrap()[..1].parse().unwrap();
    assert!((2..=3).contains(&attempts), "{x}");
    assert!(mock.last().body.len() <= 11_700);
}

/// A system message with no content is the client's, passed on as it is: it does not stop
/// the rest from being compacted.
#[tokio::test]
async fn a_system_message_without_content_does_not_stop_compaction() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), &config(3000));
    let mut messages = vec![json!({"role": "system", "content": null})];
    for n in 0..20 {
        messages.push(
            json!({"role": "user", "content": format!("question {n}: {}", "why ".repeat(60))}),
        );
        messages.push(json!({"role": "assistant", "content": format!("answer {n}: {}", "because ".repeat(60))}));
    }
    messages.push(json!({"role": "user", "content": "and now?"}));
    let request = json!({"model": MODEL, "messages": messages});
    let (status, x) = send(&proxy, 100_000, &request).await;
    assert_eq!(status, 200);
    assert!(x.starts_with("applied; trigger=preflight;"), "{x}");
    let sent = last_sent(&mock);
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": null})
    );
    assert!(sent["messages"].as_array().unwrap().len() < messages.len());
}

/// Compaction uses the room it has: a long chat compacted before the first call keeps
/// well over half of its target instead of falling to a small summary and the last turn.
#[tokio::test]
async fn a_compaction_fills_its_target_rather_than_falling_far_below_it() {
    let mock = Mock::start().await;
    let window = 8000;
    let proxy = Proxy::start(&mock.url("/v1"), &config(window));
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for n in 0..40 {
        messages.push(
            json!({"role": "user", "content": format!("question {n}: {}", "why ".repeat(40))}),
        );
        // One long answer in the middle of the session, as a pasted file would be.
        let len = if n == 30 { 1500 } else { 60 };
        messages.push(json!({"role": "assistant", "content": format!("answer {n}: {}", "because ".repeat(len))}));
    }
    messages.push(json!({"role": "user", "content": "and now?"}));
    let request = json!({"model": MODEL, "messages": messages});
    let (status, x) = send(&proxy, 100_000, &request).await;
    assert_eq!(status, 200);
    assert!(x.starts_with("applied; trigger=preflight;"), "{x}");
    let after: u64 = x
        .split("tokens=")
        .nth(1)
        .unwrap()
        .split("->")
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    // The target: the low-water mark (60% of the window) less the answer's reserve (a
    // quarter of the window here).
    let target = window * 6 / 10 - window / 4;
    assert!(
        after >= target / 2 && after <= target,
        "{after} of {target}: {x}"
    );
}
