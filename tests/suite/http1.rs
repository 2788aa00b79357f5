//! The proxy's own HTTP/1.1 server side over real sockets, at its edges: pipelined
//! requests, chunked uploads, `Expect: 100-continue`, heads too large or malformed,
//! the header-read timeout, HTTP/1.0, bodies left unread, and clients that close their
//! side mid-request.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::{raw, send_raw, Mock, Proxy};

const WAIT: Duration = Duration::from_secs(5);

/// Reads until the proxy closes the connection; panics if it is still open after `WAIT`.
async fn read_to_close(stream: &mut TcpStream) -> String {
    support::read_to_close(stream, WAIT)
        .await
        .unwrap_or_else(|so_far| panic!("still open after: {so_far}"))
}

/// Reads until `end` has been seen.
async fn read_until(stream: &mut TcpStream, end: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0; 4096];
    while !String::from_utf8_lossy(&out).contains(end) {
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("no more bytes came")
            .unwrap();
        assert!(
            n > 0,
            "closed before {end:?}: {}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn statuses(answers: &str) -> Vec<&str> {
    answers.split("HTTP/1.").skip(1).map(|a| &a[2..5]).collect()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let requests = "POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nfirstGET /nowhere HTTP/1.1\r\nhost: x\r\nx-mock: nope\r\n\r\nPOST /v1/files HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n6\r\nsecond\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let answers = raw(proxy.addr, requests.as_bytes(), WAIT).await;
    assert_eq!(
        statuses(&answers),
        ["200", "400", "200", "200"],
        "{answers}"
    );
    let first = answers.find("first").unwrap();
    let second = answers.find("second").unwrap();
    let ok = answers.rfind("\r\n\r\nok\n").unwrap();
    assert!(first < second && second < ok, "{answers}");
    let bodies: Vec<_> = mock.recorded().iter().map(|r| r.body.clone()).collect();
    assert_eq!(bodies[0], "first");
    assert_eq!(bodies[2], "second");
}

#[tokio::test]
async fn a_chunked_upload_streams_to_the_upstream_as_it_comes() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let mut stream = send_raw(
        proxy.addr,
        b"POST /v1/files HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await;
    for piece in [
        "5;ext=1\r\nhello\r\n",
        "1\r\n \r\n",
        "5\r\nworld\r\n",
        "0\r\nx-trailer: t\r\n\r\n",
    ] {
        stream.write_all(piece.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let answer = read_until(&mut stream, "hello world").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert_eq!(mock.last().body, "hello world");
    // The connection is kept for the next request.
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let next = read_to_close(&mut stream).await;
    assert!(next.starts_with("HTTP/1.1 200 OK\r\n"), "{next}");
}

#[tokio::test]
async fn a_malformed_chunk_size_is_the_clients_400_and_the_connection_closes() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let request = b"POST /v1/files HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n";
    let answer = raw(proxy.addr, request, WAIT).await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("invalid_body"), "{answer}");
    assert_eq!(statuses(&answer).len(), 1, "{answer}");
}

#[tokio::test]
async fn expect_continue_is_answered_before_the_body_is_sent() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let mut stream = send_raw(
        proxy.addr,
        b"POST /v1/files HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n",
    )
    .await;
    let interim = read_until(&mut stream, "\r\n\r\n").await;
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"body").await.unwrap();
    let answer = read_until(&mut stream, "body").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        mock.last().headers.get("expect").is_none(),
        "expect is hop-by-hop"
    );
    // Refused before its body is read: no 100, and the connection closes after the answer.
    let proxy = Proxy::start(&mock.url("/v1"), "[auth]\nkeys = [\"k\"]\n");
    let mut stream = send_raw(
        proxy.addr,
        b"POST /v1/files HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n",
    )
    .await;
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
}

