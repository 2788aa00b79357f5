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
//! [`Compactor::llm_summary`]; whether a digest that stood in for the conversation's
//! summary is updated or summarised anew from the client's own messages is decided in one
//! place too ([`Anew`]), for every caller.

// No function longer than a screen: a phase that grows past it is two phases.

mod checkpoint;
mod restore;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use serde_json::{Map, Value};

use crate::checkpoint::hash::middle_key;
use crate::checkpoint::{Applied, Checkpoint, Checkpoints, Key, Partition};
use crate::dialect::Dialect;
use crate::engine::message::content_text;
use crate::engine::{self, summary, Message, Options, Report, Summary, SummarySource};
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
    /// The engine's limits.
    pub limits: Limits,
    /// The model's window, which the summary's share is read from.
    pub window: Option<Window>,
    /// Who may be asked for an LLM summary; `None`: the digest only.
    pub summariser: Option<&'a Caller<'a>>,
    /// The client's own request, in the caller's dialect: when the base is it resumed from
    /// a checkpoint (`keys.resumed`) whose summary is a digest standing in for one, the
    /// summary is made anew from its messages (see [`Anew`]).
    pub original: Option<Bytes>,
    /// The client's request waits for this compaction (it is in the request's path, not a
    /// preparation): what is summarised anew is then bounded ([`ANEW_WAITED_WINDOWS`]).
    pub waited_for: bool,
    /// The conversation's checkpoint keys, when the result should make a checkpoint.
    pub keys: Option<Keys<'a>>,
}

/// Where a compaction's checkpoint goes: the conversation's partition, the hash of every
/// prefix of the client's messages, and the checkpoint the base was resumed from.
#[derive(Clone, Copy)]
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

/// The engine's limits for one compaction: the deep ones, and relaxed ones with a higher
/// target, taken instead when pruning alone reaches it: a summary is made only when it
/// must be, and then to the deep limits' target.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The target and ceiling in our tokens.
    pub deep: Options,
    pub relaxed: Option<Options>,
}

impl Limits {
    /// Limits with nothing relaxed.
    pub fn deep(deep: Options) -> Limits {
        Limits {
            deep,
            relaxed: None,
        }
    }

    /// The limits pruning alone stops at: the relaxed ones when there are, else the deep.
    pub fn pruning(&self) -> &Options {
        self.relaxed.as_ref().unwrap_or(&self.deep)
    }

    /// The plan a compaction of `base` finishes, with the limits it was made to: the deep
    /// ones, unless that plan needs a summary and the relaxed limits' plan does not
    /// (pruning alone reaches their higher target), which is then taken instead.
    fn plan(&self, base: &Base) -> (Options, Result<engine::Plan, engine::EngineError>) {
        let plan = plan_of(base, &self.deep);
        let pruned = match (&plan, &self.relaxed) {
            (Ok(plan), Some(relaxed)) if plan.needs_summary() => plan_of(base, relaxed)
                .ok()
                .filter(|pruned| !pruned.needs_summary())
                .map(|pruned| (relaxed.clone(), Ok(pruned))),
            _ => None,
        };
        pruned.unwrap_or_else(|| (self.deep.clone(), plan))
    }
}

/// The engine's plan of `base` at `options`, with the counts already made of it: the one
/// place a compaction is planned.
fn plan_of(base: &Base, options: &Options) -> Result<engine::Plan, engine::EngineError> {
    engine::plan_with_counts(&base.view, base.counts.as_deref(), options)
}

/// Whether the cheap passes (pruning above all) bring `base`, over the target of
/// `options`, under it: a compaction without a summary.
pub fn prunes_alone(base: &Base, options: &Options) -> bool {
    plan_of(base, options).is_ok_and(|plan| plan.prunes_alone())
}

/// Whether a compaction of `base` to `options` needs no summary.
pub fn needs_no_summary(base: &Base, options: &Options) -> bool {
    plan_of(base, options).is_ok_and(|plan| !plan.needs_summary())
}

