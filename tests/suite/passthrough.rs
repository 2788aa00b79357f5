//! Pass-through is transparent: bodies, headers, paths and upstream errors reach the
//! other side as they were sent, and large bodies stream instead of being held.

use crate::support;

use std::time::Duration;

use support::{checksum, client, raw, Mock, Proxy};

#[tokio::test]
async fn json_body_is_byte_identical_both_ways() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // Odd spacing, key order and escapes must survive: nothing re-serialises it.
    let body = "{ \"model\":\"m\",  \"input\": \"caf\\u00e9 \u{1F600}\", \"z\":1,\"a\":[ ] }";
    let response = proxy
        .post(
            "/v1/embeddings",
            &[("content-type", "application/json")],
            body,
        )
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), body);
    assert_eq!(mock.last().body, body.as_bytes());
}

#[tokio::test]
async fn chat_body_is_forwarded_as_the_original_bytes() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],   \"model\":\"gpt-4o\",\"unknown_field\":{\"x\":1.50}}";
    let response = proxy.post("/v1/chat/completions", &[], body).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-compaction").is_none());
    assert_eq!(response.text().await.unwrap(), body);
    assert_eq!(mock.last().body, body.as_bytes());
}

#[tokio::test]
async fn binary_multipart_upload_is_byte_identical() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let payload: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let boundary = "----cp-boundary-7d1";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
    body.extend_from_slice(&payload);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let response = proxy
        .post(
            "/v1/files",
            &[("content-type", content_type.as_str())],
            body.clone(),
        )
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap(), body);
    let seen = mock.last();
    assert_eq!(seen.body, body);
    assert_eq!(seen.headers["content-type"], content_type.as_str());
    assert_eq!(
        seen.headers["content-length"],
        body.len().to_string().as_str()
    );
}

#[tokio::test]
async fn large_body_is_byte_identical_both_ways() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let body: Vec<u8> = (0..50 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let response = client()
        .put(proxy.url("/v1/uploads/big"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let back = response.bytes().await.unwrap();
    assert!(
        back == body,
        "echoed body differs ({} bytes back)",
        back.len()
    );
    assert!(mock.last().body == body);
}

#[tokio::test]
async fn huge_upload_streams_without_being_held_in_memory() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    const CHUNK: usize = 1024 * 1024;
    const CHUNKS: u64 = 200;
    let chunk: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
    let mut expected = 0;
    for _ in 0..CHUNKS {
        expected = checksum(expected, &chunk);
    }
    let stream = futures_util::stream::iter(
        (0..CHUNKS).map(move |_| Ok::<_, std::io::Error>(bytes::Bytes::from(chunk.clone()))),
    );
    let response = proxy
        .post(
            "/v1/files",
            &[("x-mock", "sink")],
            reqwest::Body::wrap_stream(stream),
        )
        .await;
    assert_eq!(response.status(), 200);
    let answer = response.text().await.unwrap();
    assert_eq!(answer, format!("{} {expected}", CHUNKS * CHUNK as u64));
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.child.id())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        peak_kb < 64 * 1024,
        "proxy peaked at {peak_kb} kB for a 200 MB upload"
    );
}

#[tokio::test]
async fn hop_by_hop_headers_dropped_end_to_end_kept_host_rewritten() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let request = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: {}\r\nConnection: keep-alive, x-private-hop\r\n\
         X-Private-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eA==\r\n\
         Authorization: Bearer sk-client-key\r\nX-Session-Id: s-42\r\nAccept-Encoding: gzip\r\n\
         OpenAI-Organization: org-1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
        proxy.addr
    );
    let answer = raw(proxy.addr, request.as_bytes(), Duration::from_millis(500)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = mock.last().headers;
    for gone in ["x-private-hop", "keep-alive", "te", "proxy-authorization"] {
        assert!(seen.get(gone).is_none(), "{gone} reached the upstream");
    }
    assert_ne!(
        seen.get("connection").map(|v| v.as_bytes()),
        Some(&b"keep-alive, x-private-hop"[..])
    );
    assert_eq!(seen["authorization"], "Bearer sk-client-key");
    assert_eq!(seen["x-session-id"], "s-42");
    assert_eq!(seen["accept-encoding"], "gzip");
    assert_eq!(seen["openai-organization"], "org-1");
    assert_eq!(seen["host"], mock.addr.to_string().as_str());
}

