//! Pass 3: shrink old tool traffic outside the protected tail. Tool outputs dominate agent
//! transcripts, and an old one is usually only needed as a fact ("read X", "tests failed
//! with Y"), so it is replaced by a one-line description. Arguments of old calls (whole
//! files passed to write_file) are shortened without breaking their JSON.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde_json::Value;

use super::calls::{index_calls, result_info, CallInfo};
use super::failing_lines::error_line;
use super::message::{clip, Message, Role};
use super::output_facts::output_facts;
use super::placeholders::{DUPLICATE_PREFIX, PRUNED_ERROR, PRUNED_PREFIX};
use super::summary::has_marker;
use super::tokens::Counter;
use super::Options;
use crate::units::Limit;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneStats {
    pub deduplicated: usize,
    pub summarized: usize,
    pub arguments: usize,
    /// Outputs only cut to their beginning and end: the last one pruned, when a line
    /// would have saved far more than needed.
    pub cut: usize,
}

impl PruneStats {
    pub fn total(&self) -> usize {
        self.deduplicated + self.summarized + self.arguments + self.cut
    }

    pub fn add(&mut self, other: PruneStats) {
        self.deduplicated += other.deduplicated;
        self.summarized += other.summarized;
        self.arguments += other.arguments;
        self.cut += other.cut;
    }

