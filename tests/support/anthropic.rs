//! The mock upstream as Anthropic's Messages API (`POST .../v1/messages`): a window in
//! the mock's own tokens (`x-mock-window`), Anthropic's refusals for a request over it
//! (`x-mock-shape`), every request checked as the API checks it (what it finds goes to
//! `violations`), and answers in Anthropic's shape, streamed in its event order.
//!
//! It plays a model as far as a client's loop needs: with `thinking` enabled it thinks
//! first, in a signed block the API would reject if it came back altered; with
//! `x-mock-tools: call` it calls the request's first tool until a tool result comes back.
//! With `x-mock-answer: agent` it answers as a model driving a coding agent (Claude
//! Code) would: see [`agent`].

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use super::{full, header_str, json, plain, sse_response, MockBody, MockState};
use compaction_proxy::dialect::messages::validate;

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
/// says "prompt is too long" in an `error` event); and as Anthropic-compatible servers
/// refuse on their `/v1/messages`, in the wording of their other endpoints: `llamacpp`,
/// `vllm-new`, and `litellm` (the provider's error inside LiteLLM's own envelope).
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
    if let Err(e) = check_thinking(&request) {
        state.violations.lock().unwrap().push(e.clone());
        return error(400, "invalid_request_error", &e);
    }
    let prompt = tokens(&request);
    let output = request["max_tokens"].as_u64().unwrap_or(0);
    let stream = request["stream"] == true;
    let too_long = format!("prompt is too long: {prompt} tokens > {limit} maximum");
    match shape {
        "llamacpp" | "vllm-new" if prompt > limit => {
            return super::overflow(shape, prompt, output, limit, stream)
        }
        "litellm" if prompt > limit => {
            let inner = json!({"type": "error", "error": {"type": "invalid_request_error", "message": too_long}});
            let message = format!("litellm.BadRequestError: AnthropicException - {inner}");
            let body =
                json!({"error": {"message": message, "type": null, "param": null, "code": "400"}});
            let mut response = Response::new(full(body.to_string()));
            *response.status_mut() = StatusCode::BAD_REQUEST;
            response
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            return response;
        }
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
    let (content, stop_reason) = if header_str(headers, "x-mock-answer") == "agent" {
        agent(&request)
    } else {
        answer(headers, &request)
    };
    if stream {
        stream_blocks(&content, stop_reason, prompt)
    } else {
        json(json!({"id": message_id(), "type": "message", "role": "assistant", "model": request["model"],
            "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": 5}}).to_string())
    }
}

/// Numbers the mock's answers, so that no two thinking blocks or tool calls are alike.
static ANSWERS: AtomicU64 = AtomicU64::new(0);

/// A new message id: a client may key what it stores by it (Claude Code files the blocks
/// of one streamed message under its id, and rebuilds the message from them on resume).
fn message_id() -> String {
    static IDS: AtomicU64 = AtomicU64::new(0);
    format!("msg_mock{:06}", IDS.fetch_add(1, Ordering::Relaxed))
}

/// What the mock's summary says when an agent compacts by itself.
pub const AGENT_SUMMARY: &str =
    "1. Primary Request: run the commands the user names and report on their output.";

/// Marks what Claude Code asks when it compacts by itself: a last user message telling
/// the model to summarise without tools.
pub const OWN_COMPACTION: &str = "Do NOT call any tools";