/// A conversation resumed from a checkpoint whose summary is a digest standing in for one
/// (the refused turn's, made at once while the window was being learned, or one the
/// summariser failed to replace), summarised anew from the client's own messages instead
/// of by updating the digest. The digest kept what its budget allowed of the messages it
/// replaced; the client still sends them all, and an update of the digest would never
/// show the summariser what it cut. The digest is given to the summariser as the
/// checkpoint to update, so that its answer is held to every fact of it, as an update of
/// an earlier summary is. One rule for every event, prepared or made in the request's
/// path.
struct Anew {
    digest: String,
    /// The client's request, in `dialect`.
    original: Bytes,
    dialect: Dialect,
    /// The most tokens of the client's turns summarised anew; past that the digest is
    /// updated with the turns since, as an LLM summary is.
    within: Limit,
}

/// Windows' worth of the client's turns an event the request waits for summarises anew,
/// at most. The range a stand-in digest replaced is usually about a window (the digest's
/// event and the next one's growth): two summariser calls, which that event waits for
/// anyway. A client that arrives with a history many windows long would otherwise wait
/// for a call per window before its answer; a preparation, which no request waits for,
/// has no bound.
const ANEW_WAITED_WINDOWS: usize = 2;

impl Anew {
    /// What `order` summarises anew: only where an LLM summary may be asked for (a digest
    /// standing in is replaced by the LLM's summary, not by another digest) and the base
    /// was resumed from a stand-in digest.
    fn of(order: &Order<'_>) -> Option<Anew> {
        let caller = order.summariser?;
        let hit = order.keys.as_ref()?.resumed?;
        let window = order.window.unwrap_or(DEFAULT_WINDOW);
        Some(Anew {
            digest: stand_in_digest(&hit.checkpoint)?,
            original: order.original.clone()?,
            dialect: caller.dialect,
            within: if order.waited_for {
                Limit::At(window.usize().saturating_mul(ANEW_WAITED_WINDOWS))
            } else {
                Limit::Unbounded
            },
        })
    }

    /// The client's own messages in place of the resumed form in `base`, every other field
    /// of it kept (a completion cap lowered to fit, for one), counted.
    fn client(&self, base: &Base) -> Option<Base> {
        let messages = match self.dialect.view(&self.original)? {
            (Value::Object(mut client), _) => client.remove("messages")?,
            _ => return None,
        };
        // The resumed form's messages are not cloned only to be replaced.
        let mut view: Map<String, Value> = base
            .view
            .as_object()?
            .iter()
            .map(|(name, value)| match name.as_str() {
                "messages" => (name.clone(), Value::Null),
                _ => (name.clone(), value.clone()),
            })
            .collect();
        // In the resumed form's place: the fields keep their order.
        view.insert("messages".to_owned(), messages);
        let mut client = Base::new(Value::Object(view), None);
        client.count();
        Some(client)
    }
}

/// The digest a checkpoint carries in place of a summary; `None` when its summary is the
/// LLM's (updated as it is, iteratively) or it has none.
fn stand_in_digest(checkpoint: &Checkpoint) -> Option<String> {
    if checkpoint.summary != SummarySource::Fallback {
        return None;
    }
    checkpoint
        .messages
        .iter()
        .find_map(|m| summary::extract(&content_text(m.get("content"))).map(|(body, _)| body))
}

/// What a compaction finishes, planned on a thread that may block.
struct Planned {
    /// The base as it was given, handed back to the caller.
    base: Base,
    options: Options,
    plan: Result<engine::Plan, engine::EngineError>,
    /// The client's own request and the digest it is summarised anew beside ([`Anew`]),
    /// when the plan is of it rather than of the base.
    anew: Option<(Base, String)>,
}

