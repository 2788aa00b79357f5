//! Which paths an output says the run made: a report, a build artefact, a checkpoint, an
//! export. Such a path is what a later turn builds on, so the digest lists it as written,
//! the stub of a pruned output keeps it, and a cut keeps its line; all three read it here.
//!
//! Two readings, either enough: by the line's shape (a short line of words ending with
//! its only path, led by an arrow, a label's colon, a preposition after a verb of
//! making; or the path then the verb that made it: [`reported_path`]), whatever the
//! tool's words; and by a word that says a file was written ([`announces_file`]), for
//! lines that name it elsewhere.

use std::sync::LazyLock;

use super::phrases::Phrases;
use super::scan::{as_path, has_extension, is_constraint, paths};

/// Words of a line of output that say a file was written: the path on such a line is
/// a product of the work (a report, a build artefact), not one of a listing.
const WRITE_WORDS: &[&str] = &[
    "wrote",
    "written",
    "writing",
    "saved",
    "saving",
    "report",
    "created",
    "generated",
    "output to",
    "exported",
    "stored",
    "artifact",
    "artefact",
    "dumped",
    "emitted",
    "published",
    "uploaded",
    "copied to",
    "moved to",
    "logged to",
    "downloaded",
    "produced",
    "rendered",
];

/// Whether a line holds a word that says a file was written.
fn announces_file(text: &str) -> bool {
    static WORDS: LazyLock<Phrases> = LazyLock::new(|| Phrases::new(&[WRITE_WORDS]));
    WORDS.find(text, false).is_some()
}

/// The paths a line says the run made, each given to `found` until it answers `false`:
/// the one its shape reports ([`reported_path`]), or else every path of a line with a
/// word of writing, or else the values of its keys that name a product
/// ([`keyed_products`]); none in a rule ("never modify config/prod.yaml, it is
/// generated"): the file it names is one not to write.
pub fn reported_paths<'a>(line: &'a str, mut found: impl FnMut(&'a str) -> bool) {
    if !line.contains(['/', '.']) && !says_directory(line) {
        return;
    }
    let mut made: Vec<&'a str> = Vec::new();
    if let Some(path) = reported_path(line) {
        made.push(path);
    } else if announces_file(line) {
        // A web address is a place to visit, not a product.
        paths(line, |p| {
            if !p.starts_with("http") {
                made.push(p);
            }
            true
        });
        // Names the path reading leaves out: a Windows path, a quoted one with spaces,
        // a bare file name; not where the writing is denied ("(not saved)").
        let denied = line.split_whitespace().any(|w| {
            ["not", "never", "without"].contains(&w.trim_matches('(')) || w.ends_with("n't")
        });
        if made.is_empty() && !denied {
            made.extend(loose_path(line));
        }
    }
    // A key's value, when the words found none (`{"artifact": "gs://runs/m.tar.gz"}`).
    if made.is_empty() && line.contains([':', '=']) {
        made = keyed_products(line);
    }
    // A directory made: its name need not read as a file's (`mkdir: created directory
    // 'build/out_x9'`).
    if made.is_empty() {
        made.extend(directory_made(line));
    }
    if made.is_empty() || is_constraint(line) {
        return;
    }
    for path in made {
        if !found(path) {
            return;
        }
    }
}

/// A file's name as a line that says a file was written may give it, where it holds no
/// path the path reading takes: quoted (`"figures/loss curve.svg"`, spaces and all), a
/// Windows path (`bin\Release\app.exe`, `D:\out`), or a bare name with an extension
/// (`report_final.docx`). The first such word or quoted span.
fn loose_path(line: &str) -> Option<&str> {
    for quote in ['"', '\'', '`'] {
        let mut parts = line.split(quote);
        parts.next();
        if let Some(inner) = parts.next().filter(|_| parts.next().is_some()) {
            let named = inner.contains(['/', '\\']) || has_extension(inner);
            if named && (2..=200).contains(&inner.len()) && !inner.starts_with("http") {
                return Some(inner);
            }
        }
    }
    line.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| "()[]{},;:'\"".contains(c))
                .trim_end_matches('.')
        })
        .find(|w| {
            let windows =
                w.contains('\\') && (has_extension(w) || w.as_bytes().get(1) == Some(&b':'));
            // ("e.g." is no file: a name's stem has two letters at least.)
            let bare = has_extension(w)
                && w.split('.').next().is_some_and(|stem| stem.len() >= 2)
                && w.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c))
                && w.bytes().any(|b| b.is_ascii_lowercase() || b == b'_')
                && !w.contains("..");
            windows || bare
        })
}

