//! The body type every response is built from, and the idle timeout that guards the
//! upstream's body while it streams to the client.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tokio::time::{Instant, Sleep};

use crate::cause::BoxError;

pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Why a client's request body could not be read to its end (the server's reader
/// fails with it; the error the client is answered with is told from it).
#[derive(Debug, thiserror::Error)]
pub enum BodyReadError {
    #[error("the client closed the connection before the end of the request body")]
    Truncated,
    #[error("malformed chunked request body")]
    Chunked,
    #[error("reading the request body failed")]
    Io(#[source] std::io::Error),
}

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

/// Fails the body when its reader waits `idle` for a frame. The clock restarts on every
/// frame, so a stream that keeps producing runs for as long as it likes; and it runs
/// only while the reader waits, from the first poll that finds nothing: the time a
/// client takes to read what came (its socket full, the body not polled) is not the
/// upstream's silence.
///
/// Starting to wait only notes the time: moving the timer in tokio's wheel on every
/// frame cost more than the rest of this body's work. When the timer fires early because
/// the wait began after it was set, it is moved to `idle` after that.
pub struct IdleTimeout<B> {
    inner: B,
    idle: Duration,
    sleep: Pin<Box<Sleep>>,
    /// When the reader began waiting for the next frame; `None` while it is not.
    waiting_since: Option<Instant>,
}

impl<B> IdleTimeout<B> {
    #[cfg(test)]
    pub fn new(inner: B, idle: Duration) -> Self {
        Self::with_timer(inner, idle, Box::pin(tokio::time::sleep(idle)))
    }

    /// Reuses a timer the caller already has (the one that guarded the wait for the
    /// response head), so a request costs one timer, not two.
    pub fn with_timer(inner: B, idle: Duration, mut sleep: Pin<Box<Sleep>>) -> Self {
        sleep.as_mut().reset(Instant::now() + idle);
        Self {
            inner,
            idle,
            sleep,
            waiting_since: None,
        }
    }
}

/// The error a body ends with when the upstream went silent mid-stream.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing for {} s mid-stream", .0.as_secs_f64())]
pub struct StreamIdle(pub Duration);

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.waiting_since = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let waiting_since = *this.waiting_since.get_or_insert_with(Instant::now);
        loop {
            ready!(this.sleep.as_mut().poll(cx));
            let deadline = waiting_since + this.idle;
            if deadline <= this.sleep.deadline() {
                return Poll::Ready(Some(Err(Box::new(StreamIdle(this.idle)))));
            }
            this.sleep.as_mut().reset(deadline);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body whose first bytes were already read (to look at them) and are sent first,
/// followed by the rest of the original body untouched.
pub struct Replay<B = ProxyBody> {
    head: Option<Bytes>,
    rest: B,
}

impl<B> Replay<B> {
    pub fn new(head: Bytes, rest: B) -> Self {
        Self {
            head: (!head.is_empty()).then_some(head),
            rest,
        }
    }
}

impl<B> Body for Replay<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Pin::new(&mut self.rest)
            .poll_frame(cx)
            .map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let extra = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + extra);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + extra);
        }
        hint
    }
}

/// How a watched body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Its last frame went by.
    Complete,
    /// It failed.
    Failed,
    /// It was dropped before its end (the client went away).
    Dropped,
}

/// What a [`watched`] body reports to as it streams, untouched, to the client.
pub trait Watcher: Send + Unpin + 'static {
    /// One data frame going by.
    fn frame(&mut self, data: &[u8]);
    /// The body's end, told once.
    fn end(&mut self, ending: Ending);
}

/// `inner`, with each data frame shown to `watcher` and its end told.
pub fn watched(inner: ProxyBody, watcher: impl Watcher) -> ProxyBody {
    UnsyncBoxBody::new(Watched {
        inner,
        watcher: Some(watcher),
    })
}

struct Watched<W: Watcher> {
    inner: ProxyBody,
    /// Taken when the end is told, so it is told once.
    watcher: Option<W>,
}

impl<W: Watcher> Watched<W> {
    fn end(&mut self, ending: Ending) {
        if let Some(mut watcher) = self.watcher.take() {
            watcher.end(ending);
        }
    }
}

impl<W: Watcher> Body for Watched<W> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(watcher)) = (frame.data_ref(), self.watcher.as_mut()) {
                    watcher.frame(data);
                }
                // A body that knows its end is not polled past its last frame.
                if self.inner.is_end_stream() {
                    self.end(Ending::Complete);
                }
            }
            Poll::Ready(Some(Err(_))) => self.end(Ending::Failed),
            Poll::Ready(None) => self.end(Ending::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<W: Watcher> Drop for Watched<W> {
    fn drop(&mut self) {
        self.end(Ending::Dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;

    #[tokio::test(start_paused = true)]
    async fn silent_body_fails_after_idle() {
        let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, BoxError>>());
        let mut body = IdleTimeout::new(silent, Duration::from_secs(5));
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("5 s"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn each_frame_restarts_the_idle_clock() {
        // Frames 3 s apart: none is late for a 5 s limit, although the whole body takes
        // longer than it; then a 6 s silence fails the body.
        let frames = stream::unfold(0, |sent| async move {
            let wait = if sent < 3 { 3 } else { 6 };
            tokio::time::sleep(Duration::from_secs(wait)).await;
            Some((
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"x"))),
                sent + 1,
            ))
        });
        let mut body = IdleTimeout::new(StreamBody::new(Box::pin(frames)), Duration::from_secs(5));
        let started = Instant::now();
        for _ in 0..3 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("5 s"), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(9 + 5));
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_client_takes_to_read_is_not_the_upstreams() {
        // Each frame comes 4 s after it is asked for; the reader asks 10 s after the
        // last (its client reading slowly): never 5 s of the upstream's silence.
        let frames = stream::unfold(0, |sent| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            (sent < 3).then(|| {
                let frame = Frame::data(Bytes::from_static(b"x"));
                (Ok::<_, BoxError>(frame), sent + 1)
            })
        });
        let mut body = IdleTimeout::new(StreamBody::new(Box::pin(frames)), Duration::from_secs(5));
        for _ in 0..3 {
            assert!(body.frame().await.unwrap().is_ok());
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn replay_sends_the_head_then_the_rest() {
        let body = Replay::new(Bytes::from_static(b"data: 1\n\n"), full("data: 2\n\n"));
        assert_eq!(body.size_hint().exact(), Some(18));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"data: 1\n\ndata: 2\n\n");
    }

    #[tokio::test(start_paused = true)]
    async fn frames_pass_and_end_cleanly() {
        let chunks = stream::iter(vec![
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
        ]);
        let body = IdleTimeout::new(StreamBody::new(chunks), Duration::from_secs(5));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"ab");
    }
}
