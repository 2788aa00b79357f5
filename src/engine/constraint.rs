//! Whether a sentence of the user's sets a constraint: forbids, requires or bounds
//! something. Recognised by the shape of what is said rather than by a few words, since
//! users phrase a rule in many ways ("leave X alone", "X is off-limits", "at most 3
//! retries"). One pass of a phrase automaton finds the markers; each marker's rule then
//! looks only at the words right around it, so the digest can ask this of every sentence
//! without allocating.

use std::sync::LazyLock;

use super::phrases::Phrases;
use super::verbs;

/// What a marker needs around it to set a constraint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rule {
    /// A constraint wherever it stands: "must", "off-limits", "under no circumstances".
    Always,
    /// "never": not in a report of what happened ("I never saw it fail").
    Never,
    /// "don't", "do not": a prohibition when it governs a change verb or stands as a
    /// command, or forbids so much as thinking of a change ("don't even think about
    /// touching it"); not "I don't know".
    Negation,
    /// "without", "not to", "won't", "nobody": a prohibition only before a change
    /// ("without asking", "nobody edits"); "it ran without errors" sets nothing.
    Without,
    /// "not" before a change ("we are not touching the API"), unless it reports what was
    /// done ("it was not modified").
    Not,
    /// "can't", "cannot", "may not": a prohibition on the listener or on a change ("you
    /// can't use the network", "we cannot rename it", "we can't afford to break it"), or
    /// a bound ("the queue can't grow past 5,000"); not "I can't reproduce it".
    Cannot,
    /// "has to", "need to": a requirement, unless the speaker says what they must do.
    Requirement,
    /// "within", "under", "up to": a bound when a quantity follows.
    Bound,
    /// "limit", "quota", "at most": a bound when a quantity is next to it ("a 5 GB
    /// quota", "3 retries at most").
    Limit,
    /// "only": a restriction, unless it reports a count ("only one test failed").
    Only,
    /// "no more" closing its clause: a bound on what came before ("30 a minute, no
    /// more").
    Closing,
    /// "keep" (or "hold") to a quantity: "keep the batch to 500 rows"; or "keep" opening
    /// a command with what it keeps and how: "keep all timestamps in UTC", "keep the
    /// README short", "keep it short" (not "keep going", "keep me posted", "keep it up").
    Keep,
    /// "nothing" that may change: "nothing under infra/ should be edited".
    Nothing,
    /// "alone": a prohibition after "leave" ("leave the schema alone").
    Alone,
    /// "frozen", "locked": a rule when said of the thing ("the API is frozen").
    State,
    /// "no": a prohibition before a kind of change ("no new dependencies").
    No,
    /// "needs", "requires", "wait for": a change gated on someone's word when their
    /// review, approval or go-ahead follows within a few words ("needs legal review",
    /// "wait for security to approve it").
    Gate,
    /// "ask", "check with", "consult": a change gated on asking someone, when "before" a
    /// change follows ("ask before changing it", "check with Ops before you deploy").
    Consult,
    /// "be", "in place", "in peace" after "leave": "leave it be", "leave the header in
    /// place".
    Leave,
    /// "stop", "quit": a prohibition when a change follows ("stop editing the lockfile by
    /// hand").
    Stop,
    /// "before" a change, in a sentence that asks for someone's word on it: "before you
    /// touch `payments/`, get Olga to approve it", "before deleting any branch, check with
    /// me".
    Before,
    /// "stays", "remains" of a thing, then where it must stay: "Django stays on 4.2",
    /// "the cron schedule stays at 02:00 UTC"; not a report ("it stays in memory").
    Stays,
    /// "should" with a bound after it: "uploads should be refused over 25 MB".
    Should,
    /// "use", "prefer" opening a command: "Use `pnpm` in this repo", "prefer `httpx`".
    Use,
    /// "whenever", "every time" with a command after the clause it opens: "whenever you
    /// produce a forecast, show the 80% interval".
    Habit,
    /// "is to", "are to" with a step after it: "SSH access is to go through the bastion",
    /// "all changes are to be reviewed"; not a goal or a plan told ("the goal is to ship").
    Duty,
    /// "overwritten", "reverted", "wiped": a warning that changes will not last ("any
    /// manual edit will be reverted", "generated files get overwritten on every build"),
    /// not a report of what happened ("my edits were reverted").
    Lost,
}

/// Markers that set a constraint by themselves.
const ALWAYS: &[&str] = &[
    "must",
    "mustn't",
    "must not",
    "forbidden",
    "prohibited",
    "banned",
    "not permitted",
    "not allowed",
    "off-limits",
    "off limits",
    "out of bounds",
    "hands off",
    "hands-off",
    "stay away",
    "keep away from",
    "keep clear of",
    "stay clear of",
    "steer clear of",
    "stay out of",
    "keep out",
    "under no circumstances",
    "under no condition",
    "under any circumstances",
    "on no account",
    "in no event",
    "by no means",
    "in no case",
    "refrain",
    "avoid",
    "unchanged",
    "untouched",
    "intact",
    "read-only",
    "read only",
    "readonly",
    "untouchable",
    "as is",
    "as it is",
    "as they are",
    "not to be",
    "never to be",
    "should not",
    "shouldn't",
    "should remain",
    "should stay",
    "make sure",
    "be sure to",
    "ensure",
    "stick to",
    "required",
    "always",
    "important",
    "no more than",
    "no fewer than",
    "no less than",
    "not more than",
    "not exceed",
    "not to exceed",
    "capped at",
    "limited to",
    "mandatory",
    "non-negotiable",
    "no exceptions",
    "at all times",
    "unmodified",
    "unaltered",
    "sacred",
    "rather not",
    "rather you didn't",
    "prefer not to",
    "prefer you not",
    "limit yourself",
    "restrict yourself",
    "confine yourself",
    "keep your changes",
    "limit your changes",
    "remember to",
    "essential",
    "crucial",
    "requirement",
    "no longer than",
    "no larger than",
    "no bigger than",
    "no higher than",
    "no later than",
    "not ours to",
    "not yours to",
    "not mine to",
    "not for you to",
    "not for us to",
    "as it stands",
    "as they stand",
    "the way it is",
    "the way they are",
    "byte-for-byte",
    "byte for byte",
    "out of scope",
    "out of the diff",
    "no-go",
    "off the table",
    "shall not",
    "unacceptable",
    "not acceptable",
    "not an option",
    "not our call",
    "not your call",
    "isn't our call",
    "not our job",
    "not your job",
    "not our place",
    "not something to",
    "absolutely no",
    "strictly no",
    "without fail",
    // A change gated on someone's approval: "needs sign-off from the DBA", "changes to
    // the chart require approval from the SRE on call".
    "sign-off",
    "signoff",
    "signs off",
    "approval from",
    "requires approval",
    "require approval",
    "needs approval",
    "need approval",
    "requires review",
    "require review",
    "needs review",
    // Said to stress that what follows holds: "whatever you do, keep the bucket private".
    "whatever you do",
    "whatever else you do",
    "no matter what",
    "at all costs",
    "at any cost",
    // Said to set what holds from here on: "from now on, every endpoint needs a test".
    "from now on",
    "going forward",
    "moving forward",
    // A thing that is another's to change: "the Android code is someone else's problem".
    "someone else's",
    "somebody else's",
    // A rule named as one: "we have a standing policy that ...", "the rule is ...".
    "standing policy",
    "policy is to",
    "policy is that",
    "the rule is",
    "house rule",
    "ground rule",
    "hard rule",
    "standing instruction",
    "standing order",
    "as a rule",
    // What forbids, as a verb: "our agreement forbids joining ...", "the travel policy
    // blacklists them".
    "forbids",
    "prohibits",
    "bans",
    "disallows",
    "blacklists",
    "blacklisted",
    // Who or what alone: "writes go to staging and nowhere else".
    "and nowhere else",
    "and nobody else",
    "and no one else",
    "and nothing else",
    // A step tied to every occurrence of another: "run the linter before every commit".
    "before every",
    "before each",
    // For as long as the work goes on: "log every call, for the whole session".
    "for the whole session",
    "for the rest of the session",
    "throughout the session",
];

