//! Compaction as a prepared event. Past the prepare mark, the request is sent as it is and
//! the compaction the threshold will call for is made in the background, on a copy of the
//! conversation as the request has it, by the same [`Compactor`](crate::compactor)
//! ([`crate::checkpoint::coordination::prepared`] keeps the result aside). The turn that crosses the
//! threshold puts the prepared checkpoint in place of the client's prefix, as a resumed
//! conversation would be ([`Ready`], which the request's owner puts in place), and goes
//! without waiting for a summary; the upstream taking it makes it the conversation's
//! checkpoint.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::Request;

use super::policy::Goal;
use super::preflight;
use super::work::Work;
use super::Ctx;
use crate::app::App;
use crate::checkpoint::coordination::flight::Share;
use crate::checkpoint::coordination::prepared::{Conversation, Found, Ticket, Underway};
use crate::checkpoint::Prepared;
use crate::checkpoint::{Checkpoint, Key, Partition};
use crate::compactor::{self, Base, Caller, Keys, Order, Resumed};
use crate::dialect::Dialect;
use crate::engine::{self, SummarySource};
use crate::telemetry;
use crate::units::Ours;

/// What the background compaction of a request reads of it besides its context and work.
#[derive(Clone, Copy)]
pub(super) struct Done<'r> {
    /// The checkpoint it was resumed from.
    pub resumed: Option<&'r Resumed>,
    /// It is past asking the summariser.
    pub digest_only: bool,
}

/// Starts the background compaction of the request towards `goal`, unless the
/// conversation's stage has one prepared or running, here or on another replica, or
/// every preparation slot is busy.
pub(super) fn start(ctx: &Ctx<'_>, work: &mut Work, done: Done<'_>, goal: Goal) {
    let Some((prepared, at)) = preparation(ctx, work, done.resumed) else {
        return;
    };
    if prepared.holds(&at) {
        return;
    }
    let Some(&prefix) = at.prefixes.last() else {
        return;
    };
    let (partition, stage, hashes) = (at.partition, at.stage, at.prefixes.to_vec());
    let key = Key { partition, prefix };
    let Some(prepared) = ctx.app.prepared() else {
        return;
    };
    // The conversation as this request has it (resumed, counted): a copy, since the
    // request goes on with its own.
    let Some(base) = work.parsed().map(|base| Base {
        view: base.view.clone(),
        source: None,
        counts: base.counts.clone(),
        tokens: base.tokens,
    }) else {
        return;
    };
    let Some(ticket) = prepared.start(key, stage) else {
        return;
    };
    // Half a turn of the conversation's growth: turns vary about that much about it.
    let growth = preflight::growth(ctx, work, done.resumed);
    let job = Preparation {
        stage,
        spare: Ours(growth.ours(ctx.factor()).0 / 2),
        app: Arc::clone(ctx.app),
        parts: copy(ctx.parts),
        model: ctx.steering.model.clone(),
        dialect: ctx.dialect,
        id: ctx.id,
        partition,
        hashes,
        resumed: done.resumed.cloned(),
        digest_only: done.digest_only,
        original: work.original().clone(),
    };
    // In the trace of the request that started it: its summariser call is this request's
    // doing, even when it ends after the answer.
    let traced = telemetry::background("prepare compaction");
    let task = tokio::spawn(job.in_background(traced, ticket, base, goal));
    prepared.running(key, task.abort_handle());
    tracing::debug!(id = ctx.id, "preparing the next compaction");
}

/// A checkpoint prepared for the conversation's stage, to put in place of the client's
/// prefix it replaces (`key`).
pub(super) struct Ready {
    pub found: Found,
    pub key: Key,
}

/// At the threshold: the prepared checkpoint, waited for if its preparation is still
/// running, here or on another replica. `None` when there is none, or it would take the
/// request no further than its checkpoint.
pub(super) async fn take(
    ctx: &Ctx<'_>,
    work: &mut Work,
    resumed: Option<&Resumed>,
) -> Option<Ready> {
    let (prepared, at) = preparation(ctx, work, resumed)?;
    let (partition, stage, hashes) = (at.partition, at.stage, at.prefixes.to_vec());
    let local = prepared.take(&at).await;
    // One that would take the request no further than its checkpoint is of no use.
    let local = match local {
        Some(found) if behind(resumed, &found.checkpoint) => {
            prepared.unused(&found);
            None
        }
        local => local,
    };
    let found = match local {
        Some(found) => found,
        // None here: another replica may have prepared this stage's event.
        None => {
            let elsewhere = prepared_elsewhere(ctx, resumed, stage, &hashes).await?;
            Found::elsewhere(Arc::new(elsewhere))
        }
    };
    let Some(&prefix) = hashes.get(found.checkpoint.prefix_len) else {
        prepared.unused(&found);
        return None;
    };
    let key = Key { partition, prefix };
    Some(Ready { found, key })
}

