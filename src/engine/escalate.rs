//! Pass 8: when head + summary + tail is still over the target, give up more, in the
//! order that costs the model least, each step taken once and only while still over:
//!
//! 1. prune tool traffic, oldest first, in the head's first exchange and in the tail up to
//!    the latest calls;
//! 2. fold the head's first exchange into the summary (the leading instructions and the
//!    task stay);
//! 3. fold the history kept in the tail into it too, oldest first;
//! 4. raise the target towards the ceiling: the answer gets less room, the turn in
//!    progress keeps its own;
//! 5. cut a huge task to an eighth of the target;
//! 6. cut the turn's earlier messages, largest first;
//! 7. fold the turn's earlier rounds of calls into the summary;
//! 8. shorten the summary;
//! 9. cut the latest tool results and what else the turn holds, largest first, keeping
//!    each one's beginning and end. The latest user message is never cut, but for a
//!    command's output a text agent hands back as one, which is cut as a tool's result
//!    is, in a request that then fits (else the steps run again with it whole);
//! 10. only if that makes the request fit: the summary to its floor; then the turn's
//!     messages to theirs and the task to its first lines; then the task to its
//!     statement (its opening) and the summary's items, all of them if need be; last, the
//!     task below its statement.
//!
//! Folding takes the fewest groups that make the rest fit; when a little is over, less
//! than a quarter of the next group to fold, the unfolded messages are cut that little
//! instead. The smallest candidate wins if none fits.

use std::sync::Arc;

use serde_json::Value;

use super::cut::{cut_keeping, cut_task, cut_to, cut_to_opening};
use super::digest::{digest_in, hands_back_output, shorten, shorten_to_items, Beside};
use super::message::{clip, Message, Role};
use super::prune::Pruner;
use super::roles::OPENING;
use super::summary;
use super::tokens::Counter;
use super::{build, chars_for, note_prunes, Options, Plan};
use crate::units::Limit;

/// Messages are never cut below this many tokens: what is left must still say what it was.
const CUT_FLOOR: usize = 48;
/// Nor is a summary shortened below this.
const SUMMARY_FLOOR: usize = 64;
/// Nor below this while the turn in progress still has something to give.
const DIGEST_KEEP: usize = 300;
/// What a second round of the last cuts takes beyond the excess: the framing a cut and
/// a join add is not known in advance.
const ROUND_MARGIN: usize = 16;
/// Characters of the task kept by the last cuts but one: its first sentences.
const TASK_LEAST: usize = 264;
/// The opening of the task that states the work, a sentence or two: the last cut lets
/// it go only when the summary's items giving way does not make the request fit.
/// (bench/fidelity.py counts the task as kept by the same 200 characters.)
const TASK_STATEMENT: usize = 200;

/// The messages to send, with the notes on the steps taken.
pub struct Fitted {
    pub messages: Vec<Message>,
    pub notes: Vec<String>,
    /// The target reached for: the plan's, or higher when the answer's room was lowered.
    pub target: Limit,
    /// Escalation wrote (or extended) the summary from turns it folded in.
    pub summarised: bool,
    /// The turns it folded in, in the client's text.
    pub folds: Folds,
}

/// Turns escalation folded into the summary, in the client's text: those of the head's
/// first exchange, which come before the plan's middle, and the later ones (history the
/// tail kept, the turn's earlier rounds), which come after it.
#[derive(Clone, Default)]
pub struct Folds {
    pub head: Vec<Message>,
    pub later: Vec<Message>,
}

impl Folds {
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.later.is_empty()
    }
}

/// What a fold takes into the summary, for the notes and for where its turns stand
/// beside the plan's middle.
#[derive(Clone, Copy)]
enum Fold {
    FirstExchange,
    TailHistory,
    EarlierRounds,
}

impl Fold {
    fn name(self) -> &'static str {
        match self {
            Fold::FirstExchange => "first exchange",
            Fold::TailHistory => "tail history",
            Fold::EarlierRounds => "earlier rounds of the turn",
        }
    }
}

/// The parts of a candidate: `tail[turn..]` is the turn in progress.
#[derive(Clone)]
struct Draft<'p> {
    plan: &'p Plan,
    head: Vec<Message>,
    kept: Vec<Message>,
    body: Option<String>,
    tail: Vec<Message>,
    turn: usize,
    target: Limit,
    notes: Vec<String>,
    summarised: bool,
    /// Tokens of conversation the summary stands for: the plan's middle and what
    /// escalation folded into it. The digest's budget follows it.
    replaced: usize,
    folds: Folds,
    /// What the candidate keeps whole beside the summary, which the digest leaves out
    /// (shared by the drafts tried).
    beside: Arc<Beside>,
    /// The latest user message hands back a text agent's output.
    latest_is_output: bool,
}

#[derive(Clone)]
struct Best {
    messages: Vec<Message>,
    tokens: usize,
    notes: Vec<String>,
    folds: Folds,
}

impl<'p> Draft<'p> {
    /// The plan's parts with `body` as the summary, and the candidate they make.
    fn start(plan: &'p Plan, body: Option<String>) -> (Draft<'p>, Best) {
        let msgs = &plan.messages;
        let d = Draft {
            plan,
            head: msgs[..plan.head_end].to_vec(),
            kept: plan.kept_instructions.clone(),
            body,
            tail: msgs[plan.tail_start..].to_vec(),
            turn: plan.regions.turn_start - plan.tail_start,
            target: plan.target,
            notes: Vec::new(),
            summarised: false,
            replaced: plan.turns.iter().map(|m| m.tokens).sum::<usize>()
                + plan.previous_summary().map_or(0, |p| plan.counter.text(p)),
            folds: Folds::default(),
            beside: plan.beside(),
            latest_is_output: latest_is_output(msgs),
        };
        let (first, notes) = d.build();
        let best = Best {
            tokens: plan.total(&first),
            messages: first,
            notes,
            folds: Folds::default(),
        };
        (d, best)
    }

    /// The candidate these parts make, with the notes on the steps that led to it.
    fn build(&self) -> (Vec<Message>, Vec<String>) {
        let mut notes = self.notes.clone();
        let messages = build(
            self.plan,
            &self.head,
            &self.kept,
            self.body.as_deref(),
            &self.tail,
            &mut notes,
        );
        (messages, notes)
    }

