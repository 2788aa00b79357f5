//! Slow or numerous clients cannot hold the proxy's memory or connections for as long as
//! they like: a silent body is cut off, idle connections are closed, the chat bodies held
//! in memory share one bound, and connections beyond the cap wait to be accepted. A
//! client that reads slowly is not one of them: the upstream's idle timeout counts only
//! time spent waiting on the upstream.

use crate::support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use std::sync::LazyLock;

use support::{read_to_close, send_raw, Mock, Proxy, RawUpstream};

#[tokio::test]
async fn a_request_body_that_goes_silent_gets_408_and_its_connection_closed() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[server]\nbody_read_timeout_ms = 300\n");
    for path in ["/v1/chat/completions", "/v1/files"] {
        let head = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n");
        let mut stream = send_raw(proxy.addr, head.as_bytes()).await;
        stream.write_all(b"{\"model\":").await.unwrap();
        let started = Instant::now();
        let answer = read_to_close(&mut stream, Duration::from_secs(10))
            .await
            .unwrap_or_else(|_| panic!("{path}: still open after 10 s"));
        assert!(answer.starts_with("HTTP/1.1 408 "), "{path}: {answer}");
        assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[server]\nkeep_alive_timeout_ms = 300\n");
    let mut stream = send_raw(proxy.addr, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let answer = read_to_close(&mut stream, Duration::from_secs(5))
        .await
        .expect("the idle connection was still open after 5 s");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
}

#[tokio::test]
async fn the_keep_alive_timeout_never_cuts_a_request_in_progress() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[server]\nkeep_alive_timeout_ms = 200\n");
    // The timer runs only while the connection waits for a request head: not while the
    // upstream thinks, nor while the answer streams.
    let slow = proxy
        .post("/v1/embeddings", &[("x-mock-delay-ms", "600")], "{}")
        .await;
    assert_eq!(slow.text().await.unwrap(), "{}");
    let (mut stream, first) = support::gated_stream(&proxy, "/v1/chat/completions").await;
    assert_eq!(first, support::SSE_FIRST);
    tokio::time::sleep(Duration::from_millis(600)).await;
    mock.state.gate.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(rest, support::SSE_REST.as_bytes());
}

#[tokio::test]
async fn chat_bodies_held_in_memory_share_one_bound_and_get_503_past_it() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(
        &mock.url("/v1"),
        "[limits]\nmax_body_bytes = 1000\nmax_buffered_bytes = 1000\n",
    );
    // A body declared at 800 bytes holds them while it trickles in.
    let slow = send_raw(
        proxy.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 800\r\n\r\n{",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi there, how are you"}]}"#;
    let declared = proxy
        .post("/v1/chat/completions", &[], chat.repeat(5))
        .await;
    assert_eq!(declared.status(), 503);
    let error: serde_json::Value = declared.json().await.unwrap();
    assert_eq!(error["error"]["code"], "overloaded");
    // Without a declared length, the bytes count as they arrive.
    let chunks = futures_util::stream::iter((0..5).map(move |_| Ok::<_, std::io::Error>(chat)));
    let body = reqwest::Body::wrap_stream(chunks);
    let streamed = proxy.post("/v1/chat/completions", &[], body).await;
    assert_eq!(streamed.status(), 503);
    // What fits still goes, and the slow body's share is given back when it ends.
    let small = proxy.post("/v1/chat/completions", &[], chat).await;
    assert_eq!(small.status(), 200);
    drop(slow);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let large = proxy
        .post("/v1/chat/completions", &[], chat.repeat(5))
        .await;
    assert_eq!(large.status(), 200);
}

#[tokio::test]
async fn connections_past_the_cap_wait_to_be_accepted() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[server]\nmax_connections = 2\n");
    let idle: Vec<TcpStream> = vec![
        TcpStream::connect(proxy.addr).await.unwrap(),
        TcpStream::connect(proxy.addr).await.unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The kernel completes the handshake; the proxy does not take the connection yet.
    let mut third = send_raw(
        proxy.addr,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(
        read_to_close(&mut third, Duration::from_millis(500))
            .await
            .is_err(),
        "a third connection was served beside two held ones"
    );
    drop(idle);
    let answer = read_to_close(&mut third, Duration::from_secs(5))
        .await
        .expect("the waiting connection was not served once a slot was free");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
}

/// An answer larger than every buffer between the upstream and the client (the proxy's
/// socket buffers and the client's), so that a client that stops reading holds the
/// proxy's body unpolled.
const BIG: usize = 24 * 1024 * 1024;
static BIG_ANSWER: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {BIG}\r\n\r\n").into_bytes();
    answer.resize(answer.len() + BIG, b'x');
    answer
});

fn big(_: usize) -> Option<&'static [u8]> {
    Some(&BIG_ANSWER)
}

#[tokio::test]
async fn a_client_that_reads_slower_than_the_upstream_sends_is_not_cut() {
    // Built before the clock starts: the upstream answers at once.
    LazyLock::force(&BIG_ANSWER);
    let upstream = RawUpstream::start(big).await;
    let proxy = Proxy::start(&upstream.url("/v1"), "[upstream]\nidle_timeout_ms = 300\n");
    let mut stream = send_raw(
        proxy.addr,
        b"GET /v1/files/big/content HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let mut head = vec![0; 64 * 1024];
    let mut read = stream.read(&mut head).await.unwrap();
    // The client reads nothing for four idle timeouts while the upstream has long sent
    // all it had: the time is the client's, not the upstream's silence.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
        .await
        .expect("the answer ended within 30 s")
        .unwrap();
    read += rest.len();
    let text = String::from_utf8_lossy(&head[..200]);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    let head_len = text.find("\r\n\r\n").unwrap() + 4;
    assert_eq!(read - head_len, BIG, "the whole body reached the client");
}
