//! Protocol upgrades (a WebSocket's handshake, on any route): the request goes to the
//! upstream with its `Upgrade` header; a 101 goes back to the client, and from then on
//! the two connections are relayed byte for byte both ways, unchanged, until both sides
//! have closed or neither has sent a byte for the upstream idle timeout. At shutdown a
//! WebSocket is closed between two messages with a close frame (1001, going away) to
//! each side (see [`Gate`]): a Responses WebSocket as soon as no response is in flight,
//! any other when the grace period is over; at the end of the grace period whatever is
//! still open is shut down for writing on both sides. Any other
//! answer (a refusal) is the client's as the upstream sent it, but for Codex's Responses
//! WebSocket refused by an upstream that does not speak it: that one the proxy answers
//! itself and bridges onto the compaction path (see [`crate::codex_ws`] and
//! `upstream.responses_websocket`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::app::App;
use crate::body::{self, ProxyBody};
use crate::codex_ws;
use crate::config::ResponsesWebsocket;
use crate::error::ProxyError;
use crate::limits::ClientBody;
use crate::server::head::asks_upgrade;
use crate::server::upgrade::OnUpgrade;
use crate::server::RequestBody;
use crate::shutdown::Watch;
use crate::upstream::Upgrade;

mod frames;

use frames::{Finished, Frames};

/// Whether `request` asks to switch protocols: HTTP/1.1 (the only version with
/// upgrades), an `Upgrade` header, and `upgrade` among the `Connection` options.
pub fn asked<B>(request: &Request<B>) -> bool {
    asks_upgrade(request.version(), request.headers())
}

/// Sends the handshake upstream and answers the client with what came back. On a 101,
/// the relay runs on a task of its own, holding the client connection's `slot` of
/// `server.max_connections` until it ends: a switched connection counts as any other.
pub async fn forward(
    app: &Arc<App>,
    mut request: Request<ClientBody<RequestBody>>,
    slot: Arc<OwnedSemaphorePermit>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let client = request
        .extensions_mut()
        .remove::<OnUpgrade>()
        .ok_or(ProxyError::WebSocketHandshake)?;
    let bridged = codex_ws::asked(&request).then_some(app.config.upstream.responses_websocket);
    let known_missing = app.responses_websocket_missing.load(Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    match bridged {
        Some(ResponsesWebsocket::Bridge) => return codex_ws::bridge(app, parts, client, slot),
        Some(ResponsesWebsocket::Auto) if known_missing => {
            return codex_ws::bridge(app, parts, client, slot)
        }
        _ => {}
    }
    let body = body.map_err(Into::into).boxed_unsync();
    app.metrics.upstream_attempt();
    let answer = app
        .upstream
        .upgrade(parts.method.clone(), &parts.uri, &parts.headers, body)
        .await?;
    let (head, tunnel) = match answer {
        Upgrade::Refused(response)
            if bridged == Some(ResponsesWebsocket::Auto)
                && codex_ws::unspoken(response.status()) =>
        {
            tracing::info!(
                status = response.status().as_u16(),
                "the upstream does not speak the Responses WebSocket: the proxy bridges it from now on"
            );
            app.responses_websocket_missing
                .store(true, Ordering::Relaxed);
            return codex_ws::bridge(app, parts, client, slot);
        }
        Upgrade::Refused(response) => return Ok(response),
        Upgrade::Switched(head, tunnel) => (head, tunnel),
    };
    app.metrics.upgrade();
    let idle = app.upstream.idle_timeout();
    let shutdown = app.shutdown.watch_switched();
    let kind = if bridged.is_some() {
        Relayed::ResponsesWebSocket
    } else if is_websocket(&parts.headers) {
        Relayed::WebSocket
    } else {
        Relayed::Bytes
    };
    client.serve(slot, move |client| async move {
        match relay(client, tunnel, idle, shutdown, kind).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(e) => tracing::debug!(error = %e, "upgraded connection ended"),
        }
    });
    Ok(head.map(|()| body::empty()))
}

/// Why a relay ended other than by both sides closing.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("no byte either way for {} s", .0.as_secs_f64())]
    Idle(Duration),
    #[error("a connection failed")]
    Io(#[source] io::Error),
    #[error("the server's shutdown grace period is over")]
    ShuttingDown,
}

