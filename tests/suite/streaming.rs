//! Server-sent events reach the client as the upstream produces them, and a client that
//! leaves takes the upstream request with it.

use crate::support;

use std::time::Duration;

use futures_util::StreamExt;
use support::{client, Mock, Proxy, SSE_FIRST, SSE_REST};

const CHAT: &str =
    "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

#[tokio::test]
async fn first_event_arrives_while_the_upstream_still_holds_the_stream() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-mock", "sse-gated")
        .body(CHAT)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = response.bytes_stream();
    let mut received = Vec::new();
    // The mock sends the rest only after the gate opens below, so if the proxy held
    // the stream back this would time out.
    while received.len() < SSE_FIRST.len() {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("first SSE event was held back")
            .unwrap()
            .unwrap();
        received.extend_from_slice(&chunk);
    }
    assert_eq!(received, SSE_FIRST.as_bytes());
    mock.state.gate.notify_one();
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(received).unwrap();
    assert_eq!(text, format!("{SSE_FIRST}{SSE_REST}"));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn client_disconnect_mid_stream_ends_the_upstream_request() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("x-mock", "sse-forever")
        .body(CHAT)
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    tokio::time::timeout(
        Duration::from_secs(10),
        mock.state.stream_cancelled.notified(),
    )
    .await
    .expect("the upstream stream kept going after the client left");
}

#[tokio::test]
async fn passthrough_routes_stream_too() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let (_stream, first) = support::gated_stream(&proxy, "/v1/responses").await;
    assert!(SSE_FIRST.as_bytes().starts_with(&first));
    mock.state.gate.notify_one();
}
