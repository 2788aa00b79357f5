//! Count caps: an upstream that takes only so many images, audio clips or files in one
//! request refuses a conversation that gathered more, however few tokens they cost.
//! The oldest are replaced by placeholders ([`engine::cap_media`]) before the first call
//! when the model's `max_media` is configured or a refusal named the limit before, and
//! after such a refusal, down to the limit it names (else half of what was sent).
//!
//! Messages per request: with the model's `max_messages` configured, or a limit taught by
//! a refusal, a request with more is compacted before the first call (the oldest history
//! summarised), and every compaction for the model keeps to it (see `rewrite.rs`); after
//! such a refusal the request is compacted to the limit it names and sent again.

use super::policy::Goal;
use super::Attempt;
use crate::classify::Classification;
use crate::compactor::messages_of;
use crate::engine;

impl Attempt<'_> {
    /// Before the first call: at most the model's configured number of media parts, or
    /// the number a refusal named.
    pub(super) fn preflight_media(&mut self) {
        let (upstream, model) = (self.ctx.upstream(), self.ctx.head.model.as_str());
        if let Some(cap) = self.ctx.app.models.media_cap(upstream, model) {
            self.cap_media(cap);
        }
    }

    /// After a refusal for carrying too many media parts. `false` when none could go.
    pub(super) fn recover_media(&mut self, class: &Classification) -> bool {
        let Some((view, _)) = self.ctx.dialect.view(&self.work.body) else {
            return false;
        };
        let sent = engine::count_media(&view) as u64;
        if let Some(limit) = class.numbers.media_limit {
            let (upstream, model) = (self.ctx.upstream(), self.ctx.head.model.as_str());
            self.ctx.app.models.learn_media_cap(upstream, model, limit);
        }
        let keep = class.numbers.media_limit.unwrap_or(sent / 2);
        self.cap_media(keep.min(sent.saturating_sub(1)))
    }

    /// Replaces the oldest media parts of what the next attempt sends, and of the request
    /// later compactions start from, until at most `keep` remain. `false` when there were
    /// no more than that.
    fn cap_media(&mut self, keep: u64) -> bool {
        let dialect = self.ctx.dialect;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // What is sent may be compacted already: it is capped as it is.
        let Some((mut view, source)) = dialect.view(&self.work.body) else {
            return false;
        };
        let before = engine::count_media(&view);
        if engine::cap_media(&mut view, keep) == 0 {
            return false;
        }
        let Some(bytes) = dialect.encode(&view, source.as_ref()) else {
            return false;
        };
        self.work.body = bytes.into();
        if let Some(base) = self.work.base(dialect) {
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

    /// A request with more messages than the model's cap (configured, or taught by a
    /// refusal) is compacted to it, whatever its tokens. `true` when it was rewritten.
    pub(super) async fn preflight_messages(&mut self) -> bool {
        let Some(cap) = self.message_cap() else {
            return false;
        };
        let dialect = self.ctx.dialect;
        let Some((view, _)) = dialect.view(&self.work.body) else {
            return false;
        };
        let count = messages_of(&view).map_or(0, Vec::len);
        if count <= cap {
            return false;
        }
        let Some(tokens) = self.work.tokens(dialect) else {
            return false;
        };
        let goal = Goal {
            target: tokens,
            ceiling: tokens,
            window: self.ctx.window(),
            relaxed: None,
            settle: None,
        };
        self.rewrite(goal).await
    }

    /// After a refusal for carrying too many messages: the limit it names (else half of
    /// what was sent) is remembered for the model, and the request compacted to it.
    pub(super) async fn recover_messages(&mut self, class: &Classification) -> bool {
        let Some((view, _)) = self.ctx.dialect.view(&self.work.body) else {
            return false;
        };
        let sent = messages_of(&view).map_or(0, Vec::len) as u64;
        let limit = class
            .numbers
            .message_limit
            .unwrap_or(sent / 2)
            .min(sent.saturating_sub(1));
        let (upstream, model) = (self.ctx.upstream(), self.ctx.head.model.as_str());
        self.ctx
            .app
            .models
            .learn_message_cap(upstream, model, limit);
        self.preflight_messages().await
    }

    /// The most messages one request for this model may carry, when configured or
    /// taught by a refusal.
    pub(super) fn message_cap(&self) -> Option<usize> {
        let (upstream, model) = (self.ctx.upstream(), self.ctx.head.model.as_str());
        let cap = self.ctx.app.models.message_cap(upstream, model)?;
        Some(usize::try_from(cap).unwrap_or(usize::MAX))
    }
}
