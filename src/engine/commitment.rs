//! Whether a sentence commits to a named option, read from how it is built rather than
//! from the words it happens to use. The phrase lists of [`super::scan`] know the wordings
//! seen so far ("go with", "settled on"); agents and engineers commit in any verb ("Keeping
//! the bounded queue", "`deadpool` will own the connections", "`msgspec`, not `pydantic`"),
//! so a sentence counts when it names something ([`names_something`]) and is built as a
//! commitment: the agent as the subject of a step that is not exploring, a sentence that
//! opens with its verb, a plan of ours or a verdict label, the option as the subject of a
//! role, a contrast that selects, an evaluation that selects, a choice told in the passive
//! or set for the rest of the work. Its opposite lives here too: a step narrated
//! ([`is_narration`], "Let's open the file") commits to nothing.

use std::collections::HashSet;
use std::sync::LazyLock;

use super::verbs;

/// Verbs that, after "let's" or "I'll", narrate the next step of exploring rather than
/// decide anything: "Let's open the file", "I'll run the tests".
pub(super) const NARRATION_VERBS: &[&str] = &[
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
            // "I'll go ahead and rewrite it": the verb after the phrase that only says
            // it is about to happen.
            let after = ["go ahead and ", "go on and ", "just go ahead and "]
                .iter()
                .find_map(|p| after.strip_prefix(p))
                .unwrap_or(after);
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

/// Whether a sentence names something the model could not guess: a word holding a
/// digit, `_`, `/`, a backtick, a call's `(`, a capital past its first letter
/// (`ContextCompressor`) or a `.` between letters (`config.yaml`), or a capitalised name
/// inside the sentence ("in Redis", "with Postgres").
pub fn names_something(sentence: &str) -> bool {
    let mut before = "";
    sentence.split_whitespace().enumerate().any(|(i, word)| {
        let named = is_name(word, i) || is_option_label(before, word);
        before = word;
        named
    })
}

/// Nouns that a letter or a number after them makes the name of one option among those
/// laid out: "Option B", "plan 2", "approach C".
const LABELLED_NOUNS: &[&str] = &[
    "option",
    "plan",
    "approach",
    "variant",
    "alternative",
    "proposal",
    "candidate",
    "choice",
    "design",
    "strategy",
];

/// Whether `word` labels one of the options laid out, after such a noun (`before`): a
/// capital letter or a number of up to two digits, as in "Option B wins".
fn is_option_label(before: &str, word: &str) -> bool {
    let before = before.trim_matches(|c: char| !c.is_ascii_alphabetic());
    let label = word.trim_matches(|c: char| ",.;:!?\"'()[]*".contains(c));
    LABELLED_NOUNS
        .iter()
        .any(|n| before.eq_ignore_ascii_case(n))
        && (matches!(label.as_bytes(), [b'A'..=b'Z'])
            || ((1..=2).contains(&label.len()) && label.bytes().all(|b| b.is_ascii_digit())))
}

fn is_name(word: &str, at: usize) -> bool {
    let word = word.trim_matches(|c: char| ",.;:!?\"'()[]*".contains(c));
    let inner_dot = word.split('.').filter(|part| !part.is_empty()).count() > 1;
    let capital = at > 0
        && word.len() > 1
        && word.starts_with(|c: char| c.is_ascii_uppercase())
        && !word.starts_with("I'")
        && !word.starts_with("I\u{2019}")
        && !CAPITALISED_WORDS.contains(&word.to_ascii_lowercase().as_str());
    word.contains(|c: char| c.is_ascii_digit() || "_/`(".contains(c))
        || word.chars().skip(1).any(|c| c.is_ascii_uppercase())
        || inner_dot
        || capital
}

/// Words that open a sentence or a bullet with a capital and name nothing ("- The
/// refund will go ...").
const CAPITALISED_WORDS: &[&str] = &[
    "the", "a", "an", "this", "that", "these", "those", "it", "we", "you", "they", "he", "she",
    "my", "our", "your", "if", "when", "then", "so", "and", "but", "or", "in", "on", "at", "for",
    "to", "of", "with", "as", "is", "no", "not", "yes", "ok", "once", "after", "before", "since",
    "because", "what", "which", "who", "how", "why", "there", "here", "all", "each", "every",
    "some", "also", "now", "next", "first", "finally",
];

/// One word of a sentence: lowercase, its quotes and punctuation trimmed, with what
/// closed it (a `,` or `:` ends a clause or a label).
struct Word {
    low: String,
    /// As written, its quotes and punctuation trimmed.
    raw: String,
    /// Written in capitals: SQL's `SELECT`, a shouted word; no verb of prose.
    shouted: bool,
    /// The `,`, `;`, `:` or dash right after it, if any.
    mark: Option<char>,
    name: bool,
}

fn words(sentence: &str) -> Vec<Word> {
    let mut before = "";
    sentence
        .split_whitespace()
        .enumerate()
        .map(|(i, raw)| {
            let label = is_option_label(before, raw);
            before = raw;
            let raw = raw.replace('\u{2019}', "'");
            let core = raw.trim_end_matches(['.', '!', '?', '"', ')', '*']);
            let mark = core
                .chars()
                .last()
                .filter(|c| [',', ';', ':', '\u{2014}', '\u{2013}'].contains(c))
                .or_else(|| ["-", "\u{2014}", "\u{2013}"].contains(&core).then_some('-'));
            let low = raw
                .trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '\'' && c != '_')
                .to_ascii_lowercase();
            let letters = || core.chars().filter(char::is_ascii_alphabetic);
            let shouted = letters().count() > 1 && letters().all(|c| c.is_ascii_uppercase());
            Word {
                low,
                raw: raw
                    .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                    .to_string(),
                shouted,
                mark,
                name: is_name(&raw, i) || label,
            }
        })
        .collect()
}

/// Whether the sentence commits to a named option by its structure (module doc). A
/// question, a hedge ("maybe", "could", "whether") or a narrated step of exploring
/// ([`is_narration`]) commits to nothing.
pub fn commits(sentence: &str) -> bool {
    let s = sentence.trim();
    // Asked of every line of an output that is cut: the cheap tests first.
    let n = s.split_whitespace().count();
    if !(3..=60).contains(&n) || s.ends_with('?') || !names_something(s) || reads_as_code(s) {
        return false;
    }
    let w = words(s);
    if w.iter().any(|x| HEDGES.contains(&x.low.as_str())) {
        return false;
    }
    if has_words(&w, &["not", "sure"]) || is_narration(s) {
        return false;
    }
    // A line of a log ("Compiling serde v1.0.2") opens with its verb too: a sentence that
    // does is prose only when it ends like one.
    let ended = s.ends_with(['.', '!']);
    (ended && opens_with_verb(&w))
        || under_label(&w)
        || agent_commits(&w)
        || our_plan(&w)
        || option_in_role(&w)
        || contrast_selects(&w)
        || evaluation_selects(&w)
        || chosen_passively(&w)
        || settled_from_now(&w)
        || opens_with_a_verdict(&w)
        || future_plan(&w)
        || designated(&w)
        || set_up(&w)
}

/// How a part of the work is set up from here on, said of the part rather than of anyone
/// choosing: "the cache backend is `memcached`", "invoices now go out through
/// `Postmark`", "`isort` runs on every commit going forward", "thumbnails get generated
/// with `libvips`", "Storage layout: one bucket per tenant, no shared prefix", "`ruff` is
/// the linter", "made `Caddy` our reverse proxy". What the work meets (a value printed, a
/// count, an error) is described, not set up.
fn set_up(w: &[Word]) -> bool {
    slot_filled(w)
        || named_as_slot(w)
        || changed_now(w)
        || standing_scope(w)
        || got_arranged(w)
        || slot_label(w)
        || made_the_slot(w)
        || verdict_clause(w)
}

/// "`ruff` is the linter", "the 7:40 train from Basel is our route", "the blue Lenovo at
/// 640 EUR is the one we're ordering": a named option, the subject, said to be a slot of
/// the work ([`SLOTS`]) or the one the agent takes.
fn named_as_slot(w: &[Word]) -> bool {
    let start = clause_start(w);
    let Some(link) =
        (start + 1..w.len().min(start + 12)).find(|&k| ["is", "are"].contains(&w[k].low.as_str()))
    else {
        return false;
    };
    let subject = &w[start..link];
    let described = subject
        .iter()
        .any(|x| PREDICTED.contains(&x.low.as_str()) || DESCRIBED.contains(&x.low.as_str()));
    if described || !named(subject) {
        return false;
    }
    let Some(det) = w.get(link + 1) else {
        return false;
    };
    if !["the", "our", "my"].contains(&det.low.as_str()) {
        return false;
    }
    let after = &w[link + 2..w.len().min(link + 4)];
    let slot = after.iter().any(|x| SLOTS.contains(&x.low.as_str()));
    let taken = after.first().is_some_and(|x| x.low == "one")
        && w.get(link + 3).is_some_and(|x| {
            ["i'm", "we're", "i", "we", "i've", "we've"].contains(&x.low.as_str())
        });
    slot || taken
}

/// Nouns of a part of the work an option fills: what one picks a format, a library, a
/// carrier or a venue for.
const SLOTS: &[&str] = &[
    "format",
    "library",
    "framework",
    "policy",
    "layout",
    "approach",
    "strategy",
    "pattern",
    "convention",
    "standard",
    "stack",
    "engine",
    "backend",
    "database",
    "store",
    "queue",
    "broker",
    "provider",
    "vendor",
    "carrier",
    "supplier",
    "tool",
    "toolchain",
    "runtime",
    "platform",
    "scheme",
    "structure",
    "sequence",
    "outline",
    "schedule",
    "style",
    "template",
    "naming",
    "encoding",
    "method",
    "setup",
    "workflow",
    "linter",
    "formatter",
    "bundler",
    "router",
    "orm",
    "driver",
    "client",
    "registry",
    "region",
    "venue",
    "hotel",
    "airline",
    "route",
    "plan",
    "choice",
    "pick",
    "winner",
    "solution",
    "fix",
    "option",
    "proxy",
    "scheduler",
    "cache",
    "serializer",
    "parser",
    "model",
    "optimizer",
    "loss",
    "metric",
    "baseline",
    "split",
    "font",
    "palette",
    "theme",
    "license",
    "licence",
    "host",
    "hosting",
    "deployment",
    "management",
    "manager",
    "handling",
    "storage",
    "logging",
    "auth",
    "authentication",
];

