//! The facts a pruned tool output's stub keeps beside its size and its error line: the
//! files it says it wrote or reported, quantities with their units, and identifiers.
//!
//! A stub stays in every later prompt, and outputs that produce an artefact report it
//! once, in a line a later turn needs whole ("JUnit report written to
//! build/reports/junit.xml", "Saved the checkpoint to ckpt/epoch_3.pt"); an event that
//! prunes the output drops it even where nothing is summarised. So a few of them ride on
//! the stub, within [`MAX_CHARS`]: the stubs of a session add up (see
//! [`super::prune::describe_output`]), and a few dozen tokens are what a pruned turn can
//! spare. What a quantity is (a number with its unit or rate) is [`quantity`]'s to say,
//! as everywhere in the engine. Each fact is read from its line after that line's secrets are masked: a fact is
//! a piece of a line, and a piece of a key is a leak the whole key's mask cannot catch.

use std::borrow::Cow;

use crate::redact::redact;

use super::message::clip;
use super::products;
use super::quantity;

/// Most characters the facts of one stub take (about 40 tokens).
const MAX_CHARS: usize = 150;
/// Most files, quantities and identifiers kept; the budget usually binds first.
const MAX_FILES: usize = 2;
const MAX_NUMBERS: usize = 3;
const MAX_IDS: usize = 2;
/// Characters of a line read for facts: a minified blob of one line says none.
const LINE_CHARS: usize = 1000;
/// Longest identifier kept: longer ones are digests of data, not names.
const MAX_ID: usize = 40;

/// Words after which a bare number is a limit or a status: "limit 500", "exit code 137".
const LIMIT_WORDS: &[&str] = &[
    "limit",
    "max",
    "maximum",
    "min",
    "minimum",
    "timeout",
    "quota",
    "cap",
    "threshold",
    "budget",
    "code",
    "status",
    "port",
    "pid",
];

/// Words that say the word after them names something: "commit 3f9a2c1", "job: 48213".
const ID_WORDS: &[&str] = &[
    "id",
    "commit",
    "sha",
    "job",
    "run",
    "build",
    "request",
    "trace",
    "session",
    "ticket",
    "issue",
    "pr",
    "order",
    "container",
    "image",
    "digest",
    "uuid",
    "revision",
    "version",
    "tag",
    "task",
    "deployment",
    "release",
];

/// Words that mark a line as a summary of the run: its quantities outrank those of the
/// lines it sums up (a test's time against the suite's).
const SUMMARY_WORDS: &[&str] = &[
    "total",
    "passed",
    "failed",
    "elapsed",
    "finished",
    "took",
    "peak",
    "used",
    "limit",
    "summary",
    "result",
    "done",
    "completed",
    "size",
];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    File,
    Number,
    Id,
}

/// A fact found on a line: how much it says (higher first, then the later line), where,
/// and the line it is read from again once masked.
struct Found {
    rank: u8,
    line: usize,
    kind: Kind,
    text: String,
    source: String,
}

/// The facts of an output as one clause for its stub (`files: build/junit.xml; 80 passed,
/// took 0.52s; id 3f9a2c1`), `None` when it holds none.
pub fn output_facts(text: &str) -> Option<String> {
    let mut kept: Vec<Found> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = clip(raw.trim(), LINE_CHARS);
        // Quantities and identifiers hold a digit; a line without one states a fact only
        // when it reports a file, and most lines of an output do neither: they are passed
        // over without being split into words (this runs on every output a compaction
        // prunes).
        let digit = line.bytes().any(|b| b.is_ascii_digit());
        let files = made_files(line);
        if !digit && files.is_empty() {
            continue;
        }
        for found in line_facts(line, n, &files) {
            keep(&mut kept, found);
        }
    }
    compose(kept)
}

/// The files a line says the run made ([`products::reported_paths`]).
fn made_files(line: &str) -> Vec<&str> {
    let mut files = Vec::new();
    products::reported_paths(line, |p| {
        files.push(p);
        true
    });
    files
}

/// The facts of one line, unmasked yet, beside the `files` it says the run made.
fn line_facts(line: &str, n: usize, files: &[&str]) -> Vec<Found> {
    let mut out = Vec::new();
    let found = |kind, rank, text: String| Found {
        rank,
        line: n,
        kind,
        text,
        source: line.to_owned(),
    };
    for p in files {
        out.push(found(Kind::File, 1, (*p).to_owned()));
    }
    let words: Vec<&str> = line.split_whitespace().map(trim_word).collect();
    let summary = words.iter().any(|w| is_one_of(w, SUMMARY_WORDS));
    for i in 0..words.len() {
        if let Some(q) = quantity(&words, i) {
            out.push(found(Kind::Number, u8::from(summary), q));
        } else if let Some((id, named)) = identifier(&words, i) {
            out.push(found(Kind::Id, u8::from(named), id));
        }
    }
    out
}

