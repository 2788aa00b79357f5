//! Codex's Responses WebSocket, bridged: the proxy answers the handshake itself when the
//! upstream does not speak it, carries each `response.create` frame as
//! `POST /v1/responses` through the compaction path, and sends the events back as text
//! frames. Driven by what Codex 0.169 really sent (`fixtures/codex_ws/`), over real
//! sockets: a tungstenite client, the proxy binary, and an HTTP-only upstream.

// Test setup fails loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use support::{metrics, Mock, Proxy};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One line of a recording: a connection's handshake, a frame Codex sent, or its end.
fn recording() -> Vec<Value> {
    let text = include_str!("../../fixtures/codex_ws/exec_and_resume.jsonl");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The tool call the recording's model made (as Codex sent it back on resume), so that
/// the upstream here answers as the recording server did and the recorded tool output
/// pairs with it.
fn recorded_call(recording: &[Value]) -> Value {
    recording
        .iter()
        .filter_map(|line| line["frame"]["input"].as_array())
        .flatten()
        .find(|item| item["type"] == "function_call")
        .cloned()
        .unwrap()
}

/// An upstream that speaks the Responses API over HTTP only: a WebSocket handshake gets
/// 404, and `POST /v1/responses` a stream, as `fixtures/codex_ws/record.py` answered: the
/// recorded tool call while the input has no tool output, then a message. It keeps every
/// request body and counts the handshakes.
struct HttpOnly {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    handshakes: Arc<Mutex<usize>>,
}

impl HttpOnly {
    async fn start(call: Value) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let handshakes = Arc::new(Mutex::new(0));
        let (seen, shaken) = (Arc::clone(&bodies), Arc::clone(&handshakes));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, shaken, call) = (Arc::clone(&seen), Arc::clone(&shaken), call.clone());
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (seen, shaken, call) =
                        (Arc::clone(&seen), Arc::clone(&shaken), call.clone());
                    async move {
                        if request.headers().contains_key("upgrade") {
                            *shaken.lock().unwrap() += 1;
                            let mut refused =
                                hyper::Response::new(Full::new(Bytes::from("no such route")));
                            *refused.status_mut() = hyper::StatusCode::NOT_FOUND;
                            return Ok::<_, Infallible>(refused);
                        }
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let body: Value = serde_json::from_slice(&body).unwrap();
                        let answer = stream_answer(&body, &call);
                        seen.lock().unwrap().push(body);
                        let mut response = hyper::Response::new(Full::new(Bytes::from(answer)));
                        response
                            .headers_mut()
                            .insert("content-type", "text/event-stream".parse().unwrap());
                        Ok(response)
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        Self {
            url,
            bodies,
            handshakes,
        }
    }
}