/// Words that say a part is as it was found, which a sentence then describes: "the current
/// format is CSV".
const AS_FOUND: &[&str] = &[
    "current",
    "existing",
    "old",
    "original",
    "previous",
    "installed",
    "legacy",
    "default",
];

/// "The cache backend is `memcached`", "our font for the slides will be Inter", "the
/// retry policy is now capped backoff at 5 tries": a part of the work, a slot noun
/// ([`SLOTS`]) as the head of a definite subject, said to be a named option. Its value
/// as found ("the current format is CSV"), or a number ("the split is 80/20" is
/// [`chosen_passively`]'s), describes.
fn slot_filled(w: &[Word]) -> bool {
    let start = clause_start(w);
    let Some(first) = w.get(start) else {
        return false;
    };
    if !["the", "our", "my"].contains(&first.low.as_str()) {
        return false;
    }
    // The subject runs to its copula: at most eight words, a slot noun among them, before
    // any "for" that scopes it.
    let Some(link) = (start + 1..w.len().min(start + 10)).find(|&k| {
        ["is", "are"].contains(&w[k].low.as_str())
            || (w[k].low == "will" && w.get(k + 1).is_some_and(|n| n.low == "be"))
    }) else {
        return false;
    };
    let subject = &w[start + 1..link];
    let head_end = subject
        .iter()
        .position(|x| x.low == "for" || x.mark.is_some())
        .unwrap_or(subject.len());
    let head = &subject[..head_end];
    let slot = head.last().is_some_and(|x| SLOTS.contains(&x.low.as_str()));
    let found = subject
        .iter()
        .any(|x| AS_FOUND.contains(&x.low.as_str()) || DESCRIBED.contains(&x.low.as_str()));
    let mut at = link + if w[link].low == "will" { 2 } else { 1 };
    if w.get(at)
        .is_some_and(|x| ["now", "still"].contains(&x.low.as_str()))
    {
        at += 1;
    }
    // The option, named within its first five words, not a number.
    let predicate = &w[at..w.len().min(at + 5)];
    let numeric = predicate
        .first()
        .is_some_and(|x| x.low.starts_with(|c: char| c.is_ascii_digit()));
    slot && !found && !numeric && named(predicate)
}

/// "Invoices now go out through `Postmark`", "the nightly job is now `cron_v2`",
/// "`mypy` no longer runs on tests": a part of the work said to be changed, a named option
/// in what it now does or is. What a run now shows ("the test now passes", "it now prints
/// `None`") is an outcome.
fn changed_now(w: &[Word]) -> bool {
    (1..w.len()).any(|i| {
        let now = w[i].low == "now" || (w[i].low == "longer" && w[i - 1].low == "no");
        if !now || w[i].mark.is_some() {
            return false;
        }
        // The subject: the words before, from the clause's start, none of them a pronoun
        // a prediction is of, nor a value the work meets.
        let before = if w[i].low == "longer" { i - 1 } else { i };
        let subject = &w[clause_before(w, i).min(before)..before];
        let subject = match subject.last() {
            Some(x) if ["is", "are"].contains(&x.low.as_str()) => &subject[..subject.len() - 1],
            _ => subject,
        };
        if subject.is_empty()
            || subject.len() > 7
            || subject.iter().any(|x| {
                PREDICTED.contains(&x.low.as_str())
                    || DESCRIBED.contains(&x.low.as_str())
                    || AS_FOUND.contains(&x.low.as_str())
            })
        {
            return false;
        }
        let rest = &w[i + 1..];
        let Some(verb) = rest.first() else {
            return false;
        };
        let told = lemmas(&verb.low).iter().any(|l| {
            OUTCOMES.contains(&l.as_str()) || FORECASTS.contains(&l.as_str()) || l == "pass"
        });
        let numeric = verb.low.starts_with(|c: char| c.is_ascii_digit());
        !told && !numeric && named(&rest[..rest.len().min(6)])
    })
}

/// Where the clause that holds word `i` starts: after the last mark before it, else where
/// the sentence's clause does, never past `i` ("OK now, ...": the openers may run past
/// it).
fn clause_before(w: &[Word], i: usize) -> usize {
    (0..i)
        .rev()
        .find(|&k| w[k].mark.is_some())
        .map_or(clause_start(w), |k| k + 1)
        .min(i)
}

/// Phrases that say a choice holds for the work's own later parts: "throughout", "going
/// forward", "for all remaining runs", "each new endpoint".
const STANDING: &[&[&str]] = &[
    &["throughout"],
    &["going", "forward"],
    &["from", "now", "on"],
    &["for", "all", "remaining"],
    &["for", "all", "future"],
    &["for", "every", "new"],
    &["each", "new"],
    &["every", "new"],
    &["all", "new"],
    &["across", "the", "board"],
];

/// "`isort` runs on every commit going forward", "prices are shown in EUR throughout",
/// "each new service gets a `Dockerfile` from the template": a named option, said to hold
/// for what is still to come. What the work meets throughout ("the warning shows up
/// throughout `build.log`") is an outcome.
fn standing_scope(w: &[Word]) -> bool {
    STANDING.iter().any(|p| has_words(w, p))
        && named(w)
        && !w.iter().any(|x| {
            OUTCOMES
                .iter()
                .chain(&["appear", "occur"])
                .any(|v| inflects(&x.low, v))
        })
        && !w
            .first()
            .is_some_and(|x| PREDICTED.contains(&x.low.as_str()) && x.low != "we")
}

/// "Thumbnails get generated with `libvips`", "session data gets kept in `Redis`":
/// a part of the work and the named option it gets done with, told in the get-passive.
/// What code does to a value when something happens ("the row gets deleted when ...",
/// "... by the trigger") is described ([`chosen_passively`] has the same limits).
fn got_arranged(w: &[Word]) -> bool {
    (1..w.len()).any(|i| {
        if !["get", "gets", "got"].contains(&w[i - 1].low.as_str()) {
            return false;
        }
        let participle = &w[i].low;
        let done = participle.ends_with("ed")
            || participle.ends_with("en")
            || [
                "built", "kept", "run", "put", "set", "sent", "made", "held", "stored",
            ]
            .contains(&participle.as_str());
        let told = lemmas(participle)
            .iter()
            .any(|l| OUTCOMES.contains(&l.as_str()));
        let rest = &w[i + 1..w.len().min(i + 6)];
        let placed = rest
            .iter()
            .take(3)
            .any(|x| PLACING.contains(&x.low.as_str()) && x.low != "by");
        let by_code = rest.first().is_some_and(|x| {
            ["when", "whenever", "if", "automatically", "by"].contains(&x.low.as_str())
        });
        done && !told && placed && !by_code && named(rest)
    })
}

/// "Storage layout: one bucket per tenant, no shared prefix.", "Payment handling for the
/// shop: `Stripe` checkout": a topic of two to six words ending in a slot noun
/// ([`SLOTS`]), closed by a colon, and the option after it, named or set against another
/// ("..., no ...", "..., not ...").
fn slot_label(w: &[Word]) -> bool {
    let Some(colon) = w.iter().take(6).position(|x| x.mark == Some(':')) else {
        return false;
    };
    let label = &w[..=colon];
    let head_end = label
        .iter()
        .position(|x| x.low == "for")
        .map_or(label.len(), |k| k);
    let slot = head_end >= 2
        && label[..head_end]
            .last()
            .is_some_and(|x| SLOTS.contains(&x.low.as_str()));
    let rest = &w[colon + 1..];
    let set_against = rest
        .windows(2)
        .any(|p| p[0].mark == Some(',') && ["no", "not"].contains(&p[1].low.as_str()));
    slot && rest.len() >= 2 && (named(rest) || set_against)
}

/// "Made `Caddy` our reverse proxy", "I've set `eu-west-1` as the region": an option
/// named into a slot of the work ([`SLOTS`]) by making or setting it one.
fn made_the_slot(w: &[Word]) -> bool {
    (0..w.len()).any(|i| {
        if !["made", "make", "makes", "making", "set", "sets", "setting"]
            .contains(&w[i].low.as_str())
        {
            return false;
        }
        let rest = &w[i + 1..w.len().min(i + 9)];
        let Some(into) = rest
            .iter()
            .position(|x| ["the", "our", "as"].contains(&x.low.as_str()))
        else {
            return false;
        };
        into > 0
            && named(&rest[..into])
            && rest[into + 1..]
                .iter()
                .take(3)
                .any(|x| SLOTS.contains(&x.low.as_str()))
    })
}

/// "Of the three quotes, the Lisbon one at 410 EUR wins", "the `v3` schema rewrite goes
/// ahead": a named option, the subject of its clause in a few words, said to win, stay or
/// go ahead ([`STAYS`], as [`stays_chosen`] reads the word after).
fn verdict_clause(w: &[Word]) -> bool {
    (1..w.len()).any(|i| {
        if !STAYS.contains(&w[i].low.as_str())
            || !stays_chosen(&w[i].low, w.get(i + 1).map(|n| n.low.as_str()))
        {
            return false;
        }
        let subject = &w[clause_before(w, i)..i];
        (1..=7).contains(&subject.len())
            && named(subject)
            && !subject
                .iter()
                .any(|x| PREDICTED.contains(&x.low.as_str()) || DESCRIBED.contains(&x.low.as_str()))
    })
}

