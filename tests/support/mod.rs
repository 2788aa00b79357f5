//! Test harness: a mock OpenAI-compatible upstream on loopback that records what it
//! receives, and the real `compaction-proxy` binary started against it on port 0.
//!
//! The mock's behaviour for a request is chosen by its `x-mock` header (the proxy
//! forwards it untouched), so one mock serves every scenario. Summariser calls (the
//! proxy's own, recognised by the checkpoint prompt) are recorded apart and answered as
//! `x-mock-summary` says (after `x-mock-summary-delay-ms`), whatever `x-mock` is.
//! `x-mock: media` takes at most `x-mock-max-media` media parts and `x-mock-max-messages`
//! messages (or Responses items) in one request.

// A harness that cannot set up a scenario should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

pub mod anthropic;
pub mod props;

type MockBody = UnsyncBoxBody<Bytes, Infallible>;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When the mock had read it whole.
    pub at: Instant,
}

#[derive(Default)]
pub struct MockState {
    pub recorded: Mutex<Vec<Recorded>>,
    /// Released by a test to let a gated stream finish.
    pub gate: Notify,
    /// Signalled when the proxy dropped a stream the mock was still writing.
    pub stream_cancelled: Notify,
    /// Bytes received by the `sink` behaviour, for uploads too big to record.
    pub sunk: Mutex<Vec<(u64, u64)>>,
    /// Summariser calls the proxy made, apart from `recorded`.
    pub summaries: Mutex<Vec<Recorded>>,
    /// When each summariser call was taken and when its answer was sent, in the order
    /// the answers went.
    pub answered: Mutex<Vec<(Instant, Instant)>>,
    /// Problems the `window` behaviour found in requests it received (pairing, order).
    pub violations: Mutex<Vec<String>>,
    /// TCP connections accepted.
    pub connections: AtomicUsize,
    /// Headers a request is taken to have when it lacks them: the behaviour for clients
    /// that cannot send `x-mock` (Codex's built-in OpenAI provider).
    pub defaults: HeaderMap,
}

pub struct Mock {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
}

impl Mock {
    pub async fn start() -> Self {
        Self::start_with_defaults(&[]).await
    }

