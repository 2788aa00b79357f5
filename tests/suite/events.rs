//! Compaction events in a bursty tool session, over real sockets: each turn adds 13-21%
//! of the window (a test run's long output and a reply in prose), so a request may jump
//! from below the prepare mark past the threshold in one turn. The compaction such a turn
//! needs was prepared when the conversation's growth said the next turn may cross, so no
//! turn waits for the summariser; and events stay fewer than the turns. In a session of
//! tool outputs alone (15% of the window a turn), an event prunes every output before the
//! turn in progress and so buys several turns, where pruning only to the low-water mark
//! bought one; the turn whose refusal teaches the window prunes at once instead of waiting
//! for a summary. Both with the window configured and learned from the upstream's first
//! refusal.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{window_turn, Mock, Proxy};

/// The upstream's window, in the mock's tokens (three characters each).
const WINDOW: u64 = 20_000;
const TURNS: usize = 26;
/// A slow summariser, slower than the agent's time between turns.
const SUMMARY_DELAY_MS: u64 = 500;
/// The agent's time between turns: less than the summariser's, so a preparation started
/// only one turn ahead would still be running when the threshold is crossed.
const THINK_MS: u64 = 350;

/// The proxy's config with the window configured for `model`; the summariser's own
/// window is set in both, so only the upstream's is learned or not.
fn configured(model: &str) -> String {
    format!("[[models]]\nmatch = \"{model}\"\ncontext_window = {WINDOW}\n\n{LEARNED}")
}
/// The proxy's config with the window left to be learned from the upstream's refusal.
const LEARNED: &str = "[summarizer]\ncontext_window = 128000\n";

