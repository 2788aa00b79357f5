//! Hand scanning of free text for the digest: file paths, the commands of plain-text
//! agents, stated decisions, observations and constraints. No regular expressions: each
//! scan is linear in its text.

use std::sync::LazyLock;

use super::commitment::{self, NARRATION_VERBS};
use super::phrases::Phrases;

/// Fenced blocks tagged with one of these hold shell commands.
const SHELL_TAGS: &[&str] = &[
    "bash",
    "sh",
    "shell",
    "console",
    "zsh",
    "shell-session",
    "terminal",
    "cmd",
    "powershell",
    "ps1",
];

/// How plain-text agents (SWE-agent, mini-swe-agent, OpenHands' CodeAct and the like) hand
/// a command's output back as a user message.
const OBSERVATION_STARTS: &[&str] = &[
    "OBSERVATION",
    "Observation:",
    "<returncode>",
    "<output>",
    "<observation>",
    "Output:",
    "Exit code:",
    "EXECUTION RESULT",
    "[stdout]",
    "STDOUT:",
    "Command output",
];

/// Phrases that make a sentence of assistant text a decision or a conclusion. Strong ones
/// say what was found or chosen; weak ones announce a next step or give a passing reason,
/// which matters less once later turns have taken it.
const STRONG_DECISION: &[&str] = &[
    "decided",
    "decision",
    "the fix is",
    "the fix was",
    "root cause",
    "conclusion",
    "the problem is",
    "the problem was",
    "the issue is",
    "the issue was",
    "turns out",
    "instead",
    "go with",
    // How agents report a choice made ("I chose the streaming parser", "opted for").
    "chose",
    "opted",
    "from now on",
    "going forward",
    // Committing to an option, beside the verbs of [`COMMITTING`]: "in favour of zstd".
    "in favor of",
    "in favour of",
    "rather than",
    "i'd rather",
    "we'd rather",
    "choosing",
    "chosen",
    "prefer",
    "preferring",
    "adopt",
    "adopting",
    "be using",
    "the plan is",
    "the approach is",
    "the solution is",
    "the fix will be",
    "the plan will be",
    "the approach will be",
    "the solution will be",
    "i've concluded",
    "we've concluded",
    "i concluded",
    "we concluded",
    "best option",
    "better option",
    "best choice",
    "better choice",
    "right choice",
    "way to go",
    "way forward",
    "path forward",
    "final call",
    "bottom line",
    "my call is",
    "our call is",
    "best bet",
    "better fit",
    "best fit",
    "makes more sense",
    "makes the most sense",
    "settle for",
    "final choice",
    "my pick",
    "our pick",
];

/// Verbs of committing to an option, in every form an agent writes them ("we're
/// standardising on pnpm", "stayed with SQLite", "the team agreed on gRPC"), each with
/// the word before the option. Forms that also ask or offer ("decide", "choose", "pick")
/// are left out: "you can choose any port" chooses nothing; so is the third person's
/// present, which describes code ("the client switches to the fallback").
const COMMITTING: &[(&[&str], &[&str])] = &[
    (
        &[
            "standardise",
            "standardised",
            "standardising",
            "standardize",
            "standardized",
            "standardizing",
        ],
        &["on"],
    ),
    (&["opt", "opted", "opting"], &["for"]),
    (&["settle", "settled", "settling"], &["on", "for"]),
    (&["switch", "switched", "switching"], &["to", "over to"]),
    // Not "stuck with", which complains ("I'm stuck with this error").
    (&["stick", "sticking"], &["with", "to"]),
    (&["stay", "stayed", "staying"], &["with"]),
    (
        &["go", "went", "going", "gone"],
        &["with", "ahead with", "for"],
    ),
    (
        &["move", "moved", "moving"],
        &["ahead with", "forward with"],
    ),
    (&["commit", "committed", "committing"], &["to"]),
    (&["migrate", "migrated", "migrating"], &["to"]),
    (&["converge", "converged", "converging"], &["on"]),
    (&["agree", "agreed", "agreeing"], &["on", "to"]),
];

/// The phrases [`COMMITTING`] makes, "standardising on" and the rest.
fn committing_phrases() -> Vec<String> {
    COMMITTING
        .iter()
        .flat_map(|(forms, then)| {
            forms
                .iter()
                .flat_map(move |f| then.iter().map(move |t| format!("{f} {t}")))
        })
        .collect()
}

/// Words that make a sentence's opening label ("Verdict:", "Final call:", "The plan
/// from here:") announce what was decided.
const DECIDING_LABELS: &[&str] = &[
    "decision",
    "decided",
    "verdict",
    "conclusion",
    "resolution",
    "resolved",
    "choice",
    "outcome",
    "agreed",
    "answer",
    "forward",
    "fix",
    "solution",
    "takeaway",
    "consensus",
    "pick",
    "ruling",
    "settled",
    "concluded",
];

/// Words a possessive or "final" makes a deciding label ("My call:", "Our take -",
/// "Final word:"); alone ("Call: get_weather") they name a tool's step.
const OWNED_LABELS: &[&str] = &["call", "take", "vote", "word"];

/// Words that make a label of more than one word decide ("The plan from here:", "Revised
/// approach:"); alone ("Plan:") they head a list of next steps, which narrates.
const PLANNING_LABELS: &[&str] = &["plan", "approach", "strategy", "direction"];

/// A sentence led by a short label that says it decides: `Verdict: pg_partman handles
/// the partitions`, `Resolved: the cron moves to a CronJob`, `Final call - RabbitMQ`.
/// The label is at most four words before a colon or a dash, and the sentence goes on
/// after it.
fn decision_label(sentence: &str) -> bool {
    // The label ends at its first separator: a colon, a dash, or a hyphen between spaces.
    let Some((at, _)) = sentence.char_indices().find(|&(i, c)| {
        matches!(c, ':' | '\u{2014}' | '\u{2013}')
            || (c == '-' && sentence[..i].ends_with(' ') && sentence[i + 1..].starts_with(' '))
    }) else {
        return false;
    };
    let label = &sentence[..at];
    let rest = sentence[at..]
        .trim_start_matches([':', '\u{2014}', '\u{2013}', '-', ' '])
        .trim();
    let words: Vec<&str> = label.split_whitespace().collect();
    let named = |list: &[&str]| {
        words.iter().any(|w| {
            let w = w.trim_matches(|c: char| !c.is_alphanumeric());
            list.iter().any(|l| w.eq_ignore_ascii_case(l))
        })
    };
    // A key of a JSON object (`"plan": ...`) is no label a sentence opens with.
    !words.is_empty()
        && words.len() <= 4
        && !label.trim_start().starts_with(['"', '\'', '{'])
        && rest.split_whitespace().count() >= 2
        && (named(DECIDING_LABELS)
            || (words.len() > 1 && named(PLANNING_LABELS))
            || owned_label(&words))
}

/// "My call", "our take", "final word": a label of two words, someone's or final.
fn owned_label(words: &[&str]) -> bool {
    let [whose, what] = words else {
        return false;
    };
    ["my", "our", "final"]
        .iter()
        .any(|w| whose.eq_ignore_ascii_case(w))
        && OWNED_LABELS.iter().any(|w| what.eq_ignore_ascii_case(w))
}

const WEAK_DECISION: &[&str] = &[
    "because", "i'll", "i will", "we'll", "we will", "let's", "let us", "going to",
];

/// File extensions that make a bare word (`setup.py`, `Cargo.toml`) a file name.
const FILE_EXTENSIONS: &[&str] = &[
    "py",
    "rs",
    "js",
    "mjs",
    "cjs",
    "ts",
    "tsx",
    "jsx",
    "go",
    "java",
    "kt",
    "c",
    "h",
    "cc",
    "cpp",
    "hpp",
    "cs",
    "rb",
    "php",
    "swift",
    "scala",
    "sh",
    "sql",
    "toml",
    "yaml",
    "yml",
    "json",
    "jsonl",
    "md",
    "rst",
    "txt",
    "cfg",
    "ini",
    "conf",
    "lock",
    "html",
    "css",
    "scss",
    "vue",
    "xml",
    "gradle",
    "proto",
    "env",
    "csv",
    "ipynb",
    "dockerfile",
    "mk",
    "log",
];

