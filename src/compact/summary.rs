//! Pass 5: the summary of the removed middle. This file holds the marker that makes a
//! summary recognisable in later requests, the wrapper that frames it as reference material,
//! and the deterministic summariser used when no LLM summary is available.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::calls::{index_calls, result_info, CallInfo};
use super::errors::error_line;
use super::message::{call_id, keep_ends, one_line, Message, Role};

/// First line of every summary the engine writes. Stable across versions: later requests
/// carry it back and it is how the previous summary is found.
pub const MARKER: &str = "[compaction-proxy: summary of earlier turns]";
/// Last line of every summary, so a model can tell where the digest stops when it shares a
/// message with real conversation text.
pub const END_MARKER: &str = "[end of summary; the conversation continues below]";

const PREAMBLE: &str = include_str!("summary_preamble.md");

const H_EARLIER: &str = "## Earlier summary";
const H_ASKS: &str = "## User requests, oldest first";
const H_TOOLS: &str = "## Tool calls made";
const H_FILES: &str = "## Files touched";
const H_ERRORS: &str = "## Errors seen";
const H_LAST: &str = "## Last turns before the cut";

/// Where a summary came from, for reports, headers and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummarySource {
    /// Written by an LLM.
    Llm,
    /// The deterministic digest.
    Fallback,
    /// Reused from an earlier compaction.
    Cache,
    /// The deterministic digest of an earlier compaction, reused: still a degraded
    /// summary, and reported as one.
    CachedFallback,
    /// No summary was needed.
    None,
}

impl SummarySource {
    pub fn as_str(self) -> &'static str {
        match self {
            SummarySource::Llm => "llm",
            SummarySource::Fallback => "fallback",
            SummarySource::Cache => "cache",
            SummarySource::CachedFallback => "cached-fallback",
            SummarySource::None => "none",
        }
    }
}

/// A summary body (without marker or framing) and its origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    pub source: SummarySource,
}

/// Whether a text holds a summary. Runs over every message of every compacted request,
/// hence the SIMD searcher built once.
pub fn has_marker(text: &str) -> bool {
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(MARKER));
    FINDER.find(text.as_bytes()).is_some()
}

/// The full message text for a summary body.
pub fn wrap(body: &str) -> String {
    format!(
        "{MARKER}\n{}\n{}\n\n{END_MARKER}",
        PREAMBLE.trim(),
        body.trim()
    )
}

/// Splits a text holding a summary into (summary body, the rest of the text).
pub fn extract(text: &str) -> Option<(String, String)> {
    let at = text.find(MARKER)?;
    let before = &text[..at];
    let after = &text[at + MARKER.len()..];
    let after = after.trim_start();
    let after = after.strip_prefix(PREAMBLE.trim()).unwrap_or(after);
    let (body, rest) = match after.find(END_MARKER) {
        Some(end) => (&after[..end], &after[end + END_MARKER.len()..]),
        None => (after, ""),
    };
    let rest = format!("{}\n\n{}", before.trim(), rest.trim());
    Some((body.trim().to_string(), rest.trim().to_string()))
}

/// Caps on each section of the deterministic digest.
const MAX_ASKS_FIRST: usize = 2;
const MAX_ASKS: usize = 10;
const MAX_TOOLS: usize = 30;
const MAX_FILES: usize = 40;
const MAX_ERRORS: usize = 10;
const LAST_TURNS: usize = 6;

/// The deterministic digest of `turns`, carrying `previous` forward, within about
/// `budget_chars` characters.
pub fn digest(previous: Option<&str>, turns: &[Message], budget_chars: usize) -> String {
    let mut s = Sections::from_previous(previous.unwrap_or(""));
    s.add_turns(turns);
    s.cap();
    s.fit(budget_chars);
    // The digest quotes the turns it replaces; what they held of secrets must not live on
    // in a summary that is stored and sent again on every later turn.
    crate::redact::redact(&s.render()).into_owned()
}

#[derive(Default)]
struct Sections {
    earlier: String,
    asks: Vec<String>,
    tools: Vec<(String, usize)>,
    files: Vec<String>,
    errors: Vec<String>,
    last: Vec<String>,
}

impl Sections {
    /// Reads a previous summary: our own sections are merged item by item; anything else
    /// (an LLM's summary, say) is carried whole as "earlier summary".
    fn from_previous(text: &str) -> Sections {
        let mut s = Sections::default();
        let mut current: Option<&str> = None;
        let mut earlier = Vec::new();
        for line in text.lines() {
            if line.starts_with("## ") {
                current = [H_EARLIER, H_ASKS, H_TOOLS, H_FILES, H_ERRORS, H_LAST]
                    .into_iter()
                    .find(|h| line.trim_end() == *h);
                if current.is_none() {
                    // Keep foreign headings, one level down so they never read as ours.
                    earlier.push(format!("#{line}"));
                }
                continue;
            }
            let item = line.strip_prefix("- ");
            match (current, item) {
                (Some(H_ASKS), Some(i)) => s.asks.push(i.to_string()),
                (Some(H_TOOLS), Some(i)) => s.tools.push(parse_count(i)),
                (Some(H_FILES), Some(i)) => s.files.push(i.to_string()),
                (Some(H_ERRORS), Some(i)) => s.errors.push(i.to_string()),
                (Some(H_LAST), Some(i)) => s.last.push(i.to_string()),
                (Some(H_LAST | H_ASKS | H_TOOLS | H_FILES | H_ERRORS), None) => {}
                _ => earlier.push(line.to_string()),
            }
        }
        s.earlier = earlier.join("\n").trim().to_string();
        s
    }