/// What a relay carries, as far as its shutdown goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relayed {
    /// Another protocol: its bytes are not read.
    Bytes,
    /// A WebSocket: closed between two messages at the end of the grace period.
    WebSocket,
    /// Codex's Responses WebSocket: closed as soon as no response is in flight.
    ResponsesWebSocket,
}

fn is_websocket(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// Copies bytes both ways until both sides have closed (each close is passed on as a
/// shutdown of the other side's writing) or neither sends anything for `idle`. At
/// shutdown a WebSocket is closed by the [`Gate`]; at the end of the grace period,
/// whatever is still open (another protocol, a message still being sent) is shut down
/// for writing on both sides, so each reads the end of the stream rather than a reset
/// when the process exits. Returns the bytes sent upstream and down.
async fn relay<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    mut shutdown: Watch,
    kind: Relayed,
) -> Result<(u64, u64), RelayError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    let gate = (kind != Relayed::Bytes).then(|| Gate::new(kind));
    let mut client = Watched {
        io: client,
        activity: &activity,
        gate: gate.as_ref().map(|g| (g, Toward::Client)),
    };
    let mut upstream = Watched {
        io: upstream,
        activity: &activity,
        gate: gate.as_ref().map(|g| (g, Toward::Upstream)),
    };
    let ended = {
        let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
        tokio::pin!(copy);
        let mut phase = Phase::Serving;
        let cut = tokio::time::sleep(Duration::MAX);
        tokio::pin!(cut);
        loop {
            tokio::select! {
                copied = &mut copy => return copied.map_err(RelayError::Io),
                () = activity.silent_for(idle) => return Err(RelayError::Idle(idle)),
                () = next_phase(&mut shutdown, phase), if phase != Phase::Closing => {
                    phase = if phase == Phase::Serving { Phase::Draining } else { Phase::Closing };
                    if let Some(gate) = &gate {
                        gate.enter(phase);
                    }
                    if phase == Phase::Closing {
                        if gate.is_none() {
                            break Ended::Cut;
                        }
                        // A WebSocket in the middle of a message gets a moment to reach
                        // its end, then is cut as any other protocol.
                        cut.as_mut().reset(Instant::now() + CLOSE_WAIT);
                    }
                }
                () = &mut cut => break Ended::Cut,
                () = decided(gate.as_ref()) => break Ended::BetweenMessages,
            }
        }
    };
    if ended == Ended::BetweenMessages {
        say_going_away(&mut client.io, &mut upstream.io).await;
    }
    // A peer that stopped reading must not hold the exit: the shutdown is best effort.
    let both = async { tokio::join!(client.io.shutdown(), upstream.io.shutdown()) };
    let _ = tokio::time::timeout(CLOSE_WAIT, both).await;
    Err(RelayError::ShuttingDown)
}

/// How long each side of a relay closed at shutdown gets to take the close.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// How a relay ended at shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// A WebSocket between two messages: each side is sent a close frame.
    BetweenMessages,
    /// Anything else, at the end of the grace period.
    Cut,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Serving,
    Draining,
    Closing,
}

/// The side a relayed byte is written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Toward {
    Client,
    Upstream,
}

/// Decides when a relayed WebSocket may be closed at shutdown, from what each direction
/// has carried: both directions between two messages, no close frame passed already, and
/// either the grace period over or (a Responses WebSocket draining) every
/// `response.create` answered by its last event. Once decided, nothing more is written
/// to either side but the relay's own close frames.
struct Gate {
    kind: Relayed,
    state: std::sync::Mutex<GateState>,
    decided: tokio::sync::Notify,
}

#[derive(Clone)]
struct GateState {
    phase: Phase,
    toward_upstream: Frames,
    toward_client: Frames,
    /// Responses asked for and not yet ended.
    in_flight: u32,
    /// A message the relay could not read passed: it cannot tell what is in flight.
    opaque: bool,
    /// A close frame passed: the peers close the connection themselves.
    closing_by_peers: bool,
    decided: bool,
}

/// The last event of a Responses API response, of each way it ends.
const RESPONSE_ENDS: [&str; 4] = [
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
];

impl GateState {
    fn new() -> GateState {
        GateState {
            phase: Phase::Serving,
            toward_upstream: Frames::default(),
            toward_client: Frames::default(),
            in_flight: 0,
            opaque: false,
            closing_by_peers: false,
            decided: false,
        }
    }

    fn frames(&mut self, toward: Toward) -> &mut Frames {
        match toward {
            Toward::Client => &mut self.toward_client,
            Toward::Upstream => &mut self.toward_upstream,
        }
    }