/// Longest path kept; longer runs are data, not names.
const MAX_PATH: usize = 200;

/// The lines SWE-agent appends to every observation: its state, then its prompt.
const SWE_STATE: &[&str] = &[
    "(Open file:",
    "(Current directory:",
    "(Interactive session:",
];
const SWE_PROMPT: &str = "bash-$";

/// Whether a user message hands back a command's output rather than saying something: it
/// starts the way plain-text agents start one, or holds SWE-agent's state lines and
/// prompt.
pub fn is_observation(text: &str) -> bool {
    let t = text.trim_start();
    OBSERVATION_STARTS.iter().any(|s| t.starts_with(s))
        || output_label(t)
        || observation_end(text).is_some()
}

/// How a person at a text agent's prompt has a command run, its output handed back as
/// the next user message: aider's `/run` and `/test`, a shell prompt's `$ `, the `!`
/// escape of aider and Claude Code.
const RUN_PROMPTS: &[&str] = &["/run ", "/test ", "$ "];

/// Whether a user message ends by having a command run: its last line is typed at a
/// text agent's prompt ([`RUN_PROMPTS`], or `!` before a command's name).
pub fn runs_command(text: &str) -> bool {
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return false;
    };
    let last = last.trim_start();
    RUN_PROMPTS
        .iter()
        .any(|p| last.starts_with(p) && last.len() > p.len())
        || last.strip_prefix('!').is_some_and(|rest| {
            // A command's name: `!ls`, `!npm`, not `!important:`.
            let name = rest.split_whitespace().next().unwrap_or("");
            name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
        })
}

/// Whether a text opens with a label that names what follows as an output, however the
/// agent names its tool or numbers its step: `Observation 3:`, `MySQL Database Output:`,
/// `Python Output:`. Words in title case only: a person's "Expected output: 42" is a
/// request.
fn output_label(t: &str) -> bool {
    let Some(colon) = t.find(':').filter(|&c| c <= 40) else {
        return false;
    };
    let mut words: Vec<&str> = t[..colon].split(' ').collect();
    if words.len() > 1 && words[words.len() - 1].bytes().all(|b| b.is_ascii_digit()) {
        words.pop();
    }
    let titled = |w: &&str| {
        w.starts_with(|c: char| c.is_ascii_uppercase())
            && w.bytes().all(|b| b.is_ascii_alphanumeric())
    };
    let last = words.last().copied().unwrap_or("");
    words.len() <= 4
        && words.iter().all(titled)
        && (last.eq_ignore_ascii_case("observation") || last.eq_ignore_ascii_case("output"))
}

/// The label of a line that a ReAct-style agent numbers by its step (`Observation 3:`,
/// `Action 12:`): the word before the step's number, when the line opens so.
fn step_label(line: &str) -> Option<&str> {
    let colon = line.find(':').filter(|&c| c <= 32)?;
    let (label, number) = line[..colon].rsplit_once(' ')?;
    let numbered = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    let word = !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphabetic());
    (numbered && word).then_some(label)
}

/// The action a ReAct-style agent states on a line of its own (`Action: lookup[x]`,
/// `Action 2: Search[Joe Frazier]`): what it hands over to be run, as a command is.
fn action_line(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let rest = match t.strip_prefix("Action:") {
        Some(rest) => rest,
        None if step_label(t) == Some("Action") => &t[t.find(':')? + 1..],
        None => return None,
    };
    let rest = rest.trim();
    (!rest.is_empty()).then_some(rest)
}

/// Whether an assistant message is nothing but a command, as a text agent that answers
/// in commands writes one (`ls -la`, `cat main.c`, a query): its first paragraph holds
/// no line of prose, nor an action of a framed agent, and it is not empty. Prose a
/// person would write after it (a reason, a plan) may follow in later paragraphs.
pub fn bare_command(text: &str) -> Option<&str> {
    let t = text.trim_start_matches(['\n', '\r']);
    let first = t.split("\n\n").next().unwrap_or("").trim_end();
    let lines = || first.lines().filter(|l| !l.trim().is_empty());
    let command = lines().next().is_some()
        && !first.contains("```")
        && lines().all(|l| (!prose_line(l) || invocation(l)) && action_line(l).is_none());
    command.then_some(first)
}

/// Whether an assistant message is a program and nothing else, as a code agent writes
/// one for its runtime to run (`results = web_search("...")` and `print(results)`, a
/// loop, a script): no fence, every line a statement or a comment, at least one a
/// statement. A sentence that ends as sentences do is prose, whatever it holds.
pub fn is_code(text: &str) -> bool {
    if text.contains("```") {
        return false;
    }
    let mut statements = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let t = line.trim();
        if t.starts_with('#') || t.starts_with("//") {
            continue;
        }
        if !statement(line) {
            return false;
        }
        statements += 1;
    }
    statements > 0
}

/// A line of a program: indented, or ending as a call, a block's opening or an item of a
/// literal does, or assigning, or opened by a keyword of a language, or a name alone (an
/// expression a notebook prints), or a command line ([`invocation`]); never one that
/// ends as a sentence of prose does.
fn statement(line: &str) -> bool {
    let t = line.trim();
    if t.ends_with(['.', '!', '?']) && prose_line(line) {
        return false;
    }
    let first = t.split_whitespace().next().unwrap_or("");
    let name = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    };
    line.starts_with([' ', '\t'])
        || t.ends_with([')', ':', ']', '}', '(', '[', '{', ',', ';'])
        || t.contains('=')
        || CODE_KEYWORDS.contains(&first)
        || (name(t) && !t.ends_with('.'))
        || invocation(line)
}

/// Words that open a statement in the languages code agents write (Python, JavaScript,
/// shell), lowercase as a program has them.
const CODE_KEYWORDS: &[&str] = &[
    "import", "from", "def", "class", "return", "raise", "yield", "await", "async", "assert",
    "del", "pass", "break", "continue", "global", "with", "try", "else", "elif", "except",
    "finally", "while", "for", "if", "const", "let", "var", "function", "export", "echo",
];

/// A line that reads as a program called with its arguments rather than a sentence,
/// though made of words (`ls -la /srv`, `SELECT name FROM users`): it opens with a
/// program's name (lowercase, maybe with digits, `.`, `/`, `_` or `-`) and passes it
/// what only a command line holds (a flag, a path or a file name, a pipe, a
/// redirection, quotes, an assignment), or opens with a query's keyword in capitals;
/// and it ends with no sentence's mark. "round 2 done" is words.
fn invocation(line: &str) -> bool {
    let t = line.trim();
    let mut words = t.split_whitespace();
    let first = words.next().unwrap_or("");
    let program = first.starts_with(|c: char| c.is_ascii_lowercase() || c == '.' || c == '/')
        && first
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"./_-".contains(&b));
    let argument = |w: &str| {
        w.starts_with('-')
            || w.contains(['/', '|', '>', '<', '=', '"', '\''])
            || w.trim_end_matches(['.', ',']).contains('.')
    };
    let keyword = first.len() >= 3 && first.bytes().all(|b| b.is_ascii_uppercase());
    ((program && words.any(argument)) || keyword) && !t.ends_with(['.', '?', '!', ':'])
}

/// Where an observation ends when the agent's own framing says so: after SWE-agent's
/// prompt line (`bash-$`) or mini-swe-agent's `</output>`. What follows was written by
/// someone (a user's interjection joined to the observation), not by the command.
pub fn observation_end(text: &str) -> Option<usize> {
    let mut at = 0;
    let mut state = false;
    let mut end = None;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        state |= SWE_STATE.iter().any(|s| t.starts_with(s));
        if (state && t == SWE_PROMPT) || t == "</output>" {
            end = Some(at + line.len());
        }
        at += line.len();
    }
    end
}

