//! Any conversation the validator accepts comes out valid for the strictest chat templates,
//! smaller, deterministic, with its instructions and latest user message intact, the
//! latest tool results whole whenever the turn fits, and at least half its target used;
//! and the checkpoint a compaction makes resumes that conversation validly however it
//! goes on.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use compaction_proxy::checkpoint::{self, Checkpoint};
use compaction_proxy::engine::{self, count_request, validate, validate_strict, Options};
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::support::props;
use props::{aim_at, config};

const WORDS: &[&str] = &[
    "the",
    "build",
    "fails",
    "in",
    "src/net.rs",
    "because",
    "error:",
    "cargo",
    "test",
    "passed",
    "fn",
    "main()",
    "{",
    "}",
    "let",
    "x",
    "=",
    "42;",
    "日本語",
    "🎉",
    "\"quoted\"",
    "\n",
    "\t",
    "TODO",
    "refactor",
    "the",
    "parser",
    "and",
    "retry",
    "with",
    "backoff",
];

fn text(len: usize, seed: usize) -> String {
    let mut out = String::new();
    let mut i = seed;
    while out.len() < len {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// One step of a generated session.
#[derive(Debug, Clone)]
enum Step {
    User {
        len: usize,
        parts: bool,
        image: bool,
        name: bool,
    },
    Text {
        len: usize,
        null_parts: bool,
        reasoning: bool,
    },
    Tools {
        calls: Vec<(usize, usize)>,
        reversed: bool,
        parts: bool,
        name: bool,
    },
    Function {
        len: usize,
    },
    Developer {
        len: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..600, any::<bool>(), prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(len, parts, image, name)| Step::User { len, parts, image, name }),
        3 => (0usize..800, any::<bool>(), any::<bool>())
            .prop_map(|(len, null_parts, reasoning)| Step::Text { len, null_parts, reasoning }),
        5 => (prop::collection::vec((0usize..3000, 0usize..2000), 1..4), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(calls, reversed, parts, name)| Step::Tools { calls, reversed, parts, name }),
        1 => (1usize..1500).prop_map(|len| Step::Function { len }),
        1 => (1usize..200).prop_map(|len| Step::Developer { len }),
    ]
}

fn build(system: bool, steps: &[Step], end_with_user: bool) -> Value {
    let mut msgs = Vec::new();
    if system {
        msgs.push(json!({"role": "system", "content": text(300, 1), "x_cache": {"ttl": 5}}));
    }
    let mut call_no = 0;
    for (k, s) in steps.iter().enumerate() {
        match s {
            Step::User {
                len,
                parts,
                image,
                name,
            } => {
                let mut content = if *parts {
                    json!([{"type": "text", "text": text(*len, k)}])
                } else {
                    json!(text(*len, k))
                };
                if *image {
                    content = json!([{"type": "text", "text": "see"}, {"type": "image_url",
                        "image_url": {"url": format!("data:image/png;base64,{}", "QUFB".repeat(500)), "detail": "low"}}]);
                }
                let mut m = json!({"role": "user", "content": content});
                if *name {
                    m["name"] = json!("alice");
                }
                msgs.push(m);
            }
            Step::Text {
                len,
                null_parts,
                reasoning,
            } => {
                let mut m = if *null_parts && *len % 2 == 0 {
                    json!({"role": "assistant", "content": [{"type": "text", "text": text(*len, k)}]})
                } else {
                    json!({"role": "assistant", "content": text(*len + 1, k)})
                };
                if *reasoning {
                    m["reasoning_content"] = json!(text(*len / 4, k + 1));
                }
                msgs.push(m);
            }
            Step::Tools {
                calls,
                reversed,
                parts,
                name,
            } => {
                let mut tool_calls = Vec::new();
                let mut results = Vec::new();
                for (arg_len, out_len) in calls {
                    call_no += 1;
                    let id = format!("call_{call_no}");
                    let args = json!({"path": format!("src/f{call_no}.rs"), "content": text(*arg_len, call_no)});
                    tool_calls.push(json!({"id": id, "type": "function",
                        "function": {"name": if call_no % 2 == 0 { "write_file" } else { "bash" }, "arguments": args.to_string()}}));
                    let out = if out_len % 3 == 0 {
                        format!("error: failed {call_no}\n{}", text(*out_len, 3))
                    } else {
                        text(*out_len, 5)
                    };
                    let mut r = json!({"role": "tool", "tool_call_id": id,
                        "content": if *parts { json!([{"type": "text", "text": out}]) } else { json!(out) }});
                    if *name {
                        r["name"] = json!("bash");
                    }
                    r["x_trace"] = json!(call_no);
                    results.push(r);
                }
                if *reversed {
                    results.reverse();
                }
                msgs.push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
                msgs.extend(results);
            }
            Step::Function { len } => {
                msgs.push(json!({"role": "assistant", "content": null,
                    "function_call": {"name": "lookup", "arguments": json!({"query": text(40, k)}).to_string()}}));
                msgs.push(json!({"role": "function", "name": "lookup", "content": text(*len, k)}));
            }
            Step::Developer { len } => {
                msgs.push(json!({"role": "developer", "content": text(*len, k)}))
            }
        }
    }
    if end_with_user || msgs.is_empty() {
        msgs.push(json!({"role": "user", "content": "and now finish the task, please"}));
    }
    json!({"model": "gpt-4o", "temperature": 0.2, "tools": [{"type": "function",
        "function": {"name": "bash", "parameters": {"type": "object"}}}], "x_unknown": [1, 2],
        "messages": msgs, "stream": true})
}

fn instructions(v: &Value) -> Vec<Value> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system" || m["role"] == "developer")
        .cloned()
        .collect()
}