/// Turn `n`: the ask, a test run and its output of 2,000 to 4,000 tokens (a different
/// size each turn, as a real session's are), and the agent's short reply.
fn turn(n: usize) -> Vec<Value> {
    let id = format!("call_{n}");
    let lines = 120 + (n * 37) % 80;
    let output: String = (0..lines)
        .map(|i| format!("test module_{n}::case_{i} ... ok (took {i} ms, seed {n}{i})\n"))
        .collect();
    vec![
        json!({"role": "user", "content": format!("Turn {n}: run the tests of module {n} and fix what fails.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": output}),
    ]
}

async fn session(config: &str) -> Taken {
    // The agent's account of the fix, in prose: what only a summary can shorten.
    let reply = |n| format!("Module {n}: the fix and why it holds. ").repeat(40);
    drive(CODING_AGENT, config, TURNS, turn, reply).await
}

/// No turn that brought a new summary after the first `skip` turns waited for it: the
/// summary was made ahead of it.
fn no_turn_waited(session: &Taken, skip: usize) {
    let waited: Vec<_> = session.turns[skip..]
        .iter()
        .filter(|(x, waited)| x.contains("summary=llm") && *waited)
        .collect();
    assert!(waited.is_empty(), "{waited:#?}\n{:#?}", session.turns);
}

/// An event buys more than one turn: from the first compaction on, the request is rewritten
/// on at most two turns of three, and each event costs at most one summariser call
/// (prepared or not). Here the agent's prose replies, which no pruning shortens, pile up
/// between events: an event that goes down to its fill needs a summary about every time.
fn events_buy_room(session: &Taken) {
    let first = session
        .turns
        .iter()
        .position(|(x, _)| !x.is_empty())
        .expect("no compaction at all");
    let after = TURNS - first;
    assert!(
        session.events.len() * 3 <= after * 2,
        "{} events in the {after} turns from the first compaction: {:#?}",
        session.events.len(),
        session.turns
    );
    assert!(
        session.summaries <= session.events.len(),
        "{} summaries for {} events",
        session.summaries,
        session.events.len()
    );
}

#[tokio::test]
async fn with_the_window_configured_no_turn_waits_and_events_are_few() {
    let config = configured("mock-agent-model");
    let session = session(&config).await;
    no_turn_waited(&session, 0);
    events_buy_room(&session);
}

#[tokio::test]
async fn with_the_window_learned_from_a_refusal_no_later_turn_waits() {
    let session = session(LEARNED).await;
    // The first overflow is a refusal, learned from: that turn compacts while it waits.
    let learned = session
        .turns
        .iter()
        .position(|(x, _)| x.contains("trigger=error"))
        .expect("the window was never learned");
    no_turn_waited(&session, learned + 1);
    events_buy_room(&session);
}

/// The target length each summariser call of `session` asked for.
fn summary_targets(session: &Taken) -> Vec<usize> {
    session
        .summarised
        .iter()
        .filter_map(|body| {
            let (_, after) = body.split_once("Target length: about ")?;
            after.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// A checkpoint gets the room a model can write one in: every summariser call of the
/// session asks for at least 2,000 tokens, whatever little of the target the event's
/// plan had left beside what it kept (a preparation aims below its event's fill, which
/// in a window this small left about 60). Window learned from the first refusal, as in
/// issue 40's 30k session.
#[tokio::test]
async fn with_the_window_learned_a_checkpoint_is_asked_for_in_two_thousand_tokens() {
    let session = session(LEARNED).await;
    let targets = summary_targets(&session);
    assert!(!targets.is_empty(), "no summariser call");
    assert_eq!(targets.len(), session.summaries, "{targets:?}");
    assert!(targets.iter().all(|&t| t >= 2_000), "{targets:?}");
}

/// What the summariser reads of a conversation resumed from an earlier event's
/// checkpoint is the client's own text: the outputs that event pruned reach it whole (the
/// client sends them whole), not as their one-line stubs.
#[tokio::test]
async fn the_summariser_is_shown_the_clients_text_not_an_earlier_events_stubs() {
    // Until the summariser has been asked twice: which turn an event's background summary
    // lands in depends on how fast the machine runs the turns, not on what is tested.
    let reply = |n| format!("Module {n}: the fix and why it holds. ").repeat(40);
    let config = configured("mock-agent-model");
    let twice = |mock: &Mock| mock.summaries().len() >= 2;
    let session = drive_until(CODING_AGENT, &config, 3 * TURNS, turn, reply, twice).await;
    assert!(session.summaries >= 2, "{} summaries", session.summaries);
    for body in &session.summarised {
        assert!(!body.contains("pruned by compaction"), "{body}");
    }
}

/// Turn `n` of a tool session without prose: the ask, one command, and its output of
/// `lines` lines (150: about 3,000 tokens, 15% of the window), all of it prunable once
/// the turn is past.
fn tool_turn(n: usize, lines: usize) -> Vec<Value> {
    let id = format!("run_{n}");
    let output: String = (0..lines)
        .map(|i| {
            format!("test module_{n}::case_{i:03} ... ok (took {i:03} ms, seed {n:04}{i:03})\n")
        })
        .collect();
    vec![
        json!({"role": "user", "content": format!("Turn {n}: run the tests of module {n}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": output}),
    ]
}

/// What the upstream took on each turn of a session: the size of the request in the
/// mock's tokens, and whether it was an event (its messages do not extend the last ones
/// sent, byte for byte); with each turn's `x-compaction` and whether it waited for a
/// summariser call ([`Mock::waited_for_a_summary`]), and the summariser calls the
/// upstream saw.
struct Taken {
    sizes: Vec<u64>,
    events: Vec<usize>,
    turns: Vec<(String, bool)>,
    summaries: usize,
    /// The bodies of the summariser's requests, in the order they came.
    summarised: Vec<String>,
    /// The messages the upstream took on each turn.
    sent: Vec<Vec<Value>>,
}

/// A tool session of `turns` turns of `lines` output lines; the agent's reply to each is
/// a line, and `prose` sentences more of what no pruning shortens.
async fn tool_session(config: &str, turns: usize, lines: usize, prose: usize) -> Taken {
    let reply = |n| format!("Module {n} passes.{}", " The fix holds.".repeat(prose));
    drive(CODING_AGENT, config, turns, |n| tool_turn(n, lines), reply).await
}

/// Who talks to the proxy: the model it names and its system prompt.
struct Agent {
    model: &'static str,
    system: &'static str,
}

const CODING_AGENT: Agent = Agent {
    model: "mock-agent-model",
    system: "You are a coding agent.",
};

const REVIEWER: Agent = Agent {
    model: "mock-chat-model",
    system: "You review drafts.",
};

/// A session of `turns` turns of `agent` through a proxy with `config`, against an
/// upstream of `WINDOW` with a slow summariser: `turn(n)` gives turn `n`'s messages,
/// `reply(n)` the agent's answer to them, and the agent thinks `THINK_MS` between turns.
async fn drive(
    agent: Agent,
    config: &str,
    turns: usize,
    turn: impl Fn(usize) -> Vec<Value>,
    reply: impl Fn(usize) -> String,
) -> Taken {
    drive_until(agent, config, turns, turn, reply, |_| false).await
}

/// [`drive`], ending after the turn when what the upstream has seen is `enough`, or after
/// `turns` turns.
async fn drive_until(
    agent: Agent,
    config: &str,
    turns: usize,
    turn: impl Fn(usize) -> Vec<Value>,
    reply: impl Fn(usize) -> String,
    enough: impl Fn(&Mock) -> bool,
) -> Taken {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let mut history = vec![json!({"role": "system", "content": agent.system})];
    let mut taken = Taken {
        sizes: Vec::new(),
        events: Vec::new(),
        turns: Vec::new(),
        summaries: 0,
        summarised: Vec::new(),
        sent: Vec::new(),
    };
    let mut before: Option<String> = None;
    for n in 0..turns {
        history.extend(turn(n));
        let request = json!({"model": agent.model, "messages": history});
        let started = Instant::now();
        let (status, x) =
            window_turn(&proxy, "Bearer k", WINDOW, "ok", SUMMARY_DELAY_MS, &request).await;
        assert_eq!(status, 200, "turn {n}: {x}");
        let last = mock.last();
        taken
            .turns
            .push((x, mock.waited_for_a_summary(started, &last)));
        let sent: Value = serde_json::from_slice(&last.body).unwrap();
        taken.sizes.push(support::mock_tokens(&sent));
        let messages = sent["messages"].to_string();
        if before
            .as_ref()
            .is_some_and(|before| !messages.starts_with(before.trim_end_matches(']')))
        {
            taken.events.push(n);
        }
        before = Some(messages);
        taken
            .sent
            .push(sent["messages"].as_array().unwrap().clone());
        history.push(json!({"role": "assistant", "content": reply(n)}));
        if enough(&mock) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(THINK_MS)).await;
    }
    let summaries = mock.summaries();
    taken.summaries = summaries.len();
    taken.summarised = summaries
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    taken
}

/// Each event cleared room for several turns: it brought the request below 40% of the
/// window (its fill, sized by the conversation's growth, is far below the low-water mark
/// at 15% a turn, and pruning every output before the turn in progress gets there), so
/// at least two turns go as they are between two events (pruning only down to the
/// low-water mark leaves room for one); no turn waited for the summariser, and none was
/// asked.
fn each_event_buys_several_turns(taken: &Taken) {
    let report = || format!("events at {:?}, sizes {:?}", taken.events, taken.sizes);
    assert!(taken.events.len() >= 2, "{}", report());
    for &n in &taken.events {
        assert!(taken.sizes[n] * 10 <= WINDOW * 4, "turn {n}: {}", report());
    }
    for pair in taken.events.windows(2) {
        assert!(pair[1] - pair[0] >= 3, "{}", report());
    }
    let slow: Vec<_> = taken.turns[taken.events[0]..]
        .iter()
        .filter(|(_, waited)| *waited)
        .collect();
    assert!(slow.is_empty(), "{slow:?}\n{}", report());
    // Every output is prunable once its turn is past, so every event prunes alone: no
    // summariser call is paid for, not even by a preparation (one that kept the turn in
    // progress whole asked for a summary the event then went without).
    assert_eq!(taken.summaries, 0, "{}", report());
}

#[tokio::test]
async fn with_the_window_configured_an_event_buys_several_turns() {
    let config = configured("mock-agent-model");
    let taken = tool_session(&config, 24, 150, 0).await;
    each_event_buys_several_turns(&taken);
}

#[tokio::test]
async fn with_the_window_learned_an_event_buys_several_turns() {
    let taken = tool_session(LEARNED, 24, 150, 0).await;
    let learned = taken
        .turns
        .iter()
        .position(|(x, _)| x.contains("trigger=error"))
        .expect("the window was never learned");
    assert!(taken.events.contains(&learned), "{:?}", taken.events);
    each_event_buys_several_turns(&taken);
}

/// The turn whose refusal teaches the window is compacted at once, deterministically: it
/// does not wait for the summariser (nothing could be prepared before the window was
/// known), and neither does any later turn.
#[tokio::test]
async fn with_the_window_learned_the_refused_turn_does_not_wait_for_the_summariser() {
    let taken = tool_session(LEARNED, 12, 150, 0).await;
    let learned = taken
        .turns
        .iter()
        .position(|(x, _)| x.contains("trigger=error"))
        .expect("the window was never learned");
    let slow: Vec<_> = taken.turns[learned..]
        .iter()
        .filter(|(_, waited)| *waited)
        .collect();
    assert!(slow.is_empty(), "{:#?}", taken.turns);
}

/// An event that prunes (alone, or on from a summary made before), after the first, keeps what the event before it pruned
/// byte for byte when the outputs since give most of the room it aims at: reaching past
/// them for the rest would rewrite every message since that event, and the upstream's
/// prompt cache with them. Here each turn leaves a reply no pruning shortens, so the
/// outputs since an event seldom give all of the room: most later events keep the earlier
/// one's bytes (measured: 3 of 4 and 4 of 5; reaching past them for all of the room, 0 of
/// 3 and 1 of 4), the others reach past them when what came since gives too little.
fn later_events_keep_what_earlier_ones_pruned(taken: &Taken) {
    let stub = |m: &Value| {
        m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("[output of"))
    };
    let (mut kept, mut checked) = (0, 0);
    for &n in taken.events.iter().skip(1) {
        let x = &taken.turns[n].0;
        // A new summary rewrites what it replaces: only events that prune are checked.
        if x.contains("summary=llm") || x.contains("summary=fallback") {
            continue;
        }
        let (before, now) = (&taken.sent[n - 1], &taken.sent[n]);
        let Some(k) = before.iter().rposition(stub) else {
            continue;
        };
        kept += usize::from(before[..=k] == now[..=k]);
        checked += 1;
    }
    assert!(
        kept * 2 > checked,
        "{kept} of {checked} later events kept what an earlier one pruned: events at {:?}, {:#?}",
        taken.events,
        taken.turns
    );
}

#[tokio::test]
async fn with_the_window_configured_a_later_event_keeps_what_an_earlier_one_pruned() {
    let config = configured("mock-agent-model");
    let taken = tool_session(&config, 40, 50, 8).await;
    later_events_keep_what_earlier_ones_pruned(&taken);
}

#[tokio::test]
async fn with_the_window_learned_a_later_event_keeps_what_an_earlier_one_pruned() {
    let taken = tool_session(LEARNED, 40, 50, 8).await;
    later_events_keep_what_earlier_ones_pruned(&taken);
}

/// Turn `n` of a chat session: a paragraph to review, about 800 of the mock's tokens,
/// and nothing a pruning can shorten: every event needs a summary.
fn chat_turn(n: usize) -> Value {
    let paragraph =
        format!("Paragraph {n}: the reviewer's notes on section {n} of the draft. ").repeat(36);
    json!({"role": "user", "content": format!("Review this, briefly.\n{paragraph}")})
}

/// A chat session of `turns` turns through a proxy with `config`: each turn's
/// `x-compaction` and whether it waited for a summary, and the summariser calls the
/// upstream saw.
async fn chat_session(config: &str, turns: usize) -> Taken {
    let turn = |n| vec![chat_turn(n)];
    let reply = |n| format!("Section {n} reads well; two sentences could go. ").repeat(12);
    drive(REVIEWER, config, turns, turn, reply).await
}

/// No turn waited for a summariser call: every summary was made ahead of its event, or
/// the digest stood in for it.
fn no_chat_turn_waited(session: &Taken) {
    let slow: Vec<_> = session
        .turns
        .iter()
        .enumerate()
        .filter(|(_, (_, waited))| *waited)
        .collect();
    assert!(slow.is_empty(), "{slow:#?}\n{:#?}", session.turns);
}

/// With the window configured, a chat session's events are prepared: each is a summary
/// (nothing else shortens prose) and none is waited for.
#[tokio::test]
async fn with_the_window_configured_no_chat_turn_waits_for_its_summary() {
    let config = configured("mock-chat-model");
    let session = chat_session(&config, 36).await;
    assert!(
        session.turns.iter().any(|(x, _)| x.contains("summary=llm")),
        "{:#?}",
        session.turns
    );
    no_chat_turn_waited(&session);
}

/// With the window learned, the refused turn that teaches it cannot have been prepared
/// for: it is answered at once with the digest standing in for the summary, and the
/// conversation's next event, prepared in the background, brings the LLM's summary; no
/// turn waits for the summariser.
#[tokio::test]
async fn with_the_window_learned_the_refused_chat_turn_takes_the_digest_at_once() {
    let session = chat_session(LEARNED, 36).await;
    let learned = session
        .turns
        .iter()
        .position(|(x, _)| x.contains("trigger=error"))
        .expect("the window was never learned");
    let refused = &session.turns[learned].0;
    assert!(refused.contains("summary=fallback"), "{refused}");
    assert!(
        session.turns[learned + 1..]
            .iter()
            .any(|(x, _)| x.contains("summary=llm")),
        "the next event brought no summary: {:#?}",
        session.turns
    );
    no_chat_turn_waited(&session);
}

/// A fact in the middle of a long early turn: what the digest, cutting each message to
/// its ends and its salient sentences (rules, limits, numbers), leaves out.
const PLANTED: &str = "The release codename is Grey Heron.";

/// Turn `n` of a review session: a draft to review, about 5% of the window, with
/// [`PLANTED`] in the middle of turn 3's.
fn review_turn(n: usize) -> Vec<Value> {
    let paragraph = |m: usize| {
        format!("Paragraph {n}: the reviewer's notes on section {n} of the draft. ").repeat(m)
    };
    let content = match n {
        3 => format!(
            "Review this, briefly.\n{}{PLANTED} {}",
            paragraph(18),
            paragraph(18)
        ),
        _ => format!("Review this, briefly.\n{}", paragraph(36)),
    };
    vec![json!({"role": "user", "content": content})]
}

fn review_reply(n: usize) -> String {
    format!("Section {n} reads well; two sentences could go. ").repeat(12)
}

/// With the window learned, the LLM summary prepared after the refused turn is made from
/// the client's own messages, not from the digest that stood in: the client still sends
/// every message the digest replaced, and what the digest left out of them reaches the
/// summariser (before: it was given the digest to update, and the planted fact was lost).
#[tokio::test]
async fn with_the_window_learned_the_summary_after_the_digest_reads_the_clients_messages() {
    let session = drive(REVIEWER, LEARNED, 36, review_turn, review_reply).await;
    let learned = session
        .turns
        .iter()
        .position(|(x, _)| x.contains("trigger=error"))
        .expect("the window was never learned");
    assert!(session.turns[learned].0.contains("summary=fallback"));
    // The digest that stood in left the fact out: only the client's messages hold it.
    let refused = serde_json::to_string(&session.sent[learned]).unwrap();
    assert!(!refused.contains(PLANTED), "the digest kept the fact");
    assert!(
        !session.summarised.is_empty(),
        "the summariser was never asked"
    );
    assert!(
        session.summarised[0].contains(PLANTED),
        "the summary after the digest was not given the client's messages: {}",
        session.summarised[0]
    );
    // The digest is the checkpoint the summary updates: the answer is held to its facts.
    assert!(session.summarised[0].contains("<previous-checkpoint>"));
    assert!(
        session.turns[learned + 1..]
            .iter()
            .any(|(x, _)| x.contains("summary=llm")),
        "the prepared summary was never used: {:#?}",
        session.turns
    );
}

/// With the window learned, an event that finds nothing prepared summarises anew from the
/// client's own messages too, as a prepared one does: here the turn after the refused one
/// brings an appendix far larger than the conversation's growth said a turn would be, so
/// no preparation was started and the event compacts in the request's path. The digest
/// that stood in is the checkpoint the summary updates, its facts held to (before: the
/// event updated the digest, and what the digest cut never reached the summariser).
#[tokio::test]
async fn with_the_window_learned_an_event_with_nothing_prepared_reads_the_clients_messages() {
    nothing_prepared(LEARNED).await;
}

/// The same with a summariser that shares the upstream's small window: the client's
/// messages come in chunks, and the first, which carries the digest, leaves it its room
/// with fewer turns rather than cut ones (before: its messages were cut to their two
/// ends to fit beside the digest, and the fact in the middle of one was lost again).
#[tokio::test]
async fn with_the_window_learned_and_shared_by_the_summariser_the_first_chunk_is_not_cut() {
    nothing_prepared("").await;
}

/// A learned review session through a proxy with `config` whose turn after the refused
/// one needs an event nothing was prepared for: that event's summary reads the client's
/// messages, and its checkpoint is the next turn's.
async fn nothing_prepared(config: &str) {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let chat = |history: &Vec<Value>| {
        let request = json!({"model": REVIEWER.model, "messages": history});
        let proxy = &proxy;
        async move { window_turn(proxy, "Bearer k", WINDOW, "ok", SUMMARY_DELAY_MS, &request).await }
    };
    let mut history = vec![json!({"role": "system", "content": REVIEWER.system})];
    let mut learned = None;
    for n in 0..36 {
        history.extend(review_turn(n));
        let (status, x) = chat(&history).await;
        assert_eq!(status, 200, "turn {n}: {x}");
        history.push(json!({"role": "assistant", "content": review_reply(n)}));
        if x.contains("trigger=error") {
            assert!(x.contains("summary=fallback"), "turn {n}: {x}");
            learned = Some(mock.last());
            break;
        }
    }
    let refused = learned.expect("the window was never learned");
    // The digest that stood in left the fact out: only the client's messages hold it.
    assert!(!String::from_utf8_lossy(&refused.body).contains(PLANTED));
    assert!(
        mock.summaries().is_empty(),
        "the refused turn waited for a summary"
    );
    // About 40% of the window in one turn, where the turns before grew by 5%.
    let appendix = "Appendix: the figures of the draft, one per section, in order. ".repeat(380);
    history.push(json!({"role": "user", "content": format!("Review the appendix.\n{appendix}")}));
    let started = Instant::now();
    let (status, x) = chat(&history).await;
    assert_eq!(status, 200, "{x}");
    assert!(
        x.contains("trigger=preflight") && x.contains("summary=llm"),
        "{x}"
    );
    // Nothing was prepared: the event waited for its own summariser call.
    assert!(mock.waited_for_a_summary(started, &mock.last()), "{x}");
    let summarised = mock.summaries();
    let first = String::from_utf8_lossy(&summarised.first().expect("no summariser call").body);
    assert!(
        first.contains(PLANTED),
        "the event's summary was not given the client's messages"
    );
    assert!(first.contains("<previous-checkpoint>"), "{first}");
    // The summary made anew is the conversation's checkpoint: the next turn is resumed
    // from it, the event's request extended at its end.
    let event: Value = serde_json::from_slice(&mock.last().body).unwrap();
    history.push(json!({"role": "assistant", "content": review_reply(99)}));
    history.push(json!({"role": "user", "content": "And the conclusion?"}));
    let (status, x) = chat(&history).await;
    assert_eq!(status, 200, "{x}");
    assert!(x.contains("summary=cache"), "{x}");
    let next: Value = serde_json::from_slice(&mock.last().body).unwrap();
    let (event, next) = (event["messages"].to_string(), next["messages"].to_string());
    assert!(next.starts_with(event.trim_end_matches(']')), "{next}");
}

/// An event that prunes alone leaves no output whole or cut between the first message it
/// changes and the turn in progress: every byte from that message on is new to the
/// upstream's prompt cache, pruned or not, and an output left there whole would be pruned
/// by the next event, which would then start its rewrite at it, before what this event
/// wrote. Each turn's reply here is prose no pruning shortens, so events often need less
/// than all the outputs since the last one (before: the newest were left whole, or cut to
/// what was still needed).
fn events_prune_all_after_their_first_change(taken: &Taken) {
    let output = |m: &Value| m["role"] == "tool";
    let pruned = |m: &Value| {
        m["content"].as_str().is_some_and(|c| {
            (c.starts_with("[output of") || c.starts_with("[duplicate output of"))
                && !c.contains('\n')
        })
    };
    let mut checked = 0;
    for &n in &taken.events {
        if !taken.turns[n].0.contains("summary=none") {
            continue;
        }
        let (before, now) = (&taken.sent[n - 1], &taken.sent[n]);
        let first = before
            .iter()
            .zip(now)
            .position(|(a, b)| a != b)
            .unwrap_or(before.len());
        let turn = now.iter().rposition(|m| m["role"] == "user").unwrap();
        let whole: Vec<usize> = (first..turn)
            .filter(|&i| output(&now[i]) && !pruned(&now[i]))
            .collect();
        assert!(
            whole.is_empty(),
            "turn {n}: messages {whole:?} after the first changed, {first}, are not pruned: events at {:?}",
            taken.events
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "events at {:?}, {:#?}",
        taken.events,
        taken.turns
    );
}

#[tokio::test]
async fn with_the_window_configured_an_event_prunes_every_output_after_its_first_change() {
    let config = configured("mock-agent-model");
    let taken = tool_session(&config, 40, 50, 8).await;
    events_prune_all_after_their_first_change(&taken);
}

#[tokio::test]
async fn with_the_window_learned_an_event_prunes_every_output_after_its_first_change() {
    let taken = tool_session(LEARNED, 40, 50, 8).await;
    events_prune_all_after_their_first_change(&taken);
}

/// Turn `n` of a session that writes files: the ask, a call writing `chars` characters of
/// source and a test run with `lines` lines of output, and the outputs.
fn writing_turn(n: usize, chars: usize, lines: usize) -> Vec<Value> {
    let (write, run) = (format!("write_{n}"), format!("run_{n}"));
    let source: String = (0..)
        .map(|i| format!("    let value_{i} = compute_{n}(input, {i}); // step {i}\n"))
        .take_while({
            let mut len = 0;
            move |line: &String| {
                len += line.len();
                len <= chars
            }
        })
        .collect();
    let output: String = (0..lines)
        .map(|i| format!("test module_{n}::case_{i:03} ... ok (took {i:03} ms)\n"))
        .collect();
    vec![
        json!({"role": "user", "content": format!("Turn {n}: fix module {n}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": write, "type": "function", "function": {"name": "write_file",
                "arguments": json!({"path": format!("src/module_{n}.rs"), "content": source}).to_string()}},
            {"id": run, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
        json!({"role": "tool", "tool_call_id": write, "content": format!("Wrote src/module_{n}.rs.")}),
        json!({"role": "tool", "tool_call_id": run, "content": output}),
    ]
}

/// What a pruned turn leaves in every later prompt: its ask, its calls with their
/// arguments cut, the one-line stubs of its outputs. That pile grows with every turn an
/// event prunes, and once what an event prunes since the last one no longer makes room,
/// it must reach into the older history the first event kept and rewrite all of it (in
/// bench/events.py's roomy session, about 400 of the mock's tokens a turn, and most
/// 40-turn runs had one such event). Here a turn of about 3,200 of the mock's tokens
/// leaves about 150 (before: about 220, the arguments keeping 300 characters of the file
/// and the stub the output's size in characters beside its lines).
fn a_pruned_turn_leaves_little_behind(taken: &Taken) {
    let last = taken.sent.last().unwrap();
    let stub = |m: &Value| {
        m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("[output of"))
    };
    let asks: Vec<usize> = (0..last.len())
        .filter(|&i| last[i]["role"] == "user")
        .collect();
    let mut checked = 0;
    for pair in asks.windows(2) {
        let turn = &last[pair[0]..pair[1]];
        if !turn.iter().any(stub) {
            continue;
        }
        let tokens = support::mock_tokens(&json!({ "messages": turn }));
        assert!(tokens <= 160, "{tokens} tokens: {turn:#?}");
        checked += 1;
    }
    assert!(
        checked >= 4,
        "{checked} pruned turns, events at {:?}",
        taken.events
    );
}

#[tokio::test]
async fn with_the_window_configured_a_pruned_turn_leaves_little_behind() {
    let config = configured("mock-agent-model");
    let turn = |n| writing_turn(n, 6_000, 80);
    let taken = drive(CODING_AGENT, &config, 16, turn, |n| {
        format!("Module {n} fixed.")
    })
    .await;
    a_pruned_turn_leaves_little_behind(&taken);
}

#[tokio::test]
async fn with_the_window_learned_a_pruned_turn_leaves_little_behind() {
    let config = LEARNED;
    let turn = |n| writing_turn(n, 6_000, 80);
    let taken = drive(CODING_AGENT, config, 16, turn, |n| {
        format!("Module {n} fixed.")
    })
    .await;
    a_pruned_turn_leaves_little_behind(&taken);
}
