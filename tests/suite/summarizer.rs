//! The LLM summariser in the compaction path: a long session against a small window gets
//! an LLM-written checkpoint (`summary=llm`); any summariser failure still gives the client
//! its answer with the deterministic summary (`summary=fallback`); secrets never reach the
//! summariser; long middles are summarised in chunks; a call refused as too long is asked
//! again smaller; a failure cools the summariser down.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

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
    falls_back_logging(behaviour, "summariser failed").await;
}

/// The proxy, and how many summariser calls it made.
async fn falls_back_logging(behaviour: &str, logged: &str) -> (Proxy, usize) {
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
    // Every call failed: one, or two chunks' answers rejected in a row.
    let calls = mock.summaries().len();
    let line = format!("compaction_proxy_summarizer_calls_total{{outcome=\"error\"}} {calls}\n");
    assert!(metrics.contains(&line), "{behaviour}: {metrics}");
    assert!(proxy.logged(logged), "{behaviour}");
    (proxy, calls)
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

/// An answer the checks reject falls back, and each rejection is counted by its reason.
async fn is_rejected(behaviour: &str, reason: &str) {
    let (proxy, calls) = falls_back_logging(behaviour, "summariser answer rejected").await;
    assert!(
        proxy.logged(&format!("reason=\"{reason}\"")) || proxy.logged(&format!("reason={reason}")),
        "{}",
        proxy.logs()
    );
    let metrics = metrics(&proxy).await;
    let line =
        format!("compaction_proxy_summarizer_rejected_total{{reason=\"{reason}\"}} {calls}\n");
    assert!(metrics.contains(&line), "{behaviour}: {metrics}");
}

#[tokio::test]
async fn an_empty_summary_is_rejected() {
    is_rejected("empty", "empty").await;
}

#[tokio::test]
async fn a_refusal_is_rejected() {
    is_rejected("refusal", "refusal").await;
}

#[tokio::test]
async fn a_one_word_answer_is_rejected() {
    is_rejected("junk", "structure").await;
}

#[tokio::test]
async fn an_answer_cut_by_its_cap_is_rejected() {
    is_rejected("truncated", "truncated").await;
}

#[tokio::test]
async fn an_answer_repeating_the_focus_is_rejected() {
    is_rejected("echo", "echo").await;
}

#[tokio::test]
async fn a_paragraph_without_the_checkpoints_headings_is_rejected() {
    is_rejected("unstructured", "structure").await;
}

#[tokio::test]
async fn a_model_that_keeps_writing_junk_is_asked_twice_then_falls_back() {
    let mock = Mock::start().await;
    // A summariser window that needs several chunks for this middle.
    let proxy = proxy(&mock, "context_window = 3000");
    let (status, x) = send(&proxy, "junk", &session(40)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=fallback"), "{x}");
    // Two rejections in a row end the calls; no chunk accepted is the digest's turn.
    assert_eq!(mock.summaries().len(), 2);
}

#[tokio::test]
async fn a_rejected_chunk_falls_back_for_that_chunk_only() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "context_window = 3000");
    // The chunk holding turn 20 gets junk; every other call is answered.
    let (status, x) = send(&proxy, "junk-if:test_module_20 fails", &session(40)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}\n{}", proxy.logs());
    let calls = bodies(&mock.summaries());
    let user = |call: &Value| call["messages"][1]["content"].as_str().unwrap().to_owned();
    let junk = calls
        .iter()
        .position(|c| user(c).contains("test_module_20 fails"))
        .expect("a call held turn 20");
    assert!(junk > 0, "the first chunk must be answered");
    assert!(junk + 1 < calls.len(), "a chunk after the rejected one");
    // The next call updates the checkpoint of the chunks before, with the rejected
    // chunk's digest beside it: turn 20's error and file are not lost, the junk never
    // carried.
    let next = user(&calls[junk + 1]);
    let previous = next.split("</previous-checkpoint>").next().unwrap();
    assert!(previous.contains("MOCK-CHECKPOINT"), "{previous}");
    assert!(previous.contains("src/module_20.rs"), "{previous}");
    assert!(previous.contains("borrow of moved value"), "{previous}");
    // And the summary the upstream gets holds them.
    let sent = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(sent.contains("MOCK-CHECKPOINT"), "{sent}");
    assert!(sent.contains("src/module_20.rs"), "{sent}");
    let metrics = metrics(&proxy).await;
    let line = "compaction_proxy_summarizer_rejected_total{reason=\"structure\"} 1\n";
    assert!(metrics.contains(line), "{metrics}");
}

