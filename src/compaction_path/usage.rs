//! After a successful answer: learn how the upstream counts tokens from the `usage` it
//! reports, so that the first overflow of a model whose window is known is predicted
//! rather than suffered. Our estimate (o200k-style) and a local model's tokenizer can
//! differ by a third; without this the factor was only learned from a refusal.
//!
//! The answer streams to the client untouched: the tap only looks at the bytes going by
//! for the last `"prompt_tokens": N` (chat completions) or `"input_tokens": N` (the
//! Responses API, Messages) and, when the body ends, records it against our count of what
//! was sent. Anthropic's `input_tokens` leaves out the prompt it read from or wrote to its
//! cache, which it reports beside it (`cache_read_input_tokens`,
//! `cache_creation_input_tokens`): the prompt is the sum.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use memchr::memmem::Finder;

use crate::app::App;
use crate::body::ProxyBody;
use crate::cause::BoxError;
use crate::windows::Count;

/// The keys of the prompt's count, in the parts [`Seen`] keeps: the count, then the two
/// parts of it Anthropic reports apart.
static KEYS: LazyLock<[(Finder<'static>, usize); 4]> = LazyLock::new(|| {
    [
        (Finder::new(b"\"prompt_tokens\""), 0),
        (Finder::new(b"\"input_tokens\""), 0),
        (Finder::new(b"\"cache_read_input_tokens\""), 1),
        (Finder::new(b"\"cache_creation_input_tokens\""), 2),
    ]
});
/// Bytes of a frame's end kept for the next one, so a key and its number split across
/// two frames are still found: the longest key, the colon, spaces and a number.
const CARRY: usize = 64;

/// The last value seen of each part of the prompt's count.
type Seen = [Option<u64>; 3];

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
        seen: Seen::default(),
        learn: Some(learn),
    })
}

struct UsageTap {
    inner: ProxyBody,
    /// The end of the previous data frame.
    carry: Vec<u8>,
    /// The last count found so far, by part.
    seen: Seen,
    /// Taken when the body ends, so the count is recorded once.
    learn: Option<Learn>,
}

impl UsageTap {
    fn scan(&mut self, data: &[u8]) {
        if !self.carry.is_empty() {
            // Only the seam needs the joined bytes: the carry and the frame's start.
            let mut seam = std::mem::take(&mut self.carry);
            seam.extend_from_slice(&data[..data.len().min(CARRY)]);
            last_counts(&seam, &mut self.seen);
        }
        last_counts(data, &mut self.seen);
        self.carry = data[data.len().saturating_sub(CARRY)..].to_vec();
    }

    /// The prompt's count: the count, with the parts reported beside it.
    fn theirs(&self) -> Option<u64> {
        let [count, read, written] = self.seen;
        Some(count? + read.unwrap_or(0) + written.unwrap_or(0))
    }

    fn finish(&mut self) {
        let (Some(learn), Some(theirs)) = (self.learn.take(), self.theirs()) else {
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

/// Updates each part of `seen` with the number after the last key of that part in
/// `bytes` that has a complete number after it.
fn last_counts(bytes: &[u8], seen: &mut Seen) {
    for (part, slot) in seen.iter_mut().enumerate() {
        let last = KEYS
            .iter()
            .filter(|(_, p)| *p == part)
            .flat_map(|(key, _)| {
                key.find_iter(bytes).filter_map(move |at| {
                    number_after(&bytes[at + key.needle().len()..]).map(|n| (at, n))
                })
            })
            .max_by_key(|(at, _)| *at)
            .map(|(_, n)| n);
        *slot = last.or(*slot);
    }
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
            seen: Seen::default(),
            learn: None,
        };
        for f in frames {
            tap.scan(f);
        }
        tap.theirs()
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
    fn an_anthropic_prompt_counts_what_its_cache_read_and_wrote() {
        let start = br#"event: message_start
data: {"type":"message_start","message":{"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":9000,"cache_creation":{"ephemeral_5m_input_tokens":300},"output_tokens":1}}}

"#;
        let delta = br#"event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":40}}

"#;
        assert_eq!(scanned(&[start, delta]), Some(9312));
        for k in 0..=start.len() {
            assert_eq!(
                scanned(&[&start[..k], &start[k..]]),
                Some(9312),
                "split at {k}"
            );
        }
        let uncached = br#"{"type":"message","usage":{"input_tokens":500,"output_tokens":3}}"#;
        assert_eq!(scanned(&[uncached]), Some(500));
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
