//! Economy: fewer tokens on every request of a long tool session, not only near the
//! window. Agents send the same things again and again (a file read after each edit, the
//! same test run, a fetched document), and every later request carries all of it. This
//! pass shortens old tool outputs in place:
//!
//! - a repeat (an output identical to a later one) becomes a one-line pointer to the later
//!   call; a near repeat (a re-run with a few lines changed) keeps only the lines the later
//!   output lacks;
//! - past an age, an output is shortened by what it is: JSON keeps its shape with long
//!   arrays cut and counted, a log keeps its error, failure and warning lines with their
//!   neighbours and its summary, long text its beginning and end; the facts of what is cut
//!   (paths, error lines, ids, quantities) ride along.
//!
//! What is never touched: any message but a tool output, the latest copy of a repeated
//! output, the latest read of a file (a changed file's new text always reaches the model),
//! and the outputs of the latest `age` turns. Each shortened form is counted and dropped
//! when it saves too little to be worth a changed byte.
//!
//! Cache safety without state. A provider's prompt cache reads the longest prefix a
//! request shares with an earlier one, so an output must take its short form once and keep
//! it. The rule below decides it from the conversation alone, so every replica, and every
//! later request, decides it the same way:
//!
//! - turn `t` is the `t`-th assistant message with what follows it;
//! - replaying the conversation turn by turn, outputs are *settled* in batches: when the
//!   outputs of turns `(f, n - age]` (not yet settled, and at least `age` turns old at turn
//!   `n`) hold `batch_tokens` or more, they are settled and `f` becomes `n - age`;
//! - a settled output's form is decided from the outputs of turns up to `n` only.
//!
//! Turns up to `n` are the same bytes in every later request of the conversation, so a
//! form decided at `n` is the form of every later request, and the batches cut the
//! prefix only once per `batch_tokens` of settled outputs: each settling costs one cache
//! miss over the outputs after the batch's start. A stored decision would need a store on
//! the path of every request and would be lost with its replica; this rule needs neither.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::calls::{index_calls, result_info, CallInfo};
use super::failing_lines::{error_line, line_score};
use super::message::{clip, keep_ends, role_of, Message, Role};
use super::output_facts::output_facts;
use super::placeholders::{DUPLICATE_PREFIX, EARLIER_PREFIX, PRUNED_PREFIX, SHORTENED_PREFIX};
use super::tokens::Counter;

/// The knobs of [`economize`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EconomyOptions {
    /// Turns an output stays whole at least: the latest `age` turns are never touched.
    pub age: usize,
    /// Tokens of outputs settled together (see the module's comment): the larger, the
    /// fewer prefix changes and the later the savings.
    pub batch_tokens: usize,
}

impl Default for EconomyOptions {
    fn default() -> EconomyOptions {
        EconomyOptions {
            age: 4,
            batch_tokens: 16_000,
        }
    }
}

/// What [`economize`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EconomyStats {
    /// Tokens of the outputs it shortened, before and after.
    pub tokens_before: usize,
    pub tokens_after: usize,
    /// Outputs made pointers to a later identical copy.
    pub repeats: usize,
    /// Outputs cut to the lines a later near copy lacks.
    pub diffs: usize,
    /// Outputs shortened by their content (JSON, log, text).
    pub shaped: usize,
}

impl EconomyStats {
    pub fn saved(&self) -> usize {
        self.tokens_before.saturating_sub(self.tokens_after)
    }

    pub fn changed(&self) -> usize {
        self.repeats + self.diffs + self.shaped
    }

    fn add(&mut self, before: &Message, after: &Message, kind: Kind) {
        self.tokens_before += before.tokens;
        self.tokens_after += after.tokens;
        match kind {
            Kind::Repeat => self.repeats += 1,
            Kind::Diff => self.diffs += 1,
            Kind::Shaped => self.shaped += 1,
        }
    }
}