#[tokio::test]
async fn compressed_bodies_pass_as_they_are() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // Not real gzip: the proxy must neither decode nor re-encode what it is given.
    let body: Vec<u8> = vec![0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xfe];
    let response = proxy
        .post(
            "/v1/embeddings",
            &[
                ("content-encoding", "gzip"),
                ("content-type", "application/json"),
            ],
            body.clone(),
        )
        .await;
    assert_eq!(response.bytes().await.unwrap(), body);
    assert_eq!(mock.last().headers["content-encoding"], "gzip");
}

#[tokio::test]
async fn paths_join_the_base_url_with_v1_counted_once() {
    let mock = Mock::start().await;
    let cases = [
        ("/v1", "/v1/models", "/v1/models"),
        ("", "/v1/models", "/v1/models"),
        ("/api/v1", "/v1/models", "/api/v1/models"),
        (
            "/v1",
            "/v1/chat/completions?api-version=2024-10-21&x=%20y",
            "/v1/chat/completions?api-version=2024-10-21&x=%20y",
        ),
        ("/v1", "/api/tags", "/v1/api/tags"),
    ];
    for (base, path, expected) in cases {
        let proxy = Proxy::start(&mock.url(base), "");
        let response = client().get(proxy.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{base} + {path}");
        assert_eq!(mock.last().uri, expected, "{base} + {path}");
    }
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_reused() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // Every kind of answer hands its connection back: streamed through untouched,
    // read whole by the chat path (an error), and with an empty body.
    for _ in 0..5 {
        let chat = proxy
            .post(
                "/v1/chat/completions",
                &[],
                "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
            )
            .await;
        assert_eq!(chat.status(), 200);
        chat.bytes().await.unwrap();
        let error = proxy
            .post(
                "/v1/chat/completions",
                &[("x-mock", "error"), ("x-mock-status", "400")],
                "{\"model\":\"m\",\"messages\":[]}",
            )
            .await;
        assert_eq!(error.status(), 400);
        error.bytes().await.unwrap();
        let models = client().get(proxy.url("/v1/models")).send().await.unwrap();
        assert_eq!(models.status(), 200);
        models.bytes().await.unwrap();
        let head = client().head(proxy.url("/v1/models")).send().await.unwrap();
        assert_eq!(head.status(), 200);
    }
    assert_eq!(mock.recorded().len(), 20);
    assert_eq!(mock.connections(), 1);
}

#[tokio::test]
async fn upstream_errors_pass_through_unchanged() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    for status in [400u16, 401, 404, 413, 429, 500, 503] {
        for path in ["/v1/chat/completions", "/v1/models"] {
            let response = proxy
                .post(
                    path,
                    &[("x-mock", "error"), ("x-mock-status", &status.to_string())],
                    "{\"model\":\"m\",\"messages\":[]}",
                )
                .await;
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(response.headers()["retry-after"], "7");
            assert_eq!(response.headers()["x-upstream-marker"], "kept");
            assert!(response.headers().get("x-compaction").is_none());
            let expected = format!(
                "{{\"error\":{{\"message\":\"mock error {status}\",\"type\":\"mock\",\"code\":\"mock_{status}\"}}}}\n"
            );
            assert_eq!(response.text().await.unwrap(), expected);
        }
    }
    let attempts = mock.recorded().len();
    assert_eq!(
        attempts, 14,
        "each error must cost exactly one upstream call"
    );
}
