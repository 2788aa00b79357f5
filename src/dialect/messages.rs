//! Anthropic's Messages API (`POST .../v1/messages`, Claude Code and the Anthropic SDKs)
//! as the engine sees it. Each message's content blocks become chat-completions shapes:
//! `tool_use` blocks an assistant's `tool_calls`, each `tool_result` block a tool message,
//! text, images and documents content parts. Every part, call and tool message names the
//! block it stands for (`x_src`: message and block index), so the request is written back
//! from the client's own blocks: a block the engine left alone goes out byte for byte, one
//! it shortened is patched in place (its other fields, `cache_control` among them, kept),
//! and the engine's own text (the summary, a stub result) becomes new blocks.
//!
//! Blocks the engine has no shape for (`thinking` with its signature, `redacted_thinking`,
//! server tool calls and their results, types yet unknown) ride on their message in
//! `x_opaque`: counted, never edited, and kept or dropped with the message. The top-level
//! `system` stands in the view as a system message that is not written back: the client's
//! own `system` goes out as it came. `role: "system"` messages inside `messages` (Claude
//! Code's per-turn instructions) are instructions to the engine, which never edits or
//! drops them, and go back as they came.
//!
//! Provider compaction wins: a request that asks the upstream to compact (a `compact_*`
//! context edit) or carries the upstream's `compaction` block is not the proxy's to touch.

use std::borrow::{Borrow, Cow};
use std::collections::HashSet;

use memchr::memmem;
use serde::de::IgnoredAny;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::Steering;

/// Field on the view message standing for the top-level `system`.
const SYSTEM: &str = "x_system";
/// Field on a view message naming the client message it comes from.
const MSG: &str = "x_msg";
/// Field on a view part, tool call or tool message naming the block it stands for:
/// `[message, block]`.
const SRC: &str = "x_src";
/// Field on a view message carrying the blocks the view has no shape for, each as
/// `[message, block, the block]` (the block itself, so that it is counted).
const OPAQUE: &str = "x_opaque";
/// The most `cache_control` breakpoints a request may carry.
pub const MAX_BREAKPOINTS: usize = 4;
/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u64 = 1024;

#[derive(Deserialize)]
struct RawMessages<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    context_management: Option<Value>,
    // Required, so that a body without a message list is not compacted.
    #[allow(dead_code)]
    messages: Vec<IgnoredAny>,
}

/// The fields of a Messages request that steer compaction. `None` when the request is
/// not one the proxy may compact: no `messages` array, or one the provider compacts
/// itself (a `compact_*` context edit, a `compaction` block). Context edits that clear
/// thinking or tool uses do not guarantee a fit: they are kept as sent and do not stop
/// compaction.
pub fn steering(body: &[u8]) -> Option<Steering> {
    let raw: RawMessages = serde_json::from_slice(body).ok()?;
    if raw.context_management.as_ref().is_some_and(compacts) || holds_compaction(body) {
        return None;
    }
    Some(Steering {
        model: raw.model.map(Cow::into_owned).unwrap_or_default(),
        stream: raw.stream.unwrap_or(false),
        max_output: raw.max_tokens,
        max_output_field: raw.max_tokens.map(|_| "max_tokens"),
    })
}

/// Whether the context edits ask the upstream to compact the conversation itself.
fn compacts(context_management: &Value) -> bool {
    context_management["edits"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|edit| edit["type"].as_str())
        .any(|kind| kind.starts_with("compact_"))
}

/// Whether a message holds a `compaction` block: the provider's summary of what came
/// before, which only the provider can read. The bytes are searched first so that the
/// usual request is not parsed for it.
fn holds_compaction(body: &[u8]) -> bool {
    if memmem::find(body, b"\"compaction\"").is_none() {
        return false;
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| blocks(&m["content"]))
        .any(|b| b["type"] == "compaction")
}

/// The chat-completions view of a Messages request: `model`, `tools`, `max_tokens`, and
/// `messages`. `None` for a message the view cannot stand for (an unknown role), which
/// leaves the request to the upstream.
pub fn to_chat(request: &Value) -> Option<Value> {
    let obj = request.as_object()?;
    let source = obj.get("messages")?.as_array()?;
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system").filter(|s| !s.is_null()) {
        messages.push(json!({"role": "system", "content": plain_text(system), SYSTEM: true}));
    }
    for (i, message) in source.iter().enumerate() {
        view_of(i, message, &mut messages)?;
    }
    let mut view = Map::new();
    for key in ["model", "tools", "max_tokens"] {
        if let Some(v) = obj.get(key) {
            view.insert(key.into(), v.clone());
        }
    }
    view.insert("messages".into(), Value::Array(messages));
    Some(Value::Object(view))
}

/// The blocks of a `content` value: a string is one text block.
fn blocks(content: &Value) -> Vec<Cow<'_, Value>> {
    match content {
        Value::String(s) => vec![Cow::Owned(json!({"type": "text", "text": s}))],
        Value::Array(list) => list.iter().map(Cow::Borrowed).collect(),
        _ => Vec::new(),
    }
}