    fn count(&mut self, kind: OutputKind) {
        match kind {
            OutputKind::Duplicate => self.deduplicated += 1,
            OutputKind::Described => self.summarized += 1,
            OutputKind::Arguments => self.arguments += 1,
            OutputKind::Cut => self.cut += 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutputKind {
    Duplicate,
    Described,
    Arguments,
    Cut,
}

/// What pruning knows of a conversation: who made each call, and which result has an
/// identical later copy.
pub struct Pruner<'a> {
    opts: &'a Options,
    counter: &'a Counter,
    index: HashMap<String, CallInfo>,
    /// Result index -> index of the nearest later result with the same text.
    later_copy: HashMap<usize, usize>,
}

/// Pruned forms of some messages, oldest first, and the tokens they save.
pub struct Prunes {
    edits: Vec<(usize, Message, OutputKind)>,
    pub saved: usize,
}

impl Prunes {
    /// The oldest message pruned, `None` when none is: every message before it keeps its
    /// bytes.
    pub fn first(&self) -> Option<usize> {
        self.edits.first().map(|(i, _, _)| *i)
    }

    /// Puts the pruned forms in place.
    pub fn apply(self, messages: &mut [Message]) -> PruneStats {
        let mut stats = PruneStats::default();
        for (i, m, kind) in self.edits {
            messages[i] = m;
            stats.count(kind);
        }
        stats
    }
}

impl<'a> Pruner<'a> {
    pub fn new(messages: &[Message], opts: &'a Options, counter: &'a Counter) -> Pruner<'a> {
        Pruner {
            opts,
            counter,
            index: index_calls(messages),
            later_copy: later_copies(messages, opts.prune_min_chars),
        }
    }

    /// Prunes `range` oldest first until `over` tokens are saved (or the range ends).
    /// `verbatim(j)` says whether message `j` is sure to reach the model as it is: only
    /// then may an earlier copy of it become a pointer to it.
    pub fn oldest_first(
        &self,
        messages: &[Message],
        range: std::ops::Range<usize>,
        over: usize,
        verbatim: impl Fn(usize) -> bool,
    ) -> Prunes {
        self.until_saved(messages, range, Limit::At(over), verbatim)
    }

    /// Prunes every message of `range` that pruning shortens, each to its pruned form.
    pub fn all(
        &self,
        messages: &[Message],
        range: std::ops::Range<usize>,
        verbatim: impl Fn(usize) -> bool,
    ) -> Prunes {
        self.until_saved(messages, range, Limit::Unbounded, verbatim)
    }

    /// Prunes `range` oldest first until `wanted` tokens are saved: with no limit, all of
    /// it.
    fn until_saved(
        &self,
        messages: &[Message],
        range: std::ops::Range<usize>,
        wanted: Limit,
        verbatim: impl Fn(usize) -> bool,
    ) -> Prunes {
        let mut prunes = Prunes {
            edits: Vec::new(),
            saved: 0,
        };
        for i in range {
            let need = wanted.less(prunes.saved);
            if need == Limit::At(0) {
                break;
            }
            let Some((m, kind)) = self.pruned(messages, i, &verbatim) else {
                continue;
            };
            // The last message pruned gives up no more than is still needed, so the
            // result fills its budget rather than falling far below it (a copy kept
            // verbatim later is pointed to all the same: it says nothing new).
            let saving = messages[i].tokens.saturating_sub(m.tokens);
            let partial = match need {
                Limit::At(need) if saving > need && kind != OutputKind::Duplicate => {
                    self.partly(&messages[i], need)
                }
                _ => None,
            };
            let (m, kind) = partial.unwrap_or((m, kind));
            prunes.saved += messages[i].tokens.saturating_sub(m.tokens);
            prunes.edits.push((i, m, kind));
        }
        prunes
    }

    /// Prunes the newest messages of `range`: the shortest block of messages ending at the
    /// range's end whose pruning saves `over` tokens (or the whole range), every message in
    /// it. Every message before the block keeps its bytes, and with them the prefix the
    /// upstream's prompt cache holds from the last request; an event after this one finds
    /// this block already pruned and prunes the messages after it, extending what this one
    /// wrote instead of rewriting it. Within the block nothing is left whole or cut to
    /// what was still needed: from its first message on the request is a new prefix to
    /// the cache, pruned or not, and an output left whole there would be pruned by the next
    /// event, which would then start its rewrite at it.
    pub fn newest_block(
        &self,
        messages: &[Message],
        range: std::ops::Range<usize>,
        over: usize,
        verbatim: impl Fn(usize) -> bool,
    ) -> Prunes {
        let mut start = range.end;
        let mut saved = 0;
        while start > range.start && saved < over {
            start -= 1;
            if let Some((m, _)) = self.pruned(messages, start, &verbatim) {
                saved += messages[start].tokens.saturating_sub(m.tokens);
            }
        }
        self.all(messages, start..range.end, verbatim)
    }

    /// Prunes every message of `range` after the newest output an earlier compaction
    /// pruned, when that saves at least `settle`: the prefix up to that output, which the
    /// upstream's prompt cache has held since that compaction, keeps its bytes, and every
    /// message after it, new to the cache either way, is pruned (as in
    /// [`Pruner::newest_block`]). `None` when no output of the range was pruned before, or
    /// what came after it saves less than `settle`.
    pub fn since_pruned(
        &self,
        messages: &[Message],
        range: std::ops::Range<usize>,
        settle: usize,
        verbatim: impl Fn(usize) -> bool,
    ) -> Option<Prunes> {
        let start = range.start;
        let newest = messages[range.clone()].iter().rposition(was_pruned)? + start;
        let prunes = self.all(messages, newest + 1..range.end, verbatim);
        (prunes.saved >= settle && prunes.first().is_some()).then_some(prunes)
    }

    /// A form of `msg` about `need` tokens smaller: an output cut to its ends, or call
    /// arguments shortened no more than that takes.
    fn partly(&self, msg: &Message, need: usize) -> Option<(Message, OutputKind)> {
        if msg.role.is_result() {
            let mut m = msg.clone();
            return (super::cut::cut_to(&mut m, msg.tokens.saturating_sub(need), self.counter)
                && msg.tokens - m.tokens >= need)
                .then_some((m, OutputKind::Cut));
        }
        // The longest cap on argument strings that still saves `need`.
        let saves = |max: usize| {
            let mut m = msg.clone();
            shrink_call_arguments(&mut m, max, self.counter);
            (msg.tokens.saturating_sub(m.tokens) >= need).then_some(m)
        };
        let (mut lo, mut hi) = (self.opts.arg_max_chars, longest_argument(msg));
        let mut best = saves(lo)?;
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            match saves(mid) {
                Some(m) => {
                    best = m;
                    lo = mid;
                }
                None => hi = mid - 1,
            }
        }
        Some((best, OutputKind::Arguments))
    }

