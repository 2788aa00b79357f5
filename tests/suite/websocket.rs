//! WebSocket through the proxy: the handshake reaches the upstream with its headers, and
//! once it has switched protocols the two connections are relayed byte for byte both
//! ways, with a real WebSocket client and server (tungstenite) on loopback.

// Test setup fails loudly; the handshake callback's error type is tungstenite's.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::result_large_err
)]

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use support::{client, metrics, raw, Proxy, RawUpstream};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket server that echoes every text and binary message, answers pings (as
/// tungstenite does by itself) and completes the close handshake. It keeps each
/// handshake's request head and the close frame it was sent.
struct EchoServer {
    url: String,
    handshakes: Arc<Mutex<Vec<Request>>>,
    closes: Arc<Mutex<Vec<Option<CloseFrame>>>>,
}

impl EchoServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let closes = Arc::new(Mutex::new(Vec::new()));
        let (seen, closed) = (Arc::clone(&handshakes), Arc::clone(&closes));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, closed) = (Arc::clone(&seen), Arc::clone(&closed));
                tokio::spawn(async move {
                    // Takes the subprotocol the client offers, as a server that speaks it.
                    let record = |request: &Request, mut response: Response| {
                        seen.lock().unwrap().push(request.clone());
                        if let Some(offered) = request.headers().get("sec-websocket-protocol") {
                            let chosen = offered.clone();
                            response
                                .headers_mut()
                                .insert("sec-websocket-protocol", chosen);
                        }
                        Ok(response)
                    };
                    let mut ws = tokio_tungstenite::accept_hdr_async(stream, record)
                        .await
                        .unwrap();
                    while let Some(Ok(message)) = ws.next().await {
                        match message {
                            Message::Text(_) | Message::Binary(_) => {
                                ws.send(message).await.unwrap();
                            }
                            Message::Close(frame) => closed.lock().unwrap().push(frame),
                            _ => {}
                        }
                    }
                });
            }
        });
        Self {
            url,
            handshakes,
            closes,
        }
    }
}

/// The proxy's WebSocket URL for `path`.
fn ws_url(proxy: &Proxy, path: &str) -> String {
    format!("ws://{}{path}", proxy.addr)
}

/// A handshake request for `url` with Codex's beta header and a bearer key.
fn handshake(url: &str) -> http::Request<()> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().unwrap();
    let headers = request.headers_mut();
    headers.insert("authorization", "Bearer sk-client".parse().unwrap());
    headers.insert(
        "openai-beta",
        "responses_websockets=2026-02-06".parse().unwrap(),
    );
    headers.insert("sec-websocket-protocol", "chat".parse().unwrap());
    request
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Asserts the proxy ends the relayed `ws` within `wait`, with no further message.
async fn ends_within(ws: &mut Ws, wait: Duration) {
    let end = tokio::time::timeout(wait, ws.next())
        .await
        .expect("the relay was not closed");
    assert!(
        !matches!(end, Some(Ok(Message::Text(_) | Message::Binary(_)))),
        "{end:?}"
    );
}

