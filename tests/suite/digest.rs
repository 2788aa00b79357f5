//! The deterministic digest on three kinds of agent transcript (fixtures/transcripts/,
//! written by generate.py there): a chat agent with no tools, a SWE-agent-style
//! trajectory and a coding agent making parallel tool calls. Each has facts planted in
//! its middle that a digest of that middle must keep, within a budget proportional to
//! what it replaces, the same way every time, and carried forward unchanged.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use compaction_proxy::engine::{self, digest::digest, Counter, Message, Options};
use compaction_proxy::engine::{summary::find_end, MARKER};
use serde_json::{json, Value};

struct Fixture {
    name: &'static str,
    /// Strings the digest of the middle must hold verbatim, by kind.
    facts: &'static [(&'static str, &'static str)],
}

const PLAIN: Fixture = Fixture {
    name: "plain_agent",
    facts: &[
        ("constraint", "Never modify config/prod.yaml, it is rendered by the deploy pipeline and any hand edit gets overwritten."),
        ("constraint", "Also don't add new dependencies to requirements.txt."),
        ("number", "the invoices table has 1284663 rows"),
        ("error", "django.db.utils.IntegrityError: duplicate key value violates unique constraint \"billing_invoice_number_key\""),
        ("path", "billing/management/commands/_numbering.py"),
        ("decision", "I'll compute the next free sequence per year inside the same transaction and lock the year's rows with `select_for_update()` instead of reading the maximum once, because new invoices keep arriving while the command runs."),
        ("decision", "The root cause is that `last_sequence` only looks at invoices that already had a number when the command started"),
    ],
};

const SWE: Fixture = Fixture {
    name: "swe_agent",
    facts: &[
        ("constraint", "Do not edit anything under astropy/extern/, those files are vendored copies."),
        ("number", "The full suite takes 2350 seconds here"),
        ("error", "ValueError: Unknown format code 'd' for object of type 'float'"),
        ("error", "NameError: name '_as_int' is not defined"),
        ("path", "/testbed/astropy/utils/data_info.py"),
        ("decision", "The root cause is that `get_auto_format_func` passes integral floats straight to `format(val, 'd')`; I'll convert floats that are whole numbers to int before formatting instead of changing the user's format spec, because the spec is what the user asked for."),
    ],
};

const TOOLS: Fixture = Fixture {
    name: "parallel_tools",
    facts: &[
        ("constraint", "Keep the public API of crates/ingest-api unchanged; three other services link against it."),
        ("number", "The nightly batch is 250000 records"),
        ("error", "error[E0599]: no method named `flush_if_full` found for struct `BatchWriter` in the current scope"),
        ("error", "FAILED scripts/check_limits.py::test_nightly_limits - AssertionError: maxBytes 67108864 is above the 32 MiB budget"),
        ("error", "npm ERR! Error: Cannot find module '@ingest/metrics-client'"),
        ("error", "panicked at crates/ingest/src/pipeline.rs:212:9: peak buffer 734003200 bytes exceeds the 536870912 byte limit"),
        ("path", "deploy/helm/ingest/values-nightly.yaml"),
        ("path", "crates/storage/src/config.rs"),
        ("decision", "The root cause is that BatchWriter only flushes on its timer, so a burst of records grows the buffer without bound; I'll make it flush when the buffer reaches max_bytes instead of waiting for the interval."),
    ],
};

const FIXTURES: [&Fixture; 3] = [&PLAIN, &SWE, &TOOLS];

fn load(name: &str) -> Vec<Value> {
    let path = format!(
        "{}/fixtures/transcripts/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn parse(values: &[Value]) -> Vec<Message> {
    let counter = Counter::for_model("gpt-4o");
    values
        .iter()
        .enumerate()
        .map(|(i, v)| Message::parse(i, v, &counter).unwrap())
        .collect()
}

/// What a digest replaces: everything but the instructions and the task at the start and
/// the last two messages.
fn middle(name: &str) -> Vec<Message> {
    let all = parse(&load(name));
    all[2..all.len() - 2].to_vec()
}

/// The engine's rule: a fifth of the tokens replaced, at about 3 characters a token.
fn proportional(turns: &[Message]) -> usize {
    turns.iter().map(|m| m.tokens).sum::<usize>() / 5 * 3
}

fn missing<'a>(d: &str, facts: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    facts
        .iter()
        .filter(|(_, f)| !d.contains(f))
        .copied()
        .collect()
}

#[test]
fn every_planted_fact_is_kept_within_a_proportional_budget() {
    for f in FIXTURES {
        let turns = middle(f.name);
        let budget = proportional(&turns);
        let d = digest(None, &turns, budget);
        assert!(d.len() <= budget, "{}: {} > {budget}\n{d}", f.name, d.len());
        let lost = missing(&d, f.facts);
        assert!(lost.is_empty(), "{}: lost {lost:?} in\n{d}", f.name);
    }
}