/// The text of a `system` value or of a tool result's content.
fn plain_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(list) => list
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn kind(block: &Value) -> &str {
    block["type"].as_str().unwrap_or("")
}

/// Appends the view messages of client message `i`.
fn view_of(i: usize, message: &Value, out: &mut Vec<Value>) -> Option<()> {
    let role = message["role"].as_str()?;
    let content = &message["content"];
    match role {
        "system" => {
            out.push(json!({"role": "system", "content": plain_text(content), MSG: i}));
        }
        "user" => {
            let mut parts = Vec::new();
            let mut opaque = Vec::new();
            for (j, block) in blocks(content).iter().enumerate() {
                match kind(block) {
                    "tool_result" => out.push(tool_message(block, [i, j])),
                    _ => match user_part(block, [i, j]) {
                        Some(part) => parts.push(part),
                        None => opaque.push(json!([i, j, block])),
                    },
                }
            }
            if parts.is_empty() && opaque.is_empty() {
                return Some(());
            }
            // A chat user message needs some content; the empty text is never written.
            if parts.is_empty() {
                parts.push(json!({"type": "text", "text": ""}));
            }
            let mut user = json!({"role": "user", "content": parts, MSG: i});
            if !opaque.is_empty() {
                user[OPAQUE] = Value::Array(opaque);
            }
            out.push(user);
        }
        "assistant" => {
            let mut parts = Vec::new();
            let mut calls = Vec::new();
            let mut opaque = Vec::new();
            for (j, block) in blocks(content).iter().enumerate() {
                match kind(block) {
                    "text" => parts.push(text_part(block, [i, j])),
                    "tool_use" => calls.push(tool_call(block, [i, j])),
                    _ => opaque.push(json!([i, j, block])),
                }
            }
            let mut assistant = json!({"role": "assistant", "content": parts, MSG: i});
            if !calls.is_empty() {
                assistant["tool_calls"] = Value::Array(calls);
            }
            if !opaque.is_empty() {
                assistant[OPAQUE] = Value::Array(opaque);
            }
            out.push(assistant);
        }
        _ => return None,
    }
    Some(())
}

fn text_part(block: &Value, at: [usize; 2]) -> Value {
    json!({"type": "text", "text": block["text"].as_str().unwrap_or(""), SRC: at})
}

/// The chat part of a user block: text as text, images and documents as media (counted
/// and stripped as such; the source is kept in the part so that two conversations that
/// differ only in an image do not look the same to the summary cache).
fn user_part(block: &Value, at: [usize; 2]) -> Option<Value> {
    let mut part = part_of(block)?;
    part[SRC] = json!(at);
    Some(part)
}

/// A text, image or document block as a chat part.
fn part_of(block: &Value) -> Option<Value> {
    match kind(block) {
        "text" => Some(json!({"type": "text", "text": block["text"].as_str().unwrap_or("")})),
        "image" => {
            Some(json!({"type": "image_url", "image_url": {"url": block["source"].to_string()}}))
        }
        "document" => Some(json!({"type": "file", "file": {"source": block["source"]}})),
        _ => None,
    }
}

fn tool_call(block: &Value, at: [usize; 2]) -> Value {
    json!({"id": block["id"], "type": "function", "function": {
        "name": block["name"], "arguments": block["input"].to_string()}, SRC: at})
}

/// The view's tool message of a `tool_result` block: its text, or, when the tool gave
/// back images or documents (a screenshot, a file it read), its parts, so that they are
/// counted as the media they are and pruned with the output.
fn tool_message(block: &Value, at: [usize; 2]) -> Value {
    let content = match &block["content"] {
        Value::Array(list) if list.iter().any(|b| matches!(kind(b), "image" | "document")) => {
            // The same texts as `plain_text` reads, so an untouched result is written
            // back as the client's block.
            let part = |b: &Value| match kind(b) {
                "image" | "document" => part_of(b),
                _ => b["text"]
                    .as_str()
                    .map(|t| json!({"type": "text", "text": t})),
            };
            Value::Array(list.iter().filter_map(part).collect())
        }
        other => Value::from(plain_text(other)),
    };
    json!({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content, SRC: at})
}

/// The bytes of the client's request with its `messages` written back from the
/// (compacted) chat `view`, and its completion cap from the view's. `None` when what
/// would be written is not a valid Messages request: the caller then sends what it sent
/// before, never a request the upstream would refuse for its shape.
pub fn encode(view: &Value, source: &Value) -> Option<Vec<u8>> {
    let rewritten = MessagesRewrite::new(view, source)?;
    let breakpoints = breakpoints(&source["system"]) + breakpoints(&source["tools"]);
    if let Err(e) = check(&rewritten.messages, breakpoints) {
        tracing::warn!(error = %e, "a compacted Messages request would be invalid; not sent");
        return None;
    }
    serde_json::to_vec(&rewritten).ok()
}

