//! Keep-alive connections to one upstream, and HTTP/1.1 exchanges on them.
//!
//! The proxy speaks HTTP/1.1 to the upstream itself (the bytes are in [`crate::http1`])
//! rather than through hyper's client, whose connection runs as a task of its own and
//! talks to each request through channels. Here the request's own task writes the
//! request, reads the response head, and then, from inside the response body the server
//! streams to the client, reads the rest. A proxied exchange is one task from the
//! client's socket to the upstream's and back, and when the client goes away, dropping
//! that task drops the upstream exchange with it.
//!
//! The pool keeps idle connections and a request takes the most recently used one (its
//! socket is the likeliest to still be open), else dials. Before reuse, a connection is
//! checked for a close the upstream sent while it sat idle; one that is closed is dropped
//! and the next is tried, so the request itself is never sent on it. The upstream can
//! still close it as the request goes out (its idle timer fired meanwhile): a reused
//! connection that fails before any byte of an answer is retried once on a new
//! connection, when the request can be sent again whole, as Pingora does. The connection
//! goes back to the pool the moment its response body ends, from inside the body. Idle
//! connections are bounded in number and age, checked whenever the pool is used rather
//! than by a reaper task.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower_service::Service;

use crate::body::{ProxyBody, Replay};
use crate::cause::{BoxError, Chain};
use crate::http1::{self, BodyDecoder, Decoded, RequestFraming, ResponseHead};

/// Idle connections kept at most; more are closed when they fall idle. Well above the
/// concurrency one proxy sees from its clients, so a busy proxy does not re-dial.
const MAX_IDLE: usize = 512;
/// Body frames up to this size are copied behind the head (or the chunk header), so a
/// small request goes out in one write; larger ones are written from their own buffer.
const COPY_LIMIT: usize = 16 * 1024;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 16 * 1024;

type Io = TokioIo<<HttpsConnector<HttpConnector> as Service<Uri>>::Response>;

pub struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// Scheme and authority of the upstream: what the connector dials.
    origin: Uri,
    /// Idle connections, the most recently used last.
    idle: Mutex<Vec<Idle>>,
    /// An idle connection older than this is closed rather than reused: the upstream may
    /// have closed it already (uvicorn and Node close after 5 s), and a request sent on
    /// a connection as it closes fails.
    idle_timeout: Duration,
    /// Requests sent again on a new connection after a reused one failed before
    /// answering: how often the upstream closes idle connections under the proxy.
    stale_retries: AtomicU64,
}

/// Why an exchange failed before the response head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The client's request body failed (cut off, malformed) before the upstream answered.
    #[error("the client's request body failed")]
    Client(#[source] BoxError),
    /// The upstream could not be reached, closed the connection, or sent something other
    /// than an HTTP/1.1 answer.
    #[error("the upstream failed before answering")]
    Upstream(#[source] BoxError),
}

/// The upstream switched protocols before it had the whole request.
#[derive(Debug, thiserror::Error)]
#[error("the upstream switched protocols before the request body was sent")]
struct SwitchedEarly;

/// What the upstream answered a request to switch protocols.
pub enum Answer {
    /// 101: its head, and the connection, which now carries the new protocol.
    Switched(ResponseHead, Tunnel),
    /// Any other answer, with its body to read as usual.
    Other(Response<PooledBody>),
}

/// A connection the upstream switched to another protocol (a WebSocket's), taken out of
/// the pool for good: bytes both ways, the first read being those that came behind the
/// 101's head.
pub struct Tunnel {
    conn: Box<Conn>,
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let conn = &mut *self.conn;
        if conn.buf.is_empty() {
            return Pin::new(&mut conn.io).poll_read(cx, out);
        }
        let n = conn.buf.len().min(out.remaining());
        out.put_slice(&conn.buf.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn.io).poll_shutdown(cx)
    }
}