#[tokio::test]
async fn echo_large_frames_ping_and_close_pass_through() {
    let server = EchoServer::start().await;
    let proxy = Proxy::start(&format!("{}/v1", server.url), "");
    let (mut ws, answer) =
        tokio_tungstenite::connect_async(handshake(&ws_url(&proxy, "/v1/responses?x=1")))
            .await
            .unwrap();
    // The upstream's handshake answer reaches the client: the subprotocol it chose.
    assert_eq!(answer.status(), 101);
    assert_eq!(answer.headers()["sec-websocket-protocol"], "chat");

    // The upstream saw the handshake at the joined path, with the client's headers.
    let seen = server.handshakes.lock().unwrap()[0].clone();
    assert_eq!(seen.uri().to_string(), "/v1/responses?x=1");
    assert_eq!(seen.headers()["authorization"], "Bearer sk-client");
    assert_eq!(
        seen.headers()["openai-beta"],
        "responses_websockets=2026-02-06"
    );

    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));

    // A 1 MB frame each way, bytes that are not text.
    let big: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Binary(echoed) => assert!(echoed == big, "the 1 MB frame changed"),
        other => panic!("expected the binary frame back, got {other:?}"),
    }

    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Pong(b"are you there".to_vec().into())
    );

    // The close handshake: the client's close reaches the server, the server's answer
    // reaches the client, and then the stream ends.
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "done".into(),
    }))
    .await
    .unwrap();
    match ws.next().await {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.code, CloseCode::Normal),
        other => panic!("expected the server's close, got {other:?}"),
    }
    assert!(ws.next().await.is_none(), "the stream ends after the close");
    let closes = server.closes.lock().unwrap().clone();
    assert_eq!(closes.len(), 1);
    let frame = closes[0].clone().unwrap();
    assert_eq!(
        (frame.code, frame.reason.as_str()),
        (CloseCode::Normal, "done")
    );

    let text = metrics(&proxy).await;
    assert!(
        text.contains("compaction_proxy_upgrades_total 1\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refused_upgrade_reaches_the_client_as_the_upstream_sent_it() {
    let upstream = RawUpstream::start(|_| {
        Some(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nx-request-id: r1\r\ncontent-length: 27\r\n\r\n{\"error\":\"no websocket\"}\n\n\n")
    })
    .await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    let answer = raw(
        proxy.addr,
        b"GET /v1/responses HTTP/1.1\r\nhost: proxy\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
          sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        Duration::from_millis(500),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404 Not Found\r\n"), "{answer}");
    assert!(answer.contains("x-request-id: r1\r\n"), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\n{\"error\":\"no websocket\"}\n\n\n"),
        "{answer}"
    );
    // The handshake went upstream as an upgrade, its key and version with it.
    let (head, _) = upstream.requests()[0].clone();
    let head = head.to_ascii_lowercase();
    for line in [
        "get /v1/responses http/1.1\r\n",
        "upgrade: websocket\r\n",
        "connection: upgrade\r\n",
        "sec-websocket-key: dghlihnhbxbszsbub25jzq==\r\n",
    ] {
        assert!(head.contains(line), "{line:?} missing from {head}");
    }
    let text = metrics(&proxy).await;
    assert!(
        text.contains("compaction_proxy_upgrades_total 0\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_relay_silent_both_ways_is_closed_after_the_idle_timeout() {
    let server = EchoServer::start().await;
    let proxy = Proxy::start(
        &format!("{}/v1", server.url),
        "[upstream]\nidle_timeout_ms = 400\n",
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url(&proxy, "/v1/responses"))
        .await
        .unwrap();
    // Traffic keeps it open past the timeout.
    for i in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        ws.send(Message::text(format!("{i}"))).await.unwrap();
        assert_eq!(
            ws.next().await.unwrap().unwrap(),
            Message::text(format!("{i}"))
        );
    }
    // Then silence: the proxy closes both connections.
    ends_within(&mut ws, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn a_relayed_connection_keeps_its_place_under_max_connections() {
    let server = EchoServer::start().await;
    let proxy = Proxy::start(
        &format!("{}/v1", server.url),
        "[server]\nmax_connections = 1\n",
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url(&proxy, "/v1/responses"))
        .await
        .unwrap();
    ws.send(Message::text("hi")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hi"));
    // The one slot is the relay's: another connection waits in the backlog.
    let waiting = client().get(proxy.url("/healthz")).send();
    let waited = tokio::time::timeout(Duration::from_millis(500), waiting).await;
    assert!(
        waited.is_err(),
        "a second connection was served beside the relay"
    );
    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    // The server has closed its side after the close handshake; the client closes its own.
    drop(ws);
    let health = tokio::time::timeout(
        Duration::from_secs(5),
        client().get(proxy.url("/healthz")).send(),
    )
    .await
    .expect("the slot was not freed when the relay ended")
    .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn at_shutdown_a_relay_goes_on_for_the_grace_period_then_is_told_going_away() {
    let server = EchoServer::start().await;
    let proxy = Proxy::start(
        &format!("{}/v1", server.url),
        "[server]\nshutdown_grace_ms = 1000\n",
    );
    // Not Codex's Responses WebSocket: the proxy cannot tell when a request is answered.
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url(&proxy, "/v1/chat"))
        .await
        .unwrap();
    proxy.terminate().await;
    let stopped = Instant::now();
    // Within the grace period the relay still carries the conversation.
    ws.send(Message::text("still there")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("still there")
    );
    // Then the proxy closes it between two messages, with a close frame each way.
    let close = tokio::time::timeout(Duration::from_secs(3), ws.next())
        .await
        .expect("the relay was not closed");
    assert!(
        matches!(&close, Some(Ok(Message::Close(Some(f)))) if f.code == CloseCode::Away),
        "{close:?}"
    );
    assert!(
        stopped.elapsed() >= Duration::from_millis(900),
        "closed before the grace ended"
    );
    let exit = tokio::time::timeout(Duration::from_secs(5), proxy.exited())
        .await
        .expect("the proxy did not exit after closing the relay");
    assert!(exit.success(), "{exit:?}");
    let closes = server.closes.lock().unwrap().clone();
    assert!(
        matches!(closes.as_slice(), [Some(f)] if f.code == CloseCode::Away),
        "{closes:?}"
    );
}

/// A Responses WebSocket upstream: each `response.create` is answered by three events a
/// `pause` apart, the last `response.completed`. It keeps the close frames it was sent.
async fn responses_upstream(pause: Duration) -> (String, Arc<Mutex<Vec<Option<CloseFrame>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let closes = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&closes);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = Arc::clone(&kept);
            tokio::spawn(async move {
                let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
                while let Some(Ok(message)) = ws.next().await {
                    match message {
                        Message::Text(text) if text.contains("\"response.create\"") => {
                            for kind in [
                                "response.created",
                                "response.output_text.delta",
                                "response.completed",
                            ] {
                                tokio::time::sleep(pause).await;
                                let event = format!("{{\"type\":\"{kind}\"}}");
                                ws.send(Message::text(event)).await.unwrap();
                            }
                        }
                        Message::Close(frame) => kept.lock().unwrap().push(frame),
                        _ => {}
                    }
                }
            });
        }
    });
    (url, closes)
}

/// A relayed Codex Responses WebSocket is drained as a bridged one is: the response in
/// flight at SIGTERM reaches the client whole, then each side gets a close frame 1001,
/// and the proxy exits long before its grace period would end.
#[tokio::test]
async fn at_shutdown_a_relayed_responses_websocket_finishes_its_response_then_goes_away() {
    let (upstream, closes) = responses_upstream(Duration::from_millis(400)).await;
    let proxy = Proxy::start(
        &format!("{upstream}/v1"),
        "[server]\nshutdown_grace_ms = 20000\n[upstream]\nresponses_websocket = \"relay\"\n",
    );
    let mut request = handshake(&ws_url(&proxy, "/v1/responses"));
    request.headers_mut().remove("sec-websocket-protocol");
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let create = r#"{"type":"response.create","model":"gpt-5","input":[]}"#;
    ws.send(Message::text(create)).await.unwrap();
    let stopped = Instant::now();
    proxy.terminate().await;
    let mut read = Vec::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("nothing more came")
    {
        let message = message.unwrap();
        let close = matches!(message, Message::Close(_));
        read.push(message);
        if close {
            break;
        }
    }
    let kinds: Vec<String> = read.iter().map(|m| format!("{m:?}")).collect();
    assert_eq!(read.len(), 4, "{kinds:?}");
    assert!(kinds[2].contains("response.completed"), "{kinds:?}");
    assert!(
        matches!(&read[3], Message::Close(Some(f)) if f.code == CloseCode::Away),
        "{kinds:?}"
    );
    let exit = tokio::time::timeout(Duration::from_secs(5), proxy.exited())
        .await
        .expect("the proxy did not exit once the response was done");
    assert!(exit.success(), "{exit:?}");
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    let closes = closes.lock().unwrap().clone();
    assert!(
        matches!(closes.as_slice(), [Some(f)] if f.code == CloseCode::Away),
        "{closes:?}"
    );
}
