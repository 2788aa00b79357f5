//! Any valid Messages request compacts to a valid one (by the mock upstream's own
//! validator): roles alternating from the user on, every `tool_use` answered first thing
//! in the next message, thinking only where the client had it, never edited and never
//! dropped from a turn kept in any part, no more breakpoints than the client's, `system`
//! messages all there as they came, the latest text intact, and every field but
//! `messages` (and a lowered cap) as the client sent it.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use compaction_proxy::dialect::messages::{encode, to_chat, validate};
use compaction_proxy::engine;
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::support::props;
use props::{aim_at, config, text};

#[derive(Debug, Clone)]
enum Step {
    /// A user turn: text as a string or blocks, perhaps with an image.
    Ask {
        len: usize,
        blocks: bool,
        image: bool,
    },
    /// The assistant's answer, perhaps thinking first, perhaps with a web search.
    Answer {
        len: usize,
        thinking: bool,
        search: bool,
    },
    /// The assistant calls tools; their results come back (every fourth with a
    /// screenshot), perhaps with a reminder.
    Calls {
        outputs: Vec<usize>,
        thinking: bool,
        reminder: bool,
    },
    /// A `system` message between turns.
    Instruction,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..300, any::<bool>(), any::<bool>())
            .prop_map(|(len, blocks, image)| Step::Ask { len, blocks, image }),
        3 => (1usize..400, any::<bool>(), any::<bool>())
            .prop_map(|(len, thinking, search)| Step::Answer { len, thinking, search }),
        5 => (prop::collection::vec(0usize..900, 1..4), any::<bool>(), any::<bool>())
            .prop_map(|(outputs, thinking, reminder)| Step::Calls { outputs, thinking, reminder }),
        1 => Just(Step::Instruction),
    ]
}

fn thinking(k: usize) -> Value {
    json!({"type": "thinking", "thinking": text(30, k), "signature": format!("sig-{k}")})
}

/// Messages for `steps`, made valid: a user message wherever the order needs one.
fn build(steps: &[Step]) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "<env>linux</env>",
        "output_config": {"effort": "medium"}, "cache_control": {"type": "ephemeral"}})];
    let mut call = 0;
    let mut last = "none";
    let mut speak = |messages: &mut Vec<Value>, role: &'static str, content: Value| {
        if last == role || (last == "none" && role == "assistant") {
            let other = if role == "user" { "assistant" } else { "user" };
            messages.push(json!({"role": other, "content": "go on"}));
        }
        messages.push(json!({"role": role, "content": content}));
        last = role;
    };
    for (k, s) in steps.iter().enumerate() {
        match s {
            Step::Ask { len, blocks, image } => {
                let mut content = vec![json!({"type": "text", "text": text(*len, k)})];
                if *image {
                    content.push(json!({"type": "image", "source": {"type": "base64",
                        "media_type": "image/png", "data": "iVBORw0KGgo="}}));
                }
                let content = if *blocks || *image {
                    Value::Array(content)
                } else {
                    json!(text(*len, k))
                };
                speak(&mut messages, "user", content);
            }
            Step::Answer {
                len,
                thinking: think,
                search,
            } => {
                let mut content = Vec::new();
                if *think {
                    content.push(thinking(k));
                }
                if *search {
                    let id = format!("srvtoolu_{k}");
                    content.push(json!({"type": "server_tool_use", "id": id, "name": "web_search", "input": {"query": text(3, k)}}));
                    content.push(
                        json!({"type": "web_search_tool_result", "tool_use_id": id, "content": []}),
                    );
                }
                content.push(json!({"type": "text", "text": text(*len, k)}));
                speak(&mut messages, "assistant", Value::Array(content));
            }
            Step::Calls {
                outputs,
                thinking: think,
                reminder,
            } => {
                let mut uses = if *think {
                    vec![thinking(k)]
                } else {
                    Vec::new()
                };
                let mut results = Vec::new();
                for len in outputs {
                    call += 1;
                    let id = format!("toolu_{call}");
                    uses.push(json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"command": text(20, call)}}));
                    let output = if call % 4 == 0 {
                        json!([{"type": "text", "text": text(*len, call)}, {"type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}])
                    } else {
                        json!(text(*len, call))
                    };
                    results
                        .push(json!({"type": "tool_result", "tool_use_id": id, "content": output}));
                }
                if *reminder {
                    results.push(
                        json!({"type": "text", "text": "<system-reminder>todo</system-reminder>"}),
                    );
                }
                speak(&mut messages, "assistant", Value::Array(uses));
                speak(&mut messages, "user", Value::Array(results));
            }
            Step::Instruction => messages.push(json!({"role": "system", "content": "be brief"})),
        }
    }
    speak(
        &mut messages,
        "user",
        json!([{"type": "text", "text": "and now finish, please", "cache_control": {"type": "ephemeral"}}]),
    );
    json!({"model": "claude-opus-5-5", "max_tokens": 2000, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "messages": messages, "x_unknown": [1]})
}

