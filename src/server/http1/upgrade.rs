//! A connection switched to another protocol: after a request that asked for it is
//! answered with 101, the connection hands its socket, with any bytes of the new
//! protocol it has already read, to whoever awaits the [`OnUpgrade`] the request carried
//! in its extensions.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// In a request's extensions when it asks to switch protocols: resolves to the
/// connection once the answer, a 101, is written. Extensions must be `Clone`; the
/// connection goes to the first clone polled, the others get [`NotUpgraded`].
pub struct OnUpgrade {
    shared: Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>,
    taken: Option<oneshot::Receiver<Upgraded>>,
}

impl Clone for OnUpgrade {
    fn clone(&self) -> Self {
        OnUpgrade {
            shared: Arc::clone(&self.shared),
            taken: None,
        }
    }
}

/// The connection's side of the hand-over.
pub(super) struct Pending(oneshot::Sender<Upgraded>);

pub(super) fn pending() -> (Pending, OnUpgrade) {
    let (tx, rx) = oneshot::channel();
    let on_upgrade = OnUpgrade {
        shared: Arc::new(Mutex::new(Some(rx))),
        taken: None,
    };
    (Pending(tx), on_upgrade)
}

impl Pending {
    pub(super) fn fulfil(self, upgraded: Upgraded) {
        // Nobody waiting: the connection is dropped, closed.
        let _ = self.0.send(upgraded);
    }
}

/// The connection was not handed over: the answer was no 101, or it could not be
/// written.
#[derive(Debug, thiserror::Error)]
#[error("the connection was not handed over after the switch of protocols")]
pub struct NotUpgraded;

impl Future for OnUpgrade {
    type Output = Result<Upgraded, NotUpgraded>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if this.taken.is_none() {
            let mut shared = this.shared.lock().unwrap_or_else(PoisonError::into_inner);
            this.taken = shared.take();
        }
        match &mut this.taken {
            Some(rx) => Pin::new(rx).poll(cx).map_err(|_| NotUpgraded),
            None => Poll::Ready(Err(NotUpgraded)),
        }
    }
}

/// The client's socket after a switch of protocols: the bytes read past the request's
/// head come first.
pub struct Upgraded {
    stream: TcpStream,
    read_first: Bytes,
}

impl Upgraded {
    pub(super) fn new(stream: TcpStream, read_first: Bytes) -> Self {
        Upgraded { stream, read_first }
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read_first.is_empty() {
            let n = self.read_first.len().min(buf.remaining());
            buf.put_slice(&self.read_first[..n]);
            self.read_first.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