/// Outputs shorter than this are left as they are: a pointer would save little.
const MIN_CHARS: usize = 400;
/// A shortened form must save this many tokens, and a tenth of the output, to be used.
const MIN_SAVED: usize = 24;
/// A near copy shares at least this share of its lines, in percent.
const NEAR_PERCENT: usize = 60;
/// Later outputs an output is compared with for a near copy, at most.
const NEAR_CANDIDATES: usize = 8;
/// Lines a log must have before it is cut to its telling lines.
const LOG_LINES: usize = 20;
/// Items of a JSON array kept.
const JSON_ITEMS: usize = 2;
/// Characters of a JSON string kept.
const JSON_STRING: usize = 160;
/// Characters of a long text kept at its beginning and its end.
const TEXT_HEAD: usize = 1_200;
const TEXT_TAIL: usize = 600;

/// Shortens old tool outputs of `messages` in place (see the module's comment); no
/// message is added, removed or reordered, and only tool outputs change.
pub fn economize(
    messages: &mut [Message],
    opts: &EconomyOptions,
    counter: &Counter,
) -> EconomyStats {
    let mut stats = EconomyStats::default();
    for (i, m, kind) in edits(messages, opts, counter) {
        stats.add(&messages[i], &m, kind);
        messages[i] = m;
    }
    stats
}

/// The shortened form of each old output that gets one, by index, in order.
fn edits(
    messages: &[Message],
    opts: &EconomyOptions,
    counter: &Counter,
) -> Vec<(usize, Message, Kind)> {
    let turns = turns_of(messages);
    let total = turns.last().copied().unwrap_or(0);
    // What made each result, looked up once: the decisions below compare calls often.
    let index = index_calls(messages);
    let infos: Vec<Option<CallInfo>> = (0..messages.len())
        .map(|i| result_info(messages, i, &index))
        .collect();
    let results: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].role.is_result() && turns[i] > 0)
        .collect();
    // Each result's tokens per turn, the only sizes the schedule reads.
    let mut turn_tokens = vec![0usize; total + 1];
    for &i in &results {
        turn_tokens[turns[i]] += messages[i].tokens;
    }
    let mut settled = 0;
    let mut edits = Vec::new();
    for n in 1..=total {
        let Some(old) = n.checked_sub(opts.age) else {
            continue;
        };
        if old <= settled {
            continue;
        }
        let pending: usize = turn_tokens[settled + 1..=old].iter().sum();
        if pending < opts.batch_tokens.max(1) {
            continue;
        }
        let batch = Batch {
            messages,
            results: &results,
            turns: &turns,
            infos: &infos,
            counter,
            horizon: n,
        };
        for &i in results
            .iter()
            .filter(|&&i| turns[i] > settled && turns[i] <= old)
        {
            if let Some((m, kind)) = batch.decide(i) {
                edits.push((i, m, kind));
            }
        }
        settled = old;
    }
    edits
}

/// Economizes a chat-completions request (or a dialect's chat view) in place; `None` when
/// nothing changed.
pub fn economize_request(request: &mut Value, opts: &EconomyOptions) -> Option<EconomyStats> {
    let counter = Counter::for_request(request);
    let values = request.get_mut("messages")?.as_array_mut()?;
    let mut messages = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        // Only tool outputs are weighed and shortened: the rest go uncounted, which is
        // most of the work a request far below its window would otherwise cost.
        let role = role_of(i, v).ok()?;
        let tokens = match v.as_object() {
            Some(m) if role.is_result() => counter.message(m),
            _ => 0,
        };
        messages.push(Message::from_parts(role, v, tokens));
    }
    let edits = edits(&messages, opts, &counter);
    if edits.is_empty() {
        return None;
    }
    let mut stats = EconomyStats::default();
    for (i, m, kind) in edits {
        stats.add(&messages[i], &m, kind);
        values[i] = Value::Object(m.body);
    }
    Some(stats)
}

