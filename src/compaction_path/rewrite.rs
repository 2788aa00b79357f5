//! One compaction towards a goal, driven through the [`Compactor`](crate::compactor): what
//! it made is handed to the request's owner, which gives the rewritten view the completion
//! cap that fits beside it, encodes it in the client's dialect and makes it what the next
//! attempt sends, with the checkpoint it makes kept until the upstream takes it.

use super::count_caps;
use super::policy::Goal;
use super::work::Work;
use super::Ctx;
use crate::compactor::{Compaction, Declined, Keys, Limits, Order, Resumed};
use crate::engine;

/// What a compaction reads of what was done to the request.
#[derive(Clone, Copy)]
pub(super) struct Done<'r> {
    /// The checkpoint the request was resumed from.
    pub resumed: Option<&'r Resumed>,
    /// Upstream calls made.
    pub calls: u32,
    /// The request is past asking for an LLM summary.
    pub digest_only: bool,
    /// The summariser failed for this request before.
    pub summariser_failed: bool,
}

/// Whether this compaction may wait for the LLM summariser. Not when the request is past
/// asking for one; nor on a retry after a refusal in a conversation followed from turn to
/// turn whose events can be prepared: the refused turn (often the one that teaches the
/// window, when nothing could be prepared yet) takes the digest at once, and the
/// summariser's turn comes with the conversation's next event, prepared in the background
/// from the checkpoint this one makes, so that no turn waits for it.
fn asks_summariser(ctx: &Ctx<'_>, done: Done<'_>) -> bool {
    let prepared = ctx.app.prepared().is_some();
    // The refused turn of a conversation whose next event can be prepared.
    let stands_in = done.calls > 0 && prepared && ctx.growth.is_some();
    !done.digest_only && !stands_in
}

/// The compactor's work on the base towards `goal`, with an LLM summary unless the
/// request is past asking for one. `None` when it made nothing.
pub(super) async fn compact(
    ctx: &Ctx<'_>,
    work: &mut Work,
    done: Done<'_>,
    goal: Goal,
) -> Option<Compaction> {
    let dialect = ctx.dialect;
    work.tokens(dialect)?;
    let partition = *work.partition.get_or_insert_with(|| ctx.partition());
    // The checkpoint is keyed by the client's own messages, whose hashes are the base's:
    // computed before the base moves to the compactor.
    let keyed = ctx.app.checkpoints.is_some() && work.hashes(dialect, partition).is_some();
    let base = work.take()?;
    let caller = ctx.caller(partition);
    let keys = keyed.then(|| Keys {
        partition,
        hashes: work.hashes.as_deref().unwrap_or_default(),
        resumed: done.resumed,
        summariser_failed: done.summariser_failed,
    });
    let order = Order {
        limits: limits(ctx, goal),
        window: goal.window,
        summariser: asks_summariser(ctx, done).then_some(&caller),
        original: Some(work.original().clone()),
        waited_for: true,
        keys,
    };
    let (base, result) = ctx.app.compactor().compact(base, order).await;
    if let Some(base) = base {
        work.restore(base);
    }
    match result {
        Ok(compaction) => Some(compaction),
        // The base went down with the engine's task: the next attempts send what was
        // last built, and compact no more.
        Err(e @ Declined::Lost(_)) => {
            tracing::error!(id = ctx.id, error = %e, "no compaction");
            None
        }
        Err(e) => {
            tracing::debug!(id = ctx.id, reason = %e, "no compaction");
            None
        }
    }
}

/// The compactor's limits for `goal`, kept to the model's cap on messages per request.
fn limits(ctx: &Ctx<'_>, goal: Goal) -> Limits {
    let max_messages = count_caps::message_cap(ctx);
    let with_cap = |options: engine::Options| engine::Options {
        max_messages,
        ..options
    };
    let limits = goal.limits();
    Limits {
        deep: with_cap(limits.deep),
        relaxed: limits.relaxed.map(with_cap),
    }
}
