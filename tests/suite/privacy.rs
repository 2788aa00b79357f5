//! Conversations at rest are private. After a session through a proxy started under a
//! permissive umask (000), its state folder is its user's alone (0700) and the database
//! with its WAL and shared memory too (0600); none of them holds the conversation's text
//! (checkpoints are sealed with a key of the tenant's credential); a request with another
//! key never resumes the first tenant's conversation; and a checkpoint altered in the file
//! is a miss, logged, never an error to the client.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use support::{agent_round, tempdir, window_turn, Mock, Proxy};

const WINDOW: u64 = 6000;
const KEY: &str = "Bearer sk-private-tenant";

/// Texts of the conversation that must never be found in the clear at rest.
const SECRETS: [&str; 4] = [
    "You are the agent of the private tenant",
    "please fix src/module_",
    "had an off-by-one",
    "assertion failed",
];

/// Starts the proxy as `Proxy::start` does, but under umask 000, with its state (the
/// default place of the embedded store) under `state`.
fn start_permissive(upstream: &str, state: &Path) -> Proxy {
    let dir = tempdir();
    let config = dir.join("proxy.toml");
    std::fs::write(&config, "[summarizer]\ncontext_window = 128000\n").unwrap();
    let mut command = Command::new("sh");
    command
        .args(["-c", "umask 000 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", upstream])
        .arg("--config")
        .arg(&config)
        .current_dir(&dir)
        .env_remove("RUST_LOG")
        .env("XDG_STATE_HOME", state);
    Proxy::spawn(&mut command)
}

fn ask(n: usize) -> Value {
    json!({"role": "user", "content": format!(
        "Turn {n}: the test of module {n} fails; please fix src/module_{n}.rs and rerun it."
    )})
}

async fn send(proxy: &Proxy, credential: &str, history: &[Value]) -> String {
    let request = json!({"model": "mock-agent-model", "messages": history});
    let (status, x) = window_turn(proxy, credential, WINDOW, "ok", 0, &request).await;
    assert_eq!(status, 200, "{x}\n{}", proxy.logs());
    x
}

/// Plays turns until one is served from the cache; the history then ends on an ask.
async fn play_until_cached(proxy: &Proxy, history: &mut Vec<Value>) {
    for n in 0..60 {
        history.push(ask(n));
        let x = send(proxy, KEY, history).await;
        if x.contains("summary=cache") {
            return;
        }
        history.extend(agent_round(n));
    }
    panic!("no turn was served from the cache:\n{}", proxy.logs());
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

fn holds(path: &Path, text: &str) -> bool {
    let bytes = std::fs::read(path).unwrap_or_default();
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

#[tokio::test]
async fn a_session_leaves_its_owner_alone_able_to_read_the_store_and_no_text_in_it() {
    let mock = Mock::start().await;
    let state = tempdir();
    let proxy = start_permissive(&mock.url("/v1"), &state);
    let mut history = vec![json!({"role": "system", "content": SECRETS[0]})];
    play_until_cached(&proxy, &mut history).await;

    let folder = state.join("compaction-proxy");
    let file = folder.join("cache.sqlite3");
    let files = [
        file.clone(),
        with_suffix(&file, "-wal"),
        with_suffix(&file, "-shm"),
    ];
    let modes: Vec<String> = std::iter::once(&folder)
        .chain(&files)
        .map(|p| format!("{} {:o}", p.display(), mode(p)))
        .collect();
    eprintln!("under umask 000:\n{}", modes.join("\n"));
    assert_eq!(mode(&folder), 0o700, "{modes:?}");
    for path in &files {
        assert_eq!(mode(path), 0o600, "{modes:?}");
    }
    for path in &files {
        for text in SECRETS {
            assert!(!holds(path, text), "{text:?} is in {}", path.display());
        }
    }

    // Another key, the same conversation: never resumed from the first tenant's checkpoint.
    let x = send(&proxy, "Bearer sk-another-tenant", &history).await;
    assert!(!x.contains("summary=cache"), "{x}");
    // The first tenant's key still resumes it.
    let x = send(&proxy, KEY, &history).await;
    assert!(x.contains("summary=cache"), "{x}");
}

#[tokio::test]
async fn an_altered_checkpoint_is_a_miss_and_is_logged() {
    let mock = Mock::start().await;
    let state = tempdir();
    let mut first = start_permissive(&mock.url("/v1"), &state);
    let mut history = vec![json!({"role": "system", "content": SECRETS[0]})];
    play_until_cached(&first, &mut history).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    // One bit of every stored checkpoint flipped, past the seal's header.
    let file = state.join("compaction-proxy").join("cache.sqlite3");
    let connection = rusqlite::Connection::open(&file).unwrap();
    let rows: Vec<(Vec<u8>, Vec<u8>)> = connection
        .prepare("SELECT rowid, value FROM checkpoints")
        .unwrap()
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)?.to_be_bytes().to_vec(), row.get(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!rows.is_empty());
    for (rowid, mut value) in rows {
        assert!(value.starts_with(b"\0cs1"), "stored sealed");
        let last = value.len() - 1;
        value[last] ^= 1;
        let rowid = i64::from_be_bytes(rowid.try_into().unwrap());
        connection
            .execute(
                "UPDATE checkpoints SET value = ?1 WHERE rowid = ?2",
                rusqlite::params![value, rowid],
            )
            .unwrap();
    }
    drop(connection);

    let second = start_permissive(&mock.url("/v1"), &state);
    let x = send(&second, KEY, &history).await;
    assert!(!x.contains("summary=cache"), "{x}");
    assert!(
        second.logged("unreadable and is ignored"),
        "{}",
        second.logs()
    );
}