/// A user message split into the observation it hands back and what a person added
/// after it (empty when nothing was): after the agent's own framing of the output, or
/// else the last paragraphs when they read as a person's words ([`reads_as_speech`]).
/// A text agent's observation and the user's interjection after it arrive as one message
/// once consecutive user messages are joined, and most agents frame no end to an output.
pub fn split_observation(text: &str) -> (&str, &str) {
    let end = observation_end(text).unwrap_or_else(|| spoken_tail(text));
    (&text[..end], text[end..].trim())
}

/// Where the paragraphs a person added after an output start: the text's length when
/// none did. The first paragraph is always the output's. Within the last paragraph of
/// the output, lines from one labelled with a person as its speaker (`User: ...`,
/// `[customer] ...`) are theirs too, when they read as a person's words.
fn spoken_tail(text: &str) -> usize {
    let mut end = text.len();
    while let Some(at) = text[..end].trim_end().rfind("\n\n") {
        let paragraph = &text[at..end];
        if !reads_as_speech(paragraph) || is_observation(paragraph) {
            break;
        }
        end = at;
    }
    let output = text[..end].trim_end();
    let mut at = output.len();
    for _ in 0..SPEECH_LINES {
        let Some(start) = output[..at].rfind('\n').map(|n| n + 1) else {
            break;
        };
        if output[..start].trim().is_empty() {
            break;
        }
        if spoken_label(&output[start..]) {
            if reads_as_speech(&output[start..]) {
                return start;
            }
            break;
        }
        at = start - 1;
    }
    end
}

/// Words that name a person as the speaker of a line (`User:`, `[human]`, `Customer
/// says:`), where a tool labels its lines with what they hold.
const SPEAKERS: &[&str] = &[
    "user",
    "human",
    "customer",
    "client",
    "admin",
    "operator",
    "person",
    "owner",
    "manager",
    "supervisor",
    "reviewer",
];

/// Whether a line opens with a person's label: a few words naming a speaker before a
/// colon, or in brackets (`User:`, `USER INTERRUPT:`, `>> customer says:`, `(user)`); not
/// a shell's prompt (`[user@host ~]$`).
fn spoken_label(line: &str) -> bool {
    let t = line.trim_start().trim_start_matches(['>', '-', '*', ' ']);
    let label = match t.strip_prefix(['[', '(']) {
        Some(rest) => rest.split_once([']', ')']).map(|(label, _)| label),
        None => t.split_once(':').map(|(label, _)| label),
    };
    label.is_some_and(|label| {
        label.len() <= 32
            && label.split_whitespace().count() <= 4
            && !label.contains(['@', '$', '/', '~', '='])
            && label
                .split(|c: char| !c.is_ascii_alphabetic())
                .any(|w| SPEAKERS.iter().any(|s| s.eq_ignore_ascii_case(w)))
    })
}

/// Longest paragraph read as a person's words: an interjection is a few sentences.
const SPEECH_MAX: usize = 800;
const SPEECH_LINES: usize = 6;

/// Words with which a person addresses the agent ("please", "you", "also", "btw"), which
/// a command's output rarely holds in a paragraph of prose.
const SPEECH_MARKS: &[&str] = &[
    "you",
    "your",
    "you're",
    "you'll",
    "please",
    "thanks",
    "thank you",
    "also",
    "btw",
    "by the way",
    "fyi",
    "heads up",
    "one more thing",
    "reminder",
    "remember",
    "keep in mind",
    "actually",
    "hold on",
    "we",
    "we're",
    "our",
    "let's",
    "i'd like",
    "i want",
    "i need",
];

/// Whether a paragraph reads as a person's words: a few lines of prose (no indentation,
/// no tool's `hint:` label, no error report, mostly words) that address the agent, set a
/// rule or bound the work by a number.
pub fn reads_as_speech(paragraph: &str) -> bool {
    let t = paragraph.trim_matches(['\n', '\r']);
    let short = t.len() <= SPEECH_MAX && t.lines().count() <= SPEECH_LINES;
    short && addresses_agent(t)
}

/// Whether a text opens with prose that addresses the agent, sets a rule or bounds the
/// work by a number: what a person says, of any length, where a command's output only
/// reports.
pub fn addresses_agent(text: &str) -> bool {
    reads_as_words(text) && says_to_agent(text)
}

/// Whether `text` sets a rule or a limit, or holds a word said to someone ("please",
/// "you", "btw"): what [`addresses_agent`] asks of words, wherever they stand in it.
pub fn says_to_agent(text: &str) -> bool {
    static MARKS: LazyLock<Phrases> = LazyLock::new(|| Phrases::new(&[SPEECH_MARKS]));
    is_constraint(text)
        || MARKS.find(text, true).is_some()
        || super::quantity::amount(text) == Some(super::quantity::Amount::Limit)
}

/// Whether the first paragraph of `text` is prose, every line of it: what a person
/// writes, where a command's output has listings, code, indentation or labels.
pub fn reads_as_words(text: &str) -> bool {
    // Blank lines before it, not its indentation, are left out.
    let first = text.trim_start_matches(['\n', '\r']);
    let first = first.split("\n\n").next().unwrap_or("");
    let lines: Vec<&str> = first.lines().filter(|l| !l.trim().is_empty()).collect();
    !lines.is_empty() && lines.iter().all(|l| prose_line(l))
}

/// Whether any line of `text` is prose ([`prose_line`]).
pub fn has_prose(text: &str) -> bool {
    text.lines().any(prose_line)
}

/// A line of prose: not indented, not opened by a tool's lowercase label (`fatal:`,
/// `hint:`), no error report, at least two thirds letters, spaces and punctuation of
/// sentences, and two words or more of which at least half are words of letters (a
/// listing's `drwxr-xr-x 2 dev dev 4096` has fields).
fn prose_line(line: &str) -> bool {
    if line.starts_with([' ', '\t']) {
        return false;
    }
    let t = line.trim();
    let first = t.split_whitespace().next().unwrap_or("");
    let label = first.len() > 1
        && first.ends_with(':')
        && first[..first.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_lowercase());
    let plain = t
        .chars()
        .filter(|c| c.is_alphabetic() || " ,.;'!?\u{2019}".contains(*c))
        .count();
    let words = t.split_whitespace().count();
    let lettered = t
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| ",.;:!?\"'()".contains(c)))
        .filter(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_alphabetic() || "'-\u{2019}".contains(c))
        })
        .count();
    lettered >= 2
        && 2 * lettered >= words
        && !label
        && 3 * plain >= 2 * t.chars().count()
        && super::failing_lines::line_score(t) < 2
}

/// How lines that aider writes into the user's side of its chat begin: what it did and
/// what it asks, not what the user said.
const STATUS_STARTS: &[&str] = &[
    "Applied edit to ",
    "Commit ",
    ">>>>>>",
    "<<<<<<",
    "=======",
    "Add the output to the chat?",
    "Add these files to the chat?",
    "Allow creation of new file",
    "Create new file?",
    "/run ",
    "/add ",
    "/drop ",
    "Git repo:",
    "Repo-map:",
    "Use /help",
];

/// A user message without the status lines an agent wrote into it.
pub fn without_status_lines(text: &str) -> std::borrow::Cow<'_, str> {
    let status = |l: &str| STATUS_STARTS.iter().any(|s| l.trim_start().starts_with(s));
    if !text.lines().any(status) {
        return std::borrow::Cow::Borrowed(text);
    }
    let kept: Vec<&str> = text.lines().filter(|l| !status(l)).collect();
    std::borrow::Cow::Owned(kept.join("\n"))
}

