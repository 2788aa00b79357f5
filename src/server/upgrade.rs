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
use tokio::sync::{oneshot, OwnedSemaphorePermit};

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

impl OnUpgrade {
    /// Runs `serve` on the client's connection, on a task of its own, once the server has
    /// written the 101 and handed the connection over. The task holds `slot`, the
    /// connection's share of `server.max_connections`, until it ends: a switched
    /// connection counts as any other. A connection not handed over ends the task.
    pub fn serve<F, Fut>(self, slot: Arc<OwnedSemaphorePermit>, serve: F)
    where
        F: FnOnce(Upgraded) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        tokio::spawn(async move {
            let _slot = slot;
            match self.await {
                Ok(client) => serve(client).await,
                Err(e) => {
                    tracing::debug!(error = %e, "the client's connection was not handed over after 101");
                }
            }
        });
    }
}

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio::sync::{mpsc, Semaphore};

    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    /// A connection's slot of one, and the semaphore it came from.
    async fn slot() -> (Arc<Semaphore>, Arc<OwnedSemaphorePermit>) {
        let semaphore = Arc::new(Semaphore::new(1));
        let permit = Arc::clone(&semaphore).acquire_owned().await.unwrap();
        (semaphore, Arc::new(permit))
    }

    #[tokio::test]
    async fn the_connection_is_served_with_its_early_bytes_first_and_holds_its_slot() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        let (semaphore, slot) = slot().await;
        let (pending, on_upgrade) = pending();
        let (read_tx, mut read_rx) = mpsc::channel(1);
        let (end_tx, mut end_rx) = mpsc::channel::<()>(1);
        on_upgrade.serve(slot, move |mut upgraded| async move {
            let mut first = [0; 5];
            upgraded.read_exact(&mut first).await.unwrap();
            read_tx.send(first).await.unwrap();
            end_rx.recv().await;
        });
        pending.fulfil(Upgraded::new(server_side, Bytes::from_static(b"early")));
        let first = tokio::time::timeout(WAIT, read_rx.recv()).await.unwrap();
        assert_eq!(first, Some(*b"early"));
        assert_eq!(semaphore.available_permits(), 0, "held while served");
        drop(end_tx);
        let back = tokio::time::timeout(WAIT, semaphore.acquire()).await;
        assert!(back.is_ok(), "the slot came back when the service ended");
    }

    #[tokio::test]
    async fn a_connection_never_handed_over_gives_its_slot_back_unserved() {
        let (semaphore, slot) = slot().await;
        let (pending, on_upgrade) = pending();
        let (served_tx, mut served_rx) = mpsc::channel::<()>(1);
        on_upgrade.serve(slot, move |_| async move {
            let _ = served_tx.send(()).await;
        });
        // The answer was no 101: the connection keeps its socket.
        drop(pending);
        let back = tokio::time::timeout(WAIT, semaphore.acquire()).await;
        assert!(back.is_ok(), "the slot came back");
        assert_eq!(served_rx.recv().await, None, "nothing was served");
    }
}
