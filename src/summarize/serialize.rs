//! The turns as the summariser reads them: one labelled block per message, secrets masked,
//! long parts cut to their head and tail with the lines that state facts in between
//! (errors, the user's rules, written files, decisions: [`keep_facts`]).

use std::collections::HashMap;

use serde_json::Value;

use crate::engine::cut::keep_facts;
use crate::engine::message::{call_id, call_name_args, is_media_part, keep_ends, Message, Role};
use crate::engine::Counter;
use crate::redact::redact;
use crate::units::Limit;

/// Tool output kept per result, head and tail in bytes: enough for a stack trace's top and
/// a command's final status line.
const RESULT_HEAD: usize = 4000;
const RESULT_TAIL: usize = 1500;
/// Tool-call arguments kept per call.
const ARGS_HEAD: usize = 1200;
const ARGS_TAIL: usize = 300;
/// User and assistant text kept per message; a pasted log should not crowd out the rest.
const TEXT_HEAD: usize = 12_000;
const TEXT_TAIL: usize = 4000;
/// Blocks are joined by a blank line.
const SEPARATOR: &str = "\n\n";

/// Serialises `turns` into labelled, redacted blocks, one per message.
pub fn blocks(turns: &[Message]) -> Vec<String> {
    let names = call_names(turns);
    turns.iter().map(|m| block(m, &names)).collect()
}

/// The blocks joined, cut further (largest blocks first) if their tokens exceed `limit`.
pub fn joined(turns: &[Message], limit: Limit, counter: &Counter) -> String {
    fit(blocks(turns), limit, counter).join(SEPARATOR)
}

/// Tokens one block adds to the joined text.
pub fn block_tokens(block: &str, counter: &Counter) -> usize {
    counter.text(block) + 1
}

/// Function names by call id, so a result can say which tool produced it.
fn call_names(turns: &[Message]) -> HashMap<&str, &str> {
    turns
        .iter()
        .flat_map(|m| m.tool_calls())
        .filter_map(|c| Some((call_id(c)?, call_name_args(c).0)))
        .collect()
}

fn block(m: &Message, names: &HashMap<&str, &str>) -> String {
    let mut out = label(m, names);
    let text = m.text();
    let text = redact(&text);
    let cut = if m.role.is_result() {
        keep_facts(&text, RESULT_HEAD + RESULT_TAIL)
    } else {
        keep_facts(&text, TEXT_HEAD + TEXT_TAIL)
    };
    if !cut.trim().is_empty() {
        out.push('\n');
        out.push_str(cut.trim_end());
    }
    let media = media_parts(m);
    if media > 0 {
        out.push_str(&format!("\n[{media} attachment(s) not shown]"));
    }
    for call in m.tool_calls() {
        let (name, args) = call_name_args(call);
        out.push_str(&call_line(name, call_id(call), args));
    }
    if let Some(f) = m.function_call() {
        let name = f.get("name").and_then(Value::as_str).unwrap_or("function");
        let args = f.get("arguments").and_then(Value::as_str).unwrap_or("");
        out.push_str(&call_line(name, None, args));
    }
    out
}

fn label(m: &Message, names: &HashMap<&str, &str>) -> String {
    let id = m.tool_call_id();
    match m.role {
        Role::Tool | Role::Function => {
            let name = id
                .and_then(|id| names.get(id).copied())
                .or(m.name())
                .unwrap_or("tool");
            match id {
                Some(id) => format!("[tool result: {name} #{id}]"),
                None => format!("[tool result: {name}]"),
            }
        }
        role => match m.name() {
            Some(name) => format!("[{} {name}]", role.as_str()),
            None => format!("[{}]", role.as_str()),
        },
    }
}

fn call_line(name: &str, id: Option<&str>, args: &str) -> String {
    let args = redact(args);
    let args = keep_ends(args.trim(), ARGS_HEAD, ARGS_TAIL);
    match id {
        Some(id) => format!("\n[tool call: {name} #{id}] {args}"),
        None => format!("\n[tool call: {name}] {args}"),
    }
}

fn media_parts(m: &Message) -> usize {
    match m.content() {
        Some(Value::Array(parts)) => parts.iter().filter(|p| is_media_part(p)).count(),
        _ => 0,
    }
}

/// Bytes a cut adds back: `keep_ends` writes a note of how much it omitted, and leaves texts
/// alone that are at most this much over what it keeps.
const CUT_NOTE: usize = 64;
/// Rounds of cutting before giving up: each cut adds a short note, so one round can fall a
/// little short when many blocks are cut.
const FIT_ROUNDS: usize = 4;

/// Cuts the largest blocks to a common size until the whole fits `limit` tokens. The size is
/// found in bytes, scaled by the blocks' own bytes-per-token ratio, with 5% to spare.
fn fit(mut blocks: Vec<String>, limit: Limit, counter: &Counter) -> Vec<String> {
    let Limit::At(limit) = limit else {
        return blocks;
    };
    for _ in 0..FIT_ROUNDS {
        let tokens: usize = blocks.iter().map(|b| block_tokens(b, counter)).sum();
        if tokens <= limit {
            break;
        }
        let lens: Vec<usize> = blocks.iter().map(String::len).collect();
        let bytes: usize = lens.iter().sum();
        let target = (bytes as f64 * limit as f64 / tokens as f64 * 0.95) as usize;
        let cap = water_level(&lens, target);
        let mut cut_any = false;
        let keep = cap.saturating_sub(CUT_NOTE);
        for b in blocks.iter_mut().filter(|b| b.len() > cap) {
            let cut = keep_facts(b, keep);
            if cut.len() < b.len() {
                *b = cut;
                cut_any = true;
            }
        }
        if !cut_any {
            break;
        }
    }
    blocks
}