const NEVER: &[&str] = &["never"];
const NEGATION: &[&str] = &["don't", "do not", "dont"];
const WITHOUT: &[&str] = &["without", "not to", "won't", "nobody", "no one", "no-one"];
const NOT: &[&str] = &["not"];
const CANNOT: &[&str] = &["can't", "cannot", "can not", "may not"];
const REQUIREMENT: &[&str] = &[
    "has to",
    "have to",
    "need to",
    "needs to",
    "got to",
    "gotta",
    "supposed to",
    "not supposed to",
    "isn't supposed to",
    "aren't supposed to",
];
const STOP: &[&str] = &["stop", "quit", "cease", "hold off on", "hold off"];
const BEFORE: &[&str] = &["before"];
const STAYS: &[&str] = &["stays", "remains", "stay", "remain"];
const SHOULD: &[&str] = &["should"];
const USE: &[&str] = &["use", "prefer"];
const DUTY: &[&str] = &["is to", "are to"];
const HABIT: &[&str] = &["whenever", "every time", "each time", "any time", "anytime"];
const BOUND: &[&str] = &[
    "up to",
    "within",
    "under",
    "below",
    "less than",
    "fewer than",
];
const LIMIT: &[&str] = &[
    "at most",
    "at least",
    "at the most",
    "tops",
    "allows",
    "allowed",
    "permits",
    "throttled",
    "throttles",
    "throttle",
    "or less",
    "or fewer",
    "or lower",
    "limit",
    "limits",
    "cap",
    "budget",
    "quota",
    "ceiling",
    "maximum",
    "max",
    "allowance",
    "deadline",
];
const ONLY: &[&str] = &["only"];
const CLOSING: &[&str] = &[
    "no more",
    "no less",
    "no fewer",
    "no higher",
    "not more",
    "not higher",
    "not above",
    "not beyond",
    "not one more",
];
const KEEP: &[&str] = &["keep", "hold"];
const NOTHING: &[&str] = &["nothing"];
const ALONE: &[&str] = &["alone"];
const STATE: &[&str] = &["frozen", "locked", "immutable"];
const NO: &[&str] = &["no"];
const GATE: &[&str] = &[
    "need",
    "needs",
    "require",
    "requires",
    "go through",
    "goes through",
    "wait for",
    "wait until",
    "pending",
];

const CONSULT: &[&str] = &[
    "ask",
    "run it past",
    "run that past",
    "escalate it to",
    "tell",
    "notify",
    "inform",
    "check with",
    "consult",
    "talk to",
    "speak to",
    "speak with",
    "run it by",
    "clear it with",
    "coordinate with",
    "ping",
    "loop in",
];
const LEAVE: &[&str] = &[
    "be",
    "in place",
    "in peace",
    // "Leave the flag set to false", "leave the job switched off".
    "set to",
    "set at",
    "turned off",
    "turned on",
    "switched off",
    "switched on",
    "disabled",
    "enabled",
    "pinned",
    "where it is",
    "where they are",
];
const LOST: &[&str] = &[
    "overwritten",
    "reverted",
    "clobbered",
    "wiped",
    "discarded",
    "thrown away",
    "regenerated",
    "undone",
];

/// Words right before a warning's verb that say it will happen, or always does: "will be
/// reverted", "get overwritten", "is regenerated"; not "was" or "got", which report.
const LOST_AUXILIARIES: &[&str] = &["be", "get", "gets", "is", "are"];

/// Words before a warning that say what will not last: a change, or a file that a tool
/// writes ("the generated client is regenerated on every build").
const LOST_SUBJECTS: &[&str] = &["manual", "hand", "generated", "autogenerated"];

/// What someone gives before a change may go ahead: their review, approval, sign-off.
const GATE_WORDS: &[&str] = &[
    "review",
    "approval",
    "approve",
    "approves",
    "sign-off",
    "signoff",
    "thumbs-up",
    "go-ahead",
    "blessing",
    "okay",
    "ok",
    "green-light",
    "greenlight",
];

const RULES: &[(Rule, &[&str])] = &[
    (Rule::Always, ALWAYS),
    (Rule::Never, NEVER),
    (Rule::Negation, NEGATION),
    (Rule::Without, WITHOUT),
    (Rule::Not, NOT),
    (Rule::Cannot, CANNOT),
    (Rule::Requirement, REQUIREMENT),
    (Rule::Bound, BOUND),
    (Rule::Limit, LIMIT),
    (Rule::Only, ONLY),
    (Rule::Closing, CLOSING),
    (Rule::Keep, KEEP),
    (Rule::Nothing, NOTHING),
    (Rule::Alone, ALONE),
    (Rule::State, STATE),
    (Rule::No, NO),
    (Rule::Gate, GATE),
    (Rule::Consult, CONSULT),
    (Rule::Leave, LEAVE),
    (Rule::Lost, LOST),
    (Rule::Stop, STOP),
    (Rule::Before, BEFORE),
    (Rule::Stays, STAYS),
    (Rule::Should, SHOULD),
    (Rule::Use, USE),
    (Rule::Duty, DUTY),
    (Rule::Habit, HABIT),
];

/// Verbs of changing something (and of using what is forbidden): what a prohibition
/// governs. Matched with their endings ("touching", "renamed").
const CHANGE_VERBS: &[&str] = &[
    "touch",
    "modify",
    "change",
    "edit",
    "alter",
    "rename",
    "delete",
    "remove",
    "move",
    "overwrite",
    "rewrite",
    "replace",
    "push",
    "force-push",
    "commit",
    "merge",
    "deploy",
    "restart",
    "reboot",
    "drop",
    "truncate",
    "upgrade",
    "downgrade",
    "bump",
    "add",
    "install",
    "introduce",
    "use",
    "disable",
    "skip",
    "reformat",
    "refactor",
    "call",
    "hit",
    "exceed",
    "break",
    "mock",
    "publish",
    "release",
    "tamper",
    "mess",
    "regenerate",
    "update",
    "patch",
    "reset",
    "revert",
    "amend",
    "expose",
    "leak",
    "ask",
    "asking",
    "approval",
    "permission",
    "consent",
    "review",
];

/// Verbs after a negation or "only" that report or feel rather than rule: "I don't
/// know", "it only happens on CI".
const REPORT_VERBS: &[&str] = &[
    "know",
    "see",
    "understand",
    "think",
    "get",
    "remember",
    "believe",
    "recall",
    "worry",
    "hesitate",
    "mind",
    "care",
    "seem",
    "appear",
    "matter",
    "exist",
    "reproduce",
    "find",
    "notice",
    "agree",
    "happen",
    "fail",
    "work",
    "pass",
    "show",
    "occur",
    "sure",
];

/// Subjects of a report: after them a negation says what is, not what must be.
const REPORT_SUBJECTS: &[&str] = &[
    "i", "it", "they", "that", "this", "he", "she", "which", "who", "there", "tests", "these",
    "those",
];

/// Words before "not" that make it a report of what was done.
const REPORT_AUXILIARIES: &[&str] = &[
    "was", "were", "did", "does", "has", "have", "had", "wasn't", "it", "i",
];

/// Verbs after "I don't" that still state a rule: "I don't want new dependencies".
const WISH_VERBS: &[&str] = &["want", "allow", "permit", "accept", "like"];

/// Words before "never" that make it a report of the past or of a fact.
const NEVER_REPORTS: &[&str] = &[
    "i", "it", "has", "have", "had", "was", "were", "is", "are", "they", "that", "this",
];

/// Words before "only" that make it no restriction ("the only file", "not only").
const ONLY_NOT_RULES: &[&str] = &[
    "the", "not", "if", "my", "our", "its", "his", "her", "their", "an",
];

/// Words before "only" + a count that make it a report ("there are only 3 left").
const COUNT_REPORTS: &[&str] = &[
    "", "there", "is", "are", "was", "were", "had", "has", "have", "it", "and", "but", "i", "we",
    "they", "that", "which", "so",
];

/// Quantities written as words.
const NUMBER_WORDS: &[&str] = &[
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "twenty", "fifty", "hundred", "thousand", "once", "twice", "a few", "half",
];

/// Words before "frozen" or "locked" that say it of the thing, as a rule.
const STATE_VERBS: &[&str] = &[
    "is",
    "are",
    "stays",
    "stay",
    "remains",
    "remain",
    "be",
    "as",
    "considered",
    "keep",
];

/// Kinds of change after "no" that make it a prohibition ("no new dependencies").
const NO_CHANGES: &[&str] = &[
    "changes",
    "change",
    "edits",
    "modifications",
    "new",
    "touching",
    "commits",
    "pushes",
    "deploys",
    "deployments",
    "writes",
    "network",
    "internet",
    "external",
    "third-party",
    "additional",
    "extra",
    "dependencies",
    "migrations",
    "breaking",
    "force-push",
    "force-pushes",
    "patches",
    "merges",
    "renames",
    "rewrites",
    "upgrades",
    "upgrade",
    "downgrade",
    "downgrades",
    "migration",
    "rename",
    "rewrite",
    "bump",
    "bumps",
];

/// Words between "no" and a change that say which ones ("no direct commits"); "no
/// obvious changes" reports.
const NO_KINDS: &[&str] = &[
    "direct",
    "manual",
    "hand",
    "hand-written",
    "handwritten",
    "local",
    "further",
    "unrelated",
    "unreviewed",
    "unnecessary",
    "drive-by",
    "cosmetic",
    "stray",
    "speculative",
    "more",
    "other",
    "big",
    "large",
];

/// Words after "no <change>" that report rather than forbid ("no changes were made").
const NO_REPORTS: &[&str] = &[
    "were", "was", "is", "are", "have", "has", "had", "found", "detected", "made", "needed",
];

