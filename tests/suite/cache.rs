//! The summary cache over a real session: a conversation compacted once is resumed from its
//! checkpoint on later turns (`summary=cache`) with the compacted part byte-identical, so a
//! long session pays for a handful of summaries, not one per turn; new summaries update the
//! previous one; concurrent requests share one summariser call; secrets never reach a
//! stored summary; a conversation whose compactions save little stops paying for summaries.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use serde_json::{json, Value};
use support::{agent_round, assert_compacted_part_kept, client, metrics, window_turn, Mock, Proxy};

/// The upstream's window, in the mock's tokens; the proxy is told the same.
const WINDOW: u64 = 6000;
/// A system prompt of this many sentences takes most of the window's prompt budget.
const SYSTEM_REPEAT: usize = 330;
const API_KEY: &str = "sk-proj-Xq7LmN2pR9sT4vW8yZ1aB3cD5eF6gH0jK2lM4nP6qR8sT0uV";

fn ask(n: usize) -> Value {
    let text = if n == 3 {
        format!("Turn {n}: deploy it with OPENAI_API_KEY={API_KEY} once module {n} passes.")
    } else {
        format!(
            "Turn {n}: the test of module {n} fails; please fix src/module_{n}.rs and rerun it."
        )
    };
    json!({"role": "user", "content": text})
}

fn request(messages: &[Value]) -> Value {
    json!({"model": "mock-agent-model", "messages": messages})
}

fn proxy(mock: &Mock) -> Proxy {
    proxy_for(mock, WINDOW)
}

fn proxy_for(mock: &Mock, window: u64) -> Proxy {
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {window}\n\n[summarizer]\ncontext_window = 128000\n"
    );
    Proxy::start(&mock.url("/v1"), &config)
}

/// Sends `request` as tenant `client-key`, the summariser answering as `summary` says
/// after 200 ms; returns the status and the `x-compaction` header.
async fn send(proxy: &Proxy, summary: &str, request: &Value) -> (u16, String) {
    window_turn(proxy, "Bearer client-key", WINDOW, summary, 200, request).await
}

/// The first `turns` rounds of the session, ending on the next ask.
fn history(turns: usize) -> Vec<Value> {
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for n in 0..turns {
        history.push(ask(n));
        history.extend(agent_round(n));
    }
    history.push(ask(turns));
    history
}

/// A 60-turn session, played turn by turn as a client does: the whole history each time.
/// Returns each turn's `x-compaction` header.
async fn play(proxy: &Proxy, mock: &Mock, summary: &str, turns: usize) -> Vec<String> {
    play_with("You are a coding agent.", proxy, mock, summary, turns).await
}

async fn play_with(
    system: &str,
    proxy: &Proxy,
    mock: &Mock,
    summary: &str,
    turns: usize,
) -> Vec<String> {
    let mut history = vec![json!({"role": "system", "content": system})];
    let mut headers = Vec::new();
    for n in 0..turns {
        history.push(ask(n));
        let (status, x) = send(proxy, summary, &request(&history)).await;
        assert_eq!(status, 200, "turn {n}: {x}\n{}", proxy.logs());
        assert!(mock.state.violations.lock().unwrap().is_empty(), "turn {n}");
        headers.push(x);
        history.extend(agent_round(n));
    }
    headers
}

