//! Each fixture session compacted at a window that forces real work, checked against the
//! engine's promises and snapshotted in a compact form (one line per message, the summary
//! in full) so a change in behaviour shows up as a readable diff.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use compaction_proxy::engine::{
    self, message::one_line, validate, validate_strict, Counter, Options, MARKER,
};
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!(
        "{}/fixtures/conversations/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn render(report: &engine::Report, body: &Value) -> String {
    let counter = Counter::for_request(body);
    let mut out = format!("{report}\n");
    for (i, m) in body["messages"].as_array().unwrap().iter().enumerate() {
        let tokens = counter.message(m.as_object().unwrap());
        let role = m["role"].as_str().unwrap_or("?");
        let text = match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            Value::Array(parts) => parts
                .iter()
                .map(|p| match p["type"].as_str() {
                    Some("text") => format!("[{}]", one_line(p["text"].as_str().unwrap_or(""), 50)),
                    Some(kind) => format!("<{kind} {}>", p[kind]["detail"].as_str().unwrap_or("")),
                    None => "<?>".into(),
                })
                .collect::<Vec<_>>()
                .join(" "),
            other => other.to_string(),
        };
        let calls: Vec<String> = m["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        format!(
                            "{}({})",
                            c["function"]["name"].as_str().unwrap_or("?"),
                            one_line(c["function"]["arguments"].as_str().unwrap_or(""), 40)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut line = format!("{i:>3} {role:<9} {tokens:>5}t ");
        if !calls.is_empty() {
            line.push_str(&format!("calls {} ", calls.join(", ")));
        }
        if text.contains(MARKER) {
            line.push_str("SUMMARY:\n");
            for l in text.lines() {
                line.push_str(&format!("      | {l}\n"));
            }
        } else {
            line.push_str(&one_line(&text, 110));
            line.push('\n');
        }
        out.push_str(&line);
    }
    out
}

fn check(name: &str, window: usize) -> String {
    let request = load(name);
    validate(request["messages"].as_array().unwrap()).expect("fixture is valid");
    let outcome = engine::compact(&request, &Options::with_window(window)).unwrap();
    let body = outcome
        .rewritten
        .as_ref()
        .expect("the fixture needs compaction at this window");
    let report = &outcome.report;
    validate_strict(body["messages"].as_array().unwrap()).unwrap();
    assert!(report.fits, "{report}");
    assert_eq!(engine::count_request(body), report.tokens_after);
    assert!(report.tokens_after < report.tokens_before);
    // Every top-level field other than messages is untouched, in its place.
    for (k, v) in request.as_object().unwrap() {
        if k != "messages" {
            assert_eq!(&body[k], v, "{k}");
        }
    }
    let keys: Vec<_> = body.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        request.as_object().unwrap().keys().collect::<Vec<_>>()
    );
    // Instructions and the latest user message verbatim.
    let pick = |v: &Value, f: &dyn Fn(&Value) -> bool| -> Vec<Value> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| f(m))
            .cloned()
            .collect()
    };
    let instr = |m: &Value| m["role"] == "system" || m["role"] == "developer";
    assert_eq!(pick(body, &instr), pick(&request, &instr));
    // The latest user text ends the latest user message, unchanged.
    let last_user = |v: &Value| {
        let m = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .cloned()
            .unwrap();
        engine::message::content_text(m.get("content"))
    };
    assert!(last_user(body).ends_with(&last_user(&request)));
    // Same input, same bytes.
    let again = engine::compact(&request, &Options::with_window(window)).unwrap();
    assert_eq!(
        serde_json::to_vec(&again.rewritten).unwrap(),
        serde_json::to_vec(&outcome.rewritten).unwrap()
    );
    render(report, body)
}

#[test]
fn coding_agent_with_large_tool_outputs() {
    insta::assert_snapshot!(check("coding_agent", 5_000));
}

#[test]
fn coding_agent_pruning_is_enough_at_a_larger_window() {
    let out = check("coding_agent", 10_000);
    assert!(out.contains("summary none"), "{out}");
    assert!(out.contains("[output of read_file path=src/main.rs pruned by compaction"));
}

#[test]
fn parallel_tool_calls_stay_paired() {
    insta::assert_snapshot!(check("parallel_tools", 6_000));
}

#[test]
fn old_images_become_placeholders() {
    let out = check("images", 12_000);
    assert!(out.contains("earlier image removed"));
    insta::assert_snapshot!(out);
}

#[test]
fn multi_part_content_and_legacy_functions() {
    let request = load("multipart");
    let out = check("multipart", 10_000);
    // Unknown fields survive on kept messages.
    let outcome = engine::compact(&request, &Options::with_window(10_000)).unwrap();
    let body = outcome.rewritten.unwrap();
    let kept_tool = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert!(kept_tool.get("x_elapsed_ms").is_some());
    insta::assert_snapshot!(out);
}

#[test]
fn an_earlier_summary_is_carried_forward() {
    let out = check("already_compacted", 2_000);
    assert_eq!(out.matches("SUMMARY:").count(), 1);
    assert!(out.contains("- Add rate limiting to the proxy"), "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn under_target_is_byte_identical() {
    let request = load("coding_agent");
    let outcome = engine::compact(&request, &Options::with_window(1_000_000)).unwrap();
    assert!(outcome.rewritten.is_none() && outcome.report.unchanged && outcome.report.fits);
}