/// Whether `text` sets a constraint. Questions set none, unless they are requests ("Can
/// you make sure it stays unchanged?").
pub fn is_constraint(text: &str) -> bool {
    // A marker stands alone when no letter, digit or `_` touches it: "max_tokens" is a
    // name, not a limit.
    let whole =
        |at: usize, end: usize| !word_byte_at(text, at.wrapping_sub(1)) && !word_byte_at(text, end);
    MARKERS.any(text, whole, |list, at, end| {
        holds(RULES[list].0, text, at, end) && !in_question(text, at)
    })
}

/// Every rule's markers, found in one pass, ASCII case ignored and a typographic
/// apostrophe read as a straight one; a find's list is its rule's place in [`RULES`].
static MARKERS: LazyLock<Phrases> = LazyLock::new(|| {
    let lists: Vec<&[&str]> = RULES.iter().map(|(_, phrases)| *phrases).collect();
    Phrases::new(&lists)
});

/// Whether the byte at `i` continues a word (a letter, digit or `_`: "max_tokens" is a
/// name, not a limit; a missing byte does not).
fn word_byte_at(text: &str, i: usize) -> bool {
    text.as_bytes()
        .get(i)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// How far each side of a marker its rule looks, in bytes: a rule reads the words right
/// around it, and a bound keeps a long line without spaces (minified JSON, a base64
/// blob) linear however many markers it holds.
const AROUND: usize = 120;

/// Whether the marker at `at..end` sets a constraint by its rule.
fn holds(rule: Rule, text: &str, at: usize, end: usize) -> bool {
    if rule == Rule::Always {
        return !inferred(&text[at..end], window_after(text, end));
    }
    let ahead = window_after(text, end);
    let behind = window_before(text, at);
    let before = prev_word(behind);
    let (after, after_end) = next_word(ahead);
    match rule {
        Rule::Always => true,
        // "It never loaded": a verb in the past after it reports.
        // "It should never have shipped": what ought to have been, told after.
        Rule::Never => {
            !is_one_of(before, NEVER_REPORTS)
                && !is_past(after)
                && !is_one_of(after, &["have", "has"])
        }
        Rule::Negation => negation(before, after) || thinks_of_a_change(after, &ahead[after_end..]),
        // "Nobody but the release manager touches it": who alone may change it.
        Rule::Without => {
            is_change(after)
                || (same(after, "be") && is_change(next_word(&ahead[after_end..]).0))
                || (is_one_of(after, EXCEPT) && change_within(&ahead[after_end..], 6))
                || gate_within(ahead, 2)
        }
        Rule::Not => is_change(after) && !is_one_of(before, REPORT_AUXILIARIES),
        Rule::Cannot => cannot(before, after, &ahead[after_end..], ahead),
        // "The bot is not supposed to quote prices" forbids; "I'm not supposed to be on
        // call" is the speaker's own lot.
        Rule::Requirement => {
            let marker = &text[at..end];
            let forbids = marker.ends_with("supposed to") && !marker.starts_with("supposed");
            !is_one_of(before, &["i", "i'm"]) && (forbids || !released(behind))
        }
        Rule::Bound => !measured(before) && quantity_within(ahead, 3),
        // "Cap the eval job's spend at $20 a day": a command's limit may close its clause.
        // "The deadline for the API freeze is March 3": a deadline's date may end its
        // clause.
        Rule::Limit => {
            let reach = if same(&text[at..end], "deadline") || commands(before) {
                12
            } else {
                6
            };
            // "The deadline slipped", "the budget ran out": what became of it, reported.
            let reported = is_past(after);
            !measured(before)
                && !reported
                && (quantity_within(ahead, reach) || quantity_before(behind))
        }
        Rule::Only => only(before, after, behind),
        Rule::Closing => after.is_empty(),
        Rule::Keep => {
            quantity_within(ahead, 4)
                || (same(&text[at..end], "keep") && commands(before) && keeps_a_state(ahead))
        }
        // "Nothing should run as root", "nothing touches prod without a ticket".
        // "Nothing departing after 10pm", "nothing over $200": a bound on what may be.
        Rule::Nothing => {
            quantity_within(ahead, 4)
                || modal_change_within(ahead, 6)
                || is_one_of(after, &["should", "may", "shall", "must", "gets"])
                || (is_change(after) && !is_past(after))
        }
        // "Leave it alone"; "they alone edit it", "ops alone may deploy".
        Rule::Alone => {
            // Not what one did alone ("she alone fixed the build").
            leave_before(behind)
                || (is_change(after) && !after.ends_with("ed"))
                || (is_one_of(after, MODALS) && is_change(next_word(&ahead[after_end..]).0))
        }
        Rule::State => is_one_of(before, STATE_VERBS),
        Rule::No => {
            // One word may say which changes: "no direct commits to main", "no manual
            // edits".
            let mut rest = &ahead[after_end..];
            let mut noun = after;
            if is_one_of(after, NO_KINDS) {
                let (then, then_end) = next_word(rest);
                (noun, rest) = (then, &rest[then_end..]);
            }
            // "No entries without an invoice number": what may not be done without.
            let without = clause_ahead(ahead)
                .split_whitespace()
                .take(4)
                .any(|w| same(w, "without"));
            (is_one_of(noun, NO_CHANGES) || without) && !is_one_of(next_word(rest).0, NO_REPORTS)
        }
        // "It needs legal review", not "I need a review of this" (the speaker's own ask).
        Rule::Gate => {
            !same(before, "i")
                && (gate_within(ahead, 4)
                    || routed(&text[at..end], behind)
                    || (text[at..end].starts_with("need") && quantified(behind)))
        }
        // "Ask before changing it", not "I asked before running it".
        // "Whenever you change the limiter, ping Lena first".
        Rule::Consult => {
            !same(before, "i")
                && !same(before, "we")
                && (change_after_before(ahead) || consulted_first(behind, ahead))
        }
        // "Leave it be" ends its clause there; "leave it be changed" is no rule.
        Rule::Leave => {
            leave_before(behind) && (!same(&text[at..end], "be") || next_word(ahead).0.is_empty())
        }
        Rule::Lost => is_one_of(before, LOST_AUXILIARIES) && lost_change_before(behind),
        // "Stop rewriting the migrations", "hold off on touching the flags".
        Rule::Stop => {
            (commands(before) || is_one_of(before, &["you", "please"])) && is_change(after)
        }
        // "Whenever a ticket mentions a chargeback, escalate it": a step asked for each
        // time something happens, its command after the comma.
        Rule::Habit => habit(ahead),
        Rule::Before => change_asked_before(behind, ahead),
        Rule::Stays => stays_put(before, after, &ahead[after_end..]),
        Rule::Should => should_bound(before, ahead) || quantified(behind),
        Rule::Use => use_command(before, after, ahead),
        Rule::Duty => !is_one_of(before, INTENTS) && !is_one_of(after, &["say", "blame", "come"]),
    }
}

/// "must have" and a participle infers what happened ("clients must have hit the old
/// endpoint"), "shouldn't have" and one regrets it; "must have a ticket" still
/// requires.
fn inferred(marker: &str, ahead: &str) -> bool {
    let (have, end) = next_word(ahead);
    // "We shouldn't have promised that": a regret, told after.
    let modal = is_one_of(marker, &["must", "should not", "shouldn't"]);
    if !modal || !same(have, "have") {
        return false;
    }
    let done = next_word(&ahead[end..]).0;
    is_past(done) || verbs::is_participle(done)
}

/// "can't" or "cannot" (`rest` what follows its next word, `after`): said to the
/// listener ("you can't use the network"), of a change ("we cannot rename it", "it
/// can't be modified", "we can't have anyone editing it", "we can't afford to break
/// it") or of a bound ("disk usage can't go past 20 GB"); not "I can't reproduce it".
fn cannot(before: &str, after: &str, rest: &str, ahead: &str) -> bool {
    let passive = same(after, "be") && is_change(next_word(rest).0);
    let anyone =
        same(after, "have") && is_one_of(next_word(rest).0, ANYONE) && change_within(rest, 3);
    let afford = same(after, "afford") && change_within(rest, 2);
    let bound = !is_one_of(before, REPORT_SUBJECTS) && quantity_within(ahead, 4);
    (same(before, "you") && !is_verb_of(after, REPORT_VERBS))
        || is_change(after)
        || bound
        || passive
        || anyone
        || afford
}

/// "before" a change ("before you touch", "before dropping") in a sentence that asks for
/// someone's word on it.
fn change_asked_before(behind: &str, ahead: &str) -> bool {
    let (who, who_end) = next_word(ahead);
    let change = is_change(who)
        || (is_one_of(who, ANYONE) || is_one_of(who, &["we", "i"]))
            && change_within(&ahead[who_end..], 2);
    change && asks_for_a_word(sentence_around(behind, ahead))
}

/// "stays" or "remains" said of a thing (`before` its last word, `rest` what follows
/// `after`): "on" or "at" a version or a time ("stays on 4.2", "remains at 02:00 UTC"),
/// not a name ("stays on `rayon_pool`": a choice, not a rule), or in a state it must keep.
fn stays_put(before: &str, after: &str, rest: &str) -> bool {
    let pinned = is_one_of(after, &["on", "at"]) && quantity_within(rest, 1);
    !before.is_empty()
        && !is_one_of(before, REPORT_SUBJECTS)
        && (pinned || is_one_of(after, STAY_PLACES))
}

/// "should" with a bound after it, not any number: "uploads should stay under 25 MB",
/// not "the page should show 2 decimals".
fn should_bound(before: &str, ahead: &str) -> bool {
    let clause = clause_ahead(ahead);
    !is_one_of(before, REPORT_SUBJECTS)
        && !same(before, "i")
        && super::quantity::amount(clause) == Some(super::quantity::Amount::Limit)
}

/// "use" or "prefer" opening a command: "Use `pnpm` in this repo"; not a tool's hint of
/// what to use for what ("Use `--force` to override", "use the arrow keys to scroll"),
/// which a command's output says as often as a person.
fn use_command(before: &str, after: &str, ahead: &str) -> bool {
    let clause = clause_ahead(ahead);
    let purpose = clause.split_whitespace().any(|w| same(w, "to"));
    commands(before) && !clause.trim().is_empty() && !purpose && !is_one_of(after, USE_NOT_COMMANDS)
}

/// Whether the clause a "whenever" opens (`ahead`) is followed, after its comma, by a
/// command: a word that is no subject of a statement ("whenever it rains, the job
/// fails" reports; "every time I run it, it crashes" too).
fn habit(ahead: &str) -> bool {
    let [_, sentence] = sentence_around("", ahead);
    let Some((_, then)) = sentence.split_once(", ") else {
        return false;
    };
    let first = then
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '\'');
    !first.is_empty()
        && first.starts_with(|c: char| c.is_ascii_lowercase())
        && !is_one_of(first, STATEMENT_OPENINGS)
        && !is_past(first)
        && !first.ends_with('s')
}