#[tokio::test]
async fn a_long_session_pays_for_a_few_summaries_and_resends_the_same_bytes() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let headers = play(&proxy, &mock, "ok", 60).await;

    let summaries = mock.summaries();
    let llm = headers.iter().filter(|x| x.contains("summary=llm")).count();
    let cached = headers
        .iter()
        .filter(|x| x.contains("summary=cache"))
        .count();
    assert!(
        (1..=5).contains(&summaries.len()),
        "{} summariser calls: {headers:#?}",
        summaries.len()
    );
    assert_eq!(llm, summaries.len(), "{headers:#?}");
    assert!(cached >= 15, "{cached} turns from the cache: {headers:#?}");
    for x in headers.iter().filter(|x| x.contains("summary=cache")) {
        assert!(
            x.starts_with("applied; trigger=preflight; attempts=1;"),
            "{x}"
        );
    }

    // Turn after turn from the cache, the compacted part is the same bytes.
    let sent = mock.recorded();
    assert_eq!(sent.len(), headers.len(), "one upstream call per turn");
    let mut compared = 0;
    for (turn, pair) in headers.windows(2).enumerate() {
        if pair[1].contains("summary=cache") {
            assert_compacted_part_kept(&sent, turn);
            compared += 1;
        }
    }
    assert!(compared >= 15);

    // Every summary after the first updates the one before instead of re-reading it as a
    // turn: it arrives as the previous checkpoint, once.
    for call in &summaries[1..] {
        let body: Value = serde_json::from_slice(&call.body).unwrap();
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert!(user.starts_with("<previous-checkpoint>\n"), "{user}");
        assert_eq!(user.matches("MOCK-CHECKPOINT").count(), 1, "{user}");
        assert!(!user.contains("[compaction-proxy: summary"), "{user}");
    }
    for call in &summaries {
        assert!(!String::from_utf8_lossy(&call.body).contains(API_KEY));
    }

    let metrics = metrics(&proxy).await;
    assert!(
        metrics.contains(&format!(
            "compaction_proxy_summaries_total{{source=\"cache\"}} {cached}\n"
        )),
        "{metrics}"
    );
    // Each compaction extended the conversation's checkpoint in place of the last.
    assert!(
        metrics.contains("compaction_proxy_cache_checkpoints 1\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_fallback_summary_is_stored_without_the_secrets_it_summarised() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let headers = play(&proxy, &mock, "500", 45).await;
    assert!(
        headers.iter().any(|x| x.contains("summary=fallback")),
        "{headers:#?}"
    );
    // Served again from the cache, the digest is still reported as the degraded summary
    // it is, never as `cache`.
    assert!(
        headers
            .iter()
            .any(|x| x.contains("summary=cached-fallback;")),
        "{headers:#?}"
    );
    assert!(
        headers.iter().all(|x| !x.contains("summary=cache;")),
        "{headers:#?}"
    );
    // Once turn 3 is summarised, the key is in no request: not in the stored summary
    // resent every turn, not in a summariser call.
    let sent = mock.recorded();
    let first = headers.iter().position(|x| x.contains("applied")).unwrap();
    for (turn, request) in sent.iter().enumerate().skip(first) {
        let text = String::from_utf8_lossy(&request.body);
        assert!(!text.contains(API_KEY), "turn {turn}: {text}");
    }
    for call in mock.summaries() {
        assert!(!String::from_utf8_lossy(&call.body).contains(API_KEY));
    }
}

#[tokio::test]
async fn concurrent_requests_of_one_conversation_share_one_summary() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let history = history(40);
    let body = request(&history);
    let (a, b) = tokio::join!(send(&proxy, "ok", &body), send(&proxy, "ok", &body));
    assert_eq!((a.0, b.0), (200, 200));
    assert!(
        a.1.contains("summary=llm") && b.1.contains("summary=llm"),
        "{a:?} {b:?}"
    );
    assert_eq!(mock.summaries().len(), 1);

    // Another tenant's identical conversation is not served the first tenant's summary.
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer another-client")
        .header("x-mock", "window")
        .header("x-mock-window", WINDOW.to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    let x = response.headers()["x-compaction"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(x.contains("summary=llm"), "{x}");
    assert_eq!(mock.summaries().len(), 2);
}

#[tokio::test]
async fn an_edited_history_is_compacted_anew() {
    let mock = Mock::start().await;
    let proxy = proxy(&mock);
    let mut history = history(40);
    let (_, x) = send(&proxy, "ok", &request(&history)).await;
    assert!(x.contains("summary=llm"), "{x}");
    let (_, x) = send(&proxy, "ok", &request(&history)).await;
    assert!(x.contains("summary=cache"), "{x}");
    // The client rewrites an early turn: no stored prefix matches any more.
    history[1] = json!({"role": "user", "content": "Turn 0, reworded."});
    let (status, x) = send(&proxy, "ok", &request(&history)).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=llm"), "{x}");
    assert_eq!(mock.summaries().len(), 2);
}

#[tokio::test]
async fn with_the_cache_off_every_turn_is_compacted_anew() {
    let mock = Mock::start().await;
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[cache]\nenabled = false\n"
    );
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let history = history(40);
    // Each turn asks the summariser again (in one call or, where its input is larger than
    // the window leaves beside a checkpoint's room, in chunks).
    let mut calls = 0;
    for _ in 0..2 {
        let (_, x) = send(&proxy, "ok", &request(&history)).await;
        assert!(x.contains("summary=llm"), "{x}");
        assert!(mock.summaries().len() > calls, "{x}");
        calls = mock.summaries().len();
    }
}

#[tokio::test]
async fn a_conversation_whose_compactions_save_little_stops_calling_the_summariser() {
    let mock = Mock::start().await;
    // Nothing prepared ahead: each compaction is made, and judged, in its own turn.
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[compaction]\nprepare_concurrency = 0\n\n[summarizer]\ncontext_window = 128000\n"
    );
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    // Instructions fill most of the window, so each compaction has little to replace
    // and saves under a tenth.
    let system = "You are a coding agent; keep to the rules. ".repeat(SYSTEM_REPEAT);
    let headers = play_with(&system, &proxy, &mock, "ok", 60).await;
    let compactions: Vec<&String> = headers
        .iter()
        .filter(|x| x.starts_with("applied") && !x.contains("summary=cache"))
        .collect();
    let sources: Vec<&str> = compactions
        .iter()
        .map(|x| {
            x.split("summary=")
                .nth(1)
                .unwrap()
                .split(';')
                .next()
                .unwrap()
        })
        .collect();
    // Two poor compactions in a row: the third does without the summariser, and saves
    // enough to start the count again.
    assert_eq!(sources[..3], ["llm", "llm", "fallback"], "{compactions:#?}");
    // Every summariser call made an LLM compaction, but one: with the instructions
    // filling the window by the upstream's count, the first compaction (two turns in)
    // asked for a summary of a middle too small for it to save anything, and sent the
    // request as it came.
    let llm = sources.iter().filter(|s| **s == "llm").count();
    let calls = mock.summaries().len();
    assert!(
        (llm..=llm + 1).contains(&calls),
        "{calls} calls: {compactions:#?}"
    );
}

