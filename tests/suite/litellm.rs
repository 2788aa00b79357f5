//! LiteLLM's proxy (`litellm[proxy]`, installed by `scripts/setup-litellm.sh`) on either
//! side of compaction-proxy, one long agent session each, against the mock upstream's
//! window:
//!
//! - in front: client -> LiteLLM -> compaction-proxy -> upstream. The proxy knows the
//!   model's window and compacts before sending; LiteLLM sees only answers.
//! - behind: client -> compaction-proxy -> LiteLLM -> upstream. The proxy is not told the
//!   window: it learns it from the upstream's refusal as LiteLLM wraps it
//!   (`litellm.ContextWindowExceededError: ... OpenAIException - This model's maximum
//!   context length is ...`), compacts and retries.
//!
//! Every turn must answer 200. LiteLLM is found at `COMPACTION_PROXY_LITELLM` or where the
//! setup script puts it; without it the tests skip, unless `COMPACTION_PROXY_REQUIRE_CLIENTS`
//! is set (as `scripts/test.sh` sets it): then they fail.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{client, compacted_part, metrics, tempdir, Mock, Proxy};

/// The version `scripts/setup-litellm.sh` installs.
const LITELLM_VERSION: &str = "1.106.12";
/// The upstream's window, in the mock's tokens.
const WINDOW: u64 = 6000;
const TURNS: usize = 30;
/// LiteLLM refuses to start without a master key; clients present it.
const MASTER_KEY: &str = "sk-litellm-test-7f3a9c2e5b1d8f4a6c0e2b9d";

/// The `litellm` command, or `None` (the test skips, saying why).
fn litellm() -> Option<PathBuf> {
    let installed = std::env::var_os("COMPACTION_PROXY_LITELLM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("COMPACTION_PROXY_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/compaction-proxy")
                });
            cache.join(format!("litellm-{LITELLM_VERSION}/bin/litellm"))
        });
    if installed.exists() {
        return Some(installed);
    }
    support::Needs::Clients.missing(
        &format!("{} is missing", installed.display()),
        "run scripts/setup-litellm.sh",
    )
}