fn latest_user(v: &Value) -> Option<Value> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .cloned()
}

fn as_parts(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(parts) => parts.clone(),
        other => vec![other.clone()],
    }
}

/// Whether `outer`'s content ends with `inner`'s exactly: as the end of its text, or as
/// its final parts (the first of which may have been joined to the text before it).
fn ends_with_content(outer: &Value, inner: &Value) -> bool {
    if let (Value::String(o), Value::String(i)) = (outer, inner) {
        return o.ends_with(i.as_str());
    }
    let (o, i) = (as_parts(outer), as_parts(inner));
    if i.is_empty() || o.len() < i.len() {
        return false;
    }
    let tail = &o[o.len() - i.len()..];
    tail[1..] == i[1..]
        && (tail[0] == i[0]
            || (tail[0]["type"] == "text"
                && i[0]["type"] == "text"
                && tail[0]["text"]
                    .as_str()
                    .zip(i[0]["text"].as_str())
                    .is_some_and(|(a, b)| a.ends_with(b))))
}

/// The results of the latest tool calls when they belong to the turn in progress (no
/// user message after them), with the tokens of everything a compaction may not drop
/// before it cuts them: instructions, the task, the turn, framing and a summary.
fn latest_results(v: &Value) -> Option<(Vec<Value>, usize)> {
    let msgs = v["messages"].as_array().unwrap();
    // The latest calls are the latest message that makes any, tool calls or a legacy
    // function call: the engine keeps their results, not those of calls before them.
    let calls = msgs
        .iter()
        .rposition(|m| m["tool_calls"].is_array() || m["function_call"].is_object())?;
    let user = msgs.iter().rposition(|m| m["role"] == "user");
    if user.is_some_and(|u| u > calls) {
        return None;
    }
    let turn = user.unwrap_or(calls);
    let results: Vec<Value> = msgs[calls + 1..]
        .iter()
        .take_while(|m| m["role"] == "tool" || m["role"] == "function")
        .cloned()
        .collect();
    let task = msgs
        .iter()
        .position(|m| m["role"] == "user")
        .filter(|&t| t < turn);
    let keep: Vec<Value> = msgs
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            *i >= turn || Some(*i) == task || m["role"] == "system" || m["role"] == "developer"
        })
        .map(|(_, m)| m.clone())
        .collect();
    let mut kept = v.clone();
    kept["messages"] = json!(keep);
    Some((results, count_request(&kept) + 60 * keep.len() + 400))
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn compaction_keeps_its_promises(
        system in any::<bool>(),
        steps in prop::collection::vec(step(), 1..40),
        end_with_user in prop::bool::weighted(0.8),
        ratio in 5usize..120,
    ) {
        let request = build(system, &steps, end_with_user);
        validate(request["messages"].as_array().unwrap()).expect("generator makes valid input");
        let opts = aim_at(&request, ratio);
        let outcome = engine::compact(&request, &opts).unwrap();
        let out = outcome.body(&request).clone();
        let report = &outcome.report;

        validate(out["messages"].as_array().unwrap()).unwrap();
        if outcome.rewritten.is_some() {
            validate_strict(out["messages"].as_array().unwrap()).unwrap();
            // Below that, one message or tool call is a large share of the target, and
            // keeping or folding it is a step of more than half.
            let target = opts.target_tokens.unwrap();
            prop_assert!(
                target < 1000 || report.tokens_after >= target / 2,
                "under half the target: {}", report
            );
        }
        prop_assert!(report.tokens_after <= report.tokens_before);
        prop_assert_eq!(count_request(&out), report.tokens_after, "cached counts drifted");
        prop_assert_eq!(instructions(&out), instructions(&request));
        if let Some(latest) = latest_user(&request) {
            let kept = latest_user(&out).unwrap();
            prop_assert!(
                ends_with_content(&kept["content"], &latest["content"]),
                "latest user text changed: {} -> {}", latest, kept
            );
        }
        if let Some((results, needs)) = latest_results(&request) {
            if needs <= opts.target_tokens.unwrap() {
                let msgs = out["messages"].as_array().unwrap();
                for r in &results {
                    prop_assert!(msgs.contains(r), "latest result lost: {} ({}; needs {}) {}", r, report, needs, request);
                }
            }
        }
        for key in ["model", "temperature", "tools", "x_unknown", "stream"] {
            prop_assert_eq!(&out[key], &request[key]);
        }
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        let original: Vec<&String> = request.as_object().unwrap().keys().collect();
        prop_assert_eq!(keys, original);
        // Kept messages keep every field, in order: only values are ever rewritten.
        let shapes: std::collections::HashSet<Vec<String>> = request["messages"].as_array().unwrap()
            .iter().map(|m| m.as_object().unwrap().keys().cloned().collect()).collect();
        for m in out["messages"].as_array().unwrap() {
            let stub = m["content"].as_str().is_some_and(|c| {
                c.starts_with("[tool result no longer available") || c == engine::OPENING
            });
            if !m.to_string().contains(engine::MARKER) && !stub {
                let keys: Vec<String> = m.as_object().unwrap().keys().cloned().collect();
                prop_assert!(shapes.contains(&keys), "fields changed: {:?}", keys);
            }
        }
        if ratio >= 100 {
            prop_assert!(report.unchanged && outcome.rewritten.is_none());
        }
        if report.unchanged {
            prop_assert_eq!(&out, &request);
        }

        let again = engine::compact(&request, &opts).unwrap();
        prop_assert_eq!(
            serde_json::to_vec(again.body(&request)).unwrap(),
            serde_json::to_vec(&out).unwrap()
        );
    }

    #[test]
    fn compacting_twice_carries_the_summary_forward(
        steps in prop::collection::vec(step(), 10..40),
    ) {
        let request = build(true, &steps, true);
        let before = count_request(&request);
        let opts = Options { target_tokens: Some(before / 3), ..Options::with_window(before) };
        let first = engine::compact(&request, &opts).unwrap();
        let Some(mut once) = first.rewritten else { return Ok(()) };
        // The client goes on with the compacted history plus a new exchange.
        let msgs = once["messages"].as_array_mut().unwrap();
        msgs.push(json!({"role": "assistant", "content": text(3000, 9)}));
        msgs.push(json!({"role": "user", "content": "next step"}));
        let opts2 = Options { target_tokens: Some(count_request(&once) / 2), ..opts };
        let second = engine::compact(&once, &opts2).unwrap();
        let out = second.body(&once);
        validate_strict(out["messages"].as_array().unwrap()).unwrap();
        let markers = out["messages"].as_array().unwrap().iter()
            .filter(|m| m.to_string().contains(engine::MARKER)).count();
        prop_assert!(markers <= 1, "one summary at most, found {} in {} from {}", markers, out, once);
    }

    #[test]
    fn a_checkpoint_resumes_the_conversation_it_was_made_from(
        steps in prop::collection::vec(step(), 4..40),
        more in prop::collection::vec(step(), 0..8),
        ratio in 10usize..90,
    ) {
        let request = build(true, &steps, true);
        let opts = aim_at(&request, ratio);
        let Some(out) = engine::compact(&request, &opts).unwrap().rewritten else { return Ok(()) };
        let (input, output) = (request["messages"].as_array().unwrap(), out["messages"].as_array().unwrap());
        let Some((replaced, form)) = checkpoint::derive(input, output, None) else { return Ok(()) };
        // The same request again gets exactly what the compaction made of it.
        let mut again = form.clone();
        again.extend_from_slice(&input[replaced..]);
        prop_assert_eq!(&again, output);

        // The client goes on: where its history still starts with the prefix, and goes on
        // with the role that followed it, the checkpoint applies and the result is valid.
        let role = input.get(replaced).and_then(|m| m["role"].as_str()).map(str::to_owned);
        let stored = Checkpoint::new(replaced, 0, form, Vec::new(), role, 0);
        let grown = build(true, &[steps, more].concat(), true);
        let grown = grown["messages"].as_array().unwrap();
        if grown.len() >= replaced
            && grown[..replaced] == input[..replaced]
            && stored.continues(grown.get(replaced))
        {
            let mut resumed = stored.messages.clone();
            resumed.extend_from_slice(&grown[replaced..]);
            prop_assert!(validate(&resumed).is_ok(), "{:?}", validate(&resumed));
        }
    }

    #[test]
    fn never_panics_on_odd_input(
        roles in prop::collection::vec(prop_oneof![
            Just("user"), Just("assistant"), Just("tool"), Just("system"), Just("function"), Just("developer")], 1..20),
        contents in prop::collection::vec(prop_oneof![
            Just(json!(null)), Just(json!(5)), Just(json!("")), Just(json!("x".repeat(5000))),
            Just(json!([])), Just(json!([{"type": "text"}])), Just(json!([{"type": "image_url"}])),
            Just(json!([{"type": "weird", "data": "y".repeat(3000)}])), Just(json!({"a": 1}))], 20),
        calls in prop::collection::vec(prop_oneof![
            Just(json!(null)), Just(json!([])), Just(json!("x")),
            Just(json!([{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"path\": 1}"}}])),
            Just(json!([{"id": 7}])), Just(json!([{"function": {"arguments": "x".repeat(2000)}}]))], 20),
        target in 0usize..3000,
    ) {
        let msgs: Vec<Value> = roles.iter().enumerate().map(|(i, r)| {
            let mut m = json!({"role": r, "content": contents[i].clone()});
            if *r == "assistant" { m["tool_calls"] = calls[i].clone(); }
            if *r == "tool" { m["tool_call_id"] = json!("a"); }
            m
        }).collect();
        let request = json!({"messages": msgs});
        let opts = Options { target_tokens: Some(target), ..Options::with_window(4000) };
        let outcome = engine::compact(&request, &opts).unwrap();
        prop_assert!(outcome.report.tokens_after <= outcome.report.tokens_before);
        if let Some(out) = outcome.rewritten {
            validate_strict(out["messages"].as_array().unwrap()).unwrap();
        }
    }

    /// Whatever JSON arrives as a request, the engine answers (maybe with an error) and
    /// whatever it rewrites is valid.
    #[test]
    fn never_panics_on_any_json(request in json_ish_request(), target in 0usize..3000) {
        let opts = Options { target_tokens: Some(target), ..Options::with_window(4000) };
        if let Ok(outcome) = engine::compact(&request, &opts) {
            if let Some(out) = outcome.rewritten {
                let messages = out["messages"].as_array().expect("messages stay an array");
                prop_assert!(validate_strict(messages).is_ok(), "{:?}", validate_strict(messages));
            }
        }
    }
}

