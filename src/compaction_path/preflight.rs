//! Before the first call: resume a conversation compacted before from its checkpoint,
//! and compact when the model's window is known and the request would fill more than the
//! threshold of it, down to the low-water mark, so that the next turns are sent as resumed,
//! growing only at their end, until they cross the threshold again; a request that fits
//! but asks for more completion tokens than the window leaves gets its cap lowered (the
//! lossless fix, made before the upstream refuses).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use memchr::memmem::Finder;

use super::policy::{self, Decision, Goal, Marks};
use super::{Attempt, Trigger};
use crate::checkpoint::prepared::Underway;
use crate::checkpoint::{Applied, Checkpoint, Key};
use crate::compactor::{messages_of, Resumed};
use crate::engine::{self, budget};
use crate::units::{Ours, Theirs, Window};

/// Upper bound on the tokens an image part can cost, for the cheap "surely fits" test.
const MAX_IMAGE_TOKENS: u64 = 1_600;
/// The longest a turn waits for its event's preparation to end: a summary almost made is
/// worth a moment (a client that sends its turns back to back catches its preparation
/// still running), one that has seconds to go is not (the turn takes the digest instead).
const PREPARED_WAIT: Duration = Duration::from_millis(250);
/// Bodies above this size are parsed and counted on a thread that may block.
const LARGE_BODY: usize = 256 * 1024;
/// Built once: building a searcher costs more than running it on a small body.
static IMAGE_URL: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("image_url"));