/// The upstream closed the connection without a byte of an answer (and writing the
/// request did not fail, or that error would be the cause).
#[derive(Debug, thiserror::Error)]
#[error("the upstream closed the connection before answering")]
struct ClosedBeforeAnswer;

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// One connection to the upstream, and what has been read from it but not yet used.
/// Always boxed: a TLS stream's state is large, and a connection moves between the pool,
/// the exchange and the body on every request.
struct Conn {
    io: Io,
    buf: BytesMut,
}

impl Conn {
    /// Reads what the socket has into `buf`; `Ready(Ok(0))` is the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// Whether an idle connection can carry a request: nothing has arrived on it, not even
    /// the upstream's close.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        Poll::Ready(self.poll_fill(cx).is_pending())
    }
}

impl Pool {
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        origin: Uri,
        idle_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            connector,
            origin,
            idle: Mutex::new(Vec::new()),
            idle_timeout,
            stale_retries: AtomicU64::new(0),
        })
    }

    /// Sends a request whose line and headers are in `head` (`Host` among them, the
    /// framing header and blank line still to come) on an idle connection, else on a new
    /// one, and returns the response once its head has arrived. Its body reads the rest
    /// and hands the connection back when it ends.
    pub async fn send(
        self: &Arc<Self>,
        method: &Method,
        head: Vec<u8>,
        framing: RequestFraming,
        body: ProxyBody,
    ) -> Result<Response<PooledBody>, SendError> {
        let (exchange, head) = self.exchange(method, head, framing, body, false).await?;
        Ok(self.response(exchange, head))
    }

    /// Sends a request that asks to switch protocols (its head carries `Upgrade` and
    /// `Connection: upgrade`). On a 101 the connection leaves the pool for good, as the
    /// [`Tunnel`] the new protocol runs over; any other answer is an ordinary response.
    pub async fn upgrade(
        self: &Arc<Self>,
        method: &Method,
        head: Vec<u8>,
        framing: RequestFraming,
        body: ProxyBody,
    ) -> Result<Answer, SendError> {
        let (exchange, head) = self.exchange(method, head, framing, body, true).await?;
        if head.status != StatusCode::SWITCHING_PROTOCOLS {
            return Ok(Answer::Other(self.response(exchange, head)));
        }
        // The rest of the request body would go out as the new protocol's bytes.
        if exchange.sending {
            return Err(SendError::Upstream(SwitchedEarly.into()));
        }
        Ok(Answer::Switched(
            head,
            Tunnel {
                conn: exchange.conn,
            },
        ))
    }

    /// Writes the request on an idle connection, else on a new one, and reads the
    /// response head.
    async fn exchange(
        self: &Arc<Self>,
        method: &Method,
        mut head: Vec<u8>,
        framing: RequestFraming,
        body: ProxyBody,
        upgrade: bool,
    ) -> Result<(Exchange, ResponseHead), SendError> {
        http1::end_head(&mut head, framing);
        let chunked = framing == RequestFraming::Chunked;
        let Some(conn) = self.checkout().await else {
            let conn = self.connect().await?;
            let writer = Writer::new(head, body, chunked, false);
            let mut exchange = Exchange::new(conn, writer, upgrade);
            let head = poll_fn(|cx| exchange.poll_head(cx, method)).await?;
            return Ok((exchange, head));
        };
        // Kept only for a reused connection, the one kind that is retried.
        let again = head.clone();
        let mut exchange = Exchange::new(conn, Writer::new(head, body, chunked, true), upgrade);
        let failed = match poll_fn(|cx| exchange.poll_head(cx, method)).await {
            Ok(head) => return Ok((exchange, head)),
            Err(e) => e,
        };
        let replay = match (&failed, exchange.answered) {
            (SendError::Upstream(_), false) => exchange.writer.into_replay(),
            _ => None,
        };
        let Some(body) = replay else {
            return Err(failed);
        };
        tracing::debug!(error = %Chain(&failed), "reused upstream connection failed before answering; retrying on a new one");
        self.stale_retries.fetch_add(1, Ordering::Relaxed);
        let conn = self.connect().await?;
        let writer = Writer::new(again, body, chunked, false);
        let mut exchange = Exchange::new(conn, writer, upgrade);
        let head = poll_fn(|cx| exchange.poll_head(cx, method)).await?;
        Ok((exchange, head))
    }

    /// The response whose head has arrived, its body still to read from the exchange.
    fn response(self: &Arc<Self>, exchange: Exchange, head: ResponseHead) -> Response<PooledBody> {
        let mut response = Response::new(PooledBody {
            conn: Some(exchange.conn),
            writer: exchange.sending.then_some(exchange.writer),
            keep_alive: exchange.keep_alive && head.keep_alive,
            decoder: BodyDecoder::new(head.framing),
            pool: Arc::clone(self),
        });
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        response
    }

    async fn connect(&self) -> Result<Box<Conn>, SendError> {
        let io = self
            .connector
            .clone()
            .call(self.origin.clone())
            .await
            .map_err(SendError::Upstream)?;
        Ok(Box::new(Conn {
            io: TokioIo::new(io),
            buf: BytesMut::new(),
        }))
    }

    /// The most recently used idle connection that is still open.
    async fn checkout(&self) -> Option<Box<Conn>> {
        loop {
            let mut conn = self.pop()?;
            if poll_fn(|cx| conn.poll_idle(cx)).await {
                return Some(conn);
            }
            tracing::debug!("idle upstream connection was closed; trying another");
        }
    }

    fn pop(&self) -> Option<Box<Conn>> {
        let mut idle = self.lock();
        let entry = idle.pop()?;
        if entry.since.elapsed() > self.idle_timeout {
            // The rest are older still.
            idle.clear();
            return None;
        }
        Some(entry.conn)
    }

    /// Takes back a connection whose exchange has ended cleanly.
    fn checkin(&self, conn: Box<Conn>) {
        // No reuse asked for: the connection closes now rather than at the next checkout.
        if self.idle_timeout.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock();
        let expired = idle
            .iter()
            .take_while(|e| now.duration_since(e.since) > self.idle_timeout)
            .count();
        idle.drain(..expired);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { conn, since: now });
        }
    }

    pub fn stale_retries(&self) -> u64 {
        self.stale_retries.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

/// A request on its way out: the request until the response head has arrived.
struct Exchange {
    conn: Box<Conn>,
    writer: Writer,
    /// True until the request is written in full, or writing it has failed.
    sending: bool,
    /// False once writing the request failed: the connection is not reused.
    keep_alive: bool,
    /// Why writing failed, reported if no answer comes either.
    write_error: Option<io::Error>,
    /// Whether any byte has come back: past that, the request was heard and is not sent
    /// again.
    answered: bool,
    /// Whether the request asked to switch protocols, which makes a 101 its answer.
    upgrade: bool,
}

impl Exchange {
    fn new(conn: Box<Conn>, writer: Writer, upgrade: bool) -> Self {
        Self {
            conn,
            writer,
            sending: true,
            keep_alive: true,
            write_error: None,
            answered: false,
            upgrade,
        }
    }

    /// Writes the request while reading the response, so an upstream that answers before
    /// it has read the whole body (a 413, a 401) is heard rather than cut off.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
    ) -> Poll<Result<ResponseHead, SendError>> {
        loop {
            if self.sending {
                match self.writer.poll(&mut self.conn.io, cx) {
                    Poll::Pending => {}
                    Poll::Ready(Ok(())) => self.sending = false,
                    // The client's body failing leaves no whole request to answer.
                    Poll::Ready(Err(WriteError::Body(e))) => {
                        return Poll::Ready(Err(SendError::Client(e)))
                    }
                    Poll::Ready(Err(WriteError::Io(e))) => {
                        self.sending = false;
                        self.keep_alive = false;
                        self.write_error = Some(e);
                    }
                }
            }
            let parsed = match self.upgrade {
                true => http1::parse_upgrade_head(&mut self.conn.buf, method),
                false => http1::parse_head(&mut self.conn.buf, method),
            };
            if let Some(head) = parsed.map_err(|e| SendError::Upstream(e.into()))? {
                return Poll::Ready(Ok(head));
            }
            // Without an answer, a failed write is the error to report.
            let error: BoxError = match ready!(self.conn.poll_fill(cx)) {
                Ok(0) => self
                    .write_error
                    .take()
                    .map_or_else(|| ClosedBeforeAnswer.into(), Into::into),
                Ok(_) => {
                    self.answered = true;
                    continue;
                }
                Err(e) => self.write_error.take().unwrap_or(e).into(),
            };
            return Poll::Ready(Err(SendError::Upstream(error)));
        }
    }
}