/// The turn of each message: the number of assistant messages up to it (0 before the
/// first).
fn turns_of(messages: &[Message]) -> Vec<usize> {
    let mut turn = 0;
    messages
        .iter()
        .map(|m| {
            turn += usize::from(m.role == Role::Assistant);
            turn
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Repeat,
    Diff,
    Shaped,
}

/// One settling: what its decisions may read.
struct Batch<'a> {
    messages: &'a [Message],
    results: &'a [usize],
    turns: &'a [usize],
    /// What made each message, for the results.
    infos: &'a [Option<CallInfo>],
    counter: &'a Counter,
    /// The last turn the decisions read.
    horizon: usize,
}

impl Batch<'_> {
    /// The results after `i` up to the horizon, latest first.
    fn later(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.results
            .iter()
            .rev()
            .copied()
            .filter(move |&j| j > i && self.turns[j] <= self.horizon)
    }

    fn decide(&self, i: usize) -> Option<(Message, Kind)> {
        let msg = &self.messages[i];
        let text = plain_text(msg)?;
        // An output already shortened, by an earlier compaction or by economy itself.
        let placeholders = [
            PRUNED_PREFIX,
            DUPLICATE_PREFIX,
            SHORTENED_PREFIX,
            EARLIER_PREFIX,
        ];
        if text.len() < MIN_CHARS || placeholders.iter().any(|p| text.starts_with(p)) {
            return None;
        }
        let info = self.infos[i].as_ref();
        let label = info.map_or_else(|| "a tool".into(), CallInfo::label);
        let (form, kind) = self.shorter(i, text, &label, info)?;
        let mut m = msg.clone();
        set_text(&mut m, form, self.counter);
        let saved = msg.tokens.saturating_sub(m.tokens);
        (saved >= MIN_SAVED && saved * 10 >= msg.tokens).then_some((m, kind))
    }

    fn shorter(
        &self,
        i: usize,
        text: &str,
        label: &str,
        info: Option<&CallInfo>,
    ) -> Option<(String, Kind)> {
        // The latest identical copy is the one kept.
        if let Some(j) = self
            .later(i)
            .find(|&j| plain_text(&self.messages[j]) == Some(text))
        {
            let line = format!(
                "{DUPLICATE_PREFIX}{label}: identical to the result of {}, kept there]",
                self.name_of(j)
            );
            return Some((line, Kind::Repeat));
        }
        // A near copy: the latest later output of the same call first, then any.
        // Only the first few are compared, so that a long session's decisions stay cheap.
        let same_call = |j: &usize| info.is_some() && self.infos[*j].as_ref() == info;
        let near = self
            .later(i)
            .filter(same_call)
            .chain(self.later(i))
            .take(NEAR_CANDIDATES)
            .find_map(|j| {
                let later = plain_text(&self.messages[j])?;
                diff_against(text, later).map(|d| (j, d))
            });
        if let Some((j, lines)) = near {
            return Some((self.diff_form(label, j, &lines), Kind::Diff));
        }
        // The latest read of a file is its text as the model knows it.
        let files = info.map_or(&[][..], |c| &c.files[..]);
        if !files.is_empty() && !self.read_again(i, files) && !looks_like_json(text) {
            return None;
        }
        shaped(text).map(|s| (format!("{SHORTENED_PREFIX}{label}]\n{s}"), Kind::Shaped))
    }

    /// Whether a later output up to the horizon comes from a call on one of `files`.
    fn read_again(&self, i: usize, files: &[String]) -> bool {
        self.later(i).any(|j| {
            self.infos[j]
                .as_ref()
                .is_some_and(|c| c.files.iter().any(|f| files.contains(f)))
        })
    }

    /// How a pointer names result `j`: its call's id and turn.
    fn name_of(&self, j: usize) -> String {
        let turn = self.turns[j];
        match self.messages[j].tool_call_id() {
            Some(id) => format!("call {} (turn {turn})", clip(id, 64)),
            None => format!("the call of turn {turn}"),
        }
    }

    fn diff_form(&self, label: &str, j: usize, diff: &Diff) -> String {
        let mut out = format!(
            "{EARLIER_PREFIX}{label}: the same as the result of {} but for these {} lines, which it lacks",
            self.name_of(j),
            diff.here.len()
        );
        if diff.there > 0 {
            out.push_str(&format!("; {} lines there are new", diff.there));
        }
        out.push_str("]\n");
        out.push_str(&diff.here.join("\n"));
        out
    }
}

/// The text of a tool output whose content is a string or a single text part.
fn plain_text(m: &Message) -> Option<&str> {
    match m.content()? {
        Value::String(s) => Some(s),
        Value::Array(parts) if parts.len() == 1 => super::message::part_text(&parts[0]),
        _ => None,
    }
}

