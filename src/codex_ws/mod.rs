//! Codex's Responses WebSocket, bridged to an upstream that speaks only HTTP.
//!
//! Codex opens `GET .../responses` as a WebSocket (`openai-beta: responses_websockets=...`)
//! and sends each request as a `response.create` text frame, reading the response's
//! events back as one text frame each: the JSON an SSE `data:` line would carry. When the
//! upstream does not speak this (see `upstream.responses_websocket`), the proxy answers
//! the handshake itself and carries each frame as `POST .../responses` with
//! `stream: true` through the same request loop as the HTTP path, so that compaction and
//! the recovery from a refusal for length happen before Codex sees an event. The
//! connection keeps its conversation ([`conversation`]): a frame that continues the last
//! response goes upstream whole.
//!
//! Frames are read one at a time: Codex sends its next request only once the last
//! response has completed. tungstenite answers pings and the close handshake, refuses
//! frames and messages over `limits.max_body_bytes`, and joins fragmented ones. When the
//! server drains, the response in flight is finished and the connection then closed with
//! 1001 ("going away"), as between two responses; at the end of the grace period a
//! response still in flight is given up and the connection closed the same way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::OwnedSemaphorePermit;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::app::App;
use crate::body::{self, ProxyBody};
use crate::cause::Chain;
use crate::classify::next_event;
use crate::compaction_path;
use crate::dialect::Dialect;
use crate::error::ProxyError;
use crate::limits::Reservation;
use crate::server::upgrade::OnUpgrade;
use crate::shutdown::Watch;
use crate::upstream::own_body_headers;

mod conversation;

use conversation::{Conversation, Create, Frame};

/// The `openai-beta` feature Codex asks for its Responses WebSocket with.
const BETA: &str = "responses_websockets";

/// The handshake said `x-compaction: off`: each frame's request goes upstream as
/// resolved, never rewritten.
#[derive(Debug, Clone, Copy)]
pub struct CompactionOff;

/// Whether `request` is Codex's Responses WebSocket handshake: a WebSocket upgrade of
/// `GET .../responses` with the beta header.
pub fn asked<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    request.method() == Method::GET
        && request.uri().path().ends_with("/responses")
        && headers
            .get(header::UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
        && headers
            .get_all("openai-beta")
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains(BETA)))
}

/// Whether the upstream's answer to the handshake says it does not speak the protocol:
/// it ignored the upgrade (2xx), or has no such route or method (400, 404, 405, 426,
/// 501). Refusals of the client (401, 403, 429) or failures (5xx) say nothing of that,
/// and reach the client as they are.
pub fn unspoken(status: StatusCode) -> bool {
    status.is_success() || matches!(status.as_u16(), 400 | 404 | 405 | 426 | 501)
}

/// Answers the handshake with 101 and serves the connection on a task of its own, which
/// holds the client connection's `slot` of `server.max_connections` until it ends.
pub fn bridge(
    app: &Arc<App>,
    handshake: Parts,
    client: OnUpgrade,
    slot: Arc<OwnedSemaphorePermit>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let key = handshake
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or(ProxyError::WebSocketHandshake)?;
    let accept = HeaderValue::try_from(derive_accept_key(key.as_bytes()))
        .map_err(|_| ProxyError::WebSocketHandshake)?;
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    app.metrics.websocket_bridged();
    let limit = usize::try_from(app.config.limits.max_body_bytes).unwrap_or(usize::MAX);
    let shutdown = app.shutdown.watch_switched();
    let session = Session {
        app: Arc::clone(app),
        parts: http_parts(handshake),
        conversation: Conversation::default(),
        limit,
        held: app.buffers.reservation(),
    };
    client.serve(slot, move |io| async move {
        let config = WebSocketConfig::default()
            .max_message_size(Some(limit))
            .max_frame_size(Some(limit));
        let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        session.run(ws, shutdown).await;
    });
    Ok(response)
}