/// What of a request body could be sent again on another connection.
enum Kept {
    /// Nothing has been read from the body yet.
    Nothing,
    /// The one frame read so far. A body held in memory (the chat path's) is one frame,
    /// so it can always be sent again; a client's body streamed in several frames cannot
    /// once its second frame is read, as the first is then gone.
    Frame(Bytes),
    Gone,
}

/// Writes a request: its head, then its body as the client sends it, framed with
/// chunked encoding when its length is unknown.
struct Writer {
    /// Framed bytes not yet written, from `pos`.
    out: Vec<u8>,
    pos: usize,
    /// A large body frame, written from its own buffer after `out`.
    data: Bytes,
    /// `None` once the body has ended.
    body: Option<ProxyBody>,
    chunked: bool,
    kept: Kept,
}

impl Writer {
    /// With `keep`, what is read of the body is kept while it is one frame, so that
    /// [`Writer::into_replay`] can give the body again.
    fn new(head: Vec<u8>, body: ProxyBody, chunked: bool, keep: bool) -> Self {
        let ended = body.is_end_stream();
        let mut writer = Self {
            out: head,
            pos: 0,
            data: Bytes::new(),
            body: Some(body),
            chunked,
            kept: if keep { Kept::Nothing } else { Kept::Gone },
        };
        if ended {
            writer.end_body();
        }
        writer
    }