    fn add_turns(&mut self, turns: &[Message]) {
        let index = index_calls(turns);
        let mut seen = Seen::of(self);
        let mut last = Vec::new();
        for (i, m) in turns.iter().enumerate() {
            match m.role {
                Role::User => {
                    let text = m.text();
                    if !text.trim().is_empty() {
                        self.asks
                            .push(one_line(&keep_ends(text.trim(), 500, 200), 800));
                    }
                }
                Role::Assistant => self.add_calls(m, &mut seen),
                Role::Tool | Role::Function => {
                    if let Some(err) = error_line(&m.text()) {
                        let who = result_info(turns, i, &index)
                            .map_or_else(|| "tool".to_string(), |c| c.label());
                        let line = format!("{}: {err}", one_line(&who, 100));
                        if seen.errors.insert(line.clone()) {
                            self.errors.push(line);
                        }
                    }
                }
                _ => {}
            }
            if i + LAST_TURNS >= turns.len() {
                last.push(turn_line(m, turns, i, &index));
            }
        }
        if !last.is_empty() {
            self.last = last;
        }
    }

    fn add_calls(&mut self, m: &Message, seen: &mut Seen) {
        let infos = m
            .tool_calls()
            .iter()
            .map(CallInfo::from_call)
            .chain(m.function_call().map(|f| {
                super::calls::describe(
                    f.get("name").and_then(|v| v.as_str()).unwrap_or("function"),
                    f.get("arguments").and_then(|v| v.as_str()).unwrap_or(""),
                )
            }));
        for info in infos {
            let label = one_line(&info.label(), 160);
            match seen.tools.get(&label) {
                Some(&at) => self.tools[at].1 += 1,
                None => {
                    seen.tools.insert(label.clone(), self.tools.len());
                    self.tools.push((label, 1));
                }
            }
            for f in info.files {
                let f = one_line(&f, 200);
                if seen.files.insert(f.clone()) {
                    self.files.push(f);
                }
            }
        }
    }

    fn cap(&mut self) {
        if self.asks.len() > MAX_ASKS {
            let keep_last = MAX_ASKS - MAX_ASKS_FIRST;
            let cut = self.asks.len() - MAX_ASKS_FIRST - keep_last;
            self.asks.drain(MAX_ASKS_FIRST..MAX_ASKS_FIRST + cut);
        }
        keep_last(&mut self.tools, MAX_TOOLS);
        keep_last(&mut self.files, MAX_FILES);
        keep_last(&mut self.errors, MAX_ERRORS);
    }

    /// Drops the oldest items of the largest section until the digest fits.
    fn fit(&mut self, budget: usize) {
        if self.earlier.len() > budget / 2 {
            self.earlier = keep_ends(&self.earlier, budget / 4, budget / 4);
        }
        while self.render_len() > budget {
            let sizes = [
                self.asks.iter().map(String::len).sum::<usize>(),
                self.tools.iter().map(|t| t.0.len()).sum(),
                self.files.iter().map(String::len).sum(),
                self.errors.iter().map(String::len).sum(),
                self.last.iter().map(String::len).sum(),
            ];
            let Some((largest, _)) = sizes
                .iter()
                .enumerate()
                .filter(|(_, s)| **s > 0)
                .max_by_key(|(i, s)| (**s, std::cmp::Reverse(*i)))
            else {
                // Only the carried-over text is left.
                self.earlier = keep_ends(&self.earlier, budget / 3, budget / 3);
                return;
            };
            match largest {
                // The first request usually states the goal; drop later ones first.
                0 => {
                    let at = usize::from(self.asks.len() > 1);
                    self.asks.remove(at);
                }
                // The least used tool says the least about the session.
                1 => {
                    if let Some(at) = (0..self.tools.len()).min_by_key(|&i| self.tools[i].1) {
                        self.tools.remove(at);
                    }
                }
                2 => {
                    self.files.remove(0);
                }
                3 => {
                    self.errors.remove(0);
                }
                _ => {
                    self.last.remove(0);
                }
            }
        }
    }