/// The head each frame's `POST` goes upstream with: the handshake's path, query and
/// end-to-end headers (credentials included), without what only the WebSocket meant.
fn http_parts(handshake: Parts) -> Parts {
    let mut parts = handshake;
    let headers = &mut parts.headers;
    for name in [
        header::UPGRADE,
        header::CONNECTION,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::SEC_WEBSOCKET_EXTENSIONS,
        header::SEC_WEBSOCKET_PROTOCOL,
    ] {
        headers.remove(name);
    }
    // Other betas the client asked for still apply to its requests.
    let betas: Vec<HeaderValue> = headers
        .get_all("openai-beta")
        .iter()
        .filter(|v| !v.to_str().is_ok_and(|v| v.contains(BETA)))
        .cloned()
        .collect();
    headers.remove("openai-beta");
    for beta in betas {
        headers.append("openai-beta", beta);
    }
    own_body_headers(headers);
    parts.method = Method::POST;
    parts
}

/// One bridged connection.
struct Session {
    app: Arc<App>,
    /// The head of each upstream request.
    parts: Parts,
    conversation: Conversation,
    /// `limits.max_body_bytes`: the largest request body, and the most of an answer held
    /// while an event is incomplete.
    limit: usize,
    /// The connection's share of `limits.max_buffered_bytes`: its largest request so
    /// far, which is about the conversation it keeps until it closes.
    held: Reservation,
}

