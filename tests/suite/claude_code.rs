//! Claude Code, the real CLI (`scripts/setup-clients.sh` installs it in `.clients/`), run
//! headless as a new user runs it: a fresh home, a git workspace, the proxy as
//! `ANTHROPIC_BASE_URL` and a dummy key; `claude -p` for the first turn, `claude -c -p`
//! for each later one. The mock upstream plays Anthropic's Messages API with a small
//! window and answers as a model driving the agent would: each turn runs a command whose
//! long output Claude Code sends back, so its history outgrows the window twice over.
//! The session must live without a single `prompt is too long` reaching Claude Code,
//! whether its own compaction is off (the proxy alone keeps the session alive) or on (it
//! never has to step in, and when asked to, with `/compact`, its request for a summary of
//! the whole history is compacted too).
//!
//! Without Claude Code installed these tests say so and pass, unless
//! `COMPACTION_PROXY_REQUIRE_CLIENTS` is set (as `scripts/test.sh` and CI do).

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::anthropic::{AGENT_SUMMARY, OWN_COMPACTION};
use support::{metrics, Mock, Proxy, Recorded};

/// The mock's window, in its own tokens. Claude Code's first request (system prompt,
/// tools, environment) takes about 15,000 of them: the window holds that and one turn
/// with its command's output, not two.
const WINDOW: u64 = 24_000;

/// Turns of the session: the first with `claude -p`, the others with `claude -c -p`.
const TURNS: usize = 8;

/// A command with long, deterministic, harmless output: about 16,000 characters, 5,500
/// of the mock's tokens, which Claude Code runs in its workspace and sends back whole.
fn command(turn: usize) -> String {
    format!("seq -f 'turn {turn}, line %g of the build log: module compiled, tests passed' 1 250")
}

/// Claude Code, the installed npm package (a native binary).
fn claude() -> Option<PathBuf> {
    support::installed_client("node_modules/.bin/claude", Some("COMPACTION_PROXY_CLAUDE"))
}

/// A Claude Code session in a workspace of its own, through `proxy`.
struct Session {
    claude: PathBuf,
    workspace: PathBuf,
    env: HashMap<&'static str, String>,
}

