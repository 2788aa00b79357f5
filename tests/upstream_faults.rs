//! Upstreams that misbehave at the HTTP level: the client still gets either the whole
//! answer, framed as the proxy relays it, or an OpenAI-style error; never a truncated
//! body framed as complete, nor an empty reply.

mod support;

use support::{client, Proxy, RawUpstream};

/// The routes that relay an upstream's answer: the compaction path and pass-through.
const ROUTES: [&str; 2] = ["/v1/chat/completions", "/v1/embeddings"];

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn a_content_length_beside_transfer_encoding_is_dropped_not_relayed() {
    // RFC 9112 section 6.3: chunked framing wins, and an intermediary must remove the
    // Content-Length; relaying it would cut the decoded body to its first 3 bytes.
    let upstream = RawUpstream::start(|_| {
        Some(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n")
    })
    .await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    for path in ROUTES {
        let response = client()
            .post(proxy.url(path))
            .body(CHAT)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_ne!(
            response
                .headers()
                .get("content-length")
                .map(|v| v.as_bytes()),
            Some(&b"3"[..]),
            "{path}"
        );
        assert_eq!(response.text().await.unwrap(), "hello world", "{path}");
    }
}

#[tokio::test]
async fn a_transfer_coding_the_proxy_cannot_relay_is_a_502() {
    // `gzip` alone means "until close, gzip-coded"; the coding describes the hop, so
    // relaying the bytes without it would hand the client gzip as the body. nginx and
    // Envoy refuse such answers too.
    let upstream = RawUpstream::start(|_| {
        Some(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: gzip\r\n\r\nhello world")
    })
    .await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    for path in ROUTES {
        let response = client()
            .post(proxy.url(path))
            .body(CHAT)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 502, "{path}");
        let error: serde_json::Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], "upstream_unreachable");
        assert!(
            error["error"]["message"].as_str().unwrap().contains("gzip"),
            "{error}"
        );
    }
}
