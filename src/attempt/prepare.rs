//! Compaction as a prepared event. Past the prepare mark, the request is sent as it is and
//! the compaction the threshold will call for is made in the background, on a copy of the
//! request, by the same engine and summariser ([`crate::checkpoint::prepared`] keeps the
//! result aside). The turn that crosses the threshold puts the prepared checkpoint in place
//! of the client's prefix, as a resumed conversation would be, and goes without waiting
//! for a summary; the upstream taking it makes it the conversation's checkpoint.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Request;

use super::work::{messages_of, Work};
use super::{Attempt, Ctx, Done, Engine, Goal, Promote};
use crate::app::App;
use crate::checkpoint::prepared::Fate;
use crate::checkpoint::{Checkpoint, Key};
use crate::wire::{Dialect, Head};

impl Attempt<'_> {
    /// Starts the background compaction of this request towards `goal`, unless the
    /// conversation has one prepared or running, or every preparation slot is busy.
    pub(super) fn prepare(&mut self, goal: Goal) {
        let app = self.ctx.app;
        let Some(prepared) = app.checkpoints.as_ref().and_then(|c| c.prepared.as_ref()) else {
            return;
        };
        let dialect = self.ctx.dialect;
        let partition = *self
            .work
            .partition
            .get_or_insert_with(|| self.ctx.partition());
        let Some(hashes) = self.work.hashes(dialect, partition) else {
            return;
        };
        if prepared.holds(partition, hashes) {
            return;
        }
        let Some(&prefix) = hashes.last() else {
            return;
        };
        let key = Key { partition, prefix };
        let Some(ticket) = prepared.start(key) else {
            return;
        };
        let job = Job {
            app: Arc::clone(app),
            parts: copy(self.ctx.parts),
            original: self.work.original().clone(),
            head: self.ctx.head.clone(),
            dialect,
            id: self.ctx.id,
        };
        let task = tokio::spawn(async move {
            let checkpoint = job.run(goal).await;
            if let Some(prepared) = job
                .app
                .checkpoints
                .as_ref()
                .and_then(|c| c.prepared.as_ref())
            {
                prepared.finish(ticket, checkpoint);
            }
        });
        prepared.running(key, task.abort_handle());
        tracing::debug!(id = self.ctx.id, "preparing the next compaction");
    }

    /// At the threshold: puts the prepared checkpoint in place, waiting for its
    /// preparation if it is still running. `true` when the request then fits and goes as
    /// it is; `false` when there was none, or it no longer fits (the engine then compacts
    /// on from it, without a second summariser call).
    pub(super) async fn use_prepared(&mut self, goal: Goal) -> bool {
        let app = self.ctx.app;
        let Some(prepared) = app.checkpoints.as_ref().and_then(|c| c.prepared.as_ref()) else {
            return false;
        };
        let dialect = self.ctx.dialect;
        let partition = *self
            .work
            .partition
            .get_or_insert_with(|| self.ctx.partition());
        let Some(hashes) = self.work.hashes(dialect, partition).map(<[u128]>::to_vec) else {
            return false;
        };
        let Some(checkpoint) = prepared.take(partition, &hashes).await else {
            return false;
        };
        let Some(&prefix) = hashes.get(checkpoint.prefix_len) else {
            prepared.count(Fate::Wasted);
            return false;
        };
        // The client's own messages, with the prepared form in place of those it covers,
        // if what follows them still fits after the form.
        let resumed = self.done.resumed.take();
        self.work.forget_base();
        let next = self
            .work
            .base(dialect)
            .and_then(|base| messages_of(&base.view)?.get(checkpoint.prefix_len).cloned());
        if !checkpoint.continues(next.as_ref()) {
            prepared.count(Fate::Wasted);
            // Back to the conversation as resumed: the engine compacts it as usual.
            self.work.forget_base();
            if let Some(hit) = resumed {
                self.apply(hit.applied.prefix_len, hit.checkpoint, hit.key);
            }
            return false;
        }
        prepared.count(Fate::Used);
        let replaces = resumed.map(|hit| hit.key);
        self.apply(checkpoint.prefix_len, checkpoint, Key { partition, prefix });
        self.done.promote = Some(Promote { replaces });
        let fits = self
            .work
            .tokens(dialect)
            .is_some_and(|tokens| !self.over_threshold(tokens, goal.window));
        // The event has had its summariser call: what more it needs, the digest gives.
        self.done.digest_only |= !fits;
        fits
    }
}

/// What a preparation needs, owned: it outlives the request that started it.
struct Job {
    app: Arc<App>,
    parts: Parts,
    original: Bytes,
    head: Head,
    dialect: Dialect,
    id: u64,
}

impl Job {
    /// The checkpoint the compaction of the request towards `goal` makes, exactly as the
    /// request's own compaction would have made it.
    async fn run(&self, goal: Goal) -> Option<Checkpoint> {
        let mut attempt = Attempt {
            ctx: Ctx {
                app: &self.app,
                parts: &self.parts,
                id: self.id,
                dialect: self.dialect,
                head: self.head.clone(),
            },
            work: Work::new(self.original.clone(), &self.head),
            done: Done::default(),
        };
        attempt.resume().await;
        if !attempt.rewrite(goal).await {
            return None;
        }
        let Engine::Rewrote {
            pending, report, ..
        } = attempt.done.engine
        else {
            return None;
        };
        tracing::info!(
            id = self.id,
            tokens_before = report.tokens_before,
            tokens_after = report.tokens_after,
            summary = report.summary.as_str(),
            "prepared the next compaction"
        );
        pending.map(|p| p.checkpoint)
    }
}

/// A copy of the client's request head, for the summariser's calls made after the
/// request itself is answered.
fn copy(parts: &Parts) -> Parts {
    let mut request = Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request.into_parts().0
}
