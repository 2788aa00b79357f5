//! Cutting a kept message to a size without losing what a continuing model needs from
//! it. [`Message::cut_to`] keeps a text's beginning and end; a fact in the middle (a
//! user's constraint joined to an observation, an error line, the path of a report, a
//! decision) would go with the rest. Here the lines that state such facts are kept too,
//! between the two ends; a task's beginning is never shorter than [`OPENING_CHARS`]: its
//! first lines say what the work is.
//!
//! Secrets are masked before anything is cut (a cut through a key would keep part of it
//! and drop the prefix the redactor knows it by).

use serde_json::Value;

use super::commitment;
use super::decision::decision;
use super::failing_lines::line_score;
use super::message::{clip, clip_end, one_line, Message, Role};
use super::products;
use super::quantity::{self, Amount};
use super::scan;
use super::tokens::Counter;
use crate::redact::redact;

/// The beginning of a cut text is at least this long (when the text is).
pub const OPENING_CHARS: usize = 300;
/// A line longer than this is also read sentence by sentence.
const LONG_LINE: usize = 120;
/// Longest fact line kept from the cut part.
const FACT_LINE_CHARS: usize = 400;

/// Shortens `msg` to about `tokens`, keeping its facts; whether it got smaller. Content
/// other than a single string falls back to [`Message::cut_to`].
pub fn cut_to(msg: &mut Message, tokens: usize, counter: &Counter) -> bool {
    cut_keeping(msg, tokens, 0, counter)
}

/// [`cut_to`] for the task: its first [`OPENING_CHARS`] stay, at the cost of the target.
pub fn cut_task(msg: &mut Message, tokens: usize, counter: &Counter) -> bool {
    cut_keeping(msg, tokens, OPENING_CHARS + 64, counter)
}

/// [`cut_to`], never keeping fewer than `least` characters.
pub fn cut_keeping(msg: &mut Message, tokens: usize, least: usize, counter: &Counter) -> bool {
    let before = msg.tokens;
    if before <= tokens {
        return false;
    }
    let Some(Value::String(original)) = msg.content().cloned() else {
        return msg.cut_to(tokens, counter);
    };
    let original = redact(&original).into_owned();
    let chars = original.len();
    if chars == 0 {
        return false;
    }
    // Text and tokens shrink in about the same proportion; further tries correct for the
    // framing and what the note and the kept lines add.
    let mut keep = (chars.saturating_mul(tokens) / before.max(1)).max(least);
    let writer = if msg.role == Role::Assistant {
        Writer::Agent
    } else {
        Writer::Other
    };
    // The task keeps its opening whole: its first lines say what the work is.
    let opening = if least > 0 {
        Opening::Task
    } else {
        Opening::Short
    };
    for _ in 0..4 {
        msg.set_content(
            Value::String(keep_facts_by(&original, keep, writer, opening)),
            counter,
        );
        if msg.tokens <= tokens || keep <= least {
            break;
        }
        keep = (keep.saturating_mul(tokens) / msg.tokens.max(1)).max(least);
    }
    msg.tokens < before
}

/// `msg` down to its first `chars` characters (after leading blank space), the lines of
/// the rest that set a rule or bound the work by a number within `rules` characters (one
/// the user added in a message joined to it: the digest ranks a rule above all else), and
/// a note of the cut: what states the work when nothing else of the task has room.
/// Whether it got smaller.
pub fn cut_to_opening(msg: &mut Message, chars: usize, rules: usize, counter: &Counter) -> bool {
    let Some(Value::String(original)) = msg.content().cloned() else {
        return false;
    };
    let masked = redact(&original);
    let lead = masked.len() - masked.trim_start().len();
    let end = masked[lead..]
        .char_indices()
        .nth(chars)
        .map_or(masked.len(), |(at, _)| lead + at);
    let rest = &masked[end..];
    let rule = |score, line: &str| score == RULE || quantity::amount(line) == Some(Amount::Limit);
    let kept: Vec<String> = fact_lines(rest, rest.len(), rules, Writer::Other, rule)
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    let shown: usize = kept.iter().map(String::len).sum();
    let cut = rest.len().saturating_sub(shown);
    let mut shorter = format!(
        "{}\n[... {cut} characters omitted by compaction ...]",
        &masked[..end]
    );
    for line in kept {
        shorter.push('\n');
        shorter.push_str(&line);
    }
    if shorter.len() >= original.len() {
        return false;
    }
    let before = msg.tokens;
    msg.set_content(Value::String(shorter), counter);
    if msg.tokens < before {
        return true;
    }
    msg.set_content(Value::String(original), counter);
    false
}