    fn render_len(&self) -> usize {
        self.render().len()
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let mut section = |heading: &str, lines: Vec<String>| {
            if lines.is_empty() {
                return;
            }
            out.push_str(heading);
            out.push('\n');
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
            out.push('\n');
        };
        if !self.earlier.is_empty() {
            section(H_EARLIER, vec![self.earlier.clone()]);
        }
        let items = |v: &[String]| v.iter().map(|i| format!("- {i}")).collect::<Vec<_>>();
        section(H_ASKS, items(&self.asks));
        section(
            H_TOOLS,
            self.tools
                .iter()
                .map(|(l, n)| match n {
                    1 => format!("- {l}"),
                    n => format!("- {l} (x{n})"),
                })
                .collect(),
        );
        section(H_FILES, items(&self.files));
        section(H_ERRORS, items(&self.errors));
        section(H_LAST, items(&self.last));
        out.trim_end().to_string()
    }
}

fn parse_count(item: &str) -> (String, usize) {
    if let Some(open) = item.rfind(" (x") {
        if let Some(n) = item[open + 3..]
            .strip_suffix(')')
            .and_then(|n| n.parse().ok())
        {
            return (item[..open].to_string(), n);
        }
    }
    (item.to_string(), 1)
}

/// Lookup sets for the list sections while turns are added, so long sessions stay linear.
struct Seen {
    tools: HashMap<String, usize>,
    files: HashSet<String>,
    errors: HashSet<String>,
}

impl Seen {
    fn of(s: &Sections) -> Seen {
        Seen {
            tools: s
                .tools
                .iter()
                .enumerate()
                .map(|(i, (l, _))| (l.clone(), i))
                .collect(),
            files: s.files.iter().cloned().collect(),
            errors: s.errors.iter().cloned().collect(),
        }
    }
}

fn keep_last<T>(v: &mut Vec<T>, n: usize) {
    if v.len() > n {
        v.drain(..v.len() - n);
    }
}

fn turn_line(
    m: &Message,
    turns: &[Message],
    i: usize,
    index: &HashMap<String, CallInfo>,
) -> String {
    let text = one_line(&m.text(), 240);
    match m.role {
        Role::Assistant if m.makes_calls() => {
            let calls: Vec<String> = m
                .tool_calls()
                .iter()
                .map(|c| {
                    call_id(c)
                        .and_then(|id| index.get(id))
                        .map_or_else(|| CallInfo::from_call(c).label(), CallInfo::label)
                })
                .collect();
            let calls = one_line(&calls.join("; "), 240);
            if text.is_empty() {
                format!("assistant called: {calls}")
            } else {
                format!("assistant: {text} (called: {calls})")
            }
        }
        Role::Tool | Role::Function => {
            let who = result_info(turns, i, index).map_or_else(|| "tool".into(), |c| c.name);
            format!("{who} result: {text}")
        }
        r => format!("{}: {text}", r.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::message::parse_test_messages;
    use serde_json::{json, Value};

    fn parse(v: Value) -> Vec<Message> {
        parse_test_messages(&v)
    }

    fn session() -> Vec<Message> {
        parse(json!([
            {"role": "user", "content": "Fix the failing build in src/net.rs"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/net.rs\"}"}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"cargo build\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "pub fn connect() {}"},
            {"role": "tool", "tool_call_id": "b", "content": "error[E0425]: cannot find value `addr`"},
            {"role": "assistant", "content": "The variable is missing; adding it."},
        ]))
    }

    #[test]
    fn digest_lists_asks_tools_files_errors_and_last_turns() {
        let d = digest(None, &session(), 10_000);
        for needle in [
            "## User requests, oldest first\n- Fix the failing build in src/net.rs",
            "- read_file path=src/net.rs",
            "- bash command=cargo build",
            "## Files touched\n- src/net.rs",
            "- bash command=cargo build: error[E0425]: cannot find value `addr`",
            "- assistant: The variable is missing; adding it.",
        ] {
            assert!(d.contains(needle), "missing {needle:?} in\n{d}");
        }
    }

    #[test]
    fn wrapped_summary_round_trips_and_previous_state_merges() {
        let first = digest(None, &session(), 10_000);
        let wrapped = wrap(&first);
        assert!(wrapped.starts_with(MARKER) && wrapped.ends_with(END_MARKER));
        let merged = format!("{wrapped}\n\nplease continue");
        let (body, rest) = extract(&merged).unwrap();
        assert_eq!(body, first);
        assert_eq!(rest, "please continue");
        let more = parse(json!([{"role": "user", "content": "Now add a test"}]));
        let second = digest(Some(&body), &more, 10_000);
        assert!(second.contains("- Fix the failing build in src/net.rs\n- Now add a test"));
        assert!(second.contains("- read_file path=src/net.rs"));
        assert!(
            !second.contains(H_EARLIER),
            "our own format merges, not nests:\n{second}"
        );
        assert_eq!(
            digest(Some(&second), &[], 10_000),
            second,
            "carrying forward is stable"
        );
    }

    #[test]
    fn foreign_summaries_are_carried_and_budget_is_respected() {
        let d = digest(Some("## Active Task\nship it"), &session(), 10_000);
        assert!(
            d.starts_with("## Earlier summary\n### Active Task\nship it"),
            "{d}"
        );
        let tiny = digest(None, &session(), 200);
        assert!(tiny.len() <= 200, "{} chars:\n{tiny}", tiny.len());
        assert!(tiny.contains("Fix the failing build"));
    }
}