/// Keeps `found` among the best few of its kind: one fact of each shape (the same words
/// with other digits: `took 12 ms` on every line of a test run says one thing, the latest
/// of them), and past the kind's share the least telling (the earliest of the lowest
/// rank) makes way.
fn keep(kept: &mut Vec<Found>, found: Found) {
    let shape = |f: &Found| -> String { f.text.chars().filter(|c| !c.is_ascii_digit()).collect() };
    let found_shape = shape(&found);
    if let Some(k) = kept
        .iter_mut()
        .find(|k| k.kind == found.kind && shape(k) == found_shape)
    {
        if k.text != found.text && (k.rank, k.line) <= (found.rank, found.line) {
            *k = found;
        }
        return;
    }
    let most = match found.kind {
        Kind::File => MAX_FILES,
        Kind::Number => MAX_NUMBERS,
        Kind::Id => MAX_IDS,
    };
    let same: Vec<usize> = (0..kept.len())
        .filter(|&i| kept[i].kind == found.kind)
        .collect();
    if same.len() < most {
        kept.push(found);
        return;
    }
    let weakest = same
        .into_iter()
        .min_by_key(|&i| (kept[i].rank, kept[i].line));
    if let Some(i) = weakest.filter(|&i| (kept[i].rank, kept[i].line) <= (found.rank, found.line)) {
        kept[i] = found;
    }
}

/// The clause the kept facts make, files first, each kind in the order of its lines,
/// within [`MAX_CHARS`]. A fact its masked line no longer holds is dropped.
fn compose(mut kept: Vec<Found>) -> Option<String> {
    kept.sort_by_key(|f| (f.kind, f.line));
    let mut parts: Vec<(Kind, String)> = Vec::new();
    let mut used = 0;
    for f in kept {
        if !survives_masking(&f) {
            continue;
        }
        let cost = f.text.len() + 2;
        if used + cost > MAX_CHARS {
            continue;
        }
        used += cost;
        parts.push((f.kind, f.text));
    }
    let group = |kind: Kind, label: &str| {
        let texts: Vec<&str> = parts
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, t)| t.as_str())
            .collect();
        (!texts.is_empty()).then(|| format!("{label}{}", texts.join(", ")))
    };
    let clauses: Vec<String> = [
        group(Kind::File, "files: "),
        group(Kind::Number, ""),
        group(Kind::Id, "ids: "),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!clauses.is_empty()).then(|| clauses.join("; "))
}

/// Whether `f` is still read from its line once the line's secrets are masked.
fn survives_masking(f: &Found) -> bool {
    match redact(&f.source) {
        Cow::Borrowed(_) => true,
        Cow::Owned(masked) => line_facts(&masked, f.line, &made_files(&masked))
            .iter()
            .any(|g| g.kind == f.kind && g.text == f.text),
    }
}

/// A word without the punctuation around it in prose: `(took`, `0.52s)`, `junit.xml.`
fn trim_word(word: &str) -> &str {
    word.trim_matches(|c: char| matches!(c, '(' | ')' | '[' | ']' | ',' | ';' | '"' | '\'' | '`'))
        .trim_end_matches(['.', ':'])
}

fn is_one_of(word: &str, list: &[&str]) -> bool {
    list.iter().any(|w| w.eq_ignore_ascii_case(word))
}

/// The quantity word `i` starts, with the word that names it: `took 0.52s`, `14 MiB`,
/// `limit 500`, `60 requests/minute`. `None` for a bare number, a version or a date.
fn quantity(words: &[&str], i: usize) -> Option<String> {
    let word = words[i];
    if let Some((key, value)) = word.split_once('=') {
        return limit_setting(key, value).then(|| word.to_owned());
    }
    let digits = quantity::number_end(word)?;
    let (number, unit) = word.split_at(digits);
    let before = i.checked_sub(1).map(|b| words[b]);
    let limit = before.filter(|b| is_one_of(b.trim_end_matches(['=', ':']), LIMIT_WORDS));
    let joined_unit = !unit.is_empty() && quantity::is_unit(unit, true);
    let next_unit = unit.is_empty() && words.get(i + 1).is_some_and(|u| is_unit_word(u));
    if !joined_unit && !next_unit && limit.is_none() {
        return None;
    }
    if !unit.is_empty() && !joined_unit {
        return None;
    }
    let mut q = String::new();
    if let Some(b) = before.filter(|b| b.chars().all(char::is_alphabetic) && !is_unit_word(b)) {
        q.push_str(b);
        q.push(' ');
    } else if let Some(l) = limit {
        q.push_str(l);
        q.push(' ');
    }
    q.push_str(number);
    q.push_str(unit);
    if next_unit {
        q.push(' ');
        q.push_str(words[i + 1]);
    }
    Some(q)
}

