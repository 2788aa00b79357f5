//! A client request across its attempts: what stays fixed ([`Ctx`]), the request as it is
//! being rewritten ([`Work`]) and what was done to it ([`Done`]). This is the one owner of
//! that state: the phases (`preflight.rs`, `recover.rs`, `cap.rs`, `count_caps.rs`,
//! `prepare.rs`, `rewrite.rs`) read what they need of it and say what to change (resume
//! from a checkpoint, lower the cap, cap media, rewrite to a goal, prepare, put a prepared
//! checkpoint in place, send as is); the methods here sequence them and make the changes.

use std::sync::Arc;
use std::time::Duration;

use http::Response;

use super::cap::{self, LowerCap};
use super::count_caps::{self, CapMedia};
use super::done::{Done, Engine, Promote};
use super::policy::{Decision, Goal};
use super::preflight::{self, Resume};
use super::prepare::{self, Ready};
use super::recover::{self, Sent};
use super::rewrite;
use super::work::Work;
use super::{report, usage, Ctx};
use crate::body::ProxyBody;
use crate::checkpoint::coordination::prepared::Fate;
use crate::checkpoint::{self, Applied};
use crate::classify::{Classification, Kind};
use crate::compaction_report::{Outcome, Trigger, XCompaction};
use crate::compactor::{messages_of, Compaction, Resumed};
use crate::engine::{self, budget};
use crate::units::{Ours, Theirs, Window};

/// The longest a turn waits for its event's preparation to end: a summary almost made is
/// worth a moment (a client that sends its turns back to back catches its preparation
/// still running), one that has seconds to go is not (the turn takes the digest instead).
const PREPARED_WAIT: Duration = Duration::from_millis(250);

/// One client request across its upstream attempts.
pub(super) struct Request<'a> {
    pub ctx: Ctx<'a>,
    pub work: Work,
    pub done: Done,
}

/// What a retry reads of `work` and `done`.
fn sent<'r>(work: &'r mut Work, done: &'r Done) -> Sent<'r> {
    Sent {
        work,
        report: done.report(),
        resumed: done.resumed.as_ref(),
        rewrites: done.rewrites(),
    }
}