    /// The pruned form of `messages[i]` when it is smaller: a tool output becomes one line
    /// (or a pointer to its verbatim later copy), a call's long arguments are shortened.
    fn pruned(
        &self,
        messages: &[Message],
        i: usize,
        verbatim: &impl Fn(usize) -> bool,
    ) -> Option<(Message, OutputKind)> {
        let msg = &messages[i];
        if msg.role == Role::Assistant {
            let mut m = msg.clone();
            let changed = shrink_call_arguments(&mut m, self.opts.arg_max_chars, self.counter);
            return (changed > 0 && m.tokens < msg.tokens).then_some((m, OutputKind::Arguments));
        }
        if !msg.role.is_result() {
            return None;
        }
        let text = msg.text();
        if text.len() <= self.opts.prune_min_chars || has_marker(&text) {
            return None;
        }
        let label = result_info(messages, i, &self.index)
            .map_or_else(|| "a tool".to_string(), |c| c.label());
        let copy_kept = self.later_copy.get(&i).is_some_and(|&j| verbatim(j));
        let (line, kind) = if copy_kept {
            (
                format!("{DUPLICATE_PREFIX}{label}: identical to a later result, kept there]"),
                OutputKind::Duplicate,
            )
        } else {
            (describe_output(&label, &text), OutputKind::Described)
        };
        let mut m = msg.clone();
        m.set_content(Value::String(line), self.counter);
        (m.tokens < msg.tokens).then_some((m, kind))
    }
}

/// Whether `msg` is a tool output an earlier compaction pruned to one line.
fn was_pruned(msg: &Message) -> bool {
    msg.role.is_result() && {
        let text = msg.text();
        text.starts_with(PRUNED_PREFIX) || text.starts_with(DUPLICATE_PREFIX)
    }
}