/// `text` in about `keep` characters: its beginning, the lines of the part left out that
/// state facts (as many as half of `keep` holds, the most telling first, written in their
/// order), a note of what was cut, and its end.
pub fn keep_facts(text: &str, keep: usize) -> String {
    keep_facts_by(text, keep, Writer::Other, Opening::Short)
}

/// How much of a cut text's beginning stays before its facts are chosen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// The task's: [`OPENING_CHARS`], and a third of the room for the facts of the rest.
    Task,
    /// Any other text's: a quarter of the room, and half for the facts of the rest. A
    /// pasted channel's first lines are chatter as often as not, and a rule said in its
    /// middle lost to them (the beginning grows back into room the facts leave).
    Short,
}

/// Who wrote a text being cut, which says how its decisions are told.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Writer {
    /// The agent: its own sentences state what it chose, read by how they are built
    /// ([`commitment::commits`]) as well as by their phrases.
    Agent,
    /// A tool, a pasted page: a sentence there decides only by its phrases (a structure
    /// read in a log's line, "retiring for good", decides nothing).
    Other,
    /// A person's own words, read as [`Writer::Other`]'s, and where no reading finds a
    /// fact, a sentence that names something (a number, a file, an identifier, a name)
    /// still outranks their chatter: a rule or a limit said in words no reading knows
    /// names what it is about.
    Person,
}

/// [`keep_facts`] for a text `writer` wrote.
fn keep_facts_by(text: &str, keep: usize, writer: Writer, how: Opening) -> String {
    if text.len() <= keep + 64 {
        return text.to_string();
    }
    let (opening, room) = match how {
        Opening::Task => (OPENING_CHARS.min(keep - keep / 6), keep / 3),
        Opening::Short => (OPENING_CHARS.min(keep / 4), keep / 2),
    };
    let opening = clip(text, opening).len();
    let b = kept_end(text, opening, keep / 6, writer);
    let middle_end = text.len() - b.len();
    let facts = fact_lines(
        &text[opening..],
        middle_end - opening,
        room,
        writer,
        |_, _| true,
    );
    let facts_len: usize = facts.iter().map(|(_, l)| l.len() + 1).sum();
    let head = keep
        .saturating_sub(b.len() + facts_len)
        .max(opening)
        .min(middle_end);
    let a = clip(text, head);
    // Facts the beginning now holds are not repeated.
    let facts: Vec<&String> = facts
        .iter()
        .filter(|(at, _)| opening + at >= a.len())
        .map(|(_, l)| l)
        .collect();
    let shown: usize = facts.iter().map(|l| l.len()).sum();
    let cut = (middle_end - a.len()).saturating_sub(shown);
    let mut out = String::with_capacity(keep + 128);
    out.push_str(a);
    out.push_str(&format!(
        "\n[... {cut} characters omitted by compaction ...]\n"
    ));
    for line in &facts {
        out.push_str(line);
        out.push('\n');
    }
    if !facts.is_empty() && !b.is_empty() {
        out.push_str("[...]\n");
    }
    out.push_str(b);
    out
}