/// Whether a line may say a directory was made: the cheap test before [`directory_made`]
/// lowers its case.
fn says_directory(line: &str) -> bool {
    ["irector", "older", "dir "]
        .iter()
        .any(|w| line.contains(w))
}

/// Words for a directory, and the verbs that say one was made.
const DIRECTORY_WORDS: &[&str] = &["directory", "folder", "dir"];
const MAKING_WORDS: &[&str] = &["created", "creating", "made"];

/// The directory a line of output says was made (GNU `mkdir -v`'s `created directory
/// 'x'`, `Created folder: x/`, `directory x created`): the word after the word for a
/// directory, or else the one before it, unquoted and as written, when it holds a `/` or
/// reads as a name
/// (a digit, `_` or `-` in it), which a word of prose ("successfully") does not.
fn directory_made(line: &str) -> Option<&str> {
    if !says_directory(line) {
        return None;
    }
    let quotes = |c: char| "'\"`\u{2018}\u{2019}\u{201c}\u{201d}():,;".contains(c);
    let words: Vec<&str> = line
        .split_whitespace()
        .map(|w| w.trim_matches(quotes))
        .filter(|w| !w.is_empty())
        .collect();
    let low = |w: &str| w.to_ascii_lowercase();
    if !words
        .iter()
        .any(|w| MAKING_WORDS.contains(&low(w).as_str()))
    {
        return None;
    }
    let at = words
        .iter()
        .position(|w| DIRECTORY_WORDS.contains(&low(w).as_str()))?;
    let named = |w: &&&str| {
        let name = w.trim_end_matches(['/', '.']);
        let looks =
            name.contains('/') || name.contains(|c: char| c.is_ascii_digit() || "_-".contains(c));
        let clean = name
            .chars()
            .all(|c| c.is_alphanumeric() || "_-./~@+".contains(c));
        name.len() >= 2 && looks && clean && name.bytes().any(|b| b.is_ascii_alphabetic())
    };
    let after = words.get(at + 1).filter(named);
    let before = at.checked_sub(1).and_then(|i| words.get(i)).filter(named);
    // As the output wrote it (`'out/x9/'`), less a sentence's full stop.
    after.or(before).map(|w| w.trim_end_matches('.'))
}

/// Whether a line of output says the run made a file ([`reported_paths`]).
pub fn reports_path(line: &str) -> bool {
    let mut any = false;
    reported_paths(line, |_| {
        any = true;
        false
    });
    any
}

/// Whether `text` names any path ([`paths`]): a line reporting one product names no other.
fn names_a_path(text: &str) -> bool {
    let mut any = false;
    paths(text, |_| {
        any = true;
        false
    });
    any
}

/// Past verbs that say a file was looked at or taken away, not made: a path after them
/// is no product of the work.
const NOT_MADE: &[&str] = &[
    "opened", "loaded", "found", "read", "checked", "scanned", "searched", "skipped", "ignored",
    "deleted", "removed", "failed", "matched", "parsed", "linted", "tested", "analyzed",
    "analysed", "excluded", "missed", "watched", "closed", "edited",
];

/// The path a line of output reports as what the run produced, whatever the tool's
/// words (`Profile written to out/p.svg`, `trace saved as t.json`, `Artifacts:
/// dist/app.tar.gz`, `export done -> data/x.csv`, `Downloaded data/raw.csv`): a short
/// line of words, not an error, that ends with its only path, a file's name, led by an
/// arrow, a label's colon, `to`/`into`/`at`/`as`, or a verb of making in the past
/// tense.
fn reported_path(line: &str) -> Option<&str> {
    let t = line
        .trim()
        .trim_end_matches(['.', ',', ';', ')', ']', '"', '\'']);
    // Every path holds a `/` or a `.`: most lines of an output are passed over here.
    if t.len() > 200 || !t.contains(['/', '.']) {
        return None;
    }
    path_ending(t).or_else(|| {
        // What a tool prints after the path it made: its size, the time it took, a mark
        // (`Wrote out/r.html (42 KB)`, `... to runs/best.pt in 2.4s`, `... [ok]`), or the
        // verb itself (`Report out/junit.xml generated`, `out/a.json was written`).
        let bare = without_qualifiers(line.trim().trim_end_matches(['.', ',', ';']));
        let bare = bare.trim_end_matches(['.', ',', ';', '"', '\'']);
        (bare.len() < t.len())
            .then(|| path_ending(bare))
            .flatten()
            .or_else(|| made_after(bare))
    })
}

