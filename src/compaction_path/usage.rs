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

use std::sync::{Arc, LazyLock};

use memchr::memmem::Finder;

use crate::app::App;
use crate::body::{self, Ending, ProxyBody, Watcher};
use crate::usage_scan::UsageScan;
use crate::windows::Count;

/// The keys of the prompt's count, in the parts the scan keeps: the count, then the two
/// parts of it Anthropic reports apart.
static KEYS: LazyLock<[(Finder<'static>, usize); 4]> = LazyLock::new(|| {
    [
        (Finder::new(b"\"prompt_tokens\""), 0),
        (Finder::new(b"\"input_tokens\""), 0),
        (Finder::new(b"\"cache_read_input_tokens\""), 1),
        (Finder::new(b"\"cache_creation_input_tokens\""), 2),
    ]
});

/// Who learns from the count: the upstream and model the request went to, and our count
/// of what was sent.
pub(super) struct Learn {
    pub app: Arc<App>,
    pub model: String,
    pub ours: u64,
}

/// Wraps `body` so that its reported prompt count calibrates `learn`'s model when it ends.
pub(super) fn tap(answer: ProxyBody, learn: Learn) -> ProxyBody {
    body::watched(
        answer,
        UsageTap {
            scan: UsageScan::new(&*KEYS),
            learn,
        },
    )
}

struct UsageTap {
    scan: UsageScan<3>,
    learn: Learn,
}

/// The prompt's count: the count, with the parts reported beside it.
fn prompt_count([count, read, written]: [Option<u64>; 3]) -> Option<u64> {
    Some(count? + read.unwrap_or(0) + written.unwrap_or(0))
}

impl Watcher for UsageTap {
    fn frame(&mut self, data: &[u8]) {
        self.scan.scan(data);
    }

    /// Only a whole answer's count is comparable with ours.
    fn end(&mut self, ending: Ending) {
        let (Ending::Complete, Some(theirs)) = (ending, prompt_count(self.scan.seen())) else {
            return;
        };
        let learn = &self.learn;
        let upstream = learn.app.upstream.base_url();
        learn
            .app
            .models
            .calibrate(upstream, &learn.model, Count::Usage, learn.ours, theirs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(frames: &[&[u8]]) -> Option<u64> {
        let mut scan = UsageScan::<3>::new(&*KEYS);
        for f in frames {
            scan.scan(f);
        }
        prompt_count(scan.seen())
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