/// Every block of every message of `request`.
fn all_blocks(request: &Value) -> Vec<Value> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| match &m["content"] {
            Value::Array(blocks) => blocks.clone(),
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            _ => Vec::new(),
        })
        .collect()
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn any_valid_messages_request_compacts_to_a_valid_one(
        steps in prop::collection::vec(step(), 1..30),
        ratio in 10usize..100,
    ) {
        let request = build(&steps);
        validate(&request).expect("the generator makes valid requests");
        let view = to_chat(&request).unwrap();
        engine::validate(view["messages"].as_array().unwrap()).expect("the view is valid chat");
        let opts = aim_at(&view, ratio);
        let outcome = engine::compact(&view, &opts).unwrap();
        let bytes = encode(outcome.body(&view), &request)
            .unwrap_or_else(|| panic!("the compacted view is not a valid request: {}", outcome.report));
        let out: Value = serde_json::from_slice(&bytes).unwrap();

        validate(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        for key in ["model", "system", "tools", "thinking", "context_management", "stream", "x_unknown"] {
            prop_assert_eq!(&out[key], &request[key]);
        }
        let theirs = all_blocks(&request);
        for block in all_blocks(&out) {
            // Thinking and server tool blocks are the client's, whole, or gone.
            let kind = block["type"].as_str().unwrap();
            if kind != "text" && kind != "tool_result" && kind != "tool_use" {
                prop_assert!(theirs.contains(&block), "invented or changed: {}", block);
            }
        }
        // A turn kept in any part keeps its thinking: thinking goes only with its turn.
        let kept = all_blocks(&out);
        for message in request["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "assistant") {
            let Some(blocks) = message["content"].as_array() else { continue };
            let (thinking, rest): (Vec<&Value>, Vec<&Value>) =
                blocks.iter().partition(|b| b["type"] == "thinking" || b["type"] == "redacted_thinking");
            // Blocks that name their turn: found once in the whole request.
            let unique = |b: &Value| theirs.iter().filter(|t| *t == b).count() == 1;
            let named: Vec<&Value> = rest.iter().copied().filter(|b| unique(b)).collect();
            if !thinking.is_empty() && named.iter().any(|b| kept.contains(b)) {
                for block in thinking {
                    prop_assert!(kept.contains(block), "thinking dropped from a kept turn: {}\n{}", block, out);
                }
            }
        }
        let sent = out["messages"].as_array().unwrap();
        let instructions = |messages: &[Value]| -> Vec<Value> {
            messages.iter().filter(|m| m["role"] == "system").cloned().collect()
        };
        prop_assert_eq!(
            instructions(sent),
            instructions(request["messages"].as_array().unwrap()),
            "system messages all kept, as they came"
        );
        let latest = sent.last().unwrap();
        prop_assert_eq!(
            latest["content"].as_array().unwrap().last().unwrap(),
            &json!({"type": "text", "text": "and now finish, please", "cache_control": {"type": "ephemeral"}})
        );
        if outcome.rewritten.is_none() {
            prop_assert_eq!(bytes, serde_json::to_vec(&request).unwrap(), "an unchanged view writes back byte for byte");
        }
    }
}