/// What a model driving a coding agent answers, from where the conversation stands,
/// always opening with a signed `thinking` block (the agent must send it back as it was),
/// and its stop reason:
/// - the agent's own compaction request: a `<summary>`, as its prompt asks;
/// - a prompt saying "run `COMMAND`" not yet answered by a tool result: a `Bash`
///   `tool_use` running that command (the agent runs it and sends its output back);
/// - otherwise (the command's output came back, or nothing to run): a long text answer,
///   so that the history grows with every turn.
pub fn agent(request: &Value) -> (Vec<Value>, &'static str) {
    let n = ANSWERS.fetch_add(1, Ordering::Relaxed);
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
    let thinking =
        |text: &str| json!({"type": "thinking", "thinking": text, "signature": signature(text)});
    if prompt.contains(OWN_COMPACTION) {
        let summary = format!("<analysis>The user ran commands and read their output.</analysis>\n<summary>\n{AGENT_SUMMARY}\n</summary>");
        let content = vec![
            thinking(&format!("Answer {n}: summarise the conversation.")),
            json!({"type": "text", "text": summary}),
        ];
        return (content, "end_turn");
    }
    if let (Some(command), false) = (command, answered) {
        let input =
            json!({"command": command, "description": "Run the command the user asked for"});
        let content = vec![
            thinking(&format!("Answer {n}: run the command first.")),
            json!({"type": "tool_use", "id": format!("toolu_mock_{n:06}"), "name": "Bash", "input": input}),
        ];
        return (content, "tool_use");
    }
    let text = format!(
        "MOCK-AGENT: done ({} messages seen). {}",
        conversation.len(),
        "The output was read line by line and every line is as expected. ".repeat(40)
    );
    let content = vec![
        thinking(&format!("Answer {n}: report on the output.")),
        json!({"type": "text", "text": text}),
    ];
    (content, "end_turn")
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

/// The content blocks of the answer to `request`, and its stop reason: a signed thinking
/// block first when the request enables thinking; then, with `x-mock-tools: call`, a call
/// of the first tool unless the last message brings tool results; else the text
/// "MOCK-MESSAGE: saw N messages".
fn answer(headers: &HeaderMap, request: &Value) -> (Vec<Value>, &'static str) {
    let n = ANSWERS.fetch_add(1, Ordering::Relaxed);
    let messages = request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let mut content = Vec::new();
    if request["thinking"]["type"] == "enabled" {
        let thinking = format!("Answer {n}: {} messages so far; what next?", messages.len());
        content.push(
            json!({"type": "thinking", "signature": signature(&thinking), "thinking": thinking}),
        );
    }
    let brings_results = messages.last().is_some_and(|m| {
        m["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
    });
    let tool = &request["tools"][0]["name"];
    if header_str(headers, "x-mock-tools") == "call" && tool.is_string() && !brings_results {
        content.push(
            json!({"type": "tool_use", "id": format!("toolu_mock_{n:06}"), "name": tool,
            "input": {"path": format!("build_{n}.log")}}),
        );
        return (content, "tool_use");
    }
    let reply = format!("MOCK-MESSAGE: saw {} messages", messages.len());
    content.push(json!({"type": "text", "text": reply}));
    (content, "end_turn")
}

/// The mock's signature of a thinking text. Anthropic's signatures are opaque; this one
/// is checkable, so that a thinking block altered on its way back is caught.
pub fn signature(thinking: &str) -> String {
    let mut hasher = DefaultHasher::new();
    thinking.hash(&mut hasher);
    format!("mock-sig-{:016x}", hasher.finish())
}

/// What the API checks of thinking blocks sent back: each as the model wrote it (the
/// mock's signature matches its text), and, with thinking enabled, a budget of at least
/// 1024 tokens below `max_tokens`, and the assistant message whose
/// tool calls the last message answers still opening with its thinking (the API's "a
/// final assistant message must start with a thinking block").
fn check_thinking(request: &Value) -> Result<(), String> {
    let messages = request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for (i, message) in messages.iter().enumerate() {
        for block in message["content"].as_array().into_iter().flatten() {
            // Only the mock's own signatures can be checked: tests write others by hand.
            let signed = block["signature"]
                .as_str()
                .filter(|s| s.starts_with("mock-sig-"));
            let Some(signed) = signed.filter(|_| block["type"] == "thinking") else {
                continue;
            };
            if signed != signature(block["thinking"].as_str().unwrap_or("")) {
                return Err(format!(
                    "messages.{i}: invalid signature in thinking block: {block}"
                ));
            }
        }
    }
    if request["thinking"]["type"] != "enabled" {
        return Ok(());
    }
    let budget = request["thinking"]["budget_tokens"].as_u64().unwrap_or(0);
    let max_tokens = request["max_tokens"].as_u64().unwrap_or(0);
    if budget < 1024 || budget >= max_tokens {
        return Err(format!("thinking.budget_tokens {budget}: must be at least 1024 and less than max_tokens ({max_tokens})"));
    }
    let answers_calls = messages
        .last()
        .is_some_and(|m| m["role"] == "user" && m["content"][0]["type"] == "tool_result");
    let calling = messages.iter().rposition(|m| m["role"] == "assistant");
    if let (true, Some(i)) = (answers_calls, calling) {
        let first = &messages[i]["content"][0]["type"];
        if first != "thinking" && first != "redacted_thinking" {
            return Err(format!("messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found {first}. When `thinking` is enabled, a final `assistant` message must start with a thinking block"));
        }
    }
    Ok(())
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

/// `reply` streamed in Anthropic's event order, in two deltas.
pub fn answer_stream(reply: &str, input_tokens: u64) -> Response<MockBody> {
    stream_blocks(
        &[json!({"type": "text", "text": reply})],
        "end_turn",
        input_tokens,
    )
}

/// `content` streamed in Anthropic's event order: each block opened empty, filled by
/// deltas (text in two; thinking, then its signature; a tool's input as JSON), closed.
fn stream_blocks(content: &[Value], stop_reason: &str, input_tokens: u64) -> Response<MockBody> {
    let mut events = vec![message_start(input_tokens), event(&json!({"type": "ping"}))];
    for (index, block) in content.iter().enumerate() {
        let (start, deltas) = match block["type"].as_str().unwrap() {
            "thinking" => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
            ),
            "tool_use" => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                vec![
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                ],
            ),
            _ => {
                let text = block["text"].as_str().unwrap();
                let (a, b) = text.split_at(text.len() / 2);
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
        event(&json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {"input_tokens": input_tokens, "output_tokens": 5}})),
        event(&json!({"type": "message_stop"})),
    ]);
    sse_response(full(events.concat()))
}
