//! Upstreams that take only so many images in one request (OpenAI-compatible servers'
//! "Too many images in request. Max is 10.", Anthropic's "Too much media: ... > 100"): such
//! a refusal is not a token overflow. The proxy replaces the oldest media with
//! placeholders, keeps the latest, and sends the request again, in every dialect; with the
//! model's `max_media` configured it does so before the upstream refuses.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use serde_json::{json, Value};
use support::{media_parts, post_json, Mock, Proxy};

const MODEL: &str = "mock-vision";
const PNG: &str =
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk";
const TURNS: usize = 12;

/// The request of a session that looked at one screenshot a turn, in `dialect`.
fn request(dialect: &str) -> (String, Value) {
    let question = |n: usize| format!("what changed in screenshot {n}?");
    let answer = |n: usize| format!("screenshot {n}: the build went green");
    let mut messages = Vec::new();
    for n in 0..TURNS {
        let (image, text, reply) = match dialect {
            "chat" => (
                json!({"type": "image_url", "image_url": {"url": PNG}}),
                json!({"type": "text", "text": question(n)}),
                json!({"role": "assistant", "content": answer(n)}),
            ),
            "responses" => (
                json!({"type": "input_image", "image_url": PNG}),
                json!({"type": "input_text", "text": question(n)}),
                json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
                    "content": [{"type": "output_text", "text": answer(n), "annotations": []}]}),
            ),
            _ => (
                json!({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                    "data": PNG.trim_start_matches("data:image/png;base64,")}}),
                json!({"type": "text", "text": question(n)}),
                json!({"role": "assistant", "content": answer(n)}),
            ),
        };
        messages.push(json!({"role": "user", "content": [text, image]}));
        if n + 1 < TURNS {
            messages.push(reply);
        }
    }
    match dialect {
        "chat" => {
            messages.insert(
                0,
                json!({"role": "system", "content": "You review screenshots."}),
            );
            (
                "/v1/chat/completions".into(),
                json!({"model": MODEL, "stream": true, "max_tokens": 500, "messages": messages}),
            )
        }
        "responses" => (
            "/v1/responses".into(),
            json!({"model": MODEL, "stream": true, "store": false, "instructions": "You review screenshots.", "input": messages}),
        ),
        _ => (
            "/v1/messages".into(),
            json!({"model": MODEL, "stream": true, "max_tokens": 500, "system": "You review screenshots.", "messages": messages}),
        ),
    }
}

async fn send(proxy: &Proxy, path: &str, body: &Value, max: usize) -> (u16, String, String) {
    send_capped(proxy, path, body, max, usize::MAX).await
}

async fn send_capped(
    proxy: &Proxy,
    path: &str,
    body: &Value,
    max: usize,
    max_messages: usize,
) -> (u16, String, String) {
    let (max, max_messages) = (max.to_string(), max_messages.to_string());
    let headers = [
        ("x-mock", "media"),
        ("x-mock-max-media", max.as_str()),
        ("x-mock-max-messages", max_messages.as_str()),
        ("anthropic-version", "2023-06-01"),
    ];
    post_json(proxy, path, &headers, body).await
}

/// The latest screenshot, the one the question is about, is what the upstream got last.
fn keeps_the_latest(sent: &Value) -> bool {
    let text = sent.to_string();
    text.contains(PNG.trim_start_matches("data:image/png;base64,"))
        && text.contains("earlier image removed by context compaction")
        && text.contains(&format!("what changed in screenshot {}?", TURNS - 1))
}

#[tokio::test]
async fn a_refusal_for_too_many_images_drops_the_oldest_and_is_retried_in_every_dialect() {
    for dialect in ["chat", "responses", "messages"] {
        let mock = Mock::start().await;
        let proxy = Proxy::start(&mock.url("/v1"), "");
        let (path, body) = request(dialect);
        let (status, x, text) = send(&proxy, &path, &body, 10).await;
        assert_eq!(status, 200, "{dialect}: {x}\n{text}");
        assert!(
            x.starts_with("applied; trigger=error; attempts=2"),
            "{dialect}: {x}"
        );
        assert!(x.contains("media=12->10"), "{dialect}: {x}");
        let recorded = mock.recorded();
        assert_eq!(recorded.len(), 2, "{dialect}");
        let sent: Value = serde_json::from_slice(&recorded[1].body).unwrap();
        assert_eq!(media_parts(&sent), 10, "{dialect}");
        assert!(keeps_the_latest(&sent), "{dialect}: {sent}");
    }
}

