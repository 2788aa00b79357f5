//! The mock upstream as Anthropic's Messages API (`POST .../v1/messages`): a window in
//! the mock's own tokens (`x-mock-window`), Anthropic's refusals for a request over it
//! (`x-mock-shape`), every request checked as the API checks it (what it finds goes to
//! `violations`), and answers in Anthropic's shape, streamed in its event order.
//!
//! With `x-mock-answer: agent` it answers as a model driving a coding agent (Claude
//! Code) would: see [`agent`].

use std::sync::atomic::{AtomicUsize, Ordering};

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use super::{checksum, full, header_str, json, plain, sse_response, MockBody, MockState};
use compaction_proxy::wire::messages::validate;

/// The mock's count of a Messages request: about one token per three characters of its
/// texts (system, messages, tools), and a few per message; deliberately not ours.
pub fn tokens(request: &Value) -> u64 {
    let chars =
        text_len(&request["system"]) + text_len(&request["messages"]) + text_len(&request["tools"]);
    let messages = request["messages"].as_array().map_or(0, Vec::len) as u64;
    chars as u64 / 3 + messages * 6
}

fn text_len(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(list) => list.iter().map(text_len).sum(),
        Value::Object(obj) => obj.values().map(text_len).sum(),
        _ => 0,
    }
}

/// Answers a Messages request. Over the window, by `x-mock-shape`: `anthropic` (the
/// default: 400 "prompt is too long"), `anthropic-max-tokens` (also counting
/// `max_tokens`: 400 "input length and `max_tokens` exceed context limit"),
/// `anthropic-413` (a body over three bytes per token of window: 413
/// `request_too_large`), `anthropic-stream` (a streamed request gets a 200 whose stream
/// says "prompt is too long" in an `error` event).
pub fn messages_window(state: &MockState, headers: &HeaderMap, body: &[u8]) -> Response<MockBody> {
    let limit: u64 = header_str(headers, "x-mock-window").parse().unwrap_or(4096);
    let shape = header_str(headers, "x-mock-shape");
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return plain(StatusCode::BAD_REQUEST, "not json");
    };
    if let Err(e) = validate(&request) {
        state.violations.lock().unwrap().push(e.to_string());
        return error(400, "invalid_request_error", &e.to_string());
    }
    let as_agent = header_str(headers, "x-mock-answer") == "agent";
    if as_agent {
        if let Some(e) = forged_thinking(&request) {
            state.violations.lock().unwrap().push(e.clone());
            return error(400, "invalid_request_error", &e);
        }
    }
    let prompt = tokens(&request);
    let output = request["max_tokens"].as_u64().unwrap_or(0);
    let stream = request["stream"] == true;
    let too_long = format!("prompt is too long: {prompt} tokens > {limit} maximum");
    match shape {
        "anthropic-413" if body.len() as u64 > limit * 3 => {
            return error(413, "request_too_large", "Request exceeds the maximum size")
        }
        "anthropic-413" => {}
        _ if prompt > limit => {
            if shape == "anthropic-stream" && stream {
                return stream_error(&too_long);
            }
            return error(400, "invalid_request_error", &too_long);
        }
        "anthropic-max-tokens" if prompt + output > limit => {
            let message = format!("input length and `max_tokens` exceed context limit: {prompt} + {output} > {limit}, decrease input length or `max_tokens` and try again");
            return error(400, "invalid_request_error", &message);
        }
        _ => {}
    }
    let messages = request["messages"].as_array().map_or(0, Vec::len);
    let content = if as_agent {
        agent(&request)
    } else {
        vec![json!({"type": "text", "text": format!("MOCK-MESSAGE: saw {messages} messages")})]
    };
    let stop = if content.iter().any(|b| b["type"] == "tool_use") {
        "tool_use"
    } else {
        "end_turn"
    };
    if stream {
        answer_stream(&content, stop, prompt)
    } else {
        json(json!({"id": message_id(), "type": "message", "role": "assistant", "model": request["model"],
            "content": content, "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": output_tokens(&content)}}).to_string())
    }
}

/// What the mock's summary says when an agent compacts by itself.
pub const AGENT_SUMMARY: &str =
    "1. Primary Request: run the commands the user names and report on their output.";

/// Marks what Claude Code asks when it compacts by itself: a last user message telling
/// the model to summarise without tools.
pub const OWN_COMPACTION: &str = "Do NOT call any tools";

/// A new message id: a client may key what it stores by it (Claude Code files the blocks
/// of one streamed message under its id, and rebuilds the message from them on resume).
fn message_id() -> String {
    static IDS: AtomicUsize = AtomicUsize::new(0);
    format!("msg_mock{:06}", IDS.fetch_add(1, Ordering::Relaxed))
}

/// Tool ids the mock hands out, unique over every session of the test binary: the API
/// refuses a request in which two `tool_use` blocks share an id.
static TOOL_IDS: AtomicUsize = AtomicUsize::new(0);