/// Runs `work`, which may take milliseconds, off the runtime's other tasks where it can:
/// a multi-threaded runtime first hands them to another thread. A single-threaded one
/// (`server.worker_threads = 1`) has no other thread, and `block_in_place` would panic
/// there, so the work runs in place, as a single nginx worker would.
fn may_block<T>(work: impl FnOnce() -> T) -> T {
    let flavor = tokio::runtime::Handle::try_current().map(|handle| handle.runtime_flavor());
    match flavor {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

impl Attempt<'_> {
    pub(super) async fn preflight(&mut self) {
        self.resume().await;
        // Parsing, hashing and counting a large body takes milliseconds: off the threads
        // that move other requests' bytes.
        let decision = if self.work.original().len() > LARGE_BODY {
            may_block(|| self.decide())
        } else {
            self.decide()
        };
        let rewritten = match decision {
            Decision::Send => false,
            Decision::Prepare(goal) => {
                self.prepare(goal);
                false
            }
            // Boxed like every rare path, so the common future stays small.
            Decision::Compact(goal) => Box::pin(self.event(goal)).await,
        };
        if !rewritten && (self.done.resumed.is_some() || self.done.output.is_some()) {
            self.send_base();
        }
        if !rewritten {
            self.preflight_messages().await;
        }
        self.preflight_media();
        if self.done.tried() {
            self.done.triggered(Trigger::Preflight);
        }
    }

    /// This turn's event. A compaction prepared ahead is put in place; only if there is
    /// none, or it no longer fits, does this turn compact. A preparation still running is
    /// not waited for beyond [`PREPARED_WAIT`]: while the request still fits the window
    /// whole it goes as it is, and the event comes with the next turn, prepared;
    /// otherwise the event is made now without the summariser (pruning, and the digest
    /// where a summary is needed). `true` when the request was rewritten.
    async fn event(&mut self, goal: Goal) -> bool {
        if let Some(underway) = self.preparing() {
            if self.fits_whole(goal) {
                tracing::debug!(id = self.ctx.id, "the event waits for its preparation");
                return false;
            }
            if !self.prepared_within(underway, PREPARED_WAIT).await {
                self.discard_preparation();
                self.done.digest_only = true;
                return self.rewrite(goal).await;
            }
        }
        if !self.use_prepared(goal).await {
            return self.rewrite(goal).await;
        }
        // What it left may be crossed again within two turns: the next event is prepared
        // from it now.
        if let Decision::Prepare(goal) = self.decide() {
            self.prepare(goal);
        }
        false
    }

    /// Decides what the request, resumed from its checkpoint if it has one, needs before it
    /// is sent (see [`policy::decide`]). Costs a byte-length comparison for the many
    /// requests that are obviously small, and one token count for the rest. Not only a
    /// question: unless the request is to be compacted now (the compaction fits the cap
    /// itself, see `rewrite.rs`), a completion cap that would overflow the window beside
    /// the prompt is lowered here, with the prompt counted for the decision.
    fn decide(&mut self) -> Decision {
        let Some(window) = self.ctx.window() else {
            return Decision::Send;
        };
        let factor = self.ctx.factor();
        let marks = Marks::of(&self.ctx.app.config.compaction);
        let room = self.answer_room();
        // A token is at least one byte of JSON, so the body's length bounds the prompt
        // from above, except for image parts whose cost is fixed and may exceed their
        // URL's length.
        let original = self.work.original();
        let images = IMAGE_URL.find_iter(original).count() as u64;
        let bound = Ours(original.len() as u64 + images * MAX_IMAGE_TOKENS).theirs(factor);
        // Growth in bytes bounds growth in tokens the same way.
        let bound_growth = Ours(self.ctx.growth.unwrap_or(0)).theirs(factor);
        if self.done.resumed.is_none()
            && policy::surely_fits(bound, bound_growth, room, window, marks)
            && budget::cap_fits(window.0, bound.0, self.work.cap)
        {
            return Decision::Send;
        }
        let Some(tokens) = self.work.tokens(self.ctx.dialect) else {
            return Decision::Send;
        };
        let prompt = tokens.theirs(factor);
        let decision = policy::decide(prompt, self.growth(), room, window, factor, marks);
        if !matches!(decision, Decision::Compact(_)) {
            self.fit_output(window, prompt);
        }
        decision
    }

    /// How much the conversation grows a turn, in the upstream's tokens: its growth in
    /// bytes, at the request's own ratio of tokens to bytes (the client's whole request,
    /// resumed or not).
    pub(super) fn growth(&self) -> Theirs {
        let Some(bytes) = self.ctx.growth else {
            return Theirs(0);
        };
        let client = match &self.done.resumed {
            Some(hit) => Some(hit.tokens_before),
            None => self.work.parsed().and_then(|base| base.tokens),
        };
        let len = self.work.original().len().max(1) as f64;
        let per_byte = client.map_or(1.0, |tokens| tokens.0 as f64 / len);
        Ours((bytes as f64 * per_byte) as u64).theirs(self.ctx.factor())
    }

    /// Whether the conversation's running preparation, here or on another replica, ends
    /// within `wait`.
    async fn prepared_within(&mut self, underway: Underway, wait: Duration) -> bool {
        let Some((prepared, at)) = self.preparation() else {
            return false;
        };
        match underway {
            Underway::Here => prepared.ends_within(&at, wait).await,
            Underway::Elsewhere => {
                let stage = at.stage;
                let Some(cache) = &self.ctx.app.checkpoints else {
                    return false;
                };
                let seal = self.ctx.seal(cache);
                cache.prepared_elsewhere_within(&seal, stage, wait).await
            }
        }
    }

    /// Where this conversation's next event is being prepared right now, if it is.
    fn preparing(&mut self) -> Option<Underway> {
        let (prepared, at) = self.preparation()?;
        prepared.in_progress(&at)
    }

    /// Cancels the conversation's running preparation: this turn's event is made without
    /// it, which leaves it behind, and the next event is prepared from this one.
    fn discard_preparation(&mut self) {
        if let Some((prepared, at)) = self.preparation() {
            prepared.discard(&at);
        }
    }

    /// Whether the request, past the threshold, still fits the window whole: its event
    /// can wait for the next turn.
    fn fits_whole(&mut self, goal: Goal) -> bool {
        let Some(window) = goal.window else {
            return false;
        };
        let Some(tokens) = self.work.tokens(self.ctx.dialect) else {
            return false;
        };
        policy::fits_whole(tokens.theirs(self.ctx.factor()), self.answer_room(), window)
    }

    /// Whether a request at `tokens` (ours) would be compacted before it is sent.
    pub(super) fn over_threshold(&self, tokens: Ours, window: Window) -> bool {
        let prompt = tokens.theirs(self.ctx.factor());
        let marks = Marks::of(&self.ctx.app.config.compaction);
        marks.past_threshold(prompt + self.answer_room().budget(window), window)
    }

    /// Puts the conversation's checkpoint, when the cache holds one for a prefix of its
    /// messages, in place of that prefix: a conversation compacted before is sent
    /// compacted the same way from the first attempt, byte for byte, without a summary.
    /// Costs nothing for tenants whose conversations were never compacted: the store is
    /// asked only for tenants it is known to hold checkpoints of.
    pub(super) async fn resume(&mut self) {
        let Some(cache) = &self.ctx.app.checkpoints else {
            return;
        };
        // An empty store is the usual case; it spares every request the credential's
        // SHA-256.
        if !cache.any() {
            return;
        }
        let partition = self.ctx.partition();
        self.work.partition = Some(partition);
        if !cache.may_hold(partition) {
            return;
        }
        let dialect = self.ctx.dialect;
        let hashed = if self.work.original().len() > LARGE_BODY {
            may_block(|| self.work.hashes(dialect, partition).is_some())
        } else {
            self.work.hashes(dialect, partition).is_some()
        };
        if !hashed {
            return;
        }
        let Some(hashes) = self.work.hashes.as_deref() else {
            return;
        };
        // Boxed: only tenants with checkpoints get here, and the store's future would
        // otherwise be moved with every request's.
        let Some((len, checkpoint)) =
            Box::pin(cache.longest(&self.ctx.seal(cache), partition, hashes)).await
        else {
            return;
        };
        let continues = self
            .work
            .parsed()
            .and_then(|base| messages_of(&base.view))
            .is_some_and(|messages| checkpoint.continues(messages.get(len)));
        if !continues {
            return;
        }
        // A stored digest is a degraded summary: once the summariser may answer again,
        // the conversation is compacted anew from the client's own messages, so that a
        // real summary takes its place.
        let summarizer = self.ctx.app.summarizer.as_ref();
        if checkpoint.summariser_failed
            && checkpoint.worth_summarising()
            && summarizer.is_some_and(|s| s.ready(&self.ctx.head.model))
        {
            tracing::info!(
                id = self.ctx.id,
                "the stored summary is a fallback: summarising again"
            );
            return;
        }
        let key = Key {
            partition,
            prefix: hashes[len],
        };
        self.apply(len, checkpoint, key);
    }

    /// Puts `checkpoint` in place of the client's first `len` messages in the base.
    pub(super) fn apply(&mut self, len: usize, checkpoint: Arc<Checkpoint>, key: Key) {
        let Some(base) = self.work.base(self.ctx.dialect) else {
            return;
        };
        let counter = engine::Counter::for_request(&base.view);
        let overhead = counter.request_overhead(&base.view);
        let Some(messages) = base.view.get_mut("messages").and_then(|m| m.as_array_mut()) else {
            return;
        };
        let messages_before = messages.len();
        let form_len = checkpoint.messages.len();
        messages.splice(..len, checkpoint.messages.iter().cloned());
        let later = counter.messages(&messages[form_len..]);
        let later_tokens = later.iter().sum::<usize>();
        let mut counts = checkpoint.counts.clone();
        counts.extend(later);
        base.tokens = Some(Ours((counts.iter().sum::<usize>() + overhead) as u64));
        base.counts = Some(counts);
        if !checkpoint.worth_summarising() {
            self.done.digest_only = true;
        }
        self.done.resumed = Some(Resumed {
            key,
            tokens_before: Ours((checkpoint.prefix_tokens + later_tokens + overhead) as u64),
            applied: Applied {
                form_len,
                prefix_len: len,
            },
            checkpoint,
            messages_before,
        });
    }

    /// Sends the base as it is: resumed from its checkpoint, or with a lowered cap.
    fn send_base(&mut self) {
        let dialect = self.ctx.dialect;
        let bytes = self
            .work
            .parsed()
            .and_then(|base| self.work.encode(dialect, &base.view));
        match bytes {
            Some(bytes) => self.work.body = bytes,
            // Not reachable for a request parsed from JSON; sending the client's own bytes
            // is the safe way out.
            None => {
                tracing::warn!(
                    id = self.ctx.id,
                    "a resumed request could not be encoded; sent as the client's"
                );
                self.work.reset(&self.ctx.head);
                self.done = Default::default();
            }
        }
    }
}
