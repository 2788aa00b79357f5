//! Pass 3: shrink old tool traffic outside the protected tail. Tool outputs dominate agent
//! transcripts, and an old one is usually only needed as a fact ("read X", "tests failed
//! with Y"), so it is replaced by a one-line description. Arguments of old calls (whole
//! files passed to write_file) are shortened without breaking their JSON.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde_json::Value;

use super::calls::{first_error_line, index_calls, result_info, PRUNED_ERROR, PRUNED_PREFIX};
use super::message::{clip, Message, Role};
use super::summary::has_marker;
use super::tokens::Counter;
use super::Options;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneStats {
    pub deduplicated: usize,
    pub summarized: usize,
    pub arguments: usize,
}

impl PruneStats {
    pub fn total(&self) -> usize {
        self.deduplicated + self.summarized + self.arguments
    }
}

/// Prunes tool results and call arguments in `messages[..end]`.
pub fn prune(
    messages: &mut [Message],
    end: usize,
    opts: &Options,
    counter: &Counter,
) -> PruneStats {
    let end = end.min(messages.len());
    let index = index_calls(messages);
    let mut stats = PruneStats::default();
    let duplicates = find_duplicates(messages, end, opts.prune_min_chars);
    for i in 0..end {
        if messages[i].role.is_result() {
            let line = {
                let text = messages[i].text();
                if text.len() <= opts.prune_min_chars || has_marker(&text) {
                    continue;
                }
                let label = result_info(messages, i, &index)
                    .map_or_else(|| "a tool".to_string(), |c| c.label());
                if duplicates.binary_search(&i).is_ok() {
                    format!(
                        "[duplicate output of {label}: identical to a later result, kept there]"
                    )
                } else {
                    describe_output(&label, &text)
                }
            };
            if replace_if_smaller(&mut messages[i], Value::String(line), counter) {
                if duplicates.binary_search(&i).is_ok() {
                    stats.deduplicated += 1;
                } else {
                    stats.summarized += 1;
                }
            }
        } else if messages[i].role == Role::Assistant {
            stats.arguments += shrink_call_arguments(&mut messages[i], opts.arg_max_chars, counter);
        }
    }
    stats
}

/// Results in `[..end]` whose text equals a later result's (anywhere, tail included),
/// ascending.
fn find_duplicates(messages: &[Message], end: usize, min_chars: usize) -> Vec<usize> {
    let mut newest: HashMap<u64, usize> = HashMap::new();
    let mut dups = Vec::new();
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
        match newest.get(&h.finish()) {
            Some(&j) if i < end && messages[j].text() == text => dups.push(i),
            Some(_) => {}
            None => {
                newest.insert(h.finish(), i);
            }
        }
    }
    dups.reverse();
    dups
}

/// One line that keeps what a later turn may need from an output: which call, how big,
/// and the first error it reported.
pub fn describe_output(label: &str, text: &str) -> String {
    let lines = text.bytes().filter(|&b| b == b'\n').count() + usize::from(!text.ends_with('\n'));
    let mut line = format!(
        "{PRUNED_PREFIX}{label} pruned by compaction: {} chars, {lines} lines",
        text.len()
    );
    if let Some(err) = first_error_line(text) {
        line.push_str(PRUNED_ERROR);
        line.push_str(&err);
    }
    line.push(']');
    line
}

fn replace_if_smaller(msg: &mut Message, content: Value, counter: &Counter) -> bool {
    let tokens = msg.tokens;
    let old = msg.body.insert("content".into(), content);
    msg.recount(counter);
    if msg.tokens < tokens {
        return true;
    }
    match old {
        Some(old) => msg.body.insert("content".into(), old),
        None => msg.body.shift_remove("content"),
    };
    msg.tokens = tokens;
    false
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
    use crate::compact::message::parse_test_messages;
    use crate::compact::tokens::Encoding;
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
        let stats = prune(&mut msgs, 4, &Options::default(), &c);
        assert_eq!(
            stats,
            PruneStats {
                deduplicated: 1,
                summarized: 1,
                arguments: 0
            }
        );
        assert!(msgs[2]
            .text()
            .starts_with("[duplicate output of read_file path=src/a.rs"));
        let line = msgs[3].text();
        assert!(line.contains("bash command=make"), "{line}");
        assert!(line.contains("3021 chars, 201 lines"), "{line}");
        assert!(line.contains("first error: error: linker failed"), "{line}");
        // The tail copy is untouched.
        assert_eq!(msgs[5].text(), big);
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