impl Session {
    /// Serves frames until the client closes, the connection fails, the client sends
    /// nothing for the upstream idle timeout between two responses, or the server shuts
    /// down.
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        mut self,
        mut ws: WebSocketStream<S>,
        mut shutdown: Watch,
    ) {
        let idle = self.app.upstream.idle_timeout();
        loop {
            let next = tokio::select! {
                // Between two responses a drain closes at once, even with a frame waiting:
                // a request not yet begun is better sent again, by the client, to a
                // server that is not going away.
                biased;
                () = shutdown.draining() => return going_away(ws).await,
                next = tokio::time::timeout(idle, ws.next()) => next,
            };
            let message = match next {
                Ok(Some(Ok(message))) => message,
                Ok(None) => return,
                Ok(Some(Err(WsError::Capacity(e)))) => {
                    tracing::debug!(error = %e, "bridged WebSocket message over the limit");
                    let reason = "message over limits.max_body_bytes";
                    let _ = ws.close(Some(close(CloseCode::Size, reason))).await;
                    // The rest of the message is unread: closing with it pending would
                    // reset the connection before the client reads the close.
                    let mut sink = tokio::io::sink();
                    let drain = tokio::io::copy(ws.get_mut(), &mut sink);
                    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                    return;
                }
                Ok(Some(Err(e))) => {
                    tracing::debug!(error = %e, "bridged WebSocket ended");
                    return;
                }
                Err(_) => {
                    let _ = ws.close(Some(close(CloseCode::Away, "idle"))).await;
                    return;
                }
            };
            let served = match message {
                Message::Text(text) => tokio::select! {
                    served = self.frame(&mut ws, text.as_str()) => served,
                    () = shutdown.closing() => return going_away(ws).await,
                },
                Message::Binary(_) => {
                    let _ = ws
                        .close(Some(close(CloseCode::Unsupported, "text frames only")))
                        .await;
                    return;
                }
                // Pings are answered by tungstenite, and a close on the next read.
                Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_) => {
                    Ok(())
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "bridged WebSocket ended");
                return;
            }
        }
    }

    /// Answers one text frame.
    async fn frame<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        ws: &mut WebSocketStream<S>,
        text: &str,
    ) -> Result<(), WsError> {
        let create = match self.conversation.read(text) {
            Ok(Frame::Create(create)) => create,
            Ok(Frame::Other(kind)) => {
                tracing::debug!(kind, "WebSocket frame needing no answer");
                return Ok(());
            }
            Err(e) => {
                let message = format!("compaction-proxy: {}", Chain(&e));
                return ws
                    .send(error_event(StatusCode::BAD_REQUEST, &message))
                    .await;
            }
        };
        if create.warmup {
            return self.warm_up(ws, create).await;
        }
        self.app.metrics.request();
        self.app.metrics.websocket_response();
        let id = self.app.next_request_id();
        let started = Instant::now();
        let response = match self.send(&create, id).await {
            Ok(response) => response,
            Err(e) => {
                tracing::warn!(id, error = %Chain(&e), "proxy error");
                e.into_response()
            }
        };
        tracing::info!(
            id,
            method = "POST",
            path = self.parts.uri.path(),
            status = response.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            websocket = true,
            "answered"
        );
        self.relay(ws, response, create.input).await
    }

    /// The frame's request through the request loop, its body counted under
    /// `limits.max_buffered_bytes` as an HTTP request's is.
    async fn send(&self, create: &Create, id: u64) -> Result<Response<ProxyBody>, ProxyError> {
        let body = create
            .body()
            .map_err(|e| ProxyError::ClientBody(Box::new(e)))?;
        let limit = self.app.config.limits.max_body_bytes;
        if body.len() as u64 > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        self.held.grow_to(body.len() as u64)?;
        let body = Bytes::from(body);
        if self.parts.extensions.get::<CompactionOff>().is_some() {
            self.app.metrics.upstream_attempt();
            let (method, uri, headers) = (&self.parts.method, &self.parts.uri, &self.parts.headers);
            let body = body::full(body);
            self.app
                .upstream
                .send(method.clone(), uri, headers, body)
                .await
        } else {
            compaction_path::handle_body(&self.app, &self.parts, body, Dialect::Responses, id).await
        }
    }

    /// Codex's warm-up (`generate: false`) asks for no output, only a response to
    /// continue: it is answered here, as nothing would come of it upstream.
    async fn warm_up<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        ws: &mut WebSocketStream<S>,
        create: Create,
    ) -> Result<(), WsError> {
        let id = format!("resp_bridge_{}", self.app.next_request_id());
        let response = serde_json::json!({"id": id, "object": "response", "status": "in_progress", "output": []});
        let mut done = response.clone();
        done["status"] = "completed".into();
        ws.feed(event("response.created", response)).await?;
        ws.send(event("response.completed", done)).await?;
        self.conversation.answered(id, create.input, Vec::new());
        Ok(())
    }

    /// Sends the answer's events as frames, remembering a completed response's output.
    async fn relay<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        ws: &mut WebSocketStream<S>,
        response: Response<ProxyBody>,
        input: Vec<Value>,
    ) -> Result<(), WsError> {
        let (parts, mut body) = response.into_parts();
        let sse = parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if !parts.status.is_success() || !sse {
            return self.whole(ws, parts.status, body, input).await;
        }
        let mut stream = Stream::default();
        loop {
            let data = match body.frame().await {
                None => break,
                Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
                Some(Err(e)) => {
                    let message = format!(
                        "compaction-proxy: the upstream's stream failed: {}",
                        Chain(&*e)
                    );
                    return ws
                        .send(error_event(StatusCode::BAD_GATEWAY, &message))
                        .await;
                }
            };
            for data in stream.push(&data) {
                ws.feed(Message::text(data)).await?;
            }
            ws.flush().await?;
            if stream.pending() > self.limit {
                let message =
                    "compaction-proxy: an upstream event is larger than limits.max_body_bytes";
                return ws.send(error_event(StatusCode::BAD_GATEWAY, message)).await;
            }
        }
        match stream.end {
            End::Completed(id) => self.conversation.answered(id, input, stream.output),
            End::Other => {}
            End::Open => {
                let message =
                    "compaction-proxy: the upstream's stream ended before response.completed";
                ws.send(error_event(StatusCode::BAD_GATEWAY, message))
                    .await?;
            }
        }
        Ok(())
    }

    /// An answer that is not a stream: an error, sent as Codex's wrapped error event with
    /// its status, or a whole response, sent as the events that would have streamed it.
    async fn whole<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        ws: &mut WebSocketStream<S>,
        status: StatusCode,
        body: ProxyBody,
        input: Vec<Value>,
    ) -> Result<(), WsError> {
        let bytes = match read_whole(body, self.limit).await {
            Ok(bytes) => bytes,
            Err(message) => {
                return ws
                    .send(error_event(StatusCode::BAD_GATEWAY, &message))
                    .await
            }
        };
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        if !status.is_success() {
            let error = match parsed {
                Some(Value::Object(mut answer)) if answer.contains_key("error") => {
                    answer.remove("error").unwrap_or_default()
                }
                _ => serde_json::json!({"message": String::from_utf8_lossy(&bytes)}),
            };
            let frame =
                serde_json::json!({"type": "error", "status": status.as_u16(), "error": error});
            return ws.send(Message::text(frame.to_string())).await;
        }
        let Some(response) = parsed.filter(|r| r["id"].is_string()) else {
            let message =
                "compaction-proxy: the upstream answered with neither a stream nor a response";
            return ws.send(error_event(StatusCode::BAD_GATEWAY, message)).await;
        };
        let output = response["output"].as_array().cloned().unwrap_or_default();
        for (index, item) in output.iter().enumerate() {
            let done = serde_json::json!({"type": "response.output_item.done", "output_index": index, "item": item});
            ws.feed(Message::text(done.to_string())).await?;
        }
        let id = response["id"].as_str().unwrap_or_default().to_owned();
        ws.send(event("response.completed", response)).await?;
        self.conversation.answered(id, input, output);
        Ok(())
    }
}

