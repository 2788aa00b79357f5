//! One client connection, request after request, in typed phases: **idle** (no request
//! yet: no read buffer is held, and the keep-alive timer runs), **head** (bytes came: the
//! head is read within the same deadline, so a client that never finishes its headers is
//! dropped as an idle one is), **serving** (the handler runs; the body reads itself from
//! the socket when polled), **writing** (the answer's head, then each body frame as it
//! comes, never held back), then idle again or closed.
//!
//! The connection closes after an answer when either side said so, when the request
//! body was not read to its end (what is left of it cannot be told from a next request),
//! or when the server drains; an idle connection closes at once when the server drains.
//! A client that closes its side while its request is served has gone: the handler is
//! dropped, and with it the upstream exchange, as hyper does.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::head::{self, BodyFraming, Head, HeadError};
use super::io::{Continue, Shared};
use super::request_body::RequestBody;
use super::response::{self, Asked, Framing, Written};
use super::upgrade::{self, Pending, Upgraded};
use crate::body::ProxyBody;
use crate::http1::{self as wire, BodyDecoder};
use crate::shutdown::Watch;

/// Serves `stream` until it closes. `handler` answers each request; `keep_alive` is how
/// long the connection may wait for a request head, from the end of the last answer
/// (or the accept) to the head's last byte.
pub async fn serve<H, F>(stream: TcpStream, keep_alive: Duration, mut watch: Watch, mut handler: H)
where
    H: FnMut(Request<RequestBody>) -> F,
    F: Future<Output = Response<ProxyBody>>,
{
    let shared = Shared::new(stream);
    // One timer for the connection's life, moved for each request.
    let timer = tokio::time::sleep(keep_alive);
    tokio::pin!(timer);
    loop {
        timer.as_mut().reset(Instant::now() + keep_alive);
        let head = match next_head(&shared, timer.as_mut(), &mut watch).await {
            Ok(Some(head)) => head,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "refused request head");
                refuse(&shared, e.status()).await;
                break;
            }
        };
        let asked = Asked::new(
            head.request.method(),
            head.request.version(),
            head.keep_alive,
        );
        let (request, upgrade) = into_request(&shared, head);
        let response = tokio::select! {
            biased;
            response = handler(request) => response,
            () = peer_gone(&shared) => break,
        };
        let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        let written = match respond(&shared, response, asked, watch.is_draining()).await {
            Ok(written) => written,
            Err(e) => {
                tracing::debug!(error = %e, "answer not delivered");
                break;
            }
        };
        if let (true, Some(upgrade)) = (switched, upgrade) {
            hand_over(shared, upgrade);
            return;
        }
        let body_read = shared.lock().body == BodyDecoder::Done;
        if !written.keep_alive || !body_read || watch.is_draining() {
            break;
        }
    }
    shared.shutdown().await;
}

/// Waits for the next request head (idle, then head phase) until the timer fires, the
/// client closes, or the server drains while nothing of a request has come.
async fn next_head(
    shared: &Shared,
    mut timer: Pin<&mut Sleep>,
    watch: &mut Watch,
) -> Result<Option<Head>, HeadError> {
    loop {
        let idle = {
            let mut inbound = shared.lock();
            if !inbound.buf.is_empty() {
                if let Some(head) = head::parse(&mut inbound.buf)? {
                    return Ok(Some(head));
                }
            } else if inbound.buf.capacity() > 0 {
                // Idle: the buffer goes until bytes come again.
                inbound.buf = BytesMut::new();
            }
            if inbound.eof {
                return Ok(None);
            }
            inbound.buf.is_empty()
        };
        tokio::select! {
            biased;
            read = poll_fn(|cx| shared.lock().poll_read(cx)) => {
                if !matches!(read, Ok(1..)) {
                    return Ok(None);
                }
            }
            () = timer.as_mut() => return Ok(None),
            () = watch.draining(), if idle => return Ok(None),
        }
    }
}

/// The request the handler gets, its body set to read from the connection; and the
/// connection's side of a switch of protocols, if the request asks for one.
fn into_request(shared: &Arc<Shared>, head: Head) -> (Request<RequestBody>, Option<Pending>) {
    let Head {
        mut request,
        body,
        expect_continue,
        upgrade,
        ..
    } = head;
    let body = {
        let mut inbound = shared.lock();
        let (decoder, body) = match body {
            None => (BodyDecoder::Done, RequestBody::empty()),
            Some(framing) => {
                let framing = match framing {
                    BodyFraming::Length(n) => wire::Framing::Length(n),
                    BodyFraming::Chunked => wire::Framing::Chunked,
                };
                let body = RequestBody::streaming(Arc::clone(shared));
                (BodyDecoder::new(framing), body)
            }
        };
        inbound.body = decoder;
        inbound.expect = match expect_continue && inbound.body != BodyDecoder::Done {
            true => Continue::Due(0),
            false => Continue::No,
        };
        body
    };
    let pending = upgrade.then(|| {
        let (pending, on_upgrade) = upgrade::pending();
        request.extensions_mut().insert(on_upgrade);
        pending
    });
    (request.map(|()| body), pending)
}

/// Completes when the client has closed its side while nothing more of its request is
/// to be read; bytes of a pipelined request are kept for later, and end the watch.
async fn peer_gone(shared: &Shared) {
    poll_fn(|cx| poll_peer_gone(shared, cx)).await;
}