/// Whether `key=value` sets a limit to a quantity: `max_retries=5`, `timeout=30s`.
fn limit_setting(key: &str, value: &str) -> bool {
    let limit_key = key
        .split(['_', '-', '.'])
        .any(|part| is_one_of(part, LIMIT_WORDS) || is_one_of(part, &["retries", "rate"]));
    let number = quantity::number_end(value)
        .is_some_and(|n| n == value.len() || quantity::is_unit(&value[n..], true));
    limit_key && number
}

/// Whether `word` (a word of its own, trailing punctuation and all) is a unit or a rate.
fn is_unit_word(word: &str) -> bool {
    quantity::is_unit(word.trim_end_matches(['.', ',']), false)
}

/// The identifier word `i` is, and whether a word names it as one: a UUID, a commit-like
/// hash, a ticket key (`PROJ-1234`), or a word with a digit after an id word (`job 48213`,
/// `request_id=req_8f2a91`).
fn identifier(words: &[&str], i: usize) -> Option<(String, bool)> {
    let word = words[i];
    if word.len() > MAX_ID || word.len() < 4 {
        return None;
    }
    if let Some((key, value)) = word.split_once('=') {
        let named = key.to_ascii_lowercase().ends_with("id");
        return (named && value.len() >= 4 && has_digit(value) && is_id_text(value))
            .then(|| (word.to_owned(), true));
    }
    let after_id_word = i
        .checked_sub(1)
        .is_some_and(|b| is_one_of(words[b].trim_start_matches('#'), ID_WORDS));
    let bare = word.trim_start_matches('#');
    let named = after_id_word && has_digit(bare) && is_id_text(bare);
    let shaped = is_hash(bare) || is_uuid(bare) || is_ticket(bare);
    (shaped || named).then(|| (word.to_owned(), named))
}

fn has_digit(word: &str) -> bool {
    word.bytes().any(|b| b.is_ascii_digit())
}

