//! The Responses API (`POST .../responses`) as the engine sees it. A request's `input`
//! items become a chat-completions view: messages for message items, an assistant message
//! with `tool_calls` for each run of calls, a tool message for each call's output. Every
//! view message names the items it stands for (`x_items`), so the request is written back
//! from the client's own items: an item whose message the engine kept unchanged goes out
//! byte for byte, one it shortened is patched in place, and the engine's own messages
//! (the summary, a stub result) become new items. `instructions` is the system prompt and
//! is never touched; it stands in the view as a system message that is not written back.
//!
//! Items the view has no shape for (hosted tool calls without a separate output, item
//! references, types yet unknown) travel as opaque assistant messages: kept whole, or
//! summarised away whole, never invented. A reasoning item goes with the item after it.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::Steering;

/// Field on a view message listing the input items it stands for.
const ITEMS: &str = "x_items";
/// Field on the view message that carries the request's `instructions`.
const INSTRUCTIONS: &str = "x_instructions";

/// Tool calls answered by a separate output item, paired by `call_id`, and the type of
/// that output.
const PAIRED_CALLS: &[(&str, &str)] = &[
    ("function_call", "function_call_output"),
    ("custom_tool_call", "custom_tool_call_output"),
    ("computer_call", "computer_call_output"),
    ("local_shell_call", "local_shell_call_output"),
];

#[derive(Deserialize)]
struct RawResponses<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    previous_response_id: Option<IgnoredAny>,
    #[serde(default)]
    conversation: Option<IgnoredAny>,
    // Required, so that a body without an item list is not compacted.
    #[allow(dead_code)]
    input: Vec<IgnoredAny>,
}

/// The fields of a Responses request that steer compaction, read without building the
/// items. `None` when the request is not one the proxy can compact: no `input` array,
/// or a conversation held by the upstream (`previous_response_id`, `conversation`), whose
/// earlier turns the proxy never sees. The completion cap is named as the view names it.
pub fn steering(body: &[u8]) -> Option<Steering> {
    let raw: RawResponses = serde_json::from_slice(body).ok()?;
    if raw.previous_response_id.is_some() || raw.conversation.is_some() {
        return None;
    }
    Some(Steering {
        model: raw.model.map(|m| m.into_owned()).unwrap_or_default(),
        stream: raw.stream.unwrap_or(false),
        max_output: raw.max_output_tokens,
        max_output_field: raw.max_output_tokens.map(|_| "max_completion_tokens"),
    })
}

/// The chat-completions view of a Responses request: `model`, `tools`, the completion
/// cap as `max_completion_tokens`, and `messages`.
pub fn to_chat(request: &Value) -> Option<Value> {
    let obj = request.as_object()?;
    let items = obj.get("input")?.as_array()?;
    let mut messages = Vec::new();
    if let Some(instructions) = obj.get("instructions").filter(|v| !v.is_null()) {
        let text = match instructions {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        messages.push(json!({"role": "system", "content": text, INSTRUCTIONS: true}));
    }
    let mut pending_reasoning: Vec<usize> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item_type(item);
        if kind == "reasoning" {
            pending_reasoning.push(i);
            continue;
        }
        let mut indices = std::mem::take(&mut pending_reasoning);
        indices.push(i);
        // A run of calls is one assistant turn, as chat has it.
        if let Some(call) = call_of(item) {
            let extends = messages.last().is_some_and(|m: &Value| {
                m["role"] == "assistant" && m["tool_calls"].is_array() && m["x_calls_open"] == true
            });
            if extends {
                if let Some(last) = messages.last_mut() {
                    push_index(last, &indices);
                    if let Some(Value::Array(calls)) = last.get_mut("tool_calls") {
                        calls.push(call);
                    }
                }
                continue;
            }
            messages.push(
                json!({"role": "assistant", "content": null, "tool_calls": [call],
                "x_calls_open": true, ITEMS: indices}),
            );
            continue;
        }
        close_calls(&mut messages);
        messages.push(view_of(item, indices));
    }
    close_calls(&mut messages);
    let mut view = Map::new();
    for key in ["model", "tools", "tool_choice"] {
        if let Some(v) = obj.get(key) {
            view.insert(key.into(), v.clone());
        }
    }
    if let Some(cap) = obj.get("max_output_tokens") {
        view.insert("max_completion_tokens".into(), cap.clone());
    }
    view.insert("messages".into(), Value::Array(messages));
    Some(Value::Object(view))
}