/// The SSE answer to `request`: `call` while the input has no tool output, else a message.
fn stream_answer(request: &Value, call: &Value) -> String {
    let input = request["input"].as_array().unwrap();
    let answered = input.iter().any(|i| i["type"] == "function_call_output");
    let item = if answered {
        json!({"type": "message", "id": "msg_up", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "UPSTREAM-RESPONSE", "annotations": []}]})
    } else {
        call.clone()
    };
    let id = format!("resp_up_{}", input.len());
    let events = [
        json!({"type": "response.created", "response": {"id": id, "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": {"id": id, "status": "completed", "output": [item],
            "usage": {"input_tokens": 10, "output_tokens": 1, "total_tokens": 11}}}),
    ];
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

/// Opens a WebSocket to the proxy with the recorded handshake's headers (less those of
/// the handshake itself, which tungstenite writes) and `extra` ones.
async fn connect(proxy: &Proxy, handshake: &Value, extra: &[(&'static str, &str)]) -> Ws {
    let url = format!("ws://{}{}", proxy.addr, handshake["path"].as_str().unwrap());
    let mut request = url.into_client_request().unwrap();
    for (name, value) in handshake["headers"].as_object().unwrap() {
        let skip = [
            "host",
            "connection",
            "upgrade",
            "sec-websocket-key",
            "sec-websocket-version",
            "sec-websocket-extensions",
            "authorization",
        ];
        if !skip.contains(&name.as_str()) {
            let value = value.as_str().unwrap().parse().unwrap();
            request.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value,
            );
        }
    }
    request
        .headers_mut()
        .insert("authorization", "Bearer sk-test".parse().unwrap());
    for (name, value) in extra {
        request.headers_mut().insert(*name, value.parse().unwrap());
    }
    let (ws, answer) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(answer.status(), 101);
    ws
}

/// A proxy that bridges every Codex handshake to `mock`, with `config` after that.
fn bridging(mock: &Mock, config: &str) -> Proxy {
    let config = format!("[upstream]\nresponses_websocket = \"bridge\"\n{config}");
    Proxy::start(&mock.url("/v1"), &config)
}

/// A connection to `proxy` opened as Codex opens it, with `extra` headers.
async fn bridged(proxy: &Proxy, extra: &[(&'static str, &str)]) -> Ws {
    let handshake = json!({"path": "/v1/responses", "headers": {"openai-beta": "responses_websockets=2026-02-06"}});
    connect(proxy, &handshake, extra).await
}

/// Every event of one response, up to and including its terminal one.
async fn response_events(ws: &mut Ws) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("no event for 20 s")
            .expect("the connection closed")
            .unwrap();
        let Message::Text(text) = message else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).unwrap();
        let end = matches!(
            event["type"].as_str(),
            Some("response.completed" | "response.failed" | "response.incomplete" | "error")
        );
        events.push(event);
        if end {
            return events;
        }
    }
}

/// The `type` of each item, with a message's role.
fn shape(input: &Value) -> Vec<String> {
    input
        .as_array()
        .unwrap()
        .iter()
        .map(|i| match i["role"].as_str() {
            Some(role) => format!("{}:{role}", i["type"].as_str().unwrap_or("message")),
            None => i["type"].as_str().unwrap().to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn the_recorded_codex_session_goes_upstream_whole_over_http() {
    let recording = recording();
    let upstream = HttpOnly::start(recorded_call(&recording)).await;
    let proxy = Proxy::start(&format!("{}/v1", upstream.url), "");
    let mut ws: Option<Ws> = None;
    let mut last_id = String::new();
    let mut warmups = 0;
    for line in &recording {
        if let Some(handshake) = line.get("handshake") {
            ws = Some(connect(&proxy, handshake, &[]).await);
            continue;
        }
        let Some(frame) = line.get("frame") else {
            continue;
        };
        let ws = ws.as_mut().unwrap();
        let mut frame = frame.clone();
        // Codex continues the last response it was given on this connection, by its id.
        if frame.get("previous_response_id").is_some() {
            frame["previous_response_id"] = last_id.clone().into();
        }
        warmups += usize::from(frame["generate"] == false);
        ws.send(Message::text(frame.to_string())).await.unwrap();
        let events = response_events(ws).await;
        let done = events.last().unwrap();
        assert_eq!(done["type"], "response.completed", "{events:?}");
        last_id = done["response"]["id"].as_str().unwrap().to_owned();
    }
    assert_eq!(warmups, 2, "the recording has a warm-up per connection");

    // The warm-ups stayed in the proxy; every other frame went upstream with the whole
    // conversation, as Codex sends it over HTTP: no frame type, no warm-up flag, no
    // response id the upstream never made.
    let bodies = upstream.bodies.lock().unwrap().clone();
    let shapes: Vec<Vec<String>> = bodies.iter().map(|b| shape(&b["input"])).collect();
    let first_turn = [
        "message:developer",
        "message:developer",
        "message:user",
        "message:user",
    ];
    let mut with_call = first_turn.map(str::to_owned).to_vec();
    with_call.extend(["function_call".into(), "function_call_output".into()]);
    let mut resumed = with_call.clone();
    resumed.extend(["message:assistant".into(), "message:user".into()]);
    assert_eq!(
        shapes,
        vec![first_turn.map(str::to_owned).to_vec(), with_call, resumed]
    );
    for body in &bodies {
        for field in ["type", "generate", "previous_response_id"] {
            assert!(body.get(field).is_none(), "{field} went upstream");
        }
        assert_eq!(body["stream"], true);
        assert_eq!(body["model"], "gpt-5");
        let input = body["input"].as_array().unwrap();
        compaction_proxy::dialect::responses::validate(input).unwrap();
    }

    // The upstream was asked once whether it speaks the WebSocket; its 404 was learned.
    assert_eq!(*upstream.handshakes.lock().unwrap(), 1);
    let text = metrics(&proxy).await;
    assert!(
        text.contains("compaction_proxy_websocket_bridged_total 2\n"),
        "{text}"
    );
    assert!(
        text.contains("compaction_proxy_websocket_responses_total 3\n"),
        "{text}"
    );
    assert!(
        text.contains("compaction_proxy_upgrades_total 0\n"),
        "{text}"
    );
}

/// A conversation of `turns` exchanges of about 2,000 characters each.
fn long_conversation(turns: usize) -> Vec<Value> {
    (0..turns)
        .flat_map(|n| {
            let text = format!("turn {n}: {}", "compiling module ... warning: unused variable\n".repeat(45));
            [
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}),
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": format!("done {n}")}]}),
            ]
        })
        .collect()
}

#[tokio::test]
async fn an_overflow_is_recovered_before_codex_sees_an_event() {
    let mock = Mock::start().await;
    let proxy = bridging(&mock, "");
    // The upstream refuses over 6,000 of its tokens with a 200 stream whose first event
    // is `response.failed`, as OpenAI does.
    let mut ws = bridged(
        &proxy,
        &[
            ("x-mock", "window"),
            ("x-mock-window", "6000"),
            ("x-mock-shape", "responses-stream"),
        ],
    )
    .await;
    let mut input = long_conversation(12);
    input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}));
    let frame =
        json!({"type": "response.create", "model": "gpt-5", "stream": true, "input": input});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    let events = response_events(&mut ws).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(!types.contains(&"response.failed"), "{types:?}");
    assert_eq!(types.last(), Some(&"response.completed"), "{events:?}");
    assert!(events
        .iter()
        .any(|e| e.to_string().contains("MOCK-RESPONSE")));
    // Refused once, then sent compacted.
    assert!(mock.recorded().len() >= 2, "{}", proxy.logs());
    assert!(proxy.logged("compaction"), "{}", proxy.logs());

    // The next frame continues that response: the upstream gets the whole conversation,
    // compacted again from its checkpoint, and the answer's message after it.
    let id = events.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let next = json!({"type": "response.create", "model": "gpt-5", "previous_response_id": id,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one more"}]}]});
    ws.send(Message::text(next.to_string())).await.unwrap();
    let events = response_events(&mut ws).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    let last: Value = serde_json::from_slice(&mock.last().body).unwrap();
    let sent = last["input"].to_string();
    assert!(
        sent.contains("one more") && sent.contains("MOCK-RESPONSE"),
        "{sent}"
    );
    assert!(last.get("previous_response_id").is_none());
}

#[tokio::test]
async fn errors_pings_and_limits_on_a_bridged_connection() {
    let mock = Mock::start().await;
    let proxy = bridging(
        &mock,
        "[limits]\nmax_body_bytes = 65536\nmax_buffered_bytes = 65536\n",
    );
    let mut ws = bridged(&proxy, &[("x-mock", "error"), ("x-mock-status", "401")]).await;

    // A request in three fragments is read whole; the upstream's refusal reaches Codex
    // as its wrapped error event, with the status.
    let frame = json!({"type": "response.create", "model": "gpt-5", "input": "hi"}).to_string();
    let (a, rest) = frame.split_at(10);
    let (b, c) = rest.split_at(10);
    let pieces = [
        (a, OpCode::Data(Data::Text), false),
        (b, OpCode::Data(Data::Continue), false),
        (c, OpCode::Data(Data::Continue), true),
    ];
    for (piece, opcode, last) in pieces {
        let fragment = Frame::message(piece.as_bytes().to_vec(), opcode, last);
        ws.send(Message::Frame(fragment)).await.unwrap();
    }
    let events = response_events(&mut ws).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "error");
    assert_eq!(events[0]["status"], 401);
    assert_eq!(events[0]["error"]["code"], "mock_401");

    // A frame that is not a request is told so, and the connection stays.
    ws.send(Message::text("not json")).await.unwrap();
    let events = response_events(&mut ws).await;
    assert_eq!(
        (events[0]["type"].as_str(), events[0]["status"].as_u64()),
        (Some("error"), Some(400))
    );

    // Frames needing no answer get none; pings get their pong.
    ws.send(Message::text(
        r#"{"type":"response.processed","response_id":"r"}"#,
    ))
    .await
    .unwrap();
    ws.send(Message::Ping(b"still there".to_vec().into()))
        .await
        .unwrap();
    let pong = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(pong, Message::Pong(b"still there".to_vec().into()));

    // A message over limits.max_body_bytes ends the connection with 1009.
    ws.send(Message::text("x".repeat(70_000))).await.unwrap();
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("expected a close, got {other:?}"),
        }
    };
    assert_eq!(closed.unwrap().code, CloseCode::Size);
}