#[tokio::test]
async fn an_update_that_drops_a_section_is_rejected_and_the_facts_of_checkpoint_n_reach_n_plus_1() {
    let mock = Mock::start().await;
    // Chunks: the second call is an update of the first one's checkpoint, and the mock's
    // update leaves out its Relevant Files.
    let proxy = proxy(&mock, "context_window = 3000");
    let (status, x) = send(&proxy, "drop-section", &session(40)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}");
    let summaries = mock.summaries();
    assert_eq!(
        summaries.len(),
        3,
        "the first chunk, then two updates rejected in a row"
    );
    let metrics = metrics(&proxy).await;
    let line = "compaction_proxy_summarizer_rejected_total{reason=\"dropped-facts\"} 2\n";
    assert!(metrics.contains(line), "{metrics}");
    // The first checkpoint reaches the upstream whole, its Relevant Files included, with
    // the digest of the chunks whose updates were rejected beside it.
    let sent = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(sent.contains("MOCK-CHECKPOINT"), "{sent}");
    assert!(
        sent.contains("src/module_0.rs and the modules after it"),
        "{sent}"
    );
    // Its heading in any form: a small digest is written with the short ones, a digest of
    // a few lines with the tight ones (a line of its own, in the JSON body).
    assert!(
        sent.contains("## Errors") || sent.contains("\\nErrors:\\n"),
        "{sent}"
    );
}

/// A proxy told that `model`'s window is `window` tokens.
fn small_window_proxy(mock: &Mock, model: &str, window: u64) -> Proxy {
    let config = format!("[[models]]\nmatch = \"{model}\"\ncontext_window = {window}\n");
    Proxy::start(&mock.url("/v1"), &config)
}

/// The mock as llama.cpp with a window of `window` tokens, for the client's requests and
/// the summariser's alike; it counts its own way and reports its count.
fn llamacpp_window(window: &str) -> [(&str, &str); 4] {
    [
        ("x-mock", "window"),
        ("x-mock-shape", "llamacpp"),
        ("x-mock-window", window),
        ("x-mock-summary-window", window),
    ]
}

#[tokio::test]
async fn summariser_requests_fit_a_small_window_the_upstream_counts_its_own_way() {
    let mock = Mock::start().await;
    // The mock counts about a third more tokens than the proxy's estimate.
    const SMALL: u64 = 2048;
    let proxy = small_window_proxy(&mock, "mock-agent-model", SMALL);
    let window = SMALL.to_string();
    let headers = llamacpp_window(&window);
    let turn = |n: usize| {
        let facts: String = (0..8)
            .map(|i| format!("In part {i} of turn {n} the team agreed that the staging environment should keep running until the review has finished. "))
            .collect();
        [
            json!({"role": "user", "content": format!("Turn {n}. {facts}")}),
            json!({"role": "assistant", "content": format!("Noted the facts of turn {n}.")}),
        ]
    };
    let request = |turns: usize| {
        let mut messages =
            vec![json!({"role": "system", "content": "You are a concise assistant."})];
        messages.extend((0..turns).flat_map(turn));
        messages.push(json!({"role": "user", "content": "Where are we?"}));
        json!({"model": "mock-agent-model", "max_tokens": 48, "messages": messages})
    };
    // Ordinary answers under the threshold teach the proxy the upstream's count...
    for _ in 0..3 {
        let (status, x) = post_chat(&proxy, &headers, &request(3)).await;
        assert_eq!((status, x.as_str()), (200, ""), "{}", proxy.logs());
    }
    // ...so that the chunks of a long middle fill the window by the upstream's count,
    // not by ours.
    let (status, x) = post_chat(&proxy, &headers, &request(12)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}\n{}", proxy.logs());
    let calls = bodies(&mock.summaries());
    assert!(calls.len() >= 2, "{} calls", calls.len());
    for call in &calls {
        let asked = support::mock_tokens(call) + call["max_tokens"].as_u64().unwrap_or(0);
        assert!(asked <= SMALL, "a summariser request of {asked} tokens");
        // Filled: the room was used, not left to a blind margin.
        assert!(asked > SMALL / 2, "a summariser request of {asked} tokens");
    }
    let metrics = metrics(&proxy).await;
    assert!(
        metrics.contains("compaction_proxy_summarizer_calls_total{outcome=\"error\"} 0\n"),
        "{metrics}"
    );
}

