//! What was done to a request, told once: the `x-compaction` response header (absent
//! when the request went upstream as sent, `applied; ...` when a rewritten request
//! succeeded, `failed; ...` when no attempt did), the metrics and the log line.

use std::fmt::Write;

use http::HeaderValue;

use super::{Attempt, Engine};
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
        // Only ASCII digits, letters and punctuation go in, so this cannot fail.
        HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("applied"))
    }
}

impl XCompaction {
    /// A refusal after the proxy had a go, when nothing was measured.
    pub(super) fn failed(attempts: u32, output: Option<(u64, u64)>) -> XCompaction {
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
        }
    }
}

impl Attempt<'_> {
    /// The header's fields, `None` while nothing was done to the request.
    pub(super) fn x_compaction(&self, outcome: Outcome) -> Option<XCompaction> {
        let done = &self.done;
        let trigger = done.trigger?;
        let report = done.report();
        let hit = done.resumed.as_ref();
        // A resumed request is measured from the client's own; one compacted again after
        // that says where its summary came from, one sent as resumed says `cache`, unless
        // the stored summary is the digest: a degraded summary stays visible as such.
        let stored = |hit: &super::Hit| match hit.checkpoint.summary {
            SummarySource::Llm | SummarySource::Cache => SummarySource::Cache,
            SummarySource::Fallback | SummarySource::CachedFallback => {
                SummarySource::CachedFallback
            }
            SummarySource::None => SummarySource::None,
        };
        let summary = match (report, hit) {
            // Compacted again without a new summary: the stored one is what it carries.
            (Some(r), Some(hit)) if r.summary == SummarySource::None => stored(hit),
            (Some(r), _) => r.summary,
            // A compaction prepared ahead: its summary is new in this request.
            (None, Some(hit)) if done.promote.is_some() => hit.checkpoint.summary,
            (None, Some(hit)) => stored(hit),
            (None, None) => SummarySource::None,
        };
        // Without a compaction the messages went as they were (resumed, or with only the
        // completion cap lowered).
        let base = self.work.parsed();
        let sent_messages = || {
            base.and_then(|b| super::work::messages_of(&b.view))
                .map_or(0, Vec::len)
        };
        let sent_tokens = base.and_then(|b| b.tokens).unwrap_or(0);
        Some(XCompaction {
            outcome,
            trigger,
            attempts: done.calls,
            messages_before: hit.map_or_else(
                || report.map_or_else(sent_messages, |r| r.messages_before),
                |h| h.messages_before,
            ),
            messages_after: report.map_or_else(sent_messages, |r| r.messages_after),
            summary,
            tokens_before: hit.map_or(
                report.map_or(sent_tokens, |r| r.tokens_before as u64),
                |h| h.tokens_before,
            ),
            tokens_after: report.map_or(sent_tokens, |r| r.tokens_after as u64),
            output: done.output,
        })
    }

    /// The metrics and the log line for what was done.
    pub(super) fn record(&self, x: &XCompaction) {
        let metrics = &self.ctx.app.metrics;
        let done = &self.done;
        let rewritten = matches!(done.engine, Engine::Rewrote { .. });
        if rewritten || done.resumed.is_some() || done.output.is_some() {
            metrics.compaction(x.trigger);
            metrics.compaction_of_api(self.ctx.dialect);
            metrics.summary(x.summary);
            metrics.tokens_saved(x.tokens_before.saturating_sub(x.tokens_after));
        }
        if done.output.is_some() {
            metrics.output_lowered(x.trigger);
        }
        let passes = done.report().map(|r| r.notes.join("; "));
        tracing::info!(
            id = self.ctx.id,
            outcome = ?x.outcome,
            api = self.ctx.dialect.as_str(),
            trigger = x.trigger.as_str(),
            attempts = x.attempts,
            messages_before = x.messages_before,
            messages_after = x.messages_after,
            tokens_before = x.tokens_before,
            tokens_after = x.tokens_after,
            summary = x.summary.as_str(),
            passes = passes.as_deref().unwrap_or(""),
            output = ?done.output,
            window = ?self.ctx.window(),
            "compaction"
        );
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
        }
        .to_header();
        assert!(header
            .to_str()
            .unwrap()
            .starts_with("failed; trigger=preflight; attempts=3;"));
        assert!(header.to_str().unwrap().contains("summary=none"));
    }
}