#[tokio::test]
async fn the_limit_a_refusal_named_is_applied_to_the_next_turns_before_they_are_sent() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let (path, body) = request("chat");
    let (status, x, _) = send(&proxy, &path, &body, 10).await;
    assert_eq!(status, 200, "{x}");
    assert!(x.contains("trigger=error"), "{x}");
    let (status, x, _) = send(&proxy, &path, &body, 10).await;
    assert_eq!(status, 200, "{x}");
    assert!(
        x.starts_with("applied; trigger=preflight; attempts=1"),
        "{x}"
    );
    assert!(x.contains("media=12->10"), "{x}");
    assert_eq!(mock.recorded().len(), 3, "one refusal in all");
}

#[tokio::test]
async fn a_configured_media_cap_is_applied_before_the_upstream_refuses() {
    for dialect in ["chat", "responses", "messages"] {
        let mock = Mock::start().await;
        let config =
            format!("[[models]]\nmatch = \"{MODEL}\"\ncontext_window = 128000\nmax_media = 5\n");
        let proxy = Proxy::start(&mock.url("/v1"), &config);
        let (path, body) = request(dialect);
        let (status, x, text) = send(&proxy, &path, &body, 5).await;
        assert_eq!(status, 200, "{dialect}: {x}\n{text}");
        assert!(
            x.starts_with("applied; trigger=preflight; attempts=1"),
            "{dialect}: {x}"
        );
        assert!(x.contains("media=12->5"), "{dialect}: {x}");
        let recorded = mock.recorded();
        assert_eq!(recorded.len(), 1, "{dialect}: no refusal first");
        let sent: Value = serde_json::from_slice(&recorded[0].body).unwrap();
        assert_eq!(media_parts(&sent), 5, "{dialect}");
        assert!(keeps_the_latest(&sent), "{dialect}: {sent}");
    }
}

#[tokio::test]
async fn a_request_within_the_cap_passes_untouched() {
    let mock = Mock::start().await;
    let config =
        format!("[[models]]\nmatch = \"{MODEL}\"\ncontext_window = 128000\nmax_media = 20\nmax_messages = 50\n");
    let proxy = Proxy::start(&mock.url("/v1"), &config);
    let (path, body) = request("chat");
    let (status, x, _) = send(&proxy, &path, &body, 20).await;
    assert_eq!(status, 200);
    assert_eq!(x, "", "unmarked");
    assert_eq!(mock.last().body, serde_json::to_vec(&body).unwrap());
}

/// What a request carries as messages in its dialect: `messages`, or the Responses
/// API's `input` items.
fn messages_in(sent: &Value) -> usize {
    sent.get("input")
        .or_else(|| sent.get("messages"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

#[tokio::test]
async fn a_configured_message_cap_summarises_the_oldest_history_before_the_first_call() {
    for dialect in ["chat", "responses", "messages"] {
        let mock = Mock::start().await;
        let config = format!(
            "[[models]]\nmatch = \"{MODEL}\"\ncontext_window = 128000\nmax_messages = 10\n"
        );
        let proxy = Proxy::start(&mock.url("/v1"), &config);
        let (path, body) = request(dialect);
        assert!(messages_in(&body) > 20, "{dialect}");
        let (status, x, text) = send(&proxy, &path, &body, 100).await;
        assert_eq!(status, 200, "{dialect}: {x}\n{text}");
        assert!(
            x.starts_with("applied; trigger=preflight; attempts=1"),
            "{dialect}: {x}"
        );
        let recorded = mock.recorded();
        assert_eq!(recorded.len(), 1, "{dialect}: no refusal first");
        let sent: Value = serde_json::from_slice(&recorded[0].body).unwrap();
        assert!(
            messages_in(&sent) <= 10,
            "{dialect}: {} messages\n{sent}",
            messages_in(&sent)
        );
        let latest = format!("what changed in screenshot {}?", TURNS - 1);
        assert!(sent.to_string().contains(&latest), "{dialect}: {sent}");
        assert!(
            mock.summaries().len() == 1,
            "{dialect}: the history was summarised"
        );
    }
}

#[tokio::test]
async fn a_refusal_for_too_many_messages_summarises_the_oldest_and_is_retried() {
    for dialect in ["chat", "responses"] {
        let mock = Mock::start().await;
        let proxy = Proxy::start(&mock.url("/v1"), "");
        let (path, body) = request(dialect);
        let (status, x, text) = send_capped(&proxy, &path, &body, 100, 12).await;
        assert_eq!(status, 200, "{dialect}: {x}\n{text}");
        assert!(
            x.starts_with("applied; trigger=error; attempts=2"),
            "{dialect}: {x}"
        );
        let recorded = mock.recorded();
        let sent: Value = serde_json::from_slice(&recorded[1].body).unwrap();
        assert!(messages_in(&sent) <= 12, "{dialect}: {sent}");
        // The next turn is compacted before it is sent.
        let (status, x, _) = send_capped(&proxy, &path, &body, 100, 12).await;
        assert_eq!(status, 200, "{dialect}: {x}");
        assert_eq!(mock.recorded().len(), 3, "{dialect}: {x}");
    }
}