    fn note(&mut self, toward: Toward, finished: Finished) {
        match (toward, finished) {
            (_, Finished::Close) => self.closing_by_peers = true,
            (_, Finished::Opaque) => self.opaque = true,
            (Toward::Upstream, Finished::Typed(t)) if t == "response.create" => {
                self.in_flight += 1;
            }
            (Toward::Client, Finished::Typed(t)) if RESPONSE_ENDS.contains(&t.as_str()) => {
                self.in_flight = self.in_flight.saturating_sub(1);
            }
            _ => {}
        }
    }

    fn may_close(&self, kind: Relayed) -> bool {
        let quiet = !self.closing_by_peers
            && self.toward_upstream.between_messages()
            && self.toward_client.between_messages();
        let answered = kind == Relayed::ResponsesWebSocket && self.in_flight == 0 && !self.opaque;
        quiet
            && match self.phase {
                Phase::Serving => false,
                Phase::Draining => answered,
                Phase::Closing => true,
            }
    }

    /// Reads `data`, about to be written `toward` a side, up to where the relay may close
    /// (if it may before its end); returns how much of it to write.
    fn read(&mut self, kind: Relayed, toward: Toward, data: &[u8]) -> usize {
        let mut used = 0;
        while used < data.len() {
            let (n, finished) = self.frames(toward).read(&data[used..]);
            used += n;
            if let Some(finished) = finished {
                self.note(toward, finished);
                if self.may_close(kind) {
                    self.decided = true;
                    break;
                }
            }
        }
        used
    }
}

impl Gate {
    fn new(kind: Relayed) -> Gate {
        Gate {
            kind,
            state: std::sync::Mutex::new(GateState::new()),
            decided: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enter(&self, phase: Phase) {
        let mut state = self.lock();
        state.phase = phase;
        if state.may_close(self.kind) {
            state.decided = true;
            self.decided.notify_one();
        }
    }

    /// How much of `data` may be written `toward` a side: all of it, or the part up to
    /// where the relay closes; none once it has decided to.
    fn writable(&self, toward: Toward, data: &[u8]) -> usize {
        let state = self.lock();
        if state.decided {
            return 0;
        }
        if state.phase == Phase::Serving {
            // No close is decided while serving: every byte passes, and the trial read
            // (a copy of the state per write) is spared until the server shuts down.
            return data.len();
        }
        let mut trial = state.clone();
        drop(state);
        trial.read(self.kind, toward, data)
    }

    /// `data` was written `toward` a side.
    fn written(&self, toward: Toward, data: &[u8]) {
        let mut state = self.lock();
        state.read(self.kind, toward, data);
        if state.decided {
            self.decided.notify_one();
        }
    }
}

/// Completes once the server's shutdown has passed `phase`.
async fn next_phase(shutdown: &mut Watch, phase: Phase) {
    match phase {
        Phase::Serving => shutdown.draining().await,
        Phase::Draining | Phase::Closing => shutdown.closing().await,
    }
}

/// Completes once `gate` has decided to close; never without one.
async fn decided(gate: Option<&Gate>) {
    match gate {
        Some(gate) => loop {
            if gate.lock().decided {
                return;
            }
            gate.decided.notified().await;
        },
        None => std::future::pending().await,
    }
}

/// Sends each side a close frame (1001, going away) and waits a moment for their own
/// close in answer, so that neither side's close meets a reset.
async fn say_going_away<C, U>(client: &mut C, upstream: &mut U)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut key = [0x5A; 4];
    // A fixed key would do no harm here (the payload is ours), but RFC 6455 asks for an
    // unpredictable one.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key);
    let sent = async {
        let (to_client, to_upstream) =
            (frames::server_going_away(), frames::client_going_away(key));
        let _ = tokio::join!(
            client.write_all(&to_client),
            upstream.write_all(&to_upstream)
        );
        let _ = tokio::join!(client.flush(), upstream.flush());
        tokio::join!(read_to_end(client), read_to_end(upstream));
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, sent).await;
}

/// Reads and drops what a side still sends until it closes.
async fn read_to_end<T: AsyncRead + Unpin>(io: &mut T) {
    let _ = tokio::io::copy(io, &mut tokio::io::sink()).await;
}

/// When either side last sent a byte, as milliseconds since the relay began. A read only
/// stores the time; the one timer moves only when it fires early, as in the body's
/// idle timeout, so busy relays do not touch tokio's timer wheel per read.
struct Activity {
    began: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            began: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing has been read for `idle`.
    async fn silent_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = self.began + last + idle;
            if deadline <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One side of a relay, noting each read that brought bytes and, for a WebSocket, what
/// is written to it.
struct Watched<'a, T> {
    io: T,
    activity: &'a Activity,
    gate: Option<(&'a Gate, Toward)>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let Some((gate, toward)) = self.gate else {
            return Pin::new(&mut self.io).poll_write(cx, data);
        };
        let writable = gate.writable(toward, data);
        if writable == 0 && !data.is_empty() {
            // Past the point where the relay closes: the bytes are dropped, as the
            // connection is closed before they could be answered.
            return Poll::Ready(Ok(data.len()));
        }
        let wrote = Pin::new(&mut self.io).poll_write(cx, &data[..writable]);
        if let Poll::Ready(Ok(n)) = wrote {
            gate.written(toward, &data[..n]);
        }
        wrote
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown::Shutdown;
    use futures_util::{SinkExt, StreamExt};
    use http::{header, Version};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::WebSocketStream;