    /// A mock that takes each request lacking one of `defaults` to have it.
    pub async fn start_with_defaults(defaults: &[(&'static str, &str)]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut state = MockState::default();
        for (name, value) in defaults {
            state.defaults.insert(*name, value.parse().unwrap());
        }
        let state = Arc::new(state);
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                stream.set_nodelay(true).unwrap();
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req| respond(Arc::clone(&state), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.state.recorded.lock().unwrap().clone()
    }

    pub fn summaries(&self) -> Vec<Recorded> {
        self.state.summaries.lock().unwrap().clone()
    }

    /// Whether a request sent at `sent` waited for a summary: a summariser call was taken
    /// after it was sent and answered before the upstream took `request`, the call it
    /// became. An order of events, not a duration: a loaded machine makes a turn slow,
    /// not a summary made ahead of it late.
    pub fn waited_for_a_summary(&self, sent: Instant, request: &Recorded) -> bool {
        self.state
            .answered
            .lock()
            .unwrap()
            .iter()
            .any(|&(taken, answered)| taken >= sent && answered <= request.at)
    }

    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    pub fn last(&self) -> Recorded {
        self.recorded()
            .pop()
            .expect("the upstream received no request")
    }
}

async fn respond(
    state: Arc<MockState>,
    mut req: Request<Incoming>,
) -> Result<Response<MockBody>, Infallible> {
    for (name, value) in &state.defaults {
        if !req.headers().contains_key(name) {
            req.headers_mut().insert(name, value.clone());
        }
    }
    let behaviour = req
        .headers()
        .get("x-mock")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("echo")
        .to_owned();
    if behaviour == "sink" {
        return Ok(sink(&state, req).await);
    }
    // Like vLLM and most servers in front of models, the mock speaks no WebSocket.
    if req.headers().contains_key("upgrade") {
        return Ok(plain(StatusCode::NOT_FOUND, "Not Found"));
    }
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let recorded = Recorded {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body: body.clone(),
        at: Instant::now(),
    };
    if is_summary_call(&body) {
        let taken = recorded.at;
        state.summaries.lock().unwrap().push(recorded);
        delay(&parts.headers, "x-mock-summary-delay-ms").await;
        let answer = summary_answer(&parts.headers, &body).await;
        state.answered.lock().unwrap().push((taken, Instant::now()));
        return Ok(answer);
    }
    state.recorded.lock().unwrap().push(recorded);
    delay(&parts.headers, "x-mock-delay-ms").await;
    let response = match behaviour.as_str() {
        "echo" => echo(&parts.headers, body),
        "openai" => openai(parts.method.as_str(), parts.uri.path(), &body, 10),
        "window" if parts.uri.path().ends_with("/responses/compact") => {
            responses_compact(&parts.headers)
        }
        "window" if parts.uri.path().ends_with("/responses") => {
            responses_window(&state, &parts.headers, &body)
        }
        "window" if parts.uri.path().ends_with("/messages") => {
            anthropic::messages_window(&state, &parts.headers, &body)
        }
        "window" => window(&state, &parts.headers, &body),
        "media" => media_capped(&parts.headers, &body),
        "error" => error_answer(&parts.headers),
        "sse-gated" => sse_gated(state),
        "responses-gated" => responses_gated(state),
        "sse-forever" => sse_forever(state),
        "silent" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            plain(StatusCode::OK, "late")
        }
        other => plain(StatusCode::BAD_REQUEST, &format!("unknown x-mock {other}")),
    };
    Ok(response)
}

/// Waits as many milliseconds as the header `name` says, if present.
async fn delay(headers: &HeaderMap, name: &str) {
    let ms = headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// The opening of the summariser's system prompt (`src/summarize/prompt.md`).
const SUMMARY_PROMPT: &str = "You are writing a checkpoint";
/// What the mock summariser writes; tests find it in what the upstream receives next.
pub const CANNED_SUMMARY: &str = "## Active Task\nMOCK-CHECKPOINT: fix the failing module tests.\n\n## Goal\nAll tests pass.\n\n## Completed Actions\n- Read the modules and ran their tests.\n- Ran `cargo test` for each module: the borrow errors are fixed one module at a time.\n\n## Relevant Files\n- src/module_0.rs and the modules after it: each clones its value before the move.";

fn is_summary_call(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| {
        // Chat (the system message), the Responses API (its instructions) or Messages
        // (its top-level system).
        [
            &v["messages"][0]["content"],
            &v["instructions"],
            &v["system"],
        ]
        .iter()
        .any(|s| s.as_str().is_some_and(|s| s.starts_with(SUMMARY_PROMPT)))
    })
}

/// A streamed answer in the dialect of `body` (a Responses request has `input`, a
/// Messages request a top-level `system`).
fn stream_answer(body: &[u8], model: &str, reply: &str) -> Response<MockBody> {
    let request = serde_json::from_slice::<serde_json::Value>(body).unwrap_or_default();
    if request.get("input").is_some() {
        responses_stream(reply, 0)
    } else if request.get("system").is_some() {
        anthropic::answer_stream(reply, anthropic::tokens(&request))
    } else {
        openai_stream(model, reply, None, "stop")
    }
}

/// The summariser's answer, by `x-mock-summary`: `ok` (the default, a streamed
/// [`CANNED_SUMMARY`]), `long:N` (that and N more words), `500`, `401`, `silent`, `empty`,
/// `refusal`, `500-for:MODEL` (a 500 for that model, `ok` for others), or junk a small
/// model writes: `junk` (one word), `truncated` (cut by its cap), `echo` (the focus line
/// given back under two headings), `unstructured` (a paragraph without headings),
/// `drop-section` (an update that leaves out the previous checkpoint's Relevant Files),
/// `junk-if:TEXT` (junk for a call whose turns hold TEXT; any other call answers an
/// update with the previous checkpoint as it was given, a lossless if lazy model, and a
/// first call with [`CANNED_SUMMARY`]).
/// With `x-mock-summary-window`, a summariser request longer than that (in the mock's
/// tokens, with its completion cap, a reasoning model's included) is refused as llama.cpp refuses it, and the
/// answers report the mock's count of the prompt. With `x-mock-summary-count: json` as
/// well, the prompt is counted as the shared client harness's fake upstream counts it
/// ([`json_tokens`]) and refused as OpenAI refuses a request that sets a completion cap
/// (the summariser's always does): by prompt and cap together, which reads as an output
/// cap over the window's room when the prompt alone would fit. `x-mock-summary-shape`
/// names another refusal's shape ([`overflow`]).
async fn summary_answer(headers: &HeaderMap, body: &[u8]) -> Response<MockBody> {
    let behaviour = headers
        .get("x-mock-summary")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ok");
    let request: serde_json::Value = serde_json::from_slice(body).unwrap();
    let json_count = header_str(headers, "x-mock-summary-count") == "json";
    let tokens = match json_count {
        true => json_tokens(&request),
        false => mock_tokens(&request),
    };
    if let Ok(limit) = header_str(headers, "x-mock-summary-window").parse::<u64>() {
        let output = request["max_completion_tokens"]
            .as_u64()
            .or(request["max_tokens"].as_u64())
            .unwrap_or(0);
        if tokens + output > limit {
            let shape = match header_str(headers, "x-mock-summary-shape") {
                "" if json_count => "openai-capped",
                "" => "llamacpp",
                shape => shape,
            };
            return overflow(shape, tokens, output, limit, true);
        }
    }
    let chat =
        |reply: &str, finish: &str| openai_stream("mock-summariser", reply, Some(tokens), finish);
    match behaviour {
        "junk" => return chat("The", "stop"),
        "truncated" => return chat(CANNED_SUMMARY, "length"),
        "unstructured" => return chat("The user and the assistant worked on the failing module tests and fixed several borrow errors in the modules.", "stop"),
        // An update that forgets a section of the checkpoint it was given.
        "drop-section" => {
            let user = request["messages"][1]["content"].as_str().unwrap_or("");
            if user.contains("<previous-checkpoint>") {
                let dropped = CANNED_SUMMARY.split("\n\n## Relevant Files").next().unwrap_or("");
                return chat(dropped, "stop");
            }
            return chat(CANNED_SUMMARY, "stop");
        }
        _ if behaviour.starts_with("junk-if:") => {
            let user = request["messages"][1]["content"].as_str().unwrap_or("");
            let (previous, turns) = match user.split_once("</previous-checkpoint>") {
                Some((p, t)) => (p.split_once("<previous-checkpoint>").map(|(_, p)| p.trim()), t),
                None => (None, user),
            };
            if turns.contains(&behaviour["junk-if:".len()..]) {
                return chat("The", "stop");
            }
            return chat(previous.unwrap_or(CANNED_SUMMARY), "stop");
        }
        "echo" => {
            let user = request["messages"][1]["content"].as_str().unwrap_or("");
            let focus = user.lines().find(|l| l.starts_with("Focus of this checkpoint")).unwrap_or("");
            return chat(&format!("## Active Task\n{focus}\n\n## Goal\n{focus}"), "stop");
        }
        _ => {}
    }
    if let Some(words) = behaviour.strip_prefix("long:") {
        let filler = " step".repeat(words.parse().unwrap());
        return stream_answer(
            body,
            "mock-summariser",
            &format!("{CANNED_SUMMARY}{filler}"),
        );
    }
    let behaviour = match behaviour.strip_prefix("500-for:") {
        Some(model) => {
            let request: serde_json::Value = serde_json::from_slice(body).unwrap();
            if request["model"] == model {
                "500"
            } else {
                "ok"
            }
        }
        None => behaviour,
    };
    match behaviour {
        "ok" => stream_answer(body, "mock-summariser", CANNED_SUMMARY),
        "empty" => stream_answer(body, "mock-summariser", "  "),
        "refusal" => stream_answer(
            body,
            "mock-summariser",
            "I'm sorry, but I can't help with that.",
        ),
        "silent" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            plain(StatusCode::OK, "late")
        }
        status => {
            let mut headers = HeaderMap::new();
            headers.insert("x-mock-status", status.parse().unwrap());
            error_answer(&headers)
        }
    }
}

/// Answers with the request body as it came, and its content type.
fn echo(headers: &HeaderMap, body: Bytes) -> Response<MockBody> {
    let mut response = Response::new(full(body));
    if let Some(ct) = headers.get("content-type") {
        response.headers_mut().insert("content-type", ct.clone());
    }
    response
}

/// Answers like OpenAI: a model list, and chat completions (JSON or SSE) that repeat
/// the last user message, reporting `prompt_tokens` in their usage.
fn openai(method: &str, path: &str, body: &[u8], prompt_tokens: u64) -> Response<MockBody> {
    if method == "GET" && path.ends_with("/models") {
        let list = serde_json::json!({"object": "list", "data": [
            {"id": "mock-model", "object": "model", "created": 1, "owned_by": "mock"}
        ]});
        return json(list.to_string());
    }
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else {
        return plain(StatusCode::BAD_REQUEST, "not json");
    };
    let said = last_user_text(&request);
    let reply = format!("you said: {said}");
    let model = request["model"].as_str().unwrap_or("mock-model").to_owned();
    if request["stream"] == true {
        let usage = request["stream_options"]["include_usage"] == true;
        return openai_stream(&model, &reply, usage.then_some(prompt_tokens), "stop");
    }
    json(
        serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}
        })
        .to_string(),
    )
}

