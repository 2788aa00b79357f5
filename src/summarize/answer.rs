//! Checking what the summariser wrote before it replaces anyone's turns. A small or
//! overloaded model answers junk as readily as a summary: the first word of one ("The"),
//! the prompt's own lines given back, a checkpoint cut off by its token cap. Each is
//! rejected with its reason, so the next model or the digest takes over, and a rejected
//! answer is never carried into the next chunk as the checkpoint so far.

use super::request::{PREVIOUS_CLOSE, PREVIOUS_OPEN};
use super::stream::StreamedAnswer;
use crate::engine::{Counter, END_MARKER, END_MARKER_SHORT, MARKER};
use crate::metrics::Rejection;
use crate::redact::redact;

/// Why a summariser's answer cannot be used; the caller falls back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerProblem {
    #[error("the answer was empty")]
    Empty,
    #[error("the answer was cut off by its token cap")]
    Truncated,
    #[error("the summariser refused: {0}")]
    Refusal(String),
    #[error("the answer has {0} of the checkpoint's headings")]
    Unstructured(usize),
    #[error("the answer repeats the prompt's instructions")]
    Echo,
    #[error("the answer says nothing under its headings")]
    NoContent,
    #[error("the answer is {tokens} tokens, too short for what it replaces (at least {min})")]
    TooShort { tokens: usize, min: usize },
    #[error("the update drops {lost:?} from the previous checkpoint's {section}")]
    DroppedFacts { section: String, lost: String },
}

impl AnswerProblem {
    /// The reason metrics and log lines give for it.
    pub fn reason(&self) -> Rejection {
        match self {
            AnswerProblem::Empty => Rejection::Empty,
            AnswerProblem::Truncated => Rejection::Truncated,
            AnswerProblem::Refusal(_) => Rejection::Refusal,
            AnswerProblem::Unstructured(_) => Rejection::Structure,
            AnswerProblem::Echo => Rejection::Echo,
            AnswerProblem::NoContent => Rejection::NoContent,
            AnswerProblem::TooShort { .. } => Rejection::Short,
            AnswerProblem::DroppedFacts { .. } => Rejection::DroppedFacts,
        }
    }
}

/// What an answer is checked against.
pub struct Expect<'a> {
    /// What the request told the model besides the turns: its system message and the
    /// parameters after the turns, then, for an update, the previous checkpoint between
    /// [`PREVIOUS_OPEN`] and [`PREVIOUS_CLOSE`] ([`super::SummaryRequest::instructions`]).
    pub instructions: &'a str,
    /// The fewest tokens a checkpoint of what the call replaces can plausibly take (see
    /// [`min_tokens`]).
    pub min_tokens: usize,
    pub counter: &'a Counter,
}

/// A refusal is short; a real checkpoint, even a sparse one, is longer than this.
const REFUSAL_MAX_CHARS: usize = 600;

/// Openings of a refusal, lowercased with straight apostrophes.
const REFUSALS: &[&str] = &[
    "i can't",
    "i cannot",
    "i can not",
    "i won't",
    "i will not",
    "i'm sorry",
    "i am sorry",
    "sorry, but",
    "sorry, i",
    "i apologize",
    "i apologise",
    "i'm unable",
    "i am unable",
    "i'm not able",
    "i am not able",
    "as an ai",
    "unfortunately, i",
];

/// The template's headings, in both its forms.
const HEADINGS: &[&str] = &[
    "## Active Task",
    "## Goal",
    "## Constraints and Preferences",
    "## Completed Actions",
    "## Active State",
    "## In Progress",
    "## Blockers",
    "## Key Decisions",
    "## Resolved Questions",
    "## Pending Asks",
    "## Relevant Files",
    "## Remaining Work",
    "## Critical Values",
];
/// A checkpoint names at least this many of them: one heading over a paragraph is a
/// model that did not follow the template, and a later update could not find its parts.
const MIN_HEADINGS: usize = 2;
/// Fewest tokens a checkpoint may take however little it replaces, and what every
/// hundred tokens replaced add to that, up to [`MIN_TOKENS_CAP`].
const MIN_TOKENS_FLOOR: usize = 16;
const MIN_TOKENS_PER_HUNDRED: usize = 1;
const MIN_TOKENS_CAP: usize = 40;
/// Lines shorter than this prove nothing when the prompt holds them too ("None.", "1.").
const ECHO_MIN_CHARS: usize = 12;