/// Whether a line of output is a line of a file shown with its numbers (SWE-agent's
/// `237:    raise ValueError`, `cat -n`, `nl -ba`): code, not a report of a failure.
pub fn is_numbered_line(line: &str) -> bool {
    let t = line.trim_start();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && matches!(t.as_bytes().get(digits), Some(b':' | b'\t' | b'|'))
}

/// Words of a clause that forbid what it names: "never", "do not", "leave ... alone",
/// "keep ... unchanged", "off limits".
const PROHIBITIONS: &[&str] = &[
    "never",
    "don't",
    "do not",
    "dont",
    "must not",
    "mustn't",
    "should not",
    "shouldn't",
    "not allowed",
    "forbidden",
    "avoid",
    "untouched",
    "unchanged",
    "alone",
    "as is",
    "read-only",
    "read only",
    "off limits",
    "off-limits",
    "hands off",
    "no changes",
    "not to",
    "without touching",
    "without modifying",
    "without changing",
    "as it is",
    "refrain",
    "stay away",
    "prohibited",
    "not to be",
];

/// The paths a sentence of the user's forbids: those in a clause (between `,`, `;` and
/// "but") that holds a prohibition. "You may edit src/a.py, but never touch src/b.py"
/// forbids src/b.py only.
pub fn forbidden_paths(sentence: &str) -> Vec<String> {
    static WORDS: LazyLock<Phrases> = LazyLock::new(|| Phrases::new(&[PROHIBITIONS]));
    let mut found = Vec::new();
    // Most sentences forbid nothing: one search spares splitting them.
    if WORDS.find(sentence, true).is_none() {
        return found;
    }
    for clause in sentence.split([',', ';']).flat_map(|c| c.split(" but ")) {
        if WORDS.find(clause, true).is_some() {
            paths(clause, |p| {
                found.push(p.to_string());
                true
            });
        }
    }
    found
}

/// Whether a user message sets a rule for later work ("Never modify config/prod.yaml",
/// "at most 3 retries": see [`super::constraint`]), or forbids a path ("Leave
/// settings/base.toml alone").
pub fn is_constraint(text: &str) -> bool {
    super::constraint::is_constraint(text) || !forbidden_paths(text).is_empty()
}

/// A fenced block of a message: its tag (lowercased, maybe empty) and its lines.
struct Fence<'a> {
    tag: String,
    body: Vec<&'a str>,
    /// Nothing but whitespace follows the block.
    last: bool,
    /// The block was never closed: a reply split across messages (aider's edit blocks),
    /// whose prose may follow in the same block.
    open: bool,
}

/// The text's prose lines (outside fenced blocks) and its fenced blocks.
fn split_fences(text: &str) -> (Vec<&str>, Vec<Fence<'_>>) {
    let mut prose = Vec::new();
    let mut fences = Vec::new();
    let mut open: Option<Fence> = None;
    // Whether prose follows the latest closed block.
    let mut prose_after = false;
    for line in text.lines() {
        let t = line.trim_start();
        match open.take() {
            Some(f) if t.trim_end() == "```" => {
                fences.push(f);
                prose_after = false;
            }
            Some(mut f) => {
                f.body.push(line);
                open = Some(f);
            }
            None => match t.strip_prefix("```") {
                Some(tag) => {
                    open = Some(Fence {
                        tag: tag.trim().to_ascii_lowercase(),
                        body: Vec::new(),
                        last: false,
                        open: false,
                    });
                }
                None => {
                    prose_after |= !t.is_empty();
                    prose.push(line);
                }
            },
        }
    }
    // An unclosed fence still holds what the agent wrote, and nothing follows it.
    if let Some(mut f) = open {
        f.open = true;
        fences.push(f);
        prose_after = false;
    }
    if let Some(f) = fences.last_mut() {
        f.last = !prose_after;
    }
    (prose, fences)
}

/// The shell commands an assistant message hands to be run: blocks tagged as shell, and
/// an untagged block that ends the message (SWE-agent's action); in a message with no
/// block, the `Action:` lines of a ReAct-style agent. Each command is one string; a
/// block of several lines stays one command.
pub fn commands(text: &str) -> Vec<String> {
    if !text.contains("```") {
        return text
            .lines()
            .filter_map(action_line)
            .map(str::to_string)
            .collect();
    }
    let (_, fences) = split_fences(text);
    fences
        .iter()
        .filter(|f| SHELL_TAGS.contains(&f.tag.as_str()) || (f.tag.is_empty() && f.last))
        .map(|f| {
            f.body
                .iter()
                .map(|l| l.trim().trim_start_matches("$ "))
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|c| !c.is_empty())
        .collect()
}

/// How the note that stands for a pasted block ends.
const PASTED_NOTE_END: &str = " pasted lines left out]";

/// A user message's own words, without what it pasted (fenced blocks, or the notes that
/// stand for them in an earlier digest), and whether it pasted anything.
pub fn own_words(text: &str) -> (String, bool) {
    let words = shorten_fences(text, None);
    let mut pasted = text.contains("```") && !split_fences(text).1.is_empty();
    let own: Vec<&str> = words
        .lines()
        .filter(|l| {
            let note = l.starts_with('[') && l.ends_with(PASTED_NOTE_END);
            pasted |= note;
            !note
        })
        .collect();
    (own.join("\n"), pasted)
}

/// The text with its fenced blocks shortened: with `Some(max)`, each block longer than
/// `max` characters is cut to its ends (a pasted log keeps the lines that usually
/// matter); with `None`, each block is replaced by a note of its length, leaving the
/// user's own words.
pub fn shorten_fences(text: &str, max: Option<usize>) -> String {
    if !text.contains("```") {
        return text.to_string();
    }
    let cut = |block: &str| match max {
        Some(max) => super::message::keep_ends(block, max / 2, max / 2),
        None => {
            let n = block.lines().count();
            format!("[{n}{PASTED_NOTE_END}")
        }
    };
    let mut out = String::with_capacity(text.len());
    let mut block = String::new();
    let mut in_fence = false;
    let push = |out: &mut String, line: &str| {
        out.push_str(line);
        out.push('\n');
    };
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        if in_fence && !fence {
            block.push_str(line);
            block.push('\n');
            continue;
        }
        if in_fence {
            push(&mut out, &cut(block.trim_end()));
            block.clear();
        }
        in_fence ^= fence;
        if !fence || max.is_some() {
            push(&mut out, line);
        }
    }
    if in_fence {
        push(&mut out, &cut(block.trim_end()));
    }
    out.trim_end().to_string()
}

/// Sentences of an assistant message's prose that state a decision or a conclusion, with
/// whether a strong phrase marks them. The rule: a sentence (ended by `.`, `!` or a line
/// break; questions are not decisions) of at least four words, three for a strong one,
/// that [`decision`] reads as one. Code blocks and indented code are skipped.
pub fn decisions(text: &str) -> Vec<(String, bool)> {
    let (prose, fences) = split_fences(text);
    let mut found = Vec::new();
    // In a block never closed, a line that reads as a whole sentence is prose.
    let stray = fences
        .iter()
        .filter(|f| f.open)
        .flat_map(|f| f.body.iter().copied())
        .filter(|l| reads_as_prose(l));
    let prose: Vec<&str> = prose.into_iter().chain(stray).collect();
    for line in prose {
        if line.starts_with("    ") || line.starts_with('\t') {
            continue;
        }
        for sentence in sentences(line) {
            let s = strip_lead(sentence);
            let words = s.split_whitespace().count();
            if s.ends_with('?') || words < 3 {
                continue;
            }
            // Three words settle on an option ("Redis it is."); a weaker phrase needs more.
            match decision(s) {
                Some(strong) if strong || words >= 4 => found.push((s.to_string(), strong)),
                _ => {}
            }
        }
    }
    found
}