/// Keys and strings a chat request is made of, so arbitrary JSON reaches the engine's
/// passes rather than stopping at a missing field.
const KEYS: &[&str] = &[
    "messages",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "type",
    "text",
    "image_url",
    "url",
    "function",
    "arguments",
    "id",
    "refusal",
    "reasoning_content",
    "user",
    "assistant",
    "tool",
    "system",
    "developer",
    "function_call",
    "input_audio",
    "file",
    "max_tokens",
    "model",
    "",
];

fn json_ish() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        prop::sample::select(KEYS).prop_map(Value::from),
        (0usize..4000, 0usize..50).prop_map(|(len, seed)| Value::from(text(len, seed))),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..8).prop_map(|fields| {
                Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// A request whose `messages` is an array of arbitrary JSON, mostly objects with a role.
fn json_ish_request() -> impl Strategy<Value = Value> {
    let role = prop::sample::select(
        &[
            "user",
            "assistant",
            "tool",
            "system",
            "developer",
            "function",
            "other",
        ][..],
    );
    let message = prop_oneof![
        (role, json_ish(), json_ish()).prop_map(|(role, content, extra)| {
            let mut m = json!({"role": role, "content": content});
            if let Value::Object(fields) = extra {
                m.as_object_mut().expect("an object").extend(fields);
            }
            m
        }),
        json_ish(),
    ];
    (prop::collection::vec(message, 0..16), json_ish())
        .prop_map(|(messages, tools)| json!({"model": "m", "messages": messages, "tools": tools}))
}