/// The summariser's chat request (a system prompt and one user message) as a Messages
/// request, for an upstream that speaks only Messages: the prompt in `system`, the cap as
/// the required `max_tokens`, streamed, without thinking (a checkpoint is plain text).
pub fn summary_request(chat: &Value) -> Value {
    let parts = super::SummaryParts::of(chat);
    let mut body = serde_json::json!({
        "model": chat["model"],
        "max_tokens": parts.cap.unwrap_or(SUMMARY_CAP),
        "system": parts.system,
        "messages": [{"role": "user", "content": parts.user}],
        "stream": true,
    });
    if let Some(t) = parts.temperature {
        body["temperature"] = t.clone();
    }
    body
}

/// `max_tokens` for a summariser request that named no cap (the Messages API needs one).
const SUMMARY_CAP: u64 = 4096;

/// `sent` (a Messages request) with `max_tokens` set to `cap`.
pub fn with_output_cap(sent: &[u8], cap: u64) -> Option<Vec<u8>> {
    let mut request: Value = serde_json::from_slice(sent).ok()?;
    let obj = request.as_object_mut()?;
    obj.insert("max_tokens".into(), Value::from(cap));
    if let Some(thinking) = obj.get("thinking").and_then(|t| fit_thinking(t, cap)) {
        obj.insert("thinking".into(), thinking);
    }
    serde_json::to_vec(&request).ok()
}

/// A thinking budget must stay below `max_tokens`: lowered with it, to no less than the
/// API's least budget. A cap at or below that least budget leaves the budget as sent, for
/// the upstream to judge.
fn fit_thinking(thinking: &Value, cap: u64) -> Option<Value> {
    let budget = thinking["budget_tokens"].as_u64()?;
    if budget < cap || cap <= MIN_THINKING_BUDGET {
        return None;
    }
    let mut thinking = thinking.clone();
    thinking["budget_tokens"] = Value::from((cap - 1).max(MIN_THINKING_BUDGET));
    Some(thinking)
}

/// A Messages request written back from a view: the client's own fields, in their order,
/// with `messages` and the completion cap replaced.
struct MessagesRewrite<'a> {
    source: &'a Value,
    messages: Vec<Cow<'a, Value>>,
    cap: Option<u64>,
    thinking: Option<Value>,
}

impl<'a> MessagesRewrite<'a> {
    fn new(view: &Value, source: &'a Value) -> Option<MessagesRewrite<'a>> {
        let messages: &[Value] = source["messages"].as_array()?;
        let mut turns: Vec<Turn<'a>> = Vec::new();
        for message in view["messages"].as_array()? {
            if message.get(SYSTEM).is_some() {
                continue;
            }
            let (role, blocks) = match message["role"].as_str() {
                Some("system") => {
                    // The engine keeps instructions as they came: the client's message.
                    let at = message[MSG].as_u64().and_then(|i| messages.get(i as usize));
                    turns.push(Turn::Pinned(at?));
                    continue;
                }
                Some("tool") => ("user", vec![tool_result(message, messages)]),
                Some("user") => ("user", user_blocks(message, messages)),
                Some("assistant") => ("assistant", assistant_blocks(message, messages)),
                _ => return None,
            };
            let from = message[MSG]
                .as_u64()
                .or_else(|| message[SRC][0].as_u64())
                .map(|i| i as usize);
            push_turn(&mut turns, role, from, blocks);
        }
        let messages = turns
            .into_iter()
            .map(|turn| turn.into_message(messages))
            .collect();
        let cap = view["max_tokens"]
            .as_u64()
            .filter(|cap| source.get("max_tokens").and_then(Value::as_u64) != Some(*cap));
        let thinking = cap.and_then(|cap| fit_thinking(&source["thinking"], cap));
        Some(MessagesRewrite {
            source,
            messages,
            cap,
            thinking,
        })
    }
}

impl Serialize for MessagesRewrite<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self.source.as_object();
        let mut map = serializer.serialize_map(fields.map(Map::len))?;
        for (key, value) in fields.into_iter().flatten() {
            match (key.as_str(), self.cap, &self.thinking) {
                ("messages", _, _) => map.serialize_entry(key, &self.messages)?,
                ("max_tokens", Some(cap), _) => map.serialize_entry(key, &cap)?,
                ("thinking", _, Some(thinking)) => map.serialize_entry(key, thinking)?,
                _ => map.serialize_entry(key, value)?,
            }
        }
        map.end()
    }
}

/// One message of the request being written.
enum Turn<'a> {
    /// A client `system` message, as it came.
    Pinned(&'a Value),
    Speaker {
        role: &'static str,
        /// The client message whose fields it takes, if any.
        from: Option<usize>,
        blocks: Vec<Cow<'a, Value>>,
    },
}

