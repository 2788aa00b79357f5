//! A client's request body, read from the socket as its reader polls it: bytes that came
//! with the head first, then whatever the socket has, decoded by the body's framing
//! (`Content-Length` or chunked, its trailers dropped). Nothing is buffered beyond one
//! read, and no task or channel stands between the socket and the reader.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::io::Shared;
use crate::body::BodyReadError;
use crate::http1::{BodyDecoder, Decoded};

/// The body of one request on a connection served by [`super::conn`].
pub struct RequestBody {
    /// `None`: the request has no body.
    shared: Option<Arc<Shared>>,
}

impl RequestBody {
    pub(crate) fn empty() -> Self {
        RequestBody { shared: None }
    }

    /// A body whose framing the connection has put in `shared`'s inbound state.
    pub(super) fn streaming(shared: Arc<Shared>) -> Self {
        RequestBody {
            shared: Some(shared),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyReadError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyReadError>>> {
        let Some(shared) = &self.shared else {
            return Poll::Ready(None);
        };
        let mut guard = shared.lock();
        let inbound = &mut *guard;
        loop {
            match inbound.body.decode(&mut inbound.buf) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::End) => return Poll::Ready(None),
                Ok(Decoded::NeedMore) => {}
                // The framing is lost: the body never reaches `Done`, so the connection
                // closes after its answer.
                Err(_) => return Poll::Ready(Some(Err(BodyReadError::Chunked))),
            }
            // The client waits for leave to send: given only now that the body is read.
            if let Err(e) = ready!(inbound.poll_continue(cx)) {
                return Poll::Ready(Some(Err(BodyReadError::Io(e))));
            }
            match ready!(inbound.poll_read(cx)) {
                Ok(0) => return Poll::Ready(Some(Err(BodyReadError::Truncated))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(BodyReadError::Io(e)))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .as_ref()
            .is_none_or(|shared| shared.lock().body == BodyDecoder::Done)
    }

    fn size_hint(&self) -> SizeHint {
        let Some(shared) = &self.shared else {
            return SizeHint::with_exact(0);
        };
        match shared.lock().body {
            BodyDecoder::Length(left) => SizeHint::with_exact(left),
            BodyDecoder::Done => SizeHint::with_exact(0),
            BodyDecoder::Chunked(_) | BodyDecoder::UntilClose => SizeHint::default(),
        }
    }
}
