//! The retry policy: after a refusal compaction may fix, learn what it says of the window
//! and of the upstream's token count, and say what the next attempt changes (a lower
//! completion cap, a tighter compaction), or that there is nothing more to try. The
//! request's owner makes the change.

use super::cap::{self, Cap, LowerCap};
use super::policy::{self, Blind, Goal, Marks, Refused};
use super::work::Work;
use super::{preflight, Ctx};
use crate::classify::{Classification, Kind};
use crate::compactor::Resumed;
use crate::engine::Report;
use crate::units::{Ours, Theirs, Window};
use crate::windows::Count;

/// What a retry reads of the request beyond its context: what was sent, and what was
/// done to it.
pub(super) struct Sent<'r> {
    pub work: &'r mut Work,
    /// The report of the last compaction, whose count is what was sent.
    pub report: Option<&'r Report>,
    pub resumed: Option<&'r Resumed>,
    /// Compactions already made for this request.
    pub rewrites: u32,
}

impl Sent<'_> {
    /// Our token count of what the last attempt sent.
    fn tokens(&mut self, ctx: &Ctx<'_>) -> Option<Ours> {
        match self.report {
            Some(report) => Some(Ours(report.tokens_after as u64)),
            None => self.work.tokens(ctx.dialect),
        }
    }

    /// The size of what the last attempt sent, or is about to send, as a refusal without
    /// numbers bounds it: prompt (our count times the factor) plus completion cap.
    pub fn refused_size(&mut self, ctx: &Ctx<'_>) -> Option<Theirs> {
        let prompt = self.tokens(ctx)?.theirs(ctx.factor());
        Some(prompt + Theirs(self.work.cap.unwrap_or(0)))
    }

    fn growth(&self, ctx: &Ctx<'_>) -> Theirs {
        preflight::growth(ctx, self.work, self.resumed)
    }
}

/// Whether a refusal says nothing of the window nor of the prompt's size.
pub(super) fn blind(class: &Classification) -> bool {
    class.numbers.context_window.is_none() && class.numbers.prompt_tokens.is_none()
}

/// Remembers the window the upstream reported and how its token count compares with
/// ours, so the next request for this model is right the first time.
pub(super) fn learn(ctx: &Ctx<'_>, mut sent: Sent<'_>, class: &Classification) {
    let numbers = &class.numbers;
    let bounds_window = numbers.context_window.is_none() && class.kind == Kind::ContextOverflow;
    // Only a full count of the request as sent is comparable with ours.
    let comparable = numbers
        .prompt_tokens
        .filter(|_| !numbers.prompt_is_lower_bound);
    let tokens = if bounds_window || comparable.is_some() {
        sent.tokens(ctx)
    } else {
        None
    };
    let (upstream, model) = (ctx.upstream(), ctx.steering.model.as_str());
    let models = &ctx.app.models;
    if let Some(window) = numbers.context_window {
        models.learn(upstream, model, window);
    } else if let (true, Some(tokens)) = (bounds_window, tokens) {
        // No numbers: the window is below what was just refused (see
        // [`policy::blind_bound`]). A 413 says nothing about tokens: its bytes may be
        // images that cost few.
        let refused = tokens.theirs(ctx.factor()) + Theirs(sent.work.cap.unwrap_or(0));
        models.learn_at_most(upstream, model, policy::blind_bound(refused, None).0);
    }
    if let (Some(theirs), Some(ours)) = (comparable, tokens) {
        models.calibrate(upstream, model, Count::Refusal, ours.0, theirs);
    }
}

/// The goal of a compaction tighter than the last attempt's (see [`policy::retry_goal`]).
pub(super) fn retry_goal(
    ctx: &Ctx<'_>,
    mut sent: Sent<'_>,
    class: &Classification,
) -> Option<Goal> {
    let refused = Refused {
        kind: class.kind,
        window: class
            .numbers
            .context_window
            .map(Window)
            .or_else(|| ctx.window()),
        sent: sent.tokens(ctx),
        growth: sent.growth(ctx),
        rewrites: sent.rewrites,
    };
    let marks = Marks::of(&ctx.app.config.compaction);
    let room = cap::answer_room(ctx, sent.work.cap);
    policy::retry_goal(refused, room, ctx.factor(), marks)
}

/// The next attempt after a refusal without numbers, as [`policy::blind_step`] says:
/// below every refusal of this request, `least` among them.
pub(super) struct BlindRetry {
    pub least: Theirs,
    pub cap: Option<LowerCap>,
    pub goal: Option<Goal>,
}

/// After a refusal without numbers; `None` when what was sent cannot be counted.
/// `least_refused`: the least refused before, `calls`: the upstream calls made.
pub(super) fn blind_retry(
    ctx: &Ctx<'_>,
    mut sent: Sent<'_>,
    least_refused: Option<Theirs>,
    calls: u32,
) -> Option<BlindRetry> {
    let prompt = sent.tokens(ctx)?;
    let refused = sent.refused_size(ctx)?;
    let least = least_refused.map_or(refused, |l| l.min(refused));
    let compaction = &ctx.app.config.compaction;
    let blind = Blind {
        prompt,
        cap: sent.work.cap,
        bound: policy::blind_bound(least, ctx.window()),
        left: compaction
            .max_attempts
            .saturating_sub(calls.saturating_add(1)),
        growth: sent.growth(ctx),
        rewrites: sent.rewrites,
    };
    let step = policy::blind_step(
        blind,
        compaction.output_reserve_tokens,
        ctx.factor(),
        Marks::of(compaction),
    );
    let asked = Cap {
        field: sent.work.cap_field,
        asked: sent.work.cap,
    };
    let cap = step
        .cap
        .filter(|&cap| asked.asked.is_some_and(|asked| cap < asked))
        .and_then(|cap| asked.lower_to(cap));
    Some(BlindRetry {
        least,
        cap,
        goal: step.goal,
    })
}
