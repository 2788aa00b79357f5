//! Codex's remote compaction, on the wire: what a request for it looks like, the
//! `compaction` item the proxy answers with when the upstream cannot, the answers the
//! client expects around that item (a `response.compaction` object for
//! `POST /responses/compact`; a Response, streamed or not, for a request ending in a
//! `compaction_trigger` item), and the expansion of the proxy's items back into text in
//! later requests, where no upstream could read them.
//!
//! The proxy's item carries its summary in the clear behind a prefix, so any replica, and
//! the same process after a restart, can expand it without a store. A `compaction` item
//! without the prefix is the upstream's own opaque state, and passes untouched.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde_json::{json, Map, Value};

use crate::engine::summary;

/// Starts the `encrypted_content` of every compaction item the proxy makes. OpenAI's own
/// blobs are base64 ciphertext and never start with it.
pub const ITEM_PREFIX: &str = "compaction-proxy:summary:v1:";
const TRIGGER: &str = "compaction_trigger";

static PREFIX_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(ITEM_PREFIX));
static TRIGGER_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(TRIGGER));

/// Whether a Responses request asks for compaction: its last input item is a
/// `compaction_trigger`. A byte search first spares the parse for every other request.
pub fn is_trigger(body: &[u8]) -> bool {
    if TRIGGER_FINDER.find(body).is_none() {
        return false;
    }
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("input")?.as_array()?.last().map(is_trigger_item))
        .unwrap_or(false)
}

fn is_trigger_item(item: &Value) -> bool {
    item.get("type").and_then(Value::as_str) == Some(TRIGGER)
}

/// The request with every compaction item the proxy made replaced by a message holding
/// its summary, and stray compaction triggers (not last, so not a request for compaction)
/// removed. `None` when there is nothing to replace: the request goes as it is.
pub fn expand(body: &[u8]) -> Option<Vec<u8>> {
    PREFIX_FINDER.find(body)?;
    let mut request: Value = serde_json::from_slice(body).ok()?;
    let input = request.get_mut("input")?.as_array_mut()?;
    let last = input.len().saturating_sub(1);
    let mut changed = false;
    let mut expanded = Vec::with_capacity(input.len());
    for (i, item) in input.iter().enumerate() {
        if let Some(text) = proxy_summary(item) {
            let role = summary_role(input, i);
            expanded.push(summary_message(role, text));
            changed = true;
        } else if is_trigger_item(item) && i != last {
            changed = true;
        } else {
            expanded.push(item.clone());
        }
    }
    if !changed {
        return None;
    }
    *input = expanded;
    serde_json::to_vec(&request).ok()
}

/// The summary a compaction item of the proxy's carries.
fn proxy_summary(item: &Value) -> Option<&str> {
    let kind = item.get("type").and_then(Value::as_str)?;
    if kind != "compaction" && kind != "compaction_summary" {
        return None;
    }
    item.get("encrypted_content")?
        .as_str()?
        .strip_prefix(ITEM_PREFIX)
}