/// Adds blocks for `role`: to the last speaker's message when it has the same role, so
/// that what the proxy writes alternates strictly (a tool message and the user's text
/// after it are one user message, results first, as the client had them), else as a
/// message of their own. Instructions in between stay where they are: they do not take a
/// turn.
fn push_turn<'a>(
    turns: &mut Vec<Turn<'a>>,
    role: &'static str,
    from: Option<usize>,
    mut new: Vec<Cow<'a, Value>>,
) {
    let last = turns.iter_mut().rev().find_map(|t| match t {
        Turn::Speaker {
            role: r,
            from: first,
            blocks,
        } => Some((*r, first, blocks)),
        Turn::Pinned(_) => None,
    });
    match last {
        Some((r, first, blocks)) if r == role => {
            // A message the engine opened (its summary) takes the fields of the client
            // message it is written with.
            if first.is_none() {
                *first = from;
            }
            blocks.append(&mut new);
        }
        _ => turns.push(Turn::Speaker {
            role,
            from,
            blocks: new,
        }),
    }
}

impl<'a> Turn<'a> {
    /// The message: the client's own when its blocks are all there as they were, else
    /// the client message's fields with the new content.
    fn into_message(self, messages: &'a [Value]) -> Cow<'a, Value> {
        let (role, from, blocks) = match self {
            Turn::Pinned(message) => return Cow::Borrowed(message),
            Turn::Speaker { role, from, blocks } => (role, from, blocks),
        };
        let original = from.and_then(|i| messages.get(i));
        if let Some(original) = original.filter(|o| o["role"] == role) {
            let theirs = self::blocks(&original["content"]);
            if theirs.len() == blocks.len() && theirs.iter().zip(&blocks).all(|(a, b)| a == b) {
                return Cow::Borrowed(original);
            }
        }
        let mut message = Map::new();
        message.insert("role".into(), Value::from(role));
        let content = Value::Array(blocks.into_iter().map(Cow::into_owned).collect());
        match original.and_then(Value::as_object) {
            Some(fields) => {
                for (key, value) in fields {
                    match key.as_str() {
                        "role" => {}
                        "content" => {
                            message.insert(key.clone(), content.clone());
                        }
                        _ => {
                            message.insert(key.clone(), value.clone());
                        }
                    }
                }
                message.entry("content").or_insert(content);
            }
            None => {
                message.insert("content".into(), content);
            }
        }
        Cow::Owned(Value::Object(message))
    }
}

/// The client block `at` names.
fn block_at<'a>(messages: &'a [Value], at: &Value) -> Option<Cow<'a, Value>> {
    let i = at[0].as_u64()? as usize;
    let j = at[1].as_u64()? as usize;
    match &messages.get(i)?["content"] {
        Value::String(s) if j == 0 => Some(Cow::Owned(json!({"type": "text", "text": s}))),
        Value::Array(list) => list.get(j).map(Cow::Borrowed),
        _ => None,
    }
}

/// Where a block stands in the client's request, for putting a message's blocks back in
/// their order; the engine's own text follows the block before it.
type BlockOrder = (Option<(u64, u64)>, u8);

fn order_of(at: &Value) -> Option<(u64, u64)> {
    Some((at[0].as_u64()?, at[1].as_u64()?))
}

/// The blocks of a view message's content parts, with their order.
fn part_blocks<'a>(message: &Value, messages: &'a [Value]) -> Vec<(BlockOrder, Cow<'a, Value>)> {
    let parts: Vec<Cow<Value>> = match &message["content"] {
        Value::Array(parts) => parts.iter().map(Cow::Borrowed).collect(),
        Value::String(s) => vec![Cow::Owned(json!({"type": "text", "text": s}))],
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    let mut before = None;
    for part in parts {
        let original = block_at(messages, &part[SRC]);
        match (original, part["text"].as_str()) {
            (Some(original), text) => {
                before = order_of(&part[SRC]);
                out.push(((before, 0), patched_text(original, text)));
            }
            // The engine's own text: the summary, a placeholder for stripped media. An
            // empty text block is refused by the API.
            (None, Some(text)) if !text.is_empty() => {
                out.push((
                    (before, 1),
                    Cow::Owned(json!({"type": "text", "text": text})),
                ));
            }
            (None, _) => {}
        }
    }
    out
}

/// A client text block with the engine's text, when it shortened it.
fn patched_text<'a>(original: Cow<'a, Value>, text: Option<&str>) -> Cow<'a, Value> {
    match text {
        Some(text) if kind(&original) == "text" && original["text"] != text => {
            let mut block = original.into_owned();
            block["text"] = Value::from(text);
            Cow::Owned(block)
        }
        _ => original,
    }
}

fn opaque_blocks<'a>(message: &Value, messages: &'a [Value]) -> Vec<(BlockOrder, Cow<'a, Value>)> {
    message[OPAQUE]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| Some(((order_of(entry), 0), block_at(messages, entry)?)))
        .collect()
}