/// Whether the prepared form in place leaves the request above the event's mark (the
/// turn that was in progress when it was made is still whole) and pruning alone brings
/// it down: the event then prunes on from it, so that it buys several turns, not one.
pub(super) fn prunes_on(work: &Work, goal: Goal) -> bool {
    work.parsed()
        .is_some_and(|base| compactor::prunes_alone(base, goal.limits().pruning()))
}

/// Where this conversation's next event is being prepared right now, if it is.
pub(super) fn preparing(
    ctx: &Ctx<'_>,
    work: &mut Work,
    resumed: Option<&Resumed>,
) -> Option<Underway> {
    let (prepared, at) = preparation(ctx, work, resumed)?;
    prepared.in_progress(&at)
}

/// Cancels the conversation's running preparation: this turn's event is made without it,
/// which leaves it behind, and the next event is prepared from this one.
pub(super) fn discard(ctx: &Ctx<'_>, work: &mut Work, resumed: Option<&Resumed>) {
    if let Some((prepared, at)) = preparation(ctx, work, resumed) {
        prepared.discard(&at);
    }
}

/// Whether the conversation's running preparation, here or on another replica, ends
/// within `wait`.
pub(super) async fn prepared_within(
    ctx: &Ctx<'_>,
    work: &mut Work,
    resumed: Option<&Resumed>,
    underway: Underway,
    wait: Duration,
) -> bool {
    let Some((prepared, at)) = preparation(ctx, work, resumed) else {
        return false;
    };
    match underway {
        Underway::Here => prepared.ends_within(&at, wait).await,
        Underway::Elsewhere => {
            let Some(cache) = &ctx.app.checkpoints else {
                return false;
            };
            let seal = ctx.seal(cache);
            cache.prepared_elsewhere_within(&seal, at.stage, wait).await
        }
    }
}

/// Where this conversation's preparations are kept, and the conversation as the request
/// has it. `None` when preparations are off.
fn preparation<'r>(
    ctx: &Ctx<'r>,
    work: &'r mut Work,
    resumed: Option<&'r Resumed>,
) -> Option<(&'r Prepared, Conversation<'r>)> {
    let prepared = ctx.app.prepared()?;
    let partition = *work.partition.get_or_insert_with(|| ctx.partition());
    let prefixes = work.hashes(ctx.dialect, partition)?;
    let at = Conversation {
        partition,
        prefixes,
        stage: stage(partition, resumed, prefixes),
        resumed: resumed.map(|hit| &*hit.checkpoint),
    };
    Some((prepared, at))
}

/// The checkpoint another replica prepared for the conversation's `stage`, waited for
/// while it runs, if it replaces a prefix of this request's messages (`hashes`) and takes
/// it further than the checkpoint it is resumed from.
async fn prepared_elsewhere(
    ctx: &Ctx<'_>,
    resumed: Option<&Resumed>,
    stage: u128,
    hashes: &[u128],
) -> Option<Checkpoint> {
    let cache = ctx.app.checkpoints.as_ref()?;
    let (prefix, checkpoint) = cache.prepared_elsewhere(&ctx.seal(cache), stage).await?;
    (hashes.get(checkpoint.prefix_len) == Some(&prefix) && !behind(resumed, &checkpoint))
        .then_some(checkpoint)
}

/// Whether a prepared checkpoint would take the request no further than the one it is
/// resumed from: it replaces fewer of the client's messages, or is that checkpoint.
fn behind(resumed: Option<&Resumed>, prepared: &Checkpoint) -> bool {
    resumed.is_some_and(|hit| {
        let resumed = hit.applied.prefix_len;
        resumed > prepared.prefix_len
            || (resumed == prepared.prefix_len && hit.checkpoint.messages == prepared.messages)
    })
}

