//! The offline command's contract: stdout, stderr and exit codes.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .arg("compact")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn fixture(name: &str) -> String {
    format!(
        "{}/fixtures/conversations/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn fits_exits_0_with_the_compacted_body_and_a_one_line_report() {
    let o = run(
        &["--context-window", "10000", &fixture("coding_agent")],
        b"",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    compaction_proxy::engine::validate(body["messages"].as_array().unwrap()).unwrap();
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("compacted: 113 -> ") && err.contains("fits"),
        "{err}"
    );
}

#[test]
fn already_fitting_input_is_echoed_byte_for_byte_from_stdin() {
    let input = b"{\"model\":\"gpt-4o\",  \"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    let o = run(&[], input);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(o.stdout, input);
    assert!(stderr(&o).contains("unchanged"));
}

#[test]
fn cannot_fit_exits_3_and_still_writes_the_best_effort() {
    // The system prompt alone is larger than this window.
    let o = run(&["--context-window", "600", &fixture("coding_agent")], b"");
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let messages = body["messages"].as_array().unwrap();
    compaction_proxy::engine::validate_strict(messages).unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert!(messages.len() < 113);
    assert!(stderr(&o).contains("DOES NOT FIT"));
}

#[test]
fn bad_input_exits_2_naming_the_problem_with_nothing_on_stdout() {
    let cases: &[(&[u8], &str)] = &[
        (b"{not json", "not valid JSON"),
        (b"{\"model\": \"gpt-4o\"}", "no \"messages\""),
        (b"{\"messages\": {}}", "not an array"),
        (
            b"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
            "unknown role \"robot\"",
        ),
        (b"[1, 2]", "not a JSON object"),
    ];
    for (input, needle) in cases {
        let o = run(&["--model", "gpt-4"], input);
        assert_eq!(o.status.code(), Some(2), "{needle}");
        assert!(o.stdout.is_empty(), "{needle}");
        assert!(stderr(&o).contains(needle), "{needle}: {}", stderr(&o));
    }
    let o = run(&["/nonexistent/file.json"], b"");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read /nonexistent/file.json"));
}

#[test]
fn help_documents_the_default_window() {
    let o = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["compact", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("gpt-4o = 128000") && help.contains("else 128000"),
        "{help}"
    );
}

/// `--summarize-via` asks a real HTTP API (the mock upstream here) for the summary, and
/// falls back to the digest when it fails.
#[tokio::test]
async fn summarize_via_uses_an_llm_summary_and_falls_back_when_it_fails() {
    let mock = support::Mock::start().await;
    let url = mock.url("/v1");
    let path = fixture("coding_agent");
    let output =
        run_in_background(["--context-window", "6000", "--summarize-via", &url, &path]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("summary llm"),
        "{}",
        stderr(&output)
    );
    assert!(!mock.summaries().is_empty());
    let body: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        body.to_string().contains("MOCK-CHECKPOINT"),
        "the LLM summary is not in the output"
    );

    // Nothing listens there: the command still succeeds, with the deterministic summary.
    let closed = format!("http://127.0.0.1:{}/v1", closed_port());
    let output = run_in_background([
        "--context-window",
        "6000",
        "--summarize-via",
        &closed,
        &path,
    ])
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("summary fallback"),
        "{}",
        stderr(&output)
    );
}

/// Runs the command off the async runtime, so the mock upstream on it keeps answering.
async fn run_in_background<const N: usize>(args: [&str; N]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&refs, b"")
    })
    .await
    .unwrap()
}

fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The same rule for the answer's room as the proxy's: a completion cap as large as the
/// window does not make the target zero, and a cap that would overflow beside the prompt
/// is lowered in the output.
#[test]
fn an_oversized_completion_cap_is_lowered_not_paid_for_with_the_conversation() {
    let request = serde_json::json!({"model": "fake-model", "max_tokens": 2400, "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hello world ".repeat(300)},
    ]});
    let o = run(
        &["--context-window", "3000"],
        request.to_string().as_bytes(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(body["messages"], request["messages"]);
    let cap = body["max_tokens"].as_u64().unwrap();
    assert!((256..2400).contains(&cap), "{cap}");
    assert!(
        stderr(&o).contains("completion cap lowered 2400 -> "),
        "{}",
        stderr(&o)
    );

    let mut agent: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("coding_agent")).unwrap()).unwrap();
    agent["max_tokens"] = serde_json::json!(8000);
    let o = run(&["--context-window", "8000"], agent.to_string().as_bytes());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("(target 5840, fits)"), "{}", stderr(&o));
}

