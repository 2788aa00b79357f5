//! What an upstream's answer to a chat request means: the one place that decides whether an
//! answer is a context overflow, a body too large, an output-cap problem, or anything else
//! (passed through untouched).
//!
//! Order of decision, first match wins:
//! 1. statuses that never mean overflow (401, 402, 403, 404, 429, other 4xx): `Other`;
//! 2. structured overflow markers (`context_length_exceeded`, llama.cpp's `n_ctx`, ...);
//! 3. structured and textual vetoes (rate limits, quota, auth, unknown model, bad parameter);
//! 4. media-count wording ("too many images", "too much media", "at most 5 image(s)"):
//!    `TooManyMedia`, with the limit when it is named; a messages array too long
//!    ("Invalid 'messages': array too long"): `TooManyMessages`;
//! 5. byte-size wording (`request_too_large`, `payload too large`): `BodyTooLarge`;
//! 6. overflow wording, by phrase or by meaning (subject + excess + unit in one clause), or
//!    wording that blames `max_tokens`: `ContextOverflow` or `OutputCap`, told apart by the
//!    upstream's numbers when it gives them;
//! 7. a 413 without other signal: `BodyTooLarge`.
//!
//! 2xx answers are only read for in-band errors (an `error` object, an SSE error event, a
//! `response.failed`, MiniMax's `base_resp`) and finish reasons, never for the model's text.
//!
//! How the proxy uses it:
//! - any non-2xx answer, and a non-streamed 2xx JSON answer (its first [`SCAN_LIMIT`] bytes):
//!   [`classify`];
//! - a streamed 2xx answer: hold the bytes, call [`inspect_stream_head`] as they grow, commit
//!   the status line on `Pass` (or when the proxy's own byte/time bound is hit), act on `Error`;
//! - numbers are the upstream's own: learn `context_window` per (upstream, model) and calibrate
//!   against `prompt_tokens` unless it is a lower bound. A verdict of `Other` carries none.
//!
//! Silent truncations: a 200 whose `finish_reason` is `model_context_window_exceeded` (z.ai),
//! or `length` with zero completion tokens and no output (vLLM V0, Xiaomi MiMo), carries no
//! usable answer and can only mean the window was full: it is a `ContextOverflow` (with the
//! prompt count as a lower bound). A 200 with a real answer from a server that cut the prompt
//! (Ollama) or an empty answer with `finish_reason: stop` (LM Studio) cannot be told from a
//! genuine answer by its body: it is `Other`; the proxy avoids it by preflight with a known
//! window.

mod numbers;
mod signals;
mod sse;
mod text;

use std::sync::LazyLock;

use aho_corasick::packed::Searcher;
use serde_json::Value;

use signals::Signals;
pub use sse::{classify_event, inspect_stream_head, next_event, EventClass, SseEvent, StreamHead};

/// Only this many bytes of a body are read: errors state their case up front.
pub const SCAN_LIMIT: usize = 64 * 1024;

/// What an answer means for the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The prompt does not fit the model's window: compact and retry.
    ContextOverflow,
    /// The prompt fits (by the upstream's numbers) but prompt + requested completion does not,
    /// or the requested completion is above the model's cap: a smaller `max_tokens` fixes it
    /// when that still leaves a useful budget; otherwise compact as for an overflow.
    OutputCap,
    /// The HTTP body is too large in bytes (413-style): drop bulk (old media) first.
    BodyTooLarge,
    /// More images, documents or PDF pages than the upstream takes in one request: not a
    /// token overflow; the oldest media go (placeholders in their place) and the request
    /// is sent again.
    TooManyMedia,
    /// More messages than the upstream takes in one request: the oldest history is
    /// summarised down to the limit and the request is sent again.
    TooManyMessages,
    /// Anything else: pass through untouched.
    Other,
}

