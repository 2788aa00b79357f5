//! What a compaction did, as the client and the operator are told it: what triggered it,
//! and the fields of the `x-compaction` response header (absent when the request went
//! upstream as sent, `applied; ...` when a rewritten request succeeded, `failed; ...` when
//! no attempt did). Below the metrics, which count by these types.

use std::fmt::Write;

use http::HeaderValue;

use crate::engine::SummarySource;

/// What made the proxy compact a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Predicted before the first upstream call.
    Preflight,
    /// The upstream answered with a context-overflow error.
    Error,
    /// The client asked for a compaction (Codex's remote compaction), and the proxy
    /// answered it for an upstream that could not.
    Client,
}

impl Trigger {
    pub const ALL: [Trigger; 3] = [Trigger::Preflight, Trigger::Error, Trigger::Client];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preflight => "preflight",
            Self::Error => "error",
            Self::Client => "client",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XCompaction {
    pub outcome: Outcome,
    pub trigger: Trigger,
    /// Upstream calls made for this request.
    pub attempts: u32,
    pub messages_before: usize,
    pub messages_after: usize,
    /// `None` when no summary was made (only lossless passes ran).
    pub summary: SummarySource,
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// The completion cap before and after, when the proxy lowered it to fit the window.
    pub output: Option<(u64, u64)>,
    /// The media parts before and after, when the proxy replaced the oldest with
    /// placeholders for an upstream that takes fewer in one request.
    pub media: Option<(u64, u64)>,
}

impl XCompaction {
    pub fn to_header(&self) -> HeaderValue {
        let mut text = String::from(match self.outcome {
            Outcome::Applied => "applied",
            Outcome::Failed => "failed",
        });
        let summary = self.summary.as_str();
        // Writing to a String cannot fail.
        let _ = write!(
            text,
            "; trigger={}; attempts={}; messages={}->{}; summary={}; tokens={}->{}",
            self.trigger.as_str(),
            self.attempts,
            self.messages_before,
            self.messages_after,
            summary,
            self.tokens_before,
            self.tokens_after,
        );
        if let Some((before, after)) = self.output {
            let _ = write!(text, "; output={before}->{after}");
        }
        if let Some((before, after)) = self.media {
            let _ = write!(text, "; media={before}->{after}");
        }
        // Only ASCII digits, letters and punctuation go in, so this cannot fail.
        HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("applied"))
    }
}

impl XCompaction {
    /// A refusal after the proxy had a go, when nothing was measured.
    pub fn failed(attempts: u32, output: Option<(u64, u64)>) -> XCompaction {
        XCompaction {
            outcome: Outcome::Failed,
            trigger: Trigger::Error,
            attempts,
            messages_before: 0,
            messages_after: 0,
            summary: SummarySource::None,
            tokens_before: 0,
            tokens_after: 0,
            output,
            media: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_contract_fields_in_order() {
        let header = XCompaction {
            outcome: Outcome::Applied,
            trigger: Trigger::Error,
            attempts: 2,
            messages_before: 120,
            messages_after: 14,
            summary: SummarySource::Fallback,
            tokens_before: 150_000,
            tokens_after: 30_000,
            output: None,
            media: None,
        }
        .to_header();
        assert_eq!(
            header,
            "applied; trigger=error; attempts=2; messages=120->14; summary=fallback; tokens=150000->30000"
        );
    }

    #[test]
    fn a_lowered_completion_cap_is_its_own_field() {
        let header = XCompaction {
            outcome: Outcome::Applied,
            trigger: Trigger::Preflight,
            attempts: 1,
            messages_before: 5,
            messages_after: 5,
            summary: SummarySource::None,
            tokens_before: 21_000,
            tokens_after: 21_000,
            output: Some((32_000, 6_700)),
            media: None,
        }
        .to_header();
        assert_eq!(
            header,
            "applied; trigger=preflight; attempts=1; messages=5->5; summary=none; tokens=21000->21000; output=32000->6700"
        );
    }

    #[test]
    fn failed_without_summary() {
        let header = XCompaction {
            outcome: Outcome::Failed,
            trigger: Trigger::Preflight,
            attempts: 3,
            messages_before: 3,
            messages_after: 3,
            summary: SummarySource::None,
            tokens_before: 10,
            tokens_after: 10,
            output: None,
            media: None,
        }
        .to_header();
        assert!(header
            .to_str()
            .unwrap()
            .starts_with("failed; trigger=preflight; attempts=3;"));
        assert!(header.to_str().unwrap().contains("summary=none"));
    }
}