/// Whether the upstream request `next` sends `previous`'s messages, byte for byte, and
/// more after them: what the upstream's prompt cache needs to hit.
fn extends(previous: &[u8], next: &[u8]) -> bool {
    let messages = |body: &[u8]| {
        let value: Value = serde_json::from_slice(body).unwrap();
        serde_json::to_string(&value["messages"]).unwrap()
    };
    let (previous, next) = (messages(previous), messages(next));
    next.starts_with(previous.trim_end_matches(']'))
}

/// A tool-heavy round: the output of each call is long beside the window, as a file
/// read or a test log is.
fn heavy_round(n: usize) -> Vec<Value> {
    let mut round = agent_round(n);
    round[1]["content"] = json!(format!(
        "{}\n{}",
        round[1]["content"].as_str().unwrap(),
        format!("   Compiling module_{n} v0.1.0 (/srv/module_{n})\n").repeat(60)
    ));
    round
}

/// Compactions are rare events: each brings the request down to the low-water mark
/// (60% of the window), and until the next one crosses the threshold (90%) the turns
/// between are sent as resumed, the same bytes with the new messages after them.
#[tokio::test]
async fn between_compactions_the_request_only_grows_at_its_end() {
    const WINDOW: u64 = 40_000;
    let mock = Mock::start().await;
    let proxy = proxy_for(&mock, WINDOW);
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut headers = Vec::new();
    for n in 0..60 {
        history.push(ask(n));
        let (status, x) =
            window_turn(&proxy, "Bearer k", WINDOW, "ok", 200, &request(&history)).await;
        assert_eq!(status, 200, "turn {n}: {x}\n{}", proxy.logs());
        headers.push(x);
        history.extend(heavy_round(n));
    }
    let sent = mock.recorded();
    assert_eq!(sent.len(), 60, "one upstream call per turn");
    let pairs: Vec<bool> = sent
        .windows(2)
        .map(|pair| extends(&pair[0].body, &pair[1].body))
        .collect();
    let grown = pairs.iter().filter(|e| **e).count();
    // A request that does not extend the one before is a compaction event: the
    // proxy compacted there, and nowhere else.
    let events: Vec<usize> = (0..pairs.len())
        .filter(|i| !pairs[*i])
        .map(|i| i + 1)
        .collect();
    assert!(
        grown * 100 >= pairs.len() * 85,
        "{grown} of {} requests extend the one before; events at {events:?}: {headers:#?}",
        pairs.len()
    );
    // One summariser call at most per event.
    assert!(mock.summaries().len() <= events.len());
}