/// Token numbers stated by the upstream (absent when it did not say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Numbers {
    /// The model's context window (for some providers the prompt cap, e.g. Copilot).
    pub context_window: Option<u64>,
    /// Prompt tokens by the upstream's count (messages + tools when reported apart).
    pub prompt_tokens: Option<u64>,
    /// `prompt_tokens` is a lower bound (vLLM stops counting at the limit; a silent truncation
    /// reports what was kept): not a count to calibrate against.
    pub prompt_is_lower_bound: bool,
    /// Completion tokens the request asked for (`max_tokens`).
    pub completion_tokens: Option<u64>,
    /// Prompt + completion as the upstream summed them.
    pub requested_total: Option<u64>,
    /// How many tokens over the limit the request was (Ollama, Cohere).
    pub overflow_by: Option<u64>,
    /// The most completion tokens the model accepts, when the error names it.
    pub completion_limit: Option<u64>,
    /// The most media parts (images, documents, pages) one request may carry, when a
    /// [`Kind::TooManyMedia`] refusal names it.
    pub media_limit: Option<u64>,
    /// The most messages one request may carry, when a [`Kind::TooManyMessages`] refusal
    /// names it.
    pub message_limit: Option<u64>,
}

/// The verdict on one upstream answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// What the answer means.
    pub kind: Kind,
    /// Numbers stated by the upstream (only for `ContextOverflow` and `OutputCap`).
    pub numbers: Numbers,
    /// Which rule decided, for logs.
    pub reason: &'static str,
}

impl Classification {
    fn other(reason: &'static str) -> Self {
        Self {
            kind: Kind::Other,
            numbers: Numbers::default(),
            reason,
        }
    }

    fn body_too_large(reason: &'static str) -> Self {
        Self {
            kind: Kind::BodyTooLarge,
            ..Self::other(reason)
        }
    }
}

/// Classifies an upstream answer to a chat request from its status, `content-type` and the
/// head of its body (for a 200 stream, the bytes of its first event(s)). Never panics; reads
/// at most [`SCAN_LIMIT`] bytes.
pub fn classify(status: u16, content_type: Option<&str>, body: &[u8]) -> Classification {
    let body = &body[..body.len().min(SCAN_LIMIT)];
    let success = (200..300).contains(&status);
    if success && is_event_stream(content_type, body) {
        return match inspect_stream_head(body, true) {
            StreamHead::Error(c) => c,
            _ => Classification::other("stream without in-band error"),
        };
    }
    if success && !may_report_failure(body) {
        return Classification::other("success");
    }
    let parsed = parse_json(body);
    if success {
        return parsed
            .as_ref()
            .and_then(classify_ok_json)
            .unwrap_or(Classification::other("success"));
    }
    let signals = match &parsed {
        Some(v) => Signals::from_json(v),
        None => Signals::from_text(&String::from_utf8_lossy(body)),
    };
    decide(Some(status), &signals, body)
}

/// Whether a 2xx body contains any word an in-band error or a silent overflow needs.
/// Ordinary completions have none of them, and skipping the JSON parse for those keeps
/// the check nearly free on the common path.
fn may_report_failure(body: &[u8]) -> bool {
    // Built once: building a searcher costs more than running it on a small body. One
    // SIMD pass (Teddy) for all four words: a search per word read every ordinary answer
    // four times (measured on a 0.5 KB completion: 1,500 instructions against 940). Not
    // the automaton: on JSON its rare-byte prefilter stops at nearly every byte (57,000).
    static NEEDLES: LazyLock<Option<Searcher>> =
        LazyLock::new(|| Searcher::new(["error", "base_resp", "\"length\"", "context_window"]));
    NEEDLES
        .as_ref()
        .is_none_or(|needles| needles.find(body).is_some())
}

fn is_event_stream(content_type: Option<&str>, body: &[u8]) -> bool {
    const SSE: &[u8] = b"text/event-stream";
    let named = |ct: &str| {
        ct.as_bytes()
            .windows(SSE.len())
            .any(|w| w.eq_ignore_ascii_case(SSE))
    };
    if content_type.is_some_and(named) {
        return true;
    }
    let head = body.trim_ascii_start();
    ["data:", "event:", "error:", ":"]
        .iter()
        .any(|p| head.starts_with(p.as_bytes()))
}

