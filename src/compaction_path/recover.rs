//! The retry policy: after a refusal compaction may fix, learn what it says of the window
//! and of the upstream's token count, and prepare the next attempt (a lower completion
//! cap, a tighter compaction), or say there is nothing more to try.

use super::{Attempt, Engine, Goal, Trigger};
use crate::classify::{Classification, Kind};
use crate::windows::Count;

/// Share of the window left free on a retry, for the difference between our token
/// count and the upstream's that calibration has not yet learned.
const RETRY_MARGIN: f64 = 0.05;
/// Without any window to aim at, each retry aims at this share of the last prompt.
const BLIND_SHRINK: f64 = 0.6;
/// Each further retry tightens the target by this factor.
const ESCALATION: f64 = 0.8;

impl Attempt<'_> {
    /// Learns what the refusal says and prepares the next attempt. `false` when there
    /// is nothing more to try.
    pub(super) async fn recover(&mut self, class: &Classification) -> bool {
        self.learn(class);
        let changed = match class.kind {
            Kind::OutputCap => self.lower_output_cap(class) || self.shrink(class).await,
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
            let bound = ((sent as f64 * self.ctx.factor() + asked) * (1.0 - RETRY_MARGIN)) as u64;
            models.learn_at_most(upstream, model, bound);
        }
        if let (Some(theirs), Some(ours)) = (comparable, sent) {
            models.calibrate(upstream, model, Count::Refusal, ours, theirs);
        }
    }

    /// Our token count of what the last attempt sent.
    fn count_sent(&mut self) -> Option<u64> {
        match self.done.report() {
            Some(report) => Some(report.tokens_after as u64),
            None => self.work.tokens(self.ctx.dialect),
        }
    }

    /// Compacts to a tighter target than the last attempt's. A body too large is about
    /// bytes, not the window: it shrinks from what was sent, whatever the window.
    async fn shrink(&mut self, class: &Classification) -> bool {
        let window = class.numbers.context_window.or_else(|| self.ctx.window());
        let factor = self.ctx.factor();
        let tightening = ESCALATION.powi(self.rewrites() as i32);
        let blind = match self.count_sent() {
            Some(sent) => (sent as f64 * BLIND_SHRINK * tightening) as u64,
            None if window.is_none() => return false,
            None => u64::MAX,
        };
        let goal = match window {
            Some(window) => {
                let budget = self.output_budget(window) as f64;
                let usable = window as f64 * (1.0 - RETRY_MARGIN);
                // Down to the low-water mark, as before the first call: the next turns
                // are then sent as resumed instead of overflowing one by one.
                let low_water = window as f64 * self.ctx.app.config.compaction.low_water;
                let fill = usable.min(low_water);
                let target = ((fill - budget).max(0.0) / factor * tightening) as u64;
                let ceiling = (self.ceiling(usable, window) / factor * tightening) as u64;
                match class.kind {
                    Kind::BodyTooLarge => Goal {
                        target: target.min(blind),
                        ceiling: ceiling.min(blind),
                        window,
                    },
                    _ => Goal {
                        target,
                        ceiling,
                        window,
                    },
                }
            }
            None => Goal {
                target: blind,
                ceiling: blind,
                window: u64::MAX,
            },
        };
        self.rewrite(goal).await
    }
}
