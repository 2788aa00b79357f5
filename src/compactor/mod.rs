//! Compaction as one service, the same for every API dialect and every caller: the request
//! loop, the background preparation, Codex's compaction requests and the offline command
//! all drive a [`Compactor`]. Given a conversation in the engine's chat view (with the
//! counts already made of it), what to aim at and the checkpoint it was resumed from, it
//! gives the rewritten view, the engine's report and the checkpoint the result makes for
//! the conversation's later turns.
//!
//! It owns the three parts of a compaction: the pure engine ([`crate::engine`]), the LLM
//! summariser ([`crate::summarize`]) with the single flight that lets concurrent requests
//! of one conversation share one call and the deterministic digest it falls back to, and
//! checkpoint derivation ([`checkpoint`]). The summariser is called from one place,
//! [`Compactor::llm_summary`].

mod checkpoint;

use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use serde_json::Value;

use crate::checkpoint::hash::middle_key;
use crate::checkpoint::{Applied, Checkpoint, Checkpoints, Key, Partition};
use crate::dialect::Dialect;
use crate::engine::{self, Message, Options, Report, Summary, SummarySource};
use crate::metrics::Metrics;
use crate::summarize::{summary_budget, Call, Ledger, Middle, Summarizer};
use crate::units::{Limit, Ours, Window, DEFAULT_WINDOW};
use crate::windows::ModelWindows;

pub use checkpoint::{messages_of, NewCheckpoint};

/// What compactions need, borrowed from whoever runs them: the proxy's shared state, or
/// the offline command's own.
#[derive(Clone, Copy)]
pub struct Compactor<'a> {
    /// The LLM summariser; `None`: the deterministic digest only.
    pub summarizer: Option<&'a Summarizer>,
    /// The summary cache, whose single flight summariser calls go through and for which
    /// checkpoints are derived; `None`: neither.
    pub checkpoints: Option<&'a Checkpoints>,
    pub metrics: &'a Metrics,
    pub windows: &'a ModelWindows,
}

/// The client request a compaction is made for: its credentials pay for the summary, its
/// dialect is the one the summariser is asked in, and its partition is where concurrent
/// requests of the conversation meet.
pub struct Caller<'a> {
    pub parts: &'a Parts,
    pub model: &'a str,
    pub dialect: Dialect,
    /// The request id, for log lines.
    pub id: u64,
    pub partition: Partition,
}

impl<'a> Caller<'a> {
    /// The caller for a request of `model` in `dialect`; `partition` is taken rather than
    /// derived from `parts` because the request loop has already hashed it once.
    pub fn new(
        parts: &'a Parts,
        model: &'a str,
        dialect: Dialect,
        id: u64,
        partition: Partition,
    ) -> Caller<'a> {
        Caller {
            parts,
            model,
            dialect,
            id,
            partition,
        }
    }
}

/// A conversation as compaction starts from it: the client's request (resumed from its
/// checkpoint, with a lowered completion cap when one was needed) in the engine's chat
/// view, with our count of each message and of the whole once made.
pub struct Base {
    pub view: Value,
    /// The client's own request, which a view is written back into, for dialects that
    /// are not the view itself.
    pub source: Option<Value>,
    pub counts: Option<Vec<usize>>,
    pub tokens: Option<Ours>,
}

impl Base {
    /// A request's view, not yet counted.
    pub fn new(view: Value, source: Option<Value>) -> Base {
        Base {
            view,
            source,
            counts: None,
            tokens: None,
        }
    }

    /// Our token count of the whole, counting each message on first use.
    pub fn count(&mut self) -> Ours {
        if let Some(tokens) = self.tokens {
            return tokens;
        }
        let counts = engine::count_messages(&self.view);
        let overhead = engine::Counter::for_request(&self.view).request_overhead(&self.view);
        let tokens = Ours((counts.iter().sum::<usize>() + overhead) as u64);
        self.counts = Some(counts);
        self.tokens = Some(tokens);
        tokens
    }
}

