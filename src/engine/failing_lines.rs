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
        // A candidate that opens a line (`\nE `) is on the line after its newline.
        let found = m.start() + usize::from(text.as_bytes()[m.start()] == b'\n');
        if found < done {
            continue;
        }
        let start = text[done..found]
            .rfind('\n')
            .map_or(done, |at| done + at + 1);
        let end = line_end(text, found);
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
    // A diagnostic at a line and a column holds no candidate word as often as not (Go's
    // `undefined: x`); the first one stands when no line says more.
    if best.as_ref().is_none_or(|(b, _)| *b < COLUMN_SCORE) {
        if let Some((start, end)) = first_column_line(text) {
            let line = one_line(text[start..end].trim(), MAX_LINE);
            if !line.is_empty() {
                best = Some((COLUMN_SCORE, line));
            }
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
    if t.starts_with("E ")
        || coded(t)
        || kotlin_error(t)
        || CANDIDATES.as_ref().is_some_and(|c| c.is_match(t))
    {
        score(t)
    } else if column_diagnostic(t) {
        COLUMN_SCORE
    } else {
        0
    }
}

/// The score of a diagnostic at a line and a column ([`column_diagnostic`]).
const COLUMN_SCORE: u8 = 4;

/// The first line of `text` that [`column_diagnostic`] reads as a diagnostic, found apart
/// from the candidate words: where it starts and ends.
fn first_column_line(text: &str) -> Option<(usize, usize)> {
    let mut done = 0;
    for m in COLUMN_ENDS.as_ref()?.find_iter(text) {
        if m.start() < done {
            continue;
        }
        let start = text[..m.start()].rfind('\n').map_or(0, |at| at + 1);
        let end = line_end(text, m.start());
        done = end + 1;
        if column_diagnostic(text[start..end].trim_start()) {
            return Some((start, end));
        }
    }
    None
}

/// How much a line (without its indentation) says about a failure: 0 nothing, 7 the most.
/// A line that counts no failure at all ("0 failed", "errors_total 0", "failed jobs:
/// none") says nothing, unless a stronger form marks it a report.
fn score(t: &str) -> u8 {
    match scored(t) {
        1..=3 if counts_none(t) => 0,
        s => s,
    }
}

/// Words a count of failures is said in.
const FAILURE_COUNTED: &[&str] = &[
    "fail",
    "failed",
    "failures",
    "failure",
    "error",
    "errors",
    "exception",
    "exceptions",
    "warning",
    "warnings",
    "fatal",
];

/// Whether every failure word of a line counts none: a zero right before or after it ("0
/// failed", "0 records failed", "failed: 0"), or ending the line ("errors_total{svc=\"a\"} 0",
/// "error_rate=0.00", "failed jobs: none", "Exception count (last 24h): 0").
fn counts_none(t: &str) -> bool {
    let words: Vec<&str> = t
        .split(|c: char| c.is_whitespace() || "=:{},;()[]".contains(c))
        .filter(|w| !w.is_empty())
        .collect();
    let zero = |w: &str| {
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        w.eq_ignore_ascii_case("none")
            || (!w.is_empty() && w.bytes().all(|b| b == b'0' || b == b'.') && w.starts_with('0'))
    };
    let failing = |w: &str| {
        let w = w.to_ascii_lowercase();
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_');
        w.split('_').any(|part| FAILURE_COUNTED.contains(&part))
    };
    let last_zero = words.last().is_some_and(|w| zero(w));
    let mut any = false;
    for i in (0..words.len()).filter(|&i| failing(words[i])) {
        any = true;
        // "0 failed", "0 records failed"; "failed: 0", "error_rate=0.00".
        let near = i.saturating_sub(2)..(i + 2).min(words.len());
        if !last_zero && !near.into_iter().any(|j| j != i && zero(words[j])) {
            return false;
        }
    }
    any
}

/// [`score`] before a count of none is taken into account.
fn scored(t: &str) -> u8 {
    // A heading (`ERRORS:`, `=== FAILURES ===`) or a bare word says nothing on its own.
    let words = t
        .trim_matches(|c: char| !c.is_alphanumeric())
        .split_whitespace()
        .count();
    // A process the system ended says so in one word (`Killed`, `OOMKilled`).
    if words < 2 && !died(t) {
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
        let rest = rest.trim();
        // `npm error code ERESOLVE` names the failure's kind: said when nothing says more.
        return if rest.starts_with("code ") {
            2
        } else if npm_boilerplate(rest) {
            1
        } else {
            5
        };
    }
    if t.starts_with("error[") {
        return 6;
    }
    // `error: ...`, `ERROR: ...`, `Error: ...`.
    if let Some(rest) = t.get(..7).filter(|p| p.eq_ignore_ascii_case("error: ")) {
        let rest = &t[rest.len()..];
        // cargo's closing line says only that there were errors.
        let closing = rest.starts_with("could not compile")
            || rest.starts_with("aborting due to")
            || rest.starts_with("Recipe `");
        return if closing { 1 } else { 5 };
    }
    if t.contains("panicked at")
        || coded(t)
        || kotlin_error(t)
        || t.starts_with("--- FAIL:")
        || t.starts_with("panic: ")
        || t.starts_with("fatal: ")
        || t.starts_with("fatal error:")
        || t.starts_with("Exception in thread ")
        || located_error(t)
    {
        return 5;
    }
    // A diagnostic at a line and column whatever its words (Go's `main.go:41:9:
    // undefined: x`, a linter's `a.py:3:1: F401 'os' imported but unused`), ESLint's
    // `27:11  error  message  rule`, git's merge conflict, Jest's failed test, a linker's
    // missing symbol.
    if column_diagnostic(t)
        || stylish_error(t)
        || t.starts_with("CONFLICT (")
        || t.starts_with("\u{25cf} ")
        || t.contains("undefined reference to")
    {
        return 4;
    }
    // pytest's assertion lines: `E       AssertionError: ...`; any other is the detail
    // of one (`E       assert 3 == 4`).
    let (t, detail) = match t.strip_prefix("E ") {
        Some(rest) => (rest.trim_start_matches(' '), 3),
        None => (t, 0),
    };
    // Java's cause of a wrapped exception.
    let t = t.strip_prefix("Caused by: ").unwrap_or(t);
    if names_exception(t)
        || died(t)
        || severity_in_brackets(t)
        || K8S_FAILURES.iter().any(|r| t.contains(r))
        || error_code_first(t)
        || t.starts_with("FAIL:")
        || t.starts_with("FAIL ")
        || t.starts_with("[ERROR] ")
        || http_error(t)
    {
        return 4;
    }
    if detail > 0 {
        return detail;
    }
    if t.contains("command not found")
        || t.contains("No such file or directory")
        || t.contains("Permission denied")
        || located(t).is_some_and(names_exception)
        || program_complaint(t)
        || nonzero_exit(t)
        || step_failed(t)
        || network_failure(t)
        || failure_first(t)
        || make_failed(t)
    {
        return 3;
    }
    if starts_like_error(t) || ERROR_MARKERS.as_ref().is_some_and(|ac| ac.is_match(t)) {
        return 2;
    }
    0
}

/// A diagnostic led by its code: `TS2339: Property 'x' does not exist`, `CS0103: The
/// name 'y' does not exist`, `C2065: 'z': undeclared identifier`: one to three capitals,
/// three to five digits, a colon and a message.
fn coded(t: &str) -> bool {
    let letters = t.bytes().take_while(u8::is_ascii_uppercase).count();
    // Oracle writes a hyphen between them: `ORA-00942: table or view does not exist`.
    let dash = usize::from(t[letters..].starts_with('-'));
    let digits = t[letters + dash..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    let end = letters + dash + digits;
    (1..=3).contains(&letters)
        && (3..=5).contains(&digits)
        && t[end..].starts_with(": ")
        && t.len() > end + 4
}

/// The Kotlin compiler's error, `e: ` then where and what (`e: file:///app/Main.kt:12:5
/// Unresolved reference: foo`, older `e: /app/Main.kt: (12, 5): Type mismatch`); its
/// warnings start `w: `.
fn kotlin_error(t: &str) -> bool {
    t.strip_prefix("e: ").is_some_and(|rest| {
        let place = rest.split_whitespace().next().unwrap_or("");
        place.contains(['/', '.']) && rest.len() > place.len() + 4
    })
}

/// A report at a line and a column of a file, then its message: `cmd/api/main.go:41:9:
/// undefined: retryPolicy`, `src/a.py:3:1: F401 'os' imported but unused`. A search
/// prints a line's contents after one number (`a.py:3:    return x`), a diagnostic gives
/// two; a warning, a note or a hint is not a failure.
fn column_diagnostic(t: &str) -> bool {
    let Some((place, rest)) = t.split_once(": ") else {
        return false;
    };
    let mut parts = place.rsplitn(3, ':');
    let (Some(column), Some(line), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let aside = ["warning", "note", "info", "hint", "help"].iter().any(|w| {
        rest.get(..w.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(w))
    });
    number(column)
        && number(line)
        && file.contains('.')
        && !file.contains(char::is_whitespace)
        && rest.starts_with(|c: char| !c.is_whitespace())
        && !aside
}

/// A line or column number.
fn number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// ESLint's default report, a line under the file's name: `  27:11  error  'x' is
/// assigned a value but never used  no-unused-vars`.
fn stylish_error(t: &str) -> bool {
    let Some((place, rest)) = t.split_once(char::is_whitespace) else {
        return false;
    };
    place
        .split_once(':')
        .is_some_and(|(l, c)| number(l) && number(c))
        && rest
            .trim_start()
            .strip_prefix("error")
            .is_some_and(|m| m.starts_with(char::is_whitespace) && !m.trim().is_empty())
}

/// A connection that failed, as a client or the system says it: `Could not connect to
/// Redis at 127.0.0.1:6379: Connection refused`, `dial tcp 10.0.3.4:5432: connect:
/// connection refused`, `context deadline exceeded`, `x509: certificate signed by unknown
/// authority`.
fn network_failure(t: &str) -> bool {
    const FAILURES: &[&str] = &[
        "connection refused",
        "connection reset",
        "reset by peer",
        "no route to host",
        "name or service not known",
        "temporary failure in name resolution",
        "could not resolve host",
        "deadline exceeded",
        "certificate verify failed",
        "unknown authority",
        "certificate has expired",
        "broken pipe",
        "network is unreachable",
        "host is unreachable",
    ];
    static FOUND: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| insensitive(FAILURES));
    FOUND.as_ref().is_some_and(|ac| ac.is_match(t))
}

/// A searcher for `phrases` in any ASCII case: the lines a candidate word finds are asked
/// several such questions, and a lowercased copy of each was most of their cost.
fn insensitive(phrases: &[&str]) -> Option<AhoCorasick> {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(phrases)
        .ok()
}

/// A short line that opens by saying what could not be done: `Could not find a version
/// that satisfies the requirement x`, `Unable to locate package y`, `Failed to fetch z`,
/// `Cannot find module './w'`; not a question ("Unable to log in? ...").
fn failure_first(t: &str) -> bool {
    const OPENINGS: &[&str] = &[
        "Could not ",
        "Cannot ",
        "Can't ",
        "Unable to ",
        "Failed to ",
    ];
    t.len() <= 200 && !t.contains('?') && OPENINGS.iter().any(|o| t.starts_with(o))
}

/// make's line for a target whose recipe failed: `make: *** [Makefile:23: build] Error
/// 2`, `make[1]: *** No rule to make target 'x'`.
fn make_failed(t: &str) -> bool {
    t.strip_prefix("make")
        .map(|rest| rest.trim_start_matches(|c: char| c == '[' || c == ']' || c.is_ascii_digit()))
        .is_some_and(|rest| rest.starts_with(": *** "))
}

/// What follows a place in a file, `tests/a.py:41: ` or `src/b.c:3:9: `: the report made
/// there (`tests/a.py:41: AssertionError`).
fn located(t: &str) -> Option<&str> {
    let (place, rest) = t.split_once(": ")?;
    let (file, line) = place.split_once(':')?;
    let numbered = !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit() || b == b':');
    (numbered && file.contains('.') && !file.contains(char::is_whitespace)).then_some(rest)
}

/// A process the system ended: `Segmentation fault (core dumped)`, `Killed: 9`,
/// `Aborted`, `Bus error`, an out-of-memory kill.
fn died(t: &str) -> bool {
    const DEATHS: &[&str] = &[
        "Segmentation fault",
        "Killed",
        "Aborted",
        "Bus error",
        "Illegal instruction",
        "Floating point exception",
        "OOMKilled",
        "Out of memory",
    ];
    // A shell names the program it lost, in lowercase: `zsh: segmentation fault  python
    // train.py`.
    let (t, shell) = match t.split_once(": ") {
        Some((shell, rest)) if ["sh", "bash", "zsh", "fish", "dash", "ksh"].contains(&shell) => {
            (rest, true)
        }
        _ => (t, false),
    };
    DEATHS.iter().any(|d| {
        t.get(..d.len())
            .filter(|head| *head == *d || (shell && head.eq_ignore_ascii_case(d)))
            .map(|_| &t[d.len()..])
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', ':', '(']))
    }) || t.contains("(core dumped)")
}

/// Words that say something could not be done.
const FAILURE_WORDS: &[&str] = &[
    "cannot ",
    "can't ",
    "could not ",
    "couldn't ",
    "unable to ",
    "failed",
    "refused",
    "denied",
    "not found",
    "no such ",
    "timed out",
];

/// A server's log line by its level: nginx's `2024/05/12 09:14:03 [emerg] 1#1: bind()
/// failed`, Apache's `[error]`, `[crit]`.
fn severity_in_brackets(t: &str) -> bool {
    ["[emerg]", "[alert]", "[crit]", "[error]"]
        .iter()
        .any(|level| t.contains(level))
}

/// Why Kubernetes says a pod or a scheduling failed: `Reason: OOMKilled`, `Warning
/// FailedScheduling ... 0/6 nodes are available`, `Back-off ... CrashLoopBackOff`.
const K8S_FAILURES: &[&str] = &[
    "OOMKilled",
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "FailedScheduling",
    "FailedMount",
    "FailedCreate",
    "FailedAttachVolume",
    "CreateContainerConfigError",
    "Evicted",
];

/// A line led by an error code in capitals: `ERR_PNPM_OUTDATED_LOCKFILE  Cannot
/// install`, `ERR_MODULE_NOT_FOUND`.
fn error_code_first(t: &str) -> bool {
    let first = t.split_whitespace().next().unwrap_or("");
    let code = first.trim_end_matches(':');
    code.len() > 4
        && code.starts_with("ERR_")
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A program's own complaint: its name, a colon, and a failure said in words (`curl: (7)
/// Failed to connect`, `go: cannot find main module`, `tar: Cannot open: No such file`).
/// The name is one lowercase word, as programs call themselves; a person's "Note: ..." or
/// a key's `timeout: 30` is not one.
fn program_complaint(t: &str) -> bool {
    let Some((name, rest)) = t.split_once(": ") else {
        return false;
    };
    let program = !name.is_empty()
        && name.len() <= 24
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    static FOUND: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| insensitive(FAILURE_WORDS));
    program && FOUND.as_ref().is_some_and(|ac| ac.is_match(rest))
}

/// A command that ended with a status other than 0: `exited with code 2`, `exit status
/// 127`, `returned non-zero exit status 1`.
fn nonzero_exit(t: &str) -> bool {
    static FOUND: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
        insensitive(&[
            "exited with code ",
            "exit code ",
            "exit status ",
            "exited with status ",
            "non-zero code: ",
        ])
    });
    let Some(ac) = FOUND.as_ref() else {
        return false;
    };
    ac.find_overlapping_iter(t).any(|m| {
        let code = &t[m.end()..];
        let code = code.strip_prefix('-').unwrap_or(code);
        let digits = code.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && code[..digits].bytes().any(|b| b != b'0')
    })
}