/// The body as JSON; for an error sent as an event stream, the first event's data.
fn parse_json(body: &[u8]) -> Option<Value> {
    serde_json::from_slice(body).ok().or_else(|| {
        let (ev, _) = next_event(&[body, b"\n\n"].concat())?;
        serde_json::from_str(ev.error.as_deref().unwrap_or(&ev.data)).ok()
    })
}

/// Statuses an overflow can arrive with: 2xx (in band), 400, 413, 422 and 5xx.
fn eligible(status: u16) -> bool {
    matches!(status, 200..=299 | 400 | 413 | 422 | 500..=599)
}

/// Codes and types that name an overflow outright.
const OVERFLOW_CODES: &[&str] = &[
    "context_length_exceeded",
    "context_window_exceeded",
    "model_context_window_exceeded",
    "model_max_prompt_tokens_exceeded",
    "max_prompt_tokens_exceeded",
    "exceed_context_size_error",
    "context_exceeded",
    "prompt_too_long",
    "input_tokens",
    "input_text",
    "40303",
    "1039",
];

/// Codes and types that rule overflow out.
const NEGATIVE_CODES: &[&str] = &[
    "rate_limit_exceeded",
    "rate_limit_error",
    "ratelimiterror",
    "too_many_requests",
    "resource_exhausted",
    "tokens",
    "requests",
    "insufficient_quota",
    "quota_exceeded",
    "billing_hard_limit_reached",
    "billing_not_active",
    "invalid_api_key",
    "authentication_error",
    "permission_error",
    "permission_denied",
    "unauthenticated",
    "model_not_found",
    "not_found_error",
    "unsupported_parameter",
    "unknown_parameter",
    "unsupported_value",
    "string_above_max_length",
    "overloaded_error",
    "server_is_overloaded",
    "slow_down",
    "throttlingexception",
];

const BODY_CODES: &[&str] = &[
    "request_too_large",
    "payload_too_large",
    "request_entity_too_large",
];

/// Decides on an error's signals. `body` is the raw head, read only when no message was found.
fn decide(status: Option<u16>, signals: &Signals, body: &[u8]) -> Classification {
    if status.is_some_and(|s| !eligible(s)) {
        return Classification::other("status never means overflow");
    }
    let mut text = signals.text();
    if text.is_empty() {
        text = text::normalize(&String::from_utf8_lossy(body));
    }
    if signals.has_code(OVERFLOW_CODES) || signals.n_ctx.is_some() {
        return overflow(signals, &text, "overflow code");
    }
    if signals.has_code(NEGATIVE_CODES) {
        return Classification::other("code rules out overflow");
    }
    if text::vetoed(&text) {
        return Classification::other("wording rules out overflow");
    }
    if text::says_too_many_media(&text) {
        return Classification {
            kind: Kind::TooManyMedia,
            numbers: Numbers {
                media_limit: text::media_limit(&text),
                ..Numbers::default()
            },
            reason: "media count wording",
        };
    }
    if text::says_too_many_messages(&text) {
        return Classification {
            kind: Kind::TooManyMessages,
            numbers: Numbers {
                message_limit: text::message_limit(&text),
                ..Numbers::default()
            },
            reason: "message count wording",
        };
    }
    let body_words = text::says_body_too_large(&text) || signals.has_code(BODY_CODES);
    let overflow_words = text::says_overflow(&text);
    if body_words && !overflow_words {
        return Classification::body_too_large("body size wording");
    }
    if overflow_words {
        return overflow(signals, &text, "overflow wording");
    }
    if text::blames_output(&text) {
        return overflow(signals, &text, "output-cap wording");
    }
    if status == Some(413) {
        return Classification::body_too_large("status 413");
    }
    Classification::other("no overflow signal")
}

/// Decides on an error found inside a 2xx answer, trusting a status written in the body.
fn decide_in_band(signals: &Signals) -> Classification {
    decide(signals.embedded_status, signals, b"")
}