impl Session {
    /// `own_compaction: false` sets `DISABLE_COMPACT=1`, Claude Code's switch for its
    /// own (reactive and automatic) compaction.
    fn new(claude: PathBuf, proxy: &Proxy, own_compaction: bool) -> Self {
        let dir = support::tempdir();
        let (home, workspace) = (dir.join("home"), dir.join("workspace"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        let git = Command::new("git")
            .args(["init", "-q"])
            .current_dir(&workspace)
            .status()
            .unwrap();
        assert!(git.success());
        let base = proxy.url("");
        let mut env = HashMap::from([
            ("HOME", home.display().to_string()),
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("ANTHROPIC_BASE_URL", base),
            ("ANTHROPIC_API_KEY", "sk-ant-dummy".to_owned()),
            ("DISABLE_TELEMETRY", "1".to_owned()),
            ("DISABLE_AUTOUPDATER", "1".to_owned()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
            ("DISABLE_ERROR_REPORTING", "1".to_owned()),
            // How the mock is told to play Anthropic with a small window and answer as
            // an agent's model; the proxy forwards these headers untouched.
            (
                "ANTHROPIC_CUSTOM_HEADERS",
                format!("x-mock: window\nx-mock-window: {WINDOW}\nx-mock-answer: agent"),
            ),
        ]);
        if !own_compaction {
            env.insert("DISABLE_COMPACT", "1".to_owned());
        }
        Session {
            claude,
            workspace,
            env,
        }
    }

    /// Turn `n`: asks for [`command`]`(n)` to be run and reported on. The turn must end
    /// as a success: Bash allowed, and the mock's final answer as the result.
    async fn turn(&self, n: usize, proxy: &Proxy) {
        let prompt = format!(
            "step {n}: run `{}` and tell me whether every module compiled",
            command(n)
        );
        let result = self
            .claude(&format!("turn {n}"), n > 0, &prompt, proxy)
            .await;
        assert_eq!(result["subtype"], "success", "turn {n}: {result}");
        assert_eq!(result["terminal_reason"], "completed", "turn {n}: {result}");
        assert_eq!(
            result["permission_denials"],
            json!([]),
            "turn {n}: Bash refused"
        );
        let answer = result["result"].as_str().unwrap_or_default();
        assert!(answer.starts_with("MOCK-AGENT"), "turn {n}: {result}");
    }

    /// `claude -p PROMPT` (`-c`: continuing the workspace's last session); Claude Code's
    /// JSON result, after checking that it exited 0 with a result that is not an error.
    async fn claude(&self, what: &str, resume: bool, prompt: &str, proxy: &Proxy) -> Value {
        let mut command = Command::new(&self.claude);
        // Nothing of the environment the tests run in reaches Claude Code (a key, a
        // model, a config directory of the engineer's): only what a new user sets.
        command
            .current_dir(&self.workspace)
            .env_clear()
            .envs(&self.env)
            .args(if resume {
                &["-c", "-p"][..]
            } else {
                &["-p"][..]
            })
            .arg(prompt)
            .args(["--output-format", "json", "--allowedTools", "Bash"])
            .stdin(Stdio::null());
        let started = Instant::now();
        let output = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::process::Command::from(command)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: Claude Code still running after 120 s"))
        .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let result: Value = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
        assert!(
            output.status.success() && result["is_error"] == false,
            "{what}: Claude Code failed ({}):\n{stdout}\n{stderr}\nproxy logs:\n{}",
            output.status,
            proxy.logs()
        );
        eprintln!(
            "{what}: {:.1} s, {:.60}",
            started.elapsed().as_secs_f64(),
            result["result"].as_str().unwrap_or_default()
        );
        result
    }
}

/// A whole session: the first turn with `claude -p`, the others with `claude -c -p`.
async fn session(own_compaction: bool) -> Option<(Mock, Proxy, Session)> {
    let claude = claude()?;
    let mock = Mock::start().await;
    // As a new user runs it: the proxy is told nothing of the model's window.
    let proxy = Proxy::start(&mock.url(""), "");
    let session = Session::new(claude, &proxy, own_compaction);
    let started = Instant::now();
    for n in 0..TURNS {
        session.turn(n, &proxy).await;
    }
    eprintln!(
        "{TURNS} turns in {:.1} s, {} requests upstream",
        started.elapsed().as_secs_f64(),
        mock.recorded().len()
    );
    Some((mock, proxy, session))
}

/// The Messages requests the mock received (the proxy's summariser calls aside).
fn requests(mock: &Mock) -> Vec<Value> {
    let is_messages = |r: &Recorded| r.uri.starts_with("/v1/messages?") || r.uri == "/v1/messages";
    mock.recorded()
        .iter()
        .filter(|r| is_messages(r))
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// The output of each command Claude Code ran, by the turn that asked for it, as it came
/// back to the model in a `tool_result` (whole, at least once: in the turn that ran it).
fn command_outputs(requests: &[Value]) -> Vec<Option<String>> {
    let mut outputs: Vec<Option<String>> = vec![None; TURNS];
    let results = requests
        .iter()
        .flat_map(|r| r["messages"].as_array().unwrap())
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .filter(|b| b["type"] == "tool_result");
    for block in results {
        let output = block["content"].as_str().unwrap_or_default();
        let turn = (0..TURNS).find(|n| output.starts_with(&format!("turn {n}, line 1 ")));
        // The proxy may send an older output cut short: the longest is what ran.
        if let Some(n) = turn {
            if outputs[n].as_ref().is_none_or(|o| o.len() < output.len()) {
                outputs[n] = Some(output.to_owned());
            }
        }
    }
    outputs
}

/// The session's history as Claude Code held it at the end, counted as the mock counts:
/// at least its first request (system prompt, tools, instructions) and every command's
/// output.
fn history_tokens(requests: &[Value], outputs: &[Option<String>]) -> u64 {
    let mut history = requests[0].clone();
    let messages = history["messages"].as_array_mut().unwrap();
    for output in outputs.iter().flatten() {
        messages
            .push(json!({"role": "user", "content": [{"type": "tool_result", "content": output}]}));
    }
    support::anthropic::tokens(&history)
}

/// Requests of Claude Code's own compaction: the whole conversation, and a last user
/// message asking for a summary without tools.
fn own_compactions(requests: &[Value]) -> Vec<&Value> {
    requests
        .iter()
        .filter(|r| {
            let last = r["messages"].as_array().and_then(|m| m.last());
            last.is_some_and(|m| m["content"].to_string().contains(OWN_COMPACTION))
        })
        .collect()
}

/// The proxy's answers to Claude Code's Messages requests that were not a 200, from its
/// `answered` log lines: a `prompt is too long` would be one of them.
fn errors_answered(proxy: &Proxy) -> Vec<String> {
    assert!(proxy.logged("answered"), "{}", proxy.logs());
    proxy
        .logs()
        .lines()
        .filter(|l| l.contains("answered") && l.contains("path=\"/v1/messages\""))
        .filter(|l| !l.contains("status=200"))
        .map(str::to_owned)
        .collect()
}

/// A counter of the proxy's `/metrics`.
async fn counter(proxy: &Proxy, name: &str) -> u64 {
    let text = metrics(proxy).await;
    let line = text.lines().find(|l| l.starts_with(name));
    let value = line.and_then(|l| l.rsplit(' ').next()?.parse().ok());
    value.unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

/// What Claude Code sends beside the body reached the upstream on every request,
/// compacted or not: the query, its key, the API version, its betas (the `system`
/// messages need `per-turn-control`) and its session header.
fn sent_as_claude_code_sent(recorded: &Recorded) {
    let header = |name: &str| {
        let value = recorded.headers.get(name);
        value.map_or("", |v| v.to_str().unwrap()).to_owned()
    };
    assert_eq!(recorded.uri, "/v1/messages?beta=true");
    assert_eq!(header("x-api-key"), "sk-ant-dummy");
    assert_eq!(header("anthropic-version"), "2023-06-01");
    let betas = header("anthropic-beta");
    for beta in [
        "claude-code-20250219",
        "context-management-2025-06-27",
        "per-turn-control-2026-07-01",
    ] {
        assert!(
            betas.split(',').any(|b| b == beta),
            "{beta} missing: {betas}"
        );
    }
    assert!(!header("x-claude-code-session-id").is_empty());
}

/// What both sessions must show: the history outgrew the window twice over, every turn's
/// command output reached the model, no error reached Claude Code, the proxy compacted,
/// and what it sent was a valid Messages request each time (thinking signed as the mock
/// signed it included), with Claude Code's headers.
async fn the_proxy_kept_the_session_alive(mock: &Mock, proxy: &Proxy) {
    mock.recorded().iter().for_each(sent_as_claude_code_sent);
    let requests = requests(mock);
    let outputs = command_outputs(&requests);
    for (n, output) in outputs.iter().enumerate() {
        assert!(
            output.is_some(),
            "the output of turn {n} never reached the model"
        );
    }
    let history = history_tokens(&requests, &outputs);
    assert!(
        history > 2 * WINDOW,
        "the history ({history} tokens) fits twice in the window"
    );
    let violations = mock.state.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    let errors = errors_answered(proxy);
    assert!(errors.is_empty(), "errors reached Claude Code: {errors:#?}");
    // The proxy is not told the window: the first refusal teaches it, and after that it
    // compacts before sending.
    let refused = requests
        .iter()
        .filter(|r| support::anthropic::tokens(r) > WINDOW)
        .count();
    assert!(
        refused <= 1,
        "{refused} requests over the window reached the mock"
    );
    let compactions = counter(
        proxy,
        "compaction_proxy_compactions_by_api_total{api=\"messages\"}",
    )
    .await;
    assert!(
        compactions >= 2,
        "{compactions} compactions:\n{}",
        proxy.logs()
    );
    // The summaries were the model's, asked for in Claude Code's own dialect and path.
    let summaries = mock.summaries();
    assert!(!summaries.is_empty(), "the summariser was never asked");
    for call in &summaries {
        sent_as_claude_code_sent(call);
    }
    let llm = counter(proxy, "compaction_proxy_summaries_total{source=\"llm\"}").await;
    assert!(llm >= 1, "no summary was the model's:\n{}", proxy.logs());
    eprintln!(
        "history {history} tokens, window {WINDOW}; {} requests upstream, {refused} refused; \
         {compactions} compactions by the proxy",
        requests.len()
    );
}

#[tokio::test]
async fn claude_code_with_its_own_compaction_off_lives_on_the_proxy_alone() {
    let Some((mock, proxy, _)) = session(false).await else {
        return;
    };
    the_proxy_kept_the_session_alive(&mock, &proxy).await;
}

#[tokio::test]
async fn claude_code_never_has_to_compact_by_itself_and_its_compact_still_works() {
    let Some((mock, proxy, session)) = session(true).await else {
        return;
    };
    the_proxy_kept_the_session_alive(&mock, &proxy).await;
    // Claude Code compacts when an upstream says `prompt is too long`: it never heard it.
    assert!(own_compactions(&requests(&mock)).is_empty());

    // Asked for (`/compact`), its compaction sends the whole history, over the window:
    // the proxy compacts that request too, its instruction kept, and it succeeds.
    let result = session.claude("/compact", true, "/compact", &proxy).await;
    assert_eq!(result["subtype"], "success", "{result}");
    let requests = requests(&mock);
    let asked = own_compactions(&requests);
    assert_eq!(asked.len(), 1, "one request for a summary, answered");
    assert!(support::anthropic::tokens(asked[0]) <= WINDOW);
    let last_message = asked[0]["messages"].as_array().unwrap().last().unwrap();
    let instruction = last_message["content"].as_array().unwrap().last().unwrap();
    assert!(
        instruction["text"]
            .as_str()
            .unwrap()
            .starts_with("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."),
        "{instruction}"
    );
    // The session goes on from the summary Claude Code made of the mock's answer.
    session.turn(TURNS, &proxy).await;
    let last = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(
        last.contains("This session is being continued"),
        "{last:.2000}"
    );
    assert!(last.contains(AGENT_SUMMARY), "{last:.2000}");
    let errors = errors_answered(&proxy);
    assert!(errors.is_empty(), "errors reached Claude Code: {errors:#?}");
    assert!(mock.state.violations.lock().unwrap().is_empty());
}