    fn request(version: Version, connection: &str, upgrade: Option<&str>) -> Request<()> {
        let mut builder = Request::builder()
            .version(version)
            .header(header::CONNECTION, connection);
        if let Some(upgrade) = upgrade {
            builder = builder.header(header::UPGRADE, upgrade);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn an_upgrade_is_asked_with_both_headers_on_http_1_1() {
        assert!(asked(&request(
            Version::HTTP_11,
            "keep-alive, Upgrade",
            Some("websocket")
        )));
        assert!(!asked(&request(
            Version::HTTP_11,
            "keep-alive",
            Some("websocket")
        )));
        assert!(!asked(&request(Version::HTTP_11, "upgrade", None)));
        assert!(!asked(&request(
            Version::HTTP_10,
            "upgrade",
            Some("websocket")
        )));
    }

    type Relay = tokio::task::JoinHandle<Result<(u64, u64), RelayError>>;

    /// A relay of another protocol between two in-memory ends, with the server's shutdown
    /// to drive: the client's end, the upstream's end, the shutdown and the relay's task.
    fn byte_relay() -> (DuplexStream, DuplexStream, Shutdown, Relay) {
        let (client, client_end) = tokio::io::duplex(64);
        let (upstream, upstream_end) = tokio::io::duplex(64);
        let shutdown = Shutdown::default();
        let watch = shutdown.watch_switched();
        let idle = Duration::from_secs(5);
        let relay = tokio::spawn(relay(client, upstream, idle, watch, Relayed::Bytes));
        (client_end, upstream_end, shutdown, relay)
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_and_each_close_is_passed_on() {
        let (mut client_end, mut upstream_end, _shutdown, relay) = byte_relay();
        client_end.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        upstream_end.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        upstream_end.write_all(b"pong").await.unwrap();
        upstream_end.shutdown().await.unwrap();
        let mut rest = Vec::new();
        client_end.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"pong");
        client_end.shutdown().await.unwrap();
        assert_eq!(relay.await.unwrap().unwrap(), (4, 4));
    }

    #[tokio::test]
    async fn a_relay_ends_when_told_the_server_is_closing() {
        let (mut client_end, mut upstream_end, shutdown, relay) = byte_relay();
        client_end.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        upstream_end.read_exact(&mut buf).await.unwrap();
        // Draining leaves a relay of another protocol alone; the grace's end closes it.
        shutdown.drain();
        client_end.write_all(b"pong").await.unwrap();
        upstream_end.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        shutdown.close();
        let ended = relay.await.unwrap();
        assert!(matches!(ended, Err(RelayError::ShuttingDown)), "{ended:?}");
        // Each side reads the end of its stream.
        let mut rest = Vec::new();
        client_end.read_to_end(&mut rest).await.unwrap();
        upstream_end.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_relay_silent_both_ways_ends_after_the_idle_timeout() {
        let began = Instant::now();
        let (mut client_end, _upstream_end, _shutdown, relay) = byte_relay();
        // Traffic one way keeps it open past the timeout.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            client_end.write_all(b"x").await.unwrap();
        }
        let ended = relay.await.unwrap();
        assert!(matches!(ended, Err(RelayError::Idle(_))), "{ended:?}");
        assert_eq!(began.elapsed(), Duration::from_secs(9 + 5));
    }

    /// A client and an upstream speaking WebSocket to each other through a relay of
    /// `kind`, with the server's shutdown to drive.
    struct WsRelay {
        client: Side,
        upstream: Side,
        shutdown: Shutdown,
        relay: tokio::task::JoinHandle<Result<(u64, u64), RelayError>>,
    }

    async fn ws_relay(kind: Relayed) -> WsRelay {
        let (client, client_end) = tokio::io::duplex(1 << 16);
        let (upstream, upstream_end) = tokio::io::duplex(1 << 16);
        let shutdown = Shutdown::default();
        let watch = shutdown.watch_switched();
        let relay = tokio::spawn(relay(
            client,
            upstream,
            Duration::from_secs(30),
            watch,
            kind,
        ));
        WsRelay {
            client: WebSocketStream::from_raw_socket(client_end, Role::Client, None).await,
            upstream: WebSocketStream::from_raw_socket(upstream_end, Role::Server, None).await,
            shutdown,
            relay,
        }
    }

    fn event(kind: &str) -> Message {
        Message::text(format!("{{\"type\":\"{kind}\",\"sequence_number\":1}}"))
    }

    /// The next frame a side reads, with close frames answered as tungstenite does.
    async fn next(ws: &mut Side) -> Message {
        tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("nothing read in 5 s")
            .expect("the stream ended")
            .expect("a WebSocket error")
    }

    fn going_away(message: &Message) -> bool {
        matches!(message, Message::Close(Some(frame)) if frame.code == CloseCode::Away)
    }

    type Side = WebSocketStream<tokio::io::DuplexStream>;

    /// `message` sent by one side reaches the other as it was.
    async fn passes(from: &mut Side, to: &mut Side, message: Message) {
        from.send(message.clone()).await.unwrap();
        assert_eq!(next(to).await, message);
    }

    async fn both_told_going_away(ws: &mut WsRelay) {
        let to_client = next(&mut ws.client).await;
        assert!(going_away(&to_client), "{to_client:?}");
        let to_upstream = next(&mut ws.upstream).await;
        assert!(going_away(&to_upstream), "{to_upstream:?}");
    }

    #[tokio::test]
    async fn a_responses_websocket_finishes_its_response_then_both_sides_are_told_going_away() {
        let mut ws = ws_relay(Relayed::ResponsesWebSocket).await;
        passes(&mut ws.client, &mut ws.upstream, event("response.create")).await;
        ws.shutdown.drain();
        // The response in flight reaches the client whole.
        for kind in [
            "response.created",
            "response.output_text.delta",
            "response.completed",
        ] {
            passes(&mut ws.upstream, &mut ws.client, event(kind)).await;
        }
        both_told_going_away(&mut ws).await;
        let ended = ws.relay.await.unwrap();
        assert!(matches!(ended, Err(RelayError::ShuttingDown)), "{ended:?}");
    }

    #[tokio::test]
    async fn a_responses_websocket_between_responses_closes_as_soon_as_the_server_drains() {
        let mut ws = ws_relay(Relayed::ResponsesWebSocket).await;
        passes(&mut ws.client, &mut ws.upstream, event("response.create")).await;
        passes(&mut ws.upstream, &mut ws.client, event("response.failed")).await;
        ws.shutdown.drain();
        both_told_going_away(&mut ws).await;
    }

    #[tokio::test]
    async fn another_websocket_goes_on_while_draining_and_is_told_going_away_at_the_grace_end() {
        let mut ws = ws_relay(Relayed::WebSocket).await;
        ws.shutdown.drain();
        passes(
            &mut ws.client,
            &mut ws.upstream,
            Message::text("still there"),
        )
        .await;
        passes(&mut ws.upstream, &mut ws.client, Message::text("yes")).await;
        ws.shutdown.close();
        both_told_going_away(&mut ws).await;
    }

    #[tokio::test]
    async fn a_close_begun_by_a_peer_is_left_to_the_peers() {
        let mut ws = ws_relay(Relayed::ResponsesWebSocket).await;
        ws.client.close(None).await.unwrap();
        assert!(matches!(next(&mut ws.upstream).await, Message::Close(None)));
        ws.shutdown.drain();
        // The upstream's answer to the close is the only close the client reads.
        ws.upstream.flush().await.unwrap();
        let answer = next(&mut ws.client).await;
        assert!(matches!(answer, Message::Close(None)), "{answer:?}");
    }
}