/// A reasoning model's summariser request asks room for its thinking on top of the
/// answer's cap; an upstream that counts the cap against the window refuses a prompt and
/// cap that exceed it, so the thinking gets what the window leaves, not a fixed amount.
#[tokio::test]
async fn a_reasoning_models_summariser_request_fits_its_window_with_its_thinking() {
    let mock = Mock::start().await;
    const SMALL: u64 = 10_000;
    let proxy = small_window_proxy(&mock, "gpt-5-mini", SMALL);
    let window = SMALL.to_string();
    let headers = llamacpp_window(&window);
    // Prose, which pruning does not shorten: only a summary makes it fit.
    let mut messages = vec![json!({"role": "system", "content": "You are a careful reviewer."})];
    for n in 0..50 {
        let notes: String = (0..10)
            .map(|i| format!("Point {i} of chapter {n}: the reviewers agreed the argument needs one more example before the summary. "))
            .collect();
        messages.push(json!({"role": "user", "content": format!("Chapter {n}. {notes}")}));
        messages.push(json!({"role": "assistant", "content": format!("Chapter {n} noted.")}));
    }
    messages.push(json!({"role": "user", "content": "Which chapters still need work?"}));
    // Short requests first teach the proxy how the upstream counts.
    let short = json!({"model": "gpt-5-mini", "messages": messages[..21].to_vec()});
    for _ in 0..3 {
        let (status, x) = post_chat(&proxy, &headers, &short).await;
        assert_eq!((status, x.as_str()), (200, ""), "{}", proxy.logs());
    }
    let request = json!({"model": "gpt-5-mini", "messages": messages});
    let (status, x) = post_chat(&proxy, &headers, &request).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    let calls = bodies(&mock.summaries());
    assert!(x.contains("summary=llm"), "{x}\n{}", proxy.logs());
    assert!(!calls.is_empty());
    for call in &calls {
        let cap = call["max_completion_tokens"]
            .as_u64()
            .expect("a reasoning model's cap");
        let asked = support::mock_tokens(call) + cap;
        assert!(asked <= SMALL, "a summariser request of {asked} tokens");
    }
}

/// Our count of a summariser request is an estimate, and before the upstream has refused
/// anything the proxy may have nothing better: an upstream that counts otherwise (here as
/// the shared client harness's does, characters of the JSON over 3.5) can still refuse
/// the first call as too long. Its refusal says by how much, so the proxy asks again, in
/// smaller chunks, within the same compaction: the client gets the LLM's checkpoint, not
/// the digest, and no call after the refusal exceeds the window.
#[tokio::test]
async fn a_summariser_request_refused_as_too_long_is_asked_again_smaller() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "");
    let window = WINDOW.to_string();
    let headers = summariser_refused(&window, &window, ("x-mock-summary-count", "json"));
    // Prose, which pruning does not shorten and of which the upstream counts about half as
    // many tokens again as we do, in short replies that fill a call's room closely.
    let mut messages = vec![json!({"role": "system", "content": "You are a careful reviewer."})];
    for n in 0..40 {
        let notes = format!("In chapter {n} the reviewers agreed that the argument needs one more example before the conclusion, and the editor asked for shorter sentences throughout. ").repeat(10);
        messages.extend([
            json!({"role": "user", "content": format!("Review chapter {n}.")}),
            json!({"role": "assistant", "content": format!("Chapter {n}:\n{notes}")}),
        ]);
    }
    messages.push(json!({"role": "user", "content": "Which chapters still need work?"}));
    let request = json!({"model": "mock-agent-model", "messages": messages});

    let (status, x) = post_chat(&proxy, &headers, &request).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}\n{}", proxy.logs());
    let sent = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(sent.contains("MOCK-CHECKPOINT"), "{sent}");
    // Each summariser call as the upstream counted it, with its answer's cap.
    let asked: Vec<u64> = bodies(&mock.summaries())
        .iter()
        .map(|call| support::json_tokens(call) + call["max_tokens"].as_u64().unwrap_or(0))
        .collect();
    // One call, sized by our count alone, was refused; the calls after it all fit.
    let refused = asked.iter().position(|&a| a > WINDOW);
    let refused = refused.unwrap_or_else(|| panic!("none refused: {asked:?}"));
    assert!(asked.len() > refused + 1, "{asked:?}");
    assert!(
        asked[refused + 1..].iter().all(|&a| a <= WINDOW),
        "{asked:?}"
    );
    assert!(proxy.logged("refused as too long; asking again in smaller chunks"));
    let metrics = metrics(&proxy).await;
    assert!(
        metrics.contains("compaction_proxy_summarizer_calls_total{outcome=\"error\"} 1\n"),
        "{metrics}"
    );
}