/// The text of the last user message, whether content is a string or parts.
pub fn last_user_text(request: &serde_json::Value) -> String {
    let Some(message) = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &message["content"] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn openai_stream(
    model: &str,
    reply: &str,
    prompt_tokens: Option<u64>,
    finish: &str,
) -> Response<MockBody> {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        let event = serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        format!("data: {event}\n\n")
    };
    let mut text = chunk(
        serde_json::json!({"role": "assistant", "content": ""}),
        serde_json::Value::Null,
    );
    for word in reply.split_inclusive(' ') {
        text.push_str(&chunk(
            serde_json::json!({"content": word}),
            serde_json::Value::Null,
        ));
    }
    text.push_str(&chunk(serde_json::json!({}), serde_json::json!(finish)));
    if let Some(tokens) = prompt_tokens {
        let event = serde_json::json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [], "usage": {"prompt_tokens": tokens, "completion_tokens": 5, "total_tokens": tokens + 5}
        });
        text.push_str(&format!("data: {event}\n\n"));
    }
    text.push_str("data: [DONE]\n\n");
    sse_response(full(text))
}

fn json(text: String) -> Response<MockBody> {
    let mut response = Response::new(full(text));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// The mock's own token count, deliberately not tiktoken and deliberately higher than
/// it (about one token per three characters), as a real upstream's tokenizer differs.
pub fn mock_tokens(request: &serde_json::Value) -> u64 {
    let mut chars = 0usize;
    let mut messages = 0u64;
    for message in request["messages"].as_array().into_iter().flatten() {
        messages += 1;
        chars += json_text_len(&message["content"]);
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            chars += call["function"]["arguments"].as_str().map_or(0, str::len);
            chars += call["function"]["name"].as_str().map_or(0, str::len);
        }
    }
    chars as u64 / 3 + messages * 6
}

/// A chat request's prompt as the shared client harness's fake upstream counts it: one
/// token per 3.5 characters of its `messages` as JSON, escapes and all (each newline in a
/// message is two characters).
pub fn json_tokens(request: &serde_json::Value) -> u64 {
    let chars = request["messages"].to_string().chars().count();
    (chars as f64 / 3.5) as u64 + 1
}

fn json_text_len(content: &serde_json::Value) -> usize {
    match content {
        serde_json::Value::String(s) => s.len(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .map(|p| {
                p["text"].as_str().map_or(0, str::len)
                    + if p["type"] == "image_url" { 3000 } else { 0 }
            })
            .sum(),
        _ => 0,
    }
}

/// Checks what a strict provider checks: known roles, every tool call answered right
/// after its assistant message, no tool result without its call, no two user or two
/// assistant messages in a row, and (as strict chat templates do) the user speaking
/// first after the instructions.
pub fn strict_violations(request: &serde_json::Value) -> Vec<String> {
    let mut problems = pairing_violations(request);
    let first = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| !matches!(m["role"].as_str(), Some("system" | "developer")));
    if let Some(first) = first {
        if first["role"] != "user" {
            problems.push(format!(
                "the first message after the instructions is {}",
                first["role"]
            ));
        }
    }
    problems
}

fn pairing_violations(request: &serde_json::Value) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(messages) = request["messages"].as_array() else {
        return vec!["no messages".into()];
    };
    let mut open: Vec<String> = Vec::new();
    let mut previous = "";
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("");
        if role != "tool" && !open.is_empty() {
            problems.push(format!("messages[{i}]: tool calls {open:?} unanswered"));
            open.clear();
        }
        match role {
            "system" | "developer" => {}
            "user" | "assistant" if role == previous && message["tool_calls"].is_null() => {
                problems.push(format!("messages[{i}]: two {role} messages in a row"));
            }
            "user" | "assistant" => {}
            "tool" => {
                let id = message["tool_call_id"].as_str().unwrap_or("");
                match open.iter().position(|o| o == id) {
                    Some(at) => {
                        open.remove(at);
                    }
                    None => problems.push(format!(
                        "messages[{i}]: tool result {id:?} without its call"
                    )),
                }
            }
            other => problems.push(format!("messages[{i}]: unknown role {other:?}")),
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            open.push(call["id"].as_str().unwrap_or("").to_owned());
        }
        previous = role;
    }
    if !open.is_empty() {
        problems.push(format!("tool calls {open:?} unanswered at the end"));
    }
    problems
}