/// Names the stage a conversation is at for its preparation, the same on every turn
/// between two of its compactions and on every replica: the checkpoint it is resumed from,
/// or, before its first compaction, its first messages. Two conversations that start alike
/// share the name; what one prepares is taken by the other only if it replaces the same
/// messages.
fn stage(partition: Partition, resumed: Option<&Resumed>, hashes: &[u128]) -> u128 {
    let anchor = match resumed {
        Some(hit) => hit.key.prefix,
        None => hashes[hashes.len().saturating_sub(1).min(FIRST_MESSAGES)],
    };
    let mut bytes = [0u8; 48];
    bytes[..16].copy_from_slice(&partition.scope.to_le_bytes());
    bytes[16..32].copy_from_slice(&anchor.to_le_bytes());
    bytes[32..].copy_from_slice(b"prepared-compact");
    xxhash_rust::xxh3::xxh3_128(&bytes)
}

/// How many first messages name a conversation not yet compacted: the system prompt, the
/// first ask and the first answer.
const FIRST_MESSAGES: usize = 3;

/// What a preparation needs, owned: it outlives the request that started it.
struct Preparation {
    /// The conversation's stage, as [`stage`] names it.
    stage: u128,
    app: Arc<App>,
    /// The client's request head, whose credentials pay for the summary.
    parts: Parts,
    model: String,
    dialect: Dialect,
    id: u64,
    partition: Partition,
    /// The hash of every prefix of the client's messages.
    hashes: Vec<u128>,
    /// The checkpoint the conversation was resumed from.
    resumed: Option<Resumed>,
    /// The conversation is past asking the summariser.
    digest_only: bool,
    /// How far below the goal's relaxed target pruning must reach for the event to be
    /// left to prune alone ([`event_prunes_alone`]).
    spare: Ours,
    /// The client's request: a conversation resumed from a digest standing in for its
    /// summary is summarised anew from it (the compactor's rule, [`Order::original`]).
    original: Bytes,
}

impl Preparation {
    /// Runs the preparation, in the request's trace when it is `traced`, and hands its end
    /// to the conversation's preparations.
    async fn in_background(
        self,
        traced: Option<(telemetry::ChildSpan, telemetry::Background)>,
        ticket: Ticket,
        base: Base,
        goal: Goal,
    ) {
        let app = Arc::clone(&self.app);
        let ended = match traced {
            Some((_span, parent)) => telemetry::in_background(parent, self.run(base, goal)).await,
            None => self.run(base, goal).await,
        };
        if let Some(prepared) = app.prepared() {
            prepared.finish(ticket, ended);
        }
    }

    /// The checkpoint the compaction of `base` towards `goal` makes, exactly as the
    /// request's own compaction would have made it; with a shared store, the one another
    /// replica prepared for this stage of the conversation, if it replaces the same
    /// messages, or none when another replica is preparing it now.
    async fn run(self, base: Base, goal: Goal) -> Share<Option<Checkpoint>> {
        let Some(cache) = self.app.checkpoints.as_ref() else {
            return Share::Made(None);
        };
        let shared = cache
            .prepare_once(&cache.seal(&self.parts.headers), self.stage, || {
                self.compact(base, goal)
            })
            .await;
        shared.map(|made| {
            let (prefix, checkpoint) = made?;
            (self.hashes.get(checkpoint.prefix_len) == Some(&prefix)).then_some(checkpoint)
        })
    }

    /// The compaction itself, with the prefix hash its checkpoint replaces.
    async fn compact(&self, base: Base, goal: Goal) -> Option<(u128, Checkpoint)> {
        // Planning a large conversation takes milliseconds: off the runtime's threads.
        let spare = self.spare;
        let (base, alone) = tokio::task::spawn_blocking(move || {
            // Two plans, not one read twice: the event is planned a turn ahead (the turn in
            // progress pruned as history, the target lowered by `spare`), the compactor's
            // plan for now keeps that turn whole at the goal's own targets.
            let alone = event_prunes_alone(&base, goal, spare);
            (base, alone)
        })
        .await
        .ok()?;
        if alone {
            tracing::debug!(
                id = self.id,
                "the event will prune alone: nothing to prepare"
            );
            return None;
        }
        let caller = Caller::new(
            &self.parts,
            &self.model,
            self.dialect,
            self.id,
            self.partition,
        );
        let order = Order {
            limits: goal.limits(),
            window: goal.window,
            summariser: (!self.digest_only).then_some(&caller),
            original: Some(self.original.clone()),
            waited_for: false,
            keys: Some(Keys {
                partition: self.partition,
                hashes: &self.hashes,
                resumed: self.resumed.as_ref(),
                summariser_failed: false,
            }),
        };
        let (_, result) = self.app.compactor().compact(base, order).await;
        let compaction = result
            .inspect_err(|e| tracing::debug!(id = self.id, reason = %e, "nothing prepared"))
            .ok()?;
        let report = &compaction.report;
        // Pruning alone costs milliseconds: the event makes it itself, from the turn it
        // comes with, whose previous turn it can prune too (a pruning prepared now would
        // leave that turn whole, and the event a turn less of room).
        if report.summary == SummarySource::None {
            tracing::debug!(id = self.id, "pruning alone: nothing to prepare");
            return None;
        }
        tracing::info!(
            id = self.id,
            tokens_before = report.tokens_before,
            tokens_after = report.tokens_after,
            summary = report.summary.as_str(),
            "prepared the next compaction"
        );
        compaction.checkpoint.map(|c| (c.key.prefix, c.checkpoint))
    }
}