/// The last `about` characters of `text` after `opening`, starting where a line does:
/// when they would start inside a line that states a fact, from that line's start (cut
/// there, "Wrote build/reports/x" and "/index.html" would each say nothing); inside a
/// line of nothing, from its start when little of it is missing, else from the next
/// line's ("he output to the chat? y" is no line the tool wrote). Only a fact's line
/// makes it much longer than `about`: a cut sized to fit stays about its size.
fn kept_end(text: &str, opening: usize, about: usize, writer: Writer) -> &str {
    let b = clip_end(&text[opening..], about);
    let start = text.len() - b.len();
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    if line_start == start || line_start <= opening {
        return b;
    }
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[line_start..line_end].trim();
    let fact = line_end - line_start <= FACT_LINE_CHARS && fact_score(line, writer) > 0;
    if fact || start - line_start <= about / 2 {
        &text[line_start..]
    } else if line_end < text.len() {
        &text[line_end + 1..]
    } else {
        b
    }
}

/// The lines of `text` starting before `before` that state facts, within `room`
/// characters, with where each starts: a rule the user set, an error that names what
/// failed, a file an output says it wrote, a decision. Ranked by how much they say;
/// returned in their order in the text.
fn fact_lines(
    text: &str,
    before: usize,
    room: usize,
    writer: Writer,
    wanted: impl Fn(u8, &str) -> bool,
) -> Vec<(usize, String)> {
    let mut found: Vec<(u8, usize, String)> = Vec::new();
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if at >= before {
            break;
        }
        let start = at;
        at += line.len();
        let t = undecorated(line);
        if t.len() < 8 || scan::is_numbered_line(line) || is_cut_note(t) {
            continue;
        }
        let score = fact_score(t, writer);
        if score > 0 && wanted(score, t) {
            found.push((score, start, one_line(t, FACT_LINE_CHARS)));
        }
        // A long line's sentences may be kept alone when the line does not fit.
        if t.len() > LONG_LINE {
            for sentence in scan::sentences(t) {
                let score = fact_score(sentence, writer);
                if score > 0 && wanted(score, sentence) && sentence.len() < t.len() {
                    found.push((score, start, one_line(sentence, FACT_LINE_CHARS)));
                }
            }
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    let mut used = 0;
    let mut kept: Vec<(usize, String)> = Vec::new();
    for (_, start, line) in found {
        // A sentence of a line already kept adds nothing.
        let said = kept
            .iter()
            .any(|(at, l)| *at == start && l.contains(line.as_str()));
        if said || used + line.len() + 1 > room {
            continue;
        }
        used += line.len() + 1;
        kept.push((start, line));
    }
    kept.sort();
    kept
}

/// A line without the rules drawn around it (`===== 25 passed in 1.41s =====`, `--- FAIL
/// ---`): runs of three or more of one mark, which say nothing in a line kept alone.
fn undecorated(line: &str) -> &str {
    let t = line.trim();
    let t = t[rule_len(t.bytes())..].trim_start();
    t[..t.len() - rule_len(t.bytes().rev())].trim_end()
}

/// The length of the run of one mark (`=`, `-`, `*`, `#`, `~`, `_`) that `bytes` open
/// with, when it is three long or more; else 0.
fn rule_len(mut bytes: impl Iterator<Item = u8>) -> usize {
    let Some(mark) = bytes.next().filter(|b| b"=-*#~_".contains(b)) else {
        return 0;
    };
    let run = 1 + bytes.take_while(|&b| b == mark).count();
    if run >= 3 {
        run
    } else {
        0
    }
}

/// Whether `line` is the note of an earlier cut: its "600 characters" is no fact of the
/// text's, and keeping it as one would keep a cut text from getting any smaller.
fn is_cut_note(line: &str) -> bool {
    line.starts_with("[... ") && line.ends_with(" characters omitted by compaction ...]")
}

/// The lines of `text` that state facts, within `room` characters, in their order: what
/// to keep of a text that has room for little else.
pub fn facts_within(text: &str, room: usize) -> Vec<String> {
    lines_within(text, room, Writer::Other)
}

/// [`facts_within`] for a person's own words ([`Writer::Person`]).
pub fn said_within(text: &str, room: usize) -> Vec<String> {
    lines_within(text, room, Writer::Person)
}

fn lines_within(text: &str, room: usize, writer: Writer) -> Vec<String> {
    fact_lines(text, text.len(), room, writer, |_, _| true)
        .into_iter()
        .map(|(_, l)| l)
        .collect()
}

/// The score of a line that sets a rule.
const RULE: u8 = 5;

/// How much a line says that a model could not get back: 0 nothing.
fn fact_score(line: &str, writer: Writer) -> u8 {
    let error = line_score(line);
    if error >= 4 {
        return 6;
    }
    if scan::is_constraint(line) && line.split_whitespace().count() >= 4 {
        return RULE;
    }
    if products::reports_path(line) {
        return 4;
    }
    let amount = quantity::amount(line);
    // By its phrases only but in the agent's own text: a line of an output or a pasted
    // page is no sentence of the agent's, and a structure read there ("retiring for
    // good") would take the room of a rule or a number.
    let decides = match writer {
        Writer::Agent => decision(line).chooses(),
        Writer::Other | Writer::Person => scan::phrased_decision(line) == Some(true),
    };
    if decides || amount == Some(Amount::Limit) {
        return 3;
    }
    if error >= 2 || amount == Some(Amount::Measure) {
        return 2;
    }
    // A count or an id: four digits or more in a row; in a person's words, anything named.
    u8::from(
        amount == Some(Amount::Count)
            || (writer == Writer::Person && commitment::names_something(line)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_the_opening_and_the_facts_of_its_middle() {
        let filler: String = (0..200).map(|i| format!("listing line {i}\n")).collect();
        let text = format!(
            "Fix the flaky importer in the nightly job.\n{filler}Never modify config/prod.yaml; ops deploys it.\n{filler}Wrote reports/run_7/index.html\n{filler}KeyError: 'tenant_9'\n{filler}the end"
        );
        let cut = keep_facts(&text, 1200);
        assert!(cut.len() < 1600, "{}", cut.len());
        assert!(cut.starts_with("Fix the flaky importer"));
        for fact in [
            "Never modify config/prod.yaml",
            "reports/run_7/index.html",
            "KeyError: 'tenant_9'",
        ] {
            assert!(cut.contains(fact), "{fact} missing from\n{cut}");
        }
        assert!(cut.ends_with("the end"));
    }

    #[test]
    fn a_rule_in_the_middle_of_a_pasted_channel_outlasts_its_chatter() {
        let chatter = [
            "morning all",
            "anyone seen the flaky deploy on staging?",
            "lunch at noon?",
            "the runner restarted, ci is green",
        ];
        let line = |i: usize, said: &str| format!("[9:{:02}] sam: {said}\n", 10 + i);
        let mut text = String::from("pasting the channel for context:\n");
        for i in 0..6 {
            text.push_str(&line(i, chatter[i % 4]));
        }
        text.push_str(&line(
            6,
            "Changes to charts/values.yaml need approval from the SRE on call.",
        ));
        for i in 7..12 {
            text.push_str(&line(i, chatter[i % 4]));
        }
        text.push_str("anyway, carry on.");
        // About a third of the text: before, the opening took most of it and the rule,
        // a line longer than the third left to facts, was cut.
        let cut = keep_facts(&text, text.len() / 3);
        assert!(cut.len() < text.len() / 2, "{}", cut.len());
        assert!(cut.contains("need approval from the SRE on call"), "{cut}");
        assert!(cut.starts_with("pasting the channel"), "{cut}");
        // The task keeps its opening whole, at the facts' cost.
        let counter = Counter::new(crate::engine::tokens::Encoding::O200k);
        let v = serde_json::json!({"role": "user", "content": text});
        let mut task = Message::parse(0, &v, &counter).unwrap();
        cut_task(&mut task, 100, &counter);
        assert!(task.text().starts_with(&text[..OPENING_CHARS]));
    }

    #[test]
    fn an_agents_message_cut_keeps_what_it_chose_in_any_wording() {
        let c = Counter::new(super::super::tokens::Encoding::O200k);
        let filler: String = (0..60)
            .map(|i| format!("Step {i} of the walkthrough reads the next part of the log.\n"))
            .collect();
        for choice in [
            "Every upload now goes through `blob_gateway` rather than the old bucket.",
            "The worker pool stays on rayon_pool_3 from here on.",
            "serde_yaml gets swapped out for toml_edit in the loader.",
            "Pinning grpcio to 1.62 for the whole service.",
        ] {
            let text = format!(
                "Looking at the failures now.\n{filler}{choice}\n{filler}That is all for now."
            );
            let cut = |role: &str| {
                let body = match role {
                    "tool" => {
                        serde_json::json!({"role": role, "tool_call_id": "c1", "content": text})
                    }
                    _ => serde_json::json!({"role": role, "content": text}),
                };
                let mut m = Message::parse(0, &body, &c).unwrap_or_else(|e| panic!("{e}"));
                let quarter = m.tokens / 4;
                assert!(cut_to(&mut m, quarter, &c));
                m.text().contains(choice)
            };
            assert!(cut("assistant"), "{choice}");
            // The same sentence in a tool's output is not the agent's choice, unless a
            // phrase says it decides.
            let phrased = scan::phrased_decision(choice) == Some(true);
            assert_eq!(cut("tool"), phrased, "{choice}");
        }
    }

    #[test]
    fn a_fact_line_running_into_the_kept_end_is_kept_whole() {
        let filler: String = (0..100).map(|i| format!("listing line {i}\n")).collect();
        let path = "build/reports/tests_ys96/test/index.html";
        let text = format!("{filler}Wrote {path}");
        // The kept end (a sixth of what is kept) starts inside the fact's line.
        for keep in [120, 200, 240, 270] {
            assert!(keep / 6 < "Wrote ".len() + path.len());
            let cut = keep_facts(&text, keep);
            assert!(cut.contains(path), "{keep}: {cut}");
        }
    }

    #[test]
    fn the_kept_end_starts_where_a_line_does() {
        let filler: String = (0..100)
            .map(|i| format!("tests/test_{i:03}.py ........ [{i:3}%]\n"))
            .collect();
        let long = "x".repeat(300);
        for tail in [
            "===== 25 passed in 1.41s =====\nAdd the output to the chat? y".to_string(),
            format!("{long}\nAdd the output to the chat? y"),
        ] {
            let text = format!("{filler}{tail}");
            for keep in [120, 200, 240, 270, 400] {
                let cut = keep_facts(&text, keep);
                // What follows the note of the cut (or the facts kept from it).
                let end = cut
                    .rsplit(['\n'])
                    .take_while(|l| !l.starts_with("[..."))
                    .count();
                let end: Vec<&str> = cut.lines().rev().take(end).collect();
                let first = end.last().copied().unwrap_or_default();
                assert!(text.lines().any(|l| l == first), "{keep}: {first:?}\n{cut}");
                assert!(cut.ends_with("Add the output to the chat? y"), "{cut}");
            }
        }
    }

    #[test]
    fn a_summary_line_is_kept_without_the_rules_drawn_around_it() {
        for (progress, summary) in [
            (
                "tests/test_{i:03}.py ........ [{i:3}%]",
                "============ 25 passed, 2 skipped in 1.41s ============",
            ),
            (
                "test parser::case_{i} ... ok (took {i} ms)",
                "test result: ok. 120 passed; 0 failed; finished in 3.2s",
            ),
            (
                "step {i}: loss 0.{i:03}",
                "---- Training done: 120 steps, total 14.5 min ----",
            ),
            (
                "PASS src/case_{i}.test.ts (12 ms)",
                "Tests:       120 passed, 120 total",
            ),
        ] {
            let lines: String = (0..120)
                .map(|i| {
                    progress
                        .replace("{i:03}", &format!("{i:03}"))
                        .replace("{i:3}", &format!("{i:3}"))
                        .replace("{i}", &i.to_string())
                        + "\n"
                })
                .collect();
            let text = format!(
                "run started\n{lines}{summary}\n{}",
                "trailing note\n".repeat(20)
            );
            let cut = keep_facts(&text, 200);
            let bare = undecorated(summary);
            assert!(cut.contains(&format!("\n{bare}\n")), "{summary}\n{cut}");
        }
        assert_eq!(
            undecorated("  --- FAIL: TestParse (0.01s) ---  "),
            "FAIL: TestParse (0.01s)"
        );
        assert_eq!(undecorated("- a list item"), "- a list item");
        assert_eq!(undecorated("========"), "");
    }

    #[test]
    fn a_task_cut_to_its_opening_keeps_the_rules_joined_to_it() {
        let c = Counter::new(super::super::tokens::Encoding::O200k);
        let task = format!(
            "\n  Port the importer to the queue API. {}",
            "Background on the importer. ".repeat(30)
        );
        let rule = "Quick note: never modify config/prod_7.yaml; ops deploys it by hand.";
        let limit = "Heads up, the partner API takes at most 40 calls an hour.";
        let text = format!("{task}\nKeyError: 'tenant_9'\n\n{rule} Carry on.\n\n{limit}");
        let mut m = Message::parse(0, &serde_json::json!({"role": "user", "content": text}), &c)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cut_to_opening(&mut m, 60, 200, &c));
        let out = m.text();
        let opening: String = task.trim_start().chars().take(60).collect();
        assert!(out.starts_with(&format!("\n  {opening}\n[... ")), "{out}");
        assert!(out.contains(rule), "{out}");
        assert!(out.contains(limit), "{out}");
        // The note of an earlier cut is no limit of the text's: cut again, it goes.
        let note = "[... 600 characters omitted by compaction ...]";
        assert_eq!(
            fact_lines(note, note.len(), 200, Writer::Other, |_, _| true),
            vec![]
        );
        // Only rules and limits: the rest of the task's own lines go.
        assert!(!out.contains("KeyError"), "{out}");
        // No room for rules: the opening and the note alone.
        let mut m = Message::parse(0, &serde_json::json!({"role": "user", "content": text}), &c)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cut_to_opening(&mut m, 60, 0, &c));
        assert!(m.text().ends_with("characters omitted by compaction ...]"));
        // A key the cut would go through is masked first.
        let key = "sk-proj-Rrts0lHcijTHTqAzheh5Blf8saLp5ZN6lE7iag0Jy7lhmjWP";
        let text = format!("{}{key} {}", "a ".repeat(20), "b ".repeat(200));
        let mut m = Message::parse(0, &serde_json::json!({"role": "user", "content": text}), &c)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cut_to_opening(&mut m, 60, 200, &c));
        let out = m.text();
        assert!(
            (0..key.len() - 11).all(|i| !out.contains(&key[i..i + 12])),
            "{out}"
        );
        // A text no longer than its opening and the note is left as it was.
        let mut m = Message::parse(
            0,
            &serde_json::json!({"role": "user", "content": "short task"}),
            &c,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!cut_to_opening(&mut m, 60, 200, &c));
        assert_eq!(m.text(), "short task");
    }

    #[test]
    fn a_secret_is_masked_before_the_cut() {
        let key = "sk-proj-Rrts0lHcijTHTqAzheh5Blf8saLp5ZN6lE7iag0Jy7lhmjWP";
        let text = format!(
            "{}the key is {key} ok\n{}",
            "a ".repeat(200),
            "b ".repeat(400)
        );
        let c = Counter::new(super::super::tokens::Encoding::O200k);
        let mut m = Message::parse(0, &serde_json::json!({"role": "user", "content": text}), &c)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cut_to(&mut m, 60, &c));
        let out = m.text();
        for i in 0..key.len() - 11 {
            assert!(!out.contains(&key[i..i + 12]), "{out}");
        }
    }
}