/// `original` with its `input` written back from the (compacted) chat `view`, and its
/// completion cap from the view's.
pub fn from_chat(view: &Value, original: &Value) -> Value {
    let rewritten = ResponsesRewrite::new(view, original);
    let mut input = Some(rewritten.input);
    let mut out = Map::new();
    for (key, value) in original.as_object().into_iter().flatten() {
        let value = match key.as_str() {
            "input" => Value::Array(
                input
                    .take()
                    .into_iter()
                    .flatten()
                    .map(Cow::into_owned)
                    .collect(),
            ),
            "max_output_tokens" if rewritten.cap.is_some() => rewritten.cap.into(),
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

/// The bytes of [`from_chat`]'s request, written without copying what is kept: the
/// client's items and fields are serialised from where they are.
pub fn encode(view: &Value, original: &Value) -> Option<Vec<u8>> {
    serde_json::to_vec(&ResponsesRewrite::new(view, original)).ok()
}

/// A Responses request written back from a view: the client's own fields, in their
/// order, with `input` and the completion cap replaced.
struct ResponsesRewrite<'a> {
    original: &'a Value,
    input: Vec<Cow<'a, Value>>,
    cap: Option<u64>,
}

impl<'a> ResponsesRewrite<'a> {
    fn new(view: &Value, original: &'a Value) -> ResponsesRewrite<'a> {
        let items: &[Value] = original["input"].as_array().map_or(&[], Vec::as_slice);
        let mut input = Vec::new();
        for message in view["messages"].as_array().into_iter().flatten() {
            if message.get(INSTRUCTIONS).is_some() {
                continue;
            }
            render(message, items, &mut input);
        }
        let cap = view.get("max_completion_tokens").and_then(Value::as_u64);
        ResponsesRewrite {
            original,
            input,
            cap,
        }
    }
}

impl Serialize for ResponsesRewrite<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self.original.as_object();
        let mut map = serializer.serialize_map(fields.map(Map::len))?;
        for (key, value) in fields.into_iter().flatten() {
            match (key.as_str(), self.cap) {
                ("input", _) => map.serialize_entry(key, &self.input)?,
                ("max_output_tokens", Some(cap)) => map.serialize_entry(key, &cap)?,
                _ => map.serialize_entry(key, value)?,
            }
        }
        map.end()
    }
}

fn item_type(item: &Value) -> &str {
    match item.get("type").and_then(Value::as_str) {
        Some(t) => t,
        // An "easy" input message: `{role, content}` with no type.
        None if item.get("role").is_some() => "message",
        None => "",
    }
}

fn push_index(message: &mut Value, indices: &[usize]) {
    if let Some(Value::Array(list)) = message.get_mut(ITEMS) {
        list.extend(indices.iter().map(|&i| Value::from(i)));
    }
}

/// Ends the run of calls the last view message holds: its outputs follow.
fn close_calls(messages: &mut [Value]) {
    if let Some(Value::Object(last)) = messages.last_mut() {
        last.remove("x_calls_open");
    }
}

/// The chat tool call an item makes, when its answer is a separate output item.
fn call_of(item: &Value) -> Option<Value> {
    let kind = item_type(item);
    PAIRED_CALLS.iter().find(|(call, _)| *call == kind)?;
    let id = item.get("call_id")?.as_str()?;
    let name = item
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(kind)
        .to_owned();
    let arguments = match (item.get("arguments"), item.get("input"), item.get("action")) {
        (Some(Value::String(a)), _, _) | (None, Some(Value::String(a)), _) => a.clone(),
        (_, _, Some(action)) => action.to_string(),
        _ => String::new(),
    };
    Some(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

/// The view message of one non-call item.
fn view_of(item: &Value, indices: Vec<usize>) -> Value {
    let kind = item_type(item);
    if PAIRED_CALLS.iter().any(|(_, output)| *output == kind) {
        let output = match item.get("output") {
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => Value::Array(parts.iter().map(chat_part).collect()),
            Some(other) => Value::String(other.to_string()),
            None => Value::String(String::new()),
        };
        return json!({"role": "tool", "tool_call_id": item.get("call_id").cloned().unwrap_or_default(),
            "content": output, ITEMS: indices});
    }
    if kind == "message" {
        let role = item
            .get("role")
            .and_then(Value::as_str)
            .filter(|r| matches!(*r, "user" | "assistant" | "system" | "developer"))
            .unwrap_or("user");
        return json!({"role": role, "content": message_content(item), ITEMS: indices});
    }
    // Opaque: the engine sees its size and kind, keeps it whole or drops it whole.
    json!({"role": "assistant", "content": format!("[{kind}] {item}"), "x_opaque": true, ITEMS: indices})
}

/// The chat content of a message item.
fn message_content(item: &Value) -> Value {
    match item.get("content") {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => Value::Array(parts.iter().map(chat_part).collect()),
        _ => Value::String(String::new()),
    }
}

/// A chat content part for a Responses content part: text stays text, media stays
/// media (so it is counted and stripped as such), the rest is carried as text.
fn chat_part(part: &Value) -> Value {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "input_text" | "output_text" | "text" => {
            json!({"type": "text", "text": part.get("text").cloned().unwrap_or_default()})
        }
        "refusal" => {
            json!({"type": "text", "text": part.get("refusal").cloned().unwrap_or_default()})
        }
        "input_image" => {
            let url = part
                .get("image_url")
                .or_else(|| part.get("file_id"))
                .cloned()
                .unwrap_or_default();
            let detail = part.get("detail").cloned().unwrap_or(json!("auto"));
            json!({"type": "image_url", "image_url": {"url": url, "detail": detail}})
        }
        "input_file" => json!({"type": "file", "file": part.clone()}),
        "input_audio" => json!({"type": "input_audio", "input_audio": part.clone()}),
        _ => json!({"type": "text", "text": part.to_string()}),
    }
}

/// Writes the items one view message stands for into `input`: borrowed where they are
/// the client's as they were.
fn render<'a>(message: &Value, items: &'a [Value], input: &mut Vec<Cow<'a, Value>>) {
    let indices: Vec<usize> = message
        .get(ITEMS)
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_u64)
                .map(|i| i as usize)
                .collect()
        })
        .unwrap_or_default();
    let originals: Vec<&Value> = indices.iter().filter_map(|&i| items.get(i)).collect();
    if originals.is_empty() {
        input.extend(new_items(message).into_iter().map(Cow::Owned));
        return;
    }
    if message.get("x_opaque").is_some() {
        input.extend(originals.into_iter().map(Cow::Borrowed));
        return;
    }
    match message["role"].as_str() {
        Some("tool") => {
            for item in originals {
                input.push(patched_output(item, &message["content"]));
            }
        }
        Some("assistant") if message["tool_calls"].is_array() => {
            // The calls as the engine left them, by id: arguments it shortened are
            // written back; a call it no longer holds is not.
            let calls: Map<String, Value> = message["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| Some((c["id"].as_str()?.to_owned(), c.clone())))
                .collect();
            let text = text_of(&message["content"]);
            if !text.is_empty() {
                let said = new_items(&json!({"role": "assistant", "content": text}));
                input.extend(said.into_iter().map(Cow::Owned));
            }
            for item in originals {
                match item.get("call_id").and_then(Value::as_str) {
                    Some(id) => {
                        if let Some(call) = calls.get(id) {
                            input.push(patched_call(item, call));
                        }
                    }
                    None => input.push(Cow::Borrowed(item)),
                }
            }
        }
        _ => {
            // A message: as it was, or with the engine's text in place of its content.
            let [.., last] = originals.as_slice() else {
                return;
            };
            let reasoning = &originals[..originals.len() - 1];
            let unchanged = message_content(last) == message["content"];
            input.extend(reasoning.iter().map(|v| Cow::Borrowed(*v)));
            if unchanged {
                input.push(Cow::Borrowed(*last));
            } else {
                input.push(Cow::Owned(patched_message(last, message)));
            }
        }
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn patched_output<'a>(item: &'a Value, content: &Value) -> Cow<'a, Value> {
    let same = match (item.get("output"), content) {
        (Some(Value::String(s)), Value::String(text)) => s == text,
        (Some(Value::String(s)), _) => *s == text_of(content),
        (Some(Value::Array(parts)), view) => parts.iter().map(chat_part).eq(view
            .as_array()
            .into_iter()
            .flatten()
            .cloned()),
        _ => false,
    };
    if same {
        return Cow::Borrowed(item);
    }
    let mut item = item.clone();
    item["output"] = Value::String(text_of(content));
    Cow::Owned(item)
}

