//! The retry policy: after a refusal compaction may fix, learn what it says of the window
//! and of the upstream's token count, and prepare the next attempt (a lower completion
//! cap, a tighter compaction), or say there is nothing more to try.

use super::policy::{self, Marks, Refused};
use super::{Attempt, Engine, Trigger};
use crate::classify::{Classification, Kind};
use crate::engine::budget;
use crate::units::{Ours, Window};
use crate::windows::Count;

/// Share of what was refused taken as the window's bound when the refusal names no
/// numbers, for the difference between our count and the upstream's.
const BOUND_MARGIN: f64 = 0.05;

impl Attempt<'_> {
    /// Learns what the refusal says and prepares the next attempt. `false` when there
    /// is nothing more to try.
    pub(super) async fn recover(&mut self, class: &Classification) -> bool {
        self.learn(class);
        let changed = match class.kind {
            Kind::OutputCap => self.lower_output_cap(class) || self.shrink(class).await,
            // No numbers, and the answer's room was most of what was refused: it goes
            // down first.
            Kind::ContextOverflow if blind(class) && self.lower_blind_cap() => true,
            Kind::ContextOverflow => {
                let (rewrites, cap) = (self.rewrites(), self.work.cap);
                let shrunk = self.shrink(class).await;
                // Nothing of the conversation could go: only the completion cap can make
                // room, by an amount the upstream did not say; halve it at least.
                let halved = self.rewrites() == rewrites && self.halve_output_cap(cap);
                shrunk || halved
            }
            Kind::BodyTooLarge => self.shrink(class).await,
            Kind::Other => false,
        };
        if changed {
            self.done.triggered(Trigger::Error);
        }
        changed
    }

    /// After a refusal without numbers, a lower completion cap (see
    /// [`policy::blind_cap`]) when the cap asked for is larger than the prompt sent and
    /// above the least room an answer needs. `false` when that is not the case.
    fn lower_blind_cap(&mut self) -> bool {
        let (Some(field), Some(asked)) = (self.work.cap_field, self.work.cap) else {
            return false;
        };
        let Some(prompt) = self.count_sent().map(|sent| sent.theirs(self.ctx.factor())) else {
            return false;
        };
        if asked <= prompt.0 || asked <= budget::MIN_OUTPUT_ROOM {
            return false;
        }
        let cap = policy::blind_cap(asked, prompt, self.ctx.window());
        cap < asked && self.set_output_cap(field, asked, cap)
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
            // No numbers: the window is below what was just refused, prompt and requested
            // completion together (many upstreams count both; counting the prompt alone
            // could set the window far too small when the completion was the excess). A
            // 413 says nothing about tokens: its bytes may be images that cost few.
            let asked = self.work.cap.unwrap_or(0) as f64;
            let prompt = sent.0 as f64 * self.ctx.factor().0;
            let bound = ((prompt + asked) * (1.0 - BOUND_MARGIN)) as u64;
            models.learn_at_most(upstream, model, bound);
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
