//! Upstreams that misbehave at the HTTP level: the client still gets either the whole
//! answer, framed as the proxy relays it, or an OpenAI-style error; never a truncated
//! body framed as complete, nor an empty reply.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use futures_util::StreamExt;
use support::{client, Proxy, RawUpstream};

/// The routes that relay an upstream's answer: the compaction path and pass-through.
const ROUTES: [&str; 2] = ["/v1/chat/completions", "/v1/embeddings"];

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// What the client gets on each of `ROUTES` for a chat body, from an upstream that
/// answers as `answer` says: the path, the status, the headers and the whole body.
async fn on_each_route(
    answer: fn(usize) -> Option<&'static [u8]>,
) -> Vec<(
    &'static str,
    reqwest::StatusCode,
    reqwest::header::HeaderMap,
    String,
)> {
    let upstream = RawUpstream::start(answer).await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    let mut answers = Vec::new();
    for path in ROUTES {
        let response = client()
            .post(proxy.url(path))
            .body(CHAT)
            .send()
            .await
            .unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        answers.push((path, status, headers, response.text().await.unwrap()));
    }
    answers
}

#[tokio::test]
async fn a_content_length_beside_transfer_encoding_is_dropped_not_relayed() {
    // RFC 9112 section 6.3: chunked framing wins, and an intermediary must remove the
    // Content-Length; relaying it would cut the decoded body to its first 3 bytes.
    let answers = on_each_route(|_| {
        Some(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n")
    })
    .await;
    for (path, status, headers, body) in answers {
        assert_eq!(status, 200, "{path}");
        assert_ne!(
            headers.get("content-length").map(|v| v.as_bytes()),
            Some(&b"3"[..]),
            "{path}"
        );
        assert_eq!(body, "hello world", "{path}");
    }
}

#[tokio::test]
async fn a_transfer_coding_the_proxy_cannot_relay_is_a_502() {
    // `gzip` alone means "until close, gzip-coded"; the coding describes the hop, so
    // relaying the bytes without it would hand the client gzip as the body. nginx and
    // Envoy refuse such answers too.
    let answers = on_each_route(|_| {
        Some(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: gzip\r\n\r\nhello world")
    })
    .await;
    for (path, status, _, body) in answers {
        assert_eq!(status, 502, "{path}");
        let error: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["error"]["code"], "upstream_unreachable");
        assert!(
            error["error"]["message"].as_str().unwrap().contains("gzip"),
            "{error}"
        );
    }
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Answers the first request on each connection and closes the connection on the next
/// one unanswered: an upstream whose idle timer fires just as the proxy reuses the
/// connection.
fn first_only(nth: usize) -> Option<&'static [u8]> {
    (nth == 0).then_some(OK)
}

#[tokio::test]
async fn a_reused_connection_the_upstream_closes_unanswered_is_retried_on_a_new_one() {
    let upstream = RawUpstream::start(first_only).await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    // Each request after the first finds the pooled connection, which fails; the chat
    // body (held in memory) and small pass-through bodies are sent again whole.
    let requests = [
        ("/v1/models", ""),
        ("/v1/chat/completions", CHAT),
        ("/v1/embeddings", r#"{"input":"a"}"#),
        ("/v1/chat/completions", r#"{"not":"a chat request"}"#),
        ("/v1/models", ""),
    ];
    for (path, body) in requests {
        let request = match body {
            "" => client().get(proxy.url(path)),
            body => client().post(proxy.url(path)).body(body),
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200, "{path} {body}");
        assert_eq!(response.text().await.unwrap(), "ok");
    }
    let seen = upstream.requests();
    assert_eq!(seen.len(), 2 * requests.len() - 1);
    // The request that failed and the one that answered are the same bytes.
    for pair in seen[1..].chunks(2) {
        assert_eq!(pair[0], pair[1]);
    }
    assert_eq!(upstream.connections(), requests.len());
    let metrics = support::metrics(&proxy).await;
    assert!(
        metrics.contains("compaction_proxy_upstream_stale_retries_total 4\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_streamed_body_already_sent_is_not_sent_again() {
    let upstream = RawUpstream::start(first_only).await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    let warm = client().get(proxy.url("/v1/models")).send().await.unwrap();
    assert_eq!(warm.status(), 200);
    // Several frames, read and sent before the upstream closed: they are gone, so the
    // client hears of the failure instead of the upstream getting part of a body.
    let parts = futures_util::stream::iter(["part one,", "part two,", "part three"]).then(
        |part| async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Ok::<_, std::io::Error>(part)
        },
    );
    let response = client()
        .post(proxy.url("/v1/files"))
        .body(reqwest::Body::wrap_stream(parts))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let seen = upstream.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].1, b"part one,part two,part three");
}

#[tokio::test]
async fn idle_upstream_connections_are_not_reused_past_the_pool_idle_timeout() {
    let upstream = RawUpstream::start(|_| Some(OK)).await;
    let proxy = Proxy::start(
        &upstream.url("/v1"),
        "[upstream]\npool_idle_timeout_ms = 200\n",
    );
    let get = || client().get(proxy.url("/v1/models")).send();
    for _ in 0..3 {
        assert_eq!(get().await.unwrap().status(), 200);
    }
    assert_eq!(upstream.connections(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(get().await.unwrap().status(), 200);
    assert_eq!(upstream.connections(), 2);
}

#[tokio::test]
async fn a_body_that_fails_before_its_first_byte_is_a_502_not_an_empty_reply() {
    // A chunk size past 64 bits, in the same packet as the head.
    let upstream = RawUpstream::start(|_| {
        Some(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffffffff\r\nabc")
    })
    .await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    for path in ROUTES {
        let response = client().post(proxy.url(path)).body(CHAT).send().await;
        let response = response.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(response.status(), 502, "{path}");
        let error: serde_json::Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], "upstream_unreachable", "{path}");
    }
}