fn sorted<'a>(mut blocks: Vec<(BlockOrder, Cow<'a, Value>)>) -> Vec<(BlockOrder, Cow<'a, Value>)> {
    blocks.sort_by_key(|(order, _)| *order);
    blocks
}

fn user_blocks<'a>(message: &Value, messages: &'a [Value]) -> Vec<Cow<'a, Value>> {
    let mut blocks = part_blocks(message, messages);
    blocks.extend(opaque_blocks(message, messages));
    sorted(blocks).into_iter().map(|(_, b)| b).collect()
}

fn assistant_blocks<'a>(message: &Value, messages: &'a [Value]) -> Vec<Cow<'a, Value>> {
    let mut blocks = part_blocks(message, messages);
    blocks.extend(opaque_blocks(message, messages));
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let block = match block_at(messages, &call[SRC]) {
            Some(original) => patched_call(original, call),
            None => Cow::Owned(json!({"type": "tool_use", "id": call["id"],
                "name": call["function"]["name"], "input": arguments(call).unwrap_or(json!({}))})),
        };
        blocks.push(((order_of(&call[SRC]), 0), block));
    }
    let mut blocks = sorted(blocks);
    // Thinking opens the message it is in, as the API demands: text the engine put
    // before it (a summary folded into this message) goes after it.
    let is_new = |order: &BlockOrder| order.1 == 1;
    let lead = blocks
        .iter()
        .take_while(|(order, b)| is_thinking(b) || is_new(order))
        .count();
    blocks[..lead].sort_by_key(|(_, b)| !is_thinking(b));
    blocks.into_iter().map(|(_, b)| b).collect()
}

fn is_thinking(block: &Value) -> bool {
    matches!(kind(block), "thinking" | "redacted_thinking")
}

fn arguments(call: &Value) -> Option<Value> {
    serde_json::from_str(call["function"]["arguments"].as_str()?).ok()
}

/// A client `tool_use` block with the engine's arguments, when it shortened them (and
/// they still parse: an input the API cannot read is never written).
fn patched_call<'a>(original: Cow<'a, Value>, call: &Value) -> Cow<'a, Value> {
    let unchanged = call["function"]["arguments"].as_str() == Some(&original["input"].to_string());
    match arguments(call) {
        Some(input) if !unchanged => {
            let mut block = original.into_owned();
            block["input"] = input;
            Cow::Owned(block)
        }
        _ => original,
    }
}

/// The `tool_result` block of a view tool message: the client's, with the engine's text
/// in place of its content when it pruned it; a new one for a stub the engine made.
fn tool_result<'a>(message: &Value, messages: &'a [Value]) -> Cow<'a, Value> {
    let text = message["content"]
        .as_str()
        .map_or_else(|| plain_text(&message["content"]), str::to_owned);
    match block_at(messages, &message[SRC]) {
        Some(original) if plain_text(&original["content"]) == text => original,
        Some(original) => {
            let mut block = original.into_owned();
            block["content"] = Value::from(text);
            Cow::Owned(block)
        }
        None => Cow::Owned(json!({"type": "tool_result",
            "tool_use_id": message["tool_call_id"], "content": text})),
    }
}

/// `cache_control` breakpoints in a value: on blocks, tools, messages, and blocks nested
/// in a tool result.
fn breakpoints(value: &Value) -> usize {
    match value {
        Value::Array(list) => list.iter().map(breakpoints).sum(),
        Value::Object(obj) => {
            usize::from(obj.get("cache_control").is_some_and(|c| !c.is_null()))
                + obj.get("content").map_or(0, breakpoints)
        }
        _ => 0,
    }
}

/// Why a Messages request is not one the API accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("messages is missing or empty")]
    NoMessages,
    #[error("messages.{index} is not an object")]
    NotObject { index: usize },
    #[error("messages.{index}.role {role:?} is neither user, assistant nor system")]
    UnknownRole { index: usize, role: String },
    #[error("messages.{index}: the first message (system aside) must be the user's")]
    AssistantFirst { index: usize },
    #[error("messages.{index}: a second {role} message in a row")]
    Repeated { index: usize, role: String },
    #[error("messages.{index}: content is empty")]
    EmptyContent { index: usize },
    #[error("messages.{index}: a text block is empty")]
    EmptyText { index: usize },
    #[error("messages.{index}: tool_use {id:?} has no tool_result in the next message")]
    Unanswered { index: usize, id: String },
    #[error("messages.{index}: tool_result blocks must come first in the message")]
    ResultsNotFirst { index: usize },
    #[error("messages.{index}: tool_result {id:?} answers no tool_use of the message before")]
    Orphan { index: usize, id: String },
    #[error("messages.{index}: tool_result blocks are only allowed in user messages")]
    ResultOutsideUser { index: usize },
    #[error("messages.{index}: thinking blocks are only allowed in assistant messages")]
    ThinkingOutsideAssistant { index: usize },
    #[error("messages.{index}: tool_use id {id:?} is used twice")]
    DuplicateToolUse { index: usize, id: String },
    #[error("{count} cache_control breakpoints, more than {MAX_BREAKPOINTS}")]
    TooManyBreakpoints { count: usize },
}