    /// The whole request body again, from its start, if what was read of it is kept.
    fn into_replay(self) -> Option<ProxyBody> {
        let rest = self.body.unwrap_or_else(crate::body::empty);
        match self.kept {
            Kept::Nothing => Some(rest),
            Kept::Frame(first) => Some(Replay::new(first, rest).boxed_unsync()),
            Kept::Gone => None,
        }
    }

    fn end_body(&mut self) {
        self.body = None;
        if self.chunked {
            self.out.extend_from_slice(http1::LAST_CHUNK);
        }
    }

    /// `Ready(Ok)` once the whole request is written and flushed.
    fn poll(&mut self, io: &mut Io, cx: &mut Context<'_>) -> Poll<Result<(), WriteError>> {
        loop {
            // Frames the client has already sent join the bytes waiting to be written, so
            // a small request leaves in one write.
            let mut body_pending = false;
            while let Some(body) = self.body.as_mut() {
                if !self.data.is_empty() || self.out.len() - self.pos >= COPY_LIMIT {
                    break;
                }
                match Pin::new(body).poll_frame(cx) {
                    Poll::Pending => {
                        body_pending = true;
                        break;
                    }
                    Poll::Ready(None) => self.end_body(),
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(WriteError::Body(e))),
                    Poll::Ready(Some(Ok(frame))) => {
                        // Trailers are not forwarded, as hyper's client did not either.
                        let Ok(data) = frame.into_data() else {
                            continue;
                        };
                        if data.is_empty() {
                            continue;
                        }
                        self.kept = match self.kept {
                            Kept::Nothing => Kept::Frame(data.clone()),
                            Kept::Frame(_) | Kept::Gone => Kept::Gone,
                        };
                        if self.chunked {
                            http1::chunk_header(&mut self.out, data.len());
                        }
                        if data.len() <= COPY_LIMIT {
                            self.out.extend_from_slice(&data);
                            if self.chunked {
                                self.out.extend_from_slice(b"\r\n");
                            }
                        } else {
                            self.data = data;
                        }
                    }
                }
            }
            if self.pos < self.out.len() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.out[self.pos..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                }
                self.pos += n;
                if self.pos == self.out.len() {
                    self.out.clear();
                    self.pos = 0;
                }
                continue;
            }
            if !self.data.is_empty() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.data))?;
                if n == 0 {
                    return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                }
                self.data.advance(n);
                if self.data.is_empty() && self.chunked {
                    self.out.extend_from_slice(b"\r\n");
                }
                continue;
            }
            // Everything framed so far is written: make sure it left (TLS buffers).
            ready!(Pin::new(&mut *io).poll_flush(cx))?;
            if self.body.is_none() {
                return Poll::Ready(Ok(()));
            }
            if body_pending {
                return Poll::Pending;
            }
        }
    }
}