/// The fewest tokens a checkpoint of `replaced` tokens, asked for in about `budget`, can
/// plausibly take: a percent of what it replaces, between 16 and 40, and never more than
/// half the budget.
pub fn min_tokens(replaced: usize, budget: usize) -> usize {
    (MIN_TOKENS_FLOOR + replaced / 100 * MIN_TOKENS_PER_HUNDRED)
        .min(MIN_TOKENS_CAP)
        .min(budget / 2)
}

/// The usable checkpoint in a summariser's answer: reasoning blocks, a fence around the
/// whole answer, a lead-in line and copied summary markers removed; secrets masked again in
/// case the model echoed one. Rejects, in this order: empty answers, answers cut by their
/// token cap, refusals, answers without the template's structure, answers that repeat the
/// instructions or say nothing under the headings, and answers too short for what they
/// replace.
pub fn check_answer(answer: &StreamedAnswer, expect: &Expect) -> Result<String, AnswerProblem> {
    let unmarked = drop_markers(&answer.text);
    let text = strip_fence(strip_thinking(&unmarked).trim()).trim();
    if text.is_empty() {
        return Err(AnswerProblem::Empty);
    }
    if answer.finish_reason.as_deref() == Some("length") {
        return Err(AnswerProblem::Truncated);
    }
    if is_refusal(text) {
        return Err(AnswerProblem::Refusal(crate::engine::message::one_line(
            text, 120,
        )));
    }
    let text = drop_lead_in(text).trim();
    let headings = HEADINGS.iter().filter(|h| has_heading(text, h)).count();
    if headings < MIN_HEADINGS {
        return Err(AnswerProblem::Unstructured(headings));
    }
    let content: Vec<&str> = text.lines().filter_map(content_line).collect();
    if content.is_empty() {
        return Err(AnswerProblem::NoContent);
    }
    let (instructions, previous) = split_previous(expect.instructions);
    let echoed = content
        .iter()
        .filter(|l| l.len() >= ECHO_MIN_CHARS && instructions.contains(*l))
        .count();
    if echoed * 2 >= content.len() {
        return Err(AnswerProblem::Echo);
    }
    let tokens = expect.counter.text(text);
    if tokens < expect.min_tokens {
        return Err(AnswerProblem::TooShort {
            tokens,
            min: expect.min_tokens,
        });
    }
    let text = redact(text).into_owned();
    if let Some(previous) = previous {
        kept_facts(previous, &text)?;
    }
    Ok(text)
}

/// The instructions without the previous checkpoint, and the previous checkpoint.
fn split_previous(instructions: &str) -> (&str, Option<&str>) {
    let Some(open) = instructions.find(PREVIOUS_OPEN) else {
        return (instructions, None);
    };
    let inner = &instructions[open + PREVIOUS_OPEN.len()..];
    let inner = inner
        .find(PREVIOUS_CLOSE)
        .map_or(inner, |end| &inner[..end]);
    (&instructions[..open], Some(inner.trim()))
}

/// Sections of the checkpoint whose content is record, not state: what was set, done,
/// decided, touched and measured stays true after later turns. (Active State, In
/// Progress, Blockers and Pending Asks may rightly lose lines.)
const DURABLE: &[&str] = &[
    "## Goal",
    "## Constraints and Preferences",
    "## Completed Actions",
    "## Key Decisions",
    "## Resolved Questions",
    "## Relevant Files",
    "## Critical Values",
];

/// An update keeps every heading of the previous checkpoint, and in its durable sections
/// every fact ([`facts`]): a fact in checkpoint N is still in checkpoint N+1. A previous
/// summary not in the template's form (the digest's) is not checked: the update rewrites
/// it into the template.
fn kept_facts(previous: &str, update: &str) -> Result<(), AnswerProblem> {
    for (heading, body) in sections(previous) {
        if !has_heading(update, heading) {
            if body.lines().any(|l| content_line(l).is_some()) {
                return Err(AnswerProblem::DroppedFacts {
                    section: heading.trim_start_matches("## ").to_string(),
                    lost: heading.to_string(),
                });
            }
            continue;
        }
        if !DURABLE.contains(&heading) {
            continue;
        }
        if let Some(lost) = facts(body).into_iter().find(|f| !update.contains(f)) {
            return Err(AnswerProblem::DroppedFacts {
                section: heading.trim_start_matches("## ").to_string(),
                lost: lost.to_string(),
            });
        }
    }
    Ok(())
}