impl Request<'_> {
    /// Before the first call: resumed from the conversation's checkpoint, then what the
    /// request needs (a compaction now, one prepared for later, a lower cap), and the
    /// model's caps on messages and media parts.
    pub async fn preflight(&mut self) {
        if let Some(resume) = preflight::resume(&self.ctx, &mut self.work).await {
            self.resume_from(resume);
        }
        let needs = preflight::first_needs(&self.ctx, &mut self.work, self.done.resumed.as_ref());
        let rewritten = match self.fit_cap(needs) {
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
            self.cap_messages().await;
        }
        if let Some(media) = count_caps::configured_media(&self.ctx) {
            self.cap_media(media);
        }
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
        let (ctx, resumed) = (&self.ctx, self.done.resumed.as_ref());
        if let Some(underway) = prepare::preparing(ctx, &mut self.work, resumed) {
            if preflight::fits_whole(ctx, &mut self.work, goal) {
                tracing::debug!(id = ctx.id, "the event waits for its preparation");
                return false;
            }
            let wait = PREPARED_WAIT;
            if !prepare::prepared_within(ctx, &mut self.work, resumed, underway, wait).await {
                prepare::discard(ctx, &mut self.work, resumed);
                self.done.digest_only = true;
                return self.rewrite(goal).await;
            }
        }
        let ready = prepare::take(&self.ctx, &mut self.work, self.done.resumed.as_ref()).await;
        if !ready.is_some_and(|ready| self.put_prepared(ready, goal)) {
            return self.rewrite(goal).await;
        }
        // What it left may be crossed again within two turns: the next event is prepared
        // from it now.
        let needs = preflight::needs(&self.ctx, &mut self.work, self.done.resumed.as_ref());
        if let Decision::Prepare(goal) = self.fit_cap(needs) {
            self.prepare(goal);
        }
        false
    }

    /// Learns what the refusal says and makes the next attempt's change. `false` when
    /// there is nothing more to try.
    pub async fn recover(&mut self, class: &Classification) -> bool {
        recover::learn(&self.ctx, sent(&mut self.work, &self.done), class);
        let changed = match class.kind {
            Kind::OutputCap => {
                let lower = cap::after_refusal(self.work.cap(), &class.numbers);
                self.lower_cap(lower) || self.shrink(class).await
            }
            Kind::ContextOverflow if recover::blind(class) => self.blind_retry().await,
            Kind::ContextOverflow => {
                let (rewrites, before) = (self.done.rewrites(), self.work.cap);
                let shrunk = self.shrink(class).await;
                // Nothing of the conversation could go: only the completion cap can make
                // room, by an amount the upstream did not say; halve it at least.
                let halved = self.done.rewrites() == rewrites
                    && self.lower_cap(cap::halved(self.work.cap(), before));
                shrunk || halved
            }
            Kind::BodyTooLarge => self.shrink(class).await,
            Kind::TooManyMedia => {
                let media = count_caps::media_after_refusal(&self.ctx, &self.work.body, class);
                media.is_some_and(|media| self.cap_media(media))
            }
            Kind::TooManyMessages => {
                count_caps::learn_message_limit(&self.ctx, &self.work.body, class)
                    && self.cap_messages().await
            }
            Kind::Other => false,
        };
        if changed {
            self.done.triggered(Trigger::Error);
        }
        changed
    }

    /// Compacts to a tighter target than the last attempt's (see [`recover::retry_goal`]).
    async fn shrink(&mut self, class: &Classification) -> bool {
        let goal = recover::retry_goal(&self.ctx, sent(&mut self.work, &self.done), class);
        match goal {
            Some(goal) => self.rewrite(goal).await,
            None => false,
        }
    }

    /// After a refusal without numbers: the next attempt as [`recover::blind_retry`] says,
    /// below every refusal of this request. `false` when nothing below them can be sent.
    async fn blind_retry(&mut self) -> bool {
        let (least, calls) = (self.done.least_refused, self.done.calls);
        let sent_now = sent(&mut self.work, &self.done);
        let Some(retry) = recover::blind_retry(&self.ctx, sent_now, least, calls) else {
            return false;
        };
        self.done.least_refused = Some(retry.least);
        let mut changed = self.lower_cap(retry.cap);
        if let Some(goal) = retry.goal {
            changed |= self.rewrite(goal).await;
        }
        let next = sent(&mut self.work, &self.done).refused_size(&self.ctx);
        changed && next.is_some_and(|next| next < retry.least)
    }

    /// A request with more messages than the model's cap is compacted to it. `true` when
    /// it was rewritten.
    async fn cap_messages(&mut self) -> bool {
        match count_caps::messages_goal(&self.ctx, &mut self.work) {
            Some(goal) => self.rewrite(goal).await,
            None => false,
        }
    }

    /// The successful answer, marked when the request was rewritten. The upstream took
    /// the rewritten request: its checkpoint can serve the conversation's next turns.
    /// The checkpoint is stored before the answer is given back, so that the client's
    /// next turn finds it, on this replica or another.
    pub async fn deliver(&mut self, mut response: Response<ProxyBody>) -> Response<ProxyBody> {
        if let Some(cache) = &self.ctx.app.checkpoints {
            let done = &mut self.done;
            match (&mut done.engine, &done.promote, &done.resumed) {
                (Engine::Rewrote { pending, .. }, _, _) => {
                    if let Some(pending) = pending.take().map(|p| *p) {
                        let checkpoint = Arc::new(pending.checkpoint);
                        // Boxed, as the rare path (see `run`).
                        let put = self
                            .ctx
                            .put(cache, pending.key, checkpoint, pending.replaces);
                        Box::pin(put).await;
                    }
                }
                (_, Some(promote), Some(hit)) => {
                    let checkpoint = Arc::clone(&hit.checkpoint);
                    Box::pin(self.ctx.put(cache, hit.key, checkpoint, promote.replaces)).await;
                }
                _ => {}
            }
        }
        // The engine may have run and found nothing to remove: the client's bytes went as
        // they were, and the answer is theirs, unmarked.
        let changed = self.done.changed();
        if let Some(x) = self.x_compaction(Outcome::Applied).filter(|_| changed) {
            report::record_request(&self.ctx, &self.done, &x);
            response.headers_mut().insert("x-compaction", x.to_header());
        }
        self.calibrating(response)
    }

    /// The answer, tapped for the upstream's count of the prompt, when the model's window
    /// is known (the count matters) and the request was counted on its way (requests far
    /// below the window never are, and are not counted for this alone).
    fn calibrating(&self, response: Response<ProxyBody>) -> Response<ProxyBody> {
        // The count first: it is at hand, where the window is a lookup.
        let ours = match self.done.report() {
            Some(report) => Some(report.tokens_after as u64),
            None => self.work.parsed().and_then(|base| base.tokens).map(|t| t.0),
        };
        let Some(ours) = ours.filter(|_| self.ctx.window().is_some()) else {
            return response;
        };
        let learn = usage::Learn {
            app: Arc::clone(self.ctx.app),
            model: self.ctx.steering.model.clone(),
            ours,
        };
        response.map(|body| usage::tap(body, learn))
    }

    /// The upstream's own last refusal, marked as a compaction that did not succeed when
    /// the proxy had a go at it.
    pub fn fail(&self, mut response: Response<ProxyBody>) -> Response<ProxyBody> {
        if !self.done.tried() {
            return response;
        }
        let x = self.x_compaction(Outcome::Failed);
        let x = x.unwrap_or_else(|| XCompaction::failed(self.done.calls, self.done.output));
        report::record_request(&self.ctx, &self.done, &x);
        response.headers_mut().insert("x-compaction", x.to_header());
        response
    }

    fn x_compaction(&self, outcome: Outcome) -> Option<XCompaction> {
        report::x_compaction(&self.done, self.work.parsed(), outcome)
    }
}