/// A summary the summariser could not write is the digest, stored like any other; it is
/// replaced by a real one at the first turn the summariser may be asked again.
#[tokio::test]
async fn a_stored_fallback_gives_way_to_a_real_summary_once_the_summariser_answers() {
    let mock = Mock::start().await;
    // Nothing prepared ahead: a compaction prepared while the summariser still failed
    // would be put in place at turn 45, and the real summary would come one turn later.
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[compaction]\nprepare_concurrency = 0\n\n[summarizer]\ncontext_window = 128000\ncooldown_ms = 300\n"
    );
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut headers = Vec::new();
    for n in 0..50 {
        history.push(ask(n));
        // The summariser fails until turn 45 (the first compaction is near turn 37).
        let summary = if n < 45 { "500" } else { "ok" };
        if n == 45 {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        }
        let (status, x) = send(&proxy, summary, &request(&history)).await;
        assert_eq!(status, 200, "turn {n}: {x}");
        headers.push(x);
        history.extend(agent_round(n));
    }
    let compacted: Vec<&String> = headers[..45].iter().filter(|x| !x.is_empty()).collect();
    assert!(!compacted.is_empty(), "{headers:#?}");
    assert!(
        compacted.iter().all(|x| x.contains("fallback")),
        "{headers:#?}"
    );
    assert!(headers[45].contains("summary=llm"), "{headers:#?}");
    assert!(
        headers[46..].iter().all(|x| x.contains("summary=cache")),
        "{headers:#?}"
    );
    let last = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(last.contains("MOCK-CHECKPOINT"), "{last}");
}