impl Planned {
    /// The plan of `base`; when it needs a summary and `anew` is given, the plan of the
    /// client's own request instead, if that needs one too (what pruning alone does is
    /// done from the form in place, without a summariser call). The client's request is
    /// read and counted only then, so a conversation that needs no summary is planned once.
    fn new(base: Base, limits: &Limits, anew: Option<Anew>) -> Planned {
        let (chosen, resumed) = limits.plan(&base);
        let summarises = resumed.as_ref().is_ok_and(engine::Plan::needs_summary);
        let client = anew.filter(|_| summarises).and_then(|anew| {
            let client = anew.client(&base)?;
            let (options, planned) = limits.plan(&client);
            let planned = planned.ok().filter(engine::Plan::needs_summary)?;
            let turns: usize = planned.turns().iter().map(|m| m.tokens).sum();
            if anew.within < Limit::At(turns) {
                return None;
            }
            Some((options, planned, client, anew.digest))
        });
        match client {
            Some((options, planned, client, digest)) => Planned {
                base,
                options,
                plan: Ok(planned),
                anew: Some((client, digest)),
            },
            None => Planned {
                base,
                options: chosen,
                plan: resumed,
                anew: None,
            },
        }
    }
}

/// The checkpoint `view`, made anew from the client's own request, makes: it starts from
/// the client's first message, as a first compaction's does, and supersedes the
/// checkpoint the conversation was resumed from.
fn fresh(
    client: &Base,
    keys: &Keys<'_>,
    view: &Value,
    report: &Report,
    failed: bool,
) -> Option<NewCheckpoint> {
    let first = Keys {
        resumed: None,
        ..*keys
    };
    let mut checkpoint = checkpoint::derive(client, &first, view, report, failed)?;
    checkpoint.replaces = keys.resumed.map(|hit| hit.key);
    Some(checkpoint)
}

/// `turns`, which a summary of a conversation resumed from a checkpoint replaces, in the
/// client's own text where an earlier event shortened them ([`restore`]); `None` when it
/// was not resumed, is summarised anew from the client's messages already, or nothing in
/// them was shortened.
fn resumed_whole(
    order: &Order<'_>,
    anew: bool,
    turns: &[Message],
    caller: &Caller<'_>,
    base: &Base,
) -> Option<Vec<Message>> {
    order.keys.as_ref()?.resumed?;
    let original = order.original.as_ref().filter(|_| !anew)?;
    let counter = engine::Counter::for_request(&base.view);
    restore::client_text(turns, original, caller.dialect, &counter)
}