/// Moves the request along while any of it is left to write. `Ok(Some)` when writing to
/// the upstream has just failed (the writer is dropped, and the connection cannot carry
/// another request); `Err` when the client's body failed.
fn send_more(
    writer: &mut Option<Writer>,
    io: &mut Io,
    cx: &mut Context<'_>,
) -> Result<Option<io::Error>, BoxError> {
    let Some(sending) = writer else {
        return Ok(None);
    };
    match sending.poll(io, cx) {
        Poll::Pending => Ok(None),
        Poll::Ready(Ok(())) => {
            *writer = None;
            Ok(None)
        }
        Poll::Ready(Err(WriteError::Body(e))) => Err(e),
        Poll::Ready(Err(WriteError::Io(e))) => {
            *writer = None;
            Ok(Some(e))
        }
    }
}

enum WriteError {
    /// Reading the client's body failed.
    Body(BoxError),
    /// Writing to the upstream failed.
    Io(io::Error),
}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// An upstream response body, read from the connection as the client takes it. The
/// connection goes back to the pool when the body ends; a body dropped before its end
/// (the client went away) closes the connection, which cannot carry another request
/// with half a response on it.
pub struct PooledBody {
    /// `None` once released or failed.
    conn: Option<Box<Conn>>,
    /// The request body, when the upstream answered before reading all of it.
    writer: Option<Writer>,
    keep_alive: bool,
    decoder: BodyDecoder,
    pool: Arc<Pool>,
}

