//! Runs the classifier on every case under `fixtures/errors/` (see its README).

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

use compaction_proxy::classify::{classify, inspect_stream_head, Classification, Kind, StreamHead};
use serde_json::Value;

struct Case {
    name: String,
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
    expect: Value,
}

fn cases() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/errors");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("fixtures/errors exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| load(p)).collect()
}

fn load(path: &Path) -> Case {
    let text = fs::read_to_string(path).expect("readable fixture");
    let v: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let name = path
        .file_stem()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let status = v["status"].as_u64().expect("status") as u16;
    Case {
        status,
        content_type: v["content_type"].as_str().map(str::to_owned),
        body: v["body"].as_str().expect("body string").as_bytes().to_vec(),
        expect: v["expect"].clone(),
        name,
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::ContextOverflow => "context_overflow",
        Kind::OutputCap => "output_cap",
        Kind::BodyTooLarge => "body_too_large",
        Kind::TooManyMedia => "too_many_media",
        Kind::TooManyMessages => "too_many_messages",
        Kind::Other => "other",
    }
}

/// Every number field, as the fixture names it; absent in the fixture means "not stated".
fn mismatches(c: &Classification, expect: &Value) -> Vec<String> {
    let n = &c.numbers;
    let fields = [
        ("context_window", n.context_window),
        ("prompt_tokens", n.prompt_tokens),
        ("completion_tokens", n.completion_tokens),
        ("requested_total", n.requested_total),
        ("overflow_by", n.overflow_by),
        ("completion_limit", n.completion_limit),
        ("media_limit", n.media_limit),
        ("message_limit", n.message_limit),
    ];
    let mut out = Vec::new();
    if expect["kind"].as_str() != Some(kind_name(c.kind)) {
        out.push(format!("kind {} (reason: {})", kind_name(c.kind), c.reason));
    }
    for (key, got) in fields {
        if expect[key].as_u64() != got {
            out.push(format!("{key} {got:?}, want {:?}", expect[key].as_u64()));
        }
    }
    let lower = expect["prompt_is_lower_bound"].as_bool().unwrap_or(false);
    if lower != n.prompt_is_lower_bound {
        out.push(format!("prompt_is_lower_bound {}", n.prompt_is_lower_bound));
    }
    out
}

#[test]
fn every_fixture_classifies_as_expected() {
    let cases = cases();
    assert!(cases.len() >= 100, "only {} fixtures", cases.len());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let got = classify(case.status, case.content_type.as_deref(), &case.body);
            let bad = mismatches(&got, &case.expect);
            (!bad.is_empty()).then(|| format!("{}: {}", case.name, bad.join(", ")))
        })
        .collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn both_kinds_of_fixture_are_present() {
    let cases = cases();
    let negatives = cases.iter().filter(|c| c.expect["kind"] == "other").count();
    assert!(negatives >= 30, "{negatives} negatives");
    assert!(cases.len() - negatives >= 60);
}

fn is_stream(case: &Case) -> bool {
    (200..300).contains(&case.status)
        && case
            .content_type
            .as_deref()
            .is_some_and(|ct| ct.contains("text/event-stream"))
}

/// A stream's verdict must not depend on where the network split its bytes: every prefix
/// either asks for more or already gives the final answer.
#[test]
fn stream_heads_survive_every_split() {
    for case in cases().iter().filter(|c| is_stream(c)) {
        let last = inspect_stream_head(&case.body, true);
        let want = classify(case.status, case.content_type.as_deref(), &case.body);
        match &last {
            StreamHead::Error(c) => assert_eq!(c, &want, "{}", case.name),
            _ => assert_eq!(want.kind, Kind::Other, "{}", case.name),
        }
        for k in 0..case.body.len() {
            let head = inspect_stream_head(&case.body[..k], false);
            assert!(
                head == StreamHead::NeedMore || head == last,
                "{} split at {k}: {head:?} vs {last:?}",
                case.name
            );
        }
    }
}

/// Truncated bodies (every prefix of every fixture) and mangled statuses never panic.
#[test]
fn truncated_bodies_never_panic() {
    for case in cases() {
        for k in (0..case.body.len()).step_by(7) {
            for status in [case.status, 200, 413, 500] {
                let _ = classify(status, case.content_type.as_deref(), &case.body[..k]);
            }
        }
    }
}

/// Bodies with random bytes overwritten (a fixed-seed generator, so failures replay) never
/// panic, whether read as a whole answer or as a stream head.
#[test]
fn mangled_bodies_never_panic() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for case in cases() {
        for _ in 0..20 {
            let mut body = case.body.clone();
            for _ in 0..1 + next() % 8 {
                if body.is_empty() {
                    break;
                }
                let at = (next() % body.len() as u64) as usize;
                body[at] = (next() % 256) as u8;
            }
            let _ = classify(case.status, case.content_type.as_deref(), &body);
            let _ = inspect_stream_head(&body, false);
            let _ = inspect_stream_head(&body, true);
        }
    }
}