/// A line that starts with a capital letter, ends a sentence, says six words or more (three
/// when it settles on an option: "OK, msgspec it is.") and holds none of the marks of code.
fn reads_as_prose(line: &str) -> bool {
    let t = line.trim();
    let words = t.split_whitespace().count();
    t.starts_with(|c: char| c.is_ascii_uppercase())
        && t.ends_with('.')
        && (words >= 6 || (words >= 3 && decision(t) == Some(true)))
        && !t.contains(['{', '}', ';', '=', '<', '>'])
}

/// Whether a sentence states a decision: `Some(true)` for a strong one (a phrase that
/// says what was found or chosen, an option named and settled on: "Redis it is", "I'm
/// going to use orjson for this", or a sentence built as a commitment to a named option,
/// [`commitment::commits`]), `Some(false)` for a weak one.
pub fn decision(sentence: &str) -> Option<bool> {
    let phrased = phrased_decision(sentence);
    // The phrases know the wordings seen; a commitment in any other is read from how
    // the sentence is built.
    if phrased != Some(true) && commitment::commits(sentence) {
        return Some(true);
    }
    phrased
}

/// [`decision`] by its phrases and the forms it reads word by word ("X it is", "use X"):
/// the wordings whose meaning is certain.
pub fn phrased_decision(sentence: &str) -> Option<bool> {
    // Asked of every line of an output that is cut: the strong and weak phrases and the
    // words the forms read word by word below need are found in one pass.
    static PHRASES: LazyLock<Phrases> = LazyLock::new(|| {
        let committing = committing_phrases();
        let committing: Vec<&str> = committing.iter().map(String::as_str).collect();
        Phrases::new(&[
            STRONG_DECISION,
            WEAK_DECISION,
            &["use", "using", "it is"],
            &committing,
        ])
    });
    let lists = PHRASES.lists(sentence, true);
    let (strong, weak, choice) = (lists & 1 != 0, lists & 2 != 0, lists & 4 != 0);
    if strong || decision_label(sentence) || (lists & 8 != 0 && commits_to_an_option(sentence)) {
        return Some(true);
    }
    if choice {
        let lower = sentence.to_ascii_lowercase().replace('\u{2019}', "'");
        if settles_on(&lower) || chooses_to_use(&lower) {
            return Some(true);
        }
    }
    weak.then_some(false)
}

/// Whether a verb of [`COMMITTING`] in `sentence` goes on to an option: "keep going with
/// what you were doing" carries on, "switching to whatever works" names nothing.
fn commits_to_an_option(sentence: &str) -> bool {
    static COMMITTING_PHRASES: LazyLock<Vec<String>> = LazyLock::new(committing_phrases);
    let lower = sentence.to_ascii_lowercase();
    COMMITTING_PHRASES.iter().any(|phrase| {
        lower.match_indices(phrase.as_str()).any(|(at, found)| {
            let before = lower[..at].split_whitespace().next_back().unwrap_or("");
            let next = lower[at + found.len()..]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches(|c: char| !c.is_alphanumeric());
            let whole = (at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphanumeric())
                && !next.is_empty()
                && lower[at + found.len()..].starts_with(' ');
            whole
                && !matches!(before, "keep" | "keeps" | "kept")
                && !NAMES_NO_OPTION.contains(&next)
        })
    })
}

/// Words after a verb of committing that name no option.
const NAMES_NO_OPTION: &[&str] = &[
    "what",
    "whatever",
    "whichever",
    "wherever",
    "how",
    "it",
    "that",
    "this",
];

/// "Redis it is.", "orjson it is, then", "Plan B it is: ...": an option named, then
/// settled on, the sentence ending or breaking into its next clause there.
fn settles_on(lower: &str) -> bool {
    lower.match_indices(" it is").any(|(at, found)| {
        let after = &lower[at + found.len()..];
        let rest = after.trim_start_matches(['.', '!', ' ']);
        let breaks = rest.is_empty()
            || after.starts_with([':', ';', ',', '\u{2014}'])
            || after
                .trim_start()
                .starts_with(['-', '\u{2013}', '\u{2014}'])
            || after.starts_with(" then");
        // "as it is", "how it is", "whether it is, ...": no option named; nor after a
        // comma ("As I read it, it is.").
        let word = lower[..at].rsplit(' ').next().unwrap_or("");
        breaks
            && !word.is_empty()
            && word.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '`')
            && !SETTLES_NOT.contains(&word)
    })
}

/// Words before "it is" that name no option.
const SETTLES_NOT: &[&str] = &[
    "as", "how", "what", "where", "that", "is", "so", "whatever", "whether", "if", "when", "which",
    "who", "than", "but", "and", "or", "because", "since", "think", "know", "sure", "though",
    "while", "why", "yes", "no", "unless",
];

/// Words right before "use" that make it the agent's own choice ("I'll use", "we're
/// going to use", "let's use"), not a description ("the parser uses").
const USE_LEADS: &[&str] = &[
    "i'll",
    "we'll",
    "will",
    "let's",
    "should",
    "shall",
    "gonna",
    "i'd",
    "we'd",
    "be",
    "i'm",
    "we're",
    "going to",
    "need to",
    "want to",
    "have to",
    "plan to",
    "decided to",
    "prefer to",
];

/// Objects of "use" that name no option.
const PRONOUNS: &[&str] = &[
    "it",
    "this",
    "that",
    "them",
    "these",
    "those",
    "something",
    "anything",
    "whatever",
];

/// Whether the sentence commits to an option by using it ("I'm going to use orjson for
/// the payloads", "Using a bounded channel between the two sides."), as opposed to
/// using a tool for the next step ("let's use grep to find the caller", "I'll use the
/// edit command"), which narrates.
fn chooses_to_use(lower: &str) -> bool {
    for (at, verb) in lower
        .match_indices("using")
        .chain(lower.match_indices("use"))
    {
        let after = &lower[at + verb.len()..];
        let whole = !lower[..at].ends_with(|c: char| c.is_ascii_alphanumeric())
            && !after.starts_with(|c: char| c.is_ascii_alphanumeric());
        let before = lower[..at].trim_end();
        let led = before.is_empty() || USE_LEADS.iter().any(|l| ends_with_word(before, l));
        if whole && led && names_an_option(after) {
            return true;
        }
    }
    false
}

/// Whether `before` ends with the words `lead`.
fn ends_with_word(before: &str, lead: &str) -> bool {
    before.strip_suffix(lead).is_some_and(|rest| {
        rest.is_empty() || rest.ends_with(|c: char| !c.is_ascii_alphanumeric() && c != '\'')
    })
}

/// Whether what follows "use" names an option rather than an instrument of the next step:
/// no "to <step>" after it, no "command" or "tool", and an object that is not a pronoun
/// or an agent's own action.
fn names_an_option(after: &str) -> bool {
    let words: Vec<&str> = after
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let object = words
        .iter()
        .find(|w| !["the", "a", "an"].contains(w))
        .copied()
        .unwrap_or("");
    let instrument = words
        .windows(2)
        .any(|w| w[0] == "to" && (NARRATION_VERBS.contains(&w[1]) || STEP_VERBS.contains(&w[1])))
        || words
            .iter()
            .any(|w| ["command", "commands", "tool", "tools"].contains(w));
    !object.is_empty()
        && !instrument
        && !PRONOUNS.contains(&object)
        && !NARRATION_VERBS.contains(&object)
}

/// Verbs of a step done with a tool ("use sed to replace the line"), beyond the verbs
/// that narrate exploring ([`NARRATION_VERBS`]).
const STEP_VERBS: &[&str] = &[
    "replace",
    "fix",
    "change",
    "remove",
    "delete",
    "insert",
    "apply",
    "patch",
    "locate",
    "understand",
    "determine",
    "identify",
    "display",
    "show",
    "count",
    "debug",
    "trace",
    "grep",
    "compile",
    "see",
];