fn patched_call<'a>(item: &'a Value, call: &Value) -> Cow<'a, Value> {
    let arguments = &call["function"]["arguments"];
    let field = if item.get("arguments").is_some_and(|a| a != arguments) {
        "arguments"
    } else if item_type(item) == "custom_tool_call"
        && item.get("input").is_some_and(|a| a != arguments)
    {
        "input"
    } else {
        return Cow::Borrowed(item);
    };
    let mut item = item.clone();
    item[field] = arguments.clone();
    Cow::Owned(item)
}

fn patched_message(item: &Value, message: &Value) -> Value {
    let mut item = item.clone();
    let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
    let text_type = if role == "assistant" {
        "output_text"
    } else {
        "input_text"
    };
    let parts: Vec<Value> = match &message["content"] {
        Value::String(s) => vec![json!({"type": text_type, "text": s})],
        Value::Array(parts) => parts.iter().map(|p| response_part(p, text_type)).collect(),
        _ => Vec::new(),
    };
    item["content"] = Value::Array(parts);
    item
}

/// A Responses content part for a chat one.
fn response_part(part: &Value, text_type: &str) -> Value {
    match part.get("type").and_then(Value::as_str) {
        Some("image_url") => {
            json!({"type": "input_image", "image_url": part["image_url"]["url"], "detail": part["image_url"]["detail"]})
        }
        Some("file") => part["file"].clone(),
        Some("input_audio") => part["input_audio"].clone(),
        _ => json!({"type": text_type, "text": part.get("text").cloned().unwrap_or_default()}),
    }
}