/// A short line that says a step failed, `Build failed with 3 errors.`, `Deployment
/// failed`, `Compilation failed.`; not a count of tests (`0 failed`, `3 failed, 9 passed`),
/// which a runner's summary line reports.
fn step_failed(t: &str) -> bool {
    if t.split_whitespace().nth(10).is_some() {
        return false;
    }
    let mut before: Option<&str> = None;
    t.split_whitespace().any(|w| {
        let failed = w
            .trim_end_matches(['.', ',', '!', ':'])
            .eq_ignore_ascii_case("failed")
            && before.is_some_and(|b| !b.bytes().all(|c| c.is_ascii_digit()));
        before = Some(w);
        failed
    })
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
/// name ending in Error or Exception, then a colon (not Rust's `Error::new`); or a type
/// of a library's module, whatever its name ends in, then its message
/// (`psycopg2.errors.UniqueViolation: duplicate key`, `httpx.ConnectTimeout: timed out`).
fn names_exception(t: &str) -> bool {
    let name_end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'))
        .unwrap_or(t.len());
    let name = &t[..name_end];
    let rest = &t[name_end..];
    let said = rest.starts_with(':') && !rest.starts_with("::");
    ((name.ends_with("Error") || name.ends_with("Exception")) && (rest.is_empty() || said))
        || (module_type(name) && rest.starts_with(": "))
        || namespaced_type(t)
}

/// `Bundler::GemNotFound: Could not find ...`, `ActiveRecord::RecordNotFound: ...`: a type
/// in a namespace written with `::` (Ruby, C++, PHP's `\` aside), then its message.
fn namespaced_type(t: &str) -> bool {
    let Some((name, _)) = t.split_once(": ") else {
        return false;
    };
    let Some((_, ty)) = name.rsplit_once("::") else {
        return false;
    };
    let ident =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    name.split("::").all(ident)
        && ty.len() >= 4
        && ((ty.starts_with(|c: char| c.is_ascii_uppercase())
            && ty.bytes().any(|b| b.is_ascii_lowercase()))
            || ty.ends_with("error"))
}

/// `psycopg2.errors.UniqueViolation`: a lowercase module path, then a type in CamelCase.
fn module_type(name: &str) -> bool {
    let Some((module, ty)) = name.rsplit_once('.') else {
        return false;
    };
    let ident =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    module.starts_with(|c: char| c.is_ascii_lowercase())
        && module.split('.').all(ident)
        && ty.len() >= 4
        && ty.starts_with(|c: char| c.is_ascii_uppercase())
        && ty.bytes().any(|b| b.is_ascii_lowercase())
        && ident(ty)
}

/// A compiler's diagnostic at a place in a file: `src/a.c:12:5: error: ...`,
/// `Main.java:9: error: ...`, `app.ts(3,7): error TS2322: ...`,
/// `x.cpp(12): fatal error C1083: ...`.
fn located_error(t: &str) -> bool {
    let Some(at) = t.find(": error").or_else(|| t.find(": fatal error")) else {
        return false;
    };
    let place = &t[..at];
    !place.contains(char::is_whitespace)
        && place.contains(['.', '/'])
        && place.bytes().any(|b| b.is_ascii_digit())
        && (place.contains(':') || place.ends_with(')'))
}

/// Reasons an HTTP error status is written with.
const HTTP_REASONS: &[&str] = &[
    "Bad Request",
    "Unauthorized",
    "Payment Required",
    "Forbidden",
    "Not Found",
    "Method Not Allowed",
    "Request Timeout",
    "Conflict",
    "Gone",
    "Payload Too Large",
    "Unprocessable",
    "Too Many Requests",
    "Internal Server Error",
    "Not Implemented",
    "Bad Gateway",
    "Service Unavailable",
    "Gateway Timeout",
];

/// An HTTP error status as clients report it: `HTTP 503 Service Unavailable`,
/// `HTTP/1.1 502 Bad Gateway`, `HTTP Error 404: Not Found`, `status code 429`,
/// `429 Too Many Requests`.
fn http_error(t: &str) -> bool {
    let b = t.as_bytes();
    // Each three-digit word from 400 to 599 (`503`, `(429)`, `404:`), as cheap as the
    // bytes of the line.
    (0..b.len().saturating_sub(2)).any(|i| {
        let status = matches!(b[i], b'4' | b'5')
            && b[i + 1].is_ascii_digit()
            && b[i + 2].is_ascii_digit()
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
            && b.get(i + 3).is_none_or(|c| !c.is_ascii_alphanumeric());
        status && http_status_at(t, i)
    })
}

/// Whether the status at `at` is one: "HTTP", "status" or "code" stands in the three
/// words before it, or a reason phrase follows it.
fn http_status_at(t: &str, at: usize) -> bool {
    let named = t[..at].split_whitespace().rev().take(3).any(|w| {
        w.starts_with("HTTP") || w.eq_ignore_ascii_case("status") || w.eq_ignore_ascii_case("code")
    });
    let rest = t[at + 3..].trim_start_matches([':', ')', ' ']);
    named || HTTP_REASONS.iter().any(|r| rest.starts_with(r))
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
    insensitive(&[
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
        "exited with",
        "cannot ",
        "can't ",
        "could not",
        "couldn't",
        "unable to",
        "denied",
        "segmentation fault",
        "core dumped",
        "killed",
        "aborted",
        "bus error",
        "illegal instruction",
        "floating point exception",
        "out of memory",
        // HTTP statuses (`HTTP 503`, `HTTP/1.1 502`; not every URL), and library
        // exceptions whose names say no "error".
        "http ",
        "http/",
        "status code",
        "bad request",
        "unauthorized",
        "forbidden",
        "unavailable",
        "too many requests",
        "bad gateway",
        "timeout",
        "timed out",
        "refused",
        "violation",
        "exceeded",
        "invalid",
        // Connections that failed, merge conflicts, Jest's failed tests, a linker's
        // missing symbol, make's failed recipe.
        "reset by peer",
        "connection reset",
        "no route to host",
        "not known",
        "name resolution",
        "unknown authority",
        "broken pipe",
        "unreachable",
        "conflict (",
        "\u{25cf} ",
        "undefined reference",
        "ora-",
        "non-zero",
        "[emerg]",
        "[crit]",
        "[alert]",
        "oomkilled",
        "backoff",
        "errimagepull",
        "evicted",
        "err_",
        ": *** ",
        // pytest's detail lines, `E   assert 3 == 4`, and the Kotlin compiler's errors,
        // `e: Main.kt:3:9 ...`, at a line's start.
        "\nE ",
        "\ne: ",
    ])
});