/// Puts `text` where [`plain_text`] found the output's text.
fn set_text(m: &mut Message, text: String, counter: &Counter) {
    let content = match m.content() {
        Some(Value::Array(parts)) => {
            let mut part = parts[0].clone();
            part["text"] = Value::String(text);
            Value::Array(vec![part])
        }
        _ => Value::String(text),
    };
    m.set_content(content, counter);
}

/// How an output differs from a later near copy of it.
#[derive(Debug, PartialEq, Eq)]
struct Diff {
    /// Its lines the later copy lacks, in order.
    here: Vec<String>,
    /// How many lines of the later copy it lacks.
    there: usize,
}

/// The lines of `earlier` that `later` lacks, when the two share most of their lines.
fn diff_against(earlier: &str, later: &str) -> Option<Diff> {
    // Texts twice the other's size share too little to be near copies.
    if earlier.len() > 2 * later.len() || later.len() > 2 * earlier.len() {
        return None;
    }
    let mut theirs: HashMap<&str, usize> = HashMap::new();
    for line in later.lines() {
        *theirs.entry(line).or_default() += 1;
    }
    let mut here = Vec::new();
    let mut shared = 0;
    let mut total = 0;
    for line in earlier.lines() {
        total += 1;
        match theirs.get_mut(line) {
            Some(n) if *n > 0 => {
                *n -= 1;
                shared += 1;
            }
            _ => here.push(line.to_string()),
        }
    }
    let there: usize = theirs.values().sum();
    let later_total = later.lines().count();
    let near = total >= 4
        && shared * 100 >= total * NEAR_PERCENT
        && shared * 100 >= later_total * NEAR_PERCENT;
    near.then_some(Diff { here, there })
}

fn looks_like_json(text: &str) -> bool {
    let t = text.trim_start();
    (t.starts_with('{') || t.starts_with('['))
        && serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object() || v.is_array())
}

/// A shorter form of an old output by what it is, or `None` when none is known.
fn shaped(text: &str) -> Option<String> {
    if let Ok(v @ (Value::Object(_) | Value::Array(_))) = serde_json::from_str::<Value>(text) {
        return serde_json::to_string(&json_shape(&v)).ok();
    }
    if let Some(log) = log_lines(text) {
        return Some(log);
    }
    let cut = keep_ends(text, TEXT_HEAD, TEXT_TAIL);
    if cut.len() >= text.len() {
        return None;
    }
    // What the middle said that a later turn may need.
    let middle = middle_of(text, TEXT_HEAD, TEXT_TAIL);
    Some(with_facts(cut, middle))
}

/// JSON with every array cut to its first items and a count of the rest, and long strings
/// to their beginning: the keys, the nesting and the sizes stay.
fn json_shape(v: &Value) -> Value {
    match v {
        Value::Array(items) if items.len() > JSON_ITEMS + 1 => {
            let mut kept: Vec<Value> = items[..JSON_ITEMS].iter().map(json_shape).collect();
            kept.push(Value::String(format!(
                "... {} more items ({} in all)",
                items.len() - JSON_ITEMS,
                items.len()
            )));
            Value::Array(kept)
        }
        Value::Array(items) => Value::Array(items.iter().map(json_shape).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), json_shape(v)))
                .collect(),
        ),
        Value::String(s) if s.len() > JSON_STRING + 40 => Value::String(format!(
            "{}... ({} characters)",
            clip(s, JSON_STRING),
            s.len()
        )),
        other => other.clone(),
    }
}

/// Words that make a log line worth keeping besides the error finder's.
fn telling(line: &str) -> bool {
    if line_score(line) >= 2 {
        return true;
    }
    let lower = line.to_ascii_lowercase();
    ["error", "fail", "warn", "panic", "exception", "fatal"]
        .iter()
        .any(|w| lower.contains(w))
}

/// A summary line: how many passed, failed, took.
fn summary_line(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.contains("passed")
        || lower.contains("test result")
        || lower.contains("tests run")
        || lower.contains("finished")
        || lower.contains("total")
}