/// Items for a message the engine made: its summary, a stub for a call whose output it
/// dropped, a message opening the conversation.
fn new_items(message: &Value) -> Vec<Value> {
    match message["role"].as_str() {
        Some("tool") => vec![json!({"type": "function_call_output",
            "call_id": message["tool_call_id"], "output": text_of(&message["content"])})],
        Some("assistant") => vec![json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text_of(&message["content"])}]})],
        Some(role) => vec![json!({"type": "message", "role": role,
            "content": [{"type": "input_text", "text": text_of(&message["content"])}]})],
        None => Vec::new(),
    }
}

/// The summariser's chat request (a system and a user message) as a Responses request:
/// the system text as `instructions`, the user text as the one input message, streamed,
/// not stored.
pub fn summary_request(chat: &Value) -> Value {
    let parts = super::SummaryParts::of(chat);
    let mut body = json!({
        "model": chat["model"],
        "instructions": parts.system,
        "input": [{"role": "user", "content": parts.user}],
        "max_output_tokens": parts.cap,
        "stream": true,
        "store": false,
    });
    if let Some(t) = parts.temperature {
        body["temperature"] = t.clone();
    }
    body
}

/// Why a Responses `input` is not one an upstream accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    #[error("input[{index}] is not an object")]
    NotObject { index: usize },
    #[error("input[{index}] calls {id:?}, which no output answers")]
    Unanswered { index: usize, id: String },
    #[error(
        "input[{index}] answers {id:?}, which no earlier call made (or another output answered)"
    )]
    Orphan { index: usize, id: String },
    #[error("input[{index}] is a reasoning item with no item after it to go with")]
    StrandedReasoning { index: usize },
}

