//! One compaction towards a goal, driven through the [`Compactor`]: the rewritten view is
//! given the completion cap that fits beside it, encoded in the client's dialect, and
//! becomes what the next attempt sends, with the checkpoint it makes kept until the
//! upstream takes it.

use super::policy::Goal;
use super::{Attempt, Engine};
use crate::checkpoint;
use crate::compactor::{Compaction, Declined, Keys, Limits, Order};
use crate::engine::{self, budget};

impl Attempt<'_> {
    /// Runs the compactor on the base towards `goal`, then lowers the completion cap if
    /// prompt plus cap would still overflow the window (the engine may have kept the turn
    /// in progress by taking room from the answer). `false` when there is nothing new to
    /// send.
    pub(super) async fn rewrite(&mut self, goal: Goal) -> bool {
        // Boxed: the compactor's future (a summariser call among it) is the largest
        // state of a request, and inline it would be moved with every future around
        // it, on every request, whether it ever compacts or not (see docs/performance.md).
        let Some(compaction) = Box::pin(self.compact(goal)).await else {
            return false;
        };
        let report = compaction.report;
        if report.summary != engine::SummarySource::None
            && checkpoint::poor_savings_after(0, report.tokens_before, report.tokens_after) > 0
        {
            self.done.digest_only = true;
        }
        if matches!(self.done.engine, Engine::Unused) {
            self.done.engine = Engine::Ran;
        }
        let compacted = compaction.view.is_some();
        let Some(mut request) = compaction
            .view
            .or_else(|| self.work.parsed().map(|b| b.view.clone()))
        else {
            return false;
        };
        if let Some(window) = goal.window {
            let prompt = (report.tokens_after as f64 * self.ctx.factor().0) as u64;
            if let Some((before, after)) = budget::fit_output(&mut request, window.0, prompt) {
                self.lowered(before, after);
            }
        }
        let Some(bytes) = self.work.encode(self.ctx.dialect, &request) else {
            return false;
        };
        if bytes[..] == self.work.body[..] {
            return false;
        }
        self.work.body = bytes;
        if !compacted {
            // Only the completion cap changed: the next compaction starts from it.
            if let Some(base) = self.work.parsed_mut() {
                base.view = request;
            }
            return true;
        }
        let rewrites = match &self.done.engine {
            Engine::Rewrote { rewrites, .. } => rewrites + 1,
            _ => 1,
        };
        self.done.engine = Engine::Rewrote {
            rewrites,
            report,
            pending: compaction.checkpoint.map(Box::new),
        };
        true
    }

    /// Whether this compaction may wait for the LLM summariser. Not when the request is
    /// past asking for one; nor on a retry after a refusal in a conversation followed from
    /// turn to turn whose events can be prepared: the refused turn (often the one that
    /// teaches the window, when nothing could be prepared yet) takes the digest at once,
    /// and the summariser's turn comes with the conversation's next event, prepared in the
    /// background from the checkpoint this one makes, so that no turn waits for it.
    fn asks_summariser(&self) -> bool {
        let prepared = self.ctx.app.prepared().is_some();
        // The refused turn of a conversation whose next event can be prepared.
        let stands_in = self.done.calls > 0 && prepared && self.ctx.growth.is_some();
        !self.done.digest_only && !stands_in
    }

    /// The compactor's work on the base towards `goal`, with an LLM summary unless this
    /// request is past asking for one. `None` when it made nothing.
    async fn compact(&mut self, goal: Goal) -> Option<Compaction> {
        let dialect = self.ctx.dialect;
        self.work.tokens(dialect)?;
        let partition = *self
            .work
            .partition
            .get_or_insert_with(|| self.ctx.partition());
        // The checkpoint is keyed by the client's own messages, whose hashes are the
        // base's: computed before the base moves to the compactor.
        let keyed =
            self.ctx.app.checkpoints.is_some() && self.work.hashes(dialect, partition).is_some();
        let base = self.work.take()?;
        let caller = self.ctx.caller(partition);
        let keys = keyed.then(|| Keys {
            partition,
            hashes: self.work.hashes.as_deref().unwrap_or_default(),
            resumed: self.done.resumed.as_ref(),
            summariser_failed: self.done.summariser_failed,
        });
        let max_messages = self.message_cap();
        let with_cap = |options: engine::Options| engine::Options {
            max_messages,
            ..options
        };
        let limits = goal.limits();
        let order = Order {
            limits: Limits {
                deep: with_cap(limits.deep),
                relaxed: limits.relaxed.map(with_cap),
            },
            window: goal.window,
            summariser: self.asks_summariser().then_some(&caller),
            original: Some(self.work.original().clone()),
            waited_for: true,
            keys,
        };
        let (base, result) = self.ctx.app.compactor().compact(base, order).await;
        if let Some(base) = base {
            self.work.restore(base);
        }
        match result {
            Ok(compaction) => {
                self.done.summariser_failed |= compaction.summariser_failed;
                Some(compaction)
            }
            // The base went down with the engine's task: the next attempts send what was
            // last built, and compact no more.
            Err(e @ Declined::Lost(_)) => {
                tracing::error!(id = self.ctx.id, error = %e, "no compaction");
                None
            }
            Err(e) => {
                tracing::debug!(id = self.ctx.id, reason = %e, "no compaction");
                None
            }
        }
    }
}