/// [`reported_path`] for a line that ends with the path.
fn path_ending(t: &str) -> Option<&str> {
    let (head, last) = t.rsplit_once([' ', '\t'])?;
    let path = product(last.trim_start_matches(['(', '[', '"', '\'', '`']))?;
    if t.len() > 200 {
        return None;
    }
    let head = head.trim_end();
    let words = head.split_whitespace().count();
    let lead = head.rsplit(' ').next().unwrap_or(head).to_ascii_lowercase();
    let arrow = ["->", "=>", "\u{2192}"].contains(&lead.as_str());
    // "Trace recorded in traces/s.json", "Results stored under out/": a place the verb
    // put it; "Found 3 matches in src/a.py" names where it looked.
    let placed = ["in", "under", "inside"].contains(&lead.as_str())
        && head
            .split_whitespace()
            .any(|w| makes(&w.to_ascii_lowercase()));
    let made = (lead.ends_with(':') && names_a_product(head))
        || arrow
        || placed
        || ["to", "into", "at", "as"].contains(&lead.as_str())
        || makes(&lead);
    let others = names_a_path(head);
    let worded = head
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_ascii_alphanumeric()))
        .any(|w| w.len() > 1 && w.bytes().all(|b| b.is_ascii_alphabetic()));
    (made
        && (worded || arrow)
        && (1..=12).contains(&words)
        && !others
        && super::failing_lines::line_score(t) < 2)
        .then_some(path)
}

/// Whether a word is a verb of making in the past (`wrote`, `built`, `recorded`,
/// `uploaded`), not of looking at or taking away (`found`, `deleted`).
fn makes(word: &str) -> bool {
    ["built", "wrote", "made", "kept"].contains(&word)
        || MADE_AFTER.contains(&word)
        || (word.len() > 3 && word.ends_with("ed") && !NOT_MADE.contains(&word))
}

/// Words a label names a product with (`Output:`, `Log file:`, `Artifacts:`,
/// `Checkpoint:`), where a viewer's or a runner's labels name what it reads (`Open
/// file:`, `configfile:`, `Current directory:`).
const PRODUCT_NOUNS: &[&str] = &[
    "output",
    "report",
    "log",
    "artifact",
    "artefact",
    "result",
    "checkpoint",
    "export",
    "archive",
    "bundle",
    "backup",
    "snapshot",
    "trace",
    "dump",
    "plot",
    "figure",
    "chart",
    "screenshot",
    "wheel",
    "package",
    "coverage",
    "destination",
    "profile",
    // Keys' short forms: `outfile`, `out_dir`, `dest`.
    "out",
    "outfile",
    "outdir",
    "outpath",
    "dest",
    "dst",
];

/// Verbs of making in the progressive, as a tool labels what it is writing (`Saving
/// to:`, `Writing report:`).
const MAKING: &[&str] = &[
    "saving",
    "writing",
    "exporting",
    "generating",
    "creating",
    "dumping",
    "uploading",
    "building",
    "packaging",
    "rendering",
    "emitting",
];

/// Whether a label (the words before its colon, or a key) names a product or says it
/// was made: `Output:`, `Plot saved:`, `Saving to:`, `New file:`, `"report_path"`; not
/// `Open file:`, `configfile`.
fn names_a_product(label: &str) -> bool {
    words_of(label).any(|w| {
        let one = w.strip_suffix('s').unwrap_or(&w);
        makes(&w)
            || w == "new"
            || MAKING.contains(&w.as_str())
            || PRODUCT_NOUNS.contains(&w.as_str())
            || PRODUCT_NOUNS.contains(&one)
    })
}