/// "The branch for this work is `feat/tax-v2`", "our charting library for the report is
/// `matplotlib`", "for the review, the framework is `thematic-analysis`", "the hotel for
/// Munich is the Mercure", "Storage for big files: the `bulk-archive` bucket": a part of
/// the work, scoped by "for", said (or labelled) to be a named option. What something is
/// for a case the work meets (an error, an output, a value printed) describes it instead.
fn designated(w: &[Word]) -> bool {
    // The link: "is", "are", or the colon closing a label.
    let Some(link) = w
        .iter()
        .position(|x| x.low == "is" || x.low == "are" || x.mark == Some(':'))
    else {
        return false;
    };
    let labelled = w[link].mark == Some(':');
    let after = link + 1;
    // One article may come before the option: "is the Mercure", ": the `bulk` bucket".
    let skip = w
        .get(after)
        .is_some_and(|x| ["the", "a", "an"].contains(&x.low.as_str()));
    let named_next = w.get(after + usize::from(skip)).is_some_and(|x| x.name);
    // "For the dashboards, the library is ...": the subject starts after the comma.
    let start = (0..link)
        .rev()
        .find(|&k| w[k].mark == Some(','))
        .map_or(clause_start(w), |k| k + 1);
    let end = if labelled { link + 1 } else { link };
    let subject = &w[start..end];
    let scoped = w[..end].iter().any(|x| x.low == "for");
    // A label stands alone ("Hotel for Munich:"); a sentence's subject is definite.
    let opened = labelled
        || subject
            .first()
            .is_some_and(|x| ["the", "our", "my"].contains(&x.low.as_str()));
    let described = subject.iter().any(|x| DESCRIBED.contains(&x.low.as_str()));
    named_next && scoped && opened && !described && subject.len() <= 8
}

/// Nouns whose value a sentence reports rather than chooses: "the error for this input is
/// `KeyError`", "the output for `ls` is empty".
const DESCRIBED: &[&str] = &[
    "error",
    "errors",
    "output",
    "result",
    "results",
    "value",
    "response",
    "reason",
    "cause",
    "problem",
    "issue",
    "bug",
    "exception",
    "status",
    "message",
    "log",
    "logs",
    "answer",
    "return",
    "type",
    "size",
    "count",
    "total",
    "difference",
    "culprit",
];

/// "Server state will be managed by `react-query`", "navigation will go through
/// `expo-router`", "there'll be one `Dockerfile`", "the log level will be `INFO`": what the
/// work will be, said of a part of it, with the option named after the modal. A
/// prediction of an outcome ("the test will fail on `parse`", "it will print `None`") or
/// of what something is ("this will be slow") commits to nothing.
fn future_plan(w: &[Word]) -> bool {
    // "there will be `X`", "there'll be `X`": a part of the work that will exist.
    let be_named = |rest: &[Word]| rest.first().is_some_and(|x| x.low == "be") && named(rest);
    (0..w.len()).any(|i| {
        // Where the subject stands and where the verb after the modal does.
        let (subject, modal) = match w[i].low.as_str() {
            "will" | "shall" => (i.checked_sub(1), i + 1),
            "there'll" => return be_named(&w[i + 1..]),
            "going"
                if i > 0
                    && ["is", "are"].contains(&w[i - 1].low.as_str())
                    && w.get(i + 1).is_some_and(|x| x.low == "to") =>
            {
                (i.checked_sub(2), i + 2)
            }
            _ => return false,
        };
        // The subject: a part of the work, not the agent (see [`agent_commits`]) nor what
        // a prediction is of.
        let Some(subject) = subject.map(|k| w[k].low.as_str()) else {
            return false;
        };
        if subject == "there" {
            return be_named(&w[modal..]);
        }
        if PREDICTED.contains(&subject) {
            return false;
        }
        let Some(verb) = w.get(modal) else {
            return false;
        };
        let after = &w[modal + 1..];
        if verb.low == "be" {
            // "will be `INFO`", "will be handled by `tenacity`", "will be 3 attempts via
            // `backoff`".
            let Some(next) = after.first() else {
                return false;
            };
            if next.name {
                return true;
            }
            let participle = next.low.ends_with("ed") || next.low.ends_with("en");
            return participle
                && !lemmas(&next.low)
                    .iter()
                    .any(|l| OUTCOMES.contains(&l.as_str()))
                && after[1..]
                    .iter()
                    .take(4)
                    .any(|x| PLACING.contains(&x.low.as_str()))
                && named(after);
        }
        // "Errors will follow RFC 7807", "secrets will come from `vault`", "nginx will
        // terminate TLS": any verb of what the part does, but for what happens to a
        // value or what a prediction says of it ("will take a while", "will need `x`").
        let verb_lemmas = lemmas(&verb.low);
        let role = verb_lemmas
            .iter()
            .any(|l| ROLES.contains(&l.as_str()) || ["rely", "use", "go"].contains(&l.as_str()));
        let told = verb_lemmas
            .iter()
            .any(|l| OUTCOMES.contains(&l.as_str()) || FORECASTS.contains(&l.as_str()));
        let plain = verb.mark.is_none() && verb.low.bytes().all(|b| b.is_ascii_lowercase());
        (role || (plain && !told)) && named(after)
    })
}

/// Verbs after "will" that forecast rather than plan: "the build will take 5 minutes",
/// "the job will need `jq`", "the page will look broken".
const FORECASTS: &[&str] = &[
    "take", "need", "cost", "look", "seem", "happen", "appear", "work", "finish", "complete",
    "pass", "succeed", "change", "get", "have", "help", "cause", "affect", "not", "never",
    "probably", "likely", "still", "also", "only", "just", "now", "then", "try", "want", "see",
    "find", "notice", "hit", "reach", "crash", "time", "hang", "stop", "start", "continue",
    "depend", "require", "match", "contain", "include", "mean", "end", "let", "tell", "say",
    "report", "warn", "complain", "wait", "increase", "decrease", "grow", "drop", "rise", "fall",
    "improve", "degrade", "slow", "speed", "shrink", "double",
];

/// Subjects of a prediction: "it will fail", "this will take a while", "you'll see".
const PREDICTED: &[&str] = &[
    "it", "this", "that", "these", "those", "you", "they", "i", "we", "which", "what", "who", "he",
    "she", "he'll", "test", "tests", "build", "error", "output", "command",
];

/// Verbs of what happens to a value rather than of the work's design: "will be printed",
/// "will be raised".
const OUTCOMES: &[&str] = &[
    "print", "show", "raise", "throw", "return", "log", "display", "emit", "ignore", "lose",
    "call", "invoke", "trigger", "skip", "fail", "break",
];

/// Words that place a part of the work with its option: "managed by", "built with",
/// "verified via".
const PLACING: &[&str] = &[
    "by", "with", "via", "through", "in", "on", "using", "under", "as", "into", "to",
];

fn named(w: &[Word]) -> bool {
    w.iter().any(|x| x.name)
}

/// Phrases that set a choice for the rest of the work: "`X` handles retries from here
/// on", "henceforth". ("For good" is left out: "for good reason", "retired for good".)
const FROM_NOW: &[&[&str]] = &[
    &["from", "here", "on"],
    &["from", "this", "point"],
    &["henceforth"],
    &["until", "further", "notice"],
    &["for", "the", "rest", "of"],
    &["from", "the", "next", "release"],
    &["by", "default", "now"],
    // What closes a sentence to say the choice stands: "... — going ahead with that",
    // "... and leaving it there", "that's where it'll stay", "and keeping it that way".
    &["going", "ahead", "with", "that"],
    &["leaving", "it", "there"],
    &["leave", "it", "there"],
    &["where", "it'll", "stay"],
    &["where", "it", "will", "stay"],
    &["where", "it", "stays"],
    &["it", "that", "way"],
];

fn settled_from_now(w: &[Word]) -> bool {
    FROM_NOW.iter().any(|p| has_words(w, p))
}

/// "Best to pin `numpy` at 1.26.", "Safer to keep `v1_auth` running": an evaluation that
/// selects, opening the sentence, with the step it selects after "to".
fn opens_with_a_verdict(w: &[Word]) -> bool {
    let i = clause_start(w);
    w.get(i)
        .is_some_and(|x| SELECTING.contains(&x.low.as_str()))
        && w.get(i + 1).is_some_and(|x| x.low == "to")
        && w.get(i + 2).is_some_and(|x| !explores(&x.low))
}

/// Whether, outside its backticked spans, the sentence holds the marks of code: an
/// assignment, a block, a shell variable.
fn reads_as_code(s: &str) -> bool {
    s.split('`')
        .step_by(2)
        .any(|outside| outside.contains(['=', '{', '}', '$']))
}

/// Words that leave the choice open.
const HEDGES: &[&str] = &[
    "maybe", "perhaps", "whether", "could", "might", "wonder", "unsure", "possibly", "either",
];

fn has_words(w: &[Word], seq: &[&str]) -> bool {
    w.windows(seq.len())
        .any(|win| win.iter().zip(seq).all(|(x, s)| x.low == *s))
}

/// Words that open a sentence before its clause does ("OK, keeping ...", "So we ...").
const OPENERS: &[&str] = &[
    "ok",
    "okay",
    "alright",
    "right",
    "so",
    "then",
    "fine",
    "good",
    "great",
    "yes",
    "yeah",
    "now",
    "finally",
    "therefore",
    "thus",
    "hence",
    "anyway",
    "overall",
    "ultimately",
];

fn clause_start(w: &[Word]) -> usize {
    w.iter()
        .position(|x| !OPENERS.contains(&x.low.as_str()))
        .unwrap_or(w.len())
}