/// Headers for an upstream of [`WINDOW`] tokens for the client's requests that refuses a
/// summariser call over `holds` (its tokens with its cap), as `how` says (its count or
/// its refusal's shape).
fn summariser_refused<'a>(
    window: &'a str,
    holds: &'a str,
    how: (&'a str, &'a str),
) -> [(&'a str, &'a str); 6] {
    [
        ("authorization", "Bearer client-key"),
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window),
        ("x-mock-summary-window", holds),
        how,
    ]
}

/// The upstream holds less than the window the proxy was told (by less than a call's
/// answer cap: a prompt sized to the window fits alone, not with its cap), and refuses a
/// summariser call past that in `shape` ([`support`]'s refusal shapes).
const HOLDS: u64 = WINDOW - 1500;

/// A session of `turns` sent through `proxy` to an upstream that holds [`HOLDS`] for the
/// summariser and refuses it in `shape`; each summariser call the mock saw, as (prompt
/// tokens, answer cap) by its count.
async fn summarised_in_less_room(
    mock: &Mock,
    proxy: &Proxy,
    shape: &str,
    turns: usize,
) -> Vec<(u64, u64)> {
    let window = WINDOW.to_string();
    let holds = HOLDS.to_string();
    let headers = summariser_refused(&window, &holds, ("x-mock-summary-shape", shape));
    let (status, x) = post_chat(proxy, &headers, &session(turns)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}\n{}", proxy.logs());
    bodies(&mock.summaries())
        .iter()
        .map(|call| {
            let cap = call["max_tokens"].as_u64().unwrap_or(0);
            (support::mock_tokens(call), cap)
        })
        .collect()
}

/// OpenAI refuses a request that sets a completion cap by prompt and cap together ("you
/// requested 6289 tokens (5559 in the messages, 730 in the completion)"), which reads as
/// an output cap when the prompt alone fits. The summariser's calls always set one: such a
/// refusal of its call says the window holds less than the call was sized for, and the
/// call is asked again smaller, as for an overflow, rather than the event falling back
/// to the digest and the model being left alone for its cooldown.
#[tokio::test]
async fn a_summariser_call_refused_for_its_prompt_and_cap_together_is_asked_again_smaller() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "");
    let asked = summarised_in_less_room(&mock, &proxy, "openai-capped", 40).await;
    let holds = HOLDS;
    let refused = asked.iter().position(|&(p, c)| p + c > holds);
    let refused = refused.unwrap_or_else(|| panic!("none refused: {asked:?}"));
    assert!(
        asked[refused].0 <= holds,
        "the prompt alone was over: {asked:?}"
    );
    assert!(
        asked[refused + 1..].iter().all(|&(p, c)| p + c <= holds),
        "{asked:?}"
    );
    assert!(proxy.logged("refused as too long; asking again in smaller chunks"));
}

/// A refusal that names no number (OpenAI's Responses API) says only that the call was
/// too long: asked again at 80% within the event, and, since its prompt was sized to fit
/// beside its cap, the upstream counted more of it than that: the next event's first call
/// is sized by that bound and not refused again.
#[tokio::test]
async fn a_summariser_refusal_without_numbers_is_not_met_again_at_the_next_event() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "");
    let asked = |calls: &[(u64, u64)]| -> Vec<u64> { calls.iter().map(|&(p, c)| p + c).collect() };
    let first = asked(&summarised_in_less_room(&mock, &proxy, "blind", 40).await);
    assert!(first[0] > HOLDS, "the first call fitted: {first:?}");
    assert!(proxy.logged("refused as too long; asking again in smaller chunks"));
    // Another conversation, another event: its calls fit from the first.
    let all = asked(&summarised_in_less_room(&mock, &proxy, "blind", 50).await);
    let second = &all[first.len()..];
    assert!(!second.is_empty(), "{all:?}");
    assert!(
        second.iter().all(|&a| a <= HOLDS),
        "{first:?} then {second:?}"
    );
}