/// Length of the arguments of the longest call a message makes: no string in them is
/// longer.
fn longest_argument(msg: &Message) -> usize {
    msg.tool_calls()
        .iter()
        .filter_map(|c| c.get("function")?.get("arguments")?.as_str())
        .chain(
            msg.function_call()
                .and_then(|f| f.get("arguments")?.as_str()),
        )
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// For each long result, the nearest later result with the same text.
fn later_copies(messages: &[Message], min_chars: usize) -> HashMap<usize, usize> {
    let mut newest: HashMap<u64, usize> = HashMap::new();
    let mut copies = HashMap::new();
    for i in (0..messages.len()).rev() {
        if !messages[i].role.is_result() {
            continue;
        }
        let text = messages[i].text();
        if text.len() <= min_chars {
            continue;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        if let Some(&j) = newest.get(&h.finish()) {
            if messages[j].text() == text {
                copies.insert(i, j);
            }
        }
        newest.insert(h.finish(), i);
    }
    copies
}

/// One line that keeps what a later turn may need from an output: which call, how big,
/// the files it wrote or reported, its quantities and identifiers (a few, see
/// [`output_facts`]), and the line that says what failed, if anything did. Its size in lines only: every
/// pruned output stays in the prompt for the rest of the session, and what the stubs add
/// up to decides how soon an event can no longer stop after the last one's and must
/// rewrite older history (a character count beside the lines said nothing more).
pub fn describe_output(label: &str, text: &str) -> String {
    let lines = text.bytes().filter(|&b| b == b'\n').count() + usize::from(!text.ends_with('\n'));
    let mut line = format!("{PRUNED_PREFIX}{label} pruned by compaction: {lines} lines");
    // Before the error: a later reader takes everything after the error's mark as the
    // error line ([`error_line`]).
    if let Some(facts) = output_facts(text) {
        line.push_str("; ");
        line.push_str(&facts);
    }
    if let Some(err) = error_line(text) {
        line.push_str(PRUNED_ERROR);
        line.push_str(&err);
    }
    line.push(']');
    line
}

/// Shortens long string values inside each call's JSON arguments; returns how many calls
/// changed. Arguments that are not JSON are left alone: a strict upstream accepted them as
/// they are, and cutting them could not make them any more valid.
pub fn shrink_call_arguments(msg: &mut Message, max_chars: usize, counter: &Counter) -> usize {
    let mut changed = 0;
    if let Some(Value::Array(calls)) = msg.body.get_mut("tool_calls") {
        for call in calls.iter_mut() {
            let f = match call.get_mut("function") {
                Some(f) => f,
                None => continue,
            };
            changed += usize::from(shrink_args_field(f, max_chars));
        }
    }
    if let Some(f) = msg.body.get_mut("function_call") {
        changed += usize::from(shrink_args_field(f, max_chars));
    }
    if changed > 0 {
        msg.recount(counter);
    }
    changed
}

fn shrink_args_field(f: &mut Value, max_chars: usize) -> bool {
    let Some(Value::String(args)) = f.get_mut("arguments") else {
        return false;
    };
    match shrink_json(args, max_chars) {
        Some(short) => {
            *args = short;
            true
        }
        None => false,
    }
}

/// `Some(shorter JSON text)` when the arguments parse and had long strings.
pub fn shrink_json(args: &str, max_chars: usize) -> Option<String> {
    if args.len() <= max_chars {
        return None;
    }
    let mut parsed: Value = serde_json::from_str(args).ok()?;
    if !shrink_strings(&mut parsed, max_chars) {
        return None;
    }
    let out = serde_json::to_string(&parsed).ok()?;
    (out.len() < args.len()).then_some(out)
}

fn shrink_strings(v: &mut Value, max: usize) -> bool {
    let mut changed = false;
    match v {
        Value::String(s) if s.len() > max + 40 => {
            // Masked first: the cut must not go through a secret.
            if let std::borrow::Cow::Owned(masked) = crate::redact::redact(s) {
                *s = masked;
            }
            let kept = clip(s, max);
            let cut = s.len() - kept.len();
            *s = format!("{kept}...[{cut} chars cut by compaction]");
            changed = true;
        }
        Value::Array(items) => {
            for item in items {
                changed |= shrink_strings(item, max);
            }
        }
        Value::Object(map) => {
            for item in map.values_mut() {
                changed |= shrink_strings(item, max);
            }
        }
        _ => {}
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::tokens::Encoding;
    use serde_json::json;

    fn parse(v: &Value) -> Vec<Message> {
        parse_test_messages(v)
    }

    fn call(id: &str, name: &str, args: Value) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
    }

    #[test]
    fn summarizes_and_deduplicates_old_outputs() {
        let big = "line of output\n".repeat(100);
        let failing = format!("{big}error: linker failed\n{big}");
        let input = json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [
                call("a", "read_file", json!({"path": "src/a.rs"})),
                call("b", "bash", json!({"command": "make"}))]},
            {"role": "tool", "tool_call_id": "a", "content": big},
            {"role": "tool", "tool_call_id": "b", "content": failing},
            {"role": "assistant", "content": null, "tool_calls": [call("c", "read_file", json!({"path": "src/a.rs"}))]},
            {"role": "tool", "tool_call_id": "c", "content": big},
            {"role": "user", "content": "thanks"},
        ]);
        let mut msgs = parse(&input);
        let c = Counter::new(Encoding::O200k);
        let opts = Options::default();
        let pruner = Pruner::new(&msgs, &opts, &c);
        let prunes = pruner.all(&msgs, 0..4, |j| j >= 4);
        let stats = prunes.apply(&mut msgs);
        assert_eq!(
            stats,
            PruneStats {
                deduplicated: 1,
                summarized: 1,
                arguments: 0,
                cut: 0
            }
        );
        assert!(msgs[2]
            .text()
            .starts_with("[duplicate output of read_file path=src/a.rs"));
        let line = msgs[3].text();
        assert!(line.contains("bash command=make"), "{line}");
        assert!(line.contains("pruned by compaction: 201 lines"), "{line}");
        assert!(line.contains("first error: error: linker failed"), "{line}");
        // The tail copy is untouched.
        assert_eq!(msgs[5].text(), big);
    }

    #[test]
    fn a_pointer_only_to_a_copy_that_stays_and_no_more_than_needed() {
        let big = "line of output\n".repeat(100);
        let input = json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [call("a", "bash", json!({"command": "ls"}))]},
            {"role": "tool", "tool_call_id": "a", "content": big},
            {"role": "assistant", "content": null, "tool_calls": [call("b", "bash", json!({"command": "ls"}))]},
            {"role": "tool", "tool_call_id": "b", "content": big},
            {"role": "assistant", "content": null, "tool_calls": [call("c", "bash", json!({"command": "ls"}))]},
            {"role": "tool", "tool_call_id": "c", "content": big},
        ]);
        let msgs = parse(&input);
        let c = Counter::new(Encoding::O200k);
        let opts = Options::default();
        let pruner = Pruner::new(&msgs, &opts, &c);
        // The copy at 4 may itself be pruned: the output at 2 is described, not pointed.
        let mut all = msgs.clone();
        pruner.all(&msgs, 0..5, |j| j >= 6).apply(&mut all);
        assert!(all[2]
            .text()
            .starts_with("[output of bash command=ls pruned"));
        assert!(all[4].text().starts_with("[duplicate output of bash"));
        // Pruning stops once enough is saved: the oldest goes first, and gives up no
        // more than needed.
        let mut some = msgs.clone();
        let prunes = pruner.oldest_first(&msgs, 0..5, 100, |j| j >= 6);
        assert!(prunes.saved >= 100);
        assert_eq!(prunes.apply(&mut some).cut, 1);
        assert!(some[2].text().contains("characters omitted by compaction"));
        assert!(msgs[2].tokens - some[2].tokens < 200);
        assert_eq!(some[4].text(), big);
    }

    #[test]
    fn the_newest_block_is_pruned_and_what_comes_before_it_keeps_its_bytes() {
        let outputs = |i: usize| format!("output line {i}\n").repeat(100);
        let mut input = vec![json!({"role": "user", "content": "go"})];
        for i in 0..6 {
            let id = format!("c{i}");
            input.push(json!({"role": "assistant", "content": null,
                "tool_calls": [call(&id, "bash", json!({"command": format!("step {i}")}))]}));
            input.push(json!({"role": "tool", "tool_call_id": id, "content": outputs(i)}));
        }
        let msgs = parse(&Value::Array(input));
        let c = Counter::new(Encoding::O200k);
        let opts = Options::default();
        let pruner = Pruner::new(&msgs, &opts, &c);
        let one = msgs[12].tokens - 40;
        let mut some = msgs.clone();
        let prunes = pruner.newest_block(&msgs, 0..13, 2 * one, |j| j >= 13);
        assert!(prunes.saved >= 2 * one);
        prunes.apply(&mut some);
        // The two newest outputs went, both whole to their line although the newer was
        // not all needed: after the first message changed, the cache reads nothing anyway.
        // Everything before them is as it was.
        let texts = |ms: &[Message]| ms.iter().map(|m| m.text().into_owned()).collect::<Vec<_>>();
        assert_eq!(texts(&some[..10]), texts(&msgs[..10]));
        assert!(some[10].text().starts_with("[output of bash"));
        assert!(some[12].text().starts_with("[output of bash"));
        // Asked for more than pruning can give, it prunes the whole range.
        let everything = msgs.iter().map(|m| m.tokens).sum();
        let mut all = msgs.clone();
        pruner
            .newest_block(&msgs, 0..13, everything, |j| j >= 13)
            .apply(&mut all);
        assert!((1..7).all(|i| all[2 * i].text().starts_with("[output of bash")));
    }

    #[test]
    fn an_event_settles_after_what_an_earlier_one_pruned() {
        let outputs = |i: usize| format!("output line {i}\n").repeat(100);
        let mut input = vec![json!({"role": "user", "content": "go"})];
        for i in 0..6 {
            let id = format!("c{i}");
            // The first three outputs were pruned by an earlier event.
            let content = if i < 3 {
                format!("[output of bash command=step {i} pruned by compaction: 100 lines]")
            } else {
                outputs(i)
            };
            input.push(json!({"role": "assistant", "content": null,
                "tool_calls": [call(&id, "bash", json!({"command": format!("step {i}")}))]}));
            input.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
        }
        let msgs = parse(&Value::Array(input));
        let c = Counter::new(Encoding::O200k);
        let opts = Options::default();
        let pruner = Pruner::new(&msgs, &opts, &c);
        let one = msgs[12].tokens - 40;
        // The three outputs since the earlier event save about three outputs' worth:
        // enough to settle for two, not for four; settling for two, it prunes all three.
        let prunes = pruner
            .since_pruned(&msgs, 0..13, 2 * one, |j| j >= 13)
            .expect("settled");
        assert_eq!(prunes.first(), Some(8));
        let mut some = msgs.clone();
        prunes.apply(&mut some);
        let texts = |ms: &[Message]| ms.iter().map(|m| m.text().into_owned()).collect::<Vec<_>>();
        assert_eq!(texts(&some[..8]), texts(&msgs[..8]));
        assert!((4..7).all(|i| some[2 * i].text().starts_with("[output of bash")));
        assert!(pruner
            .since_pruned(&msgs, 0..13, 4 * one, |j| j >= 13)
            .is_none());
        // Nothing pruned before: nothing to settle after.
        let fresh = parse(&json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [call("a", "bash", json!({"command": "ls"}))]},
            {"role": "tool", "tool_call_id": "a", "content": outputs(0)},
        ]));
        let pruner = Pruner::new(&fresh, &opts, &c);
        assert!(pruner.since_pruned(&fresh, 0..3, 1, |_| false).is_none());
    }

    /// A pruned output's stub keeps the facts a later turn may ask for, with its error
    /// line after them, where a later request's reader finds the error alone.
    #[test]
    fn a_stub_keeps_the_outputs_facts_and_its_error_line() {
        let noise = "building target 12 of many, nothing to report here\n".repeat(30);
        for (facts, error) in [
            (
                "HTML coverage report saved at reports/html/index.html",
                "fatal: unable to access remote: the requested URL returned error: 403",
            ),
            (
                "Stored the dataset snapshot under /srv/snap/2026-q3.tar.zst",
                "FAILED tests/test_io.py::test_roundtrip - OSError: disk quota exceeded",
            ),
            (
                "compile finished in 12.8s, binary at out/bin/agentd",
                "error: linker `cc` not found",
            ),
            (
                "pushed commit 9e01f3ab2 to the review branch",
                "npm ERR! missing script: lint-staged",
            ),
        ] {
            let text = format!("{noise}{facts}\n{noise}{error}\n{noise}");
            let stub = describe_output("bash command=make", &text);
            assert_eq!(error_line(&stub).as_deref(), Some(error), "{stub}");
            let kept = stub.split(PRUNED_ERROR).next().unwrap_or_default();
            let fact = facts
                .split_whitespace()
                .find(|w| w.contains('/') || w.contains("12.8s") || w.starts_with("9e01"))
                .unwrap_or_default()
                .trim_end_matches(',');
            assert!(kept.contains(fact), "{fact}: {stub}");
        }
        // An output with nothing to keep keeps its line as before.
        assert_eq!(
            describe_output("read_file path=a.txt", &noise),
            "[output of read_file path=a.txt pruned by compaction: 30 lines]"
        );
    }

    #[test]
    fn shrinks_arguments_without_breaking_json() {
        let body = "x".repeat(5000);
        let args = json!({"path": "a.txt", "content": body, "mode": 7}).to_string();
        let short = shrink_json(&args, 200).unwrap();
        let back: Value = serde_json::from_str(&short).unwrap();
        assert_eq!(back["path"], "a.txt");
        assert_eq!(back["mode"], 7);
        assert!(back["content"]
            .as_str()
            .unwrap()
            .ends_with("[4800 chars cut by compaction]"));
        // Key order survives the round trip.
        assert!(short.starts_with("{\"path\""));
        assert_eq!(
            shrink_json("not json at all".repeat(100).as_str(), 200),
            None
        );
        assert_eq!(shrink_json("{\"a\": 1}", 200), None);
    }
}