/// "Keeping the bounded queue in `ingest.rs`.", "Replace `moment` with `date-fns`.",
/// "Pinned numpy to 1.26.": a verb of choosing or changing first (an imperative, a
/// participle with its subject left out), or any gerund that does not explore
/// ("Looking at `x.py`" narrates). A gerund followed by a verb is a noun ("Logging is
/// set up in `log.rs`").
fn opens_with_verb(w: &[Word]) -> bool {
    let i = clause_start(w);
    let (Some(first), Some(next)) = (w.get(i), w.get(i + 1)) else {
        return false;
    };
    let v = first.low.as_str();
    // "Docstring: ..." is a label; "Substring" no gerund.
    if first.shouted || first.mark.is_some() || v.ends_with("string") {
        return false;
    }
    if AUXILIARIES.contains(&next.low.as_str()) || explores(v) || NOT_GERUNDS.contains(&v) {
        return false;
    }
    // "Upgrading both legs would cost $1,023": a gerund whose clause goes on to its own
    // verb is that verb's subject, a consequence weighed rather than a step taken.
    // "Locking `urllib3` at 1.26 until the issue is resolved": a clause of its own ends
    // the gerund's.
    let clause = w[i + 1..]
        .iter()
        .take_while(|x| x.mark.is_none() && !SUBORDINATORS.contains(&x.low.as_str()));
    let weighed = clause.map(|x| x.low.as_str()).any(|x| {
        [
            "would", "could", "will", "is", "was", "means", "results", "costs",
        ]
        .contains(&x)
    });
    let gerund = v.len() > 5 && v.ends_with("ing");
    !weighed
        && (gerund
            || lemmas(v)
                .iter()
                .any(|l| CHOOSING_VERBS.contains(&l.as_str())))
}

/// Words that open a clause of its own inside a sentence.
const SUBORDINATORS: &[&str] = &[
    "until", "unless", "once", "when", "if", "because", "since", "so", "while", "after", "before",
    "whereas",
];

/// Words in -ing that are no step: nouns, prepositions, what a log line opens with.
const NOT_GERUNDS: &[&str] = &[
    "nothing",
    "something",
    "anything",
    "everything",
    "during",
    "string",
    "strings",
    "morning",
    "evening",
    "according",
    "including",
    "regarding",
    "following",
    "considering",
    "assuming",
    "concerning",
    "depending",
    "excluding",
    "pending",
    "padding",
    "logging",
    "warning",
    "missing",
    "failing",
    "remaining",
    "existing",
    "incoming",
    "outgoing",
    "upcoming",
    "ongoing",
    "interesting",
    "matching",
    "building",
    "collecting",
    "downloading",
    "processing",
    "compiling",
    "resolving",
    "cloning",
    "unpacking",
    "preparing",
    "generating",
    "loading",
    "setting",
    "selecting",
    "requiring",
    "testing",
    "thinking",
    "blocking",
    "routing",
    "caching",
    "scheduling",
    "parsing",
    "streaming",
    "encoding",
    "mapping",
    "binding",
    "ranking",
    "rendering",
    "timing",
    "spacing",
    "heading",
    "ceiling",
];

/// Verbs that choose or change what the work builds on, as the first word of a sentence
/// (an imperative, or a participle whose subject is the agent): base forms; [`lemmas`]
/// reads the inflected ones. Words that are also common nouns at a sentence's start
/// ("Cache", "Route", "Set") are left out.
const CHOOSING_VERBS: &[&str] = &[
    "keep",
    "drop",
    "replace",
    "swap",
    "move",
    "pin",
    "pick",
    "choose",
    "select",
    "prefer",
    "adopt",
    "retain",
    "remove",
    "rename",
    "extract",
    "inline",
    "consolidate",
    "unify",
    "centralise",
    "centralize",
    "delegate",
    "defer",
    "bump",
    "upgrade",
    "downgrade",
    "revert",
    "restructure",
    "refactor",
    "retire",
    "ditch",
    "scrap",
    "abandon",
    "skip",
    "avoid",
    "reject",
    "disable",
    "enable",
    "leave",
    "put",
    "wire",
    "stick",
    "stay",
    "trust",
    "rely",
    "lean",
    "ship",
    "vendor",
    "allow",
    "forbid",
    "require",
    "enforce",
    "standardise",
    "standardize",
    "favour",
    "favor",
    "prioritise",
    "prioritize",
    "migrate",
    "collapse",
    "simplify",
    "hardcode",
    "deduplicate",
    "memoize",
    "reuse",
    "introduce",
    "implement",
    "persist",
    "fall",
];

/// Auxiliaries and the like: a word opening a sentence that one of these follows is its
/// subject, not its verb.
const AUXILIARIES: &[&str] = &[
    "is", "was", "are", "were", "has", "have", "had", "will", "would", "can", "could", "should",
    "does", "did", "may", "might", "must", "isn't", "wasn't", "doesn't", "didn't", "won't",
    "fails", "failed", "works", "worked", "happens", "returns", "raises", "seems",
];

/// Verbs that explore, read, think or carry out a step rather than choose: with the
/// narrated steps ([`NARRATION_VERBS`]), what an agent says of what it saw or
/// believes, and the steps of running and repairing.
const THINKING_VERBS: &[&str] = &[
    "think",
    "believe",
    "notice",
    "guess",
    "suspect",
    "know",
    "hope",
    "expect",
    "assume",
    "realize",
    "realise",
    "feel",
    "mean",
    "understand",
    "agree",
    "apologize",
    "apologise",
    "appreciate",
    "thank",
    "recall",
    "remember",
    "forget",
    "suppose",
    "imagine",
    "doubt",
    "seem",
    "appear",
    "learn",
    "mention",
    "say",
    "tell",
    "ask",
    "explain",
    "describe",
    "note",
    "observe",
    "miss",
    "want",
    "wish",
    "like",
    "love",
    "encounter",
    "hit",
    "face",
    "receive",
    "sort",
    "spot",
    "discover",
    "determine",
    "identify",
    "figure",
    "debug",
    "trace",
    "diagnose",
    "compare",
    "consider",
    "evaluate",
    "assess",
    "measure",
    "benchmark",
    "profile",
    "ensure",
    "double",
    "summarize",
    "summarise",
    "recap",
    "address",
    "handle",
    "fix",
    "resolve",
    "solve",
    "apply",
    "patch",
    "insert",
    "locate",
    "display",
    "show",
    "count",
    "grep",
    "compile",
    "fail",
    "succeed",
    "pass",
    "rerun",
    "restart",
    "reload",
    "refresh",
    "save",
    "commit",
    "push",
    "pull",
    "clone",
    "download",
    "forgot",
    "retrieve",
    "obtain",
    "gather",
    "collect",
    "send",
    "connect",
    "calculate",
    "compute",
    "decode",
    "encode",
    "undo",
    "formulate",
    "recover",
    "request",
    "return",
];

/// The base forms `word` may be an inflection of: itself, without -s, -es, -ed, -d, -ing
/// (with a dropped `e` put back, a doubled consonant undone, `i` back to `y`), and its
/// irregular base.
fn lemmas(word: &str) -> Vec<String> {
    let mut out = vec![word.to_string()];
    let mut stem = |s: &str| {
        if s.len() >= 2 {
            out.push(s.to_string());
            out.push(format!("{s}e"));
            let b = s.as_bytes();
            if b[b.len() - 1] == b[b.len() - 2] {
                out.push(s[..s.len() - 1].to_string());
            }
            if let Some(y) = s.strip_suffix('i') {
                out.push(format!("{y}y"));
            }
        }
    };
    for suffix in ["ing", "ed", "es", "s", "d"] {
        if let Some(s) = word.strip_suffix(suffix) {
            stem(s);
        }
    }
    if let Some(base) = verbs::base_of(word) {
        out.push(base.to_string());
    }
    out
}

/// Whether `word` is `verb` or one of its inflections: stricter than [`lemmas`], which
/// also takes nouns for verbs ("loss" for "lose").
fn inflects(word: &str, verb: &str) -> bool {
    if word == verb || super::verbs::base_of(word) == Some(verb) {
        return true;
    }
    // "shows", "pushes", "printed", "showing"; "raises", "raised", "raising".
    match (word.strip_prefix(verb), verb.strip_suffix('e')) {
        (Some(tail), None) => ["s", "es", "ed", "ing"].contains(&tail),
        (Some(tail), Some(_)) => ["s", "d"].contains(&tail),
        (None, Some(stem)) => word.strip_prefix(stem) == Some("ing"),
        (None, None) => false,
    }
}

/// Whether `word` is a form of a verb that explores, reads or thinks.
fn explores(word: &str) -> bool {
    static VERBS: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
        NARRATION_VERBS
            .iter()
            .chain(THINKING_VERBS)
            .copied()
            .filter(|v| !["use", "go", "correct"].contains(v))
            .collect()
    });
    lemmas(word).iter().any(|l| VERBS.contains(l.as_str()))
}

/// "I'm keeping `lru_cache`", "We moved the retries into `Backoff`", "I'd put the limit
/// in `settings.toml`", "we won't touch `legacy/`", "let's fall back to `sqlite3`": the
/// agent as the subject, in any tense or mood, of a verb that neither explores nor
/// thinks; "use" only with an option as its object, "go" only with or for one.
fn agent_commits(w: &[Word]) -> bool {
    (0..w.len()).any(|i| {
        // The agent as written: "I", "We", "let's"; not `-I` nor a lone "i" of a listing.
        if !w[i].raw.starts_with(['I', 'W', 'w', 'L', 'l']) {
            return false;
        }
        let (rest, be) = match w[i].low.as_str() {
            "i" | "we" => (i + 1, false),
            "let's" | "i'll" | "we'll" | "i'd" | "we'd" => (i + 1, false),
            "i've" | "we've" => (i, false),
            "i'm" | "we're" => (i + 1, true),
            "let" if w.get(i + 1).is_some_and(|x| x.low == "us") => (i + 2, false),
            _ => return false,
        };
        commits_after_subject(w, rest, be)
    })
}

