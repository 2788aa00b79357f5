//! Secrets are masked before any cut: for any text holding a secret of a known shape and
//! any cut, no 12 characters of the secret appear in what the compactor writes (a whole
//! copy may stand only in a message the client sent as it is), and none at all in the
//! summary.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use compaction_proxy::engine::message::{keep_ends, one_line};
use compaction_proxy::engine::{self, summary::find_end, Options, MARKER};
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::support::props;
use props::{config, text};

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A secret of one of the shapes the redactor knows, its body drawn from `seed`.
fn secret(shape: usize, seed: u64) -> String {
    let mut x = seed | 1;
    let mut body = |n: usize| -> String {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ALNUM[(x % ALNUM.len() as u64) as usize] as char
            })
            .collect()
    };
    match shape % 4 {
        0 => format!("sk-proj-{}", body(48)),
        1 => format!("ghp_{}", body(36)),
        2 => format!("AKIA{}", body(16).to_ascii_uppercase()),
        _ => format!("xoxb-{}-{}", body(12), body(24)),
    }
}

/// Whether 12 characters of `secret` stand in `out` outside whole copies of it.
fn leaks(secret: &str, out: &str) -> bool {
    let rest = out.replace(secret, "\0");
    (0..=secret.len() - 12).any(|i| rest.contains(&secret[i..i + 12]))
}

/// Whether any 12 characters of `secret` stand in `out`, whole copies included.
fn shows(secret: &str, out: &str) -> bool {
    (0..=secret.len() - 12).any(|i| out.contains(&secret[i..i + 12]))
}

fn summary_part(text: &str) -> &str {
    match text.find(MARKER) {
        Some(start) => {
            let end = find_end(&text[start..]).map_or(text.len(), |(e, _)| start + e);
            &text[start..end]
        }
        None => "",
    }
}

/// A session whose message `at` holds `secret` `before` words into a text of `len` words.
fn session(secret: &str, at: usize, before: usize, len: usize, rounds: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a careful agent."})];
    let holder = |i: usize, fallback: String| -> String {
        if i == at {
            format!(
                "{} API_KEY {secret} {}",
                text(before, i),
                text(len.saturating_sub(before), i + 1)
            )
        } else {
            fallback
        }
    };
    let mut i = 1;
    messages.push(
        json!({"role": "user", "content": holder(i, "Fix the failing build in src/net.rs".into())}),
    );
    for r in 0..rounds {
        let id = format!("c{r}");
        i += 1;
        messages.push(
            json!({"role": "assistant", "content": holder(i, text(40, i)),
            "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\": \"make\"}"}}]}),
        );
        i += 1;
        messages
            .push(json!({"role": "tool", "tool_call_id": id, "content": holder(i, text(300, i))}));
        i += 1;
        messages.push(json!({"role": "user", "content": holder(i, text(30, i))}));
    }
    json!({"model": "gpt-4o", "max_tokens": 64, "messages": messages})
}

proptest! {
    #![proptest_config(config(64))]

    /// The cuts themselves: whatever is kept of either end, the secret is whole or gone.
    #[test]
    fn no_cut_keeps_part_of_a_secret(
        shape in 0usize..4, seed in any::<u64>(),
        before in 0usize..400, after in 0usize..400,
        head in 0usize..500, tail in 0usize..500, line in 10usize..300,
    ) {
        let s = secret(shape, seed);
        let t = format!("{}{s}{}", "a ".repeat(before), " b".repeat(after));
        prop_assert!(!leaks(&s, &keep_ends(&t, head, tail)));
        prop_assert!(!shows(&s, &one_line(&t, line)));
    }

    /// The whole compactor: any message holding the secret, any target.
    #[test]
    fn compaction_writes_no_part_of_a_secret(
        shape in 0usize..4, seed in any::<u64>(),
        at in 1usize..14, before in 0usize..300, len in 10usize..600,
        rounds in 3usize..5, target in 150usize..2500,
    ) {
        let s = secret(shape, seed);
        let request = session(&s, at, before.min(len), len, rounds);
        let opts = Options { target_tokens: Some(target), ..Options::default() };
        let outcome = engine::compact(&request, &opts).unwrap();
        let Some(body) = outcome.rewritten else { return Ok(()) };
        let sent: Vec<String> = request["messages"].as_array().unwrap()
            .iter().map(|m| m.to_string()).collect();
        for m in body["messages"].as_array().unwrap() {
            let text = m["content"].as_str().map_or_else(|| m["content"].to_string(), str::to_string);
            prop_assert!(!shows(&s, summary_part(&text)), "summary holds the secret:\n{text}");
            if sent.contains(&m.to_string()) {
                continue;
            }
            prop_assert!(!leaks(&s, &m.to_string()), "part of the secret in\n{m}");
        }
    }
}