/// The largest `cap` such that the lengths, each cut to `cap`, sum to at most `target`.
fn water_level(lens: &[usize], target: usize) -> usize {
    let mut sorted = lens.to_vec();
    sorted.sort_unstable();
    let mut used = 0;
    for (i, &len) in sorted.iter().enumerate() {
        let rest = sorted.len() - i;
        if used + len * rest > target {
            return (target - used) / rest;
        }
        used += len;
    }
    sorted.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarize::tests::msg;
    use serde_json::json;

    #[test]
    fn labels_calls_results_and_media() {
        let turns = vec![
            msg(json!({"role": "user", "name": "ann", "content": [
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": "data:..."}}
            ]})),
            msg(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}
            ]})),
            msg(json!({"role": "tool", "tool_call_id": "c1", "content": "fn main() {}"})),
        ];
        let text = blocks(&turns).join(SEPARATOR);
        assert_eq!(
            text,
            "[user ann]\nlook at this\n[1 attachment(s) not shown]\n\n\
             [assistant]\n[tool call: read_file #c1] {\"path\":\"a.rs\"}\n\n\
             [tool result: read_file #c1]\nfn main() {}"
        );
    }

    #[test]
    fn secrets_are_masked_in_text_and_arguments() {
        let turns = vec![
            msg(json!({"role": "user", "content": "my key is sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"})),
            msg(json!({"role": "assistant", "tool_calls": [
                {"id": "c1", "function": {"name": "sh", "arguments": "{\"cmd\":\"export PASSWORD=hunter22\"}"}}
            ]})),
        ];
        let text = blocks(&turns).join(SEPARATOR);
        assert!(!text.contains("Ab3dEf6h"), "{text}");
        assert!(!text.contains("hunter22"), "{text}");
        assert!(text.contains("[REDACTED:openai-key]"));
    }

    #[test]
    fn long_results_keep_head_and_tail() {
        let out = "x".repeat(3000) + &"y".repeat(20_000) + "FINAL STATUS";
        let turns = vec![msg(
            json!({"role": "tool", "tool_call_id": "c9", "content": out}),
        )];
        let b = &blocks(&turns)[0];
        assert!(b.len() < RESULT_HEAD + RESULT_TAIL + 200);
        assert!(b.starts_with("[tool result: tool #c9]\nxxx"));
        assert!(b.ends_with("FINAL STATUS"));
    }

    #[test]
    fn fitting_cuts_the_largest_blocks_first() {
        let counter = Counter::for_model("gpt-4o");
        let small = "[user]\nshort question".to_string();
        let big = format!("[tool result: t]\n{}", "word ".repeat(5000));
        let fitted = fit(vec![small.clone(), big.clone()], Limit::At(1000), &counter);
        assert_eq!(fitted[0], small);
        assert!(fitted[1].len() < big.len());
        let total: usize = fitted.iter().map(|b| block_tokens(b, &counter)).sum();
        assert!(total <= 1000, "{total}");
    }

    #[test]
    fn fitting_many_blocks_converges() {
        let counter = Counter::for_model("gpt-4o");
        let blocks: Vec<String> = (0..300)
            .map(|i| format!("[tool result: t #{i}]\n{}", "alpha beta gamma ".repeat(40)))
            .collect();
        let fitted = fit(blocks, Limit::At(20_000), &counter);
        let total: usize = fitted.iter().map(|b| block_tokens(b, &counter)).sum();
        assert!(total <= 20_000, "{total}");
        assert!(fitted.iter().all(|b| b.starts_with("[tool result: t #")));
    }

    /// A secret of a shape the redactor knows, its body drawn from `seed`.
    fn secret(github: bool, seed: u64) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut x = seed | 1;
        let body: String = (0..48)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ALNUM[(x % ALNUM.len() as u64) as usize] as char
            })
            .collect();
        if github {
            format!("ghp_{}", &body[..36])
        } else {
            format!("sk-proj-{body}")
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever the summariser's room and wherever a secret stands in a long message,
        /// no 12 characters of it are in what the summariser is shown: the text is masked
        /// before any cut, and a cut never gets to take the prefix it is known by.
        #[test]
        fn the_summariser_is_shown_no_part_of_a_secret(
            github: bool, seed: u64, role in 0usize..3,
            before in 0usize..4000, after in 0usize..4000, limit in 40usize..3000,
        ) {
            let key = secret(github, seed);
            let text = format!("{}{key}{}", "a ".repeat(before), " b".repeat(after));
            let m = match role {
                0 => json!({"role": "user", "content": text}),
                1 => json!({"role": "assistant", "content": text}),
                _ => json!({"role": "tool", "tool_call_id": "c1", "content": text}),
            };
            let counter = Counter::for_model("gpt-4o");
            let shown = joined(&[msg(m)], Limit::At(limit), &counter);
            for i in 0..=key.len() - 12 {
                proptest::prop_assert!(!shown.contains(&key[i..i + 12]), "{shown}");
            }
        }
    }

    #[test]
    fn water_level_splits_the_budget() {
        assert_eq!(water_level(&[10, 100, 100], 110), 50);
        assert_eq!(water_level(&[10, 20], 100), 20);
        assert_eq!(water_level(&[], 100), 0);
    }
}
