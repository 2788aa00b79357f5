//! How the engine's readings fare on sentences written for them by someone who had not
//! read them: `fixtures/phrasings/` (its README tells how they were written and split).
//! The tuning half is a specification the readings must keep meeting; the held-out half
//! is only counted ([`held_out_half_counted`], run by hand), so that a rate measured on it
//! still says how the readings generalise.

use std::path::Path;

use super::{failing_lines, products, quantity, scan};

/// A reading of one kind, asked of one sentence or log line.
type Reading = fn(&str) -> bool;

/// Each file of a half, the kind it holds, and whether its lines are of that kind.
const FILES: &[(&str, &str, bool)] = &[
    ("constraint_yes.txt", "constraint", true),
    ("constraint_no.txt", "constraint", false),
    ("decision_yes.txt", "decision", true),
    ("decision_no.txt", "strong decision", false),
    ("number_yes.txt", "number", true),
    ("error_yes.txt", "error", true),
    ("error_no.txt", "error", false),
    ("path_yes.txt", "path made", true),
    ("path_no.txt", "path made", false),
];

fn reading(kind: &str) -> Reading {
    match kind {
        "constraint" => scan::is_constraint,
        "decision" => |s| scan::decision(s).is_some(),
        // A weak decision ranks with the narrated steps: only a strong one misleads.
        "strong decision" => |s| scan::decision(s) == Some(true),
        "number" => |s| quantity::amount(s).is_some(),
        "path made" => |s| {
            let mut made = false;
            products::reported_paths(s, |_| {
                made = true;
                false
            });
            made
        },
        _ => |s| failing_lines::error_line(s).is_some(),
    }
}

/// The lines of one file of a half.
fn lines(half: &str, file: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/phrasings")
        .join(half)
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect()
}

/// Per file: the lines read as their kind, and the lines the reading got wrong.
fn read_half(half: &str) -> Vec<(&'static str, usize, Vec<String>)> {
    FILES
        .iter()
        .map(|&(file, kind, yes)| {
            let all = lines(half, file);
            let read = reading(kind);
            let wrong: Vec<String> = all.iter().filter(|l| read(l) != yes).cloned().collect();
            (file, all.len(), wrong)
        })
        .collect()
}

#[test]
fn fresh_phrasings_of_each_kind_are_read_as_it() {
    // The least share read right, per file, in percent: what the tuning half reached
    // when it was last written for (2026-11-29, all three batches; decisions again that
    // night, for the readings of a part of the work set up; then a fourth batch of
    // decisions, as those readings read it; the fifth batch, of paths an output reports
    // made, once a file's name is read however the tool writes it), so that a change
    // that loses ground fails.
    const LEAST: &[(&str, usize)] = &[
        ("constraint_yes.txt", 95),
        ("constraint_no.txt", 96),
        ("decision_yes.txt", 80),
        ("decision_no.txt", 95),
        ("number_yes.txt", 92),
        ("error_yes.txt", 96),
        ("error_no.txt", 100),
        ("path_yes.txt", 76),
        ("path_no.txt", 92),
    ];
    for (file, total, wrong) in read_half("tune") {
        let right = total - wrong.len();
        let least = LEAST
            .iter()
            .find(|(f, _)| *f == file)
            .map_or(100, |(_, l)| *l);
        assert!(
            right * 100 >= least * total,
            "{file}: {right}/{total} read right, under {least}%; wrong:\n{}",
            wrong.join("\n")
        );
    }
}

/// Counts, and nothing else, of the held-out half: `cargo test --lib held_out_half --
/// --ignored --nocapture` (`PHRASINGS_HALF=tune` counts the other). Its sentences are not
/// to be read by whoever changes the readings (fixtures/phrasings/README.md).
#[test]
#[ignore = "a measurement, run by hand"]
fn held_out_half_counted() {
    let half = std::env::var("PHRASINGS_HALF").unwrap_or_else(|_| "held".into());
    for (file, total, wrong) in read_half(&half) {
        println!("{file}: {}/{total} read right", total - wrong.len());
    }
}