/// What a model driving a coding agent answers, from where the conversation stands,
/// always opening with a signed `thinking` block (the agent must send it back as it was):
/// - the agent's own compaction request: a `<summary>`, as its prompt asks;
/// - a prompt saying "run `COMMAND`" not yet answered by a tool result: a `Bash`
///   `tool_use` running that command (the agent runs it and sends its output back);
/// - otherwise (the command's output came back, or nothing to run): a long text answer,
///   so that the history grows with every turn.
pub fn agent(request: &Value) -> Vec<Value> {
    let conversation: Vec<&Value> = request["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] != "system").collect())
        .unwrap_or_default();
    let prompt = conversation
        .iter()
        .rev()
        .filter(|m| m["role"] == "user")
        .map(|m| prompt_text(m))
        .find(|text| !text.is_empty())
        .unwrap_or_default();
    let answered = conversation.last().is_some_and(|m| {
        m["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
    });
    let command = prompt
        .split_once("run `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(command, _)| command.to_owned());
    let (thought, last) = if prompt.contains(OWN_COMPACTION) {
        let summary = format!("<analysis>The user ran commands and read their output.</analysis>\n<summary>\n{AGENT_SUMMARY}\n</summary>");
        (
            "Summarise the conversation.",
            json!({"type": "text", "text": summary}),
        )
    } else if let (Some(command), false) = (command, answered) {
        let id = format!("toolu_mock{:06}", TOOL_IDS.fetch_add(1, Ordering::Relaxed));
        let input =
            json!({"command": command, "description": "Run the command the user asked for"});
        (
            "Run the command first.",
            json!({"type": "tool_use", "id": id, "name": "Bash", "input": input}),
        )
    } else {
        let text = format!(
            "MOCK-AGENT: done ({} messages seen). {}",
            conversation.len(),
            "The output was read line by line and every line is as expected. ".repeat(40)
        );
        (
            "Report on the output.",
            json!({"type": "text", "text": text}),
        )
    };
    vec![thinking(thought), last]
}

/// The text the user typed in a user message: its text blocks but the reminders the
/// agent adds (`<system-reminder>`); empty for a message of tool results only.
fn prompt_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .filter(|t| !t.trim_start().starts_with("<system-reminder>"))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A `thinking` block and its signature, which the mock checks when the block comes back.
fn thinking(text: &str) -> Value {
    json!({"type": "thinking", "thinking": text, "signature": signature(text)})
}

fn signature(thinking: &str) -> String {
    format!("mock-sig-{:016x}", checksum(0, thinking.as_bytes()))
}

/// A `thinking` block sent back edited, as Anthropic refuses it ("Invalid `signature`
/// in `thinking` block").
fn forged_thinking(request: &Value) -> Option<String> {
    let messages = request["messages"].as_array()?;
    messages.iter().enumerate().find_map(|(i, m)| {
        let blocks = m["content"].as_array()?;
        blocks.iter().enumerate().find_map(|(j, b)| {
            let signed = b["type"] == "thinking"
                && b["signature"].as_str()
                    != Some(&signature(b["thinking"].as_str().unwrap_or("")));
            signed.then(|| {
                format!("messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
            })
        })
    })
}

fn output_tokens(content: &[Value]) -> u64 {
    text_len(&Value::from(content.to_vec())) as u64 / 3 + 1
}

fn error(status: u16, kind: &str, message: &str) -> Response<MockBody> {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_mock"});
    let mut response = json(body.to_string());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}

fn event(data: &Value) -> String {
    format!(
        "event: {}\ndata: {data}\n\n",
        data["type"].as_str().unwrap()
    )
}

fn message_start(input_tokens: u64) -> String {
    event(
        &json!({"type": "message_start", "message": {"id": message_id(), "type": "message",
        "role": "assistant", "model": "mock", "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
    )
}

/// A refusal as a stream tells it: the message opens, then an `error` event.
fn stream_error(message: &str) -> Response<MockBody> {
    let events = [
        message_start(0),
        event(&json!({"type": "ping"})),
        event(&json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})),
    ]
    .concat();
    sse_response(full(events))
}

/// `content` streamed in Anthropic's event order: each block opens empty and arrives in
/// two deltas (text, thinking then its signature, or a tool's input as partial JSON).
fn answer_stream(content: &[Value], stop: &str, input_tokens: u64) -> Response<MockBody> {
    let mut events = vec![message_start(input_tokens), event(&json!({"type": "ping"}))];
    for (index, block) in content.iter().enumerate() {
        let halves = |s: &str| {
            let mid = (0..=s.len() / 2)
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            [s[..mid].to_owned(), s[mid..].to_owned()]
        };
        let (start, deltas) = match block["type"].as_str().unwrap() {
            "thinking" => {
                let [a, b] = halves(block["thinking"].as_str().unwrap());
                (
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    vec![
                        json!({"type": "thinking_delta", "thinking": a}),
                        json!({"type": "thinking_delta", "thinking": b}),
                        json!({"type": "signature_delta", "signature": block["signature"]}),
                    ],
                )
            }
            "tool_use" => {
                let [a, b] = halves(&block["input"].to_string());
                (
                    json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                    vec![
                        json!({"type": "input_json_delta", "partial_json": a}),
                        json!({"type": "input_json_delta", "partial_json": b}),
                    ],
                )
            }
            _ => {
                let [a, b] = halves(block["text"].as_str().unwrap());
                (
                    json!({"type": "text", "text": ""}),
                    vec![
                        json!({"type": "text_delta", "text": a}),
                        json!({"type": "text_delta", "text": b}),
                    ],
                )
            }
        };
        events.push(event(
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            events.push(event(
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(event(
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.extend([
        event(
            &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens(content)}}),
        ),
        event(&json!({"type": "message_stop"})),
    ]);
    sse_response(full(events.concat()))
}