impl PooledBody {
    /// The body has ended: the connection goes back to the pool if it can carry another
    /// request (nothing left unsent or unread, and the upstream did not say close).
    fn release(&mut self) {
        self.decoder = BodyDecoder::Done;
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && self.writer.is_none() && conn.buf.is_empty() {
                self.pool.checkin(conn);
            }
        }
    }

    fn fail(&mut self, error: impl Into<BoxError>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.conn = None;
        self.decoder = BodyDecoder::Done;
        Poll::Ready(Some(Err(error.into())))
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match send_more(&mut this.writer, &mut conn.io, cx) {
                Ok(None) => {}
                // The upstream answered without the rest: the answer is what counts.
                Ok(Some(_)) => this.keep_alive = false,
                Err(e) => return this.fail(e),
            }
            let (data, ended) = match this.decoder.decode(&mut conn.buf) {
                Ok(Decoded::Data(data)) => (Some(data), this.decoder == BodyDecoder::Done),
                Ok(Decoded::End) => (None, true),
                Ok(Decoded::NeedMore) => (None, false),
                Err(e) => return this.fail(e),
            };
            if ended {
                this.release();
            }
            if let Some(data) = data {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if ended {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => match this.decoder.close() {
                    Ok(()) => {
                        this.keep_alive = false;
                        this.release();
                        return Poll::Ready(None);
                    }
                    Err(e) => return this.fail(e),
                },
                Ok(_) => {}
                Err(e) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder == BodyDecoder::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder {
            BodyDecoder::Length(n) => SizeHint::with_exact(n),
            BodyDecoder::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for PooledBody {
    /// A body with nothing to read (no content, or a response to HEAD) is never polled:
    /// its end is seen here.
    fn drop(&mut self) {
        if self.decoder == BodyDecoder::Done {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use http::Request;

    use super::*;

    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// A raw upstream that answers every request with `ANSWER` and counts connections.
    /// With `close_after_answer`, it closes each connection right after answering,
    /// without saying so (no `Connection: close`), the way an upstream's idle timeout
    /// does.
    async fn upstream(close_after_answer: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    // Requests here have no body, so one read with the blank line is one request.
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        if !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                        if stream.write_all(ANSWER).await.is_err() || close_after_answer {
                            return;
                        }
                    }
                });
            }
        });
        (origin.parse().unwrap(), accepted)
    }

    fn pool(origin: Uri) -> Arc<Pool> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Pool::new(https, origin, Duration::from_secs(90))
    }

    /// Sends `request` as it is, its URI in origin form.
    async fn send(
        pool: &Arc<Pool>,
        request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, SendError> {
        let (parts, body) = request.into_parts();
        let mut head = Vec::new();
        http1::request_line(&mut head, &parts.method, &[parts.uri.path()]);
        for (name, value) in &parts.headers {
            http1::header(&mut head, name.as_str(), value.as_bytes());
        }
        let framing = http1::request_framing(&parts.method, body.size_hint().exact(), false);
        pool.send(&parts.method, head, framing, body).await
    }

    fn get(origin: &Uri) -> Request<ProxyBody> {
        Request::builder()
            .uri("/x")
            .header(http::header::HOST, origin.authority().unwrap().as_str())
            .body(crate::body::empty())
            .unwrap()
    }

    async fn send_and_read(pool: &Arc<Pool>, origin: &Uri) -> Bytes {
        let response = send(pool, get(origin)).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_has_ended() {
        let (origin, accepted) = upstream(false).await;
        let pool = pool(origin.clone());
        for _ in 0..20 {
            assert_eq!(send_and_read(&pool, &origin).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_does_not_return_the_connection() {
        let (origin, _) = upstream(false).await;
        let pool = pool(origin.clone());
        let response = send(&pool, get(&origin)).await.unwrap();
        drop(response);
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn idle_connections_the_upstream_closed_are_replaced_transparently() {
        let (origin, accepted) = upstream(true).await;
        let pool = pool(origin.clone());
        for i in 0..20 {
            assert_eq!(send_and_read(&pool, &origin).await, "ok", "request {i}");
            // Alternate between finding the close already seen and racing it.
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 20);
    }

    /// A raw upstream that runs `script` on each connection it accepts.
    async fn scripted<F, Fut>(script: F) -> Uri
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let script = Arc::new(script);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(script(stream));
            }
        });
        origin.parse().unwrap()
    }

    /// A raw upstream that reads one request head per connection, writes what `reply`
    /// says to it, and closes the connection (without saying so).
    async fn answering(reply: fn(&[u8]) -> &'static [u8]) -> Uri {
        scripted(move |mut stream| async move {
            let mut head = Vec::new();
            read_until(&mut stream, &mut head, b"\r\n\r\n").await;
            stream.write_all(reply(&head)).await.unwrap();
        })
        .await
    }

    /// Reads from `stream` until `buf` ends with `end`.
    async fn read_until(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, end: &[u8]) {
        let mut byte = [0; 1];
        while !buf.ends_with(end) {
            assert_eq!(
                stream.read(&mut byte).await.unwrap(),
                1,
                "request cut short"
            );
            buf.push(byte[0]);
        }
    }

    /// A body of unknown length that yields `parts` one at a time.
    fn streamed(parts: Vec<Bytes>) -> ProxyBody {
        let frames = parts.into_iter().map(|p| Ok::<_, BoxError>(Frame::data(p)));
        http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
    }

    #[tokio::test]
    async fn a_body_of_unknown_length_goes_out_chunked() {
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        let seen_tx = Arc::new(Mutex::new(Some(seen_tx)));
        let origin = scripted(move |mut stream| {
            let seen_tx = Arc::clone(&seen_tx);
            async move {
                let mut request = Vec::new();
                read_until(&mut stream, &mut request, b"0\r\n\r\n").await;
                stream.write_all(ANSWER).await.unwrap();
                let _ = seen_tx.lock().unwrap().take().unwrap().send(request);
            }
        })
        .await;
        let pool = pool(origin.clone());
        let mut request = get(&origin);
        *request.method_mut() = Method::POST;
        *request.body_mut() = streamed(["hello", "", ", world"].map(Bytes::from).to_vec());
        let response = send(&pool, request).await.unwrap();
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "ok"
        );
        let request = String::from_utf8(seen_rx.await.unwrap()).unwrap();
        assert!(
            request.starts_with("POST /x HTTP/1.1\r\nhost: "),
            "{request}"
        );
        assert!(
            request.ends_with(
                "transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"
            ),
            "{request}"
        );
    }

    #[tokio::test]
    async fn chunked_answers_are_decoded_and_the_connection_reused() {
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let origin = scripted(move |mut stream| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                loop {
                    let mut request = Vec::new();
                    let mut byte = [0; 1];
                    while !request.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        request.push(byte[0]);
                    }
                    // Written in pieces that split the framing, as a slow upstream might.
                    for piece in [
                        &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r"[..],
                        b"\nabc\r\n",
                        b"2\r\nde\r\n0\r\n\r\n",
                    ] {
                        stream.write_all(piece).await.unwrap();
                        stream.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }
        })
        .await;
        let pool = pool(origin.clone());
        for _ in 0..3 {
            assert_eq!(send_and_read(&pool, &origin).await, "abcde");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_before_the_whole_body_is_delivered_not_cut_off() {
        // The upstream refuses after the head, without reading the body, and closes.
        let origin =
            answering(|_| b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\n\r\ntoo long")
                .await;
        let pool = pool(origin.clone());
        let mut request = get(&origin);
        *request.method_mut() = Method::POST;
        // A body that never ends: the answer must come regardless.
        let never = futures_util::stream::pending::<Result<Frame<Bytes>, BoxError>>();
        *request.body_mut() = http_body_util::StreamBody::new(never).boxed_unsync();
        let response = send(&pool, request).await.unwrap();
        assert_eq!(response.status(), 413);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "too long");
        assert_eq!(
            pool.idle_count(),
            0,
            "a half-sent request's connection is not reused"
        );
    }

    #[tokio::test]
    async fn close_delimited_and_connection_close_answers_are_not_reused() {
        let origin = answering(|head| match head.starts_with(b"GET /close") {
            true => b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
            false => b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
        })
        .await;
        let pool = pool(origin.clone());
        assert_eq!(send_and_read(&pool, &origin).await, "until the end");
        let mut request = get(&origin);
        *request.uri_mut() = "/close".parse().unwrap();
        let body = send(&pool, request).await.unwrap().into_body();
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn a_switched_connection_leaves_the_pool_as_a_tunnel_bytes_it_sent_first() {
        // The upstream switches and sends its first bytes in the same packet as the 101,
        // then echoes.
        let origin = scripted(|mut stream| async move {
            let mut head = Vec::new();
            read_until(&mut stream, &mut head, b"\r\n\r\n").await;
            let switch = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\nearly";
            stream.write_all(switch).await.unwrap();
            let mut buf = [0; 64];
            while let Ok(n @ 1..) = stream.read(&mut buf).await {
                stream.write_all(&buf[..n]).await.unwrap();
            }
        })
        .await;
        let pool = pool(origin.clone());
        let mut head = Vec::new();
        http1::request_line(&mut head, &Method::GET, &["/ws"]);
        http1::header(&mut head, "upgrade", b"x");
        http1::header(&mut head, "connection", b"upgrade");
        let answer = pool
            .upgrade(
                &Method::GET,
                head,
                RequestFraming::AsIs,
                crate::body::empty(),
            )
            .await
            .unwrap();
        let Answer::Switched(head, mut tunnel) = answer else {
            panic!("not switched");
        };
        assert_eq!(head.status, StatusCode::SWITCHING_PROTOCOLS);
        let mut early = [0; 5];
        tunnel.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"early");
        tunnel.write_all(b"echo me").await.unwrap();
        let mut echoed = [0; 7];
        tunnel.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"echo me");
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn a_connection_cut_mid_body_is_an_error() {
        let origin = answering(|_| b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nonly5").await;
        let pool = pool(origin.clone());
        let body = send(&pool, get(&origin)).await.unwrap().into_body();
        assert!(body.collect().await.is_err());
        assert_eq!(pool.idle_count(), 0);
    }

    /// An HTTPS upstream (hyper's server behind rustls, with a self-signed certificate
    /// for `localhost`) that counts connections. `/stream` answers in timed chunks;
    /// anything else echoes the request body.
    async fn tls_upstream() -> (Uri, Arc<Pool>, Arc<AtomicUsize>) {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let rcgen::CertifiedKey { cert, key_pair } =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pair.serialize_der()));
        let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let tls = acceptor.accept(stream).await.unwrap();
                    let service = hyper::service::service_fn(
                        |request: Request<hyper::body::Incoming>| async move {
                            let body = match request.uri().path() {
                                "/stream" => {
                                    let frames = futures_util::stream::unfold(0, |i| async move {
                                        (i < 3).then_some(())?;
                                        tokio::time::sleep(Duration::from_millis(5)).await;
                                        let frame =
                                            Frame::data(Bytes::from(format!("event {i}\n")));
                                        Some((Ok::<_, hyper::Error>(frame), i + 1))
                                    });
                                    http_body_util::StreamBody::new(frames).boxed_unsync()
                                }
                                _ => request.into_body().boxed_unsync(),
                            };
                            Ok::<_, std::convert::Infallible>(Response::new(body))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let origin: Uri = format!("https://localhost:{port}").parse().unwrap();
        (
            origin.clone(),
            Pool::new(https, origin, Duration::from_secs(90)),
            accepted,
        )
    }

    #[tokio::test]
    async fn exchanges_over_tls_stream_both_ways_and_reuse_the_connection() {
        let (origin, pool, accepted) = tls_upstream().await;
        for round in 0..3 {
            let mut request = get(&origin);
            *request.uri_mut() = "/stream".parse().unwrap();
            let response = send(&pool, request).await.unwrap();
            assert!(response.headers()[http::header::TRANSFER_ENCODING] == "chunked");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, "event 0\nevent 1\nevent 2\n", "round {round}");

            let mut request = get(&origin);
            *request.method_mut() = Method::POST;
            let big = Bytes::from(vec![b'x'; 100_000]);
            *request.body_mut() = streamed(vec![
                Bytes::from_static(b"small,"),
                big,
                Bytes::from_static(b",end"),
            ]);
            let response = send(&pool, request).await.unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body.len(), 6 + 100_000 + 4);
            assert!(body.starts_with(b"small,x") && body.ends_with(b"x,end"));
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one TLS connection, reused"
        );
    }
}
