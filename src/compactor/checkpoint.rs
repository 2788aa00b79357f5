//! The checkpoint a compaction makes: the form that now stands for a prefix of the
//! client's messages, keyed by the hash of that prefix as the client sent it.

use serde_json::Value;

use super::{Base, Keys};
use crate::checkpoint::{self, Checkpoint, Key};
use crate::engine::{Counter, Report, SummarySource};

/// A checkpoint made by a compaction, with the stored one it supersedes.
pub struct NewCheckpoint {
    pub key: Key,
    pub checkpoint: Checkpoint,
    pub replaces: Option<Key>,
}

/// The checkpoint `output` makes of `base`, the client's messages (resumed from
/// `keys.resumed` when it was). `None` when the base was not counted, or the output keeps
/// nothing of the client's messages to key it by.
pub(super) fn derive(
    base: &Base,
    keys: &Keys<'_>,
    output: &Value,
    report: &Report,
    summariser_failed: bool,
) -> Option<NewCheckpoint> {
    let input = messages_of(&base.view)?;
    let counts = base.counts.as_deref()?;
    let hit = keys.resumed;
    let (replaced, form) = checkpoint::derive(input, messages_of(output)?, hit.map(|h| h.applied))?;
    let (prefix_len, form_len, earlier_tokens) = match hit {
        Some(hit) => (
            hit.applied.prefix_len,
            hit.applied.form_len,
            hit.checkpoint.prefix_tokens,
        ),
        None => (0, 0, 0),
    };
    // The client's messages between the old prefix and the new one are, in the request
    // compacted, the ones right after the old form.
    let newly = form_len..form_len + (replaced - prefix_len);
    let prefix_tokens = earlier_tokens + counts.get(newly.clone())?.iter().sum::<usize>();
    let next_role = input
        .get(newly.end)
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let form_counts = Counter::for_request(output).messages(&form);
    // A new summary, or the one the resumed form carried.
    let (summary, failed) = match (report.summary, hit) {
        (SummarySource::Llm | SummarySource::Fallback, _) => (report.summary, summariser_failed),
        (_, Some(hit)) => (hit.checkpoint.summary, hit.checkpoint.summariser_failed),
        (_, None) => (SummarySource::None, false),
    };
    let poor_savings = checkpoint::poor_savings_after(
        hit.map_or(0, |h| h.checkpoint.poor_savings),
        report.tokens_before,
        report.tokens_after,
    );
    Some(NewCheckpoint {
        key: Key {
            partition: keys.partition,
            prefix: *keys.hashes.get(replaced)?,
        },
        checkpoint: Checkpoint::new(
            replaced,
            prefix_tokens,
            form,
            form_counts,
            next_role,
            poor_savings,
        )
        .with_summary(summary, failed),
        replaces: hit.map(|h| h.key),
    })
}

/// A chat view's messages.
pub fn messages_of(request: &Value) -> Option<&Vec<Value>> {
    request.get("messages").and_then(Value::as_array)
}