/// The words of a label or a key, lowercased: `report_path`, `outputFile`, `Log file`.
fn words_of(label: &str) -> impl Iterator<Item = String> + '_ {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in label.chars() {
        let boundary = !c.is_ascii_alphabetic() || (c.is_ascii_uppercase() && prev_lower);
        if boundary && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        if c.is_ascii_alphabetic() {
            word.push(c.to_ascii_lowercase());
        }
        prev_lower = c.is_ascii_lowercase();
    }
    if !word.is_empty() {
        words.push(word);
    }
    words.into_iter()
}

/// The paths a line gives as the values of keys that name a product (`"output_path":
/// "out/p.jsonl"`, `report_file=build/lint.txt`, `saved_to: ckpt/`): a tool's structured
/// answer says what it made by its field's name.
fn keyed_products(line: &str) -> Vec<&str> {
    let mut made = Vec::new();
    for (at, _) in line.match_indices([':', '=']) {
        // `http://`'s colon is no key's.
        if line.as_bytes().get(at + 1) == Some(&b'/') {
            continue;
        }
        // The value first: most keys' values are no path, and a key's words cost more.
        let rest = line[at + 1..].trim_start_matches([' ', '"', '\'']);
        let value_end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '}' | ']'))
            .unwrap_or(rest.len());
        let Some(path) = product(&rest[..value_end]) else {
            continue;
        };
        let key_end = line[..at].trim_end().trim_end_matches(['"', '\'']);
        let key_start = key_end
            .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            .len();
        let key = &key_end[key_start..];
        if !key.is_empty() && key.len() <= 40 && names_a_product(key) {
            made.push(path);
        }
    }
    made
}

/// The last word of a reported line as the product it names: a path to a file
/// (`out/r.html`), a directory written with its slash (`dist/`), a file's bare name of
/// any extension (`perf.data`, `model.safetensors`), a hidden one (`.venv`), a bucket's
/// object (`s3://ci/run_7/logs.tar.gz`); the value of a `key=` (`filename=app.whl`).
/// A web address is a place to visit, not a product.
fn product(word: &str) -> Option<&str> {
    let word = match word.split_once('=') {
        Some((key, value))
            if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_') =>
        {
            value
        }
        _ => word,
    };
    let word = word.trim_end_matches(['`', '"', '\'']);
    if let Some((scheme, rest)) = word.split_once("://") {
        let store = (2..=8).contains(&scheme.len())
            && scheme
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && !scheme.starts_with("http");
        return (store && rest.trim_end_matches('/').contains('/')).then_some(word);
    }
    if let Some(path) = as_path(word) {
        let file = path.rsplit('/').next().unwrap_or(path);
        return (file.contains('.') && !path.starts_with("http")).then_some(path);
    }
    let name = |s: &str| {
        s.len() >= 2
            && s.bytes().any(|b| b.is_ascii_alphabetic())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
            && !s.contains("//")
    };
    let word = word.strip_prefix("./").unwrap_or(word);
    if let Some(dir) = word.strip_suffix('/') {
        return name(dir).then_some(word);
    }
    if let Some(hidden) = word.strip_prefix('.') {
        return (name(hidden) && !hidden.contains(['.', '/'])).then_some(word);
    }
    let (stem, ext) = word.rsplit_once('.')?;
    let extension = (1..=12).contains(&ext.len())
        && ext.bytes().all(|b| b.is_ascii_alphanumeric())
        && ext.bytes().any(|b| b.is_ascii_alphabetic());
    (extension && name(stem)).then_some(word)
}

/// Words a tool prints after a path to say it made it (`Report out/junit.xml generated`).
const MADE_AFTER: &[&str] = &[
    "written",
    "saved",
    "created",
    "generated",
    "exported",
    "built",
    "emitted",
    "produced",
    "stored",
    "uploaded",
    "downloaded",
    "rendered",
    "published",
    "ready",
];

/// Words between a path and the verb that says it was made ("was written", "has been
/// created successfully").
const MADE_AUXILIARIES: &[&str] = &[
    "was",
    "were",
    "is",
    "are",
    "has",
    "have",
    "been",
    "successfully",
];