/// A body read whole, up to `limit` bytes.
async fn read_whole(mut body: ProxyBody, limit: usize) -> Result<Bytes, String> {
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            format!(
                "compaction-proxy: the upstream's answer could not be read: {}",
                Chain(&*e)
            )
        })?;
        bytes.extend_from_slice(&frame.into_data().unwrap_or_default());
        if bytes.len() > limit {
            return Err(
                "compaction-proxy: the upstream's answer is larger than limits.max_body_bytes"
                    .into(),
            );
        }
    }
    Ok(bytes.freeze())
}

/// A streamed answer, read as its bytes come: each complete event's data (a frame's
/// text), and what the conversation needs of it.
#[derive(Default)]
struct Stream {
    /// Bytes of an event not complete yet.
    buffer: BytesMut,
    /// The output items, in the order they were done.
    output: Vec<Value>,
    end: End,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum End {
    /// No terminal event yet.
    #[default]
    Open,
    /// `response.completed`, with the response's id.
    Completed(String),
    /// `response.failed`, `response.incomplete` or `error`: nothing to continue.
    Other,
}

impl Stream {
    /// The data of each event `bytes` completes, in order.
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut complete = Vec::new();
        while let Some((event, used)) = next_event(&self.buffer) {
            let _ = self.buffer.split_to(used);
            if event.data.is_empty() || event.data == "[DONE]" {
                continue;
            }
            self.observe(&event.data);
            complete.push(event.data);
        }
        complete
    }

    /// Bytes held of an event not complete yet.
    fn pending(&self) -> usize {
        self.buffer.len()
    }

    fn observe(&mut self, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match event["type"].as_str() {
            Some("response.output_item.done") => self.output.push(event["item"].clone()),
            Some("response.completed") => {
                let id = event["response"]["id"].as_str().unwrap_or_default();
                self.end = End::Completed(id.to_owned());
            }
            Some("response.failed" | "response.incomplete" | "error") => self.end = End::Other,
            _ => {}
        }
    }
}

/// A Responses stream event of type `kind` about `response`.
fn event(kind: &str, response: Value) -> Message {
    Message::text(serde_json::json!({"type": kind, "response": response}).to_string())
}

/// Codex's wrapped error event: it reads `status` as the HTTP status the request would
/// have had, and the whole frame as that answer's body.
fn error_event(status: StatusCode, message: &str) -> Message {
    let frame = serde_json::json!({"type": "error", "status": status.as_u16(),
        "error": {"message": message, "type": "proxy_error", "code": null}});
    Message::text(frame.to_string())
}

/// Closes the connection for the server's shutdown, and waits a moment for the client's
/// close in answer, so that neither side's close meets a reset.
async fn going_away<S: AsyncRead + AsyncWrite + Unpin>(mut ws: WebSocketStream<S>) {
    if ws
        .close(Some(close(CloseCode::Away, "going away")))
        .await
        .is_err()
    {
        return;
    }
    let answered = async { while let Some(Ok(_)) = ws.next().await {} };
    let _ = tokio::time::timeout(Duration::from_millis(500), answered).await;
}