/// A line split after each `.`, `!` or `?` that ends a sentence ([`ends_sentence`]).
pub fn sentences(line: &str) -> impl Iterator<Item = &str> {
    let b = line.as_bytes();
    let mut start = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() {
            let end = ends_sentence(b, i);
            i += 1;
            if end {
                let s = line[start..i].trim();
                start = i;
                if !s.is_empty() {
                    return Some(s);
                }
            }
        }
        let s = line[start..].trim();
        start = b.len();
        (!s.is_empty()).then_some(s)
    })
}

/// Whether the `.`, `!` or `?` at `i` ends a sentence: a space or the line's end follows,
/// or the next sentence starts right after it, as in transcripts whose line breaks were
/// lost ("as we thought.We will", "an `open()` call!Instead of"): a lowercase letter or a
/// closing mark before, a capitalised word and a space after. Otherwise two sentences read
/// as one, and a narrated step run into a decision outranks the next real one.
/// (`os.Path.join`, `fmt.Println(` and `v1.2.Beta` do not end one.)
fn ends_sentence(b: &[u8], i: usize) -> bool {
    if !matches!(b[i], b'.' | b'!' | b'?') {
        return false;
    }
    let Some(&next) = b.get(i + 1) else {
        return true;
    };
    if next == b' ' {
        return true;
    }
    let before = i.checked_sub(1).map(|j| b[j]);
    let closed = before.is_some_and(|c| c.is_ascii_lowercase() || b")`'\"".contains(&c));
    if !closed || !next.is_ascii_uppercase() {
        return false;
    }
    let word = b[i + 1..]
        .iter()
        .take_while(|c| c.is_ascii_alphabetic())
        .count();
    b.get(i + 1 + word) == Some(&b' ') && b[i + 2..i + 1 + word].iter().all(u8::is_ascii_lowercase)
}

/// A sentence without its list bullet or an agent's section label.
fn strip_lead(s: &str) -> &str {
    let mut s = s.trim();
    for lead in [
        "- ",
        "* ",
        "THOUGHT:",
        "Thought:",
        "DISCUSSION",
        "Discussion:",
    ] {
        if let Some(rest) = s.strip_prefix(lead) {
            s = rest.trim_start();
        }
    }
    s
}

/// Calls `found` with each file path, file name or URL in `text`, in order, until it
/// returns false. A path has a `/` and either a file extension, three segments, or a
/// leading `/` or `~/`; a bare name needs a known extension. Line numbers
/// (`src/a.rs:12:5`) and pytest test names (`tests/a.py::test_b`) are dropped: a passing
/// run lists every test, and a failing one is in the error list by its own line.
pub fn paths<'a>(text: &'a str, mut found: impl FnMut(&'a str) -> bool) {
    // Every path holds a `/` or a `.`: only the words around them are looked at, which
    // skips most of a long output at memchr's speed.
    let mut done = 0;
    for at in memchr::memchr2_iter(b'/', b'.', text.as_bytes()) {
        if at < done {
            continue;
        }
        let start = text[done..at]
            .char_indices()
            .rev()
            .find(|&(_, c)| !is_path_char(c))
            .map_or(done, |(i, c)| done + i + c.len_utf8());
        let end = text[at..]
            .char_indices()
            .find(|&(_, c)| !is_path_char(c))
            .map_or(text.len(), |(i, _)| at + i);
        done = end;
        if let Some(p) = as_path(&text[start..end]) {
            if !found(p) {
                return;
            }
        }
    }
}

fn is_path_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '~' | '@' | '+' | ':' | '%')
}

/// Whether a file's name ends in an extension: up to ten letters and digits, one letter
/// at least, after a stem (`.env` counts, as a name of more than two characters).
pub(super) fn has_extension(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(stem, ext)| {
        !ext.is_empty()
            && ext.len() <= 10
            && ext.bytes().all(|b| b.is_ascii_alphanumeric())
            && ext.bytes().any(|b| b.is_ascii_alphabetic())
            && (!stem.is_empty() || name.len() > 2)
    })
}