fn is_id_text(word: &str) -> bool {
    word.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// A commit or content hash: 7 to 40 hex digits, letters and digits both.
fn is_hash(word: &str) -> bool {
    (7..=MAX_ID).contains(&word.len())
        && word
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && has_digit(word)
        && word.bytes().any(|b| b.is_ascii_alphabetic())
}

fn is_uuid(word: &str) -> bool {
    if word.len() != 36 {
        return false;
    }
    let groups: Vec<usize> = word.split('-').map(str::len).collect();
    groups == [8, 4, 4, 4, 12] && word.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// `PROJ-1234`, `INC-20931`: capitals, a hyphen, three digits or more.
fn is_ticket(word: &str) -> bool {
    word.split_once('-').is_some_and(|(key, n)| {
        key.len() >= 2
            && key.bytes().all(|b| b.is_ascii_uppercase())
            && n.len() >= 3
            && n.bytes().all(|b| b.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lines` of filler around `fact_line`, as a long output has them.
    fn output(fact_line: &str) -> String {
        let noise: String = (0..40)
            .map(|i| format!("collecting item {i} of the suite\n"))
            .collect();
        format!("{noise}{fact_line}\n{noise}")
    }

    fn facts(fact_line: &str) -> String {
        output_facts(&output(fact_line)).unwrap_or_default()
    }

    #[test]
    fn a_file_the_output_wrote_or_reported_is_kept_however_it_is_said() {
        for (line, path) in [
            (
                "Coverage XML saved as artifacts/cov/coverage.xml",
                "artifacts/cov/coverage.xml",
            ),
            (
                "wrote 2048 bytes -> dist/bundle.min.js",
                "dist/bundle.min.js",
            ),
            (
                "Exported the embeddings to /data/emb/v3/vectors.npy",
                "/data/emb/v3/vectors.npy",
            ),
            (
                "[INFO] Writing model weights to runs/exp12/last.ckpt",
                "runs/exp12/last.ckpt",
            ),
            (
                "Trace file generated: perf/flame-2026.svg",
                "perf/flame-2026.svg",
            ),
            (
                "Dumped the schema into db/schema_dump.sql",
                "db/schema_dump.sql",
            ),
            // Read as the digest reads it: by the line's shape, whatever the verb.
            (
                "Session trace recorded in traces/t_6.json (2.1 MB)",
                "traces/t_6.json",
            ),
            (
                "See the full log at /var/log/deploy_2.log",
                "/var/log/deploy_2.log",
            ),
            ("Log file: logs/run_4.log", "logs/run_4.log"),
        ] {
            let kept = facts(line);
            assert!(
                kept.contains(&format!("files: {path}")),
                "{line:?}: {kept:?}"
            );
        }
        // A path merely read or listed is no product of the run.
        assert_eq!(
            output_facts(&output("reading config from conf/app.toml")),
            None
        );
    }

    #[test]
    fn a_quantity_with_its_unit_or_a_limit_is_kept_with_its_name() {
        for (line, quantity) in [
            ("peak resident memory 734 MiB", "memory 734 MiB"),
            ("Finished release build in 41.7s", "in 41.7s"),
            (
                "throttled: 120 requests/minute per key",
                "120 requests/minute",
            ),
            (
                "the batch importer loaded 52,310 rows",
                "loaded 52,310 rows",
            ),
            ("process exited with code 137", "code 137"),
            ("worker pool capped at max 16 threads", "max 16 threads"),
            ("retry policy: max_retries=7 between calls", "max_retries=7"),
            ("disk usage at 93.5% on /var", "at 93.5%"),
        ] {
            let kept = facts(line);
            assert!(kept.contains(quantity), "{line:?}: {kept:?}");
        }
        // Versions, dates and bare counts are not quantities.
        for line in [
            "upgraded serde to 1.0.210",
            "on 2026-11-22 at 10:31",
            "step 3 of 9",
        ] {
            assert_eq!(output_facts(&output(line)), None, "{line:?}");
        }
    }

    #[test]
    fn identifiers_are_kept_by_their_shape_or_the_word_naming_them() {
        for (line, id) in [
            (
                "[main 4be91c07] fix the off-by-one in the pager",
                "4be91c07",
            ),
            ("Queued as job 88213, poll for status", "88213"),
            (
                "request_id=rq_5Zt81a returned 502 upstream",
                "request_id=rq_5Zt81a",
            ),
            ("Linked to OPS-4471 for follow-up", "OPS-4471"),
            ("container 3c5e0d9f1a2b started", "3c5e0d9f1a2b"),
            (
                "created volume 0f8fad5b-d9cb-469f-a165-70867728950e",
                "0f8fad5b-d9cb-469f-a165-70867728950e",
            ),
        ] {
            let kept = facts(line);
            assert!(kept.contains(id), "{line:?}: {kept:?}");
        }
    }

    #[test]
    fn a_summary_line_outranks_the_lines_it_sums_up() {
        let per_test: String = (0..60)
            .map(|i| format!("test parser::case_{i} ... ok <{i} ms>\n"))
            .collect();
        let text = format!("{per_test}Summary: 58 passed, 2 failed, elapsed 9.4 s\n");
        let kept = output_facts(&text).unwrap_or_default();
        assert!(
            kept.contains("58 passed") && kept.contains("2 failed"),
            "{kept}"
        );
        assert!(kept.contains("elapsed 9.4 s"), "{kept}");
        assert!(!kept.contains("case_"), "{kept}");
    }

    #[test]
    fn the_facts_stay_within_their_budget() {
        let text: String = (0..500)
            .map(|i| {
                format!("Saved shard {i} to /mnt/output/shards/part-{i:05}.parquet ({i} MiB) id={i:08x}aa{i}\n")
            })
            .collect();
        let kept = output_facts(&text).unwrap_or_default();
        assert!(!kept.is_empty());
        assert!(kept.len() <= MAX_CHARS + 20, "{} chars: {kept}", kept.len());
        // The latest files outrank the first ones.
        assert!(kept.contains("part-00499.parquet"), "{kept}");
    }

    #[test]
    fn a_fact_is_read_from_its_line_masked() {
        let kept = facts("Uploaded to s3://bkt/run.tar with AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
        assert!(!kept.contains("wJalrXUtn"), "{kept}");
        assert!(!kept.contains("K7MDENG"), "{kept}");
        // An id word before a secret's value keeps no piece of it.
        let kept = facts("session token ghp_R4nd0mT0k3nV4lu3xyzABCDEF123456 expires 3600 s");
        assert!(!kept.contains("ghp_"), "{kept}");
        assert!(!kept.contains("R4nd0m"), "{kept}");
    }
}