/// The summary speaks as the assistant between two user messages (Codex keeps the user's
/// messages around it), so that strict chat templates behind a Responses server still see
/// the roles alternate; elsewhere it is the user's.
fn summary_role(input: &[Value], at: usize) -> &'static str {
    let role = |item: Option<&Value>| {
        item.filter(|i| i.get("type").and_then(Value::as_str).unwrap_or("message") == "message")
            .and_then(|i| i.get("role"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let before = at.checked_sub(1).and_then(|i| role(input.get(i)));
    let after = role(input.get(at + 1));
    if before.as_deref() == Some("user") && after.as_deref() != Some("assistant") {
        "assistant"
    } else {
        "user"
    }
}

/// A message item holding a summary, framed as the engine frames its own, so a later
/// compaction recognises it as the summary to carry forward.
fn summary_message(role: &str, text: &str) -> Value {
    let part = if role == "assistant" {
        "output_text"
    } else {
        "input_text"
    };
    json!({
        "type": "message",
        "role": role,
        "content": [{"type": part, "text": summary::wrap(text)}],
    })
}

/// The compaction item for a summary written by the proxy.
pub fn item(id: &str, summary: &str) -> Value {
    json!({
        "type": "compaction",
        "id": id,
        "encrypted_content": format!("{ITEM_PREFIX}{summary}"),
    })
}

/// Usage as the Responses API reports it. The input is reported as none: a client that
/// decides when to compact from the usage it is told (Codex does) must not read the
/// history just summarised as still in its context.
fn usage(output_tokens: u64) -> Value {
    json!({
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": output_tokens,
    })
}

/// The answer to `POST /responses/compact`: the user's messages of `input`, then the
/// compaction item, as OpenAI's endpoint answers.
pub fn compacted(id: &str, created_at: u64, input: &[Value], item: Value, tokens: u64) -> Value {
    let mut output: Vec<Value> = input
        .iter()
        .filter(|i| {
            i.get("type").and_then(Value::as_str).unwrap_or("message") == "message"
                && i.get("role").and_then(Value::as_str) == Some("user")
                && proxy_summary(i).is_none()
        })
        .cloned()
        .collect();
    output.push(item);
    json!({
        "id": id,
        "object": "response.compaction",
        "created_at": created_at,
        "output": output,
        "usage": usage(tokens),
    })
}

/// The Response answering a request that ends in a `compaction_trigger`: exactly one
/// output item, the compaction. `request` supplies the fields a Response echoes.
pub fn response(id: &str, created_at: u64, request: &Value, item: Value, tokens: u64) -> Value {
    let mut response = response_object(id, created_at, request, "completed");
    response.insert("output".into(), json!([item]));
    response.insert("usage".into(), usage(tokens));
    Value::Object(response)
}

fn response_object(id: &str, created_at: u64, request: &Value, status: &str) -> Map<String, Value> {
    let echo = |field: &str| request.get(field).cloned().unwrap_or(Value::Null);
    let mut object = Map::new();
    object.insert("id".into(), id.into());
    object.insert("object".into(), "response".into());
    object.insert("created_at".into(), created_at.into());
    object.insert("status".into(), status.into());
    object.insert("error".into(), Value::Null);
    object.insert("incomplete_details".into(), Value::Null);
    object.insert("model".into(), echo("model"));
    object.insert("output".into(), json!([]));
    object.insert("parallel_tool_calls".into(), echo("parallel_tool_calls"));
    object.insert("store".into(), echo("store"));
    object.insert("usage".into(), Value::Null);
    object
}

/// The same Response as server-sent events, in the order the API sends them: created,
/// in progress, the item added and done, completed.
pub fn response_events(
    id: &str,
    created_at: u64,
    request: &Value,
    item: Value,
    tokens: u64,
) -> String {
    let started = Value::Object(response_object(id, created_at, request, "in_progress"));
    let done = response(id, created_at, request, item.clone(), tokens);
    let events = [
        json!({"type": "response.created", "response": started}),
        json!({"type": "response.in_progress", "response": started}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": done}),
    ];
    let mut out = String::new();
    for (n, mut event) in events.into_iter().enumerate() {
        event["sequence_number"] = n.into();
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        out.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Value {
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    }

    #[test]
    fn a_trigger_is_the_last_item() {
        let asks = json!({"model": "m", "input": [user("hi"), {"type": "compaction_trigger"}]});
        assert!(is_trigger(asks.to_string().as_bytes()));
        let earlier = json!({"model": "m", "input": [{"type": "compaction_trigger"}, user("hi")]});
        assert!(!is_trigger(earlier.to_string().as_bytes()));
        assert!(!is_trigger(b"{\"input\": [\"compaction_trigger\"]"));
    }

    #[test]
    fn the_proxys_items_become_the_summary_between_the_users_messages() {
        let request = json!({"model": "m", "input": [
            {"type": "message", "role": "developer", "content": "be brief"},
            user("turn one"),
            item("cmp_1", "## Goal\nship it"),
            user("turn two"),
        ]});
        let out: Value =
            serde_json::from_slice(&expand(request.to_string().as_bytes()).unwrap()).unwrap();
        let input = out["input"].as_array().unwrap();
        assert_eq!(input.len(), 4);
        assert_eq!(input[2]["role"], "assistant");
        assert_eq!(input[2]["content"][0]["type"], "output_text");
        let text = input[2]["content"][0]["text"].as_str().unwrap();
        assert!(summary::has_marker(text));
        assert!(text.contains("## Goal\nship it"));
        assert_eq!(input[3], user("turn two"));
    }

    #[test]
    fn the_summary_is_the_users_where_the_assistant_cannot_speak() {
        let request = json!({"input": [item("cmp_1", "s"), user("next")]});
        let out: Value =
            serde_json::from_slice(&expand(request.to_string().as_bytes()).unwrap()).unwrap();
        assert_eq!(out["input"][0]["role"], "user");
        assert_eq!(out["input"][0]["content"][0]["type"], "input_text");
    }

    #[test]
    fn the_upstreams_own_items_pass_untouched() {
        let foreign = json!({"input": [
            {"type": "compaction", "id": "cmp_x", "encrypted_content": "gAAAAB..."},
            user("next"),
        ]});
        assert_eq!(expand(foreign.to_string().as_bytes()), None);
    }

    #[test]
    fn the_stream_has_exactly_one_compaction_item_done_and_a_completed_response() {
        let request = json!({"model": "gpt-5", "store": false});
        let events = response_events("resp_1", 7, &request, item("cmp_1", "s"), 3);
        let data: Vec<Value> = events
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let kinds: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let done: Vec<&Value> = data
            .iter()
            .filter(|d| d["type"] == "response.output_item.done")
            .collect();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0]["item"]["type"], "compaction");
        assert_eq!(data[4]["response"]["id"], "resp_1");
        assert_eq!(data[4]["response"]["output"].as_array().unwrap().len(), 1);
        assert_eq!(data[4]["response"]["model"], "gpt-5");
    }

    #[test]
    fn the_compact_endpoint_keeps_the_users_messages_then_the_item() {
        let input = [
            user("a"),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]}),
            json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}),
            user("d"),
        ];
        let out = compacted("resp_1", 1, &input, item("cmp_1", "s"), 2);
        assert_eq!(out["object"], "response.compaction");
        let output = out["output"].as_array().unwrap();
        assert_eq!(output.len(), 3);
        assert_eq!(output[0], user("a"));
        assert_eq!(output[1], user("d"));
        assert_eq!(output[2]["type"], "compaction");
    }
}
