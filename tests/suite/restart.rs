//! The embedded store (the default): a proxy killed mid-session (SIGKILL, no shutdown) and
//! started again on the same file resumes every conversation from its checkpoint, with the
//! same bytes and no summariser call, and remembers the window it learned; and the
//! `cache` command reads and clears that file while a proxy uses it.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use support::{compacted_part, post_chat, tempdir, Mock, Proxy};

/// The upstream's window, in the mock's tokens. The proxy is not told it: it learns it
/// from the upstream's first refusal.
const WINDOW: u64 = 6000;
const KEY: &str = "sk-restart-tenant";

fn round(n: usize) -> Vec<Value> {
    let id = format!("call_{n}");
    vec![
        json!({"role": "user", "content": format!("Turn {n}: module {n} fails; fix src/module_{n}.rs. {}", "Context. ".repeat(40))}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": format!("test module_{n} ... ok\n{}", "log line\n".repeat(60))}),
        json!({"role": "assistant", "content": format!("Module {n} fixed in src/module_{n}.rs.")}),
    ]
}

fn config(file: &Path) -> String {
    format!(
        "[summarizer]\ncontext_window = 128000\n\n[cache]\npath = \"{}\"\n",
        file.display()
    )
}

async fn send(proxy: &Proxy, history: &[Value]) -> (u16, String) {
    let window = WINDOW.to_string();
    let headers = [
        ("authorization", &*format!("Bearer {KEY}")),
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window.as_str()),
        ("x-mock-summary-delay-ms", "50"),
    ];
    let request = json!({"model": "mock-agent-model", "messages": history});
    post_chat(proxy, &headers, &request).await
}

/// Plays turns on `proxy` until one is served from the cache; returns the history sent.
async fn play_until_cached(proxy: &Proxy, mock: &Mock, history: &mut Vec<Value>) -> String {
    for n in history.len()..history.len() + 60 {
        history.extend(round(n));
        history.pop();
        let (status, x) = send(proxy, history).await;
        assert_eq!(status, 200, "turn {n}: {x}\n{}", proxy.logs());
        assert!(mock.state.violations.lock().unwrap().is_empty());
        history.push(json!({"role": "assistant", "content": format!("Module {n} fixed.")}));
        if x.contains("summary=cache") {
            return x;
        }
    }
    panic!("no turn was served from the cache:\n{}", proxy.logs());
}