/// Checks what the Responses API checks of `input`: every call answered by exactly one
/// output with its `call_id`, after it; no output without its call; no reasoning item
/// left at the end with nothing to go with.
pub fn validate(input: &[Value]) -> Result<(), ItemError> {
    let mut open: Vec<(String, usize)> = Vec::new();
    for (index, item) in input.iter().enumerate() {
        if !item.is_object() {
            return Err(ItemError::NotObject { index });
        }
        let kind = item_type(item);
        let id = item
            .get("call_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let (Some(_), Some(id)) = (PAIRED_CALLS.iter().find(|(c, _)| *c == kind), id.clone()) {
            open.push((id, index));
        } else if PAIRED_CALLS.iter().any(|(_, o)| *o == kind) {
            let id = id.unwrap_or_default();
            match open.iter().position(|(o, _)| *o == id) {
                Some(at) => {
                    open.remove(at);
                }
                None => return Err(ItemError::Orphan { index, id }),
            }
        }
    }
    if let Some((id, index)) = open.into_iter().next() {
        return Err(ItemError::Unanswered { index, id });
    }
    if input.last().is_some_and(|i| item_type(i) == "reasoning") {
        return Err(ItemError::StrandedReasoning {
            index: input.len() - 1,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Value {
        json!({"model": "gpt-5", "instructions": "Be brief.", "max_output_tokens": 9000,
            "store": false, "x_unknown": 1, "input": [
            {"role": "user", "content": "fix the build"},
            {"type": "reasoning", "id": "rs_1", "encrypted_content": "opaque", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{\"cmd\":\"make\"}"},
            {"type": "function_call", "call_id": "c2", "name": "bash", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "error: boom"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "a b"}]},
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "q"}},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done", "annotations": []}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"},
                {"type": "input_image", "image_url": "data:,", "detail": "low"}]},
        ]})
    }

    #[test]
    fn the_view_is_a_valid_chat_conversation_and_writes_back_byte_for_byte() {
        let original = request();
        let view = to_chat(&original).unwrap();
        let messages = view["messages"].as_array().unwrap();
        crate::engine::validate(messages).unwrap();
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(messages[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            messages[2][ITEMS],
            json!([1, 2, 3]),
            "reasoning goes with its call"
        );
        assert_eq!(view["max_completion_tokens"], 9000);
        assert_eq!(from_chat(&view, &original), original);
        validate(original["input"].as_array().unwrap()).unwrap();
    }

    #[test]
    fn dropped_messages_take_their_items_and_shortened_ones_are_patched() {
        let original = request();
        let items = original["input"].as_array().unwrap();
        let mut view = to_chat(&original).unwrap();
        let messages = view["messages"].as_array_mut().unwrap();
        // The engine cut an output and an answer, then summarised the first exchange.
        messages[3]["content"] = json!("[output of bash pruned]");
        messages[6]["content"] = json!("do[...]ne");
        let pruned = from_chat(&view, &original);
        assert_eq!(pruned["input"][4]["output"], "[output of bash pruned]");
        assert_eq!(pruned["input"][4]["call_id"], "c1");
        assert_eq!(
            pruned["input"][5], items[5],
            "an unchanged output is as it was"
        );
        let messages = view["messages"].as_array_mut().unwrap();
        messages.splice(
            1..5,
            [json!({"role": "user", "content": "[compaction-proxy: summary of earlier turns] x"})],
        );
        view["max_completion_tokens"] = json!(500);
        let out = from_chat(&view, &original);
        let input = out["input"].as_array().unwrap();
        assert_eq!(input.len(), 4);
        assert_eq!(input[0]["type"], "message");
        assert_eq!(input[0]["content"][0]["type"], "input_text");
        assert_eq!(input[1], items[6], "the opaque item is whole");
        assert_eq!(
            input[2]["content"],
            json!([{"type": "output_text", "text": "do[...]ne"}])
        );
        assert_eq!(input[3], items[8]);
        assert_eq!(out["instructions"], "Be brief.");
        assert_eq!(out["max_output_tokens"], 500);
        assert_eq!(out["x_unknown"], 1);
        // Nothing stranded: the reasoning item went with its calls.
        assert!(!out.to_string().contains("rs_1"));
        validate(input).unwrap();
    }

    #[test]
    fn server_side_conversations_are_not_the_proxys_to_compact() {
        let bytes = |v: &Value| serde_json::to_vec(v).unwrap();
        let h = steering(&bytes(&request())).unwrap();
        assert_eq!((h.model.as_str(), h.max_output), ("gpt-5", Some(9000)));
        let mut chained = request();
        chained["previous_response_id"] = json!("resp_1");
        assert_eq!(steering(&bytes(&chained)), None);
        let mut held = request();
        held["conversation"] = json!({"id": "conv_1"});
        assert_eq!(steering(&bytes(&held)), None);
        assert_eq!(steering(&bytes(&json!({"input": "hi"}))), None);
    }

    #[test]
    fn the_validator_knows_the_pairing_rules() {
        let call = json!({"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"});
        let out = json!({"type": "function_call_output", "call_id": "a", "output": "1"});
        assert!(validate(&[call.clone(), out.clone()]).is_ok());
        assert!(matches!(
            validate(std::slice::from_ref(&call)),
            Err(ItemError::Unanswered { .. })
        ));
        assert!(matches!(
            validate(std::slice::from_ref(&out)),
            Err(ItemError::Orphan { .. })
        ));
        assert!(matches!(
            validate(&[call, out.clone(), out]),
            Err(ItemError::Orphan { index: 2, .. })
        ));
        let reasoning = json!({"type": "reasoning", "id": "r"});
        assert!(matches!(
            validate(&[reasoning]),
            Err(ItemError::StrandedReasoning { index: 0 })
        ));
    }
}