/// A log's first lines, its telling lines with a line either side, and its summary (the
/// last lines), with counts of what was left out; `None` when the text is not a long log
/// with anything telling.
fn log_lines(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() < LOG_LINES {
        return None;
    }
    let mut keep = vec![false; lines.len()];
    let mut any = false;
    for (i, line) in lines.iter().enumerate() {
        if telling(line) {
            any = true;
            let end = (i + 2).min(lines.len());
            keep[i.saturating_sub(1)..end].fill(true);
        } else if summary_line(line) {
            any = true;
            keep[i] = true;
        }
    }
    if !any {
        return None;
    }
    for k in keep.iter_mut().take(2) {
        *k = true;
    }
    for k in keep.iter_mut().rev().take(2) {
        *k = true;
    }
    let mut out = String::new();
    let mut skipped = 0;
    for (line, kept) in lines.iter().zip(&keep) {
        if *kept {
            if skipped > 0 {
                out.push_str(&format!("[... {skipped} lines ...]\n"));
                skipped = 0;
            }
            out.push_str(&crate::redact::redact(line));
            out.push('\n');
        } else {
            skipped += 1;
        }
    }
    Some(out)
}

/// The part of `text` that `keep_ends(text, head, tail)` leaves out, roughly.
fn middle_of(text: &str, head: usize, tail: usize) -> &str {
    let start = clip(text, head).len();
    let end = text.len().saturating_sub(tail).max(start);
    let mut end = end;
    while !text.is_char_boundary(end) {
        end += 1;
    }
    &text[start..end]
}