    /// Builds the candidate, keeps it if it is the smallest yet; whether it fits.
    fn offer(&mut self, best: &mut Best) -> bool {
        self.target.admits(self.measure(best))
    }

    /// Builds the candidate, keeps it if it is the smallest yet; its tokens.
    fn measure(&mut self, best: &mut Best) -> usize {
        let (candidate, notes) = self.build();
        let tokens = self.plan.total(&candidate);
        if tokens < best.tokens {
            best.messages = candidate;
            best.tokens = tokens;
            best.notes = notes;
            best.folds = self.folds.clone();
        }
        tokens
    }

    fn over(&self, best: &Best) -> usize {
        self.target.excess(best.tokens)
    }

    /// Index in the tail of the latest assistant message that called tools.
    fn latest_calls(&self) -> Option<usize> {
        // Steps only ever take messages from before them, so they stay the last calls.
        self.plan.regions.latest_calls?;
        let turn = self.tail.get(self.turn..)?;
        turn.iter()
            .rposition(Message::makes_calls)
            .map(|i| i + self.turn)
    }

    /// Index in the tail of the latest user message, which is never cut.
    fn latest_user(&self) -> Option<usize> {
        self.tail.iter().rposition(|m| m.role == Role::User)
    }

    /// Index in the tail of the latest user message when it holds a person's words,
    /// which no step cuts; not when it hands back a text agent's output
    /// ([`hands_back_output`]), cut at step 9 like the latest results of a tool (in a
    /// request that then fits: [`build_fitting`]).
    fn latest_words(&self) -> Option<usize> {
        self.latest_user().filter(|_| !self.latest_is_output)
    }

    /// The task when it stands in the head: its last user message.
    fn head_task(&mut self) -> Option<&mut Message> {
        let t = self.head.iter().rposition(|m| m.role == Role::User)?;
        Some(&mut self.head[t])
    }

    /// The task in the head, or in the tail unless it is the latest user message.
    fn task(&mut self, is_task: impl Fn(&Message) -> bool) -> Option<&mut Message> {
        let latest = self.latest_user();
        if self.head.iter().any(|m| m.role == Role::User) {
            return self.head_task();
        }
        let t = self
            .tail
            .iter()
            .position(is_task)
            .filter(|&t| Some(t) != latest)?;
        Some(&mut self.tail[t])
    }

    /// Folds `messages` into the summary (instructions among them are kept instead).
    fn digest(&mut self, messages: Vec<Message>, fold: Fold, opts: &Options) {
        let (instructions, turns): (Vec<Message>, Vec<Message>) =
            messages.into_iter().partition(|m| m.role.is_instruction());
        self.kept.extend(instructions);
        if turns.is_empty() {
            return;
        }
        self.absorb_earlier_summaries();
        // What was pruned or cut to fit is digested from what it said.
        let turns: Vec<Message> = turns
            .iter()
            .map(|m| self.plan.original_of(m).clone())
            .collect();
        self.replaced += turns.iter().map(|m| m.tokens).sum::<usize>();
        match fold {
            Fold::FirstExchange => self.folds.head.extend_from_slice(&turns),
            Fold::TailHistory | Fold::EarlierRounds => self.folds.later.extend_from_slice(&turns),
        }
        let extra = self.plan.digest_extra;
        let budget = chars_for(opts.digest_budget(self.target, self.replaced, extra));
        let previous = self.body.as_deref();
        let opens_with_task = matches!(fold, Fold::FirstExchange);
        self.body = Some(digest_in(
            previous,
            &turns,
            budget,
            opens_with_task,
            &self.beside,
        ));
        self.summarised = true;
    }

    /// Takes an earlier summary still standing in a kept message (one folded into the
    /// message after it) into the summary being written, so the result carries one.
    fn absorb_earlier_summaries(&mut self) {
        let counter = self.plan.counter;
        let mut earlier = Vec::new();
        for m in self.head.iter_mut().chain(self.tail.iter_mut()) {
            let Some((body, rest)) = summary::extract(&m.text()) else {
                continue;
            };
            let rest = if rest.is_empty() {
                OPENING.to_string()
            } else {
                rest
            };
            m.set_content(Value::String(rest), &counter);
            earlier.push(body);
        }
        if earlier.is_empty() {
            return;
        }
        earlier.extend(self.body.take());
        self.body = Some(earlier.join("\n\n"));
    }
}

/// Splits the user messages joined to the task at `head[t]` (a run of user messages is
/// joined into one for strict role order) that end past its statement (its first
/// [`TASK_STATEMENT`] characters) into a message of their own after it, which the first
/// exchange's fold can take into the summary. Kept whole, a later request and a pasted key
/// outranked every fact of the digest (at a 256-token window, 25-45 tokens: a decision);
/// an agent's opening line ("$ aider app.py") and the request right after it stay the
/// task. Unfolded, the two are joined again.
fn split_task(d: &mut Draft, t: usize) {
    let (Some(sent), Some(m)) = (d.plan.task.as_deref(), d.head.get(t)) else {
        return;
    };
    let Some(Value::String(text)) = m.content() else {
        return;
    };
    if !text.starts_with(sent) {
        return;
    }
    // Where each joined message ends; the task keeps those that end within its statement.
    let mut end = sent.len();
    for part in &d.plan.task_joined {
        let next = end + 2 + part.len();
        let joined = text
            .get(end..next)
            .is_some_and(|s| s.starts_with("\n\n") && s.ends_with(part.as_str()));
        if !joined || text[..next].chars().count() > TASK_STATEMENT {
            break;
        }
        end = next;
    }
    let Some(rest) = text
        .get(end..)
        .and_then(|r| r.strip_prefix("\n\n"))
        .filter(|r| !r.trim().is_empty())
    else {
        return;
    };
    let counter = d.plan.counter;
    let mut joined = m.clone();
    joined.set_content(Value::String(rest.to_string()), &counter);
    let task = text[..end].to_string();
    d.head[t].set_content(Value::String(task), &counter);
    d.head.insert(t + 1, joined);
}

