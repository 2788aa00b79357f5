//! What was done to a request, told once: the `x-compaction` header's fields read off the
//! loop's state, and [`record`], the metrics and the one log line of a compaction, for
//! the loop and for Codex's compaction requests alike.

use super::done::Done;
use super::Ctx;
use crate::compaction_report::{Outcome, XCompaction};
use crate::compactor::{messages_of, Base, Resumed};
use crate::dialect::Dialect;
use crate::engine::SummarySource;
use crate::metrics::Metrics;
use crate::units::Window;

/// What a compaction's log line says beside the header's fields.
pub(super) struct LogLine<'a> {
    pub id: u64,
    pub dialect: Dialect,
    /// What each pass of the engine did.
    pub passes: &'a str,
    pub window: Option<Window>,
    /// Which of Codex's compaction requests was answered, if one was.
    pub ask: &'static str,
}

/// The metrics and the log line of what was done to a request. `changed`: what went
/// upstream was not the client's own request (a compaction the metrics count).
pub(super) fn record(metrics: &Metrics, x: &XCompaction, changed: bool, line: &LogLine<'_>) {
    if changed {
        metrics.compaction(x.trigger);
        metrics.compaction_of_api(line.dialect);
        metrics.summary(x.summary);
        metrics.tokens_saved(x.tokens_before.saturating_sub(x.tokens_after));
    }
    if x.output.is_some() {
        metrics.output_lowered(x.trigger);
    }
    crate::telemetry::compaction(x);
    tracing::info!(
        id = line.id,
        outcome = ?x.outcome,
        api = line.dialect.as_str(),
        trigger = x.trigger.as_str(),
        attempts = x.attempts,
        messages_before = x.messages_before,
        messages_after = x.messages_after,
        tokens_before = x.tokens_before,
        tokens_after = x.tokens_after,
        summary = x.summary.as_str(),
        passes = line.passes,
        output = ?x.output,
        window = ?line.window.map(|w| w.0),
        ask = line.ask,
        "compaction"
    );
}

/// The summary a resumed request carries, as the header reports it: `cache`, unless the
/// stored summary is the digest (a degraded summary stays visible as such).
fn stored(hit: &Resumed) -> SummarySource {
    match hit.checkpoint.summary {
        SummarySource::Llm | SummarySource::Cache => SummarySource::Cache,
        SummarySource::Fallback | SummarySource::CachedFallback => SummarySource::CachedFallback,
        SummarySource::None => SummarySource::None,
    }
}

/// The header's fields for what was `done` to a request whose base (the request as sent
/// when nothing compacted it) is `base`; `None` while nothing was done to it.
pub(super) fn x_compaction(
    done: &Done,
    base: Option<&Base>,
    outcome: Outcome,
) -> Option<XCompaction> {
    let trigger = done.trigger?;
    let report = done.report();
    let hit = done.resumed.as_ref();
    // A resumed request is measured from the client's own; one compacted again after that
    // says where its summary came from, one sent as resumed what it carries.
    let summary = match (report, hit) {
        // A compaction prepared ahead, pruned on: its summary is new in this request.
        (Some(r), Some(hit)) if r.summary == SummarySource::None && done.promote.is_some() => {
            hit.checkpoint.summary
        }
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
    let sent_messages = || base.and_then(|b| messages_of(&b.view)).map_or(0, Vec::len);
    let sent_tokens = base.and_then(|b| b.tokens).map_or(0, |t| t.0);
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
            |h| h.tokens_before.0,
        ),
        tokens_after: report.map_or(sent_tokens, |r| r.tokens_after as u64),
        output: done.output,
        media: done.media,
    })
}

/// The metrics and the log line for what was `done` to the request of `ctx`.
pub(super) fn record_request(ctx: &Ctx<'_>, done: &Done, x: &XCompaction) {
    let passes = done.report().map(|r| r.notes.join("; "));
    let line = LogLine {
        id: ctx.id,
        dialect: ctx.dialect,
        passes: passes.as_deref().unwrap_or(""),
        window: ctx.window(),
        ask: "",
    };
    record(&ctx.app.metrics, x, done.changed(), &line);
}