fn close(code: CloseCode, reason: &'static str) -> CloseFrame {
    CloseFrame {
        code,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = concat!(
        "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\"}}\r\n\r\n",
        ": a comment\n\n",
        "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"n\":1}}\n\n",
        "data: {\"type\":\"response.output_text.delta\",\n",
        "data: \"delta\":\"a\"}\n\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r1\"}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn events_and_the_response_survive_any_split_of_the_stream() {
        let whole = {
            let mut stream = Stream::default();
            let frames = stream.push(ANSWER.as_bytes());
            assert_eq!(frames.len(), 4, "{frames:?}");
            assert_eq!(
                frames[2],
                "{\"type\":\"response.output_text.delta\",\n\"delta\":\"a\"}"
            );
            assert_eq!(stream.end, End::Completed("r1".into()));
            assert_eq!(stream.output, vec![serde_json::json!({"n": 1})]);
            frames
        };
        let bytes = ANSWER.as_bytes();
        for at in 0..bytes.len() {
            for end in at..bytes.len() {
                let mut stream = Stream::default();
                let mut frames = stream.push(&bytes[..at]);
                frames.extend(stream.push(&bytes[at..end]));
                frames.extend(stream.push(&bytes[end..]));
                assert_eq!(frames, whole, "split at {at} and {end}");
                assert_eq!(stream.pending(), 0);
                assert_eq!(stream.end, End::Completed("r1".into()));
            }
        }
    }

    #[test]
    fn codex_s_handshake_is_told_from_other_upgrades() {
        let handshake = |method: Method, path: &str, beta: Option<&str>| {
            let mut request = Request::builder()
                .method(method)
                .uri(path)
                .header("connection", "Upgrade")
                .header("upgrade", "WebSocket");
            if let Some(beta) = beta {
                request = request.header("openai-beta", beta);
            }
            request.body(()).unwrap()
        };
        let beta = Some("assistants=v2, responses_websockets=2026-02-06");
        assert!(asked(&handshake(Method::GET, "/v1/responses", beta)));
        assert!(asked(&handshake(
            Method::GET,
            "/openai/v1/responses?x=1",
            beta
        )));
        assert!(!asked(&handshake(Method::GET, "/v1/responses", None)));
        assert!(!asked(&handshake(
            Method::GET,
            "/v1/chat/completions",
            beta
        )));
        assert!(!asked(&handshake(Method::POST, "/v1/responses", beta)));
    }

    #[test]
    fn only_refusals_of_the_route_say_the_protocol_is_missing() {
        for status in [200, 400, 404, 405, 426, 501] {
            assert!(unspoken(StatusCode::from_u16(status).unwrap()), "{status}");
        }
        for status in [401, 403, 429, 500, 502, 503] {
            assert!(!unspoken(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }

    #[test]
    fn the_upstream_request_keeps_the_client_s_headers_but_the_websocket_s() {
        let handshake = Request::builder()
            .uri("/v1/responses?x=1")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("sec-websocket-version", "13")
            .header("authorization", "Bearer sk")
            .header("openai-beta", "responses_websockets=2026-02-06")
            .header("openai-beta", "other=1")
            .header("session-id", "s1")
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap();
        let parts = http_parts(handshake.into_parts().0);
        assert_eq!(parts.method, Method::POST);
        assert_eq!(parts.uri, "/v1/responses?x=1");
        let mut names: Vec<&str> = parts.headers.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        let kept = [
            "accept",
            "authorization",
            "content-type",
            "openai-beta",
            "session-id",
        ];
        assert_eq!(names, kept);
        assert_eq!(parts.headers["openai-beta"], "other=1");
    }

    #[test]
    fn a_failed_response_is_not_continued() {
        let mut stream = Stream::default();
        stream.push(b"data: {\"type\":\"response.failed\",\"response\":{\"id\":\"r1\"}}\n\n");
        assert_eq!(stream.end, End::Other);
    }
}
