//! After a successful answer: learn how the upstream counts tokens from the `usage` it
//! reports, so that the first overflow of a model whose window is known is predicted
//! rather than suffered. Our estimate (o200k-style) and a local model's tokenizer can
//! differ by a third; without this the factor was only learned from a refusal.
//!
//! The answer streams to the client untouched: the tap only looks at the bytes going by
//! for the last `"prompt_tokens": N` (chat completions) or `"input_tokens": N` (the
//! Responses API) and, when the body ends, records it against our count of what was sent.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use memchr::memmem::Finder;

use crate::app::App;
use crate::body::ProxyBody;
use crate::error::BoxError;
use crate::models::Count;

static KEYS: LazyLock<[Finder<'static>; 2]> = LazyLock::new(|| {
    [
        Finder::new(b"\"prompt_tokens\""),
        Finder::new(b"\"input_tokens\""),
    ]
});
/// Bytes of a frame's end kept for the next one, so a key and its number split across
/// two frames are still found: the longest key, the colon, spaces and a number.
const CARRY: usize = 48;

/// Who learns from the count: the upstream and model the request went to, and our count
/// of what was sent.
pub(super) struct Learn {
    pub app: Arc<App>,
    pub model: String,
    pub ours: u64,
}

/// Wraps `body` so that its reported prompt count calibrates `learn`'s model when it ends.
pub(super) fn tap(body: ProxyBody, learn: Learn) -> ProxyBody {
    UnsyncBoxBody::new(UsageTap {
        inner: body,
        carry: Vec::new(),
        seen: None,
        learn: Some(learn),
    })
}

struct UsageTap {
    inner: ProxyBody,
    /// The end of the previous data frame.
    carry: Vec<u8>,
    /// The last count found so far.
    seen: Option<u64>,
    /// Taken when the body ends, so the count is recorded once.
    learn: Option<Learn>,
}

impl UsageTap {
    fn scan(&mut self, data: &[u8]) {
        if self.carry.is_empty() {
            self.seen = last_count(data).or(self.seen);
        } else {
            // Only the seam needs the joined bytes: the carry and the frame's start.
            let mut seam = std::mem::take(&mut self.carry);
            seam.extend_from_slice(&data[..data.len().min(CARRY)]);
            self.seen = last_count(&seam).or(self.seen);
            self.seen = last_count(data).or(self.seen);
        }
        self.carry = data[data.len().saturating_sub(CARRY)..].to_vec();
    }

    fn finish(&mut self) {
        let (Some(learn), Some(theirs)) = (self.learn.take(), self.seen) else {
            return;
        };
        let upstream = learn.app.upstream.base_url();
        learn
            .app
            .models
            .calibrate(upstream, &learn.model, Count::Usage, learn.ours, theirs);
    }
}

impl Body for UsageTap {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.scan(data);
                }
                // A body that knows its end is not polled past its last frame.
                if self.inner.is_end_stream() {
                    self.finish();
                }
            }
            Poll::Ready(None) => self.finish(),
            _ => {}
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

/// The number after the last usage key in `bytes` with a complete number after it.
fn last_count(bytes: &[u8]) -> Option<u64> {
    KEYS.iter()
        .flat_map(|key| {
            key.find_iter(bytes).filter_map(move |at| {
                number_after(&bytes[at + key.needle().len()..]).map(|n| (at, n))
            })
        })
        .max_by_key(|(at, _)| *at)
        .map(|(_, n)| n)
}

/// `: 123` followed by a byte that ends the number.
fn number_after(rest: &[u8]) -> Option<u64> {
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // A number at the very end may go on in the next frame.
    if digits == 0 || digits == rest.len() {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(frames: &[&[u8]]) -> Option<u64> {
        let mut tap = UsageTap {
            inner: crate::body::full(Bytes::new()),
            carry: Vec::new(),
            seen: None,
            learn: None,
        };
        for f in frames {
            tap.scan(f);
        }
        tap.seen
    }

    #[test]
    fn finds_the_last_count_of_either_api() {
        let chat = br#"{"choices":[],"usage":{"prompt_tokens": 1234,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens":5}}"#;
        assert_eq!(scanned(&[chat]), Some(1234));
        let responses = br#"data: {"type":"response.completed","response":{"usage":{"input_tokens":77,"input_tokens_details":{"cached_tokens":0}}}}"#;
        assert_eq!(scanned(&[responses]), Some(77));
        assert_eq!(
            scanned(&[b"{\"prompt_tokens\":1}", b"{\"prompt_tokens\":2}"]),
            Some(2)
        );
        assert_eq!(scanned(&[b"no usage here"]), None);
    }

    #[test]
    fn every_split_finds_the_count() {
        let body = br#"data: {"usage":{"prompt_tokens":4096,"completion_tokens":12}}"#;
        for k in 0..=body.len() {
            assert_eq!(
                scanned(&[&body[..k], &body[k..]]),
                Some(4096),
                "split at {k}"
            );
        }
    }
}
