//! Synthetic agent sessions shared by the benchmarks.

#![allow(dead_code)] // each benchmark uses a different part

use compaction_proxy::engine::count_request;
use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "let",
    "mut",
    "request",
    "response",
    "=",
    "upstream.send(body)",
    "?;",
    "if",
    "status",
    "==",
    "429",
    "{",
    "}",
    "return",
    "Err(Error::Timeout)",
    "//",
    "retry",
    "with",
    "backoff",
    "the",
    "parser",
    "keeps",
    "partial",
    "events",
    "across",
    "chunks",
    "fn",
    "parse_event(buf:",
    "&mut",
    "BytesMut)",
    "->",
    "Option<Event>",
    "error[E0308]:",
    "mismatched",
    "types",
    "test",
    "ok",
];

pub fn words(n: usize, seed: usize) -> String {
    let mut out = String::with_capacity(n * 7);
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(WORDS[x % WORDS.len()]);
        out.push(if i % 12 == 11 { '\n' } else { ' ' });
    }
    out
}

/// An agent session of at least `tokens` tokens: asks, tool calls, large outputs, replies.
pub fn session(tokens: usize) -> Value {
    session_with(tokens, 600)
}

/// Like [`session`], with tool outputs of `output_words` words (about 1.4 tokens each):
/// fewer, longer messages for the same size.
pub fn session_with(tokens: usize, output_words: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": words(400, 0)})];
    let mut round = 0;
    let mut total = 0;
    while total < tokens {
        round += 1;
        let id = format!("call_{round}");
        let round_msgs = [
            json!({"role": "user", "content": words(40, round)}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "read_file", "arguments": json!({"path": format!("src/m{round}.rs")}).to_string()}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": words(output_words, round + 1)}),
            json!({"role": "assistant", "content": words(80, round + 2)}),
        ];
        let body = json!({"model": "gpt-4o", "messages": round_msgs});
        total += count_request(&body);
        messages.extend(round_msgs);
    }
    messages.push(json!({"role": "user", "content": "Carry on with the refactor."}));
    json!({"model": "gpt-4o", "stream": true, "messages": messages})
}

/// One ask and then `rounds` rounds of tool calls and their outputs without another user
/// message: a coding agent's long turn, whose earlier rounds escalation folds into the
/// summary when the turn alone is over its window.
pub fn one_turn(rounds: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": words(400, 0)}),
        json!({"role": "user", "content": words(60, 1)}),
    ];
    for round in 1..=rounds {
        let id = format!("call_{round}");
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "run", "arguments":
            json!({"cmd": format!("pytest tests/t{round}.py")}).to_string()}}]}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": words(300, round)}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}
