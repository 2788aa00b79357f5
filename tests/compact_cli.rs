//! The offline command's contract: stdout, stderr and exit codes.

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
    compaction_proxy::compact::validate(body["messages"].as_array().unwrap()).unwrap();
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
    assert!(body["messages"].as_array().unwrap().len() <= 3);
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
