//! Which line of a command's output says what failed: used by the digest's error list and
//! by the one-line description of a pruned output.
//!
//! The first line that mentions an error is often the least useful one: a Python
//! traceback starts with `Traceback (most recent call last):` and names the exception on
//! its last line, pytest prints `FAILURES` long before its `FAILED test - reason` summary,
//! npm opens with `npm ERR! code 1`, and rustc ends with `error: could not compile`. So
//! every line gets a score for how much it says, and the best one wins; among equals the
//! first, except for Python exceptions, where the last traceback is the one that ended the
//! program. One search over the text finds the lines worth scoring; the rest are skipped.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, MatchKind};

use super::message::one_line;
use super::placeholders::{PRUNED_ERROR, PRUNED_PREFIX};

/// Longest error line kept.
const MAX_LINE: usize = 300;

/// Below this score a line is not reported at all: a marker inside a file's contents
/// ("not found" in a comment) is not a failure.
const MIN_SCORE: u8 = 2;

/// The line of `text` that best says what failed, if any line reads like an error report.
/// Matching is kept narrow (tool-style prefixes and markers, not the bare word "error")
/// because file contents mention errors all the time.
pub fn error_line(text: &str) -> Option<String> {
    // An output pruned earlier already names its error, if it had one.
    if let Some(line) = text.strip_prefix(PRUNED_PREFIX) {
        return line
            .split_once(PRUNED_ERROR)
            .map(|(_, err)| err.trim_end_matches(']').to_string());
    }
    let candidates = CANDIDATES.as_ref()?;
    let mut best: Option<(u8, String)> = None;
    // Lines before this offset are done with.
    let mut done = 0;
    // Only lines holding a candidate word are scored: outputs run to megabytes of file
    // contents, and one search over the whole text finds them.
    for m in candidates.find_iter(text) {
        if m.start() < done {
            continue;
        }
        let start = text[done..m.start()]
            .rfind('\n')
            .map_or(done, |at| done + at + 1);
        let end = line_end(text, m.start());
        done = end + 1;
        let line = &text[start..end];
        let t = line.trim_start();
        // The last traceback is the one that ended the program; of other equals, the
        // first error is the one the rest follow from.
        let (score, found, last_wins) = if t.starts_with("Traceback (most recent call last)") {
            // Frames are indented; the first line that is not names the exception.
            let Some((exception, next)) = traceback_end(text, done) else {
                break;
            };
            done = next;
            (6, exception, true)
        } else {
            (score(t), line, false)
        };
        let better = match &best {
            None => score >= MIN_SCORE,
            Some((b, _)) => score > *b || (last_wins && score == *b),
        };
        if !better {
            continue;
        }
        let mut found = found.trim().to_string();
        // Rust prints a panic's message on the line after `panicked at file:line:col:`.
        if found.contains("panicked at") && found.ends_with(':') && done < text.len() {
            let next = &text[done..line_end(text, done)];
            found = format!("{found} {}", next.trim());
        }
        let found = one_line(&found, MAX_LINE);
        if !found.is_empty() {
            best = Some((score, found));
        }
    }
    best.map(|(_, line)| line)
}

/// Where the line holding `at` ends (its `\n`, or the end of the text).
fn line_end(text: &str, at: usize) -> usize {
    text[at..].find('\n').map_or(text.len(), |n| at + n)
}

/// The exception line that ends a traceback whose frames start at `from`, and where the
/// line after it starts.
fn traceback_end(text: &str, from: usize) -> Option<(&str, usize)> {
    let mut at = from;
    while at < text.len() {
        let end = line_end(text, at);
        let line = text[at..end].trim_end_matches('\r');
        if !line.starts_with([' ', '\t']) && !line.trim().is_empty() {
            return Some((line, end + 1));
        }
        at = end + 1;
    }
    None
}

/// How much one line says about a failure, 0 nothing to 7 the most, below 2 nothing worth
/// reporting: the digest lists every such line of an output, not only the best.
pub fn line_score(line: &str) -> u8 {
    let t = line.trim_start();
    if CANDIDATES.as_ref().is_some_and(|c| c.is_match(t)) {
        score(t)
    } else {
        0
    }
}

/// How much a line (without its indentation) says about a failure: 0 nothing, 7 the most.
fn score(t: &str) -> u8 {
    // A heading (`ERRORS:`, `=== FAILURES ===`) or a bare word says nothing on its own.
    let words = t
        .trim_matches(|c: char| !c.is_alphanumeric())
        .split_whitespace()
        .count();
    if words < 2 {
        return 0;
    }
    // pytest's short summary: the test and the reason, `FAILED tests/a.py::t - Err: msg`.
    if (t.starts_with("FAILED ") || t.starts_with("ERROR ")) && t.contains("::") {
        return 7;
    }
    if let Some(rest) = t
        .strip_prefix("npm ERR!")
        .or_else(|| t.strip_prefix("npm error"))
    {
        return if npm_boilerplate(rest.trim()) { 1 } else { 5 };
    }
    if t.starts_with("error[") {
        return 6;
    }
    if let Some(rest) = t.strip_prefix("error: ") {
        // cargo's closing line says only that there were errors.
        let closing = rest.starts_with("could not compile")
            || rest.starts_with("aborting due to")
            || rest.starts_with("Recipe `");
        return if closing { 1 } else { 5 };
    }
    if t.contains("panicked at")
        || t.starts_with("--- FAIL:")
        || t.starts_with("panic: ")
        || t.starts_with("fatal: ")
        || t.starts_with("fatal error:")
    {
        return 5;
    }
    // pytest's assertion lines: `E       AssertionError: ...`.
    let t = t
        .strip_prefix("E ")
        .map_or(t, |rest| rest.trim_start_matches(' '));
    if names_exception(t) || t.starts_with("FAIL:") || t.starts_with("FAIL ") {
        return 4;
    }
    if t.contains("command not found")
        || t.contains("No such file or directory")
        || t.contains("Permission denied")
    {
        return 3;
    }
    if starts_like_error(t) || ERROR_MARKERS.as_ref().is_some_and(|ac| ac.is_match(t)) {
        return 2;
    }
    0
}