#[tokio::test]
async fn a_chat_body_declared_over_the_limit_is_refused_before_it_is_sent() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[limits]\nmax_body_bytes = 1024\n");
    let mut stream = send_raw(
        proxy.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4096\r\n\r\n",
    )
    .await;
    // The declared length alone decides: no 100 asks for the body first.
    let answer = read_until(&mut stream, "\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(mock.recorded().is_empty());
}

#[tokio::test]
async fn heads_too_large_get_431_and_malformed_ones_400() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nx-big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let answer = raw(proxy.addr, huge.as_bytes(), WAIT).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    for bad in [
        "GET /healthz HTTP/1.1\r\nno colon\r\n\r\n",
        "GET\x01 / HTTP/1.1\r\n\r\n",
    ] {
        let answer = raw(proxy.addr, bad.as_bytes(), WAIT).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{bad:?}: {answer}");
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    }
    assert!(mock.recorded().is_empty());
}

#[tokio::test]
async fn a_head_never_finished_is_dropped_after_the_keep_alive_timeout() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "[server]\nkeep_alive_timeout_ms = 300\n");
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let started = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.write_all(b": x\r\n").await.unwrap();
    let answer = read_to_close(&mut stream).await;
    assert_eq!(answer, "");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[tokio::test]
async fn http_1_0_gets_http_1_0_answers_and_keep_alive_only_when_asked() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let answer = raw(proxy.addr, b"GET /healthz HTTP/1.0\r\n\r\n", WAIT).await;
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("\r\ncontent-length: "),
        "{answer}"
    );
    let mut stream = send_raw(
        proxy.addr,
        b"GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\n\r\n",
    )
    .await;
    let first = read_until(&mut stream, "ok\n").await;
    assert!(first.contains("\r\nconnection: keep-alive\r\n"), "{first}");
    // A body of unknown length ends with the connection: no chunks for HTTP/1.0.
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.0\r\nconnection: keep-alive\r\nx-mock: sse-gated\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let first = read_until(&mut stream, support::SSE_FIRST).await;
    assert!(first.starts_with("HTTP/1.0 200 OK\r\n"), "{first}");
    mock.state.gate.notify_one();
    let rest = read_to_close(&mut stream).await;
    let streamed = first + &rest;
    assert!(
        !streamed.contains("transfer-encoding") && !streamed.contains("content-length"),
        "{streamed}"
    );
    assert!(streamed.ends_with(support::SSE_REST), "{streamed}");
}

#[tokio::test]
async fn a_body_left_unread_closes_the_connection_after_the_answer() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    // The health check reads no body; what is left of it cannot be told from a request.
    let mut stream = send_raw(
        proxy.addr,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
    )
    .await;
    let answer = read_to_close(&mut stream).await;
    assert_eq!(statuses(&answer), ["200"], "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
}

#[tokio::test]
async fn a_client_that_closes_its_side_mid_request_has_gone() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let mut stream = send_raw(
        proxy.addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-mock-delay-ms: 3000\r\n\r\n",
    )
    .await;
    // Wait until the request is upstream, then close the sending side.
    let deadline = Instant::now() + WAIT;
    while mock.recorded().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    stream.shutdown().await.unwrap();
    let answer = read_to_close(&mut stream).await;
    assert_eq!(answer, "", "no answer for a client that has gone");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn answers_carry_a_date_and_stream_frame_by_frame() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let answer = raw(
        proxy.addr,
        b"GET /healthz HTTP/1.1\r\nconnection: close\r\n\r\n",
        WAIT,
    )
    .await;
    let date = answer
        .lines()
        .find_map(|l| l.strip_prefix("date: "))
        .unwrap_or_else(|| panic!("no date: {answer}"));
    assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
    // The first event arrives while the upstream holds back the rest.
    let (mut events, first) = support::gated_stream(&proxy, "/v1/chat/completions").await;
    assert_eq!(first, support::SSE_FIRST);
    mock.state.gate.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = futures_util::StreamExt::next(&mut events).await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(rest, support::SSE_REST.as_bytes());
}