/// A digit, a colon and a space: how a place's line and column end before a diagnostic's
/// message (`main.go:41:9: undefined: x`). Searched apart from [`CANDIDATES`]: a file
/// shown with its line numbers (`237:    return x`) holds one on every line, and only
/// [`column_diagnostic`] is asked of those.
static COLUMN_ENDS: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    AhoCorasick::builder()
        .build([
            "0: ", "1: ", "2: ", "3: ", "4: ", "5: ", "6: ", "7: ", "8: ", "9: ",
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
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any output, in any script: the error line read is one of its lines, quoted as
        /// it stands (a place's numbers, a label and a dash are sliced by byte offsets).
        #[test]
        fn any_output_gives_one_of_its_lines(
            text in r#"([a-zé日 .:/()\-\n]|[0-9]{1,3}|error|failed|refused|: |\u{25cf} |make|ORA-|Killed){0,30}"#,
        ) {
            if let Some(line) = error_line(&text) {
                prop_assert!(
                    text.lines().any(|l| l.contains(line.trim_end_matches("..."))),
                    "{line:?} not a line of {text:?}"
                );
            }
            for l in text.lines() {
                line_score(l);
            }
        }
    }

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
    fn the_kotlin_compilers_error_is_the_line_that_says_what_failed() {
        for e in [
            "e: file:///home/u/app/src/main/kotlin/Main.kt:12:5 Unresolved reference: fooBar",
            "e: /srv/app/src/Config.kt: (40, 17): Type mismatch: inferred type is String? but String was expected",
            "e: src/main/kotlin/Retry.kt:7:1 Expecting a top level declaration",
        ] {
            let gradle = format!(
                "> Task :app:compileKotlin FAILED\nw: /srv/app/src/Old.kt: (3, 5): Parameter 'x' is never used\n{e}\n\nFAILURE: Build failed with an exception.\nBUILD FAILED in 3s"
            );
            assert_eq!(error_line(&gradle).as_deref(), Some(e), "{gradle}");
        }
        // A warning, and a line that only starts like one, are not.
        assert_eq!(
            line_score("w: /srv/app/src/Old.kt: (3, 5): Parameter 'x' is never used"),
            0
        );
        assert_eq!(line_score("e: 4"), 0);
    }

    #[test]
    fn any_diagnostic_line_is_an_error_line() {
        // Each appended to ordinary output, as an agent's tool hands it back.
        for line in [
            "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host db:5432",
            "botocore.errorfactory.NoSuchBucket: The specified bucket does not exist",
            "httpx.ReadTimeout: timed out while reading the response",
            "psycopg.errors.UndefinedColumn: column \"tenant\" does not exist",
            "ERROR: could not open extension control file",
            "Error: Cannot find module './routes/billing'",
            "lib/queue.c:88:14: error: 'slot' undeclared (first use in this function)",
            "web/app.ts(41,9): error TS2345: Argument of type 'string' is not assignable",
            "HTTP 503 Service Unavailable",
            "curl: (22) The requested URL returned error: 429 Too Many Requests",
            "Exception in thread \"worker-2\" java.util.ConcurrentModificationException",
            "Caused by: org.postgresql.util.PSQLException: FATAL: role \"app\" does not exist",
            "panic: runtime error: slice bounds out of range [:9] with capacity 4",
            "npm ERR! Could not resolve dependency: peer react@\"^17\"",
        ] {
            let out = format!("collecting inputs\nstep 1 done\n{line}\n");
            assert_eq!(error_line(&out).as_deref(), Some(line), "{line}");
            assert!(line_score(line) >= 4, "{line}: {}", line_score(line));
        }
        // pytest's detail lines report too, below the exception that names the
        // failure; a line is quoted as written, its spaces included.
        let pytest =
            "    def test_total():\n>       assert total([1, 2]) == 4\nE       assert 3 == 4\n";
        assert_eq!(error_line(pytest).as_deref(), Some("E       assert 3 == 4"));
    }

    #[test]
    fn diagnostics_without_the_word_error_are_error_lines() {
        for line in [
            // At a line and a column: Go's compiler and vet, linters of other languages.
            "services/ledger/post.go:212:14: undefined: ledgerClient",
            "cmd/worker/run.go:9:2: \"os/signal\" imported and not used",
            "api/v2/users.go:58:23: too many arguments in call to s.Save",
            "billing/rates.py:14:1: F811 redefinition of unused 'Decimal' from line 3",
            "lib/tokenize.rb:40:7: Lint/UselessAssignment: Useless assignment to variable - idx.",
            // ESLint's default format.
            "31:7  error  'retryCount' is defined but never used  no-unused-vars",
            "112:3  error  Unexpected console statement  no-console",
            // Connections.
            "Could not connect to Postgres at db.internal:5432: Connection refused",
            "read tcp 172.18.0.4:51522->172.18.0.2:6379: read: connection reset by peer",
            "urlopen error [Errno -3] Temporary failure in name resolution",
            "Get \"https://registry.local/v2/\": context deadline exceeded",
            "SSL: CERTIFICATE_VERIFY_FAILED certificate verify failed: self-signed certificate",
            // Other tools' ways of saying it.
            "CONFLICT (modify/delete): config/limits.toml deleted in HEAD",
            "\u{25cf} Checkout \u{203a} rejects an expired card",
            "/usr/bin/ld: cache.o: undefined reference to `lru_evict'",
            "make[2]: *** [CMakeFiles/app.dir/build.make:76: app] Error 1",
            "make: *** No rule to make target 'dist/bundle.js'.  Stop.",
            "ORA-01017: invalid username/password; logon denied",
            "Unable to locate package libssl1.1",
            "Failed to start nginx.service: Unit nginx.service not found.",
            "Could not find a version that satisfies the requirement torch==1.0.0",
            "The command '/bin/sh -c make release' returned a non-zero code: 2",
            "wget: unable to resolve host address 'mirror.example'",
            "Killed",
            "OOMKilled",
            // A type in a `::` namespace (Ruby, C++), a shell's report of the program it
            // lost.
            "ActiveRecord::RecordNotFound: Couldn't find Invoice with 'id'=88",
            "Bundler::GemNotFound: Could not find rake-13.0.6 in any of the sources",
            "zsh: segmentation fault (core dumped)  ./bench --threads 8",
            "bash: killed     python train.py --epochs 40",
        ] {
            assert!(line_score(line) >= 3, "{line}: {}", line_score(line));
            let out = format!("fetching\n  building step 2\n{line}\nwaiting\n");
            assert_eq!(error_line(&out).as_deref(), Some(line), "{line}");
        }
        // A search's hits (one number, or the code indented after the column), a
        // warning or a note at a place, a count, a question, a setting: no failure.
        for line in [
            "services/ledger/post.go:212: func post(ctx context.Context) error {",
            "src/app/models.py:12:    retries: int = 3",
            "src/app/models.py:12:5:     return None",
            "lib/a.c:3:5: warning: unused variable 'n'",
            "lib/a.c:3:5: note: declared here",
            "ui/App.tsx:4:1: Hint: prefer a const",
            "31:7  warning  'x' is defined but never used  no-unused-vars",
            "Unable to log in? Reset your password from the start page.",
            "retries: 3",
            "12:30: standup",
        ] {
            assert!(line_score(line) < 3, "{line}: {}", line_score(line));
        }
    }

    #[test]
    fn names_and_statuses_that_report_nothing_are_no_error() {
        for line in [
            "logging.handlers.RotatingFileHandler rotates at midnight",
            "served 200 OK in 12ms",
            "see http://example.com/status for the 404 page design",
            "src/app.c:12:5: warning: unused variable 'x'",
            "Error handling is described in docs/errors.md",
        ] {
            assert!(line_score(line) < 4, "{line}: {}", line_score(line));
        }
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

    #[test]
    fn failures_told_without_the_word_error_are_reported() {
        // A program's own complaint, a process the system ended, a status other than 0,
        // a step that failed, a diagnostic led by its code, an exception at a place.
        for line in [
            "curl: (6) Could not resolve host: mirror.internal",
            "tar: Cannot open: No such file or directory",
            "go: cannot find main module, but found .git/config in /src",
            "scp: remote open \"/srv/x\": Permission denied",
            "Segmentation fault (core dumped)",
            "Killed: 9",
            "Aborted (core dumped)",
            "Bus error",
            "Process exited with code 137",
            "subprocess returned non-zero exit status 2",
            "Build failed with 3 errors.",
            "Deployment failed: image pull back-off",
            "TS2339: Property 'total' does not exist on type 'Cart'.",
            "CS0103: The name 'cfg' does not exist in the current context",
            "C2065: 'buf': undeclared identifier",
            "tests/test_cart.py:57: KeyError",
            "src/app/models.py:12:4: ValueError",
        ] {
            assert!(line_score(line) >= 2, "{line}");
        }
        // Said in passing, counted, or a setting: no failure reported.
        for line in [
            "Note: the cache cannot be shared between users.",
            "timeout: 30",
            "Process exited with code 0",
            "12 passed, 0 failed in 3.1s",
            "3 failed, 9 passed in 2.2s",
            "The killer feature is the cache.",
            "AB12: see section 4",
            "config.yaml:3: name",
        ] {
            assert!(line_score(line) < 2, "{line}");
        }
    }

    #[test]
    fn server_and_cluster_reports_are_errors_and_counts_of_none_are_not() {
        for line in [
            "2025/01/07 10:02:11 [crit] 88#88: *1 connect() to unix:/run/php.sock failed",
            "[Tue Jan 07 10:02:11 2025] [error] [client 10.1.2.3] File does not exist: /srv/www",
            "  Reason:       OOMKilled",
            "api-7d9c-xk2 0/1 CrashLoopBackOff 6 (2m ago) 9m",
            "Warning  FailedMount  41s  kubelet  MountVolume.SetUp failed for volume \"certs\"",
            "ERR_MODULE_NOT_FOUND Cannot find package 'zod' imported from /app/index.js",
        ] {
            assert!(line_score(line) >= 2, "{line}");
        }
        for line in [
            "sync finished: 1200 rows copied, 0 rows failed",
            "http_errors_total{route=\"/login\"} 0",
            "Dead-letter queue (failed messages): none",
            "warning_count=0 run=nightly",
            "Unhandled exceptions since restart: 0",
        ] {
            assert!(line_score(line) < 2, "{line}");
        }
        // A line that names a failure outright stays one, whatever its numbers.
        assert!(line_score("panic: runtime error: index out of range [0] with length 0") >= 2);
    }
}
