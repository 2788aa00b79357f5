//! The proxy's own errors are OpenAI-style JSON with the right status, bad input never
//! takes it down, and it keeps serving under concurrency.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use support::{client, raw, Mock, Proxy};

async fn json_error(response: reqwest::Response) -> serde_json::Value {
    assert_eq!(response.headers()["content-type"], "application/json");
    let value: serde_json::Value = response.json().await.unwrap();
    assert!(value["error"]["message"].is_string(), "{value}");
    assert!(value["error"]["type"].is_string(), "{value}");
    value
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn upstream_down_is_502_json() {
    let proxy = Proxy::start(&format!("http://127.0.0.1:{}/v1", free_port()), "");
    for path in ["/v1/chat/completions", "/v1/models"] {
        let response = proxy.post(path, &[], "{}").await;
        assert_eq!(response.status(), 502);
        let error = json_error(response).await;
        assert_eq!(error["error"]["code"], "upstream_unreachable");
    }
}

#[tokio::test]
async fn upstream_silent_past_idle_timeout_is_504_json() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[upstream]\nidle_timeout_ms = 300\n");
    let response = proxy
        .post("/v1/chat/completions", &[("x-mock", "silent")], "{}")
        .await;
    assert_eq!(response.status(), 504);
    assert_eq!(
        json_error(response).await["error"]["code"],
        "upstream_timeout"
    );
}

#[tokio::test]
async fn two_hundred_concurrent_requests_are_all_answered() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            let url = if i % 2 == 0 {
                proxy.url("/v1/chat/completions")
            } else {
                proxy.url("/v1/embeddings")
            };
            tokio::spawn(async move {
                let body = format!("{{\"n\":{i}}}");
                let response = client.post(url).body(body.clone()).send().await.unwrap();
                assert_eq!(response.status(), 200);
                assert_eq!(response.text().await.unwrap(), body);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(mock.recorded().len(), 200);
}

#[tokio::test]
async fn malformed_http_gets_400_and_the_proxy_keeps_serving() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let answer = raw(
        proxy.addr,
        b"THIS IS NOT HTTP\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    let answer = raw(
        proxy.addr,
        b"POST /v1/x HTTP/1.1\r\nContent-Length: zz\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    let response = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(mock.recorded().is_empty());
}

#[tokio::test]
async fn invalid_json_on_the_chat_route_is_forwarded_unchanged() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    for body in ["{not json", "[1,2,3]", "{\"messages\":\"nope\"}", ""] {
        let response = proxy.post("/v1/chat/completions", &[], body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(mock.last().body, body.as_bytes());
    }
}

#[tokio::test]
async fn unknown_paths_are_the_upstreams_business() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let response = client()
        .delete(proxy.url("/v1/some/new/endpoint?x=1"))
        .header("x-mock", "error")
        .header("x-mock-status", "404")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let seen = mock.last();
    assert_eq!(
        (seen.method.as_str(), seen.uri.as_str()),
        ("DELETE", "/v1/some/new/endpoint?x=1")
    );
}

#[tokio::test]
async fn oversized_chat_body_is_413_json_with_or_without_length() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[limits]\nmax_body_bytes = 1024\n");
    let big = "x".repeat(4096);
    let response = proxy.post("/v1/chat/completions", &[], big.clone()).await;
    assert_eq!(response.status(), 413);
    assert_eq!(
        json_error(response).await["error"]["code"],
        "request_too_large"
    );

    let chunks =
        futures_util::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>("y".repeat(512))));
    let body = reqwest::Body::wrap_stream(chunks);
    let response = proxy.post("/v1/chat/completions", &[], body).await;
    assert_eq!(response.status(), 413);
    json_error(response).await;

    // The limit is the chat route's: other routes stream whatever size they get.
    let response = proxy.post("/v1/files", &[], big).await;
    assert_eq!(response.status(), 200);
    assert_eq!(mock.recorded().len(), 1);
}
