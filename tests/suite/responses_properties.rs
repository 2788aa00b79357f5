//! Any valid Responses `input` compacts to a valid one: calls answered by their outputs,
//! no orphans, each reasoning item still before the item it went with, unknown item types
//! kept whole or not at all (never invented), the latest user message's text intact, and
//! every field but `input` (and a lowered cap) as the client sent it.

use compaction_proxy::dialect::responses::{from_chat, to_chat, validate};
use compaction_proxy::engine;
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::support::props;
use props::{aim_at, config, text};

#[derive(Debug, Clone)]
enum Step {
    User {
        len: usize,
        parts: bool,
    },
    Answer {
        len: usize,
    },
    Calls {
        outputs: Vec<usize>,
        interleaved: bool,
        reasoning: bool,
        custom: bool,
    },
    Hosted,
    Unknown {
        len: usize,
    },
    Developer,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..300, any::<bool>()).prop_map(|(len, parts)| Step::User { len, parts }),
        3 => (1usize..400).prop_map(|len| Step::Answer { len }),
        5 => (prop::collection::vec(0usize..900, 1..4), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(outputs, interleaved, reasoning, custom)| Step::Calls { outputs, interleaved, reasoning, custom }),
        1 => Just(Step::Hosted),
        1 => (1usize..200).prop_map(|len| Step::Unknown { len }),
        1 => Just(Step::Developer),
    ]
}

fn build(steps: &[Step]) -> Value {
    let mut input = Vec::new();
    let mut call = 0;
    for (k, s) in steps.iter().enumerate() {
        match s {
            Step::User { len, parts } => input.push(if *parts {
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text(*len, k)}]})
            } else {
                json!({"role": "user", "content": text(*len, k)})
            }),
            Step::Answer { len } => input.push(json!({"type": "message", "role": "assistant", "id": format!("msg_{k}"),
                "content": [{"type": "output_text", "text": text(*len, k), "annotations": []}]})),
            Step::Calls { outputs, interleaved, reasoning, custom } => {
                let mut calls = Vec::new();
                let mut outs = Vec::new();
                for len in outputs {
                    call += 1;
                    let id = format!("call_{call}");
                    if *custom && call % 2 == 0 {
                        calls.push(json!({"type": "custom_tool_call", "call_id": id, "name": "apply_patch", "input": text(40, call)}));
                        outs.push(json!({"type": "custom_tool_call_output", "call_id": id, "output": text(*len, call)}));
                    } else {
                        calls.push(json!({"type": "function_call", "call_id": id, "name": "shell",
                            "arguments": json!({"command": text(20, call)}).to_string()}));
                        // Every fifth output carries an image, as Codex's view_image gives back.
                        let output = if call % 5 == 0 {
                            json!([{"type": "input_text", "text": text(*len, call)},
                                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}])
                        } else {
                            json!(text(*len, call))
                        };
                        outs.push(json!({"type": "function_call_output", "call_id": id, "output": output}));
                    }
                }
                if *reasoning {
                    input.push(json!({"type": "reasoning", "id": format!("rs_{k}"), "summary": [], "encrypted_content": "gAAA".repeat(10)}));
                }
                if *interleaved {
                    for (c, o) in calls.into_iter().zip(outs) {
                        input.push(c);
                        input.push(o);
                    }
                } else {
                    input.extend(calls);
                    input.extend(outs);
                }
            }
            Step::Hosted => input.push(json!({"type": "web_search_call", "id": format!("ws_{k}"), "status": "completed",
                "action": {"type": "search", "query": text(5, k)}})),
            Step::Unknown { len } => input.push(json!({"type": "x_future_item", "id": format!("fut_{k}"), "data": text(*len, k)})),
            Step::Developer => input.push(json!({"role": "developer", "content": "be brief"})),
        }
    }
    input.push(json!({"role": "user", "content": "and now finish, please"}));
    json!({"model": "gpt-5", "instructions": "You are an agent.", "input": input,
        "max_output_tokens": 2000, "store": false, "x_unknown": [1]})
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn any_valid_input_compacts_to_a_valid_input(
        steps in prop::collection::vec(step(), 1..30),
        ratio in 10usize..100,
    ) {
        let request = build(&steps);
        let original = request["input"].as_array().unwrap();
        validate(original).expect("the generator makes valid input");
        let view = to_chat(&request).unwrap();
        engine::validate(view["messages"].as_array().unwrap()).expect("the view is valid chat");
        let opts = aim_at(&view, ratio);
        let outcome = engine::compact(&view, &opts).unwrap();
        let out = from_chat(outcome.body(&view), &request);
        let items = out["input"].as_array().unwrap();

        validate(items).unwrap_or_else(|e| panic!("{e}: {out}"));
        for key in ["model", "instructions", "store", "x_unknown"] {
            prop_assert_eq!(&out[key], &request[key]);
        }
        for (i, item) in items.iter().enumerate() {
            let kind = item["type"].as_str().unwrap_or("message");
            // Hosted and unknown items are the client's, whole, or gone.
            if matches!(kind, "x_future_item" | "web_search_call") {
                prop_assert!(original.contains(item), "invented or changed: {}", item);
            }
            // A reasoning item stands before the item it stood before.
            if kind == "reasoning" {
                let at = original.iter().position(|o| o == item).unwrap();
                prop_assert_eq!(&items[i + 1]["call_id"], &original[at + 1]["call_id"]);
            }
        }
        let latest = items.last().unwrap();
        let said = latest["content"].as_str().map(str::to_owned)
            .or_else(|| latest["content"].as_array()?.last()?["text"].as_str().map(str::to_owned))
            .unwrap_or_default();
        prop_assert!(said.ends_with("and now finish, please"), "latest: {}", latest);
        if outcome.rewritten.is_none() {
            prop_assert_eq!(&out, &request, "an unchanged view writes back byte for byte");
        }
    }
}