/// Whether the event `goal` is prepared for will need no summary. The event comes a turn
/// later, with that turn whole, and prunes the one in progress now as history; a
/// preparation that kept this turn whole too would find pruning a turn's outputs short,
/// and pay for a summary the event then goes without (the goal's relaxed target already
/// leaves room for the turn the event comes with, of the conversation's usual growth).
/// Pruning must reach `spare` below that target: a turn larger than usual would otherwise
/// leave the event short of it, to wait for a summary nobody prepared (measured: 3 s, in
/// bench/events.py's tight session, with no margin).
fn event_prunes_alone(base: &Base, goal: Goal, spare: Ours) -> bool {
    let limits = goal.limits();
    let options = limits.pruning();
    let lower = |tokens: usize| tokens.saturating_sub(spare.usize());
    let options = engine::Options {
        prune_turn: true,
        target_tokens: options.target_tokens.map(lower),
        prune_settle: options.prune_settle.map(lower),
        ..options.clone()
    };
    compactor::needs_no_summary(base, &options)
}

/// A copy of the client's request head, for the summariser's calls made after the
/// request itself is answered.
fn copy(parts: &Parts) -> Parts {
    let mut request = Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request.into_parts().0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::count_request;
    use crate::units::Window;
    use serde_json::{json, Value};

    /// A tool turn: the ask, the call, and its output of `lines` lines of a log.
    fn turn(n: usize, lines: usize) -> Vec<Value> {
        let output: String = (0..lines)
            .map(|i| format!("turn {n} line {i}: warning: unused variable `value_{i}`\n"))
            .collect();
        let id = format!("call_{n}");
        vec![
            json!({"role": "user", "content": format!("Turn {n}: run the tests.")}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "run", "arguments": "{\"cmd\":\"cargo test\"}"}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": output}),
        ]
    }

    fn conversation(lines: usize) -> Value {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coding agent."}),
            json!({"role": "user", "content": "Fix the failing tests."}),
            json!({"role": "assistant", "content": "I will run them."}),
        ];
        messages.extend(turn(1, lines));
        messages.push(json!({"role": "assistant", "content": "One left."}));
        // The turn in progress: its output is the model's to read now, history a turn later.
        messages.extend(turn(2, lines));
        json!({"model": "gpt-4o", "messages": messages})
    }

    fn goal(relaxed: usize) -> Goal {
        Goal {
            target: Ours(relaxed as u64 / 2),
            ceiling: Ours(relaxed as u64),
            window: Some(Window(100_000)),
            relaxed: Some(Ours(relaxed as u64)),
            settle: None,
        }
    }

    fn base(view: Value) -> Base {
        Base {
            view,
            source: None,
            counts: None,
            tokens: None,
        }
    }

    #[test]
    fn a_preparation_counts_the_turn_in_progress_as_what_its_event_prunes() {
        let whole = count_request(&conversation(200));
        let small = count_request(&conversation(0));
        // Pruning one output leaves more than this, pruning both far less.
        let relaxed = small + (whole - small) / 2;
        let goal = goal(relaxed);
        // Kept whole, the turn in progress leaves pruning short: a summary is needed.
        let options = goal.limits().relaxed.unwrap();
        let plan = engine::plan(&conversation(200), &options).unwrap();
        assert!(plan.needs_summary());
        // The event, a turn later, prunes that turn too: nothing to prepare.
        assert!(event_prunes_alone(&base(conversation(200)), goal, Ours(0)));
        // Unless a larger turn than usual would leave the event short.
        let spare = Ours(((whole - small) / 2) as u64);
        assert!(!event_prunes_alone(&base(conversation(200)), goal, spare));
    }

    #[test]
    fn a_preparation_is_made_when_the_event_cannot_prune_alone() {
        let small = count_request(&conversation(0));
        // Below what the conversation is with every output pruned.
        let goal = goal(small / 2);
        assert!(!event_prunes_alone(&base(conversation(200)), goal, Ours(0)));
    }
}