/// An overflow-family verdict: numbers decide between the prompt and the completion budget.
fn overflow(signals: &Signals, text: &str, reason: &'static str) -> Classification {
    let mut numbers = numbers::extract(text);
    if signals.n_ctx.is_some() {
        numbers.context_window = signals.n_ctx;
    }
    if signals.n_prompt_tokens.is_some() {
        numbers.prompt_tokens = signals.n_prompt_tokens;
        numbers.prompt_is_lower_bound = false;
    }
    let kind = settle(&numbers, text::blames_output(text));
    Classification {
        kind,
        numbers,
        reason,
    }
}

/// `OutputCap` when the upstream's own numbers say the prompt fits and only the completion
/// budget overflows (or, without numbers, when the wording blames `max_tokens`).
fn settle(n: &Numbers, blames_output: bool) -> Kind {
    let prompt = n.prompt_tokens.or_else(|| {
        n.requested_total
            .zip(n.completion_tokens)
            .and_then(|(t, c)| t.checked_sub(c))
    });
    match (prompt, n.context_window, n.completion_tokens) {
        (Some(p), Some(w), _) if p >= w => Kind::ContextOverflow,
        (Some(p), Some(w), Some(c)) if p.saturating_add(c) > w => Kind::OutputCap,
        _ if blames_output => Kind::OutputCap,
        _ => Kind::ContextOverflow,
    }
}

/// An in-band error of a 2xx JSON answer or event, or `None` when it is a normal answer.
fn in_band_error(v: &Value) -> Option<Classification> {
    let is_error = says_something(&v["error"])
        || v["object"] == "error"
        || v["type"]
            .as_str()
            .is_some_and(|t| t == "error" || t == "response.failed" || t == "response.error")
        || v["base_resp"]["status_code"]
            .as_i64()
            .is_some_and(|c| c != 0);
    is_error.then(|| decide_in_band(&Signals::from_json(v)))
}

/// An `error` field that is present and not empty (`null`, `""` and `{}` say nothing).
fn says_something(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.trim().is_empty(),
        Value::Object(m) => !m.is_empty(),
        _ => true,
    }
}

/// A whole 2xx JSON answer: an in-band error or a silent overflow, else `None`.
fn classify_ok_json(v: &Value) -> Option<Classification> {
    let v = match v {
        Value::Array(items) => items.first()?,
        v => v,
    };
    in_band_error(v).or_else(|| {
        let choice = v["choices"].as_array()?.first()?;
        silent_overflow(choice, &v["usage"])
    })
}

/// A choice that produced nothing because the window was full (see the module docs).
fn silent_overflow(choice: &Value, usage: &Value) -> Option<Classification> {
    let reason = choice["finish_reason"].as_str()?;
    let empty = !has_output(&choice["delta"])
        && !has_output(&choice["message"])
        && choice["text"].as_str().is_none_or(str::is_empty);
    // After a `length` stop the server may have cut the prompt to fit, so its count is a floor.
    let truncated = match reason {
        "model_context_window_exceeded" if empty => false,
        "length" if empty && usage["completion_tokens"].as_u64() == Some(0) => true,
        _ => return None,
    };
    let prompt_tokens = usage["prompt_tokens"].as_u64();
    Some(Classification {
        kind: Kind::ContextOverflow,
        numbers: Numbers {
            prompt_tokens,
            prompt_is_lower_bound: truncated && prompt_tokens.is_some(),
            ..Numbers::default()
        },
        reason: "finish reason",
    })
}