/// A line that names a path and then says it was made, nothing after the verb but
/// `successfully`: the path.
fn made_after(t: &str) -> Option<&str> {
    let listed = |list: &[&str], w: &str| list.iter().any(|m| m.eq_ignore_ascii_case(w));
    if !t.split_whitespace().any(|w| listed(MADE_AFTER, w)) {
        return None;
    }
    let words: Vec<&str> = t.split_whitespace().collect();
    let at = words.iter().rposition(|w| w.contains(['/', '.']))?;
    let tail = &words[at + 1..];
    let verb = tail.iter().position(|w| listed(MADE_AFTER, w))?;
    let helpers_only = tail
        .iter()
        .enumerate()
        .all(|(i, w)| i == verb || listed(MADE_AUXILIARIES, w));
    let path = product(words[at].trim_matches(|c: char| "([\"'`)]".contains(c)))?;
    let others = names_a_path(&words[..at].join(" "));
    (helpers_only && at <= 12 && !others && super::failing_lines::line_score(t) < 2).then_some(path)
}

/// A line without what a tool prints after the path it made: a short group in brackets
/// without a path in it, a size or a duration (`12.3 kB`, `1.2MB`, `in 0.4s`, `120ms`),
/// a mark of success.
fn without_qualifiers(line: &str) -> &str {
    let mut t = line.trim_end();
    loop {
        let before = t.len();
        if let Some(open) = t
            .strip_suffix(')')
            .and_then(|r| r.rfind('('))
            .or_else(|| t.strip_suffix(']').and_then(|r| r.rfind('[')))
        {
            if t.len() - open <= 40 && !t[open..].contains('/') {
                t = t[..open].trim_end();
            }
        }
        if let Some((head, last)) = t.rsplit_once([' ', '\t']) {
            let head = head.trim_end();
            // `... done`, `... ok`: the dots a tool prints while it works go with the mark.
            if is_measure(last)
                || ["✓", "✔", "OK", "ok", "done"].contains(&last)
                || last.trim_matches(['.', '\u{2026}']).is_empty()
            {
                t = head;
            } else if is_unit(last) && head.rsplit(' ').next().is_some_and(is_number) {
                t = head.rsplit_once(' ').map_or(head, |(h, _)| h.trim_end());
            }
            if let Some(h) = t.strip_suffix(" in").filter(|_| t.len() < before) {
                t = h.trim_end();
            }
        }
        if t.len() == before {
            return t;
        }
    }
}

/// A size or a duration written as one word: `1.2MB`, `42KiB`, `0.4s`, `120ms`, `1m2s`.
fn is_measure(word: &str) -> bool {
    let digits = word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == 'm');
    digits.len() < word.len()
        && word.starts_with(|c: char| c.is_ascii_digit())
        && (is_unit(digits) || digits.is_empty() && word.ends_with('m'))
}

fn is_unit(word: &str) -> bool {
    [
        "B", "kB", "KB", "KiB", "MB", "MiB", "GB", "GiB", "kb", "mb", "bytes", "s", "ms", "sec",
        "secs", "seconds", "min",
    ]
    .contains(&word)
}

fn is_number(word: &str) -> bool {
    !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}