#[tokio::test]
async fn the_clients_focus_steers_the_summary_and_never_reaches_the_upstream() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "context_window = 128000");
    let window = WINDOW.to_string();
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window.as_str()),
        ("x-compaction-focus", "the borrow errors in src/module_3.rs"),
    ];
    let (status, x) = post_chat(&proxy, &headers, &session(30)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}");
    let calls = mock.summaries();
    let user = bodies(&calls)[0]["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        user.contains("Focus of this checkpoint: \"the borrow errors in src/module_3.rs\""),
        "{user}"
    );
    for recorded in calls.iter().chain(&mock.recorded()) {
        assert!(!recorded.headers.contains_key("x-compaction-focus"));
    }
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

/// Sends `request` to the mock's window scenario in OpenAI's shape ([`WINDOW`]), whose
/// summariser refuses as too long every call over `refused_at` of its tokens, naming that
/// window.
async fn post_refused_over(proxy: &Proxy, refused_at: u64, request: &Value) -> (u16, String) {
    let (window, refused_at) = (WINDOW.to_string(), refused_at.to_string());
    let headers = [
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window.as_str()),
        ("x-mock-summary-window", refused_at.as_str()),
    ];
    post_chat(proxy, &headers, request).await
}

/// A summariser call's size as the mock counts it, with its completion cap.
fn asked(call: &Value) -> u64 {
    support::mock_tokens(call) + call["max_tokens"].as_u64().unwrap_or(0)
}

/// A summariser refused as too long teaches nothing of the client's window when it is
/// sized by a window of its own (`summarizer.context_window`), even when it is the
/// request's model behind the same upstream: learning the window its refusal named for
/// the model would have every later request compacted against the summariser's window
/// instead of the model's. A request that fits the model's window then goes to the
/// upstream as the client sent it.
#[tokio::test]
async fn a_summarisers_refusal_never_shrinks_the_window_of_the_clients_requests() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "context_window = 3000");
    // The summariser's upstream holds less than the summariser was told: it refuses
    // every summariser request as too long, naming this window.
    const REFUSED_AT: u64 = 1500;
    let (status, x) = post_refused_over(&proxy, REFUSED_AT, &session(30)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary="), "{x}");
    // The first call was refused as too long (and asked again smaller, within the
    // window the refusal named).
    let calls = bodies(&mock.summaries());
    assert!(
        calls.first().is_some_and(|call| asked(call) > REFUSED_AT),
        "{:?}",
        calls.iter().map(asked).collect::<Vec<_>>()
    );

    // Another conversation, over the window the refusals named and well within the
    // model's (below where a compaction would even be prepared).
    let mut next = session(4);
    next["messages"][0]["content"] = json!("You are another coding agent.");
    next["max_tokens"] = json!(100);
    let fill = support::mock_tokens(&next) + 100;
    assert!(REFUSED_AT < fill && fill < WINDOW * 2 / 3, "{fill}");
    let (status, x) = post_refused_over(&proxy, REFUSED_AT, &next).await;
    assert_eq!((status, x.as_str()), (200, ""), "{}", proxy.logs());
    assert_eq!(mock.last().body, serde_json::to_vec(&next).unwrap());
}

/// A summariser without a window of its own is sized by the request's window, but never
/// past what its own model is known to hold: once a refusal of its calls has named the
/// smaller window of its model, the next event's calls fit it from the first (before:
/// every event's first call was sized by the request's window again, refused, and asked
/// again smaller, a wasted call per event).
#[tokio::test]
async fn a_summariser_model_that_refused_once_is_sized_by_what_it_said_at_the_next_event() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock, "model = \"small-summary-model\"");
    const REFUSED_AT: u64 = 2500;
    let (status, x) = post_refused_over(&proxy, REFUSED_AT, &session(30)).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary="), "{x}");
    let first = bodies(&mock.summaries());
    assert!(
        first.first().is_some_and(|call| asked(call) > REFUSED_AT),
        "the first event's first call was not refused: {:?}",
        first.iter().map(asked).collect::<Vec<_>>()
    );

    // Another conversation's event, with the summariser's window learned.
    let mut next = session(30);
    next["messages"][0]["content"] = json!("You are another coding agent.");
    let (status, x) = post_refused_over(&proxy, REFUSED_AT, &next).await;
    assert_eq!(status, 200, "{}", proxy.logs());
    assert!(x.contains("summary=llm"), "{x}");
    let calls = bodies(&mock.summaries());
    let later: Vec<u64> = calls[first.len()..].iter().map(asked).collect();
    assert!(!later.is_empty(), "{x}");
    assert!(
        later.iter().all(|&tokens| tokens <= REFUSED_AT),
        "a call of the second event over the learned window: {later:?}"
    );
}