pub(super) fn as_path(word: &str) -> Option<&str> {
    let mut w = word.trim_end_matches(['.', ':', ',']);
    // `src/a.rs:12:5` and `a.py:7`: the location is not part of the name.
    while let Some((head, tail)) = w.rsplit_once(':') {
        if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
            w = head;
        } else {
            break;
        }
    }
    let w = w.strip_prefix("./").unwrap_or(w);
    if w.len() < 3 || w.len() > MAX_PATH || !w.bytes().any(|b| b.is_ascii_alphabetic()) {
        return None;
    }
    if w.starts_with("http://") || w.starts_with("https://") {
        return (w.len() > "https://".len() + 3).then_some(w);
    }
    if w.contains("//") || w.contains("://") {
        return None;
    }
    let file = w.split_once("::").map_or(w, |(f, _)| f);
    if file.contains(':') {
        return None;
    }
    let last = file.rsplit('/').next().unwrap_or(file);
    let has_ext = has_extension(last);
    let is_path = if file.contains('/') {
        let segments = file.split('/').filter(|s| !s.is_empty()).count();
        has_ext
            || segments >= 3
            || ((file.starts_with('/') || file.starts_with("~/")) && segments >= 2)
    } else {
        has_ext
            && last.rsplit_once('.').is_some_and(|(stem, ext)| {
                stem.bytes().any(|b| b.is_ascii_alphabetic())
                    && FILE_EXTENSIONS.iter().any(|e| e.eq_ignore_ascii_case(ext))
            })
    };
    is_path.then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_paths(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        paths(text, |p| {
            out.push(p.to_string());
            true
        });
        out
    }

    #[test]
    fn finds_paths_names_and_node_ids() {
        let text =
            "src/billing/invoice.py:118:    def f(x):\n  File \"/repo/app/cli.py\", line 3\n\
            see setup.py and README.md, e.g. and/or 1/2 a/b, 2024/05/01 and ./scripts/run.sh.\n\
            FAILED tests/test_x.py::test_y - boom; docs at https://example.com/a/b; /dev/null";
        assert_eq!(
            all_paths(text),
            vec![
                "src/billing/invoice.py",
                "/repo/app/cli.py",
                "setup.py",
                "README.md",
                "scripts/run.sh",
                "tests/test_x.py",
                "https://example.com/a/b",
                "/dev/null",
            ]
        );
        assert!(all_paths("version 1.2.3, std::fmt::Display, e.g. this").is_empty());
    }

    #[test]
    fn commands_come_from_shell_blocks_and_a_final_bare_block() {
        let swe = "THOUGHT: Let me run the tests.\n\n```bash\npython -m pytest -q tests\n```";
        assert_eq!(commands(swe), vec!["python -m pytest -q tests"]);
        let bare = "DISCUSSION\nOpen it.\n```\nopen src/a.py 120\n```\n";
        assert_eq!(commands(bare), vec!["open src/a.py 120"]);
        let chat = "Here is the code:\n```\nx = 1\n```\nThen run it.";
        assert!(commands(chat).is_empty());
        let python = "```python\nprint(1)\n```";
        assert!(commands(python).is_empty());
    }

    #[test]
    fn a_choice_reported_in_the_past_is_a_decision() {
        for s in [
            "I chose the streaming parser over the DOM one.",
            "We opted for a per-tenant bucket.",
            "After the benchmark we settled on zstd level 3.",
        ] {
            assert_eq!(decision(s), Some(true), "{s}");
        }
        // Not a word inside another.
        assert_eq!(decision("Choose the parser that streams."), None);
    }

    #[test]
    fn a_verb_of_committing_decides_in_any_of_its_forms_and_so_does_a_deciding_label() {
        for s in [
            // The verbs' other forms.
            "We're standardizing on Bazel for the Java targets.",
            "The services standardised on OpenTelemetry for traces.",
            "We migrated to Alembic from hand-written SQL files.",
            "The reviewers agreed on semantic version tags for the images.",
            "Both teams converged on one schema registry.",
            "I'm committing to the single-writer design.",
            "Moving forward with the Helm chart in deploy/chart.",
            "I'll go for the table-driven parser.",
            // Labels that say a decision follows.
            "Verdict: the queue stays on SQS.",
            "Resolved - the nightly job moves to 02:00 UTC.",
            "Final call: Argon2id replaces bcrypt for new hashes.",
            "The agreed approach: shard the sessions by user id.",
            "Outcome: Traefik at the edge, nginx retired.",
            "Settled: retries move into the client wrapper.",
            "My call: keep the monolith and split only the billing module out.",
            "Our take - the importer keys rows on the file hash.",
            "Concluded: the leak is in the websocket buffer pool.",
            // A plan stated in the future, a conclusion reached.
            "The fix will be to pin urllib3 below 2.0 until the TLS change lands.",
            "The approach will be to stream rows from the export API in pages.",
            "I've concluded the leak is in the websocket handler, so its buffer pool goes.",
        ] {
            assert_eq!(decision(s), Some(true), "{s}");
        }
        // A describing third person, a complaint, a list of steps, a key of an object, a
        // tool's label, a question left open.
        for s in [
            "The client switches to the fallback host when the cache is cold.",
            "I'm stuck with this error from the linker.",
            "Plan: read the config, then run the tests.",
            "\"plan\": \"- read the file - summarise it\"",
            "Tool call: read_file path=src/app.py",
            "We need to decide whether to keep the v1 endpoint.",
            // Carrying on, or a verb of committing that goes on to no option.
            "Keep going with what you were doing and ping me later.",
            "We'll switch to whatever the platform team picks.",
            "Just go ahead with it once the tests pass.",
            "Fine, going with that.",
            // A tool's step, a report of how a run ended.
            "Call: get_weather(city=\"Oslo\")",
            "The test run concluded after 41 seconds.",
        ] {
            assert_ne!(decision(s), Some(true), "{s}");
        }
    }

    #[test]
    fn committing_to_a_named_option_is_a_decision_whatever_the_verb() {
        for s in [
            "We'll go with msgpack for the wire format.",
            "Using a token bucket instead of the fixed window.",
            "Switching to PgBouncer in transaction mode.",
            "Tokio it is.",
            "Alright, rustls it is, then.",
            "Let's stick with the v2 schema for now.",
            "I'm going to use xxhash for the cache keys.",
            "Going with the second layout.",
            "I'd rather keep SQLite than add a server.",
            "We will be using Celery beat for the nightly jobs.",
            "A trie is the better fit here.",
            "My pick is zstd at level 3.",
        ] {
            assert_eq!(decision(s), Some(true), "{s}");
            assert_eq!(decisions(s).len(), 1, "{s}");
            // Also after an edit block the reply left open, as aider splits them.
            let open = format!("```python\napp.py\n=======\n    x = 2\n\n{s}");
            assert_eq!(decisions(&open).len(), 1, "{open}");
        }
        // Using a tool for the next step narrates; so does a description.
        for s in [
            "Let's use grep to find where the token is refreshed.",
            "I'll use the edit command to change line 40.",
            "I'm going to use it to print the frames.",
            "The parser uses a lookup table.",
            "Leave the function as it is.",
        ] {
            assert_ne!(decision(s), Some(true), "{s}");
        }
    }

    #[test]
    fn an_interjection_after_an_observation_is_the_users_own() {
        for (observation, said) in [
            (
                "OBSERVATION:\nrunning 4 tests\ntest result: ok. 4 passed",
                "Also, keep the retry budget under 30 per minute.",
            ),
            (
                "Observation: {\"rows\": 12, \"next\": null}",
                "btw please don't touch vendor/ at all",
            ),
            (
                "EXECUTION RESULT of [bash]:\n$ ls\nCargo.toml  src",
                "Quick one: we can't exceed 2 GiB of memory on the runner.",
            ),
            (
                "<returncode>0</returncode>\n<output>\nok\n</output>",
                "Remember that staging only has 4 vCPUs.",
            ),
        ] {
            let joined = format!("{observation}\n\n{said}");
            assert!(is_observation(&joined), "{joined}");
            let (kept, added) = split_observation(&joined);
            assert_eq!((kept.trim_end(), added), (observation, said), "{joined}");
        }
        // A line labelled with a person as its speaker, in the output's last paragraph.
        for (observation, said) in [
            (
                "Observation: page 3\n[1] B07X | tea, 20 bags | $4.99",
                "User: stop after 5 pages, we are wasting credits.",
            ),
            (
                "OBSERVATION:\n$ ls\nCargo.toml  src",
                ">> customer says: never exceed 2 GiB of memory on the runner.",
            ),
            (
                "Output: rows=12\nnext=null",
                "[admin] please keep the batch size at 50 or below",
            ),
        ] {
            let joined = format!("{observation}\n{said}");
            let (kept, added) = split_observation(&joined);
            assert_eq!((kept.trim_end(), added), (observation, said), "{joined}");
        }
        // A shell's prompt and a tool's field naming a user are the output's.
        for tail in [
            "[user@host app]$ echo please keep it under 5 MB",
            "User: root\nHome: /root",
        ] {
            let text = format!("OBSERVATION:\n$ id\n{tail}");
            assert_eq!(split_observation(&text), (text.as_str(), ""), "{tail}");
        }
        // The output's own prose and labels stay in it.
        for tail in [
            "hint: Updates were rejected because the remote contains work that you do not have.",
            "Ran 12 tests in 0.41s",
            "  You must specify a target.",
            "Error: you must pass --force to continue",
        ] {
            let text = format!("OBSERVATION:\n$ git push\n\n{tail}");
            assert_eq!(split_observation(&text), (text.as_str(), ""), "{tail}");
        }
    }

    #[test]
    fn output_and_words_are_told_apart_by_their_lines() {
        for words in [
            "Keep the retry budget under 30 per minute.",
            "ok that looks right, carry on",
            "Please also check the Windows path handling.",
            "Don't modify settings/prod.toml.",
        ] {
            assert!(reads_as_words(words), "{words}");
        }
        for output in [
            "total 8\ndrwxr-xr-x  2 dev dev 4096 Jan  3 10:00 src",
            "src/main.rs\nsrc/lib.rs",
            "  File \"app.py\", line 3, in <module>",
            "{\"status\": \"ok\", \"count\": 3}",
            "fatal: not a git repository",
        ] {
            assert!(!reads_as_words(output), "{output}");
        }
    }

    #[test]
    fn sentences_run_together_without_a_space_are_two() {
        let line =
            "The file was printed, exactly as we thought.We will further examine the upload. \
            It calls `open()` call!Instead of the upload, it shows any file.";
        assert_eq!(
            sentences(line).collect::<Vec<_>>(),
            [
                "The file was printed, exactly as we thought.",
                "We will further examine the upload.",
                "It calls `open()` call!",
                "Instead of the upload, it shows any file.",
            ]
        );
        // Names with a capital after a dot are not sentence ends.
        let code = "Use os.Path.join and fmt.Println(x) from v1.2.Beta builds.";
        assert_eq!(sentences(code).count(), 1);
        // A narrated step run into the sentence before no longer reads as a decision.
        let run_on = "The file was printed as expected.We will further examine this vulnerability.";
        assert!(decisions(run_on)
            .iter()
            .all(|(s, _)| commitment::is_narration(s)));
    }

    #[test]
    fn decisions_are_marked_sentences_of_prose() {
        let text = "THOUGHT: The tests pass now. I'll switch to Decimal instead of float because floats drift.\n\
            Should I also do that instead?\n```python\n# we will never run this because code\n```\n\
            - The root cause is the rounding in parse_rows.\nLet's look.";
        assert_eq!(
            decisions(text),
            vec![
                (
                    "I'll switch to Decimal instead of float because floats drift.".to_string(),
                    true
                ),
                (
                    "The root cause is the rounding in parse_rows.".to_string(),
                    true
                ),
            ]
        );
        assert_eq!(
            decisions("Next, I will read the config file."),
            vec![("Next, I will read the config file.".to_string(), false)]
        );
    }

    #[test]
    fn phrases_are_found_in_one_pass_as_whole_words_in_either_case() {
        let p = Phrases::new(&[&["root cause"], &["i'll", "go"]]);
        assert_eq!(p.find("The ROOT CAUSE is here; I'll fix it", true), Some(0));
        assert_eq!(p.find("I\u{2019}ll fix it", true), Some(1));
        assert_eq!(p.find("I'll fix it", true), Some(1));
        // Inside a word it is no phrase, unless words are not asked for.
        assert_eq!(p.find("the cargo build", true), None);
        assert_eq!(p.find("the cargo build", false), Some(1));
        assert_eq!(p.find("nothing here", true), None);
        // Every list found, in the same pass.
        assert_eq!(p.lists("Root cause found, so I'll go", true), 0b11);
        assert_eq!(p.lists("let's go", true), 0b10);
        assert_eq!(p.lists("the cargo build", true), 0);
        assert_eq!(p.lists("the cargo build", false), 0b10);
    }

    #[test]
    fn a_path_forbidden_in_other_words_is_a_constraint() {
        for s in [
            "Leave infra/prod_vars.tf alone please.",
            "The file ci/release.yml is off limits for this task.",
            "Treat tools/gen_schema.py as read-only.",
            "Keep migrations/0042_init.sql untouched.",
            "Please refrain from editing web/theme.css.",
            "Stay away from scripts/rotate_keys.sh, it runs in prod.",
            "Changing db/seed.sql is prohibited.",
            "lib/compat.py is not to be modified",
            "Keep docs/api.md as it is.",
        ] {
            assert!(is_constraint(s), "{s}");
            assert_eq!(forbidden_paths(s).len(), 1, "{s}");
        }
        // Naming a path is not forbidding it.
        assert!(!is_constraint("Leave a comment in src/app.py when done."));
        assert_eq!(
            forbidden_paths("You may edit src/a.py, but never touch src/b.py."),
            ["src/b.py"]
        );
    }

    #[test]
    fn a_command_typed_at_a_text_agents_prompt_is_known_by_its_prompt() {
        for t in [
            "/run pytest tests/test_io.py",
            "/test cargo test -p parser",
            "Applied edit to src/app.py\n\n$ make check",
            "!ls -la build/",
            "  $ npm run lint  \n",
        ] {
            assert!(runs_command(t), "{t}");
        }
        for t in [
            "Please run the tests again.",
            "/run ",
            "The budget is $ 40 a month, no more.\nThanks",
            "!important: keep the API stable",
            "/run pytest\nand tell me what fails",
            "",
        ] {
            assert!(!runs_command(t), "{t}");
        }
    }

    #[test]
    fn observations_and_constraints() {
        assert!(is_observation(
            "<returncode>0</returncode>\n<output>\n</output>"
        ));
        assert!(is_observation("OBSERVATION:\nfile.py"));
        assert!(!is_observation("Please fix the build"));
        assert!(is_constraint("Never modify config/prod.yaml"));
        assert!(is_constraint("Please don\u{2019}t touch the migrations"));
        assert!(!is_constraint(
            "Fix the failing build; the keeper test is flaky"
        ));
    }

    #[test]
    fn an_output_is_known_by_a_label_that_names_it_whatever_the_tool() {
        for t in [
            "Observation 7: The page lists three results.",
            "Postgres Query Output: [(1, 'a')]",
            "Observation 12:\nnothing found",
            "Sandbox Output: total 0",
            "Python Output 3: 42",
        ] {
            assert!(is_observation(t), "{t}");
        }
        for t in [
            "Expected output: a list of ids",
            "Note 2: the output is wrong",
            "My favourite observation about this codebase: it has no tests.",
            "The Output Of The Last Run Was Long And Wrong: see above",
        ] {
            assert!(!is_observation(t), "{t}");
        }
    }

    #[test]
    fn a_react_agents_action_lines_are_its_commands() {
        let step = "Thought 2: The page does not say.\nAction 2: Lookup[founding year]";
        assert_eq!(commands(step), vec!["Lookup[founding year]"]);
        let plain = "Thought: I should list the files.\nAction: run_shell[ls -la]";
        assert_eq!(commands(plain), vec!["run_shell[ls -la]"]);
        let finish = "Action 11: Finish[yes]";
        assert_eq!(commands(finish), vec!["Finish[yes]"]);
        // Speaking of an action is not taking one.
        assert!(commands("The action I took: none yet, I am still reading.").is_empty());
        assert!(commands("Action 3:").is_empty());
    }

    #[test]
    fn a_message_that_is_only_a_command_is_a_bare_command() {
        for t in [
            "ls -la /srv",
            "grep -rn TODO src | head",
            "SELECT id, total FROM orders WHERE total > 100",
            "python3 solve.py --key 0x3f\n\nThis should print the flag.",
            "cat notes_2.txt",
        ] {
            assert!(bare_command(t).is_some(), "{t}");
        }
        // Words without a command line's marks are a short reply, not a command.
        for t in ["round 2 done", "sure thing", "fixed it"] {
            assert!(bare_command(t).is_none(), "{t}");
        }
        assert_eq!(
            bare_command("find . -name '*.log'\n\nLooking for logs."),
            Some("find . -name '*.log'")
        );
        for t in [
            "I will look at the log files first.",
            "Thought 1: find it\nAction 1: Search[x]",
            "```bash\nls\n```",
            "",
        ] {
            assert!(bare_command(t).is_none(), "{t}");
        }
    }

    #[test]
    fn what_addresses_the_agent_is_told_from_what_a_command_printed() {
        for t in [
            "Please stop retrying after three attempts, we get billed per call.",
            "hold on, you are editing the wrong service",
            "Never commit the generated client in api/gen/.",
            "The uploader takes at most 25 files per batch.",
        ] {
            assert!(addresses_agent(t), "{t}");
        }
        for t in [
            "No output",
            "total 12\ndrwxr-xr-x 2 dev dev 4096 Jan 3 10:02 src",
            "Build finished in 3.2s",
            "Segmentation fault (core dumped)",
        ] {
            assert!(!addresses_agent(t), "{t}");
        }
    }

    #[test]
    fn an_option_settled_on_with_it_is_is_a_strong_decision_whatever_follows() {
        for s in [
            "Postgres it is.",
            "Plan C it is: the importer retries each batch on its own.",
            "Fine, tokio_uring it is; the blocking pool goes.",
            "Approach two it is \u{2014} smaller diff, same result.",
            "sqlite_wal it is, then.",
        ] {
            assert_eq!(decision(s), Some(true), "{s}");
        }
        for s in [
            "Leave the loop as it is.",
            "I am not sure what it is, so I will print it.",
            "As far as I can tell, it is: the timeout fires first.",
            "Check whether it is, and report back.",
        ] {
            assert_ne!(decision(s), Some(true), "{s}");
        }
    }

    #[test]
    fn long_fenced_blocks_keep_their_ends() {
        let log: String = (0..200).map(|i| format!("line {i}\n")).collect();
        let text = format!("Running it gives:\n```\n{log}ValueError: boom\n```\nWhat now?");
        let short = shorten_fences(&text, Some(200));
        assert!(short.starts_with("Running it gives:\n```\nline 0\n"));
        assert!(short.contains("characters omitted by compaction"));
        assert!(
            short.ends_with("ValueError: boom\n```\nWhat now?"),
            "{short}"
        );
        assert_eq!(shorten_fences("no fences", Some(10)), "no fences");
        let words = shorten_fences(&text, None);
        assert_eq!(
            words,
            "Running it gives:\n[201 pasted lines left out]\nWhat now?"
        );
        let own = ("Running it gives:\nWhat now?".to_string(), true);
        assert_eq!(own_words(&text), own);
        assert_eq!(own_words(&words), own);
        assert_eq!(own_words("just words"), ("just words".to_string(), false));
    }
}