/// Cuts `messages` at `candidates` down to a common level, largest first, until `over`
/// tokens are saved or all are at the floor. Returns how many were cut.
fn level(messages: &mut [Message], candidates: &[usize], over: usize, counter: &Counter) -> usize {
    // A message without text (calls only) cannot be cut: levelling it would only spare
    // the others.
    let candidates: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&i| messages[i].has_text())
        .collect();
    let mut cut = 0;
    let mut over = over;
    // A second round makes up for what the notes added by each cut cost.
    for _ in 0..2 {
        if over == 0 {
            break;
        }
        let sizes: Vec<usize> = candidates.iter().map(|&i| messages[i].tokens).collect();
        let level = water_level(&sizes, over, CUT_FLOOR);
        let before: usize = sizes.iter().sum();
        for &i in &candidates {
            if messages[i].tokens > level && cut_to(&mut messages[i], level, counter) {
                cut += 1;
            }
        }
        let after: usize = candidates.iter().map(|&i| messages[i].tokens).sum();
        over = over.saturating_sub(before.saturating_sub(after));
    }
    cut
}

/// Folds into the summary the fewest of `messages`' groups, oldest first, that make a
/// candidate fit; `place` puts what is not folded back in its place, given in order.
/// Whether one fitted (if none, all are folded). Folding fewer groups than hold the
/// excess cannot fit on its own, so the tries start there: a few builds, not one per
/// group.
///
/// A try that is over by less than a quarter of what the next try would fold in addition
/// cuts its unfolded messages a little instead, each keeping its beginning and end: a few
/// lines of old tool traffic cost the model less than a whole exchange. So are tried the
/// draft as it came and the largest fold short of the excess. `what` names the messages.
fn fold<'p>(
    d: &mut Draft<'p>,
    best: &mut Best,
    opts: &Options,
    what: Fold,
    messages: &[Message],
    place: impl Fn(&mut Draft, usize, &[Message]),
) -> bool {
    let over = d.over(best);
    // The draft as it is, the most groups that hold less than the excess (the try a
    // small cut may complete), then each fold that may fit on its own.
    let mut tries = vec![0];
    let (mut at, mut held, mut below) = (0, 0, 0);
    while at < messages.len() {
        let end = next_group_end(messages, at, messages.len());
        held += messages[at..end].iter().map(|m| m.tokens).sum::<usize>();
        if held >= over || end == messages.len() {
            if below > 0 && tries.len() == 1 {
                tries.push(below);
            }
            tries.push(end);
        } else {
            below = end;
        }
        at = end;
    }
    // Each try starts from the same parts: digesting may also take an earlier summary
    // out of a kept message.
    let start = d.clone();
    let tried = Tried {
        start: &start,
        opts,
        what,
        messages,
        tries: &tries,
    };
    // The first try that fits, found in a number of builds that grows with the log of
    // the tries, not with the tries (a turn of thousands of rounds has as many, and a
    // digest of the whole fold each would be quadratic). Tries further on fold more, so
    // one that fits is followed by others that do: the search gallops to a try that
    // fits, then halves the gap back to the last that did not. Each is measured against
    // a copy of the smallest candidate, kept only if it did not fit: the one that fits
    // first is built again last, so the smallest candidate is the first that fits.
    let last = tries.len() - 1;
    let probe = |d: &mut Draft<'p>, best: &mut Best, k: usize| -> bool {
        let mut trial = best.clone();
        let fitted = tried.attempt(d, &mut trial, k, &place);
        if !fitted {
            *best = trial;
        }
        fitted
    };
    let (mut failed, mut step, mut k) = (None, 1, 0);
    let first_fit = loop {
        if probe(d, best, k) {
            break k;
        }
        if k == last {
            // None fits: all are folded, as the last try left them.
            return false;
        }
        failed = Some(k);
        k = (k + step).min(last);
        step *= 2;
    };
    let mut high = first_fit;
    while let Some(low) = failed.filter(|&low| low + 1 < high) {
        let mid = low + (high - low) / 2;
        if probe(d, best, mid) {
            high = mid;
        } else {
            failed = Some(mid);
        }
    }
    tried.attempt(d, best, high, &place)
}

/// What the tries of one [`fold`] share: the draft they start from, the messages and
/// where each try ends its fold.
struct Tried<'a, 'p> {
    start: &'a Draft<'p>,
    opts: &'a Options,
    what: Fold,
    messages: &'a [Message],
    tries: &'a [usize],
}

impl<'p> Tried<'_, 'p> {
    /// Try `k` from the start: its fold, then, when what is still over is less than a
    /// quarter of what the next try would fold in addition, a little cut of the unfolded
    /// messages instead. Whether the candidate fits.
    fn attempt(
        &self,
        d: &mut Draft<'p>,
        best: &mut Best,
        k: usize,
        place: &impl Fn(&mut Draft, usize, &[Message]),
    ) -> bool {
        let (messages, moved) = (self.messages, self.tries[k]);
        d.clone_from(self.start);
        if moved > 0 {
            d.digest(messages[..moved].to_vec(), self.what, self.opts);
            d.notes
                .push(format!("escalate: {} summarised", self.what.name()));
        }
        place(d, moved, &messages[moved..]);
        let tokens = d.measure(best);
        if d.target.admits(tokens) {
            return true;
        }
        let next = self.tries.get(k + 1).copied().unwrap_or(moved);
        let folded_next: usize = messages[moved..next].iter().map(|m| m.tokens).sum();
        let over = d.target.excess(tokens);
        if over.saturating_mul(4) > folded_next {
            return false;
        }
        let mut rest = messages[moved..].to_vec();
        let candidates: Vec<usize> = (0..rest.len())
            .filter(|&i| rest[i].role != Role::User && !rest[i].role.is_instruction())
            .collect();
        let cut = level(&mut rest, &candidates, over, &d.plan.counter);
        if cut == 0 {
            return false;
        }
        place(d, moved, &rest);
        d.notes.push(format!(
            "escalate: {cut} messages of the {} cut",
            self.what.name()
        ));
        d.offer(best)
    }
}

/// `messages` without those at the first `moved` of `indices` (folded), and with `left`
/// in place of those at the others.
fn put_back(
    messages: &[Message],
    indices: &[usize],
    moved: usize,
    left: &[Message],
) -> Vec<Message> {
    let mut left = left.iter();
    messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            if indices[..moved].binary_search(&i).is_ok() {
                None
            } else if indices[moved..].binary_search(&i).is_ok() {
                left.next().cloned()
            } else {
                Some(m.clone())
            }
        })
        .collect()
}