#[test]
fn tool_calls_and_commands_are_listed_in_order_and_collapsed() {
    let d = digest(None, &middle(TOOLS.name), 100_000);
    // The calls in the order the assistant made them, not the order results came back.
    let calls = [
        "- read_file path=crates/ingest/src/main.rs\n- read_file path=crates/ingest/Cargo.toml\n- bash command=ls crates\n",
        "- grep path=crates\n- read_file path=crates/ingest/src/pipeline.rs\n",
        "- bash command=cargo test -p storage\n- write_file path=crates/storage/src/batch_writer.rs\n- bash command=cargo test -p storage\n- bash command=cargo test -p ingest (x3)\n",
    ];
    let mut from = 0;
    for run in calls {
        let at = d[from..]
            .find(run)
            .unwrap_or_else(|| panic!("missing {run:?} after {from} in\n{d}"));
        from += at + run.len();
    }
    let d = digest(None, &middle(SWE.name), 100_000);
    let commands = [
        "- command: sed -n '1,120p' /testbed/astropy/io/ascii/fixedwidth.py\n",
        "- command: cd /testbed && python reproduce.py\n",
        "- command: sed -n '205,270p' /testbed/astropy/table/pprint.py\n",
        "- command: cd /testbed && python -m pytest astropy -q\n",
        "- command: cd /testbed && python reproduce.py\n",
    ];
    let mut from = 0;
    for c in commands {
        let at = d[from..]
            .find(c)
            .unwrap_or_else(|| panic!("missing {c:?} after {from} in\n{d}"));
        from += at + c.len();
    }
    // Observations are read, not listed as requests.
    assert!(!d.contains("- <returncode>"), "{d}");
}

#[test]
fn never_empty_and_never_over_budget() {
    for f in FIXTURES {
        let turns = middle(f.name);
        for budget in [192, 400, 1000, 3000] {
            let d = digest(None, &turns, budget);
            assert!(!d.trim().is_empty(), "{} at {budget}", f.name);
            assert!(
                d.len() <= budget,
                "{} at {budget}: {}\n{d}",
                f.name,
                d.len()
            );
        }
        // With room for little, what the user laid down is what stays (the fact planted as
        // a number can be a constraint too: "run only ...").
        let d = digest(None, &turns, 400);
        assert!(
            f.facts
                .iter()
                .any(|(kind, fact)| matches!(*kind, "constraint" | "number") && d.contains(fact)),
            "{} at 400:\n{d}",
            f.name
        );
    }
}

#[test]
fn the_same_input_gives_the_same_bytes() {
    for f in FIXTURES {
        let turns = middle(f.name);
        let budget = proportional(&turns);
        assert_eq!(digest(None, &turns, budget), digest(None, &turns, budget));
        let request = json!({"model": "gpt-4o", "messages": load(f.name)});
        let opts = Options::with_window(3200);
        let a = engine::compact(&request, &opts).unwrap().rewritten;
        let b = engine::compact(&request, &opts).unwrap().rewritten;
        assert_eq!(a, b, "{}", f.name);
    }
}

#[test]
fn carrying_forward_is_stable_and_does_not_nest() {
    for f in FIXTURES {
        let turns = middle(f.name);
        let budget = proportional(&turns);
        for b in [192, 400, 1000, 3000, budget] {
            let d = digest(None, &turns, b);
            assert_eq!(digest(Some(&d), &[], b), d, "{} at {b}", f.name);
        }
        // Two compactions in a row: the second carries the first item by item.
        let half = turns.len() / 2;
        let first = digest(None, &turns[..half], budget);
        let second = digest(Some(&first), &turns[half..], budget);
        assert!(
            !second.contains("## Earlier summary"),
            "{}:\n{second}",
            f.name
        );
        for heading in second.lines().filter(|l| l.starts_with("## ")) {
            assert_eq!(
                second.matches(&format!("{heading}\n")).count(),
                1,
                "{}: {heading} twice in\n{second}",
                f.name
            );
        }
        let lost = missing(&second, f.facts);
        assert!(lost.is_empty(), "{}: lost {lost:?} in\n{second}", f.name);
    }
}

/// The summary the engine wrote into a compacted request.
fn summary_of(request: &Value, window: usize) -> String {
    let outcome = engine::compact(request, &Options::with_window(window)).unwrap();
    let body = outcome.rewritten.expect("compacted");
    let text = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|t| t.contains(MARKER))
        .expect("a summary")
        .to_string();
    let start = text.find(MARKER).unwrap();
    let end = start + find_end(&text[start..]).unwrap().0;
    text[start..end].to_string()
}

#[test]
fn the_engine_hands_the_facts_on() {
    // A window that leaves the SWE trajectory's digest room for every fact.
    let swe = summary_of(
        &json!({"model": "gpt-4o", "messages": load(SWE.name)}),
        8192,
    );
    let lost = missing(&swe, SWE.facts);
    assert!(lost.is_empty(), "lost {lost:?} in\n{swe}");
    // Small windows: the budget is a tenth of the target, and the user's words go last.
    for (f, window) in [(&PLAIN, 4096), (&TOOLS, 3200)] {
        let s = summary_of(
            &json!({"model": "gpt-4o", "messages": load(f.name)}),
            window,
        );
        let rules: Vec<_> = f
            .facts
            .iter()
            .filter(|(kind, _)| matches!(*kind, "constraint" | "number"))
            .copied()
            .collect();
        let lost = missing(&s, &rules);
        assert!(lost.is_empty(), "{}: lost {lost:?} in\n{s}", f.name);
        for placeholder in [
            "pruned by compaction",
            "no longer available",
            "(conversation continues)",
        ] {
            assert!(
                !s.contains(placeholder),
                "{}: {placeholder} in\n{s}",
                f.name
            );
        }
    }
}