/// A running `litellm` proxy, stopped (by its own process id) when dropped.
struct LiteLlm {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl LiteLlm {
    /// Starts LiteLLM with one model, `mock-agent-model`, served by `api_base`, the mock's
    /// headers added to every call it makes; waits until it answers.
    async fn start(command: &PathBuf, api_base: &str) -> Self {
        let dir = tempdir();
        let config = format!(
            "model_list:\n  - model_name: mock-agent-model\n    litellm_params:\n      model: openai/mock-agent-model\n      api_base: {api_base}\n      api_key: sk-fake-upstream-key\n      extra_headers: {{x-mock: window, x-mock-shape: openai, x-mock-window: \"{WINDOW}\"}}\nlitellm_settings:\n  num_retries: 0\n  telemetry: false\nrouter_settings:\n  num_retries: 0\ngeneral_settings:\n  master_key: {MASTER_KEY}\n"
        );
        let config_path = dir.join("litellm.yaml");
        std::fs::write(&config_path, config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join("litellm.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(command)
            .arg("--config")
            .arg(&config_path)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .current_dir(&dir)
            // No telemetry, no fetch of the model cost map, no database.
            .env("LITELLM_TELEMETRY", "False")
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env_remove("DATABASE_URL")
            .env_remove("LITELLM_MASTER_KEY")
            .env("NO_PROXY", "*")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start litellm");
        let mut litellm = Self { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let alive = client()
                .get(litellm.url("/health/liveliness"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if alive {
                return litellm;
            }
            let exited = litellm.child.try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "litellm did not start ({exited:?}):\n{}",
                litellm.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LiteLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One round of the session after ask `n`: a tool call with a long output, then the
/// agent's reply.
fn round(n: usize) -> Vec<Value> {
    let id = format!("call_{n}");
    let output: String = (0..12)
        .map(|i| format!("test module_{n}::case_{i} ... FAILED: left == right (left: {i})\n"))
        .collect();
    vec![
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": output}),
        json!({"role": "assistant", "content": format!("Module {n} had an off-by-one; fixed in src/module_{n}.rs.")}),
    ]
}

/// Plays the session against `chat` (a chat completions URL), the whole history each turn
/// as a client sends it; every turn must answer 200 with the mock's reply.
async fn play(chat: &str, logs: impl Fn() -> String) {
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for n in 0..TURNS {
        let ask = format!("Turn {n}: the test of module {n} fails; please fix it.");
        history.push(json!({"role": "user", "content": ask}));
        let response = client()
            .post(chat)
            .bearer_auth(MASTER_KEY)
            .json(&json!({"model": "mock-agent-model", "messages": history}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert_eq!(status, 200, "turn {n}: {body}\n{}", logs());
        let answer: Value = serde_json::from_str(&body).unwrap();
        let reply = answer["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(reply.contains(&format!("Turn {n}:")), "turn {n}: {reply}");
        history.extend(round(n));
    }
}

/// The value of the metric line that starts with `name` (labels included), 0 when absent.
fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// What the upstream received: the turns (the summariser's calls apart), how many were
/// compacted, and the largest request in the mock's tokens.
fn upstream(mock: &Mock) -> (usize, usize, u64) {
    // LiteLLM also lists the models at start-up.
    let sent: Vec<_> = mock
        .recorded()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    let compacted = sent
        .iter()
        .filter(|r| compacted_part(&r.body).is_some())
        .count();
    let largest = sent
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .map(|v| support::mock_tokens(&v))
        .max()
        .unwrap_or(0);
    (sent.len(), compacted, largest)
}

#[tokio::test]
async fn litellm_in_front_of_the_proxy_keeps_a_long_session_alive() {
    let Some(command) = litellm() else { return };
    let mock = Mock::start().await;
    let config = format!(
        "[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {WINDOW}\n\n[summarizer]\ncontext_window = 128000\n"
    );
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let litellm = LiteLlm::start(&command, &proxy.url("/v1")).await;
    let logs = || format!("{}\n{}", proxy.logs(), litellm.logs());

    play(&litellm.url("/v1/chat/completions"), logs).await;

    let (turns, compacted, largest) = upstream(&mock);
    assert_eq!(turns, TURNS, "one upstream call per turn\n{}", logs());
    assert!(compacted >= 1, "no compacted request reached the upstream");
    assert!(largest <= WINDOW, "{largest} tokens reached the upstream");
    assert!(!mock.summaries().is_empty());
    assert!(mock.state.violations.lock().unwrap().is_empty());
    let metrics = metrics(&proxy).await;
    let preflight = metric(
        &metrics,
        "compaction_proxy_compactions_total{trigger=\"preflight\"}",
    );
    assert!(preflight >= 1.0, "{metrics}");
}

#[tokio::test]
async fn the_proxy_in_front_of_litellm_reads_its_wrapped_overflow() {
    let Some(command) = litellm() else { return };
    let mock = Mock::start().await;
    let litellm = LiteLlm::start(&command, &mock.url("/v1")).await;
    // Not told the window: the proxy learns it from LiteLLM's wrapped refusal.
    let proxy = Proxy::start(
        &litellm.url("/v1"),
        "[summarizer]\ncontext_window = 128000\n",
    );
    let logs = || format!("{}\n{}", proxy.logs(), litellm.logs());

    play(&proxy.url("/v1/chat/completions"), logs).await;

    let (turns, compacted, largest) = upstream(&mock);
    assert!(compacted >= 1, "no compacted request reached the upstream");
    // Refused turns reached the upstream once more than the others.
    assert!(turns > TURNS, "the upstream never refused a turn");
    assert!(largest > WINDOW, "the upstream never refused a turn");
    let metrics = metrics(&proxy).await;
    // A summary was made: by the summariser (through LiteLLM), or, on the refused turn of
    // this followed conversation, by the digest standing in for it without a wait.
    let summaries = ["llm", "fallback"]
        .map(|source| {
            let name = format!("compaction_proxy_summaries_total{{source=\"{source}\"}}");
            metric(&metrics, &name)
        })
        .iter()
        .sum::<f64>();
    assert!(summaries >= 1.0, "{metrics}");
    let on_error = metric(
        &metrics,
        "compaction_proxy_compactions_total{trigger=\"error\"}",
    );
    assert!(on_error >= 1.0, "{metrics}");
}