/// Words that open a statement rather than a command after a clause.
const STATEMENT_OPENINGS: &[&str] = &[
    "it",
    "i",
    "we",
    "they",
    "he",
    "she",
    "you",
    "the",
    "a",
    "an",
    "this",
    "that",
    "there",
    "our",
    "my",
    "its",
    "their",
    "his",
    "her",
    "your",
    "these",
    "those",
    "something",
    "nothing",
    "everything",
    "all",
    "some",
    "no",
    "which",
    "what",
    "then",
];

/// Whether the clause before a "should" or a "needs" opens with a quantifier over its
/// subject: "every query against `events` should have a date filter", "all new
/// endpoints need an OpenAPI entry": a requirement on each of them.
fn quantified(behind: &str) -> bool {
    let clause = behind
        .rsplit(['.', '!', '?', ';', ',', ':', '\n'])
        .next()
        .unwrap_or(behind);
    let first = clause.split_whitespace().next().unwrap_or("");
    is_one_of(first, &["every", "each", "all", "any"]) && clause.split_whitespace().count() <= 8
}

/// Subjects of "is to" that tell a goal, a plan or a way rather than set a duty: "the
/// goal is to ship", "the fix is to pin it", "this is to confirm".
const INTENTS: &[&str] = &[
    "goal",
    "plan",
    "idea",
    "aim",
    "point",
    "purpose",
    "task",
    "job",
    "step",
    "option",
    "fix",
    "trick",
    "answer",
    "solution",
    "way",
    "thing",
    "hope",
    "intention",
    "objective",
    "target",
    "priority",
    "next",
    "best",
    "easiest",
    "simplest",
    "only",
    "what",
    "all",
    "problem",
    "question",
    "reason",
    "default",
    "workaround",
    "approach",
    "strategy",
    "mission",
    "role",
    "alternative",
    "that",
    "this",
    "it",
    "there",
    "which",
    "who",
    "one",
    "first",
    "dream",
    "wish",
    "challenge",
    "key",
];

/// What `ahead` holds of the clause it starts: up to a sentence's end or a `;`.
fn clause_ahead(ahead: &str) -> &str {
    ahead.split(['.', '!', '?', ';', '\n']).next().unwrap_or("")
}

/// "go through" said of changes: "schema changes go through Maria", "every deploy goes
/// through the release train"; not a path through code ("the request goes through the
/// proxy").
fn routed(marker: &str, behind: &str) -> bool {
    let clause = behind
        .rsplit(['.', '!', '?', ';', ',', '\n', '\u{2014}'])
        .next()
        .unwrap_or(behind);
    marker.starts_with("go")
        && clause.split_whitespace().rev().take(4).any(|w| {
            let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            is_change(w)
                || is_one_of(w, NO_CHANGES)
                || is_one_of(w, &["anything", "everything", "all"])
        })
}

/// Whether a verb whose previous word is `before` opens a command: the start of a
/// sentence or a clause, or after a word that only softens or joins it.
fn commands(before: &str) -> bool {
    before.is_empty()
        || is_one_of(
            before,
            &["please", "always", "and", "just", "also", "so", "but"],
        )
}

/// Where "stays" or "remains" puts a thing that must stay so: "stays on 4.2", "remains
/// at 02:00 UTC", "stays put", "stays private".
const STAY_PLACES: &[&str] = &[
    "as",
    "put",
    "pinned",
    "where",
    "fixed",
    "exactly",
    "private",
    "public",
    "internal",
    "disabled",
    "enabled",
    "off",
    "unchanged",
    "untouched",
    "below",
    "under",
];

/// Words after an opening "use" that make it no rule: "Use case: ...", "use that when
/// you estimate" (what it uses was said before).
const USE_NOT_COMMANDS: &[&str] = &[
    "case", "cases", "of", "that", "this", "it", "them", "those", "these", "one", "whatever",
    "what",
];

/// Words in which someone gives their word on a change: a gate ([`GATE_WORDS`]) or a
/// question put to them.
const WORD_GIVEN: &[&str] = &[
    "ask",
    "check",
    "consult",
    "confirm",
    "clear",
    "permission",
    "say-so",
    "approved",
    "ping",
];

/// The sentence a marker stands in, from what lies on each side of it. A `.`, `!` or `?`
/// ends it before a space or at the text's end, a line break anywhere: a dot inside a
/// name ("ratelimit.lua", "v2.1") ends nothing.
fn sentence_around<'a>(behind: &'a str, ahead: &'a str) -> [&'a str; 2] {
    let ends_at = |text: &str, i: usize| {
        let b = text.as_bytes();
        b[i] == b'\n'
            || (b".!?".contains(&b[i]) && b.get(i + 1).is_none_or(|n| n.is_ascii_whitespace()))
    };
    let start = (0..behind.len())
        .rev()
        .find(|&i| ends_at(behind, i))
        .map_or(0, |i| i + 1);
    let end = (0..ahead.len())
        .find(|&i| ends_at(ahead, i))
        .unwrap_or(ahead.len());
    [&behind[start..], &ahead[..end]]
}

/// Whether a sentence asks for someone's word: their approval, a check with them.
fn asks_for_a_word(sentence: [&str; 2]) -> bool {
    sentence
        .iter()
        .flat_map(|part| part.split_whitespace())
        .any(|w| {
            let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-');
            is_one_of(w, GATE_WORDS) || is_one_of(w, WORD_GIVEN)
        })
}

/// Words right after an opening "keep" that carry on or look rather than hold something
/// as it must be: "keep going", "keep me posted", "keep an eye on it", "keep in mind".
const KEEP_CARRIES_ON: &[&str] = &[
    "me", "us", "it", "a", "an", "track", "tabs", "watch", "in", "up", "on", "at", "looking",
    "going", "trying", "working", "reading", "digging", "calm", "quiet",
];

/// Whether what follows an opening "keep" is a thing and the state it must stay in: an
/// object (not [`KEEP_CARRIES_ON`], not a verb in -ing), and the clause going on past its
/// first word ("keep the README short", not "keep quiet").
fn keeps_a_state(ahead: &str) -> bool {
    let first = ahead
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    // "Keep it short", "keep things simple": a pronoun, then the state it must keep.
    if is_one_of(first, &["it", "them", "things", "everything"]) {
        let state = ahead
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        return is_one_of(state, KEPT_STATES);
    }
    if first.is_empty() || is_one_of(first, KEEP_CARRIES_ON) || first.ends_with("ing") {
        return false;
    }
    let clause = ahead
        .split(['.', '!', '?', ';', ',', '\n'])
        .next()
        .unwrap_or("");
    clause.split_whitespace().count() >= 2
}