impl Compactor<'_> {
    /// Plans (the client's own messages, when the base was resumed from a stand-in digest
    /// and needs a summary: see [`Anew`]), asks the summariser for the middle when the
    /// plan needs a summary and the order allows it, finishes, and derives the
    /// checkpoint. The engine's work runs on a thread that may block (milliseconds for
    /// huge conversations, kept off the threads that move other requests' bytes); `base`
    /// is moved there and handed back, since cloning a conversation of a million tokens
    /// costs as much as compacting it. A base lost with a failed task comes back as
    /// `None`.
    pub async fn compact(
        &self,
        base: Base,
        order: Order<'_>,
    ) -> (Option<Base>, Result<Compaction, Declined>) {
        let started = Instant::now();
        let limits = order.limits.clone();
        let anew = Anew::of(&order);
        let planned = tokio::task::spawn_blocking(move || Planned::new(base, &limits, anew)).await;
        let Planned {
            base,
            options,
            plan,
            anew,
        } = match planned {
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
                let carried = anew.as_ref().map(|(_, digest)| digest.as_str());
                middle.previous = middle.previous.or(carried);
                // What the summary will stand for, folds and all, then in the client's
                // own text.
                let widened = plan.with_folds(middle.turns, &options);
                if let Some(turns) = &widened {
                    middle.turns = turns;
                }
                let restored = resumed_whole(&order, anew.is_some(), middle.turns, caller, &base);
                if let Some(turns) = &restored {
                    middle.turns = turns;
                }
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
            (Some(view), Some(keys)) if self.checkpoints.is_some() => {
                let failed = summariser_failed || keys.summariser_failed;
                match &anew {
                    Some((client, _)) => fresh(client, keys, view, &report, failed),
                    None => checkpoint::derive(&base, keys, view, &report, failed),
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Applied;
    use serde_json::json;

    const PLANTED: &str = "The release codename is HERON-7731.";

    /// Turn `n` of a review: a draft section to read and the reply, prose that no pruning
    /// shortens; turn 1's holds [`PLANTED`].
    fn turn(n: usize) -> [Value; 2] {
        let draft = format!("Section {n} of the draft, paragraph after paragraph. ").repeat(40);
        let draft = match n {
            1 => format!("{draft}{PLANTED}{draft}"),
            _ => draft,
        };
        let reply = format!("Section {n} reads well. ").repeat(10);
        [
            json!({"role": "user", "content": format!("Review this.\n{draft}")}),
            json!({"role": "assistant", "content": reply}),
        ]
    }

    /// The client's request of `turns` turns, then the ask in progress.
    fn client(turns: usize) -> Value {
        let mut messages = vec![json!({"role": "system", "content": "You review drafts."})];
        messages.extend((0..turns).flat_map(turn));
        messages.push(json!({"role": "user", "content": "And the conclusion?"}));
        json!({"model": "gpt-4o", "max_tokens": 4000, "messages": messages})
    }

    /// A checkpoint of the client's first nine messages (the system prompt and four
    /// turns) whose summary is `summary`, from `source`.
    fn form(summary: &str, source: SummarySource) -> Checkpoint {
        let messages = vec![
            json!({"role": "system", "content": "You review drafts."}),
            json!({"role": "user", "content": summary::wrap(summary)}),
        ];
        Checkpoint::new(9, 9_000, messages, vec![10, 100], None, 0).with_summary(source, false)
    }

    /// The client's request of `turns` turns resumed from a stand-in digest of its first
    /// four, with the completion cap lowered to fit.
    fn resumed(turns: usize) -> Base {
        let mut view = client(turns);
        let digest = form("## Requests\n- Review the draft.", SummarySource::Fallback);
        let messages = view["messages"].as_array_mut().unwrap();
        messages.splice(..9, digest.messages);
        view["max_tokens"] = json!(1000);
        let mut base = Base::new(view, None);
        base.count();
        base
    }

    fn anew(turns: usize) -> Anew {
        Anew {
            digest: "## Requests\n- Review the draft.".to_owned(),
            original: Bytes::from(client(turns).to_string()),
            dialect: Dialect::Chat,
            within: Limit::Unbounded,
        }
    }

    fn target(tokens: usize) -> Options {
        Options {
            target_tokens: Some(tokens),
            ceiling_tokens: Some(tokens * 2),
            ..Options::default()
        }
    }

    #[test]
    fn a_digest_standing_in_for_the_summary_is_summarised_anew() {
        let digest = "## Requests\n- Fix the failing tests.";
        let stand_in = form(digest, SummarySource::Fallback);
        assert_eq!(stand_in_digest(&stand_in).as_deref(), Some(digest));
        // The digest that stands in for a summariser that failed, too.
        let failed =
            form(digest, SummarySource::Fallback).with_summary(SummarySource::Fallback, true);
        assert_eq!(stand_in_digest(&failed).as_deref(), Some(digest));
    }

    #[test]
    fn an_llm_summary_is_updated_as_it_is() {
        let llm = form("## Active Task\nFix the tests.", SummarySource::Llm);
        assert_eq!(stand_in_digest(&llm), None);
        let pruned = form("", SummarySource::None);
        assert_eq!(stand_in_digest(&pruned), None);
    }

    /// The rule is the compactor's, whoever drives it: an order resumed from a stand-in
    /// digest, with the client's request at hand and the summariser to ask, summarises
    /// anew; one that may only digest, or whose summary is the LLM's, updates.
    #[test]
    fn only_an_order_that_asks_the_summariser_summarises_a_stand_in_digest_anew() {
        let (parts, ()) = http::Request::new(()).into_parts();
        let partition = Partition::new(&parts.headers, "", "gpt-4o");
        let caller = Caller::new(&parts, "gpt-4o", Dialect::Chat, 1, partition);
        let hit = |source| Resumed {
            key: Key {
                partition,
                prefix: 7,
            },
            checkpoint: Arc::new(form("## Requests\n- Review.", source)),
            applied: Applied {
                form_len: 2,
                prefix_len: 9,
            },
            messages_before: 12,
            tokens_before: Ours(9_000),
        };
        let (digest, llm) = (hit(SummarySource::Fallback), hit(SummarySource::Llm));
        let order = |resumed, summariser, original: Option<Bytes>| Order {
            limits: Limits::deep(Options::default()),
            window: None,
            summariser,
            original,
            waited_for: true,
            keys: Some(Keys {
                partition,
                hashes: &[],
                resumed,
                summariser_failed: false,
            }),
        };
        let original = || Some(Bytes::from(client(6).to_string()));
        let anew = Anew::of(&order(Some(&digest), Some(&caller), original())).unwrap();
        assert_eq!(anew.digest, "## Requests\n- Review.");
        // Waited for, with no window known: two of the default window's worth.
        assert_eq!(anew.within, Limit::At(2 * DEFAULT_WINDOW.usize()));
        assert!(Anew::of(&order(Some(&digest), None, original())).is_none());
        assert!(Anew::of(&order(Some(&llm), Some(&caller), original())).is_none());
        assert!(Anew::of(&order(Some(&digest), Some(&caller), None)).is_none());
        assert!(Anew::of(&order(None, Some(&caller), original())).is_none());
    }

    #[test]
    fn a_stand_in_digest_that_needs_a_summary_is_planned_from_the_clients_messages() {
        let base = resumed(8);
        let planned = Planned::new(base, &Limits::deep(target(1_500)), Some(anew(8)));
        let (client, digest) = planned.anew.expect("not summarised anew");
        assert_eq!(digest, "## Requests\n- Review the draft.");
        let plan = planned.plan.unwrap();
        let turns =
            serde_json::to_string(&plan.turns().iter().map(|m| &m.body).collect::<Vec<_>>());
        assert!(
            turns.unwrap().contains(PLANTED),
            "the middle is the digest's"
        );
        // The client's messages, with every other field as the base has it (its lowered
        // cap), in the order the client sent them.
        assert_eq!(client.view["max_tokens"], 1000);
        assert_eq!(client.view["messages"], client_messages(8));
        let names: Vec<_> = client.view.as_object().unwrap().keys().collect();
        assert_eq!(names, ["model", "max_tokens", "messages"]);
        // The base is handed back as it was given.
        assert_eq!(planned.base.view, resumed(8).view);
    }

    /// An event the request waits for summarises anew only a bounded range: past it, the
    /// digest is updated with the turns since, one call instead of one per window.
    #[test]
    fn an_event_the_request_waits_for_summarises_anew_only_a_bounded_range() {
        let anew_within = |within| {
            let planned = Planned::new(
                resumed(8),
                &Limits::deep(target(1_500)),
                Some(Anew { within, ..anew(8) }),
            );
            let turns: usize = planned
                .plan
                .as_ref()
                .unwrap()
                .turns()
                .iter()
                .map(|m| m.tokens)
                .sum();
            (planned.anew.is_some(), turns)
        };
        let (anew, turns) = anew_within(Limit::Unbounded);
        assert!(anew);
        assert_eq!(anew_within(Limit::At(turns)), (true, turns));
        let (anew, updated) = anew_within(Limit::At(turns - 1));
        assert!(!anew);
        assert!(updated < turns, "{updated} of {turns}");
    }

    fn client_messages(turns: usize) -> Value {
        client(turns)["messages"].clone()
    }

    /// A conversation as resumed that needs no summary is planned once: the client's
    /// request, which would need one, is not even read, and what the event needs is done
    /// from the form in place.
    #[test]
    fn a_stand_in_digest_that_needs_no_summary_is_kept() {
        let base = resumed(8);
        let options = target(base.tokens.unwrap().usize() * 5 / 4);
        let whole = engine::plan(&client(8), &options).unwrap();
        assert!(whole.needs_summary());
        let planned = Planned::new(base, &Limits::deep(options), Some(anew(8)));
        assert!(planned.anew.is_none());
        assert!(!planned.plan.unwrap().needs_summary());
    }
}