/// The template's sections of a checkpoint: each heading with the text under it.
fn sections(text: &str) -> Vec<(&'static str, &str)> {
    let mut starts: Vec<(usize, &'static str)> = HEADINGS
        .iter()
        .filter_map(|h| {
            text.match_indices(h)
                .find(|(at, _)| *at == 0 || text.as_bytes()[at - 1] == b'\n')
                .map(|(at, _)| (at, *h))
        })
        .collect();
    starts.sort();
    starts
        .iter()
        .enumerate()
        .map(|(i, &(at, h))| {
            let end = starts.get(i + 1).map_or(text.len(), |n| n.0);
            (h, &text[at + h.len()..end])
        })
        .collect()
}

/// The words of a text a model could not get back once dropped: code spans, paths and
/// file names, names from code (`snake_case`), and words with three or more digits (ids,
/// counts, versions, dates). Prose may be reworded; these must stand as they were.
fn facts(text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = after[..close].trim();
        if !span.is_empty() && !span.contains('\n') {
            out.push(span);
        }
        rest = &after[close + 1..];
    }
    for word in text.split_whitespace() {
        let w = word.trim_matches(|c: char| !c.is_alphanumeric() && !"/_~".contains(c));
        let digits = w.bytes().filter(u8::is_ascii_digit).count();
        let path = w.contains('/') && w.len() > 3
            || w.rsplit_once('.').is_some_and(|(a, b)| {
                !a.is_empty()
                    && (2..=5).contains(&b.len())
                    && b.bytes().all(|c| c.is_ascii_lowercase())
            });
        // `events_wv76`, `parse_rows`: a name in code.
        let identifier = w.contains('_') && w.len() >= 6;
        if (digits >= 3 || path || identifier) && !w.starts_with("REDACTED") && !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

/// Whether `heading` starts a line of `text`.
fn has_heading(text: &str, heading: &str) -> bool {
    text.match_indices(heading)
        .any(|(at, _)| at == 0 || text.as_bytes()[at - 1] == b'\n')
}

/// A line that says something: not a heading, not blank, not "None.", with its list
/// marker removed.
fn content_line(line: &str) -> Option<&str> {
    let l = line.trim();
    if l.starts_with('#') {
        return None;
    }
    let l = l.trim_start_matches(['-', '*', '+']).trim_start();
    let l = l.trim_start_matches(|c: char| c.is_ascii_digit());
    let l = l.strip_prefix('.').unwrap_or(l).trim();
    let bare = l.trim_end_matches('.').trim();
    (!bare.is_empty() && !bare.eq_ignore_ascii_case("none") && !bare.eq_ignore_ascii_case("n/a"))
        .then_some(l)
}

/// Longest text before the first heading that is taken for a lead-in ("Here is the
/// checkpoint:") rather than content.
const LEAD_IN_MAX_CHARS: usize = 300;

/// Removes a short line of chatter before the first template heading.
fn drop_lead_in(text: &str) -> &str {
    match text.find("## ") {
        Some(at) if at > 0 && at <= LEAD_IN_MAX_CHARS && text[..at].ends_with('\n') => &text[at..],
        _ => text,
    }
}

/// Removes the engine's summary markers if the model copied them: a summary holding them
/// would be mistaken for the start or end of a summary in later requests.
fn drop_markers(text: &str) -> String {
    let marked = |t: &str| {
        [MARKER, END_MARKER, END_MARKER_SHORT]
            .iter()
            .any(|m| t.contains(m))
    };
    if !marked(text) {
        return text.to_string();
    }
    text.lines()
        .filter(|l| !marked(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Drops a leading `<think>...</think>` block, which some reasoning models put in the content.
fn strip_thinking(text: &str) -> &str {
    let t = text.trim_start();
    match t
        .strip_prefix("<think>")
        .and_then(|r| r.split_once("</think>"))
    {
        Some((_, rest)) => rest,
        None => text,
    }
}

/// Removes a code fence wrapping the whole answer (```` ```markdown ... ``` ````).
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(inner) = rest.trim_end().strip_suffix("```") else {
        return text;
    };
    match inner.split_once('\n') {
        // The opening line may name a language; a fence of a single line is no wrapper.
        Some((lang, body)) if !lang.contains(' ') => body,
        _ => text,
    }
}

fn is_refusal(text: &str) -> bool {
    if text.chars().count() > REFUSAL_MAX_CHARS || HEADINGS.iter().any(|h| text.contains(h)) {
        return false;
    }
    let lower = text.to_lowercase().replace(['\u{2019}', '\u{2018}'], "'");
    let opening = lower.trim_start_matches(|c: char| !c.is_alphanumeric());
    REFUSALS.iter().any(|r| opening.starts_with(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "## Active Task\nNone.\n\n## Goal\nShip release 2.4 of the billing service.\n\n## Completed Actions\n1. 2026-11-23: ran `cargo test` - 41 passed, 2 failed (parse_empty, parse_nested).";
    const INSTRUCTIONS: &str = "You are writing a checkpoint.\n## Active Task\nThe user's most recent request that has not been fulfilled yet.\n## Goal\nThe larger purpose behind the user's requests.\nThe user's latest messages are about: \"the deploy\".";

    fn check(text: &str) -> Result<String, AnswerProblem> {
        check_with(text, Some("stop"), 16)
    }

    fn check_with(text: &str, finish: Option<&str>, min: usize) -> Result<String, AnswerProblem> {
        let answer = StreamedAnswer {
            text: text.to_string(),
            finish_reason: finish.map(str::to_string),
            error: None,
            prompt_tokens: None,
        };
        let counter = Counter::for_model("gpt-4o");
        let expect = Expect {
            instructions: INSTRUCTIONS,
            min_tokens: min,
            counter: &counter,
        };
        check_answer(&answer, &expect)
    }

    #[test]
    fn every_reason_is_listed_for_the_metrics() {
        let problems = [
            AnswerProblem::Empty,
            AnswerProblem::Truncated,
            AnswerProblem::Refusal(String::new()),
            AnswerProblem::Unstructured(0),
            AnswerProblem::Echo,
            AnswerProblem::NoContent,
            AnswerProblem::TooShort { tokens: 0, min: 1 },
            AnswerProblem::DroppedFacts {
                section: String::new(),
                lost: String::new(),
            },
        ];
        let reasons: Vec<Rejection> = problems.iter().map(AnswerProblem::reason).collect();
        assert_eq!(reasons, Rejection::ALL);
    }

    #[test]
    fn accepts_a_checkpoint() {
        assert_eq!(check(GOOD).as_deref(), Ok(GOOD));
        assert_eq!(check(&format!("\n\n{GOOD}\n")).as_deref(), Ok(GOOD));
        assert_eq!(check_with(GOOD, None, 16).as_deref(), Ok(GOOD));
    }

    #[test]
    fn rejects_empty_answers() {
        for text in ["", "   \n\t", "```\n```", "<think>hmm</think>\n  "] {
            assert_eq!(check(text), Err(AnswerProblem::Empty), "{text:?}");
        }
    }

    #[test]
    fn rejects_an_answer_cut_by_its_cap() {
        assert_eq!(
            check_with(GOOD, Some("length"), 16),
            Err(AnswerProblem::Truncated)
        );
    }

    #[test]
    fn rejects_short_refusals() {
        for text in [
            "I can't help with that.",
            "I\u{2019}m sorry, but I cannot summarize this conversation.",
            "Sorry, but I won't do that.",
            "As an AI, I am unable to process this request.",
            "**I cannot comply with this request.**",
        ] {
            assert!(
                matches!(check(text), Err(AnswerProblem::Refusal(_))),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_checkpoint_quoting_a_refusal_is_not_one() {
        let text = format!("I cannot reproduce the token.\n\n{GOOD}");
        assert!(check(&text).is_ok());
    }

    #[test]
    fn rejects_answers_without_the_templates_structure() {
        for (text, found) in [
            ("The", 0),
            (
                "A plain paragraph about the work so far, with no headings at all.",
                0,
            ),
            (
                "## Goal\nShip release 2.4 of the billing service, all of it, today.",
                1,
            ),
            (
                "Notes\n### Goal\nShip it.\nText with ## Active Task inside a line.",
                0,
            ),
        ] {
            assert_eq!(
                check(text),
                Err(AnswerProblem::Unstructured(found)),
                "{text:?}"
            );
        }
    }

    #[test]
    fn rejects_answers_that_repeat_the_instructions_or_say_nothing() {
        let echo = "## Active Task\nThe user's most recent request that has not been fulfilled yet.\n## Goal\nThe user's latest messages are about: \"the deploy\".";
        assert_eq!(check(echo), Err(AnswerProblem::Echo));
        let empty = "## Active Task\nNone.\n\n## Goal\n- None\n## Blockers\nN/A";
        assert_eq!(check(empty), Err(AnswerProblem::NoContent));
        // Copying the turns' exact text is what a checkpoint should do.
        let quoting = format!("{GOOD}\n## Critical Values\nYou are writing a checkpoint.");
        assert!(check(&quoting).is_ok());
    }

    #[test]
    fn rejects_answers_too_short_for_what_they_replace() {
        let short = "## Active Task\nNone.\n## Goal\nShip 2.4.";
        assert!(matches!(
            check_with(short, Some("stop"), 40),
            Err(AnswerProblem::TooShort { min: 40, .. })
        ));
        assert!(check_with(GOOD, Some("stop"), 40).is_ok());
        assert_eq!(min_tokens(0, 1000), 16);
        assert_eq!(min_tokens(2_000, 1000), 36);
        assert_eq!(min_tokens(1_000_000, 12_000), 40);
        assert_eq!(min_tokens(1_000_000, 40), 20);
    }

    #[test]
    fn strips_fences_and_thinking() {
        assert_eq!(
            check(&format!("```markdown\n{GOOD}\n```")).as_deref(),
            Ok(GOOD)
        );
        assert_eq!(check(&format!("```\n{GOOD}\n```")).as_deref(), Ok(GOOD));
        assert_eq!(
            check(&format!("<think>plan</think>\n{GOOD}")).as_deref(),
            Ok(GOOD)
        );
    }

    #[test]
    fn drops_lead_ins_and_copied_markers() {
        let text = format!("Here is the updated checkpoint:\n\n{GOOD}");
        assert_eq!(check(&text).as_deref(), Ok(GOOD));
        for end in [END_MARKER, END_MARKER_SHORT] {
            let marked = format!("{MARKER}\n{GOOD}\n{end}");
            assert_eq!(check(&marked).as_deref(), Ok(GOOD));
            let only = format!("{MARKER}\n{end}");
            assert_eq!(check(&only), Err(AnswerProblem::Empty));
        }
    }

    const PREVIOUS: &str = "## Active Task\nFix the importer.\n\n## Constraints and Preferences\n- Never modify `config/prod_ws45.yaml`.\n\n## Completed Actions\n1. 2026-11-23: ran `make test` - 41 passed.\n\n## Key Decisions\n- Timestamps are stored as UTC in events_wv76.\n\n## Relevant Files\n- src/importer.py: the parser\n- reports/coverage_rv56/index.html";

    /// A mock summariser's update, checked as the call path checks it: the instructions
    /// of a real update request carry the previous checkpoint.
    fn check_update(update: &str) -> Result<String, AnswerProblem> {
        let counter = Counter::for_model("gpt-4o");
        let request = super::super::SummaryRequest::new("m", &[], 400, counter)
            .previous_summary(Some(PREVIOUS));
        let instructions = request.instructions();
        let expect = Expect {
            instructions: &instructions,
            min_tokens: 16,
            counter: &counter,
        };
        let answer = StreamedAnswer {
            text: update.to_string(),
            finish_reason: Some("stop".into()),
            error: None,
            prompt_tokens: None,
        };
        check_answer(&answer, &expect)
    }

    #[test]
    fn an_update_keeps_every_fact_of_the_previous_checkpoint() {
        // Carrying the previous checkpoint over word for word is what an update should
        // do, not an echo of the instructions.
        let kept =
            format!("{PREVIOUS}\n\n## In Progress\n- Rerunning the importer on 897150 rows.");
        assert!(check_update(&kept).is_ok(), "{:?}", check_update(&kept));
        let reworded = PREVIOUS.replace(
            "- src/importer.py: the parser",
            "- src/importer.py (parser, now fixed)",
        );
        assert!(check_update(&reworded).is_ok());
    }

    #[test]
    fn an_update_that_drops_a_section_or_a_fact_is_rejected() {
        // A mock summariser that forgets the Relevant Files section.
        let dropped = &PREVIOUS[..PREVIOUS.find("\n\n## Relevant Files").unwrap()];
        assert_eq!(
            check_update(dropped),
            Err(AnswerProblem::DroppedFacts {
                section: "Relevant Files".into(),
                lost: "## Relevant Files".into()
            })
        );
        // One that keeps the heading but loses a path under it.
        let lost = PREVIOUS.replace("\n- reports/coverage_rv56/index.html", "");
        assert!(matches!(
            check_update(&lost),
            Err(AnswerProblem::DroppedFacts { lost, .. }) if lost == "reports/coverage_rv56/index.html"
        ));
        // A constraint's code span, a decision's identifier.
        for fact in ["`config/prod_ws45.yaml`", "events_wv76"] {
            let lost = PREVIOUS.replace(fact, "the file");
            assert!(check_update(&lost).is_err(), "{fact}");
        }
        // State may change: a finished task leaves Active Task.
        let done = PREVIOUS.replace("Fix the importer.", "None.");
        assert!(check_update(&done).is_ok());
    }

    #[test]
    fn masks_echoed_secrets() {
        let text =
            format!("{GOOD}\n## Critical Values\nOPENAI_API_KEY=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t");
        let ok = check(&text).unwrap_or_default();
        assert!(ok.ends_with("OPENAI_API_KEY=[REDACTED:key]"), "{ok}");
    }
}
