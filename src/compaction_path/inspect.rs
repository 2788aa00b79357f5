//! Reading just enough of an upstream answer to know whether compaction could fix it,
//! before the client is sent a status line. Successful non-streaming answers are not
//! read at all; a stream is held until its first real event (bounded in bytes and
//! time); an error body is read whole (bounded) so it can be returned unchanged.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::response::Parts;
use http::{header, Response};
use http_body_util::BodyExt;

use crate::body::{self, ProxyBody, Replay};
use crate::classify::{self, Classification, Kind, StreamHead};
use crate::error::ProxyError;

/// Error bodies larger than this are not errors compaction can fix: they pass through.
const MAX_ERROR_BODY: usize = 256 * 1024;

pub enum Verdict {
    /// Give this answer to the client as it is (bytes already read are replayed first).
    Deliver(Response<ProxyBody>),
    /// The upstream refused the request for a reason compaction may fix. The answer is
    /// kept whole so that, if no retry succeeds, the client gets it unchanged.
    Refused {
        parts: Parts,
        body: Bytes,
        class: Classification,
    },
}

/// Looks at an upstream answer to a chat request. `hold` bounds how long a stream's
/// status line is held back waiting for the first decisive event.
pub async fn inspect(
    response: Response<ProxyBody>,
    streaming: bool,
    hold: Duration,
) -> Result<Verdict, ProxyError> {
    let status = response.status();
    // Looked up once, for the check below and the classifier: each lookup hashes the
    // name. A clone of the value is a count on the head's bytes, not a copy.
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let content_type = content_type.as_ref().and_then(|v| v.to_str().ok());
    if status.is_success() && !streaming && !small_json(&response, content_type) {
        return Ok(Verdict::Deliver(response));
    }
    let (parts, mut body) = response.into_parts();
    if status.is_success() && streaming {
        let (head, class) = hold_stream_head(&mut body, hold).await?;
        return match class {
            Some(class) if class.kind != Kind::Other => {
                let (read, complete) = read_to_end(&mut body, head, MAX_ERROR_BODY).await?;
                Ok(refused_or_deliver(parts, read, complete, body, class))
            }
            _ => Ok(Verdict::Deliver(Response::from_parts(
                parts,
                Replay::new(head, body).boxed_unsync(),
            ))),
        };
    }
    let (read, complete) = read_to_end(&mut body, Bytes::new(), MAX_ERROR_BODY).await?;
    let class = classify::classify(status.as_u16(), content_type, &read);
    tracing::debug!(status = status.as_u16(), kind = ?class.kind, reason = class.reason, "upstream answer classified");
    Ok(refused_or_deliver(parts, read, complete, body, class))
}

fn refused_or_deliver(
    parts: Parts,
    read: Bytes,
    complete: bool,
    rest: ProxyBody,
    class: Classification,
) -> Verdict {
    // An answer longer than the bound still has unread bytes: it is passed on whole
    // rather than judged on a fragment.
    if class.kind == Kind::Other || !complete {
        return Verdict::Deliver(Response::from_parts(
            parts,
            Replay::new(read, rest).boxed_unsync(),
        ));
    }
    Verdict::Refused {
        parts,
        body: read,
        class,
    }
}

/// A successful non-streaming answer is read before it is passed on only when it is
/// small JSON of known length: a few servers report an overflow inside a 200 (an empty
/// completion stopped for `length`, a provider status code in the body). Larger or
/// unsized answers pass untouched.
fn small_json(response: &Response<ProxyBody>, content_type: Option<&str>) -> bool {
    let json = content_type.is_some_and(|v| v.starts_with("application/json"));
    let small = http_body::Body::size_hint(response.body())
        .exact()
        .is_some_and(|n| n <= classify::SCAN_LIMIT as u64);
    json && small
}

/// Reads a stream until its head is decisive: real output (pass), an in-band error
/// (classified), the end, or `hold` elapsing (pass: a slow first token is not an error).
async fn hold_stream_head(
    body: &mut ProxyBody,
    hold: Duration,
) -> Result<(Bytes, Option<Classification>), ProxyError> {
    let mut buf = BytesMut::new();
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Ok((buf.freeze(), None)),
            Ok(frame) => frame,
        };
        let eof = match frame {
            None => true,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
                false
            }
            Some(Err(e)) => return Err(ProxyError::UpstreamUnreachable(e)),
        };
        match classify::inspect_stream_head(&buf, eof) {
            StreamHead::NeedMore if !eof => continue,
            StreamHead::Error(class) => return Ok((buf.freeze(), Some(class))),
            _ => return Ok((buf.freeze(), None)),
        }
    }
}

/// Appends the rest of `body` to `head`, up to about `limit` bytes in all; stops early
/// past the limit, leaving the rest unread. Says whether the body was read to its end.
pub(super) async fn read_to_end(
    body: &mut ProxyBody,
    head: Bytes,
    limit: usize,
) -> Result<(Bytes, bool), ProxyError> {
    // A small answer usually comes in one frame, which is then kept as it is; a second
    // one starts a copy.
    let mut read = head;
    let mut joined: Option<BytesMut> = None;
    let complete = loop {
        if joined.as_ref().map_or(read.len(), BytesMut::len) > limit {
            break false;
        }
        match body.frame().await {
            None => break true,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if read.is_empty() && joined.is_none() => read = data,
                Ok(data) => joined
                    .get_or_insert_with(|| BytesMut::from(&read[..]))
                    .extend_from_slice(&data),
                Err(_) => {}
            },
            Some(Err(e)) => return Err(ProxyError::UpstreamUnreachable(e)),
        }
    };
    Ok((joined.map_or(read, BytesMut::freeze), complete))
}

/// Rebuilds a refused answer for the client, exactly as the upstream sent it.
pub fn deliver_refused(parts: Parts, body: Bytes) -> Response<ProxyBody> {
    Response::from_parts(parts, body::full(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::StreamBody;

    fn frames(parts: &[&'static [u8]]) -> ProxyBody {
        let frames = parts
            .iter()
            .map(|p| Ok::<_, crate::cause::BoxError>(Frame::data(Bytes::from_static(p))))
            .collect::<Vec<_>>();
        StreamBody::new(stream::iter(frames)).boxed_unsync()
    }

    #[tokio::test]
    async fn reads_one_frame_or_joins_several() {
        let mut one = frames(&[b"{\"a\":1}"]);
        let read = read_to_end(&mut one, Bytes::new(), 100).await.unwrap();
        assert_eq!(read, (Bytes::from_static(b"{\"a\":1}"), true));

        let mut several = frames(&[b"ab", b"", b"cd"]);
        let read = read_to_end(&mut several, Bytes::from_static(b"x"), 100)
            .await
            .unwrap();
        assert_eq!(read, (Bytes::from_static(b"xabcd"), true));
    }

    #[tokio::test]
    async fn stops_past_the_limit_leaving_the_rest_unread() {
        let mut body = frames(&[b"ab", b"cd", b"ef"]);
        let read = read_to_end(&mut body, Bytes::new(), 3).await.unwrap();
        assert_eq!(read, (Bytes::from_static(b"abcd"), false));
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(rest, Bytes::from_static(b"ef"));
    }
}
