//! Clients that misbehave (broken framing, odd methods and paths) get an answer of the
//! proxy's own that says it was the client's doing, never a 502 that blames the upstream.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use support::{raw, Mock, Proxy};

/// The JSON error in a raw HTTP answer, after checking its status line.
fn json_error(answer: &str, status: u16) -> serde_json::Value {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

#[tokio::test]
async fn a_chunked_body_with_bare_lf_lines_is_the_clients_error() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    for path in ["/v1/files", "/v1/chat/completions"] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5;a=b\nhello\n0\n\n"
        );
        let answer = raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await;
        let error = json_error(&answer, 400);
        assert_eq!(error["error"]["code"], "invalid_body", "{path}");
    }
}

#[tokio::test]
async fn connect_is_refused_with_a_405_not_an_empty_reply() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let request =
        b"CONNECT evil.example:443 HTTP/1.1\r\nhost: evil.example:443\r\nconnection: close\r\n\r\n";
    let answer = raw(proxy.addr, request, Duration::from_secs(5)).await;
    let error = json_error(&answer, 405);
    assert_eq!(error["error"]["code"], "method_not_allowed");
    assert!(
        answer.to_ascii_lowercase().contains("\r\nallow: get, "),
        "{answer}"
    );
    assert!(mock.recorded().is_empty());
}

#[tokio::test]
async fn dot_segments_never_step_outside_the_base_path() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/api/v1"), "");
    // Resolved before the path is joined to the base URL: whatever climbs, it climbs
    // inside the client's own path.
    let resolved = [
        ("/v1/m/x/../../../admin?x=1", "/api/v1/admin?x=1"),
        ("/v1/models/%2e%2E/files", "/api/v1/files"),
        ("/v1/./models", "/api/v1/models"),
    ];
    // Sent raw: HTTP clients resolve dot segments themselves, attackers do not.
    let get = |path: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        async move { raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await }
    };
    for (path, upstream) in resolved {
        let answer = get(path).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{path}: {answer}");
        assert_eq!(mock.last().uri, upstream, "{path}");
    }
    // What cannot be resolved inside the path is refused before it goes anywhere.
    let seen = mock.recorded().len();
    for path in [
        "/v1/../../admin",
        "/v1/x/..%2f..%2f..%2fadmin",
        "/%2e%2e/admin",
    ] {
        let error = json_error(&get(path).await, 400);
        assert_eq!(error["error"]["code"], "invalid_path", "{path}");
    }
    assert_eq!(mock.recorded().len(), seen);
}
