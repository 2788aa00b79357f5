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
//!
//! These learn the limits and say what to do ([`CapMedia`], a [`Goal`]); the request's
//! owner does it.

use bytes::Bytes;

use super::policy::Goal;
use super::work::Work;
use super::Ctx;
use crate::classify::Classification;
use crate::compactor::messages_of;
use crate::engine;

/// Replace the oldest media parts of what is sent until at most `keep` remain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct CapMedia {
    pub keep: u64,
}

/// Before the first call: at most the model's configured number of media parts, or the
/// number a refusal named.
pub(super) fn configured_media(ctx: &Ctx<'_>) -> Option<CapMedia> {
    let (upstream, model) = (ctx.upstream(), ctx.steering.model.as_str());
    let keep = ctx.app.models.media_cap(upstream, model)?;
    Some(CapMedia { keep })
}

/// After a refusal for carrying too many media parts in `sent`: the limit it names is
/// remembered for the model, and fewer than were sent are kept.
pub(super) fn media_after_refusal(
    ctx: &Ctx<'_>,
    sent: &Bytes,
    class: &Classification,
) -> Option<CapMedia> {
    let (view, _) = ctx.dialect.view(sent)?;
    let sent = engine::count_media(&view) as u64;
    if let Some(limit) = class.numbers.media_limit {
        let (upstream, model) = (ctx.upstream(), ctx.steering.model.as_str());
        ctx.app.models.learn_media_cap(upstream, model, limit);
    }
    let keep = class.numbers.media_limit.unwrap_or(sent / 2);
    Some(CapMedia {
        keep: keep.min(sent.saturating_sub(1)),
    })
}

/// `sent` with its oldest media parts replaced until at most `keep` remain, and how many
/// it had; `None` when it had no more than that.
pub(super) fn capped(ctx: &Ctx<'_>, sent: &Bytes, keep: usize) -> Option<(Bytes, usize)> {
    // What is sent may be compacted already: it is capped as it is.
    let (mut view, source) = ctx.dialect.view(sent)?;
    let before = engine::count_media(&view);
    if engine::cap_media(&mut view, keep) == 0 {
        return None;
    }
    let bytes = ctx.dialect.encode(&view, source.as_ref())?;
    Some((bytes.into(), before))
}

/// A request with more messages than the model's cap (configured, or taught by a
/// refusal) is compacted to it, whatever its tokens: the goal it is compacted to.
pub(super) fn messages_goal(ctx: &Ctx<'_>, work: &mut Work) -> Option<Goal> {
    let cap = message_cap(ctx)?;
    let (view, _) = ctx.dialect.view(&work.body)?;
    let count = messages_of(&view).map_or(0, Vec::len);
    if count <= cap {
        return None;
    }
    let tokens = work.tokens(ctx.dialect)?;
    Some(Goal {
        target: tokens,
        ceiling: tokens,
        window: ctx.window(),
        relaxed: None,
        settle: None,
    })
}

/// After a refusal for carrying too many messages in `sent`: the limit it names (else
/// half of what was sent) is remembered for the model. `false` when `sent` cannot be read.
pub(super) fn learn_message_limit(ctx: &Ctx<'_>, sent: &Bytes, class: &Classification) -> bool {
    let Some((view, _)) = ctx.dialect.view(sent) else {
        return false;
    };
    let sent = messages_of(&view).map_or(0, Vec::len) as u64;
    let limit = class
        .numbers
        .message_limit
        .unwrap_or(sent / 2)
        .min(sent.saturating_sub(1));
    let (upstream, model) = (ctx.upstream(), ctx.steering.model.as_str());
    ctx.app.models.learn_message_cap(upstream, model, limit);
    true
}

/// The most messages one request for this model may carry, when configured or taught by
/// a refusal.
pub(super) fn message_cap(ctx: &Ctx<'_>) -> Option<usize> {
    let (upstream, model) = (ctx.upstream(), ctx.steering.model.as_str());
    let cap = ctx.app.models.message_cap(upstream, model)?;
    Some(usize::try_from(cap).unwrap_or(usize::MAX))
}
