//! Hand scanning of free text for the digest: file paths, the commands of plain-text
//! agents, stated decisions, observations and constraints. No regular expressions: each
//! scan is linear in its text.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

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
    "settled on",
    "switch to",
    "from now on",
    "going forward",
];
const WEAK_DECISION: &[&str] = &[
    "because",
    "i'll",
    "i will",
    "we'll",
    "we will",
    "let's",
    "let us",
    "going to",
    "the plan is",
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
    OBSERVATION_STARTS.iter().any(|s| t.starts_with(s)) || observation_end(text).is_some()
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
/// after it (empty when nothing was).
pub fn split_observation(text: &str) -> (&str, &str) {
    match observation_end(text) {
        Some(end) => (&text[..end], text[end..].trim()),
        None => (text, ""),
    }
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

/// Words of a line of output that say a file was written: the path on such a line is
/// a product of the work (a report, a build artefact), not one of a listing.
const WRITE_WORDS: &[&str] = &[
    "wrote",
    "written",
    "saved",
    "report",
    "created",
    "generated",
    "output to",
    "exported",
    "stored",
    "artifact",
    "artefact",
];

/// Whether a line of output announces a file it wrote.
pub fn announces_file(line: &str) -> bool {
    static WORDS: LazyLock<Phrases> = LazyLock::new(|| Phrases::new(&[WRITE_WORDS]));
    WORDS.find(line, false).is_some()
}

/// Verbs that, after "let's" or "I'll", narrate the next step of exploring rather than
/// decide anything: "Let's open the file", "I'll run the tests".
const NARRATION_VERBS: &[&str] = &[
    "open",
    "look",
    "run",
    "search",
    "scroll",
    "check",
    "see",
    "view",
    "find",
    "try",
    "read",
    "examine",
    "inspect",
    "start",
    "navigate",
    "go",
    "take",
    "begin",
    "execute",
    "test",
    "verify",
    "print",
    "list",
    "edit",
    "reproduce",
    "install",
    "now",
    "first",
    "also",
    "next",
    "then",
    "confirm",
    "submit",
    "create",
    "call",
    "use",
    "get",
    "make",
    "write",
    "continue",
    "proceed",
    "investigate",
    "explore",
    "review",
    "analyze",
    "analyse",
    "decompile",
    "disassemble",
    "scroll_down",
    "scroll_up",
    "goto",
    "fetch",
    "query",
    "paste",
    "help",
    "need",
    "be",
    "have",
    "do",
    "think",
    "assist",
    "provide",
    "give",
    "search_file",
    "search_dir",
    "find_file",
    "clean",
    "carefully",
    "correct",
    "retry",
    "add",
    "modify",
    "update",
    "focus",
    "wait",
];

/// Words between "I'll" and the verb of a step that say when or how, not what.
const STEP_ADVERBS: &[&str] = &[
    "now", "first", "then", "next", "also", "further", "just", "again", "quickly", "briefly",
];

/// Whether a sentence with a weak decision phrase only narrates the next step.
pub fn is_narration(sentence: &str) -> bool {
    let lower = sentence.to_ascii_lowercase().replace('\u{2019}', "'");
    for lead in [
        "let's", "let us", "i'll", "i will", "we'll", "we will", "going to", "we can", "i can",
    ] {
        for (at, _) in lower.match_indices(lead) {
            let after = lower[at + lead.len()..].trim_start();
            // "We will further examine", "I'll now look": the verb after an adverb.
            let verb = after
                .split(|c: char| !c.is_ascii_alphabetic() && c != '_')
                .find(|w| !STEP_ADVERBS.contains(w))
                .unwrap_or("");
            if NARRATION_VERBS.contains(&verb) {
                return true;
            }
        }
    }
    false
}

/// Whether a user message sets a rule for later work ("Never modify config/prod.yaml",
/// "leave the schema alone", "at most 3 retries"): see [`super::constraint`].
pub fn is_constraint(text: &str) -> bool {
    super::constraint::is_constraint(text)
}

/// Lists of lowercase phrases looked for in one pass over a text, ASCII case ignored and
/// a typographic apostrophe read as a straight one. The digest asks this of every
/// sentence and every line of output: a search per phrase, each setting up its own
/// searcher, was most of the digest's time.
pub struct Phrases {
    /// `None` only if the automaton could not be built; then each phrase is searched
    /// for on its own.
    automaton: Option<AhoCorasick>,
    /// Per pattern: the list it came from, and its text.
    patterns: Vec<(usize, String)>,
}

impl Phrases {
    pub fn new(lists: &[&[&str]]) -> Phrases {
        let mut patterns = Vec::new();
        for (list, phrases) in lists.iter().enumerate() {
            for p in phrases.iter() {
                patterns.push((list, (*p).to_string()));
                if p.contains('\'') {
                    patterns.push((list, p.replace('\'', "\u{2019}")));
                }
            }
        }
        let automaton = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(patterns.iter().map(|(_, p)| p))
            .ok();
        Phrases {
            automaton,
            patterns,
        }
    }

    /// The lowest list any phrase found in `text` belongs to; with `words`, only a phrase
    /// with no letter or digit right before or after it counts.
    pub fn find(&self, text: &str, words: bool) -> Option<usize> {
        let b = text.as_bytes();
        let whole = |at: usize, end: usize| {
            !words
                || ((at == 0 || !b[at - 1].is_ascii_alphanumeric())
                    && (end == b.len() || !b[end].is_ascii_alphanumeric()))
        };
        let Some(ac) = &self.automaton else {
            // ASCII lowercasing keeps every byte where it was.
            let lower = text.to_ascii_lowercase();
            return self
                .patterns
                .iter()
                .filter(|(_, p)| {
                    lower
                        .match_indices(p.as_str())
                        .any(|(at, _)| whole(at, at + p.len()))
                })
                .map(|(list, _)| *list)
                .min();
        };
        let mut best: Option<usize> = None;
        for m in ac.find_overlapping_iter(text) {
            if !whole(m.start(), m.end()) {
                continue;
            }
            let list = self.patterns[m.pattern().as_usize()].0;
            if list == 0 {
                return Some(0);
            }
            best = Some(best.map_or(list, |b| b.min(list)));
        }
        best
    }
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
/// an untagged block that ends the message (SWE-agent's action). Each command is one
/// string; a block of several lines stays one command.
pub fn commands(text: &str) -> Vec<String> {
    if !text.contains("```") {
        return Vec::new();
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
/// break; questions are not decisions) of at least four words that holds one of the
/// phrases above as whole words. Code blocks and indented code are skipped.
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
            if s.ends_with('?') || s.split_whitespace().count() < 4 {
                continue;
            }
            if let Some(strong) = decision(s) {
                found.push((s.to_string(), strong));
            }
        }
    }
    found
}

/// A line that starts with a capital letter, ends a sentence, says six words or more and
/// holds none of the marks of code.
fn reads_as_prose(line: &str) -> bool {
    let t = line.trim();
    t.starts_with(|c: char| c.is_ascii_uppercase())
        && t.ends_with('.')
        && t.split_whitespace().count() >= 6
        && !t.contains(['{', '}', ';', '=', '<', '>'])
}

/// Whether a sentence holds a decision phrase: `Some(true)` for a strong one,
/// `Some(false)` for a weak one.
pub fn decision(sentence: &str) -> Option<bool> {
    static PHRASES: LazyLock<Phrases> =
        LazyLock::new(|| Phrases::new(&[STRONG_DECISION, WEAK_DECISION]));
    PHRASES.find(sentence, true).map(|list| list == 0)
}

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
pub fn paths(text: &str, mut found: impl FnMut(&str) -> bool) {
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

fn as_path(word: &str) -> Option<&str> {
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
    let has_ext = last.rsplit_once('.').is_some_and(|(stem, ext)| {
        !ext.is_empty()
            && ext.len() <= 10
            && ext.bytes().all(|b| b.is_ascii_alphanumeric())
            && ext.bytes().any(|b| b.is_ascii_alphabetic())
            && (!stem.is_empty() || last.len() > 2)
    });
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
        assert!(decisions(run_on).iter().all(|(s, _)| is_narration(s)));
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