/// The changes, made.
impl Request<'_> {
    /// Puts a stored or prepared checkpoint in place of the client's first messages in
    /// the base.
    fn resume_from(&mut self, resume: Resume) {
        let Resume {
            len,
            checkpoint,
            key,
        } = resume;
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
                self.work.reset(&self.ctx.steering);
                self.done = Default::default();
            }
        }
    }

    /// The decision of `needs`, with the completion cap of the request compaction starts
    /// from lowered where it overflows, unless the request is compacted now.
    fn fit_cap(&mut self, needs: preflight::Needs) -> Decision {
        if let (Some((window, prompt)), false) = (
            needs.overflowing_cap,
            matches!(needs.decision, Decision::Compact(_)),
        ) {
            self.fit_output(window, prompt);
        }
        needs.decision
    }

    /// Lowers the cap of the request compaction starts from so that `prompt` and the cap
    /// fit the window.
    fn fit_output(&mut self, window: Window, prompt: Theirs) {
        let Some(base) = self.work.base(self.ctx.dialect) else {
            return;
        };
        if let Some((before, after)) = budget::fit_output(&mut base.view, window.0, prompt.0) {
            self.lowered(before, after);
        }
    }

    /// Records a lowered cap: later budgets use it, and the header reports the first
    /// cap asked for and the last one sent.
    fn lowered(&mut self, before: u64, after: u64) {
        let first = self.done.output.map_or(before, |(first, _)| first);
        self.done.output = Some((first, after));
        self.work.cap = Some(after);
    }

    /// Sends the last request again with the lower completion cap. `false` when there is
    /// none, or it cannot be written.
    fn lower_cap(&mut self, lower: Option<LowerCap>) -> bool {
        let Some(LowerCap { field, asked, cap }) = lower else {
            return false;
        };
        let dialect = self.ctx.dialect;
        let Some(bytes) = dialect.with_output_cap(&self.work.body, field, cap) else {
            return false;
        };
        self.work.body = bytes.into();
        self.lowered(asked, cap);
        // Later compactions start from the client's request with the lower cap too.
        if let Some(base) = self.work.parsed_mut() {
            if let Some(request) = base.view.as_object_mut() {
                request.insert(field.into(), cap.into());
            }
        }
        true
    }

    /// Replaces the oldest media parts of what the next attempt sends, and of the request
    /// later compactions start from, until at most `keep` remain. `false` when there were
    /// no more than that.
    fn cap_media(&mut self, CapMedia { keep }: CapMedia) -> bool {
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        let Some((bytes, before)) = count_caps::capped(&self.ctx, &self.work.body, keep) else {
            return false;
        };
        self.work.body = bytes;
        if let Some(base) = self.work.base(self.ctx.dialect) {
            if engine::cap_media(&mut base.view, keep) > 0 {
                // Placeholders cost fewer tokens than what they replace.
                base.tokens = None;
                base.counts = None;
            }
        }
        let first = self.done.media.map_or(before as u64, |(first, _)| first);
        self.done.media = Some((first, keep.min(before) as u64));
        true
    }

    /// Starts the compaction the threshold will call for, in the background.
    fn prepare(&mut self, goal: Goal) {
        let done = prepare::Done {
            resumed: self.done.resumed.as_ref(),
            digest_only: self.done.digest_only,
        };
        prepare::start(&self.ctx, &mut self.work, done, goal);
    }

    /// Puts a prepared checkpoint in place of the client's prefix. `true` when the request
    /// then fits and goes as it is; `false` when it no longer continues the client's
    /// messages, or no longer fits (the engine then compacts on from it, without a second
    /// summariser call).
    fn put_prepared(&mut self, ready: Ready, goal: Goal) -> bool {
        let Some(prepared) = self.ctx.app.prepared() else {
            return false;
        };
        let dialect = self.ctx.dialect;
        let checkpoint = Arc::clone(&ready.found.checkpoint);
        // The client's own messages, with the prepared form in place of those it covers,
        // if what follows them still fits after the form.
        let resumed = self.done.resumed.take();
        self.work.forget_base();
        let next = self
            .work
            .base(dialect)
            .and_then(|base| messages_of(&base.view)?.get(checkpoint.prefix_len).cloned());
        if !checkpoint.continues(next.as_ref()) {
            prepared.unused(&ready.found);
            // Back to the conversation as resumed: the engine compacts it as usual.
            self.work.forget_base();
            if let Some(hit) = resumed {
                self.resume_from(resumed_again(hit));
            }
            return false;
        }
        prepared.count(Fate::Used);
        let replaces = resumed.map(|hit| hit.key);
        let len = checkpoint.prefix_len;
        let key = ready.key;
        self.resume_from(Resume {
            len,
            checkpoint,
            key,
        });
        self.done.promote = Some(Promote { replaces });
        let fits = self.work.tokens(dialect).is_some()
            && goal
                .window
                .is_some_and(|w| preflight::within_threshold(&self.ctx, &mut self.work, w));
        // The event has had its summariser call: what more it needs, the digest gives.
        self.done.digest_only |= !fits || prepare::prunes_on(&self.work, goal);
        fits && !self.done.digest_only
    }

    /// Runs the compactor on the base towards `goal` and makes what it made the next
    /// attempt. `false` when there is nothing new to send.
    async fn rewrite(&mut self, goal: Goal) -> bool {
        let done = rewrite::Done {
            resumed: self.done.resumed.as_ref(),
            calls: self.done.calls,
            digest_only: self.done.digest_only,
            summariser_failed: self.done.summariser_failed,
        };
        // Boxed: the compactor's future (a summariser call among it) is the largest
        // state of a request, and inline it would be moved with every future around
        // it, on every request, whether it ever compacts or not (see docs/performance.md).
        let compaction = Box::pin(rewrite::compact(&self.ctx, &mut self.work, done, goal)).await;
        let Some(compaction) = compaction else {
            return false;
        };
        self.done.summariser_failed |= compaction.summariser_failed;
        self.rewritten(compaction, goal)
    }

    /// Makes a compaction towards `goal` the next attempt, with the completion cap lowered
    /// if prompt plus cap would still overflow the window (the engine may have kept the
    /// turn in progress by taking room from the answer). `false` when it changes nothing
    /// that is sent.
    fn rewritten(&mut self, compaction: Compaction, goal: Goal) -> bool {
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
        self.done.engine = Engine::Rewrote {
            rewrites: self.done.rewrites() + 1,
            report,
            pending: compaction.checkpoint.map(Box::new),
        };
        true
    }
}

/// The checkpoint a request was resumed from, to put back in place.
fn resumed_again(hit: Resumed) -> Resume {
    Resume {
        len: hit.applied.prefix_len,
        checkpoint: hit.checkpoint,
        key: hit.key,
    }
}