/// True when a message or delta carries any output (text, reasoning, tool calls, refusal).
fn has_output(m: &Value) -> bool {
    let text = |k: &str| m[k].as_str().is_some_and(|s| !s.is_empty());
    let list = |k: &str| m[k].as_array().is_some_and(|a| !a.is_empty());
    text("content")
        || text("reasoning_content")
        || text("reasoning")
        || text("refusal")
        || list("tool_calls")
        || m["function_call"].is_object()
        || list("content")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bodies_with_a_failure_word_are_parsed() {
        let ordinary = br#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}"#;
        assert!(!may_report_failure(ordinary));
        for word in ["error", "base_resp", "\"length\"", "context_window"] {
            let body = format!(r#"{{"x":1,"y":{word}}}"#);
            assert!(may_report_failure(body.as_bytes()), "{word}");
            // Found at any offset of a longer body, past the searcher's first blocks.
            let content = "lorem ipsum ".repeat(60);
            let long = format!(r#"{{"content":"{content}","x":{word}}}"#);
            assert!(may_report_failure(long.as_bytes()), "{word} at the end");
        }
        let long = format!(r#"{{"content":"{}"}}"#, "lorem ipsum ".repeat(60));
        assert!(!may_report_failure(long.as_bytes()));
    }

    const OVERFLOW: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","code":"context_length_exceeded"}}"#;

    #[test]
    fn status_scope() {
        for status in [400, 413, 422, 500, 502, 503, 504] {
            let c = classify(status, Some("application/json"), OVERFLOW.as_bytes());
            assert_eq!(c.kind, Kind::ContextOverflow, "{status}");
        }
        for status in [401, 402, 403, 404, 408, 409, 429, 301] {
            let c = classify(status, Some("application/json"), OVERFLOW.as_bytes());
            assert_eq!(c.kind, Kind::Other, "{status}");
        }
        // An error object in a 200 is read; the model's own text never is.
        let c = classify(200, None, OVERFLOW.as_bytes());
        assert_eq!(c.kind, Kind::ContextOverflow);
    }

    #[test]
    fn numbers_decide_between_prompt_and_completion() {
        let n = |p, w, c| Numbers {
            prompt_tokens: Some(p),
            context_window: Some(w),
            completion_tokens: c,
            ..Numbers::default()
        };
        assert_eq!(
            settle(&n(9000, 8192, Some(10)), false),
            Kind::ContextOverflow
        );
        assert_eq!(settle(&n(8192, 8192, None), true), Kind::ContextOverflow);
        assert_eq!(settle(&n(5000, 8192, Some(4000)), false), Kind::OutputCap);
        assert_eq!(settle(&n(5000, 8192, None), false), Kind::ContextOverflow);
        assert_eq!(settle(&n(5000, 8192, None), true), Kind::OutputCap);
        let derived = Numbers {
            requested_total: Some(9000),
            completion_tokens: Some(2000),
            context_window: Some(8192),
            ..Numbers::default()
        };
        assert_eq!(settle(&derived, false), Kind::OutputCap);
        assert_eq!(settle(&Numbers::default(), false), Kind::ContextOverflow);
    }

    #[test]
    fn huge_and_hostile_bodies_are_bounded() {
        let mut body = OVERFLOW.as_bytes().to_vec();
        body.extend(std::iter::repeat_n(b' ', 10 * SCAN_LIMIT));
        // Cut at the scan limit the JSON no longer parses; the text still says overflow.
        assert_eq!(classify(400, None, &body).kind, Kind::ContextOverflow);
        let junk: Vec<u8> = (0..SCAN_LIMIT * 3)
            .map(|i| (i * 7919 % 256) as u8)
            .collect();
        assert_eq!(classify(400, None, &junk).kind, Kind::Other);
        assert_eq!(
            classify(200, Some("text/event-stream"), &junk).kind,
            Kind::Other
        );
        let nested = "[".repeat(100_000);
        assert_eq!(classify(400, None, nested.as_bytes()).kind, Kind::Other);
    }

    #[test]
    fn error_events_in_non_2xx_event_streams() {
        let body =
            b"data: {\"error\":{\"message\":\"prompt is too long: 9 tokens > 8 maximum\"}}\n\n";
        let c = classify(400, Some("text/event-stream"), body);
        assert_eq!(c.kind, Kind::ContextOverflow);
        assert_eq!(c.numbers.context_window, Some(8));
    }

    fn verdict(message: &str) -> Kind {
        let body = serde_json::json!({"error": {"message": message, "type": "x"}}).to_string();
        classify(400, Some("application/json"), body.as_bytes()).kind
    }

    /// Wordings from no provider list: the meaning matcher must catch them.
    #[test]
    fn unlisted_wordings_are_caught() {
        let messages = [
        "Context length exceeded",
        "context overflow",
        "The prompt exceeds the model's context length.",
        "Prompt exceeds maximum context length of 8192",
        "Error: prompt (12000) exceeds context (8192)",
        "input too large for context window",
        "The input is too long for the model",
        "Your input is too long. Max allowed: 32000 tokens",
        "Too many input tokens",
        "Number of input tokens exceeds the maximum allowed",
        "Token count exceeds limit",
        "Exceeded max sequence length",
        "sequence length 9000 exceeds maximum 8192",
        "The sequence length exceeds the maximum allowed for this model",
        "input_ids length 9000 is larger than max_position_embeddings 8192",
        "Requested tokens exceed context window",
        "Messages exceed the maximum context size",
        "Your prompt has 9000 tokens which is more than the 8192 the model supports",
        "The combined length of messages exceeds the model's token limit.",
        "KV cache is full",
        "not enough context space for the prompt",
        "the context is full",
        "prompt too large",
        "Prompt is larger than the context window",
        "request too long for model context",
        "Input length (in tokens) exceeds model limit",
        "Token limit exceeded",
        "maximum context window reached",
        "history is too long",
        "The message you submitted was too long, please reload the conversation and submit something shorter.",
    ];
        for m in messages {
            assert_ne!(verdict(m), Kind::Other, "{m}");
        }
    }

    /// Errors that mention prompts, tokens, limits or context but are not overflows.
    #[test]
    fn unrelated_errors_pass_through() {
        let messages = [
        "Invalid 'messages[3].tool_calls': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: call_abc",
        "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
        "max_tokens: Input should be greater than or equal to 1",
        "temperature: Input should be less than or equal to 2",
        "Invalid value for 'max_tokens': expected an integer, but got a string instead.",
        "The request was rejected because it was considered high risk",
        "Conversation roles must alternate user/assistant/user/assistant/...",
        "Input should be a valid dictionary or object to extract fields from",
        "Extra inputs are not permitted",
        "prompt must be a string, array of strings, array of tokens, or array of token arrays",
        "Request contains an invalid argument.",
        "Please ensure that multiturn requests alternate between user and model.",
        "The input is empty",
        "The number of tokens in the request must be a positive integer",
        "messages: text content blocks must be non-empty",
        "image is too large, maximum is 20MB",
        "Invalid image: the image exceeds the maximum size of 2048x2048 pixels",
        "Your request was blocked. Too many requests from your IP.",
        "Tokenizer error: invalid UTF-8 in input",
        "stop: at most 4 stop sequences are allowed",
        "Input exceeds maximum of 2048 stop sequences",
        "logit_bias: too many tokens, maximum is 300",
        "n: must be less than or equal to 128",
        "tools: maximum number of tools is 128",
        "Model is not loaded. Please load the model with a larger context or a different model.",
        "The model is currently loading, please retry shortly",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "Request timed out",
        "upstream connect error or disconnect/reset before headers",
        "Invalid schema for function 'f': In context=('properties', 'x'), 'additionalProperties' is required to be supplied and to be false.",
        "stop sequence too long",
        "Request line is too long",
        "function name is too long, maximum is 64 characters",
        "Invalid 'messages[0].name': string too long. Expected a string with maximum length 64",
        "You exceeded your current quota, please check your plan and billing details.",
        "This model is not available in your region",
        "response_format json_schema exceeds the maximum of 100 properties",
        "Too many tokens, please wait before trying again.",
    ];
        for m in messages {
            assert_eq!(verdict(m), Kind::Other, "{m}");
        }
    }

    #[test]
    fn too_many_images_is_a_media_count_not_an_overflow() {
        // Once passed through as unfixable; dropping the oldest images fixes it.
        let class = classify(
            400,
            Some("application/json"),
            br#"{"error":{"message":"Too many images: maximum of 5 images per request"}}"#,
        );
        assert_eq!(class.kind, Kind::TooManyMedia);
        assert_eq!(class.numbers.media_limit, Some(5));
    }
}
