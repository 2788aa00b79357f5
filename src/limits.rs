//! Bounds on what clients can make the proxy hold: how long a request body may go
//! silent, and how much memory the chat bodies read into memory take, all together. A
//! client that trickles a body, or many that do at once, get an error instead of holding
//! the proxy's memory for as long as they like.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// Why a client's body failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError<E> {
    /// Nothing came for the body-read timeout.
    #[error("the client sent no request body for {} s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// Reading it failed: the connection was cut, or its framing is broken.
    #[error(transparent)]
    Read(E),
}

/// Reading more of a body read into memory would take the bodies held past
/// `limits.max_buffered_bytes` (the value inside).
#[derive(Debug, thiserror::Error)]
#[error("the proxy already holds {0} bytes of request bodies, its limit; try again shortly")]
pub struct Overloaded(pub u64);

/// The memory request bodies read whole (the chat path's) may hold in total.
pub struct Buffers {
    held: AtomicU64,
    max: u64,
}

impl Buffers {
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(Self {
            held: AtomicU64::new(0),
            max,
        })
    }

    /// A reservation for one request's body, empty until it grows.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            buffers: Arc::clone(self),
            held: AtomicU64::new(0),
        }
    }

    fn take(&self, bytes: u64) -> Result<(), Overloaded> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.max)
            })
            .map(drop)
            .map_err(|_| Overloaded(self.max))
    }

    #[cfg(test)]
    fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }
}

/// The bytes of the budget one request holds; given back when it is dropped. Shared
/// between the body being read and the request it belongs to, so the bytes stay counted
/// until the request is answered, not only while the body is read.
pub struct Reservation {
    buffers: Arc<Buffers>,
    held: AtomicU64,
}

impl Reservation {
    /// Makes the reservation at least `bytes`: taken from the budget, or refused with
    /// nothing more taken.
    pub fn grow_to(&self, bytes: u64) -> Result<(), Overloaded> {
        let held = self.held.load(Ordering::Acquire);
        if bytes <= held {
            return Ok(());
        }
        self.buffers.take(bytes - held)?;
        self.held.store(bytes, Ordering::Release);
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let held = *self.held.get_mut();
        self.buffers.held.fetch_sub(held, Ordering::AcqRel);
    }
}

/// A client's request body, with the bounds the proxy puts on it: it fails with
/// [`BodyError::Timeout`] when no frame comes for `timeout`, and, when it is read into
/// memory, with [`BodyError::Overloaded`] when what it has delivered cannot be reserved.
/// Its error is a concrete type, not a boxed one, so that the futures reading it stay
/// `Send` whatever adapters (`Limited`) they go through.
///
/// The silence counted is the time the reader spent waiting for the body, from the
/// first poll that found nothing: time the reader spent elsewhere (writing to a slow
/// upstream) is not the client's. The timer is set only when the body makes its reader
/// wait, so a body that arrived with its head (most of them) costs no timer at all.
pub struct ClientBody<B> {
    inner: B,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the reader began waiting for the next frame; `None` while it is not.
    waiting_since: Option<Instant>,
    /// Set for a body read into memory: every byte it delivers is reserved first.
    reservation: Option<Arc<Reservation>>,
    delivered: u64,
}

impl<B> ClientBody<B> {
    pub fn new(inner: B, timeout: Duration, reservation: Option<Arc<Reservation>>) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
            waiting_since: None,
            reservation,
            delivered: 0,
        }
    }

    fn reserve(&mut self, frame: &Frame<Bytes>) -> Result<(), Overloaded> {
        let (Some(reservation), Some(data)) = (&self.reservation, frame.data_ref()) else {
            return Ok(());
        };
        self.delivered += data.len() as u64;
        reservation.grow_to(self.delivered)
    }

    /// Whether the reader has waited for `timeout`; otherwise the timer is (re)set to
    /// fire `timeout` after it began waiting.
    fn timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = *self.waiting_since.get_or_insert_with(Instant::now) + self.timeout;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

impl<B> Body for ClientBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError<B::Error>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.waiting_since = None;
                let reserved = this.reserve(&frame).map_err(BodyError::Overloaded);
                Poll::Ready(Some(reserved.map(|()| frame)))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map_err(BodyError::Read))),
            Poll::Pending if this.timed_out(cx) => {
                Poll::Ready(Some(Err(BodyError::Timeout(this.timeout))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};

    fn frames(parts: &[&'static str]) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        let frames = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))));
        StreamBody::new(stream::iter(frames.collect::<Vec<_>>()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_body_fails_after_the_timeout() {
        let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, Infallible>>());
        let mut body = ClientBody::new(silent, Duration::from_secs(60), None);
        let started = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(matches!(err, BodyError::Timeout(_)), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn each_frame_restarts_the_clock() {
        let slow = stream::unfold(0, |sent| async move {
            tokio::time::sleep(Duration::from_secs(if sent < 3 { 50 } else { 70 })).await;
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"x"))),
                sent + 1,
            ))
        });
        let mut body = ClientBody::new(
            StreamBody::new(Box::pin(slow)),
            Duration::from_secs(60),
            None,
        );
        for _ in 0..3 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(matches!(err, BodyError::Timeout(_)), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_reader_spends_elsewhere_is_not_the_clients() {
        // The second frame comes 50 s after it is asked for; the reader asks 120 s after
        // the first (busy writing to a slow upstream, say).
        let frames = stream::unfold(0, |sent| async move {
            if sent > 0 {
                tokio::time::sleep(Duration::from_secs(50)).await;
            }
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"x"))),
                sent + 1,
            ))
        });
        let mut body = ClientBody::new(
            StreamBody::new(Box::pin(frames)),
            Duration::from_secs(60),
            None,
        );
        assert!(body.frame().await.unwrap().is_ok());
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(body.frame().await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn bodies_read_into_memory_share_one_budget_until_their_requests_end() {
        let buffers = Buffers::new(10);
        let first = Arc::new(buffers.reservation());
        let body = ClientBody::new(
            frames(&["abc", "def"]),
            Duration::from_secs(1),
            Some(Arc::clone(&first)),
        );
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");
        // Read, but its request is not over: still counted.
        assert_eq!(buffers.held(), 6);
        let second = Arc::new(buffers.reservation());
        let body = ClientBody::new(
            frames(&["ghi", "jkl"]),
            Duration::from_secs(1),
            Some(second),
        );
        let err = body.collect().await.unwrap_err();
        assert!(matches!(err, BodyError::Overloaded(_)), "{err}");
        // The refused body's request ended with it.
        assert_eq!(buffers.held(), 6);
        drop(first);
        assert_eq!(buffers.held(), 0);
    }

    #[test]
    fn a_declared_length_is_reserved_up_front() {
        let buffers = Buffers::new(100);
        let first = buffers.reservation();
        first.grow_to(80).unwrap();
        first.grow_to(50).unwrap();
        assert!(buffers.reservation().grow_to(30).is_err());
        assert_eq!(buffers.held(), 80);
    }
}
