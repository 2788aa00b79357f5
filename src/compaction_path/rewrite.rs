//! One compaction towards a goal: the engine plans, the summariser (when the plan needs a
//! summary and may ask for one) writes the middle's summary, the engine finishes, and the
//! result is encoded in the client's dialect with the checkpoint it makes for later turns.

use std::time::Instant;

use serde_json::Value;

use super::work::messages_of;
use super::{Attempt, Engine, Goal, Pending};
use crate::checkpoint::{self, Checkpoint, Key};
use crate::engine::{self, budget, SummarySource};
use crate::summarize::{Call, Middle};

impl Attempt<'_> {
    /// Runs the engine on the base towards `goal`, then lowers the completion cap if
    /// prompt plus cap would still overflow the window (the engine may have kept the turn
    /// in progress by taking room from the answer). `false` when there is nothing new to
    /// send.
    pub(super) async fn rewrite(&mut self, goal: Goal) -> bool {
        let Some(outcome) = self.compact(goal).await else {
            return false;
        };
        let report = outcome.report;
        if report.summary != engine::SummarySource::None
            && checkpoint::poor_savings_after(0, report.tokens_before, report.tokens_after) > 0
        {
            self.done.digest_only = true;
        }
        if matches!(self.done.engine, Engine::Unused) {
            self.done.engine = Engine::Ran;
        }
        let dialect = self.ctx.dialect;
        // A rewrite that removes nothing (everything left is instructions and the turn in
        // progress) would only change bytes the upstream's prompt cache holds.
        let saved = report.tokens_after < report.tokens_before
            || report.messages_after < report.messages_before;
        let rewritten = outcome.rewritten.filter(|_| saved);
        let compacted = rewritten.is_some();
        let Some(mut request) = rewritten.or_else(|| self.work.parsed().map(|b| b.view.clone()))
        else {
            return false;
        };
        if goal.window != u64::MAX {
            let prompt = (report.tokens_after as f64 * self.ctx.factor()) as u64;
            if let Some((before, after)) = budget::fit_output(&mut request, goal.window, prompt) {
                self.lowered(before, after);
            }
        }
        let Some(bytes) = self.work.encode(dialect, &request) else {
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
        let pending = self.checkpoint_of(&request, &report).map(Box::new);
        let rewrites = match &self.done.engine {
            Engine::Rewrote { rewrites, .. } => rewrites + 1,
            _ => 1,
        };
        self.done.engine = Engine::Rewrote {
            rewrites,
            report,
            pending,
        };
        true
    }

    /// The checkpoint `output` makes for the client's conversation: the form that now
    /// stands for a prefix of the client's messages.
    fn checkpoint_of(&mut self, output: &Value, report: &engine::Report) -> Option<Pending> {
        self.ctx.app.checkpoints.as_ref()?;
        let dialect = self.ctx.dialect;
        let partition = *self
            .work
            .partition
            .get_or_insert_with(|| self.ctx.partition());
        // Not resumed: the request compacted holds the client's own messages, whose
        // hashes are those of the base.
        self.work.hashes(dialect, partition)?;
        self.work.tokens(dialect)?;
        let base = self.work.parsed()?;
        let input = messages_of(&base.view)?;
        let counts = base.counts.as_deref()?;
        let hashes = self.work.hashes.as_deref()?;
        let hit = self.done.resumed.as_ref();
        let (replaced, form) =
            checkpoint::derive(input, messages_of(output)?, hit.map(|h| h.applied))?;
        let (prefix_len, form_len, earlier_tokens) = match hit {
            Some(hit) => (
                hit.applied.prefix_len,
                hit.applied.form_len,
                hit.checkpoint.prefix_tokens,
            ),
            None => (0, 0, 0),
        };
        // The client's messages between the old prefix and the new one are, in the
        // request compacted, the ones right after the old form.
        let newly = form_len..form_len + (replaced - prefix_len);
        let prefix_tokens = earlier_tokens + counts.get(newly.clone())?.iter().sum::<usize>();
        let next_role = input
            .get(newly.end)
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let form_counts = engine::Counter::for_request(output).messages(&form);
        // A new summary, or the one the resumed form carried.
        let (summary, failed) = match (report.summary, hit) {
            (SummarySource::Llm | SummarySource::Fallback, _) => {
                (report.summary, self.done.summariser_failed)
            }
            (_, Some(hit)) => (hit.checkpoint.summary, hit.checkpoint.summariser_failed),
            (_, None) => (SummarySource::None, false),
        };
        let poor_savings = checkpoint::poor_savings_after(
            hit.map_or(0, |h| h.checkpoint.poor_savings),
            report.tokens_before,
            report.tokens_after,
        );
        Some(Pending {
            key: Key {
                partition,
                prefix: *hashes.get(replaced)?,
            },
            checkpoint: Checkpoint::new(
                replaced,
                prefix_tokens,
                form,
                form_counts,
                next_role,
                poor_savings,
            )
            .with_summary(summary, failed),
            replaces: hit.map(|h| h.key),
        })
    }

    /// Plans, asks the LLM summariser for the middle when the plan needs a summary, and
    /// finishes. `None` when the engine refused the request.
    async fn compact(&mut self, goal: Goal) -> Option<engine::Outcome> {
        self.work.tokens(self.ctx.dialect)?;
        let base = self.work.take()?;
        let tokens = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let options = engine::Options {
            context_window: tokens(goal.window),
            target_tokens: Some(tokens(goal.target)),
            ceiling_tokens: Some(tokens(goal.ceiling.max(goal.target))),
            ..engine::Options::default()
        };
        let started = Instant::now();
        // Compaction is CPU work measured in milliseconds for huge conversations: keep
        // it off the threads that move other requests' bytes.
        let planned = tokio::task::spawn_blocking(move || {
            let plan = engine::plan_with_counts(&base.view, base.counts.as_deref(), &options);
            (base, options, plan)
        })
        .await;
        let (base, options, plan) = match planned {
            Ok(planned) => planned,
            Err(e) => {
                // The base went down with the task: the next attempts send what was last
                // built, and compact no more.
                tracing::error!(id = self.ctx.id, error = %e, "the compaction engine failed");
                return None;
            }
        };
        self.work.restore(base);
        // The summariser's call is network time, not engine work: it is left out.
        let planning = started.elapsed();
        let metrics = &self.ctx.app.metrics;
        let plan = match plan {
            Ok(plan) => plan,
            Err(e) => {
                metrics.compaction_time(planning);
                tracing::debug!(id = self.ctx.id, reason = %e, "the engine declined the request");
                return None;
            }
        };
        let summary = self.llm_summary(&plan, &options, goal.window).await;
        let started = Instant::now();
        let finished =
            tokio::task::spawn_blocking(move || engine::finish(plan, summary, &options)).await;
        metrics.compaction_time(planning + started.elapsed());
        finished
            .inspect_err(|e| {
                tracing::error!(id = self.ctx.id, error = %e, "the compaction engine failed");
            })
            .ok()
    }

    /// The LLM's summary of the plan's middle, when it needs one and the summariser may
    /// be asked; `None` leaves the engine to its deterministic digest.
    async fn llm_summary(
        &mut self,
        plan: &engine::Plan,
        options: &engine::Options,
        window: u64,
    ) -> Option<engine::Summary> {
        let summarizer = self.ctx.app.summarizer.as_ref()?;
        if self.done.digest_only || !plan.needs_summary() {
            return None;
        }
        let summary = self.ask_summariser(summarizer, plan, options, window).await;
        self.done.summariser_failed |= summary.is_none();
        summary
    }

    async fn ask_summariser(
        &self,
        summarizer: &crate::summarize::Summarizer,
        plan: &engine::Plan,
        options: &engine::Options,
        window: u64,
    ) -> Option<engine::Summary> {
        let call = Call {
            parts: self.ctx.parts,
            model: &self.ctx.head.model,
            window,
            id: self.ctx.id,
            dialect: self.ctx.dialect,
        };
        let middle = Middle::of_plan(plan, options);
        let work = || summarizer.summarize(self.ctx.app.shared(), &call, &middle);
        match &self.ctx.app.checkpoints {
            // Concurrent requests of one conversation wait for one call.
            Some(cache) => {
                let partition = self.work.partition.unwrap_or_else(|| self.ctx.partition());
                let key =
                    checkpoint::hash::middle_key(partition, plan.previous_summary(), plan.turns());
                cache.summarise(&self.ctx.seal(cache), key, work).await
            }
            None => work().await,
        }
    }
}