/// Words between the agent and its verb that say when, how sure or in what mood.
const BETWEEN: &[&str] = &[
    "will",
    "would",
    "shall",
    "should",
    "must",
    "do",
    "does",
    "did",
    "not",
    "never",
    "yet",
    "won't",
    "don't",
    "didn't",
    "shouldn't",
    "wouldn't",
    "now",
    "also",
    "just",
    "then",
    "first",
    "still",
    "simply",
    "really",
    "definitely",
    "probably",
    "actually",
    "instead",
    "already",
    "only",
    "therefore",
    "finally",
    "indeed",
    "clearly",
    "ultimately",
    "eventually",
    "deliberately",
    "intentionally",
    "explicitly",
    "basically",
    "gonna",
    "rather",
    "to",
    "have",
    "has",
    "had",
    "going",
    "want",
    "need",
    "plan",
    "intend",
    "aim",
    "mean",
    "ought",
    "decided",
    "chose",
    "prefer",
    "can",
    "be",
    "been",
    "am",
    "are",
    "is",
    "was",
    "were",
    "i've",
    "we've",
];

/// The verb after the agent (from `at`), past the auxiliaries; `be` when the subject
/// came with its "am"/"are": the verb is then a gerund ("I'm keeping"), else the word is
/// a state ("I'm confident").
fn commits_after_subject(w: &[Word], mut at: usize, mut be: bool) -> bool {
    let mut had = false;
    while let Some(x) = w.get(at) {
        let word = x.low.as_str();
        if ["can", "could", "may", "might", "can't", "cannot"].contains(&word) {
            return false;
        }
        // An adverb in -ly ("previously", "probably") says when or how sure.
        let adverb = word.len() > 4 && word.ends_with("ly");
        if !BETWEEN.contains(&word) && !adverb {
            break;
        }
        // "have to", "want to", "going to": what follows is the verb, no state.
        if w.get(at + 1).is_some_and(|n| n.low == "to") {
            be = false;
        } else if ["am", "are", "is", "was", "were", "be", "been"].contains(&word) {
            be = true;
        }
        // Past "not" and "yet": "we have not yet explored" is still "have" + participle.
        if word == "to" {
            had = false;
        }
        had |= ["have", "has", "had", "i've", "we've"].contains(&word);
        at += 1;
    }
    let Some(verb) = w.get(at).filter(|x| !x.shouted).map(|x| x.low.as_str()) else {
        return false;
    };
    // "We have three failing tests": "have" with no participle after it owns, not does.
    let participle = verb.ends_with("ed") || verb.ends_with("en") || verbs::base_of(verb).is_some();
    if (be && !verb.ends_with("ing"))
        || (had && !participle)
        || AUXILIARIES.contains(&verb)
        || NOT_VERBS.contains(&verb)
    {
        return false;
    }
    let after = &w[at + 1..];
    let named_after = after.iter().any(|x| x.name);
    let lemma = lemmas(verb);
    let is = |base: &str| lemma.iter().any(|l| l == base);
    if is("use") {
        return named_after
            && !after.iter().any(|x| {
                ["to", "command", "tool", "it", "this", "that"].contains(&x.low.as_str())
            });
    }
    if is("go") {
        return after
            .first()
            .is_some_and(|x| ["with", "for"].contains(&x.low.as_str()));
    }
    // "I selected lines 10-20 to view them": a step whose purpose is to explore.
    let to_explore = after.windows(2).any(|p| {
        // "to be safe", "to make the build reproducible": a reason, not a look.
        let reason = ["be", "have", "do", "make", "get", "help", "give", "keep"];
        p[0].low == "to" && explores(&p[1].low) && !reason.contains(&p[1].low.as_str())
    });
    !to_explore && !explores(verb) && verb.chars().all(|c| c.is_ascii_alphabetic() || c == '-')
}

/// Words that, where the agent's verb would stand, show there is none: "I had the
/// tests", "we have a fix".
const NOT_VERBS: &[&str] = &[
    "the", "a", "an", "this", "that", "these", "those", "it", "its", "no", "some", "any", "all",
    "to", "in", "on", "at", "of", "for", "with", "from", "by", "about", "as", "so", "there",
    "here", "what", "which", "sure", "my", "our", "your", "their", "more", "less", "much", "many",
    "one", "two", "if", "when", "because", "and", "or", "but", "yes", "ok", "okay", "both",
    "again", "too",
];

/// Nouns of a plan: what "our"/"my" or a verdict label put before the option.
const PLAN_NOUNS: &[&str] = &[
    "plan",
    "approach",
    "choice",
    "pick",
    "fix",
    "strategy",
    "recommendation",
    "preference",
    "call",
    "bet",
    "option",
    "solution",
    "direction",
    "proposal",
    "design",
    "decision",
    "default",
    "route",
    "path",
    "winner",
    "favourite",
    "favorite",
    "fallback",
    "verdict",
    "resolution",
    "conclusion",
    "outcome",
    "answer",
    "compromise",
];

/// "Our fallback stays `sqlite3`", "My recommendation: `tokio::sync::Semaphore`.", "the
/// pick here is `blake3`": a plan of ours, or the plan, stated; not one that failed
/// ("my fix didn't work").
fn our_plan(w: &[Word]) -> bool {
    (0..w.len()).any(|i| {
        let whose = w[i].low.as_str();
        let ours = ["our", "my"].contains(&whose);
        if !ours && whose != "the" {
            return false;
        }
        // One adjective may come between: "our final pick", "the new plan"; not a name
        // ("the Missouri Compromise" is one). After "the", only the nouns that are a
        // choice: "the path is" describes.
        let nouns = if ours { PLAN_NOUNS } else { THE_PLAN };
        let noun = (i + 1..(i + 3).min(w.len()))
            .take_while(|&j| !w[j].name)
            .find(|&j| nouns.contains(&w[j].low.as_str()));
        let Some(n) = noun else { return false };
        let next: Vec<&str> = w[n + 1..].iter().take(3).map(|x| x.low.as_str()).collect();
        let failed = next.iter().any(|x| {
            [
                "didn't", "doesn't", "failed", "fails", "broke", "breaks", "wasn't", "isn't",
            ]
            .contains(x)
        });
        let stated = w[n].mark == Some(':')
            || next
                .first()
                .is_some_and(|x| ["is", "was", "stays", "remains", "here", "now"].contains(x));
        // "the default is 30": a setting described, not chosen.
        !failed && (stated || ours)
    })
}

/// The plan nouns that, after "the", name the choice itself.
const THE_PLAN: &[&str] = &[
    "plan",
    "approach",
    "choice",
    "pick",
    "fix",
    "strategy",
    "call",
    "verdict",
    "winner",
    "decision",
    "resolution",
    "recommendation",
    "direction",
    "compromise",
    "solution",
    "conclusion",
];

/// Labels that announce the option chosen: "Plan:", "Verdict:", "Going forward:".
const LABELS: &[&str] = &[
    "plan",
    "verdict",
    "choice",
    "decision",
    "final",
    "pick",
    "winner",
    "approach",
    "fix",
    "resolution",
    "recommendation",
    "conclusion",
    "outcome",
    "strategy",
    "direction",
    "solution",
    "call",
    "forward",
    "tl;dr",
    "tldr",
    "chosen",
    "selected",
    "preferred",
    "proposal",
    "takeaway",
];

/// "Plan: `orjson` everywhere.", "**Verdict:** keep `v2`.": a label of up to three words,
/// closed by a colon or a dash, and the option after it. ("Final Answer:" is a text
/// agent's reply to the user, not a choice.)
fn under_label(w: &[Word]) -> bool {
    let Some(colon) = w
        .iter()
        .take(3)
        .position(|x| matches!(x.mark, Some(':' | '-' | '\u{2014}' | '\u{2013}')))
    else {
        return false;
    };
    let label = &w[..=colon];
    label.iter().any(|x| LABELS.contains(&x.low.as_str()))
        && !label.iter().any(|x| x.low == "answer")
        && w[colon + 1..].iter().any(|x| x.name)
}

/// "`deadpool` will own the connections", "`v2_schema` stays", "the `Redis` backend
/// should become the default", "`orjson` wins": the option, subject of a role it takes on
/// (a modal before it), or of a verb that says it stays or is chosen.
fn option_in_role(w: &[Word]) -> bool {
    (0..w.len()).filter(|&k| w[k].name).any(|k| {
        // "Option B wins": the noun and its label are the subject.
        let k0 = if k > 0 && LABELLED_NOUNS.contains(&w[k - 1].low.as_str()) {
            k - 1
        } else {
            k
        };
        let subject = k0 == 0
            || w[k0 - 1].mark.is_some()
            || [
                "the", "a", "an", "our", "my", "so", "then", "and", "but", "now", "this",
            ]
            .contains(&w[k0 - 1].low.as_str())
            || clause_start(w) == k0;
        if !subject {
            return false;
        }
        // "the `Redis` backend will": one noun may finish the subject.
        let mut at = k + 1;
        if w.get(at).is_some_and(|x| {
            !ROLE_MODALS.contains(&x.low.as_str()) && !STAYS.contains(&x.low.as_str())
        }) && w.get(at).is_some_and(|x| x.mark.is_none())
        {
            at += 1;
        }
        let Some(x) = w.get(at) else { return false };
        if STAYS.contains(&x.low.as_str()) {
            return stays_chosen(&x.low, w.get(at + 1).map(|n| n.low.as_str()));
        }
        let mut modal = false;
        // "is" only as "is going to": "`x` is run by cron" describes.
        while w.get(at).is_some_and(|x| {
            ROLE_MODALS.contains(&x.low.as_str())
                || (x.low == "is" && w.get(at + 1).is_some_and(|n| n.low == "going"))
        }) {
            modal = true;
            at += 1;
        }
        let Some(verb) = w.get(at).map(|x| x.low.as_str()) else {
            return false;
        };
        if !modal {
            return false;
        }
        if verb == "be" || verb == "become" {
            return w
                .get(at + 1)
                .is_some_and(|x| ["the", "our", "my"].contains(&x.low.as_str()));
        }
        lemmas(verb).iter().any(|l| ROLES.contains(&l.as_str()))
    })
}