fn poll_peer_gone(shared: &Shared, cx: &mut Context<'_>) -> Poll<()> {
    let mut inbound = shared.lock();
    if inbound.eof {
        return Poll::Ready(());
    }
    // The body is its reader's to read; what follows a pipelined head is the next
    // request's. Either way, nothing to watch now.
    if !inbound.buf.is_empty() || inbound.body != BodyDecoder::Done {
        return Poll::Pending;
    }
    match inbound.poll_read(cx) {
        Poll::Ready(Ok(1..)) | Poll::Pending => Poll::Pending,
        Poll::Ready(_) => Poll::Ready(()),
    }
}

/// Writes `response`: its head, with its first body frame when that is ready at once
/// (one `writev`), then each frame as the body yields it.
async fn respond(
    shared: &Shared,
    response: Response<ProxyBody>,
    asked: Asked,
    close: bool,
) -> io::Result<Written> {
    let (mut parts, mut body) = response.into_parts();
    let unread = {
        let mut inbound = shared.lock();
        // The final answer is going out: an interim one must not follow it.
        inbound.expect = Continue::No;
        inbound.body != BodyDecoder::Done
    };
    // A body not read by now is likely never to be (refused unread, or the client waits
    // for a 100 it will not get): the client is told the connection closes.
    let close = close || unread;
    let mut head = Vec::with_capacity(256);
    let written = response::encode_head(&mut head, &mut parts, &body.size_hint(), asked, close);
    drop(parts);
    let mut out = Outgoing {
        framing: written.framing,
        head: Some(head),
    };
    if written.framing == Framing::Empty {
        out.flush(shared).await?;
        return Ok(written);
    }
    loop {
        let frame = match out.head.is_some() {
            true => match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                Poll::Ready(frame) => frame,
                // Nothing yet: the head goes out alone, so the client sees the answer
                // begin (an event stream's first event may be long in coming).
                Poll::Pending => {
                    out.flush(shared).await?;
                    continue;
                }
            },
            false => tokio::select! {
                biased;
                frame = body.frame() => frame,
                () = peer_gone(shared) => return Err(io::ErrorKind::ConnectionAborted.into()),
            },
        };
        match frame {
            None => {
                out.finish(shared).await?;
                return Ok(written);
            }
            Some(Err(e)) => return Err(io::Error::other(e)),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    // Trailers: not relayed, as the client did not ask for them.
                    continue;
                };
                let last = body.is_end_stream();
                out.data(shared, data, last).await?;
                if last {
                    return Ok(written);
                }
            }
        }
    }
}

/// The answer as it goes out: the head until it is written, and what is left of a body
/// of known length.
struct Outgoing {
    framing: Framing,
    head: Option<Vec<u8>>,
}

/// Ends a chunk's data, and with it the body.
const LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";

impl Outgoing {
    async fn flush(&mut self, shared: &Shared) -> io::Result<()> {
        if let Some(head) = self.head.take() {
            shared.write_all(&[&head[..]]).await?;
        }
        Ok(())
    }

    /// One frame of the body, with the head if it has not gone yet; `last` ends the body.
    async fn data(&mut self, shared: &Shared, data: Bytes, last: bool) -> io::Result<()> {
        if data.is_empty() {
            return match last {
                true => self.finish(shared).await,
                false => Ok(()),
            };
        }
        let head = self.head.take().unwrap_or_default();
        match &mut self.framing {
            Framing::Chunked => {
                let mut line = [0; 18];
                let size = wire::chunk_size_line(&mut line, data.len());
                let end: &[u8] = if last { LAST_CHUNK } else { b"\r\n" };
                shared.write_all(&[&head[..], size, &data[..], end]).await
            }
            Framing::Length(left) => {
                // More than the length said would be read as the next answer.
                let len = data.len() as u64;
                if len > *left || (last && len < *left) {
                    return Err(io::Error::other("the body does not match its length"));
                }
                *left -= len;
                shared.write_all(&[&head[..], &data[..]]).await
            }
            Framing::UntilClose | Framing::Empty => shared.write_all(&[&head[..], &data[..]]).await,
        }
    }

    /// The body has ended.
    async fn finish(&mut self, shared: &Shared) -> io::Result<()> {
        let head = self.head.take().unwrap_or_default();
        match self.framing {
            Framing::Chunked => shared.write_all(&[&head[..], &LAST_CHUNK[2..]]).await,
            Framing::Length(left) if left > 0 => {
                shared.write_all(&[&head[..]]).await?;
                Err(io::Error::other("the body ended before its length"))
            }
            _ => shared.write_all(&[&head[..]]).await,
        }
    }
}

/// Answers a head that could not be taken, then the connection closes.
async fn refuse(shared: &Shared, status: StatusCode) {
    let mut out = Vec::with_capacity(128);
    response::refusal(&mut out, status);
    let _ = shared.write_all(&[&out[..]]).await;
}

/// Gives the socket, and what was read past the head, to whoever awaits the switch.
fn hand_over(shared: Arc<Shared>, upgrade: Pending) {
    // Held elsewhere only by a request body still alive, which an upgrade has not.
    if let Ok(shared) = Arc::try_unwrap(shared) {
        let (stream, read) = shared.into_parts();
        upgrade.fulfil(Upgraded::new(stream, read.freeze()));
    }
}
