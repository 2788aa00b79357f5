//! Protocol upgrades (a WebSocket's handshake, on any route): the request goes to the
//! upstream with its `Upgrade` header; a 101 goes back to the client, and from then on
//! the two connections are relayed byte for byte both ways, unread, until both sides
//! have closed, neither has sent a byte for the upstream idle timeout, or the server's
//! shutdown grace period is over (each side is then closed cleanly). Any other
//! answer (a refusal) is the client's as the upstream sent it, but for Codex's Responses
//! WebSocket refused by an upstream that does not speak it: that one the proxy answers
//! itself and bridges onto the compaction path (see [`crate::codex_ws`] and
//! `upstream.responses_websocket`).

use std::future::Future;
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
use crate::server::http1::head::asks_upgrade;
use crate::server::http1::request_body::RequestBody;
use crate::server::http1::upgrade::OnUpgrade;
use crate::upstream::Upgrade;

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
    let mut shutdown = app.shutdown.watch_switched();
    client.serve(slot, move |client| async move {
        match relay(client, tunnel, idle, shutdown.closing()).await {
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

/// Copies bytes both ways until both sides have closed (each close is passed on as a
/// shutdown of the other side's writing), neither sends anything for `idle`, or `closing`
/// completes: both sides are then shut down for writing, so each reads the end of the
/// stream rather than a reset when the process exits. Returns the bytes sent upstream
/// and down.
async fn relay<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    closing: impl Future<Output = ()>,
) -> Result<(u64, u64), RelayError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    let mut client = Watched {
        io: client,
        activity: &activity,
    };
    let mut upstream = Watched {
        io: upstream,
        activity: &activity,
    };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            return copied.map_err(RelayError::Io);
        }
        () = activity.silent_for(idle) => return Err(RelayError::Idle(idle)),
        () = closing => {}
    }
    // A peer that stopped reading must not hold the exit: the shutdown is best effort.
    let both = async { tokio::join!(client.shutdown(), upstream.shutdown()) };
    let _ = tokio::time::timeout(CLOSE_WAIT, both).await;
    Err(RelayError::ShuttingDown)
}

/// How long each side of a relay closed at shutdown gets to take the close.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

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

/// One side of a relay, noting each read that brought bytes.
struct Watched<'a, T> {
    io: T,
    activity: &'a Activity,
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
        Pin::new(&mut self.io).poll_write(cx, data)
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
    use http::{header, Version};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    #[tokio::test]
    async fn bytes_pass_both_ways_and_each_close_is_passed_on() {
        let (client, mut client_end) = tokio::io::duplex(64);
        let (upstream, mut upstream_end) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay(
            client,
            upstream,
            Duration::from_secs(5),
            std::future::pending(),
        ));
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
        let (client, mut client_end) = tokio::io::duplex(64);
        let (upstream, mut upstream_end) = tokio::io::duplex(64);
        let (close, closing) = tokio::sync::oneshot::channel::<()>();
        let closing = async {
            let _ = closing.await;
        };
        let relay = tokio::spawn(relay(client, upstream, Duration::from_secs(5), closing));
        client_end.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        upstream_end.read_exact(&mut buf).await.unwrap();
        close.send(()).unwrap();
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
        let (client, mut client_end) = tokio::io::duplex(64);
        let (upstream, _upstream_end) = tokio::io::duplex(64);
        let began = Instant::now();
        let relay = tokio::spawn(relay(
            client,
            upstream,
            Duration::from_secs(5),
            std::future::pending(),
        ));
        // Traffic one way keeps it open past the timeout.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            client_end.write_all(b"x").await.unwrap();
        }
        let ended = relay.await.unwrap();
        assert!(matches!(ended, Err(RelayError::Idle(_))), "{ended:?}");
        assert_eq!(began.elapsed(), Duration::from_secs(9 + 5));
    }
}