/// Checks what the Messages API checks: roles alternate user/assistant from the user on
/// (`system` messages take no turn), every `tool_use` answered by a `tool_result` first
/// thing in the next message, no `tool_result` without its `tool_use`, no empty content,
/// thinking only from the assistant, at most four `cache_control` breakpoints in all.
pub fn validate(request: &Value) -> Result<(), Invalid> {
    let messages: Vec<&Value> = request["messages"]
        .as_array()
        .map(|m| m.iter().collect())
        .unwrap_or_default();
    check(
        &messages,
        breakpoints(&request["system"]) + breakpoints(&request["tools"]),
    )
}

fn check<M: Borrow<Value>>(messages: &[M], mut breakpoints_before: usize) -> Result<(), Invalid> {
    if messages.is_empty() {
        return Err(Invalid::NoMessages);
    }
    let mut previous: Option<&str> = None;
    // The tool_use ids of the last assistant message, and where it was.
    let mut open: Vec<String> = Vec::new();
    let mut open_at = 0;
    let mut ids = HashSet::new();
    let last = messages.len() - 1;
    for (index, message) in messages.iter().map(Borrow::borrow).enumerate() {
        if !message.is_object() {
            return Err(Invalid::NotObject { index });
        }
        breakpoints_before += breakpoints(message);
        let role = message["role"].as_str().unwrap_or("");
        match role {
            "system" => continue,
            "user" | "assistant" => {}
            other => {
                return Err(Invalid::UnknownRole {
                    index,
                    role: other.to_owned(),
                })
            }
        }
        match previous {
            None if role == "assistant" => return Err(Invalid::AssistantFirst { index }),
            Some(p) if p == role => {
                return Err(Invalid::Repeated {
                    index,
                    role: role.to_owned(),
                })
            }
            _ => {}
        }
        let content = blocks(&message["content"]);
        let prefill = index == last && role == "assistant";
        if content.is_empty() && !prefill {
            return Err(Invalid::EmptyContent { index });
        }
        if content.iter().any(|b| kind(b) == "text" && b["text"] == "") {
            return Err(Invalid::EmptyText { index });
        }
        let results: Vec<&str> = content
            .iter()
            .filter(|b| kind(b) == "tool_result")
            .map(|b| b["tool_use_id"].as_str().unwrap_or(""))
            .collect();
        if role == "user" {
            if content.iter().any(|b| is_thinking(b)) {
                return Err(Invalid::ThinkingOutsideAssistant { index });
            }
            let leading = content
                .iter()
                .take_while(|b| kind(b) == "tool_result")
                .count();
            if leading != results.len() {
                return Err(Invalid::ResultsNotFirst { index });
            }
            for id in results {
                let Some(at) = open.iter().position(|o| o == id) else {
                    return Err(Invalid::Orphan {
                        index,
                        id: id.to_owned(),
                    });
                };
                open.remove(at);
            }
        } else if !results.is_empty() {
            return Err(Invalid::ResultOutsideUser { index });
        }
        if let Some(id) = open.first() {
            return Err(Invalid::Unanswered {
                index: open_at,
                id: id.clone(),
            });
        }
        if role == "assistant" {
            for block in content.iter().filter(|b| kind(b) == "tool_use") {
                let id = block["id"].as_str().unwrap_or("").to_owned();
                if !ids.insert(id.clone()) {
                    return Err(Invalid::DuplicateToolUse { index, id });
                }
                open.push(id);
            }
            open_at = index;
        }
        previous = Some(role);
    }
    if let Some(id) = open.first() {
        return Err(Invalid::Unanswered {
            index: open_at,
            id: id.clone(),
        });
    }
    if breakpoints_before > MAX_BREAKPOINTS {
        return Err(Invalid::TooManyBreakpoints {
            count: breakpoints_before,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Claude Code request in miniature: system blocks with breakpoints, a `system`
    /// message, thinking before a tool call, a tool result with a rolling breakpoint.
    fn request() -> Value {
        json!({"model": "claude-opus-5-5", "max_tokens": 128000, "stream": true,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "system", "content": "<env>linux</env>", "output_config": {"effort": "medium"}},
            {"role": "user", "content": "fix the build"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "run make", "signature": "sig1"},
                {"type": "text", "text": "Running make."},
                {"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"command": "make"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": "error: boom", "is_error": true},
                {"type": "text", "text": "<system-reminder>todo</system-reminder>"}]},
            {"role": "assistant", "content": [
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"query": "boom"}},
                {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                {"type": "text", "text": "Fixed it."}]},
            {"role": "user", "content": [{"type": "text", "text": "thanks",
                "cache_control": {"type": "ephemeral"}}], "x_later": 1},
        ]})
    }

    fn written(view: &Value, source: &Value) -> Value {
        serde_json::from_slice(&encode(view, source).unwrap()).unwrap()
    }

    #[test]
    fn the_summariser_s_request_is_written_as_messages() {
        let chat = serde_json::json!({"model": "claude-x", "max_completion_tokens": 900,
            "temperature": 0.2, "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "system", "content": "You are writing a checkpoint"},
                         {"role": "user", "content": "<turns>"}]});
        let body = summary_request(&chat);
        assert_eq!(
            body,
            serde_json::json!({"model": "claude-x", "max_tokens": 900,
            "system": "You are writing a checkpoint", "temperature": 0.2, "stream": true,
            "messages": [{"role": "user", "content": "<turns>"}]})
        );
        assert!(validate(&body).is_ok());
    }

    #[test]
    fn the_view_is_valid_chat_and_an_untouched_view_writes_back_byte_for_byte() {
        let original = request();
        validate(&original).unwrap();
        let view = to_chat(&original).unwrap();
        let messages = view["messages"].as_array().unwrap();
        crate::engine::validate_strict(messages).unwrap();
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(
            roles,
            [
                "system",
                "system",
                "user",
                "assistant",
                "tool",
                "user",
                "assistant",
                "user"
            ]
        );
        assert_eq!(
            messages[3]["tool_calls"][0]["function"]["arguments"],
            "{\"command\":\"make\"}"
        );
        assert_eq!(
            messages[6][OPAQUE].as_array().unwrap().len(),
            2,
            "server tool blocks ride along"
        );
        assert_eq!(view["max_tokens"], 128000);
        assert_eq!(
            encode(&view, &original).unwrap(),
            serde_json::to_vec(&original).unwrap()
        );
    }

    #[test]
    fn a_summary_before_the_latest_user_turn_keeps_every_kept_block_as_it_was() {
        let original = request();
        let mut view = to_chat(&original).unwrap();
        let messages = view["messages"].as_array_mut().unwrap();
        // The engine summarised the first exchange and folded the summary into the
        // next user message (the user message standing for the tool result's turn).
        messages.splice(2..5, []);
        messages[2]["content"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"type": "text", "text": "[summary] make failed"}));
        messages[2]["role"] = json!("user");
        view["max_tokens"] = json!(6000);
        let out = written(&view, &original);
        validate(&out).unwrap();
        let sent = out["messages"].as_array().unwrap();
        let source = original["messages"].as_array().unwrap();
        assert_eq!(sent[0], source[0], "the system message as it came");
        assert_eq!(sent[1]["content"][0]["text"], "[summary] make failed");
        assert_eq!(sent[1]["content"][1], source[3]["content"][1]);
        assert_eq!(sent[2], source[4], "server tool blocks whole");
        assert_eq!(sent[3], source[5], "the latest message and its own fields");
        for key in [
            "system",
            "tools",
            "thinking",
            "context_management",
            "stream",
            "model",
        ] {
            assert_eq!(out[key], original[key], "{key}");
        }
        assert_eq!(out["max_tokens"], 6000);
    }

    #[test]
    fn thinking_still_opens_an_assistant_message_the_summary_was_folded_into() {
        let original = request();
        let mut view = to_chat(&original).unwrap();
        let messages = view["messages"].as_array_mut().unwrap();
        messages[3]["content"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"type": "text", "text": "[summary]"}));
        let out = written(&view, &original);
        let blocks = out["messages"][2]["content"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "thinking");
        assert_eq!(blocks[0], original["messages"][2]["content"][0]);
        assert_eq!(blocks[1]["text"], "[summary]");
        assert_eq!(blocks[3]["type"], "tool_use");
    }

    #[test]
    fn pruned_results_and_cut_arguments_are_patched_in_their_own_blocks() {
        let original = request();
        let mut view = to_chat(&original).unwrap();
        let messages = view["messages"].as_array_mut().unwrap();
        messages[4]["content"] = json!("[output pruned]");
        messages[3]["tool_calls"][0]["function"]["arguments"] = json!("{\"command\":\"ma…\"}");
        messages[7]["content"][0]["text"] = json!("tha…");
        let out = written(&view, &original);
        let sent = &out["messages"];
        assert_eq!(
            sent[3]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "tu_1", "content": "[output pruned]", "is_error": true})
        );
        assert_eq!(sent[2]["content"][2]["input"], json!({"command": "ma…"}));
        assert_eq!(
            sent[5]["content"][0],
            json!({"type": "text", "text": "tha…", "cache_control": {"type": "ephemeral"}}),
            "a shortened block keeps its breakpoint"
        );
        assert_eq!(sent[5]["x_later"], 1);
    }

    #[test]
    fn a_screenshot_a_tool_returned_is_counted_and_goes_with_its_pruned_output() {
        let mut original = request();
        let shot = json!({"type": "image", "source": {"type": "base64",
            "media_type": "image/png", "data": "iVBOR".repeat(2_000)}});
        original["messages"][3]["content"][0]["content"] =
            json!([{"type": "text", "text": "saved screen.png"}, shot]);
        let view = to_chat(&original).unwrap();
        let tool = &view["messages"][4];
        assert_eq!(tool["content"][1]["type"], "image_url");
        let text_only = json!({"model": view["model"],
            "messages": [{"role": "tool", "tool_call_id": "tu_1", "content": "saved screen.png"}]});
        let with_image = json!({"model": view["model"], "messages": [tool]});
        assert!(
            crate::engine::count_request(&with_image)
                >= crate::engine::count_request(&text_only) + 500,
            "the image costs what an image costs"
        );
        assert_eq!(
            encode(&view, &original).unwrap(),
            serde_json::to_vec(&original).unwrap(),
            "an untouched result is the client's block"
        );
        let mut pruned = view.clone();
        pruned["messages"][4]["content"] = json!("[screenshot pruned]");
        let out = written(&pruned, &original);
        assert_eq!(
            out["messages"][3]["content"][0]["content"],
            "[screenshot pruned]"
        );
    }

    #[test]
    fn what_would_be_invalid_is_not_written() {
        let original = request();
        let mut view = to_chat(&original).unwrap();
        // A tool call whose result is gone.
        view["messages"].as_array_mut().unwrap().remove(4);
        assert_eq!(encode(&view, &original), None);
    }

    #[test]
    fn provider_compaction_wins_and_context_editing_does_not_stop_compaction() {
        let bytes = |v: &Value| serde_json::to_vec(v).unwrap();
        let h = steering(&bytes(&request())).unwrap();
        assert_eq!(h.max_output, Some(128000));
        assert_eq!(h.max_output_field, Some("max_tokens"));
        assert!(h.stream);
        let mut compacting = request();
        compacting["context_management"]["edits"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}}));
        assert_eq!(steering(&bytes(&compacting)), None);
        let mut compacted = request();
        compacted["messages"][2]["content"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"type": "compaction", "content": "earlier turns"}));
        assert_eq!(steering(&bytes(&compacted)), None);
        // A text that merely says "compaction" is no compaction block.
        let mut said = request();
        said["messages"][1]["content"] = json!("compaction");
        assert!(steering(&bytes(&said)).is_some());
        assert_eq!(steering(br#"{"model":"m","max_tokens":5}"#), None);
    }

    #[test]
    fn a_lower_cap_takes_the_thinking_budget_down_with_it() {
        let sent = br#"{"max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":16000},"messages":[]}"#;
        let out: Value = serde_json::from_slice(&with_output_cap(sent, 9000).unwrap()).unwrap();
        assert_eq!(out["max_tokens"], 9000);
        assert_eq!(out["thinking"]["budget_tokens"], 8999);
        let out: Value = serde_json::from_slice(&with_output_cap(sent, 20000).unwrap()).unwrap();
        assert_eq!(out["thinking"]["budget_tokens"], 16000, "already below");
    }

    #[test]
    fn the_validator_knows_the_apis_rules() {
        let with = |messages: Value| json!({"messages": messages});
        let call = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]});
        let result = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "1"});
        let user = |content: Value| json!({"role": "user", "content": content});
        let q = user(json!("q"));
        assert!(validate(&with(json!([q, call, user(json!([result("a")]))]))).is_ok());
        let cases = [
            (json!([]), "NoMessages"),
            (json!([call]), "AssistantFirst"),
            (json!([q, q]), "Repeated"),
            (json!([q, call, q]), "Unanswered"),
            (json!([q, call]), "Unanswered"),
            (
                json!([
                    q,
                    call,
                    user(json!([{"type": "text", "text": "x"}, result("a")]))
                ]),
                "ResultsNotFirst",
            ),
            (json!([q, call, user(json!([result("b")]))]), "Orphan"),
            (
                json!([user(
                    json!([{"type": "thinking", "thinking": "t", "signature": "s"}])
                )]),
                "ThinkingOutsideAssistant",
            ),
            (
                json!([user(json!([{"type": "text", "text": ""}]))]),
                "EmptyText",
            ),
            (json!([user(json!([]))]), "EmptyContent"),
            (json!([{"role": "tool", "content": "x"}]), "UnknownRole"),
        ];
        for (messages, want) in cases {
            let got = format!("{:?}", validate(&with(messages.clone())));
            assert!(got.contains(want), "{messages}: {got}");
        }
        // System messages take no turn; a final assistant message may be a prefill.
        let sys = json!({"role": "system", "content": "s"});
        assert!(validate(&with(
            json!([sys, q, sys, {"role": "assistant", "content": "a"}])
        ))
        .is_ok());
        let marked = json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
        let five = json!({"system": [marked, marked], "messages": [user(json!([marked, marked, marked]))]});
        assert_eq!(
            validate(&five),
            Err(Invalid::TooManyBreakpoints { count: 5 })
        );
    }
}