/// npm's lines that frame an error without saying what it was.
fn npm_boilerplate(rest: &str) -> bool {
    const FRAMING: &[&str] = &[
        "code ",
        "errno",
        "syscall",
        "path ",
        "command",
        "workspace",
        "location",
        "A complete log",
        "Log files",
        "To see",
        "npm ",
        "/",
    ];
    rest.is_empty() || FRAMING.iter().any(|f| rest.starts_with(f))
}

/// `ValueError: ...`, `java.lang.IllegalStateException: ...`, `TypeError: ...`: a dotted
/// name ending in Error or Exception, then a colon (not Rust's `Error::new`).
fn names_exception(t: &str) -> bool {
    let name_end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'))
        .unwrap_or(t.len());
    let name = &t[..name_end];
    let rest = &t[name_end..];
    (name.ends_with("Error") || name.ends_with("Exception"))
        && (rest.is_empty() || (rest.starts_with(':') && !rest.starts_with("::")))
}

fn starts_like_error(t: &str) -> bool {
    const STARTS: &[&str] = &["error", "fatal", "exception", "panic", "failed", "failure"];
    let t = t.as_bytes();
    STARTS
        .iter()
        .any(|s| t.len() >= s.len() && t[..s.len()].eq_ignore_ascii_case(s.as_bytes()))
}

/// Words (in any case) without which a line scores nothing: every pattern [`score`]
/// looks for holds one of them.
static CANDIDATES: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build([
            "error",
            "fatal",
            "exception",
            "panic",
            "fail",
            "traceback",
            "npm err",
            "not found",
            "no such file",
            "permission denied",
            "exit code",
            "exit status",
        ])
        .ok()
});

/// Substrings that mark an error report anywhere in a line.
static ERROR_MARKERS: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build([
            "error: ",
            "error[",
            "Error: ",
            "ERROR",
            "FAILED",
            "FAIL:",
            "Exception:",
            "not found",
            "exit code",
            "exit status",
        ])
        .ok()
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tracebacks_give_their_last_line() {
        let out = "running\nTraceback (most recent call last):\n  File \"/repo/a.py\", line 3, in <module>\n    main()\n  File \"/repo/b.py\", line 9, in main\n    int(x)\nValueError: invalid literal for int() with base 10: 'x'\n";
        assert_eq!(
            error_line(out).as_deref(),
            Some("ValueError: invalid literal for int() with base 10: 'x'")
        );
        // Chained: the exception that ended the program is the last one.
        let chained = format!(
            "{out}\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"/repo/c.py\", line 1, in f\n    g()\nRuntimeError: import failed"
        );
        assert_eq!(
            error_line(&chained).as_deref(),
            Some("RuntimeError: import failed")
        );
    }

    #[test]
    fn the_informative_line_of_each_tool() {
        let rustc = "   Compiling a v0.1.0\nwarning: unused import: `std::fmt`\n --> src/a.rs:1:5\nerror[E0425]: cannot find value `addr` in this scope\n  --> src/b.rs:3:9\nerror: could not compile `a` (lib) due to 1 previous error";
        assert_eq!(
            error_line(rustc).as_deref(),
            Some("error[E0425]: cannot find value `addr` in this scope")
        );
        let pytest = "=== FAILURES ===\n___ test_y ___\n>       assert f() == 2\nE       AssertionError: assert 1 == 2\n\ntests/x.py:4: AssertionError\n=== short test summary info ===\nFAILED tests/x.py::test_y - AssertionError: assert 1 == 2\n=== 1 failed ===";
        assert_eq!(
            error_line(pytest).as_deref(),
            Some("FAILED tests/x.py::test_y - AssertionError: assert 1 == 2")
        );
        let npm = "npm WARN deprecated x@1\nnpm ERR! code 1\nnpm ERR! Missing script: \"build\"\nnpm ERR!\nnpm ERR! A complete log of this run can be found in:";
        assert_eq!(
            error_line(npm).as_deref(),
            Some("npm ERR! Missing script: \"build\"")
        );
        let panic = "running 1 test\nthread 't' panicked at src/sse.rs:88:9:\nassertion failed: ok\ntest t ... FAILED";
        assert_eq!(
            error_line(panic).as_deref(),
            Some("thread 't' panicked at src/sse.rs:88:9: assertion failed: ok")
        );
        assert_eq!(
            error_line("ERRORS:\nerror: boom").as_deref(),
            Some("error: boom")
        );
    }

    #[test]
    fn ordinary_text_has_no_error() {
        assert_eq!(error_line("all good\n3 passed"), None);
        assert_eq!(error_line("let e = MyError::new();\nreturn error;"), None);
        assert_eq!(error_line("Traceback (most recent call last):"), None);
        assert_eq!(error_line("=== FAILURES ===\nERRORS:\n"), None);
        assert!(error_line("test x ... FAILED").is_some());
    }

    #[test]
    fn pruned_outputs_name_their_error() {
        let pruned = crate::engine::prune::describe_output("bash", "ok\nerror: boom\n");
        assert_eq!(error_line(&pruned).as_deref(), Some("error: boom"));
        assert_eq!(
            error_line(&crate::engine::prune::describe_output("bash", "ok")),
            None
        );
    }
}