/// The media parts anywhere in a request, in any dialect.
pub fn media_parts(value: &serde_json::Value) -> usize {
    const MEDIA: &[&str] = &[
        "image_url",
        "input_image",
        "image",
        "document",
        "input_file",
        "file",
        "input_audio",
    ];
    match value {
        serde_json::Value::Array(items) => items.iter().map(media_parts).sum(),
        serde_json::Value::Object(map) => {
            let own = map
                .get("type")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|t| MEDIA.contains(&t));
            usize::from(own) + map.values().map(media_parts).sum::<usize>()
        }
        _ => 0,
    }
}

/// An upstream that takes at most `x-mock-max-media` media parts in one request, refusing
/// more in its dialect's words as real providers do (Anthropic's for Messages, OpenAI's
/// envelope otherwise), and at most `x-mock-max-messages` messages (OpenAI's array-length
/// refusal), and streaming an answer to the rest.
fn media_capped(headers: &HeaderMap, body: &[u8]) -> Response<MockBody> {
    let max: usize = header_str(headers, "x-mock-max-media")
        .parse()
        .unwrap_or(10);
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else {
        return plain(StatusCode::BAD_REQUEST, "not json");
    };
    let items = request
        .get("input")
        .or_else(|| request.get("messages"))
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len);
    let max_items: usize = header_str(headers, "x-mock-max-messages")
        .parse()
        .unwrap_or(usize::MAX);
    if items > max_items {
        let field = if request.get("input").is_some() {
            "input"
        } else {
            "messages"
        };
        let error = serde_json::json!({"error": {"message": format!("Invalid '{field}': array too long. Expected an array with maximum length {max_items}, but got an array with length {items} instead."),
            "type": "invalid_request_error", "param": field, "code": "array_above_max_length"}});
        let mut response = json(error.to_string());
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    }
    let count = media_parts(&request);
    if count <= max {
        let model = request["model"].as_str().unwrap_or("mock-model");
        return stream_answer(body, model, &format!("MOCK-RESPONSE: saw {count} media"));
    }
    let error = if request.get("system").is_some() {
        serde_json::json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": format!("Too much media: 0 document pages + {count} images > {max}")}})
    } else if request.get("input").is_some() {
        serde_json::json!({"error": {"message": format!("Too many images in request: {count} images provided, but the model supports a maximum of {max} images."),
            "type": "invalid_request_error", "param": null, "code": null}})
    } else {
        serde_json::json!({"error": {"message": format!("Too many images in request. Max is {max}."),
            "type": "invalid_request_error", "param": null, "code": null}})
    };
    let mut response = json(error.to_string());
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response
}

/// An upstream with a context window (`x-mock-window`, in its own tokens) that refuses
/// longer requests in the shape of the provider named by `x-mock-shape`, and answers
/// the rest like OpenAI after checking the conversation is valid.
fn window(state: &MockState, headers: &HeaderMap, body: &[u8]) -> Response<MockBody> {
    let header = |name: &str| header_str(headers, name);
    let limit: u64 = header("x-mock-window").parse().unwrap_or(4096);
    let shape = header("x-mock-shape").to_owned();
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else {
        return plain(StatusCode::BAD_REQUEST, "not json");
    };
    let problems = strict_violations(&request);
    if !problems.is_empty() {
        state
            .violations
            .lock()
            .unwrap()
            .extend(problems.iter().cloned());
        return plain(StatusCode::UNPROCESSABLE_ENTITY, &problems.join("\n"));
    }
    let tokens = mock_tokens(&request);
    let output = request["max_completion_tokens"]
        .as_u64()
        .or(request["max_tokens"].as_u64())
        .unwrap_or(0);
    let stream = request["stream"] == true;
    let too_big = if shape == "html413" {
        body.len() as u64 > limit * 3
    } else {
        tokens + output > limit
    };
    if !too_big {
        return openai("POST", "/v1/chat/completions", body, tokens);
    }
    overflow(&shape, tokens, output, limit, stream)
}