/// The handshake Codex opens its Responses WebSocket with, written by hand.
const CODEX_HANDSHAKE: &[u8] = b"GET /v1/responses HTTP/1.1\r\nhost: proxy\r\nconnection: Upgrade\r\n\
    upgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    openai-beta: responses_websockets=2026-02-06\r\n\r\n";

#[tokio::test]
async fn refusals_that_say_nothing_of_the_protocol_and_relay_mode_reach_the_client() {
    use support::{raw, RawUpstream};
    // A refusal of the client (its key) is not a missing protocol: it passes, unlearned.
    let upstream =
        RawUpstream::start(|_| Some(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\nno"))
            .await;
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    for _ in 0..2 {
        let answer = raw(proxy.addr, CODEX_HANDSHAKE, Duration::from_millis(500)).await;
        assert!(
            answer.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
            "{answer}"
        );
    }
    assert_eq!(upstream.requests().len(), 2, "each handshake went upstream");

    // In relay mode even a 404 is the client's: the proxy never bridges.
    let upstream =
        RawUpstream::start(|_| Some(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno"))
            .await;
    let proxy = Proxy::start(
        &upstream.url("/v1"),
        "[upstream]\nresponses_websocket = \"relay\"\n",
    );
    let answer = raw(proxy.addr, CODEX_HANDSHAKE, Duration::from_millis(500)).await;
    assert!(answer.starts_with("HTTP/1.1 404 Not Found\r\n"), "{answer}");

    // In auto mode the same 404 is answered with the proxy's own 101.
    let proxy = Proxy::start(&upstream.url("/v1"), "");
    let answer = raw(proxy.addr, CODEX_HANDSHAKE, Duration::from_millis(500)).await;
    assert!(
        answer.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{answer}"
    );
    // RFC 6455's example key and its accept value.
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
        "{answer}"
    );
    let text = metrics(&proxy).await;
    assert!(
        text.contains("compaction_proxy_websocket_bridged_total 1\n"),
        "{text}"
    );
}

#[tokio::test]
async fn with_compaction_off_a_refusal_for_length_reaches_codex() {
    let mock = Mock::start().await;
    let proxy = bridging(&mock, "");
    let mut ws = bridged(
        &proxy,
        &[
            ("x-mock", "window"),
            ("x-mock-window", "6000"),
            ("x-mock-shape", "responses"),
            ("x-compaction", "off"),
        ],
    )
    .await;
    let frame =
        json!({"type": "response.create", "model": "gpt-5", "input": long_conversation(12)});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    let events = response_events(&mut ws).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "error");
    assert_eq!(events[0]["status"], 400);
    assert_eq!(events[0]["error"]["code"], "context_length_exceeded");
    // Sent once, as resolved, and the proxy's header never reached the upstream.
    let recorded = mock.recorded();
    assert_eq!(recorded.len(), 1);
    assert!(!recorded[0].headers.contains_key("x-compaction"));
    let sent: Value = serde_json::from_slice(&recorded[0].body).unwrap();
    assert_eq!(sent["input"].as_array().unwrap().len(), 24);
}

#[tokio::test]
async fn a_handshake_without_a_key_is_refused_by_the_bridge() {
    let mock = Mock::start().await;
    let proxy = bridging(&mock, "");
    let keyless = b"GET /v1/responses HTTP/1.1\r\nhost: proxy\r\nconnection: Upgrade\r\n\
        upgrade: websocket\r\nsec-websocket-version: 13\r\nopenai-beta: responses_websockets=2026-02-06\r\n\r\n";
    let answer = support::raw(proxy.addr, keyless, Duration::from_millis(500)).await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("invalid_websocket_handshake"), "{answer}");
    assert!(mock.recorded().is_empty(), "the upstream was asked");
}

#[tokio::test]
async fn at_shutdown_the_response_in_flight_finishes_then_the_connection_goes_away() {
    let mock = Mock::start().await;
    let proxy = bridging(&mock, "[server]\nshutdown_grace_ms = 10000\n");
    let mut busy = bridged(&proxy, &[("x-mock", "responses-gated")]).await;
    let mut idle = bridged(&proxy, &[]).await;
    let frame = json!({"type": "response.create", "model": "gpt-5", "input": "hi"});
    busy.send(Message::text(frame.to_string())).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), busy.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        first.to_text().unwrap().contains("response.created"),
        "{first}"
    );
    proxy.terminate().await;

    // A connection between two responses goes away at once, long before the grace ends.
    let goodbye = |message: Option<Result<Message, _>>| match message {
        Some(Ok(Message::Close(Some(frame)))) => (frame.code, frame.reason.to_string()),
        other => panic!("expected a close frame, got {other:?}"),
    };
    let closed = tokio::time::timeout(Duration::from_secs(2), idle.next()).await;
    let expected = (CloseCode::Away, "going away".to_owned());
    assert_eq!(
        goodbye(closed.expect("the idle connection stayed open")),
        expected
    );

    // The response in flight is finished first.
    mock.state.gate.notify_one();
    let events = response_events(&mut busy).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    let closed = tokio::time::timeout(Duration::from_secs(2), busy.next()).await;
    assert_eq!(
        goodbye(closed.expect("no close after the response")),
        expected
    );
    // Both connections answered the close, so the proxy is not held to the grace period.
    let exit = tokio::time::timeout(Duration::from_secs(5), proxy.exited())
        .await
        .expect("the proxy waited past its connections");
    assert!(exit.success(), "{exit:?}");
}