/// A Responses API body is compacted too, and written back as Responses items.
#[test]
fn a_responses_body_is_compacted_as_items() {
    let mut input = Vec::new();
    for n in 0..40 {
        let id = format!("call_{n}");
        input.push(serde_json::json!({"role": "user", "content": format!("step {n}")}));
        input.push(
            serde_json::json!({"type": "function_call", "call_id": id, "name": "shell",
            "arguments": "{\"command\":\"make\"}"}),
        );
        input.push(
            serde_json::json!({"type": "function_call_output", "call_id": id,
            "output": "build line\n".repeat(200)}),
        );
    }
    input.push(serde_json::json!({"role": "user", "content": "finish"}));
    let request =
        serde_json::json!({"model": "gpt-4o", "instructions": "Be brief.", "input": input});
    let o = run(
        &["--context-window", "4000"],
        request.to_string().as_bytes(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(body.get("messages").is_none());
    assert_eq!(body["instructions"], "Be brief.");
    let items = body["input"].as_array().unwrap();
    compaction_proxy::dialect::responses::validate(items).unwrap();
    assert!(body.to_string().contains("pruned by compaction"), "{body}");
    assert_eq!(items.last().unwrap()["content"], "finish");
}

/// A 30-turn Claude-style body (tool_use, tool_result, a top-level system) is read as
/// Anthropic's Messages API, compacted, and written back as a valid Messages body.
#[test]
fn a_messages_body_is_compacted_as_messages() {
    let mut messages = vec![serde_json::json!({"role": "user", "content": "Fix the build."})];
    for n in 0..30 {
        let id = format!("toolu_{n:02}");
        messages.push(serde_json::json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Step {n}: running make.")},
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "make"}}
        ]}));
        messages.push(serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": "build line\n".repeat(200)}
        ]}));
    }
    messages.push(serde_json::json!({"role": "assistant", "content": "Done with the steps."}));
    messages.push(serde_json::json!({"role": "user", "content": "finish"}));
    let request = serde_json::json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are a coding agent."}],
        "messages": messages,
    });
    for api in [&[][..], &["--api", "messages"][..]] {
        let mut args = vec!["--context-window", "2000"];
        args.extend_from_slice(api);
        let o = run(&args, request.to_string().as_bytes());
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        // The chat view counts the system prompt as a message.
        assert!(stderr(&o).contains("compacted: 64 -> "), "{}", stderr(&o));
        let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        compaction_proxy::dialect::messages::validate(&body).unwrap();
        assert_eq!(body["system"][0]["text"], "You are a coding agent.");
        let out = body["messages"].as_array().unwrap();
        assert!(out.len() < 63, "{} messages", out.len());
        assert_eq!(out[0]["role"], "user");
        assert_eq!(out.last().unwrap()["content"], "finish");
        // Roles alternate, and every tool_use is answered in the next message.
        for pair in out.windows(2) {
            assert_ne!(pair[0]["role"], pair[1]["role"], "{body}");
            let uses = blocks(&pair[0], "tool_use", "id");
            let results = blocks(&pair[1], "tool_result", "tool_use_id");
            assert_eq!(uses, results, "{body}");
        }
        assert!(out
            .iter()
            .all(|m| m["role"] == "user" || m["role"] == "assistant"));
    }
}

/// The ids of `message`'s content blocks of `kind`, read from `field`.
fn blocks(message: &serde_json::Value, kind: &str, field: &str) -> Vec<String> {
    message["content"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter(|p| p["type"] == kind)
                .map(|p| p[field].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `--economy` shortens old tool outputs first, as economy mode does on the path: a file
/// read again and again far below the window comes out as pointers to its latest read,
/// which stays whole; without the flag the body is echoed as it came.
#[test]
fn economy_shortens_old_repeats_far_below_the_window() {
    let file: String = (0..400)
        .map(|i| format!("pub fn handler_{i}(req: Request) -> Response {{ route({i}, req) }}\n"))
        .collect();
    let mut messages = vec![serde_json::json!({"role": "user", "content": "Fix it."})];
    for n in 0..12 {
        let id = format!("call_{n}");
        messages.push(
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read_file",
                "arguments": "{\"path\": \"src/app.rs\"}"}}]}),
        );
        messages.push(serde_json::json!({"role": "tool", "tool_call_id": id, "content": file}));
    }
    let input = serde_json::json!({"model": "gpt-4o", "messages": messages}).to_string();
    let plain = run(&[], input.as_bytes());
    assert_eq!(plain.stdout, input.as_bytes());
    let o = run(&["--economy"], input.as_bytes());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let out = body["messages"].as_array().unwrap();
    compaction_proxy::engine::validate(out).unwrap();
    assert_eq!(out.len(), messages.len());
    assert_eq!(out[out.len() - 1]["content"], file.as_str());
    let pointers = out
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|t| t.starts_with("[duplicate output of "))
        })
        .count();
    assert!(pointers >= 6, "{body}");
}
