//! The mock upstream as Anthropic's Messages API (`POST .../v1/messages`): a window in
//! the mock's own tokens (`x-mock-window`), Anthropic's refusals for a request over it
//! (`x-mock-shape`), every request checked as the API checks it (what it finds goes to
//! `violations`), and answers in Anthropic's shape, streamed in its event order.

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use super::{full, header_str, json, plain, sse_response, MockBody, MockState};
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
    let reply = format!("MOCK-MESSAGE: saw {messages} messages");
    if stream {
        answer_stream(&reply, prompt)
    } else {
        json(json!({"id": "msg_mock", "type": "message", "role": "assistant", "model": request["model"],
            "content": [{"type": "text", "text": reply}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": 5}}).to_string())
    }
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
        &json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message",
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
    let (a, b) = reply.split_at(reply.len() / 2);
    let delta = |text: &str| {
        event(&json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}}))
    };
    let events = [
        message_start(input_tokens),
        event(&json!({"type": "ping"})),
        event(&json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}})),
        delta(a),
        delta(b),
        event(&json!({"type": "content_block_stop", "index": 0})),
        event(&json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"input_tokens": input_tokens, "output_tokens": 5}})),
        event(&json!({"type": "message_stop"})),
    ]
    .concat();
    sse_response(full(events))
}
