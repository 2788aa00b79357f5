//! Real clients, unmodified, pointed at the proxy with their usual base-URL setting.
//!
//! The clients live in a virtualenv made by `scripts/setup-clients.sh` (CI runs it).
//! Without it these tests say so and pass, unless `COMPACTION_PROXY_REQUIRE_CLIENTS`
//! is set (as `scripts/test.sh` and CI do), in which case a missing client fails.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::{Mock, Proxy};

fn python() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let python = std::env::var_os("COMPACTION_PROXY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or(venv);
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var_os("COMPACTION_PROXY_REQUIRE_CLIENTS").is_none(),
        "{} is missing: run scripts/setup-clients.sh",
        python.display()
    );
    eprintln!(
        "skipping: {} is missing (run scripts/setup-clients.sh)",
        python.display()
    );
    None
}

#[tokio::test]
async fn openai_python_sdk_chat_stream_and_models() {
    let Some(python) = python() else { return };
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

/// Runs a session script of `tests/clients/` with the SDK pointed at a proxy in front of
/// a fresh mock: the SDK must see no error, and the upstream no invalid request.
async fn sdk_session(script: &str) {
    let Some(python) = python() else { return };
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::from(Command::new(python))
        .arg(path)
        .env("OPENAI_BASE_URL", proxy.url("/v1"))
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
}

#[tokio::test]
async fn openai_python_sdk_long_streaming_session_never_sees_an_overflow() {
    sdk_session("openai_sdk_session.py").await;
}

#[tokio::test]
async fn openai_python_sdk_responses_session_never_sees_an_overflow() {
    sdk_session("openai_sdk_responses.py").await;
}
