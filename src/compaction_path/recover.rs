//! The retry policy: after a refusal compaction may fix, learn what it says of the window
//! and of the upstream's token count, and prepare the next attempt (a lower completion
//! cap, a tighter compaction), or say there is nothing more to try.

use super::policy::{self, Blind, Marks, Refused};
use super::{Attempt, Engine, Trigger};
use crate::classify::{Classification, Kind};
use crate::units::{Ours, Theirs, Window};
use crate::windows::Count;

impl Attempt<'_> {
    /// Learns what the refusal says and prepares the next attempt. `false` when there
    /// is nothing more to try.
    pub(super) async fn recover(&mut self, class: &Classification) -> bool {
        self.learn(class);
        let changed = match class.kind {
            Kind::OutputCap => self.lower_output_cap(class) || self.shrink(class).await,
            Kind::ContextOverflow if blind(class) => self.blind_retry().await,
            Kind::ContextOverflow => {
                let (rewrites, cap) = (self.rewrites(), self.work.cap);
                let shrunk = self.shrink(class).await;
                // Nothing of the conversation could go: only the completion cap can make
                // room, by an amount the upstream did not say; halve it at least.
                let halved = self.rewrites() == rewrites && self.halve_output_cap(cap);
                shrunk || halved
            }
            Kind::BodyTooLarge => self.shrink(class).await,
            Kind::TooManyMedia => self.recover_media(class),
            Kind::TooManyMessages => self.recover_messages(class).await,
            Kind::Other => false,
        };
        if changed {
            self.done.triggered(Trigger::Error);
        }
        changed
    }

    /// After a refusal without numbers: the next attempt as [`policy::blind_step`] says,
    /// below every refusal of this request. `false` when nothing below them can be sent.
    async fn blind_retry(&mut self) -> bool {
        let Some(prompt) = self.count_sent() else {
            return false;
        };
        let Some(refused) = self.blind_refused() else {
            return false;
        };
        let least = self.done.least_refused.map_or(refused, |l| l.min(refused));
        self.done.least_refused = Some(least);
        let compaction = &self.ctx.app.config.compaction;
        let blind = Blind {
            prompt,
            cap: self.work.cap,
            bound: policy::blind_bound(least, self.ctx.window()),
            left: compaction
                .max_attempts
                .saturating_sub(self.done.calls.saturating_add(1)),
            growth: self.growth(),
            rewrites: self.rewrites(),
        };
        let step = policy::blind_step(
            blind,
            compaction.output_reserve_tokens,
            self.ctx.factor(),
            Marks::of(compaction),
        );
        let mut changed = false;
        if let (Some(cap), Some(field), Some(asked)) =
            (step.cap, self.work.cap_field, self.work.cap)
        {
            changed |= cap < asked && self.set_output_cap(field, asked, cap);
        }
        if let Some(goal) = step.goal {
            changed |= self.rewrite(goal).await;
        }
        changed && self.blind_refused().is_some_and(|next| next < least)
    }

    /// The size of what the last attempt sent, or is about to send, as a refusal without
    /// numbers bounds it: prompt (our count times the factor) plus completion cap.
    fn blind_refused(&mut self) -> Option<Theirs> {
        let prompt = self.count_sent()?.theirs(self.ctx.factor());
        Some(prompt + Theirs(self.work.cap.unwrap_or(0)))
    }

    fn rewrites(&self) -> u32 {
        match self.done.engine {
            Engine::Rewrote { rewrites, .. } => rewrites,
            _ => 0,
        }
    }

    /// Remembers the window the upstream reported and how its token count compares with
    /// ours, so the next request for this model is right the first time.
    fn learn(&mut self, class: &Classification) {
        let numbers = &class.numbers;
        let bounds_window = numbers.context_window.is_none() && class.kind == Kind::ContextOverflow;
        // Only a full count of the request as sent is comparable with ours.
        let comparable = numbers
            .prompt_tokens
            .filter(|_| !numbers.prompt_is_lower_bound);
        let sent = if bounds_window || comparable.is_some() {
            self.count_sent()
        } else {
            None
        };
        let (upstream, model) = (self.ctx.upstream(), self.ctx.head.model.as_str());
        let models = &self.ctx.app.models;
        if let Some(window) = numbers.context_window {
            models.learn(upstream, model, window);
        } else if let (true, Some(sent)) = (bounds_window, sent) {
            // No numbers: the window is below what was just refused (see
            // [`policy::blind_bound`]). A 413 says nothing about tokens: its bytes may be
            // images that cost few.
            let refused = sent.theirs(self.ctx.factor()) + Theirs(self.work.cap.unwrap_or(0));
            models.learn_at_most(upstream, model, policy::blind_bound(refused, None).0);
        }
        if let (Some(theirs), Some(ours)) = (comparable, sent) {
            models.calibrate(upstream, model, Count::Refusal, ours.0, theirs);
        }
    }

    /// Our token count of what the last attempt sent.
    fn count_sent(&mut self) -> Option<Ours> {
        match self.done.report() {
            Some(report) => Some(Ours(report.tokens_after as u64)),
            None => self.work.tokens(self.ctx.dialect),
        }
    }

    /// Compacts to a tighter target than the last attempt's (see [`policy::retry_goal`]).
    async fn shrink(&mut self, class: &Classification) -> bool {
        let refused = Refused {
            kind: class.kind,
            window: class
                .numbers
                .context_window
                .map(Window)
                .or_else(|| self.ctx.window()),
            sent: self.count_sent(),
            growth: self.growth(),
            rewrites: self.rewrites(),
        };
        let marks = Marks::of(&self.ctx.app.config.compaction);
        let goal = policy::retry_goal(refused, self.answer_room(), self.ctx.factor(), marks);
        match goal {
            Some(goal) => self.rewrite(goal).await,
            None => false,
        }
    }
}

/// Whether a refusal says nothing of the window nor of the prompt's size.
fn blind(class: &Classification) -> bool {
    class.numbers.context_window.is_none() && class.numbers.prompt_tokens.is_none()
}