#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any line, in any script: every path read is a piece of it, and nothing panics
        /// (a key found before a multi-byte letter once sliced inside it).
        #[test]
        fn any_line_gives_pieces_of_itself(
            line in r#"([a-zç日é_ /.:=",{}()\[\]'`>-]|out|report|saved|written|to|in|file|\.json|s3://){0,24}"#,
        ) {
            let mut found = Vec::new();
            reported_paths(&line, |p| {
                found.push(p.to_owned());
                true
            });
            for p in found {
                prop_assert!(line.contains(&p), "{p:?} not in {line:?}");
            }
        }
    }

    #[test]
    fn a_file_written_keeps_its_name_however_the_tool_writes_it() {
        let made = |line: &str| {
            let mut all = Vec::new();
            reported_paths(line, |p| {
                all.push(p.to_string());
                true
            });
            all
        };
        for (line, path) in [
            (
                "Chart saved as \"plots/revenue by region q3.png\"",
                "plots/revenue by region q3.png",
            ),
            (
                "Package written to 'C:\\work\\pkg\\acme_tools-2.1.whl'",
                "C:\\work\\pkg\\acme_tools-2.1.whl",
            ),
            (
                "Build succeeded, created out\\Release\\viewer.exe",
                "out\\Release\\viewer.exe",
            ),
            (
                "The slide deck q4_board.pptx was generated.",
                "q4_board.pptx",
            ),
        ] {
            assert_eq!(made(line), vec![path.to_string()], "{line}");
        }
        // No word of writing, or no name of a file among its words.
        for line in [
            "Reading \"plots/revenue by region q3.png\" for the legend",
            "Saved your preferences, e.g. the theme and the language.",
            "Wrote 3 rows in 0.2s",
            "Skipped attachment payroll_q3.xlsx (not saved)",
        ] {
            assert!(made(line).is_empty(), "{line}: {:?}", made(line));
        }
    }

    #[test]
    fn a_path_an_output_reports_making_is_found_in_its_words() {
        for (line, path) in [
            ("Profile written to out/prof_q2.svg", "out/prof_q2.svg"),
            ("  trace saved as traces/run-7.json.", "traces/run-7.json"),
            ("Artifacts: dist/app-1.0.tar.gz", "dist/app-1.0.tar.gz"),
            ("export done -> data/exports/q3.csv", "data/exports/q3.csv"),
            (
                "Downloaded data/raw/sales_2024.csv",
                "data/raw/sales_2024.csv",
            ),
            ("[bundler] emitted build/main.js", "build/main.js"),
            ("Compiled 12 sources into target/app.jar", "target/app.jar"),
            ("Output file: out/r_a5.parquet", "out/r_a5.parquet"),
            (
                "[info] artifact uploaded: dist/r_a9.tar.gz",
                "dist/r_a9.tar.gz",
            ),
            // What tools print after the path: a size, a time, a mark, or the verb.
            ("Wrote out/report_k7.html (42 KB)", "out/report_k7.html"),
            (
                "Saved checkpoint to runs/exp3/best.pt in 2.4s",
                "runs/exp3/best.pt",
            ),
            ("Exported data/out_9.csv [ok]", "data/out_9.csv"),
            ("Created docs/api_ref.md 3.1 kB", "docs/api_ref.md"),
            (
                "Report reports/junit_q4.xml generated",
                "reports/junit_q4.xml",
            ),
            (
                "build/site/index.html was written successfully.",
                "build/site/index.html",
            ),
            (
                "The summary file results/summary_v2.json has been created",
                "results/summary_v2.json",
            ),
            ("bundle dist/app.min.js ready (12.3 kB)", "dist/app.min.js"),
        ] {
            assert_eq!(reported_path(line), Some(path), "{line}");
        }
        for line in [
            // Looked at, taken away, failed, or no product named.
            "Found 3 matches in src/lib/parse.py",
            "Opened src/config.yaml",
            "Deleted tmp/cache.db",
            "error: cannot write to out/report.xml",
            "cp src/a.py src/b.py",
            "Changed directory to /srv/app",
            "src/a.py",
            "See https://example.com/docs/index.html",
            "Opened src/config.yaml (read-only)",
            "Deleted tmp/cache.db (12 KB)",
            "src/app/models.py (modified)",
            "tests/test_api.py passed in 0.3s",
            "error: out/report.xml could not be written",
            "Copied src/a.py to src/b.py and out/c.py was written",
        ] {
            assert_eq!(reported_path(line), None, "{line}");
        }
    }

    #[test]
    fn a_directory_made_is_a_product_whatever_its_name_looks_like() {
        for (line, dir) in [
            (
                "mkdir: created directory 'build/artifacts_x9'",
                "build/artifacts_x9",
            ),
            (
                "mkdir: created directory 'build/reports_x9/'",
                "build/reports_x9/",
            ),
            (
                "mkdir: created directory \u{2018}exports_q7\u{2019}",
                "exports_q7",
            ),
            ("Created folder: reports/nightly_k3/", "reports/nightly_k3/"),
            ("created dir /data/cache/shards_7b", "/data/cache/shards_7b"),
            (
                "[setup] directory out/run-2024-05 created",
                "out/run-2024-05",
            ),
            ("Creating directory \"tmp/work_a1\" ... done", "tmp/work_a1"),
        ] {
            let mut made = Vec::new();
            reported_paths(line, |p| {
                made.push(p);
                true
            });
            assert_eq!(made, vec![dir], "{line}");
        }
        for line in [
            "Directory created successfully.",
            "mkdir: cannot create directory 'build/x': File exists",
            "created directory listing for the report",
            "Never touch the directory config/prod_q1, it is created by ops.",
        ] {
            assert!(!reports_path(line), "{line}");
        }
    }

    #[test]
    fn a_place_after_a_verb_of_making_a_directory_a_bare_name_or_a_bucket_is_reported() {
        for (line, path) in [
            // A preposition of place after the verb that put it there.
            (
                "Trace recorded in traces/sess_41.json (2.1 MB)",
                "traces/sess_41.json",
            ),
            (
                "Results stored under out/run_8/summary.csv",
                "out/run_8/summary.csv",
            ),
            // A directory written with its slash.
            ("Wrote 3 files to dist_k2/", "dist_k2/"),
            // A bare name of any extension, a hidden one, a `key=` value.
            ("Profile data dumped into perf_91.data", "perf_91.data"),
            (
                "Your notebook has been converted to slides_4.pdf",
                "slides_4.pdf",
            ),
            ("Successfully created virtual environment at .venv", ".venv"),
            (
                "Created wheel for pkg: filename=pkg_x-1.0-py3-none-any.whl",
                "pkg_x-1.0-py3-none-any.whl",
            ),
            // A bucket's object.
            (
                "Artifacts uploaded to s3://ci-bucket/run_77/logs.tar.gz",
                "s3://ci-bucket/run_77/logs.tar.gz",
            ),
            // An arrow alone, dots and a mark after the path.
            ("  -> build/app_5.js", "build/app_5.js"),
            (
                "Creating backup at backups/db_3.sql.gz ... done",
                "backups/db_3.sql.gz",
            ),
        ] {
            assert_eq!(reported_path(line), Some(path), "{line}");
        }
        for line in [
            // Where something was looked for or run, not what was made.
            "Found 3 matches in src/lib/parse.py",
            "Running tests in tests/test_api.py",
            "Changed directory to /srv/app",
            "Listening on http://127.0.0.1:8000/",
            "Using Python 3.12.1",
            "src/a.py -> src/b.py",
            // A viewer's or a runner's label names what it reads.
            "(Open file: /testbed/src/app/fields.py)",
            "[File: /testbed/src/app/fields.py (1998 lines total)]",
            "configfile: pyproject.toml",
        ] {
            assert_eq!(reported_path(line), None, "{line}");
        }
    }

    #[test]
    fn a_rule_that_names_a_file_reports_no_product() {
        let mut found = Vec::new();
        for line in [
            "Report written to out/r_1.html",
            "[INFO] Writing model weights and config: runs/a.pt, runs/a.json",
            "Never modify config/prod.yaml, it is generated.",
            "Do not overwrite out/baseline.json when you export.",
        ] {
            reported_paths(line, |p| {
                found.push(p.to_owned());
                true
            });
        }
        assert_eq!(found, ["out/r_1.html", "runs/a.pt", "runs/a.json"]);
    }

    #[test]
    fn a_key_that_names_a_product_gives_its_value() {
        let read = |line: &str| {
            let mut found = Vec::new();
            reported_paths(line, |p| {
                found.push(p.to_owned());
                true
            });
            found
        };
        for (line, path) in [
            (
                r#"{"status": "ok", "output_path": "results/pred_1.jsonl", "rows": 1200}"#,
                "results/pred_1.jsonl",
            ),
            (
                r#"{"artifact": "gs://ml-runs/exp_2/model.tar.gz", "size_mb": 413}"#,
                "gs://ml-runs/exp_2/model.tar.gz",
            ),
            (
                "report_file=build/lint_3.txt status=done",
                "build/lint_3.txt",
            ),
            ("outfile: coverage/lcov_4.info", "coverage/lcov_4.info"),
            ("reportPath: out/junit_5.xml", "out/junit_5.xml"),
            (
                "New file: migrations/0043_add_index.sql",
                "migrations/0043_add_index.sql",
            ),
        ] {
            assert_eq!(read(line), [path], "{line}");
        }
        for line in [
            r#"{"input_path": "data/raw.csv", "config": "conf/app.yaml"}"#,
            "configfile: pyproject.toml",
            "url=https://example.com/report.html",
        ] {
            assert!(read(line).is_empty(), "{line}");
        }
    }
}