/// What comes between an option and the role it takes on: "will", "should", "is going
/// to", "now".
const ROLE_MODALS: &[&str] = &[
    "will", "'ll", "shall", "should", "must", "now", "then", "alone", "going", "to", "needs", "has",
];

/// Whether "stays", "goes" and the like, followed by `next`, keep an option rather than
/// describe a value ("`count` stays 0") or a path through code ("`parse` goes through").
fn stays_chosen(verb: &str, next: Option<&str>) -> bool {
    let next = next.unwrap_or("");
    if verb == "goes" {
        return [
            "in", "into", "first", "away", "out", "ahead", "last", "live",
        ]
        .contains(&next);
    }
    let value = next.starts_with(|c: char| c.is_ascii_digit())
        || [
            "none", "null", "nil", "false", "true", "empty", "zero", "unset", "at",
        ]
        .contains(&next);
    !value
}

/// Present-tense verbs that keep or choose an option: "`v2` stays", "`zstd` wins".
const STAYS: &[&str] = &[
    "stays",
    "remains",
    "wins",
    "beats",
    "trumps",
    "outranks",
    "supersedes",
    "prevails",
    "goes",
];

/// Roles an option takes on in the work: "will own", "should handle", "needs to go".
const ROLES: &[&str] = &[
    "own",
    "handle",
    "serve",
    "take",
    "replace",
    "supersede",
    "back",
    "power",
    "host",
    "store",
    "hold",
    "manage",
    "drive",
    "carry",
    "cover",
    "live",
    "sit",
    "stay",
    "remain",
    "go",
    "win",
    "do",
    "front",
    "guard",
    "wrap",
    "provide",
    "absorb",
    "house",
    "keep",
    "become",
    "run",
    "process",
    "cache",
    "persist",
    "answer",
    "decide",
    "gate",
    "stay",
];

/// Participles that, after "was", "is", "got" or "has been", say an option was chosen
/// or turned down.
const CHOSEN: &[&str] = &[
    "picked",
    "selected",
    "pinned",
    "retired",
    "swapped",
    "favoured",
    "favored",
    "ditched",
    "scrapped",
    "rejected",
    "shortlisted",
    "greenlit",
    "vetoed",
    "preferred",
];

/// "`ed25519` was picked for the signing keys", "`node:18` is pinned as the base
/// image", "`nose` got ditched", "the split is fixed at 80/10/10": an option or a value
/// chosen or turned down, told in the passive;
/// not what code does to a value ("the row is selected by the query", "... when").
fn chosen_passively(w: &[Word]) -> bool {
    (1..w.len()).any(|i| {
        let auxiliary = ["is", "was", "are", "were", "gets", "got", "been", "be"]
            .contains(&w[i - 1].low.as_str());
        let by_code = w.get(i + 1).is_some_and(|n| {
            [
                "by",
                "when",
                "whenever",
                "if",
                "automatically",
                "implicitly",
            ]
            .contains(&n.low.as_str())
        });
        // "The split is fixed at 80/10/10", "the pool is set to 8": a value chosen.
        let valued = SET_AT.contains(&w[i].low.as_str())
            && w
                .get(i + 1)
                .is_some_and(|n| ["at", "to", "on", "as"].contains(&n.low.as_str()))
            // "fixed at last" is a repair.
            && w
                .get(i + 2)
                .is_none_or(|n| !["last", "first", "once"].contains(&n.low.as_str()));
        auxiliary && (CHOSEN.contains(&w[i].low.as_str()) || valued) && !by_code
    })
}

/// Participles that, with "at", "to" or "on" after them, say a value was chosen: "fixed at
/// 80/10/10", "locked to `v2`", "standardised on `ruff`".
const SET_AT: &[&str] = &[
    "fixed",
    "set",
    "locked",
    "frozen",
    "hardcoded",
    "standardised",
    "standardized",
    "settled",
    "assigned",
];

/// "`msgspec` over `pydantic` for decoding", "`uvloop`, not the default loop", "`ruff` in
/// place of `flake8`": a contrast that keeps one option and not the other.
fn contrast_selects(w: &[Word]) -> bool {
    // "`X` wins over `Y`", "`X` wins out over `Y`", "`X` won over `Y`": the option, then
    // the verb of its winning.
    let option_before = |i: usize| {
        let mut at = i;
        if at > 0 && w[at - 1].low == "out" {
            at -= 1;
        }
        if at > 0 && ["wins", "won", "win", "prevails"].contains(&w[at - 1].low.as_str()) {
            at -= 1;
        }
        at > 0 && w[at - 1].name && w[at - 1].mark.is_none()
    };
    let over = (1..w.len()).any(|i| {
        w[i].low == "over"
            && option_before(i)
            && w.get(i + 1).is_some_and(|n| {
                ![
                    "time", "network", "ssh", "http", "https", "tcp", "udp", "it", "them", "and",
                ]
                .contains(&n.low.as_str())
            })
    });
    // "failed in `a`, not in `b`" places a fault: the contrast is of options only when
    // an option follows.
    let not = (1..w.len()).any(|i| {
        w[i].low == "not"
            && w[i - 1].mark.is_some()
            && w[..i].iter().any(|x| x.name)
            && w.get(i + 1).is_some_and(|n| {
                ![
                    "in",
                    "on",
                    "at",
                    "from",
                    "to",
                    "because",
                    "yet",
                    "only",
                    "just",
                    "when",
                    "if",
                    "sure",
                    "always",
                    "all",
                    "everything",
                    "by",
                    "for",
                ]
                .contains(&n.low.as_str())
            })
    });
    let phrase = [
        &["in", "place", "of"][..],
        &["as", "opposed", "to"],
        &["in", "preference", "to"],
    ]
    .iter()
    .any(|p| has_words(w, p));
    over || not || phrase || picked_between(w)
}

/// "Between `sentry` and `rollbar`, `sentry`.", "Of pnpm and yarn, pnpm": the options
/// weighed, then the one taken, named again after the comma.
fn picked_between(w: &[Word]) -> bool {
    let i = clause_start(w);
    if !w
        .get(i)
        .is_some_and(|x| ["between", "of"].contains(&x.low.as_str()))
    {
        return false;
    }
    let Some(comma) = (i + 1..w.len().min(i + 10)).find(|&k| w[k].mark == Some(',')) else {
        return false;
    };
    let weighed = &w[i + 1..=comma];
    weighed.iter().any(|x| x.low == "and" || x.low == "or")
        && w.get(comma + 1)
            .is_some_and(|taken| taken.name && weighed.iter().any(|x| x.name && x.low == taken.low))
}

/// Adjectives that select whatever noun they stand before, or alone: "the cleanest", "a
/// better fit", "simpler".
const SELECTING: &[&str] = &[
    "best",
    "better",
    "simplest",
    "safest",
    "cleanest",
    "easiest",
    "cheapest",
    "sanest",
    "wisest",
    "smartest",
    "preferable",
    "ideal",
    "sensible",
    "cleaner",
    "simpler",
    "safer",
    "easier",
    "saner",
    "leanest",
    "tidiest",
    "neatest",
    "soundest",
    "sturdiest",
    "nicest",
    "nicer",
];

/// Adjectives that select only before a noun of options: "the right tool", "the only
/// way", "the obvious candidate".
const BEFORE_AN_OPTION: &[&str] = &[
    "right",
    "correct",
    "obvious",
    "only",
    "proper",
    "natural",
    "clear",
    "preferred",
    "recommended",
    "logical",
    "winning",
    "likely",
    "least",
    "most",
];

const OPTION_NOUNS: &[&str] = &[
    "option",
    "options",
    "choice",
    "bet",
    "fit",
    "approach",
    "path",
    "route",
    "way",
    "fix",
    "solution",
    "tool",
    "pick",
    "candidate",
    "move",
    "call",
    "plan",
    "design",
    "tradeoff",
    "trade-off",
    "compromise",
    "strategy",
    "alternative",
    "direction",
    "answer",
    "default",
    "pattern",
    "abstraction",
    "library",
    "format",
    "backend",
    "engine",
    "setup",
    "culprit",
    "cause",
    "winner",
];

/// Nouns that are the choice itself: "`blake3` is the winner", "`ld.lld` is the culprit".
const VERDICT_NOUNS: &[&str] = &[
    "plan", "winner", "culprit", "fix", "call", "pick", "choice", "way", "one", "keeper", "answer",
    "cause", "go",
];