/// States a thing is kept in after "keep it": "keep it short", "keep them private".
const KEPT_STATES: &[&str] = &[
    "short",
    "brief",
    "simple",
    "small",
    "minimal",
    "concise",
    "private",
    "internal",
    "stable",
    "lean",
    "tight",
    "focused",
    "readable",
    "compatible",
    "backwards-compatible",
    "offline",
    "local",
    "sorted",
    "consistent",
    "deterministic",
    "boring",
    "dependency-free",
    "under",
    "below",
    "within",
];

/// Whether a verb in the past tense reports ("loaded", "finished", "broke"), not a verb
/// whose base form ends so ("need", "embed", "proceed").
fn is_past(word: &str) -> bool {
    let regular = word.len() > 4
        && word.ends_with("ed")
        && !word.ends_with("eed")
        && !is_one_of(word, &["embed", "shred"]);
    regular || verbs::is_past(word)
}

/// Whether "before" comes within the clause's next eight words, a change within three
/// words after it: "ask the owners before renaming anything", "check with me before you
/// merge".
fn change_after_before(text: &str) -> bool {
    let mut rest = text;
    for _ in 0..8 {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, after) = rest.split_at(end);
        if word.is_empty() {
            return false;
        }
        if same(
            word.trim_matches(|c: char| !c.is_ascii_alphanumeric()),
            "before",
        ) {
            return change_within(after, 3);
        }
        if word.ends_with(['.', '!', '?', ';']) {
            return false;
        }
        rest = after;
    }
    false
}

/// Whether a consult ("ping Lena") is asked for "first", in a sentence that names a change
/// before it: "whenever you change the limiter, ping Lena first".
fn consulted_first(behind: &str, ahead: &str) -> bool {
    let [head, tail] = sentence_around(behind, ahead);
    let first = tail.split_whitespace().any(|w| {
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        same(w, "first") || same(w, "before")
    });
    first
        && head
            .split_whitespace()
            .any(|w| is_change(w.trim_matches(|c: char| !c.is_ascii_alphanumeric())))
}

/// Whether the clause before a warning names a change or a file a tool writes: "anything
/// you change there", "manual edits", "the generated files".
fn lost_change_before(behind: &str) -> bool {
    let clause = behind
        .rsplit(['.', '!', '?', ';', '\n'])
        .next()
        .unwrap_or(behind);
    clause.split_whitespace().any(|w| {
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        is_change(w) || is_one_of(w, LOST_SUBJECTS)
    })
}

/// Up to [`AROUND`] bytes of `text` before `at`, from a character's start.
fn window_before(text: &str, at: usize) -> &str {
    let mut start = at.saturating_sub(AROUND);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..at]
}

/// Up to [`AROUND`] bytes of `text` from `end`, to a character's end.
fn window_after(text: &str, end: usize) -> &str {
    let mut stop = (end + AROUND).min(text.len());
    while !text.is_char_boundary(stop) {
        stop -= 1;
    }
    &text[end..stop]
}

/// A negation forbids a change, or commands ("Please don't ..."), or states a wish; it
/// does not when it reports ("I don't know", "the tests don't pass").
fn negation(before: &str, after: &str) -> bool {
    // "You don't need to rerun it" releases.
    if is_one_of(after, &["need", "needs"]) {
        return false;
    }
    if is_change(after) || is_one_of(after, WISH_VERBS) {
        return true;
    }
    !is_verb_of(after, REPORT_VERBS) && !is_one_of(before, REPORT_SUBJECTS)
}

/// "Don't even think about touching it", "do not dream of renaming it": thinking of a
/// change is forbidden along with it; "don't think it matters" is an opinion.
fn thinks_of_a_change(verb: &str, rest: &str) -> bool {
    if !is_verb_of(verb, &["think", "dream"]) {
        return false;
    }
    let (about, end) = next_word(rest);
    is_one_of(about, &["about", "of"]) && change_within(&rest[end..], 2)
}

/// "only" restricts ("use only the stdlib", "touch only src/", "only work inside
/// `web/`"), unless it is part of a noun phrase, reports how something behaves ("it only
/// works on CI", "it only broke after the upgrade", "we didn't run it, only on staging"),
/// or reports a count.
fn only(before: &str, after: &str, behind: &str) -> bool {
    // Opening a command, a verb in its plain form is one: "Only work inside `web/`".
    let command = commands(before) && is_one_of(after, REPORT_VERBS);
    let reports = is_verb_of(after, REPORT_VERBS) || is_past(after);
    if is_one_of(before, ONLY_NOT_RULES) || (reports && !command) || reported_before(behind) {
        return false;
    }
    !(is_quantity(after) && is_one_of(before, COUNT_REPORTS))
}

/// Whether the sentence before a marker reports what was done: "we didn't run the
/// migration on the replica, only ...".
fn reported_before(behind: &str) -> bool {
    let [sentence, _] = sentence_around(behind, "");
    sentence.split_whitespace().any(|w| {
        let w =
            w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '\'' && c != '\u{2019}');
        is_one_of(
            w,
            &[
                "didn't", "did", "wasn't", "weren't", "was", "were", "hadn't",
            ],
        )
    })
}

/// Whether "leave" (or "leaving") comes within the ten words before, in the same
/// sentence ("leave db/schema.sql alone": a dot inside a name ends nothing; "leave the
/// vendored copy of libsodium in third_party/ alone").
fn leave_before(text: &str) -> bool {
    for word in text.split_whitespace().rev().take(10) {
        if word.ends_with(['.', '!', '?', ';', ':']) {
            return false;
        }
        if is_verb_of(
            word.trim_start_matches(|c: char| !c.is_ascii_alphanumeric()),
            &["leave"],
        ) {
            return true;
        }
    }
    false
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '\'' | '\u{2019}' | '_')
}

/// The word that ends `head`, past blank space; empty at the start of a sentence, a
/// clause, a line or a bullet, where a command starts.
/// Whether the clause before a requirement takes it back: "you don't need to", "nothing
/// we have to", "no one needs to", "you won't need to" say what is not required.
fn released(behind: &str) -> bool {
    let clause = behind
        .rsplit(['.', '!', '?', ',', ';', ':', '\n'])
        .next()
        .unwrap_or(behind);
    clause.split_whitespace().rev().take(3).any(|w| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '\u{2019}');
        is_one_of(w, RELEASES) || w.ends_with("n't") || w.ends_with("n\u{2019}t")
    })
}

/// Words that take a requirement after them back.
const RELEASES: &[&str] = &["not", "never", "nothing", "no", "nobody", "none"];

fn prev_word(head: &str) -> &str {
    let head = head.trim_end_matches([' ', '\t']);
    if head.ends_with(['.', '!', '?', ',', ';', ':', '\n', '(', '-']) || head.is_empty() {
        return "";
    }
    let start = head
        .char_indices()
        .rev()
        .find(|&(_, c)| !is_word_char(c))
        .map_or(0, |(i, c)| i + c.len_utf8());
    &head[start..]
}

/// The word that starts `tail`, past blank space and a few adverbs ("don't ever
/// touch"), and where it ends; empty when a sentence or clause ends first.
fn next_word(tail: &str) -> (&str, usize) {
    let mut at = 0;
    loop {
        let rest = &tail[at..];
        let start = at + (rest.len() - rest.trim_start_matches([' ', '\t']).len());
        let rest = &tail[start..];
        let len = rest.find(|c: char| !is_word_char(c)).unwrap_or(rest.len());
        let word = &rest[..len];
        at = start + len;
        if word.is_empty() || !is_one_of(word, SKIPPED_ADVERBS) {
            return (word, at);
        }
    }
}

/// Words between a negation and its verb or noun that do not change what it governs
/// ("don't ever touch", "without my approval", "without first asking").
const SKIPPED_ADVERBS: &[&str] = &[
    "ever", "even", "just", "really", "actually", "please", "first", "my", "your", "our", "a",
    "an", "the", "any", "prior", "explicit",
];

/// Whether a quantity (digits, "$5", "two") starts one of the first `words` words.
fn quantity_within(text: &str, words: usize) -> bool {
    let clause = text.split([';', '\n', '!', '?']).next().unwrap_or("");
    clause
        .split(|c: char| c.is_whitespace() || c == ':' || c == '=')
        .filter(|w| !w.is_empty())
        .take(words)
        .any(is_quantity)
}

/// Whether a bound after `before` reports a measurement ("it took under 5 seconds", "it
/// used at least 3 GB") rather than setting one.
fn measured(before: &str) -> bool {
    is_one_of(before, MEASURED)
}

/// Verbs and words before a quantity that report what was measured.
const MEASURED: &[&str] = &[
    "took",
    "ran",
    "finished",
    "completed",
    "was",
    "were",
    "used",
    "got",
    "had",
    "needed",
    "failed",
    "passed",
    "returned",
    "printed",
    "showed",
];