fn overflow(shape: &str, tokens: u64, output: u64, limit: u64, stream: bool) -> Response<MockBody> {
    let total = tokens + output;
    let (status, content_type, body) = match shape {
        "openai" => (400, "application/json", serde_json::json!({"error": {
            "message": format!("This model's maximum context length is {limit} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}).to_string()),
        // OpenAI's Responses API: no number at all.
        "blind" => (400, "application/json", serde_json::json!({"error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}).to_string()),
        // OpenAI's wording for a request with a completion cap.
        "openai-capped" => (400, "application/json", serde_json::json!({"error": {
            "message": format!("This model's maximum context length is {limit} tokens. However, you requested {total} tokens ({tokens} in the messages, {output} in the completion). Please reduce the length of the messages or completion."),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}).to_string()),
        "vllm-old" => (400, "application/json", serde_json::json!({"object": "error",
            "message": format!("This model's maximum context length is {limit} tokens. However, you requested {total} tokens ({tokens} in the messages, {output} in the completion). Please reduce the length of the messages or completion."),
            "type": "BadRequestError", "param": null, "code": 400}).to_string()),
        "vllm-new" => (400, "application/json", serde_json::json!({"error": {
            "message": format!("This model's maximum context length is {limit} tokens. However, your request has {tokens} input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value={tokens})"),
            "type": "BadRequestError", "param": "input_tokens", "code": 400}}).to_string()),
        "llamacpp" => (400, "application/json; charset=utf-8", serde_json::json!({"error": {
            "code": 400, "message": format!("request ({tokens} tokens) exceeds the available context size ({limit} tokens), try increasing it"),
            "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": limit}}).to_string()),
        "anthropic" => (400, "application/json", serde_json::json!({"type": "error", "error": {
            "type": "invalid_request_error", "message": format!("prompt is too long: {tokens} tokens > {limit} maximum")},
            "request_id": "req_mock"}).to_string()),
        "sglang" => {
            let error = serde_json::json!({"object": "error",
                "message": format!("The input ({tokens} tokens) is longer than the model's context length ({limit} tokens)."),
                "type": "BadRequestError", "param": null, "code": 400});
            if stream {
                let mut response = sse_response(full(format!("data: {error}\n\ndata: [DONE]\n\n")));
                response.headers_mut().insert("content-type", "text/event-stream; charset=utf-8".parse().unwrap());
                return response;
            }
            (400, "application/json", error.to_string())
        }
        // Old vLLM: a 200 whose completion is empty, stopped for length, zero tokens.
        "vllm-empty-200" => (200, "application/json", serde_json::json!({
            "id": "cmpl-mock", "object": "chat.completion", "created": 1, "model": "mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": limit, "completion_tokens": 0, "total_tokens": limit}}).to_string()),
        "html413" => (413, "text/html", "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n".to_owned()),
        other => (400, "text/plain", format!("unknown x-mock-shape {other}")),
    };
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    response
}

/// A request header's value, "" when absent.
fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// `POST /responses/compact`: unknown (404, as vLLM and llama.cpp answer) unless
/// `x-mock-compaction: native` makes the mock OpenAI, which answers with its own opaque item.
fn responses_compact(headers: &HeaderMap) -> Response<MockBody> {
    if header_str(headers, "x-mock-compaction") != "native" {
        return plain(StatusCode::NOT_FOUND, "{\"detail\":\"Not Found\"}");
    }
    json(serde_json::json!({"id": "resp_native", "object": "response.compaction", "created_at": 1,
        "output": [{"type": "compaction", "id": "cmp_native", "encrypted_content": NATIVE_COMPACTION}],
        "usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}}).to_string())
}

/// The opaque state the mock, acting as OpenAI, puts in its compaction items.
pub const NATIVE_COMPACTION: &str = "gAAAAB-native-compaction";

/// The Responses API with a window: counts `instructions` and `input` its own way,
/// refuses item types it does not know (`compaction_trigger`, `compaction`: as vLLM does,
/// unless `x-mock-compaction: native`) and an invalid input (call/output pairing, as the
/// real API does) with 400, an
/// over-long one as OpenAI does (`x-mock-shape: responses`, a 400; `responses-stream`, a
/// 200 stream whose first event is `response.failed`), and answers the rest.
fn responses_window(state: &MockState, headers: &HeaderMap, body: &[u8]) -> Response<MockBody> {
    let header = |name: &str| header_str(headers, name);
    let limit: u64 = header("x-mock-window").parse().unwrap_or(4096);
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else {
        return plain(StatusCode::BAD_REQUEST, "not json");
    };
    let input = request["input"].as_array().cloned().unwrap_or_default();
    let native = header("x-mock-compaction") == "native";
    if let Some(at) = input
        .iter()
        .position(|i| i["type"] == "compaction_trigger" || i["type"] == "compaction")
    {
        if !native {
            let kind = input[at]["type"].as_str().unwrap_or_default();
            state
                .violations
                .lock()
                .unwrap()
                .push(format!("unknown item {kind}"));
            let error = serde_json::json!({"error": {"message": format!("Invalid value: '{kind}'."),
                "type": "invalid_request_error", "param": format!("input[{at}].type"), "code": "invalid_value"}});
            let mut response = json(error.to_string());
            *response.status_mut() = StatusCode::BAD_REQUEST;
            return response;
        }
        if input[at]["type"] == "compaction_trigger" {
            return json(serde_json::json!({"id": "resp_native", "object": "response", "status": "completed",
                "output": [{"type": "compaction", "id": "cmp_native", "encrypted_content": NATIVE_COMPACTION}]}).to_string());
        }
    }
    if let Err(e) = compaction_proxy::dialect::responses::validate(&input) {
        state.violations.lock().unwrap().push(e.to_string());
        return plain(StatusCode::BAD_REQUEST, &e.to_string());
    }
    let text: usize = input.iter().map(|i| i.to_string().len()).sum::<usize>()
        + request["instructions"].as_str().map_or(0, str::len);
    let tokens = text as u64 / 3 + input.len() as u64 * 6;
    let output = request["max_output_tokens"].as_u64().unwrap_or(0);
    let stream = request["stream"] == true;
    if tokens + output <= limit {
        let reply = format!("MOCK-RESPONSE: saw {} items", input.len());
        return if stream {
            responses_stream(&reply, tokens)
        } else {
            json(serde_json::json!({"id": "resp_mock", "object": "response", "status": "completed",
                "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": reply, "annotations": []}]}],
                "usage": {"input_tokens": tokens, "output_tokens": 5}}).to_string())
        };
    }
    let error = serde_json::json!({"message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"});
    if header("x-mock-shape") == "responses-stream" && stream {
        let failed = serde_json::json!({"type": "response.failed", "response": {"id": "resp_mock", "status": "failed", "error": error}});
        let events = format!(
            "event: response.created\ndata: {}\n\nevent: response.failed\ndata: {failed}\n\n",
            serde_json::json!({"type": "response.created", "response": {"id": "resp_mock", "status": "in_progress"}})
        );
        let mut response = sse_response(full(events));
        response
            .headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        return response;
    }
    let mut response = Response::new(full(serde_json::json!({"error": error}).to_string()));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// A streamed Responses answer with `reply` as its text, in two deltas, reporting
/// `input_tokens` of usage (clients such as Codex decide when to compact from it).
fn responses_stream(reply: &str, input_tokens: u64) -> Response<MockBody> {
    let (a, b) = reply.split_at(reply.len() / 2);
    let event =
        |v: serde_json::Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
    let item = serde_json::json!({"type": "message", "id": "msg_mock", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": reply, "annotations": []}]});
    let usage = serde_json::json!({"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input_tokens + 5});
    let events = [
        event(serde_json::json!({"type": "response.created", "response": {"id": "resp_mock", "object": "response",
            "created_at": 1, "model": "mock-model", "status": "in_progress", "output": []}})),
        event(serde_json::json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "message", "id": "msg_mock", "role": "assistant", "status": "in_progress", "content": []}})),
        event(serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": a})),
        event(serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": b})),
        event(serde_json::json!({"type": "response.output_item.done", "output_index": 0, "item": item})),
        event(serde_json::json!({"type": "response.completed", "response": {"id": "resp_mock", "object": "response",
            "created_at": 1, "model": "mock-model", "status": "completed", "incomplete_details": null,
            "output": [item], "usage": usage}})),
    ]
    .concat();
    let mut response = sse_response(full(events));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

/// Answers with the status in `x-mock-status`, an OpenAI-style error and a header the
/// test can look for.
fn error_answer(headers: &HeaderMap) -> Response<MockBody> {
    let status: u16 = headers
        .get("x-mock-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let body = format!(
        "{{\"error\":{{\"message\":\"mock error {status}\",\"type\":\"mock\",\"code\":\"mock_{status}\"}}}}\n"
    );
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
        .headers_mut()
        .insert("retry-after", "7".parse().unwrap());
    response
        .headers_mut()
        .insert("x-upstream-marker", "kept".parse().unwrap());
    response
}

pub const SSE_FIRST: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n";
pub const SSE_REST: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

/// Sends the first event at once and the rest only when the test opens the gate: a
/// proxy that buffered would never deliver the first event.
fn sse_gated(state: Arc<MockState>) -> Response<MockBody> {
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from_static(SSE_FIRST.as_bytes())).await;
        state.gate.notified().await;
        let _ = tx.send(Bytes::from_static(SSE_REST.as_bytes())).await;
    });
    sse_response(body)
}

/// A Responses stream that opens at once, with its first output item (what the proxy
/// waits for before answering), and completes only when the test opens the gate.
fn responses_gated(state: Arc<MockState>) -> Response<MockBody> {
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        let created = r#"{"type":"response.created","response":{"id":"resp_gated","status":"in_progress","output":[]}}"#;
        let added = r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","role":"assistant","content":[]}}"#;
        let _ = tx
            .send(Bytes::from(format!(
                "event: response.created\ndata: {created}\n\nevent: response.output_item.added\ndata: {added}\n\n"
            )))
            .await;
        state.gate.notified().await;
        let completed = r#"{"type":"response.completed","response":{"id":"resp_gated","status":"completed","output":[]}}"#;
        let _ = tx
            .send(Bytes::from(format!(
                "event: response.completed\ndata: {completed}\n\n"
            )))
            .await;
    });
    sse_response(body)
}

/// Streams an event every 20 ms until the reader goes away, then says so.
fn sse_forever(state: Arc<MockState>) -> Response<MockBody> {
    let (tx, body) = channel_body();
    tokio::spawn(async move {
        loop {
            if tx
                .send(Bytes::from_static(SSE_FIRST.as_bytes()))
                .await
                .is_err()
            {
                state.stream_cancelled.notify_one();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    sse_response(body)
}

/// Counts and checksums an upload without keeping it, answering `len checksum`.
async fn sink(state: &MockState, req: Request<Incoming>) -> Response<MockBody> {
    let mut body = req.into_body();
    let (mut len, mut sum) = (0u64, 0u64);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Some(data) = frame.data_ref() {
            len += data.len() as u64;
            sum = checksum(sum, data);
        }
    }
    state.sunk.lock().unwrap().push((len, sum));
    plain(StatusCode::OK, &format!("{len} {sum}"))
}

/// A cheap order-sensitive checksum (FNV-1a) for comparing large bodies.
pub fn checksum(mut hash: u64, data: &[u8]) -> u64 {
    if hash == 0 {
        hash = 0xcbf2_9ce4_8422_2325;
    }
    for byte in data {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn channel_body() -> (mpsc::Sender<Bytes>, MockBody) {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed_unsync())
}

fn sse_response(body: MockBody) -> Response<MockBody> {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
        .headers_mut()
        .insert("cache-control", "no-cache".parse().unwrap());
    response
}

fn plain(status: StatusCode, text: &str) -> Response<MockBody> {
    let mut response = Response::new(full(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
}

fn full(bytes: impl Into<Bytes>) -> MockBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// The real binary, listening on a free loopback port.
/// A request as [`RawUpstream`] read it: the head as text, the body decoded.
pub type RawRequest = (String, Vec<u8>);

/// An upstream that writes HTTP/1.1 by hand, for answers hyper would never write (a
/// `Content-Length` beside `Transfer-Encoding`, a chunk size past 64 bits) and for
/// connections closed at chosen moments. It reads each request whole (by
/// `Content-Length` or chunked) and records it, then `answer` decides, from the
/// request's index on its connection (0 for the first), what to write: `Some(bytes)`
/// and the connection stays open for the next request, or `None` to close it unanswered.
pub struct RawUpstream {
    pub addr: SocketAddr,
    /// Every request received, head and body as they came, in order.
    pub requests: Arc<Mutex<Vec<RawRequest>>>,
    pub connections: Arc<AtomicUsize>,
}

impl RawUpstream {
    pub async fn start(answer: fn(usize) -> Option<&'static [u8]>) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (seen, counted) = (Arc::clone(&requests), Arc::clone(&connections));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut stream = tokio::io::BufReader::new(stream);
                    for nth in 0.. {
                        let mut head = String::new();
                        while !head.ends_with("\r\n\r\n") {
                            if stream.read_line(&mut head).await.unwrap_or(0) == 0 {
                                return;
                            }
                        }
                        let lower = head.to_ascii_lowercase();
                        let mut body = Vec::new();
                        if lower.contains("transfer-encoding: chunked") {
                            loop {
                                let mut line = String::new();
                                stream.read_line(&mut line).await.unwrap();
                                let size = usize::from_str_radix(line.trim(), 16).unwrap();
                                let mut chunk = vec![0; size + 2];
                                stream.read_exact(&mut chunk).await.unwrap();
                                if size == 0 {
                                    break;
                                }
                                body.extend_from_slice(&chunk[..size]);
                            }
                        } else if let Some(at) = lower.find("content-length: ") {
                            let rest = &lower[at + 16..];
                            let len = rest[..rest.find("\r\n").unwrap()].parse().unwrap();
                            body.resize(len, 0);
                            stream.read_exact(&mut body).await.unwrap();
                        }
                        seen.lock().unwrap().push((head, body));
                        let Some(reply) = answer(nth) else { return };
                        if stream.get_mut().write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            requests,
            connections,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn requests(&self) -> Vec<RawRequest> {
        self.requests.lock().unwrap().clone()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub child: Child,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Starts the proxy with `config` (TOML) written to a file, pointed at `upstream`.
    pub fn start(upstream: &str, config: &str) -> Self {
        Self::start_with_env(upstream, config, &HashMap::new())
    }

    pub fn start_with_env(upstream: &str, config: &str, env: &HashMap<&str, &str>) -> Self {
        let dir = tempdir();
        let config_path = dir.join("proxy.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"));
        command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                upstream,
                "--config",
            ])
            .arg(&config_path)
            .current_dir(&dir)
            .env_remove("RUST_LOG")
            // Each proxy keeps its embedded cache in its own folder.
            .env("XDG_STATE_HOME", &dir)
            .envs(env);
        Self::spawn(&mut command)
    }

    /// Runs `command` (the proxy's `serve`, however it is started) with its stderr kept,
    /// and waits for the address it listens on.
    pub fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start compaction-proxy");
        let stderr = child.stderr.take().unwrap();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("listening on http://") {
                    let addr = rest.split(' ').next().unwrap_or_default().to_owned();
                    let _ = addr_tx.send(addr);
                }
                kept.lock().unwrap().push(line);
            }
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("proxy did not start: {:?}", lines.lock().unwrap()));
        Self {
            addr: addr.parse().unwrap(),
            child,
            stderr: lines,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A `POST` of `body` to `path` with `headers` added, on a fresh connection.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let mut request = client().post(self.url(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(body).send().await.unwrap()
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Whether a log line containing `needle` arrives within five seconds: the proxy's
    /// stderr is read by another thread, which may not have caught up yet.
    pub fn logged(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

impl Proxy {
    /// Sends SIGTERM, as a service manager stops the proxy, and returns once it has begun
    /// to shut down: new connections are refused.
    pub async fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(self.addr).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the proxy still accepts connections after SIGTERM");
    }

    /// Waits for the proxy to exit.
    pub async fn exited(self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || {
            let mut proxy = self;
            proxy.child.wait()
        })
        .await
        .unwrap()
        .unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tool a test needs that the machine may lack, and the switch that turns its absence
/// from a skip into a failure. One rule for every switch: set to anything but empty or
/// `0`, it requires the tool (`scripts/test.sh` and CI set them all).
#[derive(Clone, Copy, Debug)]
pub enum Needs {
    /// The real clients and the Python packages the tests drive (`scripts/setup-clients.sh`,
    /// `scripts/setup-litellm.sh`).
    Clients,
    /// A `redis-server` (`scripts/setup-redis.sh`).
    Redis,
    /// `llama-server` and its model (`scripts/setup-llama.sh`).
    Llama,
}

impl Needs {
    fn switch(self) -> &'static str {
        match self {
            Needs::Clients => "COMPACTION_PROXY_REQUIRE_CLIENTS",
            Needs::Redis => "COMPACTION_PROXY_REQUIRE_REDIS",
            Needs::Llama => "COMPACTION_PROXY_REQUIRE_LLAMA",
        }
    }

    fn required(self) -> bool {
        std::env::var_os(self.switch()).is_some_and(|v| !v.is_empty() && v != "0")
    }

    /// The tool is missing (`why`, and `how` to install it): fails the test when it is
    /// required, else says on the terminal that the test is skipped and returns `None`.
    /// The test harness keeps a passing test's printed output to itself, so the line is
    /// written to the process's stderr directly: a skipped test must not pass unseen.
    pub fn missing<T>(self, why: &str, how: &str) -> Option<T> {
        assert!(!self.required(), "{}: {why}; {how}", self.switch());
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        let line = format!(
            "SKIPPED {test}: {why} ({how}, or set {} to fail instead)\n",
            self.switch()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        None
    }
}

/// A client `scripts/setup-clients.sh` installs in `./.clients` (at `path` there), or the
/// one `override_var` names; without it the test is skipped ([`Needs::missing`]).
pub fn installed_client(path: &str, override_var: Option<&str>) -> Option<std::path::PathBuf> {
    let installed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".clients")
        .join(path);
    let client = override_var
        .and_then(std::env::var_os)
        .map(std::path::PathBuf::from)
        .unwrap_or(installed);
    if client.exists() {
        return Some(client);
    }
    Needs::Clients.missing(
        &format!("{} is missing", client.display()),
        "run scripts/setup-clients.sh",
    )
}

/// The Python of `./.venv` (or `COMPACTION_PROXY_PYTHON`) if it can import `module`, the
/// client a test drives; without it the test is skipped ([`Needs::missing`]).
pub fn python_with(module: &str) -> Option<std::path::PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let python = std::env::var_os("COMPACTION_PROXY_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or(venv);
    let installed = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        return Some(python);
    }
    Needs::Clients.missing(
        &format!("{module} is missing from {}", python.display()),
        "run scripts/setup-clients.sh",
    )
}

/// The bytes a request body holds from its start to the end of the proxy's summary: the
/// part a resumed conversation must send again byte for byte. `None` when it holds none.
pub fn compacted_part(body: &[u8]) -> Option<Vec<u8>> {
    use compaction_proxy::engine::summary::find_end;
    let text = std::str::from_utf8(body).unwrap();
    let (at, len) = find_end(text)?;
    let end = at + len;
    Some(body[..end].to_vec())
}

/// Asserts that the request sent after `sent[turn]` repeats its compacted part byte for
/// byte, as a conversation resumed from a checkpoint must.
pub fn assert_compacted_part_kept(sent: &[Recorded], turn: usize) {
    let before = compacted_part(&sent[turn].body).expect("a compacted turn");
    let after = compacted_part(&sent[turn + 1].body).expect("a compacted turn");
    assert!(
        before == after,
        "turn {}: the compacted part changed",
        turn + 1
    );
}

/// One round of an agent session after the user's ask `n`: a tool call, its output and the
/// agent's reply. Short beside the tests' windows, as in a real session, so one
/// compaction buys many turns.
pub fn agent_round(n: usize) -> Vec<serde_json::Value> {
    use serde_json::json;
    let id = format!("call_{n}");
    vec![
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "run_command",
                "arguments": json!({"command": format!("cargo test module_{n}")}).to_string()}}]}),
        json!({"role": "tool", "tool_call_id": id,
            "content": format!("test module_{n}::works ... FAILED\nassertion failed: left == right (left: {n}, right: {})", n + 1)}),
        json!({"role": "assistant", "content": format!("Module {n} had an off-by-one; fixed in src/module_{n}.rs and the test passes now.")}),
    ]
}

/// Starts `compaction-proxy serve` with the configuration file `config`, which it must
/// refuse at start: exit 2. Returns what it printed on stderr.
pub fn refused_config(config: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh directory under the target dir (no tempfile dependency).
pub fn tempdir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An HTTP client that never pools, so each test sees fresh connections.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()
        .unwrap()
}

/// A `POST` of `{}` to `path` through `proxy`, which the mock answers with its gated
/// stream: the answer's stream and its first chunk, which comes within 10 s (the rest
/// waits for `mock.state.gate`).
pub async fn gated_stream(
    proxy: &Proxy,
    path: &str,
) -> (
    impl futures_util::Stream<Item = reqwest::Result<Bytes>>,
    Bytes,
) {
    use futures_util::StreamExt;
    let response = client()
        .post(proxy.url(path))
        .header("x-mock", "sse-gated")
        .body("{}")
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the first event was held back")
        .unwrap()
        .unwrap();
    (stream, first)
}

/// The proxy's `/metrics` text.
pub async fn metrics(proxy: &Proxy) -> String {
    let response = client().get(proxy.url("/metrics")).send().await.unwrap();
    response.text().await.unwrap()
}

/// Posts a chat request through `proxy` with `headers` added; returns the status and the
/// `x-compaction` header ("" when absent).
pub async fn post_chat(
    proxy: &Proxy,
    headers: &[(&str, &str)],
    request: &serde_json::Value,
) -> (u16, String) {
    let mut builder = client().post(proxy.url("/v1/chat/completions"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = builder.json(request).send().await.unwrap();
    let x = x_compaction(&response);
    (response.status().as_u16(), x)
}

/// Posts a chat turn paid by `credential` to the mock's `window` scenario in OpenAI's shape
/// (a window of `window` tokens), whose summariser answers as `summary` says (`ok` for a
/// summary) after `summary_delay_ms`; returns the status and the `x-compaction` header
/// ("" when absent).
pub async fn window_turn(
    proxy: &Proxy,
    credential: &str,
    window: u64,
    summary: &str,
    summary_delay_ms: u64,
    request: &serde_json::Value,
) -> (u16, String) {
    let (window, delay) = (window.to_string(), summary_delay_ms.to_string());
    let headers = [
        ("authorization", credential),
        ("x-mock", "window"),
        ("x-mock-shape", "openai"),
        ("x-mock-window", window.as_str()),
        ("x-mock-summary", summary),
        ("x-mock-summary-delay-ms", delay.as_str()),
    ];
    post_chat(proxy, &headers, request).await
}

/// Posts `body` as JSON to `path` through `proxy` with `headers` added; returns the status,
/// the `x-compaction` header ("" when absent) and the text the client read.
pub async fn post_json(
    proxy: &Proxy,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> (u16, String, String) {
    let mut builder = client().post(proxy.url(path));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = builder.json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let x = x_compaction(&response);
    (status, x, response.text().await.unwrap())
}

/// The answer's `x-compaction` header, empty when it has none.
pub fn x_compaction(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("x-compaction")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Sends raw bytes on a new connection and returns everything read until the server
/// closes it or `wait` passes.
pub async fn raw(addr: SocketAddr, request: &[u8], wait: Duration) -> String {
    let mut stream = send_raw(addr, request).await;
    read_to_close(&mut stream, wait)
        .await
        .unwrap_or_else(|so_far| so_far)
}

/// A new connection to `addr` with `bytes` written on it: a request, or the start of one
/// whose rest the test sends (or withholds) itself.
pub async fn send_raw(addr: SocketAddr, bytes: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

/// Reads until the server closes the connection: all it sent, or `Err` with what it had
/// sent when the connection is still open after `wait`. A reset ends it as a close does:
/// a server that closes with bytes of the request unread may reset rather than close.
pub async fn read_to_close(
    stream: &mut tokio::net::TcpStream,
    wait: Duration,
) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let read = tokio::time::timeout(wait, stream.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    match read {
        Ok(_) => Ok(text),
        Err(_) => Err(text),
    }
}