/// "`bounded(64)` is the safest choice", "`ruff` looks like a better fit", "`SIGTERM` is
/// the obvious option", "`sqlx` is the winner": a copula, then an adjective that selects,
/// or a noun that is the choice.
fn evaluation_selects(w: &[Word]) -> bool {
    (0..w.len()).any(|c| {
        let copula = match w[c].low.as_str() {
            "is" | "are" | "seems" | "looks" | "remains" | "sounds" | "feels" | "becomes" => true,
            "be" => c > 0 && ["would", "will", "should", "'d"].contains(&w[c - 1].low.as_str()),
            _ => false,
        };
        if !copula {
            return false;
        }
        let mut at = c + 1;
        let mut article = false;
        while let Some(x) = w.get(at) {
            let word = x.low.as_str();
            let skip = [
                "the",
                "a",
                "an",
                "our",
                "my",
                "by",
                "far",
                "clearly",
                "definitely",
                "probably",
                "obviously",
                "really",
                "much",
                "still",
                "simply",
                "just",
                "also",
                "like",
                "here",
                "now",
                "then",
                "not",
                "to",
                "be",
            ];
            if !skip.contains(&word) {
                break;
            }
            article |= ["the", "a", "an", "our", "my"].contains(&word);
            at += 1;
        }
        let Some(adj) = w.get(at).map(|x| x.low.as_str()) else {
            return false;
        };
        let noun = |j: usize| {
            w.get(j)
                .is_some_and(|x| OPTION_NOUNS.contains(&x.low.as_str()))
        };
        let superlative = article && adj.len() >= 6 && adj.ends_with("est") && adj != "latest";
        SELECTING.contains(&adj)
            || (BEFORE_AN_OPTION.contains(&adj) && (noun(at + 1) || noun(at + 2)))
            || (superlative && noun(at + 1))
            || (article && VERDICT_NOUNS.contains(&adj))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::scan::{decision, decisions};

    #[test]
    fn an_option_winning_over_another_is_chosen_wherever_it_stands() {
        all_commit(&[
            "After the benchmark, I think `orjson` wins over `ujson` for our payloads.",
            "On balance redis_7 wins out over memcached here.",
            "In the end, `sqlite_wal` won over the Postgres sidecar.",
            "For the parser, the `nom` crate wins over hand-rolled code.",
        ]);
        none_commit(&["Does `orjson` win over `ujson` for small payloads?"]);
    }

    #[test]
    fn an_option_named_by_its_label_is_chosen_like_any_name() {
        for s in [
            "Option B wins: the queue worker owns retries.",
            "Plan C it is.",
            "We'll go with approach 2 for the importer.",
            "Variant A stays; the other one is dropped.",
        ] {
            assert_eq!(decision(s), Some(true), "{s}");
            assert_eq!(decisions(&format!("```\nx = 1\n```\n{s}")).len(), 1, "{s}");
        }
        none_commit(&[
            "Option B and option C both time out on the large file.",
            "Plan 2 failed the load test.",
            "Is option A any faster?",
        ]);
        assert!(names_something("Option B wins."));
        assert!(!names_something("Option by option, nothing wins."));
    }

    /// Each is a strong decision, found as one in a message's prose, after code too.
    fn all_commit(cases: &[&str]) {
        for s in cases {
            assert!(commits(s), "should commit: {s}");
            assert_eq!(decision(s), Some(true), "{s}");
            let after_code = format!("```rust\nlet x = 1;\n```\n{s}");
            assert_eq!(decisions(&after_code).len(), 1, "{after_code}");
        }
    }

    fn none_commit(cases: &[&str]) {
        for s in cases {
            assert!(!commits(s), "should not commit: {s}");
        }
    }

    #[test]
    fn a_sentence_that_opens_with_a_verb_of_choosing_commits() {
        all_commit(&[
            "Keeping `tower::limit` as the only throttle in the gateway.",
            "Dropping the hand-rolled LRU, moka covers it now.",
            "Replace `chrono` with the `time` crate across the workspace.",
            "Pinned pyarrow to 14.0.2 so the wheels stay compatible!",
            "Retiring the v1 endpoint after this release.",
            "OK, moving every feature flag into `flags.yaml`.",
        ]);
        // Exploring opens with its verb too, and so do log lines and gerunds as nouns.
        none_commit(&[
            "Looking at `parse_rows` in utils.py to see the loop.",
            "Running `pytest -k slow` again.",
            "Checking the value of `CACHE_DIR` first.",
            "Compiling serde v1.0.193",
            "Selecting previously unselected package libssl3.",
            "Logging is configured in `log_setup.py`.",
            "Missing `region` in the boto3 call.",
        ]);
    }

    #[test]
    fn the_agent_committing_in_any_tense_or_mood_commits() {
        all_commit(&[
            "I'm keeping the retry budget inside `HttpClient`.",
            "We moved session storage to `redis_sessions` last sprint.",
            "I'd put the rate limiter in front of `AuthService`.",
            "We won't touch `legacy_billing` in this change.",
            "I reverted `pool_size` to its previous value.",
            "From here we route every webhook through `EventBus`.",
            "I've swapped `requests` for `httpx` in the client.",
            "We pin `numpy_1_26` to make the wheels reproducible.",
        ]);
        none_commit(&[
            "I'll look at `config.py` next.",
            "Let me check `settings.toml` for the port.",
            "Now I'll run the tests in `tests/test_api.py`.",
            "I opened `models.py` and scrolled to the class.",
            "We searched the repo for `TODO_MARKER` and found two hits.",
            "I think `asyncio` is involved somewhere in `worker.py`.",
            "I had the logs from `run_3` open.",
            "I'm confident the bug is in `merge_ranges`.",
            "We could drop `six` once Python 2 support is gone.",
            "I fixed the typo in `README.md`.",
        ]);
    }

    #[test]
    fn a_plan_of_ours_or_a_verdict_label_commits() {
        all_commit(&[
            "Our fallback remains `sqlite3` when Postgres is unreachable.",
            "My recommendation here is `argon2id` for the password hashes.",
            "Our plan puts `ingest_worker` behind a queue.",
            "The call here is `serde_json::from_slice` for the hot path.",
            "Plan: `bincode` for the cache files, JSON for everything else.",
            "Verdict \u{2014} `httpx` for every outbound call.",
            "**Choice:** `pnpm` workspaces for the monorepo.",
            "Final call: ed25519 keys for every deploy host.",
        ]);
        none_commit(&[
            "My fix didn't work for `test_dates`.",
            "The path is `src/app/main.py`.",
            "The default is 30 seconds in `client.py`.",
            "Final Answer: the tallest building is Burj Khalifa.",
            "Line 42: `total` is never reset.",
            "Note: `retry_after` is in seconds.",
        ]);
    }

    #[test]
    fn an_option_taking_on_a_role_commits() {
        all_commit(&[
            "`deadpool_postgres` will own every database connection from here.",
            "The `Scheduler` actor should handle all retries.",
            "`tantivy` stays as the search index.",
            "gRPC wins for the internal calls between services.",
            "The `v3` parser goes in behind the flag.",
            "`celery_beat` needs to go once cron is wired up.",
        ]);
        none_commit(&[
            "`normalize()` replaces tabs with spaces.",
            "`self.count` stays 0 after the reset.",
            "`parse` goes through each line twice.",
            "`cleanup_job` is run by cron every night.",
            "The function returns `None` when the key is missing.",
            "`HttpClient` calls `send` twice per request.",
        ]);
    }

    #[test]
    fn an_option_chosen_in_the_passive_commits() {
        all_commit(&[
            "`ed25519` was picked for the signing keys.",
            "For the base image, `node:18-slim` is pinned.",
            "The old `nose` runner got ditched during the cleanup.",
            "Both `bcrypt` variants were rejected after the review.",
            "`pytest-xdist` has been shortlisted to split the suite.",
            "`ripgrep` is preferred for every search step in CI.",
        ]);
        none_commit(&[
            "The first row is selected by the query in `fetch_one`.",
            "`Option::None` is picked when the map has no entry.",
            "Which `tokio` feature was selected?",
            "I selected the lines 10-20 of `main.py` to view.",
        ]);
    }

    #[test]
    fn a_choice_set_for_the_rest_of_the_work_or_judged_first_commits() {
        all_commit(&[
            "`sccache` handles the compiler cache from here on.",
            "The staging cluster runs `k3s_v1.29` until further notice.",
            "Henceforth all money values travel as `Decimal` strings.",
            "From this point the `v1` import path is unsupported.",
            "Best to pin `numpy` at 1.26 for the CI image.",
            "Safer to keep `v1_auth` running beside the new service.",
            "Simpler to inline `to_snake()` than keep a helper module.",
            "Cleaner to let `Makefile` targets call `just` recipes.",
        ]);
        none_commit(&[
            "Best to check `dmesg` before anything else.",
            "We read the rows from here in `load_rows`.",
            "The `for` loop in `tally()` is good enough to read.",
        ]);
    }

    #[test]
    fn a_contrast_that_keeps_one_option_commits() {
        all_commit(&[
            "`blake3` over sha256 for the content hashes.",
            "Tokio's `mpsc`, not crossbeam, for the job queue.",
            "`ruff` in place of flake8 and isort for linting.",
            "`uuid7` as opposed to random v4 ids, for sortable keys.",
            "Plain `Vec<u8>` buffers, not `bytes::Bytes`, in the encoder.",
        ]);
        none_commit(&[
            "It failed in `load()`, not in `save()`.",
            "The loop iterates over `self.items` twice.",
            "Packets go over TCP to `collector:4317`.",
            "`tokio` over `async-std`?",
        ]);
    }

    #[test]
    fn an_evaluation_that_selects_commits() {
        all_commit(&[
            "`rustls` is the safest option for the TLS layer.",
            "SQLite looks like the simplest choice for a single node.",
            "A `BTreeMap` seems cleaner than the sorted vector here.",
            "`msgpack` is clearly the right format for the wire.",
            "`pgbouncer` is the culprit for the dropped connections.",
            "Moving the build to `bazel_7` is a go from my side.",
            "`Arc<Mutex<_>>` would be the obvious approach for shared state.",
        ]);
        none_commit(&[
            "`v2.3.1` is the latest tag in the registry.",
            "`main.rs` is the largest file in the crate.",
            "I'm not sure `uvloop` is the best option.",
            "Maybe `zstd` is the better codec.",
            "Is `redis` the right backend for this?",
            "`test_upload` is the only test that touches S3.",
        ]);
    }

    #[test]
    fn a_description_of_code_or_a_finding_commits_to_nothing() {
        none_commit(&[
            "`parse_rows` is defined in `io/reader.py`.",
            "This test fails because `tz` is naive.",
            "The error comes from line 88 of `views.py`.",
            "There are 14 call sites of `get_user` in the codebase.",
            "`Config.load` reads `APP_ENV` before anything else.",
            "We have three failing tests in `tests/unit`.",
        ]);
    }

    #[test]
    fn a_plan_said_of_a_part_of_the_work_commits() {
        all_commit(&[
            "Session tokens will be stored in `redis` with a 24h TTL.",
            "The ingest path will go through `kafka_bridge` from now on.",
            "Feature flags will live in `flags.yaml` next to the chart.",
            "Image resizing will rely on `sharp` rather than ImageMagick.",
            "The default log format will be `json`.",
            "Scheduled jobs are going to live in `apscheduler` inside the API process.",
            "There'll be one `Makefile` target per service.",
        ]);
        none_commit(&[
            "This will fail on `parse_date` if the input is empty.",
            "It will print `None` when the key is missing.",
            "The error will be raised by `load_config` before anything else.",
            "You will see `ECONNRESET` in the logs.",
            "The build will take a while on `ci-small`.",
        ]);
    }

    #[test]
    fn a_clause_of_its_own_does_not_weigh_a_step() {
        all_commit(&["Holding `openssl` at 3.0.13 until the FIPS module is certified."]);
        none_commit(&["Upgrading both `numpy` and `scipy` would cost a day of fixes."]);
    }

    #[test]
    fn a_value_set_told_in_the_passive_commits() {
        all_commit(&[
            "The train/test split is fixed at 80/20 with seed 7.",
            "The pool size is set to 16 for `prod`.",
            "Lint rules are standardised on `ruff` across the repos.",
        ]);
        none_commit(&["The flaky `test_login` is fixed at last."]);
    }

    #[test]
    fn a_part_of_the_work_planned_with_any_verb_commits() {
        all_commit(&[
            "Log lines will carry `request_id` from the gateway down.",
            "Thumbnails will come from `imgproxy`, not the app servers.",
            "Every service will expose `/healthz` on its admin port.",
            "Release notes will follow `keep-a-changelog` from the next tag.",
        ]);
        none_commit(&[
            "The queue will grow by 10% a day at this rate on `kafka-3`.",
            "The page will look broken on `Safari 15`.",
            "The migration will need `psql` on the path.",
            "The cache will probably speed up `GET /items` a lot.",
        ]);
    }

    #[test]
    fn the_option_taken_from_a_pair_named_again_commits() {
        all_commit(&[
            "Between `pnpm` and `yarn`, `pnpm`: the lockfile is smaller.",
            "Of `jest` and `vitest`, `vitest`, since the config already uses Vite.",
            "Between `zstd` or `lz4`, `lz4` for the hot path.",
        ]);
        none_commit(&[
            "Between `pnpm` and `yarn`, neither handles the workspace links.",
            "Of the two jobs, one timed out on `ci-large`.",
        ]);
    }

    #[test]
    fn a_choice_closed_by_saying_it_stands_commits() {
        all_commit(&[
            "Moving the retry logic into `net/retry.go` and leaving it there.",
            "The feature flags now live in `flags.yaml`, and that's where it'll stay.",
            "Pinning `tokio` at 1.38 and keeping it that way until the audit.",
            "The export uses `parquet` files, going ahead with that.",
            "The bucket naming is settled as `team-env-purpose`.",
        ]);
        none_commit(&["I left it there for a while and it still failed."]);
    }

    #[test]
    fn a_part_of_the_work_said_to_be_a_named_option_commits() {
        all_commit(&[
            "The branch for the rewrite is `feat/parser-v3`; every commit goes there.",
            "Our queue for the webhooks is `rabbitmq`, with one exchange per tenant.",
            "For the dashboards, the charting library is `plotly`.",
            "The image for the workers is `python:3.12-slim`.",
            "Overnight loads on that lane are assigned to `carrier_17`.",
            "The venue for the offsite is the Hotel Arts, two nights.",
            "Caching for the search API: the `edge-kv` store, 60 s per key.",
            "Courier for the Leeds orders: DPD Local, next-day before noon.",
        ]);
        none_commit(&[
            "The error for an empty input is `ValueError`.",
            "The output for `ls build/` is empty.",
            "Is the branch for this `main` or `develop`?",
            "Output for `make test`: 3 failures in `test_io`.",
            "Logs for the nightly job: `/var/log/etl.log`.",
        ]);
    }

    #[test]
    fn a_slot_of_the_work_said_to_be_a_named_option_is_set_up() {
        all_commit(&[
            "The cache backend is `memcached` with a 64 MB slab.",
            "Our font for the slides will be Inter at two weights.",
            "The retry policy is now capped backoff with 5 tries and jitter.",
            "The event broker for billing is NATS JetStream.",
        ]);
        none_commit(&[
            "The current format is CSV with a header row.",
            "The error for this input is `KeyError` from the lookup.",
            "The database is 14 GB after last night's import.",
            "The queue is empty again after the restart of `worker-2`.",
        ]);
    }

    #[test]
    fn a_named_option_said_to_be_a_slot_of_the_work_is_set_up() {
        all_commit(&[
            "`ruff` is the linter and formatter for the whole repo.",
            "The 7:40 train from Basel is our route to the workshop.",
            "The blue Lenovo at 640 EUR is the one we're ordering for Mia.",
            "A single `events_v2` topic per region is the layout we keep.",
        ]);
        none_commit(&[
            "`parse_row` is the function that raises on empty lines.",
            "Those are the settings `pytest` printed for the run.",
            "`KeyError` is the error the job logs on every retry.",
            "`app.log` is the file the test writes to.",
        ]);
    }

    #[test]
    fn a_part_of_the_work_said_to_be_changed_now_is_set_up() {
        all_commit(&[
            "Invoices now go out through Postmark instead of the SMTP relay.",
            "The nightly export is now `export_v2.py` on the shared runner.",
            "Lint checks no longer run on `tests/`, only on `src/`.",
            "The staging cluster now pulls images from `ghcr.io/acme` only.",
        ]);
        none_commit(&[
            "The test now passes on `main` after the rebase.",
            "It now prints `None` for the empty case.",
            "Memory use is now 3.2 GB on the `m5.large` box.",
            "The build now fails on `parse_args` with a type error.",
        ]);
    }

    #[test]
    fn an_option_said_to_hold_for_what_is_still_to_come_is_set_up() {
        all_commit(&[
            "`isort` runs on every commit going forward, before the tests.",
            "Prices are quoted in EUR throughout, with VAT included.",
            "Each new service gets a `Dockerfile` from the shared template.",
            "Dropout stays at 0.1 for all remaining sweeps on the small model.",
        ]);
        none_commit(&[
            "The warning shows up throughout `build.log`, mostly from `vendor/`.",
            "Timeouts appear across the board on `eu-west-1` since noon.",
            "It fails for every new user created through `signup_v1`.",
        ]);
    }

    #[test]
    fn a_part_that_gets_done_with_a_named_option_is_set_up() {
        all_commit(&[
            "Thumbnails get generated with `libvips` in the upload worker.",
            "Session data gets kept in Redis under the `sess:` prefix.",
            "Receipts get stored as PDF in the `receipts-2024` bucket.",
            "The seating chart gets built in Figma from the guest list.",
        ]);
        none_commit(&[
            "The row gets deleted when `purge_old` runs at midnight.",
            "The error gets printed to `stderr` twice on failure.",
            "The file gets written by `save_state` on every tick.",
        ]);
    }

    #[test]
    fn a_topic_label_ending_in_a_slot_names_its_option() {
        all_commit(&[
            "Storage layout: one bucket per tenant, with `tenant_id` as the prefix.",
            "Payment handling for the shop: Stripe Checkout, hosted page.",
            "Dependency management: Poetry with a committed `poetry.lock`.",
            "Venue for the offsite: the Hotel Adler in Zurich, two nights.",
        ]);
        none_commit(&[
            "Error: cannot find module `left-pad` in `node_modules`.",
            "Note: `make test` needs Docker running first.",
        ]);
    }

    #[test]
    fn an_option_made_or_set_into_a_slot_of_the_work_is_chosen() {
        all_commit(&[
            "I've made Caddy our reverse proxy in front of both apps.",
            "We set `eu-west-1` as the region for every new bucket.",
            "Making `pnpm` the package manager for the monorepo.",
            "I went ahead and made Lufthansa the airline for both legs.",
        ]);
        none_commit(&[
            "I made the test pass by fixing `parse_date`.",
            "Setting a breakpoint in `handler.rs` to see the value.",
        ]);
    }

    #[test]
    fn a_named_option_that_wins_or_goes_ahead_in_its_clause_is_chosen() {
        all_commit(&[
            "Of the two drafts, the Nordic layout wins for the brochure.",
            "After the load test, the `v3` schema rewrite goes ahead next sprint.",
            "The `legacy-auth` service stays until the SSO cutover.",
            "Between the quotes, the Acme Freight offer wins on transit time.",
        ]);
        none_commit(&[
            "The `count` stays 0 after the first batch.",
            "The request goes through `auth_middleware` before the router.",
        ]);
    }

    #[test]
    fn a_verb_is_told_from_a_noun_of_its_letters() {
        assert!(inflects("shows", "show"));
        assert!(inflects("raised", "raise"));
        assert!(inflects("raising", "raise"));
        assert!(inflects("lost", "lose"));
        assert!(!inflects("loss", "lose"));
        assert!(!inflects("showcase", "show"));
    }

    proptest::proptest! {
        /// Any run of the words the readings count positions by (openers, copulas, "no
        /// longer", slots, verdicts), with marks and names among them: no reading panics.
        #[test]
        fn any_words_are_read_without_a_panic(
            words in proptest::collection::vec(
                r"(OK|OK now|now|now,|no longer|no|longer|is|are|will|be|the|our|this|made|set|as|gets|built|with|wins|stays|goes|ahead|throughout|each|new|format|layout:|one|I'm|`x_1`|Redis|for|,|:|;|-|3)",
                0..14,
            ),
        ) {
            let s = words.join(" ");
            let _ = commits(&s);
            // Each reading alone too, past the cheap tests `commits` asks first.
            let _ = set_up(&super::words(&s));
        }
    }
}