/// Whether, within the first `words` words, a modal verb comes and a change verb
/// later ("under infra/ should be edited").
/// Whether a change ([`is_change`]) is among the first `words` words of `text`, in its
/// clause.
/// Whether someone's review, approval or go-ahead ([`GATE_WORDS`], "sign off", "thumbs
/// up", "green light") is among the first `words` words of `text`, in its clause.
fn gate_within(text: &str, words: usize) -> bool {
    let mut last = "";
    for word in text.split_whitespace().take(words + 1) {
        let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-');
        let pair = [("sign", "off"), ("thumbs", "up"), ("green", "light")]
            .iter()
            .any(|(a, b)| same(last, a) && same(w, b));
        if is_one_of(w, GATE_WORDS) || pair {
            return true;
        }
        // "It needs no review" waives it.
        if is_one_of(w, &["no", "not", "never"]) {
            return false;
        }
        if word.ends_with(['.', '!', '?', ';', ',', ':']) {
            return false;
        }
        last = w;
    }
    false
}

fn change_within(text: &str, words: usize) -> bool {
    for word in text.split_whitespace().take(words) {
        if is_change(word.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())) {
            return true;
        }
        if word.ends_with(['.', '!', '?', ';', ',', ':']) {
            return false;
        }
    }
    false
}

/// Words after "nobody" or "no one" that name who alone may ("nobody but ops").
const EXCEPT: &[&str] = &["but", "except", "besides", "other", "apart"];

/// Whom "we can't have ... editing it" keeps from a change.
const ANYONE: &[&str] = &["anyone", "anybody", "others", "people", "you", "agents"];

fn modal_change_within(text: &str, words: usize) -> bool {
    let mut modal = false;
    for word in text.split_whitespace().take(words) {
        let word = word.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        if modal && is_change(word) {
            return true;
        }
        modal |= is_one_of(word, MODALS);
    }
    false
}

/// Verbs that say what may or must happen.
const MODALS: &[&str] = &[
    "should", "may", "can", "must", "shall", "is", "gets", "will",
];

/// Whether a quantity ends one of the two words before a limit ("a 500 MB cap").
fn quantity_before(text: &str) -> bool {
    text.split_whitespace().rev().take(2).any(is_quantity)
}

fn is_quantity(word: &str) -> bool {
    let w = word.trim_start_matches(['$', '€', '£', '~', '(']);
    w.starts_with(|c: char| c.is_ascii_digit()) || is_one_of(word, NUMBER_WORDS)
}

/// Whether `word` is one of `list`, ASCII case ignored, a typographic apostrophe read
/// as a straight one.
fn is_one_of(word: &str, list: &[&str]) -> bool {
    list.iter().any(|w| same(word, w))
}

fn same(word: &str, plain: &str) -> bool {
    if !word.contains('\u{2019}') {
        return word.eq_ignore_ascii_case(plain);
    }
    let mut a = word.chars().map(|c| if c == '\u{2019}' { '\'' } else { c });
    let mut b = plain.chars();
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x.eq_ignore_ascii_case(&y) => {}
            _ => return false,
        }
    }
}

fn is_change(word: &str) -> bool {
    // "hand-edited", "hand-edit": the change, done by hand.
    let word = word
        .get(..5)
        .filter(|head| head.eq_ignore_ascii_case("hand-"))
        .map_or(word, |_| &word[5..]);
    is_verb_of(word, CHANGE_VERBS)
}

/// Whether `word` is one of the verbs of `list` with an ending ("touching", "renamed",
/// "dropped", "uses").
fn is_verb_of(word: &str, list: &[&str]) -> bool {
    list.iter().any(|verb| {
        let stem = verb.strip_suffix('e').unwrap_or(verb);
        let Some(head) = word.get(..stem.len()) else {
            return false;
        };
        if !head.eq_ignore_ascii_case(stem) {
            return false;
        }
        let rest = &word[stem.len()..];
        let doubled = rest.len() > 1 && rest.as_bytes()[0] == stem.as_bytes()[stem.len() - 1];
        let ending = if doubled { &rest[1..] } else { rest };
        is_one_of(ending, &["", "e", "s", "es", "ed", "d", "ing"])
    })
}