/// A stored checkpoint put in place of the client's prefix.
#[derive(Clone)]
pub struct Resumed {
    pub key: Key,
    pub checkpoint: Arc<Checkpoint>,
    pub applied: Applied,
    /// The client's request, for the header and the metrics.
    pub messages_before: usize,
    pub tokens_before: Ours,
}

/// What one compaction is asked to do.
pub struct Order<'a> {
    /// The engine's limits: its target and ceiling in our tokens.
    pub options: Options,
    /// Limits with a higher target, taken instead when pruning alone reaches it: a summary
    /// is made only when it must be, and then to `options`' deeper target.
    pub relaxed: Option<Options>,
    /// The model's window, which the summary's share is read from.
    pub window: Option<Window>,
    /// Who may be asked for an LLM summary; `None`: the digest only.
    pub summariser: Option<&'a Caller<'a>>,
    /// A digest that stood in for the conversation's summary, whose messages the base
    /// holds again as the client sent them: the summariser is given it as the checkpoint
    /// to update, so that its answer is held to every fact of it, as an update of an
    /// earlier summary is, while reading the messages the digest cut.
    pub carried: Option<&'a str>,
    /// The conversation's checkpoint keys, when the result should make a checkpoint.
    pub keys: Option<Keys<'a>>,
}

/// Where a compaction's checkpoint goes: the conversation's partition, the hash of every
/// prefix of the client's messages, and the checkpoint the base was resumed from.
pub struct Keys<'a> {
    pub partition: Partition,
    pub hashes: &'a [u128],
    pub resumed: Option<&'a Resumed>,
    /// The summariser failed for this request before (an earlier attempt's call): a
    /// digest in this compaction's summary stands in for it too.
    pub summariser_failed: bool,
}

/// What one compaction made.
pub struct Compaction {
    /// The rewritten view; `None` when the engine kept the request as it was.
    pub view: Option<Value>,
    pub report: Report,
    /// The checkpoint the rewritten view makes, stored once the upstream takes it.
    pub checkpoint: Option<NewCheckpoint>,
    /// The summariser was asked and gave nothing usable: the summary is the digest.
    pub summariser_failed: bool,
}