/// The turn that crosses the threshold does not wait for the summariser: the compaction
/// it needs was prepared in the background once the conversation passed the prepare mark,
/// with the one summariser call the event costs.
#[tokio::test]
async fn the_turn_that_crosses_the_threshold_does_not_wait_for_the_summary() {
    const WINDOW: u64 = 20_000;
    let mock = Mock::start().await;
    let proxy = proxy_for(&mock, WINDOW);
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut turns = Vec::new();
    for n in 0..36 {
        history.push(ask(n));
        let started = std::time::Instant::now();
        // A slow summariser: a turn that waited for it would take half a second more.
        let (status, x) =
            window_turn(&proxy, "Bearer k", WINDOW, "ok", 500, &request(&history)).await;
        assert_eq!(status, 200, "turn {n}: {x}");
        turns.push((x, started.elapsed()));
        // A long answer in prose: what only a summary can shorten.
        let answer = format!("Module {n}: the fix and why it holds. ").repeat(80);
        history.push(json!({"role": "assistant", "content": answer}));
        // The client thinks between turns, as a model answering or a tool running does.
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    let events: Vec<&(String, std::time::Duration)> = turns
        .iter()
        .filter(|(x, _)| x.contains("summary=llm"))
        .collect();
    assert!(!events.is_empty(), "{turns:#?}");
    for (x, took) in &events {
        assert!(
            took.as_millis() < 400,
            "the event waited {took:?}: {x}\n{turns:#?}"
        );
    }
    // One summariser call per event, made ahead of it; the session may end with the
    // next event prepared, or still in preparation, and not yet needed: its call is
    // counted once it is made.
    let made = || {
        format!(
            "compaction_proxy_prepared_total{{fate=\"made\"}} {}\n",
            mock.summaries().len()
        )
    };
    let mut counted = metrics(&proxy).await;
    for _ in 0..50 {
        if counted.contains(&made()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        counted = metrics(&proxy).await;
    }
    let metrics = counted;
    assert!(metrics.contains(&made()), "{metrics}");
    assert!(mock.summaries().len() <= events.len() + 1, "{turns:#?}");
    let used = format!(
        "compaction_proxy_prepared_total{{fate=\"used\"}} {}\n",
        events.len()
    );
    assert!(metrics.contains(&used), "{metrics}");
}

/// Preparations are bounded per tenant: a tenant's fifth conversation in preparation
/// pushes out its oldest, whose work (a summariser call still waiting) is cancelled and
/// counted as wasted; none of it reaches a request.
#[tokio::test]
async fn a_preparation_pushed_out_by_newer_ones_is_cancelled() {
    const WINDOW: u64 = 20_000;
    let mock = Mock::start().await;
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[compaction]\nprepare_concurrency = 8\n"
    );
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    for conversation in 0..5 {
        // Past the prepare mark (75%), short of the threshold (90%).
        let mut messages =
            vec![json!({"role": "system", "content": format!("Conversation {conversation}.")})];
        for n in 0..13 {
            messages.push(ask(n));
            let answer = format!("Module {n}: the fix and why it holds. ").repeat(80);
            messages.push(json!({"role": "assistant", "content": answer}));
        }
        messages.push(ask(13));
        let credential = "Bearer one-tenant";
        let (status, x) =
            window_turn(&proxy, credential, WINDOW, "ok", 5000, &request(&messages)).await;
        assert_eq!(status, 200, "{x}");
        assert_eq!(x, "", "nothing changes in the request before the threshold");
    }
    let metrics = metrics(&proxy).await;
    assert!(
        metrics.contains("compaction_proxy_prepared_total{fate=\"wasted\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("compaction_proxy_prepared_total{fate=\"made\"} 0\n"));
}

/// A coding agent's session as opencode sends it (its harness session, scaled to the
/// mock's count): long instructions, then turns of two calls of the same listing and a
/// reply. The canned summary is short enough for the tight frame, so the first compaction
/// fits with the first exchange kept; on the next call the resumed form is over again and
/// the compaction folds the first exchange into the summary while the turn in progress
/// stays whole. Its checkpoint stands for the same client prefix as the one it was resumed
/// from, and replaces it: the later requests resume from it, and each summariser call
/// updates the summary with the turns since instead of summarising the whole history.
#[tokio::test]
async fn a_checkpoint_made_again_for_the_same_prefix_is_resumed_from() {
    const WINDOW: u64 = 8000;
    const TURNS: usize = 8;
    let mock = Mock::start().await;
    let proxy = proxy_for(&mock, WINDOW);
    let listing: String = (1..=120)
        .map(|i| format!("output line {i} of a long listing, padded with some words\n"))
        .collect();
    let system = "You are a coding agent; keep to the rules of this workspace. ".repeat(150);
    let mut history = vec![json!({"role": "system", "content": system})];
    let mut headers = Vec::new();
    for turn in 0..TURNS {
        let ask = format!("turn {turn}: please use the tool 2 times");
        history.push(json!({"role": "user", "content": ask}));
        for call in 0..3 {
            let (status, x) = send(&proxy, "ok", &request(&history)).await;
            assert_eq!(status, 200, "turn {turn}: {x}\n{}", proxy.logs());
            headers.push(x);
            if call == 2 {
                break;
            }
            let id = format!("call_{turn}_{call}");
            history.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "bash",
                    "arguments": json!({"command": "seq -f 'output line %g' 1 120"}).to_string()}}]}));
            history.push(json!({"role": "tool", "tool_call_id": id, "content": listing}));
        }
        let reply = format!("Done with turn {turn}. {}", "A note on it. ".repeat(40));
        history.push(json!({"role": "assistant", "content": reply}));
    }
    assert!(
        headers.iter().any(|x| x.contains("summary=cache")),
        "{headers:#?}"
    );
    // One call a turn at most (before the fix: 14, every other one of the whole history).
    let calls = mock.summaries();
    assert!(calls.len() <= TURNS, "{} calls: {headers:#?}", calls.len());
    for (i, call) in calls.iter().enumerate().skip(1) {
        let body = std::str::from_utf8(&call.body).unwrap();
        assert!(
            body.contains("<previous-checkpoint>"),
            "call {i} summarised the history anew: {headers:#?}"
        );
    }
}
