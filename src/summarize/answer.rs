//! Checking what the summariser wrote before it replaces anyone's turns.

use crate::compact::{END_MARKER, MARKER};
use crate::redact::redact;

/// Why a summariser's answer cannot be used; the caller falls back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerProblem {
    #[error("the summariser returned an empty answer")]
    Empty,
    #[error("the summariser refused: {0}")]
    Refusal(String),
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

/// Headings of the template; one of them in the answer means it followed the template.
const HEADINGS: &[&str] = &["## Active Task", "## Goal", "## Completed Actions"];

/// The usable checkpoint in a summariser's answer: reasoning blocks, a fence around the whole
/// answer, a lead-in line and copied summary markers removed; secrets masked again in case
/// the model echoed one. Rejects empty
/// answers and refusals (short, without the template's headings, opening like a refusal).
pub fn check_answer(text: &str) -> Result<String, AnswerProblem> {
    let unmarked = drop_markers(text);
    let text = strip_fence(strip_thinking(&unmarked).trim()).trim();
    if text.is_empty() {
        return Err(AnswerProblem::Empty);
    }
    if is_refusal(text) {
        return Err(AnswerProblem::Refusal(crate::compact::message::one_line(
            text, 120,
        )));
    }
    Ok(redact(drop_lead_in(text).trim()).into_owned())
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
    if !text.contains(MARKER) && !text.contains(END_MARKER) {
        return text.to_string();
    }
    text.lines()
        .filter(|l| !l.contains(MARKER) && !l.contains(END_MARKER))
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

    const GOOD: &str = "## Active Task\nNone.\n\n## Goal\nShip it.";

    #[test]
    fn accepts_a_checkpoint() {
        assert_eq!(check_answer(GOOD).as_deref(), Ok(GOOD));
        assert_eq!(check_answer(&format!("\n\n{GOOD}\n")).as_deref(), Ok(GOOD));
    }

    #[test]
    fn rejects_empty_answers() {
        for text in ["", "   \n\t", "```\n```", "<think>hmm</think>\n  "] {
            assert_eq!(check_answer(text), Err(AnswerProblem::Empty), "{text:?}");
        }
    }

    #[test]
    fn rejects_short_refusals() {
        for text in [
            "I can't help with that.",
            "I’m sorry, but I cannot summarize this conversation.",
            "Sorry, but I won't do that.",
            "As an AI, I am unable to process this request.",
            "**I cannot comply with this request.**",
        ] {
            assert!(
                matches!(check_answer(text), Err(AnswerProblem::Refusal(_))),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_checkpoint_quoting_a_refusal_is_not_one() {
        let text = "I cannot reproduce the token.\n\n## Active Task\nNone.";
        assert!(check_answer(text).is_ok());
        let long = format!("I'm sorry for the delay. {}", "Detail. ".repeat(100));
        assert!(check_answer(&long).is_ok());
    }

    #[test]
    fn strips_fences_and_thinking() {
        assert_eq!(
            check_answer(&format!("```markdown\n{GOOD}\n```")).as_deref(),
            Ok(GOOD)
        );
        assert_eq!(
            check_answer(&format!("```\n{GOOD}\n```")).as_deref(),
            Ok(GOOD)
        );
        assert_eq!(
            check_answer(&format!("<think>plan</think>\n{GOOD}")).as_deref(),
            Ok(GOOD)
        );
        let inline = "```code``` and more";
        assert_eq!(check_answer(inline).as_deref(), Ok(inline));
    }

    #[test]
    fn drops_lead_ins_and_copied_markers() {
        let text = format!("Here is the updated checkpoint:\n\n{GOOD}");
        assert_eq!(check_answer(&text).as_deref(), Ok(GOOD));
        let marked = format!("{MARKER}\n{GOOD}\n{END_MARKER}");
        assert_eq!(check_answer(&marked).as_deref(), Ok(GOOD));
        let only = format!("{MARKER}\n{END_MARKER}");
        assert_eq!(check_answer(&only), Err(AnswerProblem::Empty));
        let no_headings = "A plain paragraph about the work so far, with no headings at all.";
        assert_eq!(check_answer(no_headings).as_deref(), Ok(no_headings));
    }

    #[test]
    fn masks_echoed_secrets() {
        let text =
            format!("{GOOD}\n## Critical Values\nOPENAI_API_KEY=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t");
        let ok = check_answer(&text).unwrap_or_default();
        assert!(ok.ends_with("OPENAI_API_KEY=[REDACTED:key]"), "{ok}");
    }
}