fn cache_command(config: &Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["cache", "--config"])
        .arg(config)
        .args(args)
        .env("RESTART_TENANT_KEY", KEY)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn a_killed_proxy_s_successor_resumes_the_conversation_from_its_checkpoint() {
    let mock = Mock::start().await;
    let dir = tempdir();
    let file = dir.join("state").join("cache.sqlite3");
    let mut first = Proxy::start(&mock.url("/v1"), &config(&file));
    let mut history = Vec::new();
    play_until_cached(&first, &mock, &mut history).await;
    let summaries = mock.summaries().len();
    // The checkpoint holds a summary: the summariser's, or the digest that stood in for it
    // on the turn whose refusal taught the window (this conversation's next event would be
    // prepared with the summariser); the summary's end marker is found in either.
    let before = compacted_part(&mock.last().body).expect("a summarised request");

    // No shutdown: the process is gone between two turns.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = Proxy::start(&mock.url("/v1"), &config(&file));
    let sent = mock.recorded().len();
    history.extend(round(100));
    history.pop();
    let (status, x) = send(&second, &history).await;
    assert_eq!(status, 200, "{x}\n{}", second.logs());
    assert!(x.contains("summary=cache"), "{x}\n{}", second.logs());
    // The window was remembered too: the resumed request went once, and fitted.
    assert!(x.contains("trigger=preflight; attempts=1;"), "{x}");
    assert_eq!(mock.recorded().len(), sent + 1);
    assert_eq!(mock.summaries().len(), summaries, "no summariser call");
    assert!(
        compacted_part(&mock.last().body).expect("a compacted request") == before,
        "the compacted part is the same bytes as before the restart"
    );
    let metrics = support::metrics(&second).await;
    assert!(
        metrics.contains(
            "compaction_proxy_store_lookups_total{backend=\"embedded\",result=\"hit\"} 1\n"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_cache_command_reads_and_clears_the_file_a_running_proxy_uses() {
    let mock = Mock::start().await;
    let dir = tempdir();
    let file = dir.join("cache.sqlite3");
    let config_path = dir.join("proxy.toml");
    std::fs::write(&config_path, config(&file)).unwrap();
    let proxy = Proxy::start(&mock.url("/v1"), &config(&file));
    let mut history = Vec::new();
    play_until_cached(&proxy, &mock, &mut history).await;

    let stats = cache_command(&config_path, &["stats"]);
    assert!(stats.contains("backend: embedded"), "{stats}");
    assert!(stats.contains("checkpoints: 1\n"), "{stats}");
    assert!(stats.contains("tenants: 1\n"), "{stats}");
    assert!(stats.contains("models: 1\n"), "the learned window: {stats}");

    let cleared = cache_command(
        &config_path,
        &["clear", "--tenant-key-env", "RESTART_TENANT_KEY"],
    );
    assert!(cleared.starts_with("cleared 1 checkpoints"), "{cleared}");
    assert!(cache_command(&config_path, &["stats"]).contains("checkpoints: 0\n"));

    // The running proxy finds the checkpoint gone and compacts the conversation anew.
    let summaries = mock.summaries().len();
    history.extend(round(100));
    history.pop();
    let (status, x) = send(&proxy, &history).await;
    assert_eq!(status, 200, "{x}");
    assert!(!x.contains("summary=cache"), "{x}");
    assert!(mock.summaries().len() > summaries);
}

#[test]
fn a_cache_file_that_cannot_be_created_stops_the_proxy_with_a_clear_message() {
    let dir = tempdir();
    let blocker = dir.join("not-a-folder");
    std::fs::write(&blocker, "a file").unwrap();
    let config_path = dir.join("proxy.toml");
    std::fs::write(&config_path, config(&blocker.join("cache.sqlite3"))).unwrap();
    let stderr = support::refused_config(&config_path);
    assert!(stderr.contains("cache.path"), "{stderr}");
    assert!(stderr.contains("not-a-folder"), "{stderr}");
}

/// A write the file holds back past the store's time limit (the `cache` command holding
/// the file's lock, or a disk slow to sync under load) still lands, and the store stays in
/// use: the conversation's next turn is resumed from the checkpoint written late, its
/// request extending the event's byte for byte. Before, the late write counted as an
/// outage: the store went unasked for a second, and every turn in it was compacted anew
/// from the client's messages, each one more rewrite of the prompt the upstream had cached
/// (the four events in a row of a flaky `suite::events` run).
#[tokio::test]
async fn a_write_held_back_past_the_time_limit_lands_and_the_next_turn_is_resumed() {
    let mock = Mock::start().await;
    let dir = tempdir();
    let file = dir.join("cache.sqlite3");
    let proxy = Proxy::start(&mock.url("/v1"), &config(&file));
    let holder = hold_write_lock(&file);
    let mut history = Vec::new();
    let event = play_until_event(&proxy, &mock, &mut history).await;
    // The event was answered without its write, which the lock holds back still.
    assert!(proxy.logged("a write to the checkpoint store is late"));
    holder.execute_batch("ROLLBACK").unwrap();
    // Waited for, not raced: a turn looked up before the write lands finds no row.
    wait_for_a_row(&holder, &proxy).await;
    assert_eq!(rows(&holder), 1);
    history.extend(round(100));
    history.pop();
    let (status, x) = send(&proxy, &history).await;
    assert_eq!(status, 200, "{x}");
    let (event, next) = (body_messages(&event.body), body_messages(&mock.last().body));
    assert!(
        next.starts_with(event.trim_end_matches(']')),
        "the turn after the event was not resumed from its checkpoint: {x}\n{}",
        proxy.logs()
    );
}

/// A turn looked up while the event's write is still held back finds the checkpoint in
/// the index but no row in the file yet. It is resumed from the checkpoint being written,
/// and the checkpoint stays indexed, so that the turns after the write lands are resumed
/// from it too. Before, that lookup dropped the checkpoint from the index as cleared by
/// another process: the turn and every one after it until a restart were compacted anew
/// (a rewrite of the prompt the upstream had cached, and a summariser call), although the
/// write landed a moment later.
#[tokio::test]
async fn a_turn_looked_up_before_a_late_write_lands_keeps_the_checkpoint_for_the_next() {
    let mock = Mock::start().await;
    let dir = tempdir();
    let file = dir.join("cache.sqlite3");
    let proxy = Proxy::start(&mock.url("/v1"), &config(&file));
    let holder = hold_write_lock(&file);
    let mut history = Vec::new();
    let event = play_until_event(&proxy, &mock, &mut history).await;
    let event = body_messages(&event.body);
    let summaries = mock.summaries().len();

    history.extend(round(100));
    history.pop();
    let (status, x) = send(&proxy, &history).await;
    assert_eq!(status, 200, "{x}");
    // The lock was held over the whole turn: its lookup found no row.
    assert_eq!(rows(&holder), 0, "the write landed before the lookup");
    let looked_up_early = body_messages(&mock.last().body);
    history.push(json!({"role": "assistant", "content": "Module 100 fixed."}));
    holder.execute_batch("ROLLBACK").unwrap();
    wait_for_a_row(&holder, &proxy).await;

    history.extend(round(101));
    history.pop();
    let (status, x) = send(&proxy, &history).await;
    assert_eq!(status, 200, "{x}");
    let landed = body_messages(&mock.last().body);
    for (turn, sent) in [("looked up early", looked_up_early), ("after", landed)] {
        assert!(
            sent.starts_with(event.trim_end_matches(']')),
            "the turn {turn} was not resumed from the event's checkpoint: {x}\n{}",
            proxy.logs()
        );
    }
    assert_eq!(mock.summaries().len(), summaries, "no summariser call");
}

/// Another connection takes the file's write lock: the proxy's writes wait for it.
fn hold_write_lock(file: &Path) -> rusqlite::Connection {
    let holder = rusqlite::Connection::open(file).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    holder
}

/// Plays turns until one is an event; returns its request as the upstream took it. The
/// first event is the refused turn that teaches the window: with the write lock held, its
/// checkpoint is the proxy's first write, held back.
async fn play_until_event(
    proxy: &Proxy,
    mock: &Mock,
    history: &mut Vec<Value>,
) -> support::Recorded {
    for n in 0..60 {
        history.extend(round(n));
        history.pop();
        let (status, x) = send(proxy, history).await;
        assert_eq!(status, 200, "turn {n}: {x}\n{}", proxy.logs());
        history.push(json!({"role": "assistant", "content": format!("Module {n} fixed.")}));
        if x.contains("applied") {
            return mock.last();
        }
    }
    panic!("no event:\n{}", proxy.logs());
}

/// The checkpoints in the file, as `connection` sees them.
fn rows(connection: &rusqlite::Connection) -> i64 {
    connection
        .query_row("SELECT count(*) FROM checkpoints", [], |row| row.get(0))
        .unwrap()
}

/// Polls the file until the held-back write has landed in it.
async fn wait_for_a_row(connection: &rusqlite::Connection, proxy: &Proxy) {
    for _ in 0..1000 {
        if rows(connection) > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the held-back write never landed:\n{}", proxy.logs());
}

/// The messages of a request the upstream took, as JSON text.
fn body_messages(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body).unwrap()["messages"].to_string()
}