/// Why a compaction made nothing.
#[derive(Debug, thiserror::Error)]
pub enum Declined {
    /// The engine cannot shrink this request (not a conversation it can read).
    #[error("the engine declined the request: {0}")]
    Engine(#[from] engine::EngineError),
    /// The engine's task ended without an answer (it panicked); the base went with it.
    #[error("the compaction engine failed: {0}")]
    Lost(#[from] tokio::task::JoinError),
}

/// The plan a compaction of `base` finishes, with the limits it was made to: `options`',
/// unless that plan needs a summary and the `relaxed` limits' plan does not (pruning alone
/// reaches their higher target), which is then taken instead.
pub fn plan(
    base: &Base,
    options: Options,
    relaxed: Option<Options>,
) -> (Options, Result<engine::Plan, engine::EngineError>) {
    let counts = base.counts.as_deref();
    let plan = engine::plan_with_counts(&base.view, counts, &options);
    let pruned = match (&plan, relaxed) {
        (Ok(plan), Some(relaxed)) if plan.needs_summary() => {
            engine::plan_with_counts(&base.view, counts, &relaxed)
                .ok()
                .filter(|pruned| !pruned.needs_summary())
                .map(|pruned| (relaxed, Ok(pruned)))
        }
        _ => None,
    };
    pruned.unwrap_or((options, plan))
}

impl Compactor<'_> {
    /// Plans, asks the summariser for the middle when the plan needs a summary and the
    /// order allows it, finishes, and derives the checkpoint. The engine's work runs on a
    /// thread that may block (milliseconds for huge conversations, kept off the threads
    /// that move other requests' bytes); `base` is moved there and handed back, since
    /// cloning a conversation of a million tokens costs as much as compacting it. A base
    /// lost with a failed task comes back as `None`.
    pub async fn compact(
        &self,
        base: Base,
        order: Order<'_>,
    ) -> (Option<Base>, Result<Compaction, Declined>) {
        let started = Instant::now();
        let (options, relaxed) = (order.options, order.relaxed);
        let planned = tokio::task::spawn_blocking(move || {
            let (options, plan) = plan(&base, options, relaxed);
            (base, options, plan)
        })
        .await;
        let (base, options, plan) = match planned {
            Ok(planned) => planned,
            Err(e) => return (None, Err(e.into())),
        };
        // The summariser's call is network time, not engine work: it is left out.
        let planning = started.elapsed();
        let plan = match plan {
            Ok(plan) => plan,
            Err(e) => {
                self.metrics.compaction_time(planning);
                return (Some(base), Err(e.into()));
            }
        };
        let mut summariser_failed = false;
        let summary = match order.summariser {
            Some(caller) if plan.needs_summary() => {
                let mut middle = Middle::of_plan(&plan, &options);
                middle.previous = middle.previous.or(order.carried);
                let summary = self.llm_summary(&middle, caller, order.window).await;
                summariser_failed = summary.is_none() && self.summarizer.is_some();
                summary
            }
            _ => None,
        };
        let started = Instant::now();
        let finished =
            tokio::task::spawn_blocking(move || engine::finish(plan, summary, &options)).await;
        self.metrics.compaction_time(planning + started.elapsed());
        let rewrite = match finished {
            Ok(rewrite) => rewrite,
            Err(e) => return (Some(base), Err(e.into())),
        };
        // A rewrite that removes nothing (everything left is instructions and the turn in
        // progress) would only change bytes the upstream's prompt cache holds.
        let report = rewrite.report;
        let saved = report.tokens_after < report.tokens_before
            || report.messages_after < report.messages_before;
        let view = rewrite.rewritten.filter(|_| saved);
        let checkpoint = match (&view, &order.keys) {
            (Some(view), Some(keys)) if self.checkpoints.is_some() => checkpoint::derive(
                &base,
                keys,
                view,
                &report,
                summariser_failed || keys.summariser_failed,
            ),
            _ => None,
        };
        let compaction = Compaction {
            view,
            report,
            checkpoint,
            summariser_failed,
        };
        (Some(base), Ok(compaction))
    }

    /// The summary of a whole history (Codex's compaction requests): the LLM's, else the
    /// deterministic digest, or an earlier summary standing alone as it is.
    pub async fn summarise(
        &self,
        turns: &[Message],
        previous: Option<&str>,
        replaced: Ours,
        caller: &Caller<'_>,
        window: Option<Window>,
    ) -> Summary {
        let context_window = window.unwrap_or(DEFAULT_WINDOW);
        let middle = Middle {
            turns,
            previous,
            after: turns,
            budget_cap: Limit::Unbounded,
            context_window: Some(context_window),
        };
        if let Some(summary) = self.llm_summary(&middle, caller, window).await {
            return summary;
        }
        if let Some(reused) = engine::reused_summary(turns, previous) {
            return reused;
        }
        let budget = summary_budget(replaced.usize(), context_window.usize());
        Summary {
            text: engine::digest::digest(previous, turns, budget * 4),
            source: SummarySource::Fallback,
        }
    }

    /// The LLM's summary of `middle`, asked once for every concurrent request of the
    /// conversation when the summary cache is on; `None` when no summariser is configured
    /// or it gave nothing usable (the caller then falls back to the digest).
    async fn llm_summary(
        &self,
        middle: &Middle<'_>,
        caller: &Caller<'_>,
        window: Option<Window>,
    ) -> Option<Summary> {
        let summarizer = self.summarizer?;
        let call = Call {
            parts: caller.parts,
            model: caller.model,
            window,
            id: caller.id,
            dialect: caller.dialect,
        };
        let ledger = Ledger {
            metrics: self.metrics,
            windows: self.windows,
        };
        let work = || summarizer.summarize(ledger, &call, middle);
        let mut span = crate::telemetry::child("summarise");
        let summary = match self.checkpoints {
            Some(cache) => {
                let key = middle_key(caller.partition, middle.previous, middle.turns);
                let seal = cache.seal(&caller.parts.headers);
                cache.summarise(&seal, key, work).await
            }
            None => work().await,
        };
        if let (Some(span), None) = (&mut span, &summary) {
            span.failed("no_summary");
        }
        summary
    }
}