/// End of the group (a message, or an assistant message with its results) that starts at
/// `at`, at most `limit`.
fn next_group_end(messages: &[Message], at: usize, limit: usize) -> usize {
    let mut end = at + 1;
    while end < limit && messages[end].role.is_result() {
        end += 1;
    }
    end.min(limit)
}

/// The highest level L (at least `floor`) such that cutting every size above L down to L
/// saves `over`; `floor` when even that is not enough.
fn water_level(sizes: &[usize], over: usize, floor: usize) -> usize {
    let saved = |level: usize| -> usize { sizes.iter().map(|s| s.saturating_sub(level)).sum() };
    let (mut lo, mut hi) = (
        floor,
        sizes.iter().copied().max().unwrap_or(floor).max(floor),
    );
    if saved(lo) < over {
        return floor;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if saved(mid) >= over {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Returns the assembled messages and notes on the steps taken.
pub fn build_fitting(plan: &Plan, body: Option<String>, opts: &Options) -> Fitted {
    let (mut d, mut best) = Draft::start(plan, body.clone());
    if !d.target.admits(best.tokens) && !escalate(&mut d, &mut best, opts) {
        // A text agent's latest output is cut only for a request that then fits: one
        // that stays over its target anyway carries it as the client sent it.
        if d.latest_is_output {
            (d, best) = Draft::start(plan, body);
            d.latest_is_output = false;
            if escalate(&mut d, &mut best, opts) {
                return fitted(d, best);
            }
        }
        best.notes.push("escalate: no form fits".into());
    }
    fitted(d, best)
}

fn fitted(d: Draft, best: Best) -> Fitted {
    Fitted {
        messages: best.messages,
        notes: best.notes,
        target: d.target,
        summarised: d.summarised,
        folds: best.folds,
    }
}

/// Runs the steps until one fits; whether one did.
fn escalate(d: &mut Draft, best: &mut Best, opts: &Options) -> bool {
    let counter = d.plan.counter;
    if prune_tool_traffic(d, best, opts, &counter)
        || fold_first_exchange(d, best, opts)
        || fold_tail_history(d, best, opts)
        || lower_answer_room(d, best)
    {
        return true;
    }
    let task = Task::of(d.plan);
    let is_task = |m: &Message| task.as_ref().is_some_and(|t| t.is(m));
    if cut_huge_task(d, best, is_task, &counter) || cut_the_turn(d, best, opts, is_task, &counter) {
        return true;
    }
    last_resorts(d, best, task.as_ref(), is_task)
}

/// Step 1 of [`escalate`].
fn prune_tool_traffic(d: &mut Draft, best: &mut Best, opts: &Options, counter: &Counter) -> bool {
    // 1. Tool traffic, oldest first: the head's first exchange, then the tail up to the
    //    latest calls.
    let over = d.over(best);
    let head = Pruner::new(&d.head, opts, counter);
    let lead = d.plan.regions.instructions_end.min(d.head.len());
    let head_prunes = head.oldest_first(&d.head, lead..d.head.len(), over, |_| false);
    let saved = head_prunes.saved;
    let mut stats = head_prunes.apply(&mut d.head);
    let end = d.latest_calls().unwrap_or(d.tail.len());
    let pruner = Pruner::new(&d.tail, opts, counter);
    let prunes = pruner.oldest_first(&d.tail, 0..end, over.saturating_sub(saved), |j| j >= end);
    stats.add(prunes.apply(&mut d.tail));
    note_prunes(&mut d.notes, "escalate: pruned", stats);
    stats.total() > 0 && d.offer(best)
}

/// Step 2 of [`escalate`].
fn fold_first_exchange(d: &mut Draft, best: &mut Best, opts: &Options) -> bool {
    // 2. The head's first exchange joins the summary, oldest group first: the leading
    //    instructions and the task stay. User messages joined to the task past its
    //    statement are not the task: they fold first, ranked in the digest like any
    //    other request.
    let task = d.plan.regions.task.filter(|&t| t < d.head.len());
    if let Some(t) = task {
        split_task(d, t);
    }
    let head = d.head.clone();
    let folded: Vec<usize> = (0..head.len())
        .filter(|&i| Some(i) != task && !head[i].role.is_instruction())
        .collect();
    fold_picked(
        d,
        best,
        opts,
        Fold::FirstExchange,
        &head,
        &folded,
        |d, kept| {
            d.head = kept;
        },
    )
}

/// Folds the messages of `from` at `picked` (ascending), oldest first as [`fold`] does;
/// `place` puts `from` less those folded (and with those cut) in its place.
fn fold_picked(
    d: &mut Draft,
    best: &mut Best,
    opts: &Options,
    what: Fold,
    from: &[Message],
    picked: &[usize],
    place: impl Fn(&mut Draft, Vec<Message>),
) -> bool {
    if picked.is_empty() {
        return false;
    }
    let moved: Vec<Message> = picked.iter().map(|&i| from[i].clone()).collect();
    fold(d, best, opts, what, &moved, |d, n, left| {
        place(d, put_back(from, picked, n, left));
    })
}

/// Step 3 of [`escalate`].
fn fold_tail_history(d: &mut Draft, best: &mut Best, opts: &Options) -> bool {
    // 3. So does the history kept in the tail, oldest group first; but when only a
    //    little is over, its largest messages give that up instead of a whole exchange.
    if d.turn > 0 {
        let history = d.tail[..d.turn].to_vec();
        let turn = d.tail[d.turn..].to_vec();
        let fitted = fold(d, best, opts, Fold::TailHistory, &history, |d, _, left| {
            d.tail = left.to_vec();
            d.tail.extend_from_slice(&turn);
            d.turn = left.len();
        });
        if fitted {
            return true;
        }
    }

    false
}

/// Step 4 of [`escalate`].
fn lower_answer_room(d: &mut Draft, best: &Best) -> bool {
    // 4. The answer's room, down to its minimum, before the turn's own messages.
    if d.plan.ceiling > d.target {
        d.target = d.plan.ceiling;
        d.notes.push(format!(
            "escalate: answer room lowered, target {}",
            d.target
        ));
        if d.target.admits(best.tokens) {
            return true;
        }
    }

    false
}

/// Step 5 of [`escalate`].
fn cut_huge_task(
    d: &mut Draft,
    best: &mut Best,
    is_task: impl Fn(&Message) -> bool + Copy,
    counter: &Counter,
) -> bool {
    // 5. A huge task is cut, no further than the excess asks and never below an eighth
    //    of the target: its opening states the work. (A quarter left small windows too
    //    little room for the digest: on the real corpus an eighth keeps 2-4 points more
    //    of every kind of fact, and the task's opening as often; bench/fidelity.py.)
    // The first user message states the work, also when it is inside the turn (an
    // agent whose only request is the task).
    let over = d.over(best);
    let target = d.target;
    let at = match d.head.iter().rposition(|m| m.role == Role::User) {
        Some(t) => Some(&mut d.head[t]),
        // The latest user message is never cut, even when it is the task.
        None => {
            let latest = d.latest_user();
            d.tail
                .iter_mut()
                .enumerate()
                .find(|(i, m)| Some(*i) != latest && is_task(m))
                .map(|(_, m)| m)
        }
    };
    if let Some(m) = at {
        let least = match target {
            Limit::At(target) => target / 8,
            // No target: nothing to cut the task for.
            Limit::Unbounded => m.tokens,
        };
        let keep = m.tokens.saturating_sub(over).max(least);
        if cut_task(m, keep, counter) {
            d.notes.push("escalate: task cut".into());
            if d.offer(best) {
                return true;
            }
        }
    }

    false
}

/// Whether the latest user message of `messages` hands back an output.
fn latest_is_output(messages: &[Message]) -> bool {
    let Some(i) = messages.iter().rposition(|m| m.role == Role::User) else {
        return false;
    };
    hands_back_output(i.checked_sub(1).map(|b| &messages[b]), &messages[i])
}

/// Steps 6 to 9 of [`escalate`]: the turn gives up what it can, its latest user message
/// and the task kept.
fn cut_the_turn(
    d: &mut Draft,
    best: &mut Best,
    opts: &Options,
    is_task: impl Fn(&Message) -> bool + Copy,
    counter: &Counter,
) -> bool {
    // 6. The turn's earlier messages, before its latest calls.
    // The task may stand in the tail (an agent whose only request is the task, with
    // interjections after it): step 5 alone cuts it, and never below its opening.
    let cuttable = |d: &Draft, range: std::ops::Range<usize>| -> Vec<usize> {
        let latest_user = d.latest_words();
        range
            .filter(|&i| {
                Some(i) != latest_user && !d.tail[i].role.is_instruction() && !is_task(&d.tail[i])
            })
            .collect()
    };
    let end = d.latest_calls().unwrap_or(0);
    let earlier = cuttable(d, 0..end);
    let over = d.over(best);
    let cut = level(&mut d.tail, &earlier, over, counter);
    if cut > 0 {
        d.notes
            .push(format!("escalate: {cut} earlier messages of the turn cut"));
        if d.offer(best) {
            return true;
        }
    }

    // 7. Still over: the turn's earlier rounds of calls join the summary, oldest first.
    //    Its user messages and the latest calls stay.
    let end = d.latest_calls().unwrap_or(0);
    let tail = d.tail.clone();
    let rounds: Vec<usize> = (d.turn..end)
        .filter(|&i| !matches!(tail[i].role, Role::User) && !tail[i].role.is_instruction())
        .collect();
    let turn = d.turn;
    if fold_picked(
        d,
        best,
        opts,
        Fold::EarlierRounds,
        &tail,
        &rounds,
        |d, kept| {
            d.tail = kept;
            d.turn = turn;
        },
    ) {
        return true;
    }

    // 8. A shorter summary, though not below what holds the facts of a long stretch
    //    (the digest's floor) while the turn still has something to give.
    if shorten_summary(d, best, DIGEST_KEEP, shorten) {
        return true;
    }

    // 9. Last: the latest results and whatever else the turn holds.
    let rest = cuttable(d, 0..d.tail.len());
    let over = d.over(best);
    let cut = level(&mut d.tail, &rest, over, counter);
    if cut > 0 {
        d.notes
            .push(format!("escalate: {cut} messages of the turn cut to fit"));
        if d.offer(best) {
            return true;
        }
    }

    false
}

/// Steps 10 and 11 of [`escalate`]: what is tried only if it makes the request fit.
fn last_resorts(
    d: &mut Draft,
    best: &mut Best,
    task: Option<&Task>,
    is_task: impl Fn(&Message) -> bool + Copy,
) -> bool {
    // 10. The summary down to its smallest size, but only if that makes the request fit:
    //     a request that stays over its target anyway keeps its facts.
    let mut shorter = d.clone();
    let mut trial = best.clone();
    let whole = d.body.clone();
    if shorten_summary(&mut shorter, &mut trial, SUMMARY_FLOOR, shorten) {
        let stated = (d.clone(), best.clone());
        *best = at_statement_if_fuller(&shorter, trial, stated, whole.as_deref(), is_task);
        return true;
    }
    // 11. Then the rest of the turn and the task, still only if that makes it fit. The
    //     task keeps its first lines while that is enough; then the summary's items give
    //     way before its opening (what the work is outranks any line of what was done);
    //     the last round lets the opening go.
    //     Whichever fits, the summary then takes back what room is left, up to its size
    //     before step 10.
    let whole = whole.as_deref();
    for round in 0..2 {
        if last_cut(&mut shorter, &mut trial, round, TASK_LEAST, is_task) {
            let stated = (shorter.clone(), trial.clone());
            regrow_to(&mut shorter, &mut trial, whole);
            *best = at_statement_if_fuller(&shorter, trial, stated, whole, is_task);
            return true;
        }
    }
    // The last round, tried on a copy: one that keeps the task's statement anyway (a
    // short task) costs the summary nothing.
    let mut last = shorter.clone();
    let mut last_best = trial.clone();
    let last_fits = last_cut(&mut last, &mut last_best, 2, 0, is_task);
    let keeps_task = |d: &Draft| task.is_none_or(|t| t.stated_in(d, is_task));
    if !(last_fits && keeps_task(&last)) {
        let (mut giving, mut given) = (shorter.clone(), trial.clone());
        if summary_gives_way(&mut giving, &mut given, is_task) {
            regrow_to(&mut giving, &mut given, whole);
            *best = given;
            return true;
        }
    }
    if last_fits {
        regrow_to(&mut last, &mut last_best, whole);
        *best = last_best;
        return true;
    }
    trial = last_best;
    // Nothing fits. The facts are kept only in a form smaller than the request as it came:
    // one no smaller would be sent unchanged, the summariser's work thrown away.
    if best.tokens >= d.plan.tokens_before && trial.tokens < best.tokens {
        *best = trial;
    }
    false
}

/// The task: the first user message, which states the work. It may stand in the tail
/// (an agent whose only request is the task).
struct Task {
    /// Its first characters, which every cut keeps: how it is known once cut.
    known_by: String,
    /// Its opening that says what the work is.
    statement: String,
}

impl Task {
    fn of(plan: &Plan) -> Option<Task> {
        let text = plan.messages.iter().find(|m| m.role == Role::User)?.text();
        let known_by = clip(&text, 60);
        // Of the message the client sent: user messages joined to it state no more of
        // the work.
        let sent = plan.task.as_deref().unwrap_or(&text);
        (!known_by.is_empty()).then(|| Task {
            known_by: known_by.to_string(),
            statement: sent.trim_start().chars().take(TASK_STATEMENT).collect(),
        })
    }

    fn is(&self, m: &Message) -> bool {
        m.role == Role::User && m.text().starts_with(&self.known_by)
    }

    /// Whether the draft still holds the task's statement whole (or no task at all, as
    /// when it was folded into the summary).
    fn stated_in(&self, d: &Draft, is_task: impl Fn(&Message) -> bool) -> bool {
        let head = d.head.iter().rev().find(|m| m.role == Role::User);
        match head.or_else(|| d.tail.iter().find(|m| is_task(m))) {
            Some(m) => m.text().trim_start().starts_with(&self.statement),
            None => true,
        }
    }
}

/// A request that fits with its summary shortened (`kept`, that summary in `d`: step 10,
/// or a last cut keeping the task's first sentences), or `stated` (the draft before that
/// step) with the task down to its statement, when its summary comes out larger: what the
/// summary holds outranks the task's text past its statement, as when the summary gives
/// way. Otherwise whatever the summary's floor cost decided how much of the task stayed: a
/// frame 5 tokens smaller lost an error line at a 50% and at a 1,024-token window
/// (bench/results/fidelity-2026-11-26g.md).
fn at_statement_if_fuller(
    d: &Draft,
    kept: Best,
    (mut stated, mut stated_best): (Draft, Best),
    whole: Option<&str>,
    is_task: impl Fn(&Message) -> bool,
) -> Best {
    let counter = d.plan.counter;
    let Some(m) = stated.task(is_task) else {
        return kept;
    };
    if !cut_to_opening(m, TASK_STATEMENT, TASK_STATEMENT, &counter) {
        return kept;
    }
    if stated.offer(&mut stated_best) {
        regrow_to(&mut stated, &mut stated_best, whole);
    } else if !shorten_summary(
        &mut stated,
        &mut stated_best,
        SUMMARY_FLOOR,
        shorten_to_items,
    ) {
        return kept;
    }
    let size = |d: &Draft| d.body.as_deref().map_or(0, |b| counter.text(b));
    if size(&stated) > size(d) {
        stated_best
    } else {
        kept
    }
}

/// One round of the last cuts: the turn's messages but the latest user message, and the
/// task, never below `least` characters (in the tail too, when `least` is set), by the
/// excess; the `round`s after the first take [`ROUND_MARGIN`] more for what joining the
/// summary to a message costs. Whether the request then fits.
fn last_cut(
    d: &mut Draft,
    best: &mut Best,
    round: usize,
    least: usize,
    is_task: impl Fn(&Message) -> bool,
) -> bool {
    let counter = d.plan.counter;
    let latest = d.latest_words();
    let spared = |m: &Message| m.role.is_instruction() || (least > 0 && is_task(m));
    let all: Vec<usize> = (0..d.tail.len())
        .filter(|&i| Some(i) != latest && !spared(&d.tail[i]))
        .collect();
    let over = d.over(best) + round.min(1) * ROUND_MARGIN;
    let mut cut = level(&mut d.tail, &all, over, &counter);
    // In the tail, the last round levels the task with the rest.
    let task = match least {
        0 => d.head_task(),
        _ => d.task(is_task),
    };
    if let Some(m) = task {
        let keep = m.tokens.saturating_sub(over).max(CUT_FLOOR);
        cut += usize::from(cut_keeping(m, keep, least, &counter));
    }
    if cut == 0 {
        return false;
    }
    d.notes
        .push(format!("escalate: {cut} messages cut, the task too"));
    d.offer(best)
}

/// The summary's items give way, all of them if need be, before the task's statement.
/// Whether the request then fits.
fn summary_gives_way(d: &mut Draft, best: &mut Best, is_task: impl Fn(&Message) -> bool) -> bool {
    let counter = d.plan.counter;
    // The task down to its statement first: what the summary holds is worth more than
    // the rest of the task's text.
    if let Some(m) = d.task(is_task) {
        if cut_to_opening(m, TASK_STATEMENT, TASK_STATEMENT, &counter) {
            d.notes.push("escalate: task cut to its statement".into());
            if d.offer(best) {
                return true;
            }
        }
    }
    shorten_summary(d, best, 0, shorten_to_items)
}

/// A request that fits with a summary shortened from `whole`: the summary takes back, in
/// whole items, the room left under the target (the last cuts leave it where step 10's
/// shortening for a request that did not fit yet put it).
fn regrow_to(d: &mut Draft, best: &mut Best, whole: Option<&str>) {
    let (Some(whole), Some(now)) = (whole, d.body.as_deref()) else {
        return;
    };
    if now.len() < whole.len() {
        regrow_summary(d, best, whole, now.len(), shorten_to_items);
    }
}

/// A way to shorten a summary to a number of characters.
type Shorten = fn(&str, usize) -> String;

/// Shortens the summary with `cut` by the excess, down to `floor` tokens; whether the
/// request then fits.
fn shorten_summary(d: &mut Draft, best: &mut Best, floor: usize, cut: Shorten) -> bool {
    let counter = d.plan.counter;
    let Some(body) = d.body.take() else {
        return false;
    };
    let tokens = counter.text(&body);
    let (mut size, mut over) = (tokens, d.over(best));
    // The request does not shrink token for token with the summary (the frame, a join
    // with the next message, whole items given up): a try that is still over cuts again
    // by what is left and a margin, so that a smaller summary never fails where a larger
    // one, cut deeper by its larger excess, fitted.
    for tried in 0..SHORTEN_TRIES {
        let keep = size.saturating_sub(over).max(floor);
        if keep >= size {
            break;
        }
        d.body = Some(cut(&body, chars_for(keep)));
        if tried == 0 {
            d.notes.push("escalate: summary shortened".into());
        }
        let now = d.measure(best);
        if d.target.admits(now) {
            regrow_summary(d, best, &body, chars_for(keep), cut);
            return true;
        }
        (size, over) = (keep, d.target.excess(now) + ROUND_MARGIN);
    }
    if d.body.is_none() {
        d.body = Some(body);
    }
    false
}

/// Cuts [`shorten_summary`] makes at most.
const SHORTEN_TRIES: usize = 3;

/// Halvings [`regrow_summary`] tries: each costs a digest and a count of the request.
/// Eight find the size to a few characters (a token or two) over the thousand or so
/// characters a small window's summary spans; four left up to 14 tokens, a path or an
/// error line, unused (bench/results/fidelity-2026-11-26e.md).
const REGROW_STEPS: usize = 8;

/// A summary `body` cut to `fits` characters made the request fit: gives it back the room
/// the cut did not need, up to the whole body. The digest gives up whole items and three
/// characters a token is a low guess, so the first cut often left the request well under
/// its target (on the real corpus a tenth of the target at small windows), a decision or
/// an error line dropped for nothing. The search runs in characters, up to the body's
/// own length: bounded by its tokens at three characters each, it could never give back
/// a body of prose (four characters a token), and left 86 tokens of a 718-token target
/// unused while a decision was given up. The largest size that still fits is kept: the
/// search runs to its end even when the request is already a few tokens under its
/// target, since a few tokens hold a path, and a larger size may cost fewer tokens (the
/// digest counts characters: a masked key, `[REDACTED:openai-key]`, is 21 characters and
/// 10 tokens, and a larger size may give up such an item for a longer, lighter decision).
fn regrow_summary(d: &mut Draft, best: &mut Best, body: &str, fits: usize, cut: Shorten) {
    let (mut lo, mut hi) = (fits, body.len() + 1);
    for _ in 0..REGROW_STEPS {
        if hi <= lo + 1 {
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let shorter = d.body.replace(cut(body, mid));
        let (candidate, notes) = d.build();
        let tokens = d.plan.total(&candidate);
        if d.target.admits(tokens) {
            lo = mid;
            *best = Best {
                messages: candidate,
                tokens,
                notes,
                folds: d.folds.clone(),
            };
        } else {
            hi = mid;
            d.body = shorter;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::digest::digest;

    #[test]
    fn what_is_not_folded_goes_back_in_place_as_given() {
        let m = |text: &str| {
            Message::from_parts(
                Role::User,
                &serde_json::json!({"role": "user", "content": text}),
                1,
            )
        };
        let messages: Vec<Message> = ["task", "a", "b", "c", "d"].map(m).to_vec();
        // "a" is folded; "b" and "d" come back cut; "task" and "c" were never candidates.
        let out = put_back(&messages, &[1, 2, 4], 1, &[m("b cut"), m("d cut")]);
        let texts: Vec<String> = out.iter().map(|m| m.text().into_owned()).collect();
        assert_eq!(texts, ["task", "b cut", "c", "d cut"]);
    }

    /// An agent session of the given sizes in words: the task, then rounds of a rule the
    /// user sets, a decision and a command whose output fails, as tool calls or as a
    /// plain-text agent's commands and observations, then the latest message.
    fn session(
        task: usize,
        rounds: &[(usize, usize)],
        latest: usize,
        plain: bool,
    ) -> serde_json::Value {
        use serde_json::json;
        let words = |n: usize, seed: usize| -> String {
            let pool = [
                "build",
                "the",
                "parser",
                "src/net.rs",
                "retry",
                "with",
                "日本語",
                "42",
            ];
            let words: Vec<&str> = (0..n).map(|i| pool[(i * 7 + seed) % pool.len()]).collect();
            words.join(" ")
        };
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a careful agent."}),
            json!({"role": "user", "content": format!("Port the importer. {}", words(task, 1))}),
        ];
        for (i, &(said, output)) in rounds.iter().enumerate() {
            let decision = format!("Decision: we keep ledger_{i}. {}", words(said, i + 3));
            let output = format!(
                "{}\nKeyError: 'tenant_{i}'\nWrote build/reports/run_{i}/index.html",
                words(output, i)
            );
            if plain {
                msgs.push(json!({"role": "assistant",
                    "content": format!("THOUGHT: {decision}\n\n```bash\nmake test\n```")}));
                msgs.push(json!({"role": "user", "content": format!("OBSERVATION:\n{output}")}));
                continue;
            }
            let id = format!("c{i}");
            msgs.push(json!({"role": "user", "content": format!(
                "Never modify config/prod_{i}.yaml; ops deploys it. {}", words(said, i))}));
            msgs.push(
                json!({"role": "assistant", "content": decision, "tool_calls": [{"id": id,
                "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
            );
            msgs.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
        if !plain {
            msgs.push(json!({"role": "assistant", "content": "done"}));
        }
        let latest = format!("OBSERVATION:\n{}", words(latest, 5));
        msgs.push(json!({"role": "user", "content": latest}));
        json!({"model": "gpt-4o", "messages": msgs})
    }

    proptest::proptest! {
        // 64 cases unless PROPTEST_CASES asks for more, as in tests/.
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
            ..proptest::prelude::ProptestConfig::default()
        })]
        /// Escalation is monotonic in the summary's size: where a digest fitted, any
        /// smaller digest of the same turns fits too.
        #[test]
        fn a_smaller_digest_fits_wherever_a_larger_one_did(
            task in 0usize..300,
            rounds in proptest::collection::vec((0usize..60, 0usize..400), 1..12),
            latest in 0usize..300,
            plain: bool,
            target in 120usize..1200,
        ) {
            let request = session(task, &rounds, latest, plain);
            let opts = Options { target_tokens: Some(target), ..Options::default() };
            let plan = crate::engine::plan(&request, &opts).unwrap();
            proptest::prop_assume!(plan.needs_summary());
            let full = crate::engine::summarize_deterministic(&plan, &opts).text.len();
            let mut fitted: Option<usize> = None;
            let mut size = full;
            loop {
                let body = digest(plan.previous_summary(), plan.turns(), size);
                let out = build_fitting(&plan, Some(body), &opts);
                let fits = out.target.admits(plan.total(&out.messages));
                if let Some(larger) = fitted {
                    proptest::prop_assert!(fits, "fits at {larger} chars, not at {size}: {:?}", out.notes);
                }
                if fits {
                    fitted = Some(size);
                }
                if size == 0 {
                    break;
                }
                size -= size / 8 + 1;
            }
        }
    }

    #[test]
    fn the_last_cuts_give_the_summary_back_the_room_they_left() {
        let request = session(40, &[(20, 100); 6], 30, false);
        let opts = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let plan = crate::engine::plan(&request, &opts).unwrap();
        assert!(plan.needs_summary());
        let whole = crate::engine::summarize_deterministic(&plan, &opts).text;
        let (_, with_whole) = Draft::start(&plan, Some(whole.clone()));
        let (mut d, mut best) = Draft::start(&plan, Some(shorten_to_items(&whole, 0)));
        let empty = best.tokens;
        // Room for about half of what the summary's items take.
        let target = (with_whole.tokens + empty) / 2;
        d.target = Limit::At(target);
        regrow_to(&mut d, &mut best, Some(&whole));
        assert!(best.tokens <= target, "{} > {target}", best.tokens);
        assert!(
            target - best.tokens < (with_whole.tokens - empty) / 4,
            "{} of {}: {} to {}",
            best.tokens,
            target,
            empty,
            with_whole.tokens
        );
    }

    #[test]
    fn the_regrowth_fills_the_room_to_within_the_smallest_item() {
        // Forty paths of six tokens each (a digest of the tight layout at any size):
        // whatever the target, the summary regrows until the room left would not hold
        // another one (a search stopped 8 tokens short left one out).
        let request = session(40, &[(20, 100); 6], 30, false);
        let opts = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let plan = crate::engine::plan(&request, &opts).unwrap();
        let paths: Vec<String> = (10..50).map(|i| format!("- src/m{i}.rs")).collect();
        let whole = format!("## Files\n{}", paths.join("\n"));
        let item = paths
            .iter()
            .map(|p| plan.counter.text(&format!("{p}\n")))
            .max()
            .unwrap();
        let (_, with_whole) = Draft::start(&plan, Some(whole.clone()));
        let (_, empty) = Draft::start(&plan, Some(shorten_to_items(&whole, 0)));
        for target in empty.tokens + 20..with_whole.tokens - 20 {
            let (mut d, mut best) = Draft::start(&plan, Some(shorten_to_items(&whole, 0)));
            d.target = Limit::At(target);
            regrow_to(&mut d, &mut best, Some(&whole));
            assert!(best.tokens <= target, "{} > {target}", best.tokens);
            let left = target - best.tokens;
            assert!(
                left < item,
                "{left} tokens left at {target} (an item: {item})"
            );
        }
    }

    #[test]
    fn a_text_agents_latest_output_is_cut_like_a_tools_and_a_persons_words_never_are() {
        use serde_json::{json, Value};
        let output = format!(
            "============ test session starts ============\n{}E   AssertionError: assert 3 == 4\n\
             ============ 1 failed, 199 passed in 2.41s ============",
            "tests/test_parser.py ........................................ [ 10%]\n".repeat(200)
        );
        let words = "Please keep every public signature of the parser as it is today, other \
                     teams import it, and tell me before you change a default. "
            .repeat(60);
        let request = |before: &Value, latest: &str| {
            json!({"model": "gpt-4o", "messages": [
                {"role": "system", "content": "You are a careful agent."},
                {"role": "user", "content": "Fix the failing parser test."},
                before,
                {"role": "user", "content": latest},
            ]})
        };
        let opts = Options::with_window(700);
        let latest_of = |request: &Value| {
            let outcome = crate::engine::compact(request, &opts).unwrap();
            let sent = outcome.rewritten.unwrap_or_else(|| request.clone());
            let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
            (
                outcome.report.fits,
                last["content"].as_str().unwrap().to_string(),
            )
        };
        for before in [
            json!({"role": "user", "content": "/run pytest tests/"}),
            json!({"role": "assistant", "content": "Running them.\n\n```bash\npytest tests/\n```"}),
        ] {
            // Its beginning and its end stay, as of a tool's latest result (a message
            // the user sent before it may be joined to it, for the strict role order).
            let (fits, latest) = latest_of(&request(&before, &output));
            assert!(fits, "{latest}");
            assert!(latest.contains("omitted by compaction"), "{latest}");
            assert!(
                latest.contains("============ test session starts ============\ntests/")
                    && latest.ends_with("in 2.41s ============"),
                "{latest}"
            );
            // The same length of a person's words is sent as it was, fitting or not.
            let (_, latest) = latest_of(&request(&before, &words));
            assert!(latest.ends_with(&words), "{latest}");
            // Where no form fits (the instructions alone fill the window), the output
            // goes as the client sent it.
            let mut hopeless = request(&before, &output);
            hopeless["messages"][0]["content"] = json!("Follow the house rules. ".repeat(400));
            let (fits, latest) = latest_of(&hopeless);
            assert!(!fits && latest.ends_with(&output), "{latest}");
        }
    }

    #[test]
    fn the_water_level_saves_what_is_asked_cutting_the_largest_first() {
        assert_eq!(water_level(&[1000, 100, 50], 500, 10), 500);
        assert_eq!(water_level(&[1000, 600, 50], 500, 10), 550);
        assert_eq!(water_level(&[100, 100], 1000, 10), 10);
        assert_eq!(water_level(&[], 5, 10), 10);
    }
}