/// `cut` with the facts and the error line of `middle`, which it left out.
fn with_facts(mut cut: String, middle: &str) -> String {
    let mut seen = HashSet::new();
    let mut notes = Vec::new();
    if let Some(e) = error_line(middle) {
        seen.insert(e.clone());
        notes.push(format!("error: {e}"));
    }
    if let Some(f) = output_facts(middle) {
        if seen.insert(f.clone()) {
            notes.push(f);
        }
    }
    if !notes.is_empty() {
        cut.push_str(&format!("\n[in the part left out: {}]", notes.join("; ")));
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::tokens::Encoding;
    use crate::engine::validate;
    use proptest::prelude::*;
    use serde_json::json;

    fn opts(age: usize, batch_tokens: usize) -> EconomyOptions {
        EconomyOptions { age, batch_tokens }
    }

    fn call(id: &str, name: &str, args: Value) -> Value {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function",
             "function": {"name": name, "arguments": args.to_string()}}]})
    }

    fn result(id: &str, text: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": text})
    }

    fn source(version: usize) -> String {
        (0..60)
            .map(|i| format!("fn item_{i}() -> u32 {{ {} }}\n", i * version))
            .collect()
    }

    /// A conversation of read/answer turns: each `outputs[k]` is the result of turn k+1.
    fn session(calls: &[(&str, Value, String)]) -> Vec<Value> {
        let mut v = vec![
            json!({"role": "system", "content": "You are a coding agent."}),
            json!({"role": "user", "content": "Fix the bug."}),
        ];
        for (k, (name, args, out)) in calls.iter().enumerate() {
            let id = format!("call_{k}");
            v.push(call(&id, name, args.clone()));
            v.push(result(&id, out));
        }
        v
    }

    fn run(v: &[Value], o: EconomyOptions) -> (Vec<Message>, EconomyStats) {
        let mut m = parse_test_messages(&Value::Array(v.to_vec()));
        let counter = Counter::new(Encoding::O200k);
        let stats = economize(&mut m, &o, &counter);
        (m, stats)
    }

    #[test]
    fn an_output_repeated_later_points_to_the_later_copy() {
        let read = || ("read_file", json!({"path": "src/a.rs"}), source(1));
        let other = || ("bash", json!({"command": "ls"}), "a\nb\n".to_string());
        let v = session(&[read(), other(), read(), other(), other(), other(), other()]);
        let (m, stats) = run(&v, opts(2, 1));
        assert_eq!(stats.repeats, 1, "{stats:?}");
        let first = m[3].text();
        assert!(first.starts_with(DUPLICATE_PREFIX), "{first}");
        assert!(first.contains("call_2 (turn 3)"), "{first}");
        // The later copy stays whole.
        assert_eq!(m[7].text(), source(1));
    }

    #[test]
    fn a_changed_file_keeps_only_what_differs_and_its_new_text_reaches_the_model() {
        let mut edited = source(1);
        edited = edited.replace("fn item_7() -> u32 { 7 }", "fn item_7() -> u32 { 700 }");
        let noise = || ("bash", json!({"command": "ls"}), "a\n".to_string());
        let v = session(&[
            ("read_file", json!({"path": "src/a.rs"}), source(1)),
            noise(),
            ("read_file", json!({"path": "src/a.rs"}), edited.clone()),
            noise(),
            noise(),
            noise(),
        ]);
        let (m, stats) = run(&v, opts(2, 1));
        assert_eq!(stats.diffs, 1, "{stats:?}");
        let old = m[3].text();
        assert!(old.contains("fn item_7() -> u32 { 7 }"), "{old}");
        assert!(!old.contains("item_8"), "{old}");
        assert_eq!(m[7].text(), edited);
    }

    #[test]
    fn the_latest_read_of_a_file_stays_whole() {
        let noise = || ("bash", json!({"command": "ls"}), "a\n".to_string());
        let mut calls = vec![("read_file", json!({"path": "src/a.rs"}), source(1))];
        calls.extend((0..8).map(|_| noise()));
        let (m, stats) = run(&session(&calls), opts(2, 1));
        assert_eq!(stats.changed(), 0);
        assert_eq!(m[3].text(), source(1));
    }

    #[test]
    fn old_json_keeps_its_shape_and_counts() {
        let items: Vec<Value> = (0..40)
            .map(|i| json!({"id": i, "name": format!("item {i}"), "size": "12 MB"}))
            .collect();
        let doc = serde_json::to_string_pretty(&json!({"total": 40, "items": items})).unwrap();
        let noise = || ("bash", json!({"command": "ls"}), "a\n".to_string());
        let mut calls = vec![("fetch", json!({"url": "https://x/api"}), doc)];
        calls.extend((0..4).map(|_| noise()));
        let (m, stats) = run(&session(&calls), opts(2, 1));
        assert_eq!(stats.shaped, 1);
        let text = m[3].text();
        let body = text.split_once('\n').unwrap().1;
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["total"], 40);
        assert_eq!(v["items"].as_array().unwrap().len(), 3);
        assert_eq!(v["items"][2], "... 38 more items (40 in all)");
    }

    #[test]
    fn an_old_log_keeps_failures_warnings_and_its_summary() {
        let mut log: Vec<String> = (0..80).map(|i| format!("test case_{i} ... ok")).collect();
        log[30] = "test case_30 ... FAILED".into();
        log[31] = "thread 'case_30' panicked at src/lib.rs:42:5".into();
        log[50] = "warning: unused variable `x` in src/b.rs".into();
        log.push("test result: FAILED. 79 passed; 1 failed; finished in 2.31s".into());
        let log = log.join("\n");
        let noise = || ("bash", json!({"command": "ls"}), "a\n".to_string());
        let mut calls = vec![("bash", json!({"command": "cargo test"}), log)];
        calls.extend((0..4).map(|_| noise()));
        let (m, stats) = run(&session(&calls), opts(2, 1));
        assert_eq!(stats.shaped, 1);
        let t = m[3].text();
        for kept in [
            "case_30 ... FAILED",
            "src/lib.rs:42:5",
            "unused variable",
            "79 passed; 1 failed",
        ] {
            assert!(t.contains(kept), "{kept} lost: {t}");
        }
        assert!(!t.contains("case_10 ... ok"), "{t}");
        // A later compaction that prunes it still finds its error.
        let error = error_line(&t).unwrap_or_default();
        assert!(error.contains("case_30"), "{error}");
    }

    #[test]
    fn long_text_keeps_its_ends_and_the_facts_of_its_middle() {
        let mut page: Vec<String> = (0..200)
            .map(|i| format!("Paragraph {i} of prose about nothing much at all."))
            .collect();
        page[100] = "The artefact was written to build/out/report.xml".into();
        let page = page.join("\n");
        let noise = || ("bash", json!({"command": "ls"}), "a\n".to_string());
        let mut calls = vec![("fetch", json!({"url": "https://x/doc"}), page)];
        calls.extend((0..4).map(|_| noise()));
        let (m, stats) = run(&session(&calls), opts(2, 1));
        assert_eq!(stats.shaped, 1);
        let t = m[3].text();
        assert!(
            t.contains("Paragraph 0 ") && t.contains("Paragraph 199 "),
            "{t}"
        );
        assert!(t.contains("build/out/report.xml"), "{t}");
    }

    #[test]
    fn nothing_is_touched_before_a_batch_fills() {
        let read = || ("read_file", json!({"path": "src/a.rs"}), source(1));
        let v = session(&[read(), read(), read(), read(), read()]);
        let (_, stats) = run(&v, opts(2, 1_000_000));
        assert_eq!(stats.changed(), 0);
    }

    // --- the property: any valid conversation in, a valid one out, decided once --------

    /// Outputs from a small pool, so that repeats and near repeats are common.
    fn pool(k: u8) -> String {
        match k % 6 {
            0 => source(1),
            1 => source(2),
            2 => serde_json::to_string(&json!({"rows": (0..30).collect::<Vec<_>>()})).unwrap(),
            3 => (0..40)
                .map(|i| format!("line {i}: error[E{i}] failed at src/m.rs:{i}"))
                .collect::<Vec<_>>()
                .join("\n"),
            4 => "short".into(),
            _ => "word ".repeat(600),
        }
    }

    fn conversation(turns: &[(u8, u8, bool)]) -> Vec<Value> {
        let mut v = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "task"}),
        ];
        for (t, &(a, b, user)) in turns.iter().enumerate() {
            let (x, y) = (format!("c{t}a"), format!("c{t}b"));
            v.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": x, "type": "function", "function": {"name": "read_file",
                  "arguments": json!({"path": format!("f{}", a % 3)}).to_string()}},
                {"id": y, "type": "function", "function": {"name": "bash",
                  "arguments": "{\"command\":\"make\"}"}}]}));
            v.push(result(&x, &pool(a)));
            v.push(result(&y, &pool(b)));
            if user {
                v.push(json!({"role": "assistant", "content": "ok"}));
                v.push(json!({"role": "user", "content": "go on"}));
            }
        }
        v
    }

    proptest! {
        #[test]
        fn any_valid_conversation_stays_valid_and_each_form_is_decided_once(
            turns in prop::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..14),
            age in 1usize..4,
            batch in 1usize..3000,
        ) {
            let v = conversation(&turns);
            validate::validate_strict(&v).unwrap();
            let o = opts(age, batch);
            let mut earlier: Option<Vec<Value>> = None;
            // Every request of the conversation: each prefix ending with a turn's results.
            let ends: Vec<usize> = (1..=v.len())
                .filter(|&e| e > 2 && (e == v.len() || v[e]["role"] == "assistant"))
                .collect();
            for end in ends {
                let (m, _) = run(&v[..end], o);
                let out: Vec<Value> = m.iter().map(|m| Value::Object(m.body.clone())).collect();
                prop_assert!(validate::validate_strict(&out).is_ok());
                prop_assert_eq!(out.len(), end);
                let last = v[..end].iter().rposition(|m| m["role"] == "assistant").unwrap();
                for i in 0..end {
                    prop_assert_eq!(&out[i]["role"], &v[i]["role"]);
                    prop_assert_eq!(&out[i]["tool_call_id"], &v[i]["tool_call_id"]);
                    if v[i]["role"] != "tool" || i >= last {
                        prop_assert_eq!(&out[i], &v[i]);
                    }
                }
                // Cache safety: a message's form changes at most once, from whole to
                // short, and then stays.
                if let Some(before) = &earlier {
                    for (i, b) in before.iter().enumerate() {
                        prop_assert!(b == &out[i] || b == &v[i], "messages[{}] changed twice", i);
                    }
                }
                earlier = Some(out);
            }
        }
    }
}