/// Whether the marker at `at` is in a question that asks rather than requests ("Do you
/// know why it must fail?", not "Can you make sure it stays?"). Only the sentence's
/// part within [`AROUND`] bytes is read: a longer one counts as a statement.
fn in_question(text: &str, at: usize) -> bool {
    let ahead = window_after(text, at);
    if ahead
        .find(['.', '!', '?', '\n'])
        .is_none_or(|i| ahead.as_bytes()[i] != b'?')
    {
        return false;
    }
    let behind = window_before(text, at);
    let start = match behind.rfind(['.', '!', '?', '\n']) {
        Some(i) => i + 1,
        // The opening is out of reach: read as a statement.
        None if behind.len() < at => return false,
        None => 0,
    };
    let opening = behind[start..].trim_start();
    let requests = [
        "can you",
        "could you",
        "would you",
        "will you",
        "please",
        "can we",
        "could we",
    ];
    !requests.iter().any(|r| {
        opening
            .get(..r.len())
            .is_some_and(|h| h.eq_ignore_ascii_case(r))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word list this module replaced: each phrasing below that it missed (or
    /// wrongly caught) is what a rule here is for.
    fn old_list(text: &str) -> bool {
        const OLD: &[&str] = &[
            "never",
            "always",
            "must",
            "don't",
            "do not",
            "dont",
            "only",
            "avoid",
            "make sure",
            "unchanged",
            "as is",
            "stick to",
            "no new",
            "without",
            "should not",
            "shouldn't",
            "not allowed",
            "forbidden",
            "required",
            "important",
        ];
        crate::engine::phrases::Phrases::new(&[OLD])
            .find(text, true)
            .is_some()
    }

    /// Each of `found` is a constraint that the old list missed.
    fn all_new(found: &[&str]) {
        for s in found {
            assert!(is_constraint(s), "missed: {s}");
            assert!(!old_list(s), "not new: {s}");
        }
    }

    #[test]
    fn prohibitions_however_phrased() {
        all_new(&[
            "The vendor/ directory is off-limits.",
            "Hands off src/legacy/parser.c, it is shared with the firmware team.",
            "Stay away from the deploy scripts.",
            "The billing module is out of bounds for this change.",
            "Under no circumstances push to main.",
            "Please refrain from editing the generated files.",
            "Touching settings/prod.py is prohibited.",
            "Running the suite against prod is not permitted.",
            "The migrations are not to be touched.",
        ]);
    }

    #[test]
    fn more_prohibitions_and_requirements() {
        all_new(&[
            "We are not touching the public API in this PR.",
            "Nobody edits the release notes but me.",
            "I'd rather not add a database.",
            "Limit yourself to the files in src/parser/.",
            "The wire format stays unmodified.",
            "Remember to regenerate the snapshots.",
            "It is essential that the CLI flags keep their names.",
            "The diff should be no longer than a screen.",
        ]);
        for s in [
            "The file was not modified by the script.",
            "It won't compile on stable.",
            "No one knows why.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
    }

    #[test]
    fn a_limit_may_follow_its_quantity() {
        all_new(&[
            "Three retries at most.",
            "The API allows 60 requests per minute.",
            "Keep each call to 5 seconds tops.",
        ]);
        assert!(!is_constraint("Tabs are allowed in the Makefile."));
    }

    #[test]
    fn ownership_scope_and_sameness() {
        all_new(&[
            "The file infra/main.tf is owned by ops, so it's not ours to edit.",
            "infra/main.tf is not yours to modify.",
            "infra/main.tf stays exactly the way it is.",
            "I'd prefer that you leave infra/main.tf as it stands.",
            "Keep infra/main.tf byte-for-byte identical.",
            "Edits to infra/main.tf are out of scope.",
            "Changing infra/main.tf is a no-go.",
            "Refactors are off the table this sprint.",
            "On no account rename the tables.",
            "Steer clear of the legacy importer.",
            "The Makefile is someone else's; keep out.",
        ]);
    }

    #[test]
    fn nothing_that_may_change() {
        all_new(&["Nothing under infra/ should be edited."]);
        assert!(!is_constraint("Nothing changed after the restart."));
    }

    #[test]
    fn a_bound_closing_its_clause_or_kept_to() {
        all_new(&[
            "We get 30 requests a minute from the provider, no more.",
            "Batch size 384, not higher.",
            "Room for 128 shards, not one more.",
            "Keep the batch to 500 rows.",
            // Held to a state, not a number.
            "Please keep all timestamps in UTC.",
            "Keep the public docs in British English.",
            "Keep the feature flags default-off.",
            "Keep secrets out of the logs, including debug ones.",
            "Each request may take 2 seconds or less.",
            "The provider throttles us at 30 req/min.",
            "The limit on the search API is 60 per minute.",
        ]);
        for s in [
            "I have no more ideas.",
            "It is not more expensive than the old one.",
            "Keep going with the next file.",
            "Keep me posted on the migration.",
            "Keep an eye on the memory graph.",
            "Keep in mind the staging box is slow.",
            "Keep digging into the flaky test.",
            "We keep hitting the same timeout.",
            "It is more or less done.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
    }

    #[test]
    fn a_measurement_is_no_bound() {
        for s in ["It took under 5 seconds.", "The run used at least 3 GB."] {
            assert!(!is_constraint(s), "{s}");
        }
        assert!(is_constraint("Respond in under 200 ms."));
    }

    #[test]
    fn read_only_is_a_rule() {
        // The old list caught it only by the "only" in it.
        assert!(is_constraint("config/base.yaml is read-only for you."));
        assert!(is_constraint("Treat the fixtures as read only."));
    }

    #[test]
    fn leave_alone_needs_leave_before_it() {
        all_new(&[
            "Leave the schema in db/schema.sql alone.",
            "Please leave vendor/openssl alone for now.",
        ]);
        assert!(!is_constraint("I was alone on call last night."));
    }

    #[test]
    fn a_frozen_or_locked_thing_is_a_rule_said_of_it() {
        all_new(&[
            "The lockfile is frozen until the release.",
            "Treat the public schema as locked.",
        ]);
        assert!(!is_constraint("A frozen dataclass holds the settings."));
    }

    #[test]
    fn cannot_binds_the_listener_or_a_change_not_the_speaker() {
        all_new(&[
            "You can't use the network in this sandbox.",
            "We cannot rename the public endpoints.",
            "The config can\u{2019}t be changed by the agent.",
        ]);
        assert!(!is_constraint("I can't reproduce it on my machine."));
        assert!(!is_constraint("We cannot find the log file anywhere."));
    }

    #[test]
    fn no_before_a_kind_of_change_forbids_it() {
        all_new(&[
            "No changes to the CI workflow, please.",
            "No edits in third_party/ at all.",
            "No extra dependencies.",
        ]);
        assert!(!is_constraint("No changes were made to the file."));
    }

    #[test]
    fn one_word_may_say_which_changes_no_forbids() {
        all_new(&[
            "No direct pushes to the release branch.",
            "No manual edits in db/migrations/.",
            "No local patches to vendor/openssl.",
            "No hand-written merges into staging; the bot does them.",
        ]);
        assert!(!is_constraint("No direct commits were found on main."));
        assert!(!is_constraint("No obvious changes in the output."));
    }

    #[test]
    fn a_change_gated_on_approval_is_a_rule() {
        all_new(&[
            "Anything under billing/ needs sign-off from finance before it ships.",
            "Schema changes require approval from the data team.",
            "The Terraform state needs review by two people before apply.",
            "Edits to the pricing table need approval, ask Dana first.",
        ]);
        assert!(!is_constraint("Dana approved the pricing table yesterday."));
    }

    #[test]
    fn asking_first_leaving_be_and_warnings_that_changes_do_not_last_are_rules() {
        for said in [
            "storage/quota.go is someone else's code; ask before changing it.",
            "Check with the on-call SRE before you restart anything in prod.",
            "Please consult the data team before renaming columns in the warehouse.",
            "Ping #infra before deploying the new ingress.",
            "That file is owned by the data team, so leave it be.",
            "Leave the licence header in place when you reformat.",
            "The config under etc/nginx/ is managed by Ansible, so any manual edit will be reverted.",
            "The generated files in gen/ get overwritten on every build, so edit the templates instead.",
            "Anything you change in dist/ is regenerated by the bundler.",
            "Whatever you do, the public bucket policy stays private.",
            "No matter what, the invoices table keeps its primary key.",
        ] {
            assert!(is_constraint(said), "missed: {said}");
        }
        for said in [
            "I asked before running it and nobody answered.",
            "Ask me anything about the deploy.",
            "My edits were reverted by the merge.",
            "The cache got overwritten last night.",
            "Let it be known that the build is green.",
            "The config file never loaded.",
            "It never finished on CI either.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
        // A rule with a verb that ends in -ed but is no past.
        assert!(is_constraint("Never embed the API key in the bundle."));
    }

    #[test]
    fn a_change_waiting_on_someones_word_is_a_rule() {
        for said in [
            "docs/privacy.md needs legal review before it ships.",
            "Wait for security to approve the new IAM policy before applying it.",
            "Nothing goes to prod without a thumbs-up from compliance.",
            "The migration in 0042_users.sql requires the DBA's sign-off.",
            "Publishing the SDK has to go through a review by the platform team first.",
            "Keep the rollout pending approval from Priya.",
            "Don't cut the release; wait until QA gives the green light.",
        ] {
            assert!(is_constraint(said), "missed: {said}");
        }
        for said in [
            "I need a review of this PR when you have a minute.",
            "This refactor needs no review.",
            "The PR needs a rebase onto main.",
            "The tests require Python 3.11 or newer.",
            "Legal reviewed the notice yesterday.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
    }

    #[test]
    fn not_to_and_without_forbid_only_a_change() {
        assert!(is_constraint("Be careful not to break the public API."));
        assert!(is_constraint("Do it without touching the fixtures."));
        // Past a determiner or an adverb.
        for s in [
            "Land it without my approval and it gets reverted.",
            "Go ahead without first asking.",
            "Ship it without a review from me.",
        ] {
            assert!(is_constraint(s), "{s}");
        }
        // The old list read these as rules.
        for s in ["It ran without errors.", "The script exits without output."] {
            assert!(old_list(s) && !is_constraint(s), "{s}");
        }
    }

    #[test]
    fn negations_that_command_or_govern_a_change() {
        for s in [
            "Don't touch the migrations.",
            "Please do not rename api/v1.py.",
            "We don't deploy on Fridays.",
            "I don't want any new crates.",
            "Don\u{2019}t ever edit the lockfile by hand.",
            "dont commit the .env file",
        ] {
            assert!(is_constraint(s), "{s}");
        }
        // Reports with a negation, all of which the old list took for rules.
        for s in [
            "I don't know why the build broke.",
            "The tests don't pass on CI.",
            "I do not understand the stack trace.",
            "Don't worry about the warnings.",
        ] {
            assert!(old_list(s) && !is_constraint(s), "{s}");
        }
    }

    #[test]
    fn never_is_a_rule_unless_it_reports() {
        assert!(is_constraint("Never modify config/prod.yaml"));
        assert!(is_constraint("We never force-push shared branches."));
        assert!(is_constraint("The keys are never to be logged."));
        for s in [
            "I never saw that error before.",
            "It has never worked on Windows.",
        ] {
            assert!(old_list(s) && !is_constraint(s), "{s}");
        }
    }

    #[test]
    fn thinking_of_a_change_or_affording_one_is_forbidden_with_it() {
        for s in [
            "Don't even think about touching billing/ledger.py.",
            "Do not think of renaming the public functions.",
            "Please don't even dream of pushing to main on a Friday.",
            "Don't think about deleting the old migrations yet.",
            "We can't afford to break the v1 endpoints.",
            "You cannot afford to change the wire format now.",
            "We simply can't afford to drop support for Python 3.9.",
            "The team cannot afford to rename the exported symbols.",
        ] {
            assert!(is_constraint(s), "missed: {s}");
        }
        for s in [
            "I don't think about the cache much.",
            "Don't think it matters, the tests pass.",
            "We can't afford another cloud bill like last month's.",
            "I can't afford to spend another evening on flaky tests.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
    }

    #[test]
    fn who_alone_may_change_a_thing_sets_a_rule() {
        all_new(&[
            "deploy/values-prod.yaml belongs to the platform crew, they alone edit it.",
            "Nobody but the release manager touches infra/main.tf.",
            "No one except ops may deploy the gateway.",
            "We can't have anyone editing the schema right now.",
            "Ops alone may edit the runbook.",
        ]);
        for s in [
            "Nobody but me seems to read this channel.",
            "She alone fixed the build last night.",
            "I was alone on call last night.",
            "We can't have lunch before the demo.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
    }

    #[test]
    fn requirements_however_phrased() {
        all_new(&[
            "The output has to stay byte-identical.",
            "Every handler needs to log its request id.",
            "You have to run the formatter before committing.",
            "Be sure to bump the version in Cargo.toml.",
            "Ensure the cache is cleared between runs.",
            "Keep the wire format exactly as it is.",
            "The public API should remain stable.",
            "Signing is mandatory for every release.",
        ]);
        assert!(!is_constraint("I have to admit the error is odd."));
        // Said not to be required: a release, not a rule.
        for s in [
            "We talked about the offsite, nothing you need to act on there.",
            "You don't need to rerun the whole suite.",
            "No one has to sign off on the docs change.",
            "You won't need to touch the migrations.",
            "There's no need to page anyone tonight.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
        // Still a rule when the negation belongs to another clause.
        assert!(is_constraint(
            "It's not urgent, but every handler needs to log its request id."
        ));
    }

    #[test]
    fn bounds_need_a_quantity() {
        all_new(&[
            "Use at most 4 worker threads.",
            "Keep responses under 200 ms.",
            "The patch should be no more than 50 lines.",
            "Retry up to 3 times.",
            "Finish within 10 minutes.",
            "At least two reviewers approve each PR.",
            "Stay below 80% CPU.",
        ]);
        for s in [
            "Under the hood it calls requests.",
            "The branch is up to date.",
            "Put it within the loop.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
    }

    #[test]
    fn limits_need_a_quantity_beside_them() {
        all_new(&[
            "We have a budget of 5,000 tokens per request.",
            "There is a cap of 100 requests per minute.",
            "The API quota is 20k calls a day.",
            "Stay inside a 512 MiB ceiling.",
            "The rate limit: 60 per minute.",
            "Max 3 retries per job.",
        ]);
        for s in [
            "The rate limit was hit yesterday.",
            "Set max_tokens=4096 in the request.",
        ] {
            assert!(!is_constraint(s), "{s}");
        }
    }

    #[test]
    fn only_restricts_unless_it_reports() {
        for s in [
            "Use only the standard library.",
            "Only touch files under src/.",
            "Run only 2 jobs at a time.",
        ] {
            assert!(is_constraint(s), "{s}");
        }
        for s in [
            "Only one test failed.",
            "It only happens on CI.",
            "There are only 3 left.",
            "The only difference is the flag.",
        ] {
            assert!(old_list(s) && !is_constraint(s), "{s}");
        }
    }

    #[test]
    fn questions_set_no_rule_unless_they_request() {
        assert!(is_constraint("Can you make sure the API stays unchanged?"));
        assert!(!is_constraint("Do you know why it must be sorted?"));
        assert!(!is_constraint("Do you know where the config lives?"));
        // A rule in one sentence, a question in the next.
        assert!(is_constraint("Never edit main.rs. Why is it failing?"));
    }

    #[test]
    fn a_line_break_starts_a_command() {
        // "it" ends the line before: the negation still opens its own line.
        assert!(is_constraint(
            "That is all I have about it\nDon't go near the prod cluster"
        ));
    }

    #[test]
    fn long_lines_and_long_questions() {
        // A line without spaces full of markers (each reads its window only: time grows
        // with the line, checked by hand at 60,000 and 120,000 markers) sets no bound.
        assert!(!is_constraint(&"limit-".repeat(20_000)));
        // A question whose opening is out of reach reads as a statement.
        let question = format!("Why {} must it?", "very ".repeat(60));
        assert!(is_constraint(&question));
        assert!(!is_constraint("Why must it?"));
    }

    #[test]
    fn verbs_match_with_their_endings() {
        for w in [
            "touch", "touching", "Renamed", "dropped", "uses", "using", "change",
        ] {
            assert!(is_change(w), "{w}");
        }
        for w in ["touchy", "used_by", "usual", "add_"] {
            assert!(!is_change(w), "{w}");
        }
    }

    #[test]
    fn rules_said_as_a_stop_a_gate_before_a_change_or_a_place_to_stay() {
        all_new(&[
            "Stop rewriting the migrations after they have shipped.",
            "Please quit touching the shared fixtures.",
            "Before you rename any column, run it past Priya for approval.",
            "Before dropping a table, check with the data team.",
            "Before we deploy to prod, I need a sign-off from QA.",
            "The base image stays on 22.04 until the vendor certifies 24.04.",
            "Nightly backups remain at 03:30 CET, the DBAs plan around that.",
            "The feature flag stays disabled in production.",
        ]);
        for said in [
            "I stopped editing the file once the tests passed.",
            "Before deploying it, the script checks the disk.",
            "Memory stays in the cache between requests.",
            "It stays on the old branch for some reason.",
            "The worker pool stays on rayon_pool_3 from here on.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
    }

    #[test]
    fn rules_said_as_a_judgement_a_duty_or_whose_call_it_is() {
        all_new(&[
            "Downtime during business hours is unacceptable.",
            "A second database is not an option for this project.",
            "The bot is not supposed to promise refunds.",
            "Every endpoint is supposed to return JSON errors.",
            "Renaming the public routes isn't our call.",
            "The retention period is not something to change lightly.",
            "Absolutely no secrets in the example config.",
        ]);
        assert!(is_constraint("Tag every release in git without fail."));
        for said in [
            "I'm not supposed to be on call this week, but here I am.",
            "The old cron job never had a timeout.",
            "That was not an easy bug to find.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
    }

    #[test]
    fn bounds_said_with_should_cannot_nothing_or_a_command() {
        all_new(&[
            "Webhook payloads should be kept below 64 KB.",
            "Each shard should hold fewer than 10 million rows.",
            "The queue can't grow beyond 5,000 messages.",
            "Response time can't creep past 300 ms at p99.",
            "Nothing should listen on a public port.",
            "Nothing touches the billing tables on a Friday.",
            "Cap the nightly crawler's total bandwidth at 50 GB.",
            "Use `uv` for every Python environment here.",
            "Prefer composition over inheritance in the new widgets.",
        ]);
        for said in [
            "It should take about 5 minutes to build.",
            "Exports should be split into files of 100k rows.",
            "I can't run 2 jobs at once on this laptop.",
            "Nothing changed after the restart.",
            "Use case: a customer uploads 3 invoices at once.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
    }

    #[test]
    fn a_change_done_by_hand_is_a_change() {
        assert!(is_change("hand-edited"));
        assert!(is_constraint(
            "Files under `proto/gen/` are not hand-edited; run `buf generate` instead."
        ));
    }

    #[test]
    fn changes_routed_through_someone_are_gated() {
        all_new(&[
            "All schema changes go through Maria.",
            "Every deploy goes through the release train on Thursdays.",
        ]);
        assert!(!is_constraint("The request goes through the proxy first."));
    }

    #[test]
    fn keep_it_in_a_state_is_a_rule() {
        all_new(&[
            "Keep it short, the reviewers read these on their phones.",
            "Please keep them private until the launch.",
            "Keep things boring in the deploy scripts.",
        ]);
        for said in ["Keep it up!", "Keep it coming, this is great."] {
            assert!(!is_constraint(said), "{said}");
        }
    }

    #[test]
    fn rules_said_as_a_duty_a_standing_change_or_a_deadline() {
        all_new(&[
            "Database access from laptops is to go through the VPN.",
            "Hotfixes are to be tagged with the incident number.",
            "From now on, each migration gets a rollback script in db/down/.",
            "Going forward, every public function in sdk/ needs a docstring.",
            "The firmware in boards/legacy/ is someone else's problem, leave it.",
            "The hard deadline for the API freeze is March 3.",
        ]);
        assert!(is_constraint(
            "We have a standing policy that prod data never lands in staging."
        ));
        for said in [
            "The goal is to ship the export feature.",
            "The fix is to pin the resolver version.",
            "This is to confirm the backup ran last night.",
            "The deadline slipped once already last quarter.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
    }

    #[test]
    fn rules_said_of_scope_or_of_a_thing_left_as_it_is() {
        assert!(is_constraint(
            "Only edit inside services/search; the rest belongs to other teams."
        ));
        all_new(&[
            "Leave the generated protobuf stubs in api/gen/ alone.",
            "Leave the `LEGACY_AUTH` toggle switched off in staging.",
            "I'm happy with renames, but keep the REST paths backwards compatible.",
            "Whenever you touch the billing cron, ping Ana in #payments first.",
            "We won't be moving the mobile app to Kotlin 2 in this project.",
            "Keep React on 17 for now, no upgrade to 18.",
        ]);
        for said in [
            "The staging deploy only broke after the cert rotated.",
            "We didn't patch the edge nodes, only the core ones.",
            "The payment SDK should never have shipped with debug logging.",
            "Someone must have rotated the key without telling us.",
            "It only works when the VPN is up.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
        // "must have" with what it requires still requires.
        assert!(is_constraint(
            "Every deploy must have a ticket number in its message."
        ));
    }

    #[test]
    fn rules_said_of_each_occurrence_or_of_who_alone() {
        all_new(&[
            "Whenever a build goes red on main, open an incident in #eng-oncall.",
            "Every time a refund is over the limit, route it to Priya.",
            "Each invoice needs a PO number before it is paid.",
            "Every migration should ship with a down step in db/down/.",
            "Hold off on touching the payment webhooks until the audit ends.",
            "Deploys go through the release bot and nobody else.",
            "Our contract with the lab prohibits sharing the raw scans outside the EU.",
            "Run the formatter before every push to the shared branch.",
            "Nothing over $300 a night for the hotels in Lisbon.",
            "As a rule, cite the ticket id in each commit message.",
            "If you modify the Helm chart in deploy/prod, tell Ravi before applying it.",
        ]);
        assert!(is_constraint(
            "No purchase orders without a cost centre code."
        ));
        for said in [
            "Whenever it rains, the delivery app slows down.",
            "Every time I run the suite, it hangs on test_upload.",
            "Each invoice needed a manual fix last month.",
            "We shouldn't have merged that branch on a Friday.",
            "Nothing happened after the restart.",
        ] {
            assert!(!is_constraint(said), "{said}");
        }
    }
}
