//! The compaction engine: pure transcript surgery that shrinks a chat-completions request
//! to a token target while keeping what the model needs to continue.
//!
//! Two phases, so that an asynchronous LLM summariser can sit between them outside the
//! engine:
//!
//! ```text
//! let plan = engine::plan(&request, &opts)?; // passes 1-4
//! // An LLM's summary, or the deterministic digest:
//! let summary = plan.needs_summary().then(|| summarize_deterministic(&plan, &opts));
//! let outcome = engine::finish(plan, summary, &opts); // passes 5-8
//! ```
//!
//! [`compact`] does both with the deterministic summary. Passes, cheapest first, stopping as
//! soon as the request fits: merge same-role runs, strip old media, prune old tool traffic
//! (oldest first, no more than needed), then the head and the smallest middle whose summary
//! makes it fit, assembly, sanitising, the strict role order, and bounded escalation.
//!
//! What is given up last: the instructions (never), the latest user message (never, but
//! for a text agent's output handed back as one, cut with the latest results in a
//! request that then fits), the results of the latest tool calls, the task (the first
//! user message), the rest of the turn in progress, and the history, oldest first.

mod assemble;
mod boundary;
mod bpe;
pub mod budget;
mod calls;
mod commitment;
mod constraint;
pub mod cut;
mod decision;
pub mod digest;
pub mod economy;
mod envelope;
mod escalate;
mod failing_lines;
mod media;
pub use media::{cap_media, count_media};
mod merge;
pub mod message;
mod output_facts;
mod phrases;
#[cfg(test)]
mod phrasings;
mod placeholders;
mod pretoken;
mod products;
mod prune;
mod quantity;
mod regions;
mod roles;
mod sanitize;
mod scan;
pub mod summary;
pub mod tokens;
mod validate;
mod verbs;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use crate::units::{Limit, Window, DEFAULT_WINDOW};

pub use message::{Message, Role};
pub use roles::OPENING;
pub use summary::{Summary, SummarySource, END_MARKER, END_MARKER_SHORT, MARKER};
pub use tokens::{count_messages, count_request, Counter};
pub use validate::{validate, validate_strict, ValidationError};

use assemble::Placement;
use boundary::TailRoom;
use prune::Pruner;
use regions::Regions;

/// Why a request body cannot be compacted: it is not a chat-completions request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body is not a JSON object")]
    NotAnObject,
    #[error("request has no \"messages\" field")]
    MissingMessages,
    #[error("\"messages\" is not an array")]
    MessagesNotArray,
    #[error("\"messages\" is empty")]
    NoMessages,
    #[error("messages[{index}] is not an object")]
    MessageNotObject { index: usize },
    #[error("messages[{index}] has no string \"role\"")]
    MissingRole { index: usize },
    #[error("messages[{index}] has unknown role {role:?}")]
    UnknownRole { index: usize, role: String },
}

/// The smallest summary budget in tokens.
const SUMMARY_MIN: usize = 64;

/// Tokens a digest may take however little it replaces (if it replaces that much): room
/// for a request, an error and a decision or two.
const DIGEST_FLOOR: usize = 300;

/// Limits and knobs. Defaults suit real models; tests use small windows.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The model's context window in tokens (prompt plus completion); `None` when it is
    /// not known, and then only `target_tokens` and `ceiling_tokens` bound the request.
    pub context_window: Option<Window>,
    /// Model whose tokenizer to count with; by default the request's own `model`.
    pub model: Option<String>,
    /// Prompt-token target to reach; by default the window minus the completion budget
    /// and a safety margin.
    pub target_tokens: Option<usize>,
    /// The most prompt tokens allowed when keeping the turn in progress whole means giving
    /// the answer less room than the completion budget; by default the window minus
    /// `min_output_tokens` and the margin.
    pub ceiling_tokens: Option<usize>,
    /// Completion budget assumed when the request sets neither `max_completion_tokens` nor
    /// `max_tokens`; the budget is capped at a quarter of the window either way.
    pub default_output_reserve: usize,
    /// The answer room the turn in progress may leave, at least: below it, the turn's own
    /// messages are cut instead.
    pub min_output_tokens: usize,
    /// Share of the window, in percent, left free because the upstream's own count of tool
    /// definitions and framing can differ slightly from ours.
    pub safety_margin_percent: usize,
    /// Non-instruction messages kept verbatim at the start: the first user message (the
    /// task) always, and with 2 or more the assistant's reply to it.
    pub protect_first_n: usize,
    /// When a summary is needed, the share of the target, in percent, the result aims at:
    /// the room left lets the next turns grow before compacting again.
    pub fill_percent: usize,
    /// Tool outputs longer than this many characters are pruned outside the tail.
    pub prune_min_chars: usize,
    /// String values in old tool-call arguments are cut to this many characters: enough
    /// to say what a written file began with; the rest of a pruned call stays in every
    /// later prompt (see [`prune::describe_output`] for why that adds up).
    pub arg_max_chars: usize,
    /// Upper bound on the summary's size in tokens.
    pub summary_max_tokens: usize,
    /// The most messages the upstream takes in one request, when it caps them: past it,
    /// the oldest history is summarised even when the tokens fit.
    pub max_messages: Option<usize>,
    /// When pruning alone brings the request under its target, it goes on down to this
    /// many tokens, as far as pruning can, newest prunable messages before the turn in
    /// progress first ([`Pruner::newest_block`]), and prunes every message after the
    /// first it changes: a compaction event that breaks the upstream's prompt cache clears
    /// room for many turns without a summary, and keeps the bytes before what it prunes.
    /// `None`: pruning stops at the target, oldest first.
    pub prune_to: Option<usize>,
    /// With `prune_to`: when pruning what came after the newest output an earlier
    /// compaction pruned brings the request down to this many tokens, pruning stops there
    /// ([`Pruner::since_pruned`]) instead of reaching past that output for more room.
    /// Reaching past it rewrites every message after it, and the upstream's prompt cache
    /// with them: most of a session's history once it has had a few events.
    pub prune_settle: Option<usize>,
    /// Prune the turn in progress as history too. A compaction prepared a turn ahead asks
    /// what its event could prune: by then the turn in progress is history, and only the
    /// turn after it is kept whole.
    pub prune_turn: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            context_window: Some(DEFAULT_WINDOW),
            model: None,
            target_tokens: None,
            ceiling_tokens: None,
            default_output_reserve: 4096,
            min_output_tokens: budget::MIN_OUTPUT_ROOM as usize,
            safety_margin_percent: 2,
            protect_first_n: 2,
            fill_percent: 70,
            prune_min_chars: 400,
            arg_max_chars: 100,
            summary_max_tokens: 4000,
            max_messages: None,
            prune_to: None,
            prune_settle: None,
            prune_turn: false,
        }
    }
}

impl Options {
    pub fn with_window(context_window: usize) -> Options {
        Options {
            context_window: Some(Window(context_window as u64)),
            ..Options::default()
        }
    }

    /// The prompt-token target for this request: the window less the completion budget
    /// ([`budget::reserve`], the proxy's rule too) and the margin. Neither a target nor a
    /// window: nothing bounds the request's tokens.
    pub fn target_for(&self, request: &Value) -> Limit {
        if let Some(t) = self.target_tokens {
            return Limit::At(t);
        }
        let Some(window) = self.context_window else {
            return Limit::Unbounded;
        };
        Limit::At(
            window
                .usize()
                .saturating_sub(self.reserve_for(request, window))
                .saturating_sub(self.margin(window)),
        )
    }

    /// The most prompt tokens this request may carry with its answer room cut to the
    /// minimum; never below the target.
    pub fn ceiling_for(&self, request: &Value) -> Limit {
        let target = self.target_for(request);
        // A target set by hand is a hard one unless a ceiling is set with it.
        let ceiling = match (self.ceiling_tokens, self.target_tokens) {
            (Some(c), _) => Limit::At(c),
            (None, Some(t)) => Limit::At(t),
            (None, None) => match self.context_window {
                Some(window) => {
                    let least = budget::least_answer_room(
                        budget::asked(request),
                        self.reserve_for(request, window) as u64,
                        self.min_output_tokens as u64,
                        window.0,
                    );
                    let least = usize::try_from(least).unwrap_or(usize::MAX);
                    Limit::At(
                        window
                            .usize()
                            .saturating_sub(least)
                            .saturating_sub(self.margin(window)),
                    )
                }
                None => target,
            },
        };
        ceiling.max(target)
    }

    fn reserve_for(&self, request: &Value, window: Window) -> usize {
        let reserve = budget::reserve(
            budget::asked(request),
            self.default_output_reserve as u64,
            window.0,
        );
        usize::try_from(reserve).unwrap_or(usize::MAX)
    }

    fn margin(&self, window: Window) -> usize {
        (window.usize() / 100).saturating_mul(self.safety_margin_percent)
    }

    fn fill(&self, target: Limit) -> Limit {
        target.map(|t| {
            (t / 100)
                .saturating_mul(self.fill_percent)
                .saturating_add((t % 100).saturating_mul(self.fill_percent) / 100)
        })
    }

    /// Summary budget: a tenth of the target, capped.
    fn summary_budget(&self, target: Limit) -> usize {
        target
            .map(|t| t / 10)
            .clamp(self.summary_max_tokens)
            .max(SUMMARY_MIN)
    }

    /// The deterministic digest's budget in tokens when it replaces `replaced` tokens: a
    /// quarter of them, but at least [`DIGEST_FLOOR`] unless it replaces less, and no more
    /// than the room the plan keeps for a summary unless that is below the floor: the
    /// constraints, errors, paths and decisions of a long stretch need a few hundred
    /// tokens however small the window, and escalation finds them elsewhere first (see
    /// [`escalate`]). A few messages get a few lines; a single short one still gets the
    /// summary's smallest size, room for a heading and a line. `extra` is room found
    /// free once the request fits ([`finish`] offers it), up to the summary's cap.
    fn digest_budget(&self, target: Limit, replaced: usize, extra: usize) -> usize {
        let base = (replaced / 4)
            .max(replaced.min(DIGEST_FLOOR))
            .max(SUMMARY_MIN)
            .min(self.summary_budget(target).max(DIGEST_FLOOR));
        base.saturating_add(extra)
            .min(self.summary_max_tokens.max(base))
    }
}

/// What happened, for logs, response headers and the offline command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub messages_before: usize,
    pub messages_after: usize,
    pub tokens_before: usize,
    pub tokens_after: usize,
    pub target_tokens: Limit,
    pub fits: bool,
    /// The request was returned as it came: forward the original bytes.
    pub unchanged: bool,
    pub summary: SummarySource,
    /// One short note per pass that changed something.
    pub notes: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.fits { "fits" } else { "DOES NOT FIT" };
        let what = if self.unchanged {
            "unchanged"
        } else {
            "compacted"
        };
        write!(
            f,
            "{what}: {} -> {} messages, {} -> {} tokens (target {}, {verdict}); summary {}",
            self.messages_before,
            self.messages_after,
            self.tokens_before,
            self.tokens_after,
            self.target_tokens,
            self.summary.as_str()
        )?;
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

/// The result of a compaction.
#[derive(Clone, Debug)]
pub struct Rewrite {
    /// The new request body; `None` when the original should be sent as it is (it already
    /// fit, or nothing could be gained), so a proxy can forward the original bytes.
    pub rewritten: Option<Value>,
    pub report: Report,
}

impl Rewrite {
    /// The body to send: the rewrite, or the original.
    pub fn body<'a>(&'a self, original: &'a Value) -> &'a Value {
        self.rewritten.as_ref().unwrap_or(original)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Already under target.
    Unchanged,
    /// The cheap passes were enough.
    Fits,
    /// A head, a middle to replace (perhaps nothing), and a tail.
    Reduce,
}

/// The state between the two phases: the conversation after passes 1-4 and the chosen
/// head/tail boundaries.
#[derive(Clone, Debug)]
pub struct Plan {
    stage: Stage,
    /// The request with `messages` emptied (so its key keeps its position).
    envelope: Map<String, Value>,
    counter: Counter,
    overhead: usize,
    target: Limit,
    /// How far the target may rise, at the answer's expense, to keep the turn in progress.
    ceiling: Limit,
    /// The most messages the result may have.
    max_messages: Limit,
    messages_before: usize,
    tokens_before: usize,
    messages: Vec<Message>,
    regions: Regions,
    head_end: usize,
    tail_start: usize,
    /// System/developer messages found in the middle: kept, placed before the summary.
    kept_instructions: Vec<Message>,
    /// The middle without instructions or earlier summaries: what the summary replaces.
    turns: Vec<Message>,
    previous_summary: Option<String>,
    notes: Vec<String>,
    /// Tokens the deterministic digest may take beyond its budget: room a first try left
    /// free under the target.
    digest_extra: usize,
    /// The messages as merged, before any was pruned or cut: what escalation digests when
    /// it folds a message it had pruned or cut first.
    originals: Vec<Message>,
    /// Where in `originals` each tool result stands by the call it answers, and each
    /// message that calls tools by its first call: a folded message's original is found
    /// without a search through all of them (one search per folded message made folding
    /// a turn of thousands of rounds quadratic).
    originals_by_call: OriginalsByCall,
    /// The first user message as the client sent it, before a run of user messages was
    /// joined to it: the task, which escalation keeps the opening of.
    task: Option<String>,
    /// The user messages right after the first one, as the client sent them: those the
    /// merge may have joined to the task.
    task_joined: Vec<String>,
    /// [`Plan::beside`], read once for every digest the plan writes (each regrowth and
    /// each fold of escalation writes one), and shared by its clones.
    beside: OnceLock<Arc<digest::Beside>>,
}

impl Plan {
    /// Whether `finish` needs a summary (of [`Plan::turns`], carrying
    /// [`Plan::previous_summary`] forward). Never for an empty middle.
    pub fn needs_summary(&self) -> bool {
        self.stage == Stage::Reduce && (!self.turns.is_empty() || self.previous_summary.is_some())
    }

    /// Whether the cheap passes (pruning above all) bring the request under its target,
    /// which it was over: a rewrite without a summary.
    pub fn prunes_alone(&self) -> bool {
        self.stage == Stage::Fits
    }

    /// The messages the summary replaces, in order.
    pub fn turns(&self) -> &[Message] {
        &self.turns
    }

    /// The body of a compaction summary found among the replaced messages.
    pub fn previous_summary(&self) -> Option<&str> {
        self.previous_summary.as_deref()
    }

    /// The messages kept verbatim before the summary.
    pub fn head(&self) -> &[Message] {
        &self.messages[..self.head_end]
    }

    /// The messages kept after the summary.
    pub fn tail(&self) -> &[Message] {
        &self.messages[self.tail_start..]
    }

    /// What the request keeps whole beside its summary, which no pass cuts: the
    /// instructions and the latest user message ([`digest::Beside`]).
    pub(crate) fn beside(&self) -> Arc<digest::Beside> {
        let read = || {
            let instructions = self
                .head()
                .iter()
                .chain(&self.kept_instructions)
                .chain(self.tail())
                .filter(|m| m.role.is_instruction());
            let latest = self.tail().iter().rev().find(|m| m.role == Role::User);
            Arc::new(digest::Beside::of(instructions.chain(latest)))
        };
        Arc::clone(self.beside.get_or_init(read))
    }

    /// How long a summary may be, in tokens.
    pub fn summary_budget_tokens(&self, opts: &Options) -> usize {
        opts.summary_budget(self.target)
    }

    /// What a summary written by a model should be shown: `middle` (these turns, or the
    /// client's own text of them), and beside it the turns escalation folds into a summary
    /// of the planned size (the head's first exchange before it, history the tail kept or
    /// the turn's earlier rounds after it); `None` when it folds none. A request that
    /// cannot fit with those turns kept loses them to the summary, and a model writes a
    /// checkpoint only of what it was shown: folded in by the digest alone, their facts
    /// never reached it. A dry run of [`finish`]'s last step with a stand-in of the most the
    /// summary may take tells which; an answer shorter than that may leave some of them
    /// kept, shown twice then, which costs summary tokens and loses nothing.
    pub fn with_folds(&self, middle: &[Message], opts: &Options) -> Option<Vec<Message>> {
        if !self.needs_summary() {
            return None;
        }
        let stand_in = stand_in_summary(self.summary_budget_tokens(opts), &self.counter);
        let folds = escalate::build_fitting(self, Some(stand_in), opts).folds;
        (!folds.is_empty()).then(|| {
            let mut turns = folds.head;
            turns.extend_from_slice(middle);
            turns.extend(folds.later);
            turns
        })
    }

    fn total(&self, messages: &[Message]) -> usize {
        messages.iter().map(|m| m.tokens).sum::<usize>() + self.overhead
    }

    fn fits(&self) -> bool {
        self.target.admits(self.total(&self.messages))
            && self.max_messages.admits(self.messages.len())
    }

    /// The message `m` was before any pass pruned or cut it: the same role, the same tool
    /// call id or calls, and (cuts keep a text's beginning) the same opening.
    fn original_of<'p>(&'p self, m: &'p Message) -> &'p Message {
        let text = m.text();
        // Up to where a cut's note starts, if it starts that early. Clipped after the
        // split: a note starting right at the clip would leave its newline in the
        // opening, which the original does not have.
        let before_note = text.split("\n[...").next().unwrap_or(&text);
        let opening = message::clip(before_note, 60);
        // Pruning may shorten a call's arguments: calls are known by their ids.
        let ids = |m: &Message| -> Vec<Option<String>> {
            m.tool_calls()
                .iter()
                .map(|c| message::call_id(c).map(str::to_owned))
                .collect()
        };
        let calls = ids(m);
        let same = |o: &&Message| {
            o.role == m.role
                && o.tool_call_id() == m.tool_call_id()
                && ids(o) == calls
                && (m.role.is_result() || o.text().starts_with(opening))
        };
        let by_call = match m.tool_call_id() {
            Some(id) => self.originals_by_call.results.get(id),
            None => calls
                .first()
                .and_then(Option::as_deref)
                .and_then(|id| self.originals_by_call.calls.get(id)),
        };
        if let Some(o) = by_call.map(|&i| &self.originals[i]).filter(same) {
            return o;
        }
        self.originals.iter().find(same).unwrap_or(m)
    }
}

/// Parses a request body and compacts it with the deterministic summary.
pub fn compact_bytes(body: &[u8], opts: &Options) -> Result<(Value, Rewrite), EngineError> {
    let request: Value =
        serde_json::from_slice(body).map_err(|e| EngineError::InvalidJson(e.to_string()))?;
    let outcome = compact(&request, opts)?;
    Ok((request, outcome))
}

/// Writes the summary of a plan's middle; [`compact_with`] calls it between planning
/// and finishing, only when a summary is needed. A summariser that must wait on the
/// network (an LLM call) drives [`plan`] and [`finish`] itself instead, so the engine
/// stays free of I/O and async.
pub trait SummaryWriter {
    fn summarize(&self, plan: &Plan, opts: &Options) -> Summary;
}

/// The summary made from the dropped turns themselves, with no model: it cannot fail,
/// which makes it the fallback of every other summariser.
#[derive(Debug, Clone, Copy, Default)]
pub struct Deterministic;

impl SummaryWriter for Deterministic {
    fn summarize(&self, plan: &Plan, opts: &Options) -> Summary {
        summarize_deterministic(plan, opts)
    }
}

/// Passes 1-8 with the deterministic summary.
pub fn compact(request: &Value, opts: &Options) -> Result<Rewrite, EngineError> {
    compact_with(request, None, opts, &Deterministic)
}

/// Passes 1-8 with `summarizer`, reusing per-message counts the caller already has
/// (from [`count_messages`] on the same request).
pub fn compact_with(
    request: &Value,
    counts: Option<&[usize]>,
    opts: &Options,
    summarizer: &dyn SummaryWriter,
) -> Result<Rewrite, EngineError> {
    let plan = plan_with_counts(request, counts, opts)?;
    let summary = plan
        .needs_summary()
        .then(|| summarizer.summarize(&plan, opts));
    Ok(finish(plan, summary, opts))
}

/// The summary of a middle that is only an earlier summary: that summary as it was, byte
/// for byte, reported as reused; rewriting it would change what the upstream's prompt
/// cache holds, and call an LLM's summary a digest. `None` when there are turns to
/// summarise or no earlier summary.
pub fn reused_summary(turns: &[Message], previous: Option<&str>) -> Option<Summary> {
    match (turns, previous) {
        ([], Some(previous)) => Some(Summary {
            text: previous.to_owned(),
            source: SummarySource::Cache,
        }),
        _ => None,
    }
}

/// The deterministic summary of a plan's middle; an earlier summary standing alone is
/// kept ([`reused_summary`]).
pub fn summarize_deterministic(plan: &Plan, opts: &Options) -> Summary {
    if let Some(reused) = reused_summary(plan.turns(), plan.previous_summary()) {
        return reused;
    }
    let replaced = plan.turns.iter().map(|m| m.tokens).sum::<usize>()
        + plan.previous_summary().map_or(0, |p| plan.counter.text(p));
    Summary {
        text: digest::digest_in(
            plan.previous_summary(),
            plan.turns(),
            chars_for(opts.digest_budget(plan.target, replaced, plan.digest_extra)),
            false,
            &plan.beside(),
        ),
        source: SummarySource::Fallback,
    }
}

/// Code and JSON run about 3 characters per token; budgets in characters use that ratio so
/// they err on the small side.
fn chars_for(tokens: usize) -> usize {
    tokens.saturating_mul(3)
}

/// Passes 1-4.
pub fn plan(request: &Value, opts: &Options) -> Result<Plan, EngineError> {
    plan_with_counts(request, None, opts)
}

/// Like [`plan`], reusing per-message token counts the caller already has (from
/// [`count_messages`] on the same request), so nothing is counted twice.
pub fn plan_with_counts(
    request: &Value,
    counts: Option<&[usize]>,
    opts: &Options,
) -> Result<Plan, EngineError> {
    let obj = request.as_object().ok_or(EngineError::NotAnObject)?;
    let raw = match obj.get("messages") {
        None => return Err(EngineError::MissingMessages),
        Some(Value::Array(raw)) if raw.is_empty() => return Err(EngineError::NoMessages),
        Some(Value::Array(raw)) => raw,
        Some(_) => return Err(EngineError::MessagesNotArray),
    };
    let counter = match &opts.model {
        Some(m) => Counter::for_model(m),
        None => Counter::for_request(request),
    };
    let counts: Vec<usize> = match counts {
        Some(c) if c.len() == raw.len() => c.to_vec(),
        _ => counter.messages(raw),
    };
    let roles = raw
        .iter()
        .enumerate()
        .map(|(i, m)| message::role_of(i, m))
        .collect::<Result<Vec<Role>, EngineError>>()?;
    let overhead = counter.request_overhead(request);
    let tokens_before = counts.iter().sum::<usize>() + overhead;
    let target = opts.target_for(request);
    let mut envelope = Map::new();
    for (k, v) in obj {
        let v = if k == "messages" {
            Value::Null
        } else {
            v.clone()
        };
        envelope.insert(k.clone(), v);
    }
    let mut plan = Plan {
        stage: Stage::Unchanged,
        envelope,
        counter,
        overhead,
        target,
        ceiling: opts.ceiling_for(request),
        max_messages: Limit::from(opts.max_messages),
        messages_before: raw.len(),
        tokens_before,
        messages: Vec::new(),
        regions: Regions::find(&[]),
        head_end: 0,
        tail_start: 0,
        kept_instructions: Vec::new(),
        turns: Vec::new(),
        previous_summary: None,
        notes: Vec::new(),
        digest_extra: 0,
        originals: Vec::new(),
        originals_by_call: OriginalsByCall::default(),
        task: None,
        task_joined: Vec::new(),
        beside: OnceLock::new(),
    };
    if target.admits(tokens_before) && plan.max_messages.admits(raw.len()) {
        return Ok(plan);
    }
    plan.messages = raw
        .iter()
        .zip(roles.into_iter().zip(counts))
        .map(|(m, (role, tokens))| Message::from_parts(role, m, tokens))
        .collect();
    run_cheap_passes(&mut plan, opts);
    Ok(plan)
}

fn run_cheap_passes(plan: &mut Plan, opts: &Options) {
    let counter = plan.counter;
    remember_task(plan);
    merge_and_mark(plan, &counter);
    if plan.fits() || strip_media(plan, &counter) {
        return;
    }
    let turn_start = plan.regions.turn_start;
    let pruned_end = if opts.prune_turn {
        plan.messages.len()
    } else {
        turn_start
    };
    let pruner = Pruner::new(&plan.messages, opts, &counter);
    if prune_alone(plan, opts, &pruner, pruned_end) {
        return;
    }
    make_room_for_a_summary(plan, opts, &pruner, turn_start);
}

/// The task as the user first stated it, and the user messages that continue it.
fn remember_task(plan: &mut Plan) {
    plan.task = plan
        .messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| m.text().into_owned());
    plan.task_joined = plan
        .messages
        .iter()
        .skip_while(|m| m.role != Role::User)
        .skip(1)
        .take_while(|m| m.role == Role::User)
        .map(|m| m.text().into_owned())
        .collect();
}

/// Consecutive messages of one role joined, the regions found, and the messages as they
/// stand kept as the originals a summary is made from.
fn merge_and_mark(plan: &mut Plan, counter: &Counter) {
    let merged = merge::merge_same_role(&mut plan.messages, counter);
    if merged > 0 {
        plan.notes.push(format!("merge: joined {merged}"));
    }
    plan.regions = Regions::find(&plan.messages);
    plan.stage = Stage::Fits;
    plan.originals = plan.messages.clone();
    plan.originals_by_call = OriginalsByCall::of(&plan.originals);
}

/// [`Plan::originals_by_call`].
#[derive(Clone, Debug, Default)]
struct OriginalsByCall {
    results: HashMap<String, usize>,
    calls: HashMap<String, usize>,
}

impl OriginalsByCall {
    fn of(messages: &[Message]) -> OriginalsByCall {
        let mut index = OriginalsByCall::default();
        for (i, m) in messages.iter().enumerate() {
            if let Some(id) = m.tool_call_id() {
                index.results.entry(id.to_owned()).or_insert(i);
            }
            if let Some(id) = m.tool_calls().first().and_then(message::call_id) {
                index.calls.entry(id.to_owned()).or_insert(i);
            }
        }
        index
    }
}

/// Old media replaced when the tokens are over (too many messages is not fixed by them);
/// whether the plan fits after.
fn strip_media(plan: &mut Plan, counter: &Counter) -> bool {
    if plan.target.admits(plan.total(&plan.messages)) {
        return false;
    }
    let stripped = media::strip_old_media(&mut plan.messages, counter);
    if stripped > 0 {
        plan.notes.push(format!("media: stripped {stripped}"));
    }
    plan.fits()
}

/// Pruning the history alone, when it is enough: no summary, nothing else lost (when
/// the messages are not too many: pruning keeps every one). Whether it was.
fn prune_alone(plan: &mut Plan, opts: &Options, pruner: &Pruner<'_>, pruned_end: usize) -> bool {
    // Pruning the history is enough: no summary, nothing else lost (when the messages
    // are not too many: pruning keeps every one).
    let total = plan.total(&plan.messages);
    let over = plan.target.excess(total);
    let verbatim = |j| j >= pruned_end;
    let prunes = match opts.prune_to {
        Some(deep) => {
            let deeper = total.saturating_sub(deep).max(over);
            let block = pruner.newest_block(&plan.messages, 0..pruned_end, deeper, verbatim);
            let settled = opts.prune_settle.and_then(|level| {
                let settle = total.saturating_sub(level);
                let range = 0..pruned_end;
                let settled = pruner.since_pruned(&plan.messages, range, settle, verbatim)?;
                (settled.first() > block.first()).then_some((settled, level))
            });
            match settled {
                // The target it settles for is its level.
                Some((settled, level)) => {
                    plan.target = plan.target.max(Limit::At(level));
                    settled
                }
                None => block,
            }
        }
        None => pruner.oldest_first(&plan.messages, 0..pruned_end, over, verbatim),
    };
    let over = plan.target.excess(total);
    if prunes.saved >= over && plan.max_messages.admits(plan.messages.len()) {
        let stats = prunes.apply(&mut plan.messages);
        note_prunes(&mut plan.notes, "prune", stats);
        return true;
    }
    false
}

/// Otherwise the smallest middle whose summary makes the rest fit, the tail kept as it
/// can be (pruned or cut), and the middle split off to be summarised.
fn make_room_for_a_summary(
    plan: &mut Plan,
    opts: &Options,
    pruner: &Pruner<'_>,
    turn_start: usize,
) {
    // Otherwise the smallest middle whose summary makes the rest fit. The middle is
    // summarised from its original messages, not from pruned ones.
    plan.stage = Stage::Reduce;
    plan.head_end = boundary::head_end(&plan.messages, &plan.regions, opts.protect_first_n);
    let before: Vec<Message> = plan.messages.clone();
    // An earlier summary is always in the middle, to be carried into the new one.
    let floor = plan.messages[plan.head_end..turn_start]
        .iter()
        .rposition(|m| summary::has_marker(&m.text()))
        .map_or(plan.head_end, |i| plan.head_end + i + 1);
    let reserved = opts.summary_budget(plan.target);
    plan.tail_start = choose_tail(plan, opts, pruner, turn_start, floor, reserved);
    // The tail was chosen beside the summary's usual room, a tenth of the target; the
    // digest of what it leaves out needs the room `digest_budget` gives it (a few hundred
    // tokens for a short stretch), and below a target of a few thousand tokens that is
    // more than a tenth: the tail's last group took the difference and the digest, built
    // last, was cut to the remainder (a constraint, a number and an error line lost at a
    // 75% window of 9-message sessions). So the tail is chosen again beside the room the
    // dropped stretch needs, up to a quarter of the target: an older kept group joins the
    // middle, or a kept old output is pruned or cut. The turn in progress is never part
    // of the tail's choice, and its groups keep calls with their results.
    let need = digest_room(plan, opts, floor);
    if need > reserved {
        plan.messages = before.clone();
        plan.tail_start = choose_tail(plan, opts, pruner, turn_start, floor, need);
    }
    let reshaped = plan.messages[plan.tail_start..turn_start]
        .iter()
        .zip(&before[plan.tail_start..turn_start])
        .filter(|(m, b)| m.tokens != b.tokens)
        .count();
    if reshaped > 0 {
        plan.notes
            .push(format!("tail: {reshaped} kept pruned or cut"));
    }
    split_middle(plan);
}

/// Start of the tail kept beside the head, the turn in progress, the middle's
/// instructions and `reserved` tokens of summary.
fn choose_tail(
    plan: &mut Plan,
    opts: &Options,
    pruner: &Pruner<'_>,
    turn_start: usize,
    floor: usize,
    reserved: usize,
) -> usize {
    let middle_instructions = || {
        plan.messages[plan.head_end..turn_start]
            .iter()
            .filter(|m| m.role.is_instruction())
    };
    let fixed = plan.overhead
        + plan.messages[..plan.head_end]
            .iter()
            .chain(&plan.messages[turn_start..])
            .chain(middle_instructions())
            .map(|m| m.tokens)
            .sum::<usize>()
        + reserved;
    let fill = opts.fill(plan.target).less(fixed);
    // Messages the tail may keep beside the head, the summary (and a message the strict
    // role order may add beside it), the middle's instructions and the turn in progress.
    let kept =
        plan.head_end + 2 + middle_instructions().count() + (plan.messages.len() - turn_start);
    let room = TailRoom {
        fill,
        stretch: match (plan.target, fill) {
            (Limit::At(target), Limit::At(fill)) => {
                target.saturating_sub(fixed).saturating_sub(fill)
            }
            // With no target, no fill to run past.
            _ => 0,
        },
        messages: plan.max_messages.less(kept),
    };
    boundary::tail_start(
        &mut plan.messages,
        floor,
        turn_start,
        room,
        pruner,
        &plan.counter,
    )
}

/// Tokens the digest of the middle the plan's tail leaves (from `floor`, past an earlier
/// summary, which is carried whole) is given, up to a quarter of the target: a larger
/// share would leave the turn's history too little at small windows.
fn digest_room(plan: &Plan, opts: &Options, floor: usize) -> usize {
    let Limit::At(target) = plan.target else {
        return 0;
    };
    let replaced = plan.messages[floor..plan.tail_start]
        .iter()
        .filter(|m| !m.role.is_instruction())
        .map(|m| plan.original_of(m).tokens)
        .sum::<usize>();
    opts.digest_budget(plan.target, replaced, 0).min(target / 4)
}

fn note_prunes(notes: &mut Vec<String>, pass: &str, stats: prune::PruneStats) {
    if stats.total() > 0 {
        notes.push(format!(
            "{pass}: {} outputs, {} duplicates, {} arguments, {} cut",
            stats.summarized, stats.deduplicated, stats.arguments, stats.cut
        ));
    }
}

/// Sorts the middle into kept instructions, an earlier summary, and turns to summarise.
fn split_middle(plan: &mut Plan) {
    for m in &plan.messages[plan.head_end..plan.tail_start] {
        if m.role.is_instruction() {
            plan.kept_instructions.push(m.clone());
            continue;
        }
        let text = m.text();
        match summary::extract(&text) {
            Some((body, rest)) => {
                plan.previous_summary = Some(body);
                if !rest.is_empty() {
                    let mut turn = m.clone();
                    turn.set_content(Value::String(rest), &plan.counter);
                    plan.turns.push(turn);
                }
            }
            None => plan.turns.push(m.clone()),
        }
    }
}

/// Passes 5-8: assemble head + summary + tail, sanitise, put the roles in strict order,
/// validate, escalate if needed. `summary` is used when the plan needs one; an empty or
/// missing one is replaced by the deterministic digest. A plan whose middle is empty
/// gets no summary at all.
pub fn finish(plan: Plan, summary: Option<Summary>, opts: &Options) -> Rewrite {
    match plan.stage {
        Stage::Unchanged => unchanged(&plan, true, Vec::new(), plan.target),
        Stage::Fits => {
            let mut notes = Vec::new();
            let messages = repair(plan.messages.clone(), &plan.counter, &mut notes);
            conclude(&plan, messages, SummarySource::None, notes, plan.target)
        }
        Stage::Reduce => {
            // An LLM's summary is written once; the digest can be written again larger
            // when the first try leaves room under the target.
            let given = summary
                .as_ref()
                .is_some_and(|s| !s.text.trim().is_empty() && s.source != SummarySource::Fallback);
            let first = reduce(&plan, summary, opts);
            if given || first.rewritten.is_none() {
                return first;
            }
            regrow(&plan, first, opts)
        }
    }
}

/// The digest written again larger while the last try leaves room under the target: a
/// digest's budget in characters errs small (three characters a token, where prose runs
/// four) and each try offers only part of the room left, so one try left a tenth of a
/// small window unused while facts were given up. A try that no longer fits halves the
/// step; one that grows nothing ends it. At most [`REGROW_TRIES`] more digests.
fn regrow(plan: &Plan, first: Rewrite, opts: &Options) -> Rewrite {
    let mut best = first;
    let mut extra = 0usize;
    let mut step = None;
    for _ in 0..REGROW_TRIES {
        let tokens = best.report.tokens_after;
        let free = match plan.target {
            Limit::At(target) if tokens > target || target - tokens < regrow_min(target) => break,
            Limit::At(target) => target - tokens,
            // Nothing bounds the digest but its own cap: one try at that.
            Limit::Unbounded if extra == 0 => opts.summary_max_tokens * 3 / 2,
            Limit::Unbounded => break,
        };
        let offer = step.unwrap_or(free * 2 / 3);
        let mut roomy = plan.clone();
        roomy.digest_extra = extra + offer;
        let next = reduce(&roomy, None, opts);
        let fits = next.rewritten.is_some() && plan.target.admits(next.report.tokens_after);
        if !fits {
            step = Some(offer / 2);
            continue;
        }
        if next.report.tokens_after <= tokens {
            break;
        }
        extra += offer;
        step = None;
        best = next;
    }
    best
}

/// Text of at least `tokens` tokens, standing in for a summary not written yet.
fn stand_in_summary(tokens: usize, counter: &Counter) -> String {
    let mut text = " x".repeat(tokens);
    while counter.text(&text) < tokens {
        text.push_str(&" x".repeat(tokens));
    }
    text
}

/// Less free room than this under the target is not worth another digest.
const REGROW_MIN: usize = 40;

/// Free room under `target` worth another digest: [`REGROW_MIN`], but in a small target
/// a twentieth of it (at least a dozen tokens), since there a path or a short error line
/// is the size of the room a larger target would not bother about.
fn regrow_min(target: usize) -> usize {
    (target / 20).clamp(12, REGROW_MIN)
}
/// Digests written again at most, beyond the first.
const REGROW_TRIES: usize = 4;

/// Passes 5-8 for a plan that needs its middle replaced.
fn reduce(plan: &Plan, summary: Option<Summary>, opts: &Options) -> Rewrite {
    let summary = plan.needs_summary().then(|| match summary {
        Some(s) if !s.text.trim().is_empty() => s,
        _ => summarize_deterministic(plan, opts),
    });
    let mut notes = Vec::new();
    if summary.is_some() {
        notes.push(format!(
            "summarised {} messages{}",
            plan.turns.len(),
            if plan.previous_summary.is_some() {
                ", earlier summary carried"
            } else {
                ""
            }
        ));
    }
    let source = summary.as_ref().map_or(SummarySource::None, |s| s.source);
    let fitted = escalate::build_fitting(plan, summary.map(|s| s.text), opts);
    notes.extend(fitted.notes);
    let source = if fitted.summarised {
        // Escalation digested more turns into a summary of its own making.
        match source {
            SummarySource::None => SummarySource::Fallback,
            other => other,
        }
    } else {
        source
    };
    conclude(plan, fitted.messages, source, notes, fitted.target)
}

/// Builds head + kept instructions + summary + tail and repairs the tool protocol and
/// the role order.
fn build(
    plan: &Plan,
    head: &[Message],
    kept: &[Message],
    body: Option<&str>,
    tail: &[Message],
    notes: &mut Vec<String>,
) -> Vec<Message> {
    let mut head_part: Vec<Message> = head.to_vec();
    head_part.extend(kept.iter().cloned());
    let assembled = match body {
        Some(body) => {
            let (assembled, placement) =
                assemble::assemble(head_part, body, tail.to_vec(), &plan.counter);
            match placement {
                Placement::Own(_) => {}
                Placement::MergedIntoNext => {
                    notes.push("summary merged into the next message".into())
                }
                Placement::MergedIntoPrevious => {
                    notes.push("summary merged into the previous message".into())
                }
            }
            assembled
        }
        None => {
            head_part.extend(tail.iter().cloned());
            head_part
        }
    };
    repair(assembled, &plan.counter, notes)
}

fn repair(messages: Vec<Message>, counter: &Counter, notes: &mut Vec<String>) -> Vec<Message> {
    let (clean, stats) = sanitize::sanitize(messages, counter);
    if stats.dropped_results + stats.stubbed_calls > 0 {
        notes.push(format!(
            "sanitize: dropped {} results, stubbed {} calls",
            stats.dropped_results, stats.stubbed_calls
        ));
    }
    let (strict, changes) = roles::conform(clean, counter);
    if changes > 0 {
        notes.push(format!("roles: {changes} merged or added for strict order"));
    }
    strict
}

fn unchanged(plan: &Plan, fits: bool, notes: Vec<String>, target: Limit) -> Rewrite {
    Rewrite {
        rewritten: None,
        report: Report {
            messages_before: plan.messages_before,
            messages_after: plan.messages_before,
            tokens_before: plan.tokens_before,
            tokens_after: plan.tokens_before,
            target_tokens: target,
            fits,
            unchanged: true,
            summary: SummarySource::None,
            notes,
        },
    }
}

/// Final checks: the result must pass the strict validator and must be smaller than the
/// input, otherwise the original goes out unchanged. `target` is the target reached for,
/// raised above the plan's when the turn in progress took room from the answer.
fn conclude(
    plan: &Plan,
    messages: Vec<Message>,
    source: SummarySource,
    extra: Vec<String>,
    target: Limit,
) -> Rewrite {
    let mut notes = plan.notes.clone();
    notes.extend(extra);
    let tokens_after = plan.total(&messages);
    if tokens_after >= plan.tokens_before {
        notes.push("no smaller form found".into());
        return unchanged(plan, target.admits(plan.tokens_before), notes, target);
    }
    let values: Vec<Value> = messages
        .into_iter()
        .map(|m| Value::Object(m.body))
        .collect();
    if let Err(e) = validate_strict(&values) {
        notes.push(format!("result failed validation ({e}); sent unchanged"));
        return unchanged(plan, false, notes, target);
    }
    let messages_after = values.len();
    let mut body = plan.envelope.clone();
    body.insert("messages".into(), Value::Array(values));
    Rewrite {
        rewritten: Some(Value::Object(body)),
        report: Report {
            messages_before: plan.messages_before,
            messages_after,
            tokens_before: plan.tokens_before,
            tokens_after,
            target_tokens: target,
            fits: target.admits(tokens_after),
            unchanged: false,
            summary: source,
            notes,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(rounds: usize, output_chars: usize) -> Value {
        let mut messages = vec![json!({"role": "system", "content": "You are a careful agent."})];
        for r in 0..rounds {
            let id = format!("c{r}");
            messages.push(json!({"role": "user", "content": format!("step {r}: keep going")}));
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
                "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"make\"}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id,
                "content": format!("build line {r}\n").repeat(output_chars / 13)}));
            messages.push(json!({"role": "assistant", "content": format!("round {r} done")}));
        }
        messages.push(json!({"role": "user", "content": "finish up"}));
        json!({"model": "gpt-4o", "max_tokens": 100, "messages": messages})
    }

    fn roles(v: &Value) -> Vec<&str> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect()
    }

    /// A text agent's session: the task, its first long reply, rounds of observations
    /// and replies, the latest ask.
    fn first_reply_session(first_reply_words: usize) -> Value {
        let mut messages = vec![
            json!({"role": "system", "content": "You run Python for the user."}),
            json!({"role": "user", "content": "Total the invoices by month."}),
            json!({"role": "assistant", "content": format!("Picking duckdb_41 for this. {}",
                "the plan holds ".repeat(first_reply_words))}),
        ];
        for r in 0..8 {
            messages.push(
                json!({"role": "user", "content": format!("exitcode: 0\nmonth {r}: {r}00.00")}),
            );
            messages
                .push(json!({"role": "assistant", "content": "looks right so far ".repeat(60)}));
        }
        let ask = format!(
            "Now the yearly report. {}",
            "with the same columns ".repeat(150)
        );
        messages.push(json!({"role": "user", "content": ask}));
        json!({"model": "gpt-4o", "max_tokens": 100, "messages": messages})
    }

    #[test]
    fn a_model_summary_is_shown_the_first_exchange_only_when_the_request_cannot_keep_it() {
        let opts = Options::with_window(1500);
        let short = plan(&first_reply_session(10), &opts).unwrap();
        assert!(short.needs_summary());
        assert!(short.with_folds(short.turns(), &opts).is_none());

        let long = plan(&first_reply_session(400), &opts).unwrap();
        assert!(long.needs_summary());
        let shown = long
            .with_folds(long.turns(), &opts)
            .expect("the first reply folds");
        assert!(
            shown[0].text().starts_with("Picking duckdb_41"),
            "{:?}",
            shown[0].text()
        );
        let texts = |m: &[Message]| m.iter().map(|m| m.text().into_owned()).collect::<Vec<_>>();
        assert_eq!(texts(&shown[1..=long.turns().len()]), texts(long.turns()));
    }

    #[test]
    fn target_leaves_room_for_the_completion_and_a_margin() {
        let opts = Options::with_window(10_000);
        assert_eq!(
            opts.target_for(&json!({"max_tokens": 1000})),
            Limit::At(10_000 - 1000 - 200)
        );
        assert_eq!(
            opts.target_for(&json!({"max_completion_tokens": 500, "max_tokens": 9})),
            Limit::At(9_300)
        );
        assert_eq!(opts.target_for(&json!({})), Limit::At(10_000 - 2500 - 200));
        let fixed = Options {
            target_tokens: Some(42),
            ..opts
        };
        assert_eq!(fixed.target_for(&json!({"max_tokens": 1})), Limit::At(42));
    }

    #[test]
    fn in_a_small_window_the_turn_in_progress_may_take_half_the_answers_room() {
        // 4,096 tokens: a quarter (1,024) reserved, and 2% (80) of margin.
        let opts = Options::with_window(4096);
        assert_eq!(opts.target_for(&json!({})), Limit::At(4096 - 1024 - 80));
        // No cap asked: the answer may be left an eighth of the window.
        assert_eq!(opts.ceiling_for(&json!({})), Limit::At(4096 - 512 - 80));
        // A cap asked is what the upstream holds the prompt to.
        let asked = json!({"max_tokens": 1024});
        assert_eq!(opts.ceiling_for(&asked), opts.target_for(&asked));
        // A large window's answer goes down to the least room, as ever.
        let large = Options::with_window(128_000);
        assert_eq!(
            large.ceiling_for(&json!({})),
            Limit::At(128_000 - 1024 - 2560)
        );
    }

    #[test]
    fn an_unknown_window_leaves_the_given_target_and_ceiling_as_the_only_bounds() {
        let bounded = Options {
            context_window: None,
            target_tokens: Some(5000),
            ceiling_tokens: Some(6000),
            ..Options::default()
        };
        // No window: a large completion ask takes nothing off the target.
        let asks_much = json!({"max_tokens": 100_000});
        assert_eq!(bounded.target_for(&asks_much), Limit::At(5000));
        assert_eq!(bounded.ceiling_for(&asks_much), Limit::At(6000));
        let unbounded = Options {
            context_window: None,
            ..Options::default()
        };
        assert_eq!(unbounded.target_for(&asks_much), Limit::Unbounded);
        assert_eq!(unbounded.ceiling_for(&asks_much), Limit::Unbounded);
        let request = session(12, 2000);
        assert!(compact(&request, &unbounded).unwrap().report.unchanged);
        assert!(!compact(&request, &bounded).unwrap().report.unchanged);
    }

    #[test]
    fn with_no_bound_on_tokens_a_message_cap_alone_shapes_the_result() {
        let request = session(12, 2000);
        let count = |v: &Value| v["messages"].as_array().map_or(0, Vec::len);
        let capped = Options {
            context_window: None,
            max_messages: Some(10),
            ..Options::default()
        };
        let outcome = compact(&request, &capped).unwrap();
        let report = &outcome.report;
        // No token target: the report says so instead of printing a number nobody set,
        // and whatever the size, it fits.
        assert_eq!(report.target_tokens, Limit::Unbounded);
        assert!(report.fits, "{report}");
        assert!(
            report.to_string().contains("(target none, fits)"),
            "{report}"
        );
        let rewritten = outcome.rewritten.unwrap();
        assert!(count(&rewritten) <= 10, "{rewritten}");
        assert!(validate_strict(rewritten["messages"].as_array().unwrap()).is_ok());
    }

    #[test]
    fn plan_exposes_the_middle_for_an_external_summariser() {
        let request = session(12, 2000);
        let opts = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let plan = plan(&request, &opts).unwrap();
        assert!(plan.needs_summary());
        assert!(plan.previous_summary().is_none());
        assert_eq!(plan.head()[0].role, Role::System);
        assert_eq!(plan.tail().last().unwrap().text(), "finish up");
        assert!(plan.turns().iter().all(|m| !m.role.is_instruction()));
        let llm = Summary {
            text: "## Goal\nship the build".into(),
            source: SummarySource::Llm,
        };
        let outcome = finish(plan, Some(llm), &opts);
        assert_eq!(outcome.report.summary, SummarySource::Llm);
        let body = outcome.rewritten.unwrap();
        assert!(body.to_string().contains("ship the build"));
        validate(body["messages"].as_array().unwrap()).unwrap();
    }

    #[test]
    fn a_cut_message_is_known_by_its_opening_wherever_the_note_starts() {
        let request = session(12, 2000);
        let opts = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let mut plan = plan(&request, &opts).unwrap();
        let counter = plan.counter;
        let text = format!("{} and then much more", "x".repeat(59));
        let original = Message::from_parts(
            Role::Assistant,
            &serde_json::json!({"role": "assistant", "content": text}),
            counter.text(&text),
        );
        plan.originals.push(original);
        // The cut's note right at the sixtieth character, and earlier.
        for at in [59, 30] {
            let cut = format!(
                "{}\n[... 99 characters omitted by compaction ...]\nmore",
                &text[..at]
            );
            let m = Message::from_parts(
                Role::Assistant,
                &serde_json::json!({"role": "assistant", "content": cut}),
                counter.text(&cut),
            );
            assert_eq!(plan.original_of(&m).text(), text, "note at {at}");
        }
    }

    #[test]
    fn compact_with_asks_the_summarizer_only_when_a_summary_is_needed() {
        struct Canned(std::cell::Cell<usize>);
        impl SummaryWriter for Canned {
            fn summarize(&self, _: &Plan, _: &Options) -> Summary {
                self.0.set(self.0.get() + 1);
                Summary {
                    text: "## Goal\ncanned checkpoint".into(),
                    source: SummarySource::Llm,
                }
            }
        }
        let request = session(12, 2000);
        let tight = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let canned = Canned(std::cell::Cell::new(0));
        let outcome = compact_with(&request, None, &tight, &canned).unwrap();
        assert_eq!(canned.0.get(), 1);
        assert_eq!(outcome.report.summary, SummarySource::Llm);
        assert!(outcome
            .rewritten
            .unwrap()
            .to_string()
            .contains("canned checkpoint"));

        let roomy = Options::with_window(1_000_000);
        let outcome = compact_with(&request, None, &roomy, &canned).unwrap();
        assert_eq!(canned.0.get(), 1, "a request that fits needs no summary");
        assert!(outcome.report.unchanged);
    }

    #[test]
    fn a_message_cap_summarises_the_oldest_history_when_the_tokens_fit() {
        let request = session(12, 20);
        let count = |v: &Value| v["messages"].as_array().map_or(0, Vec::len);
        assert!(count(&request) > 10);
        let capped = Options {
            max_messages: Some(10),
            ..Options::with_window(1_000_000)
        };
        let plan = plan(&request, &capped).unwrap();
        assert!(plan.needs_summary());
        let outcome = finish(plan, None, &capped);
        let rewritten = outcome.rewritten.unwrap();
        assert!(count(&rewritten) <= 10, "{rewritten}");
        assert!(validate_strict(rewritten["messages"].as_array().unwrap()).is_ok());
        // Without the cap, nothing is done.
        let uncapped = Options::with_window(1_000_000);
        assert!(compact(&request, &uncapped).unwrap().report.unchanged);
    }

    #[test]
    fn a_blank_external_summary_falls_back_to_the_digest() {
        let request = session(12, 2000);
        let opts = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let plan = plan(&request, &opts).unwrap();
        let blank = Summary {
            text: "  \n".into(),
            source: SummarySource::Llm,
        };
        let outcome = finish(plan, Some(blank), &opts);
        assert_eq!(outcome.report.summary, SummarySource::Fallback);
        assert!(outcome
            .rewritten
            .unwrap()
            .to_string()
            .contains("step 1: keep going"));
    }

    #[test]
    fn an_earlier_summary_alone_in_the_middle_is_kept_as_it_was() {
        let before =
            summary::wrap("## Goal\nShip the parser.\n\n## Completed Actions\n1. ran the tests");
        let request = json!({"model": "gpt-4o", "max_tokens": 100, "messages": [
            {"role": "system", "content": "You are a careful agent."},
            {"role": "user", "content": "step 0: keep going"},
            {"role": "assistant", "content": before},
            {"role": "user", "content": "and now?"},
            {"role": "assistant", "content": "done ".repeat(300)},
        ]});
        let opts = Options {
            target_tokens: Some(300),
            ..Options::default()
        };
        let plan = plan(&request, &opts).unwrap();
        assert!(
            plan.needs_summary() && plan.turns().is_empty(),
            "{:?} {} {:?}",
            plan.stage,
            plan.turns().len(),
            plan.previous_summary().map(str::len)
        );
        let outcome = finish(plan, None, &opts);
        assert_eq!(outcome.report.summary, SummarySource::Cache);
        let text = outcome.rewritten.unwrap().to_string();
        assert!(
            text.contains("Ship the parser.\\n\\n## Completed Actions\\n1. ran the tests"),
            "{text}"
        );
    }

    #[test]
    fn a_summary_in_the_tight_frame_is_merged_into_the_next_one() {
        let earlier = "## Errors\n- bash make: error: missing symbol zq17_init";
        let before = summary::wrap(earlier);
        assert!(before.ends_with(summary::END_MARKER_SHORT), "{before}");
        let mut request = session(8, 600);
        let msgs = request["messages"].as_array_mut().unwrap();
        msgs.insert(2, json!({"role": "assistant", "content": before}));
        let opts = Options {
            target_tokens: Some(400),
            ..Options::default()
        };
        let plan = plan(&request, &opts).unwrap();
        assert_eq!(plan.previous_summary(), Some(earlier));
        let outcome = finish(plan, None, &opts);
        assert_eq!(
            outcome.report.summary,
            SummarySource::Fallback,
            "{}",
            outcome.report
        );
        let body = outcome.rewritten.unwrap();
        let texts: Vec<String> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap_or_default().to_string())
            .collect();
        let holders: Vec<&String> = texts.iter().filter(|t| summary::has_marker(t)).collect();
        assert_eq!(holders.len(), 1, "{texts:#?}");
        let (merged, _) = summary::extract(holders[0]).unwrap();
        // The earlier summary's item and its frame: the item carried on, the frame once.
        assert!(merged.contains("zq17_init"), "{merged}");
        assert!(
            !merged.contains(MARKER) && summary::find_end(&merged).is_none(),
            "{merged}"
        );
        assert_eq!(holders[0].matches(MARKER).count(), 1, "{}", holders[0]);
    }

    #[test]
    fn escalation_cuts_the_turn_in_progress_last_and_keeps_task_and_latest_user() {
        // A huge reply after the latest user message: nothing but cutting it can make room.
        let mut request = session(3, 500);
        let msgs = request["messages"].as_array_mut().unwrap();
        msgs.push(json!({"role": "assistant", "content": "x ".repeat(20_000)}));
        let opts = Options {
            target_tokens: Some(600),
            ..Options::default()
        };
        let outcome = compact(&request, &opts).unwrap();
        let body = outcome.rewritten.unwrap();
        assert!(outcome.report.fits, "{}", outcome.report);
        assert_eq!(
            roles(&body),
            ["system", "user", "assistant", "user", "assistant"],
            "{}",
            outcome.report
        );
        let out = body["messages"].as_array().unwrap();
        assert_eq!(out[1]["content"], "step 0: keep going", "the task stays");
        assert!(out[2]["content"].as_str().unwrap().starts_with(MARKER));
        assert_eq!(out[3]["content"], "finish up");
        let reply = out[4]["content"].as_str().unwrap();
        assert!(reply.starts_with("x x") && reply.contains("omitted by compaction"));
        validate_strict(out).unwrap();
    }

    #[test]
    fn a_turn_that_fits_only_with_less_answer_room_is_kept_whole() {
        // An agent's turn: big instructions, the task, one tool result. The window would
        // keep it all with a smaller answer: nothing of the turn is lost.
        let request = json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "Rules: be careful. ".repeat(1800)},
            {"role": "user", "content": "please use the tool"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\": \"seq 1 120\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "output line, padded with words\n".repeat(400)},
        ]});
        let opts = Options::with_window(count_request(&request) + 2000);
        assert!(!opts.target_for(&request).admits(count_request(&request)));
        let outcome = compact(&request, &opts).unwrap();
        assert!(
            outcome.report.unchanged && outcome.report.fits,
            "{}",
            outcome.report
        );
    }

    #[test]
    fn a_shortened_digest_takes_back_the_room_its_cut_left() {
        // Decisions of about twenty-five tokens each in the middle and tight targets: the
        // digest is shortened, and leaves unused less than two items' worth of room.
        let mut msgs = vec![json!({"role": "user", "content": "Refactor the billing module."})];
        for i in 0..12 {
            msgs.push(json!({"role": "assistant", "content": format!(
                "Decision: we keep ledger_{i} as the source of truth and drop cache layer {i}.")}));
            msgs.push(json!({"role": "user", "content": format!("ok, next {i}")}));
        }
        msgs.push(json!({"role": "assistant", "content": "done"}));
        msgs.push(json!({"role": "user", "content": "finish up"}));
        let request = json!({"model": "gpt-4o", "messages": msgs});
        let mut shortened = 0;
        for target in (120..300).step_by(15) {
            let opts = Options {
                target_tokens: Some(target),
                ..Options::default()
            };
            let report = compact(&request, &opts).unwrap().report;
            if !report.notes.iter().any(|n| n.contains("summary shortened")) {
                continue;
            }
            shortened += 1;
            assert!(report.fits, "{report}");
            // Without the regrowth up to 78 tokens were left unused here.
            assert!(report.tokens_after + 40 > target, "{report}");
        }
        assert!(shortened > 3, "{shortened}");
    }

    #[test]
    fn in_a_small_target_a_dozen_tokens_left_is_worth_another_digest() {
        // aider's session building a pong game (fixtures/transcripts/real, from aider's
        // own chat history) at windows of a few hundred tokens: with forty tokens the
        // least room worth a larger digest, up to 27 of a 307-token target were left
        // unused while the digest gave up what it could not hold.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/transcripts/real/bodies/aider-pong.chat.json"
        );
        let request: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for window in [340, 420, 520, 600, 700] {
            let outcome = compact(&request, &Options::with_window(window)).unwrap();
            let report = &outcome.report;
            let Limit::At(target) = report.target_tokens else {
                panic!("a window gives a target");
            };
            assert!(report.fits, "{report}");
            let unused = target - report.tokens_after;
            assert!(unused <= regrow_min(target), "window {window}: {report}");
        }
    }

    #[test]
    fn what_the_latest_brief_says_again_is_left_out_of_the_digest() {
        // Agents that brief one another restate the whole brief in every prompt, the
        // latest one too, which the request keeps whole. The digest listed the first
        // brief's restatement (hundreds of tokens) while the rule stated once in between
        // had no room.
        let brief = "You are the reviewer of a billing service written in Go. The service \
            sends invoices to the customers of a small shop every month. Every invoice \
            carries the shop's tax number and a due date thirty days out. Review each \
            change line by line and answer in plain English. The team deploys twice a \
            week, on Tuesdays and Thursdays, from the main branch. ";
        let rule = "Never change the rounding in money/round_c4.go, the auditors signed it off.";
        let mut msgs = vec![json!({"role": "system", "content": "You work in a team of agents."})];
        for r in 0..6 {
            let news = if r == 3 {
                rule.to_string()
            } else {
                format!("Phase {r}: look at the change set number {r} and list what it breaks.")
            };
            msgs.push(json!({"role": "user", "content": format!("{brief}{news}")}));
            msgs.push(json!({"role": "assistant", "content": format!(
                "Phase {r} reviewed: the change set compiles and its tests pass. {}",
                "Nothing else to report on it, the diff only moves code around. ".repeat(6))}));
        }
        msgs.push(json!({"role": "user", "content": format!("{brief}Now sum up the review.")}));
        let request = json!({"model": "gpt-4o", "messages": msgs});
        let opts = Options::with_window(900);
        let outcome = compact(&request, &opts).unwrap();
        assert!(outcome.report.fits, "{}", outcome.report);
        let body = outcome.rewritten.unwrap();
        let texts: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect();
        let holder = texts.iter().find(|t| summary::has_marker(t)).unwrap();
        let (digest, _) = summary::extract(holder).unwrap();
        assert!(digest.contains(rule), "{digest}");
        let restated = "Every invoice carries the shop's tax number";
        assert!(!digest.contains(restated), "{digest}");
        assert!(texts.last().unwrap().contains(restated));
    }

    /// The compactions of `request` at `windows` that rewrote it: each window, its target,
    /// the report and the rewritten body as text.
    fn rewrites(
        request: &Value,
        windows: impl IntoIterator<Item = usize>,
    ) -> Vec<(usize, usize, Report, String)> {
        windows
            .into_iter()
            .filter_map(|window| {
                let outcome = compact(request, &Options::with_window(window)).unwrap();
                let Limit::At(target) = outcome.report.target_tokens else {
                    panic!("a window gives a target");
                };
                let text = outcome.rewritten?.to_string();
                Some((window, target, outcome.report, text))
            })
            .collect()
    }

    #[test]
    fn a_summary_of_prose_shortened_to_fit_takes_back_the_room_left() {
        // Decisions in prose (over four characters a token) and a latest user message,
        // never cut, that leaves the summary less room than it takes: the summary
        // shortened to fit was given room back only up to its tokens at three characters
        // each, so a digest of prose never came back whole, and up to 75 tokens stayed
        // unused while a decision of 45 was given up.
        let module = |r: u8| format!("parser_{}{}", char::from(b'a' + r), char::from(b'z' - r));
        let decision = |r: u8| {
            format!(
                "We will keep the existing cache layer and move the slow parsing of part {r} \
                 into {}, because the nightly export depends on the cache and rewriting \
                 that would take much longer than anybody here would like.",
                module(r)
            )
        };
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a careful coding agent."}),
            json!({"role": "user", "content": "Speed up the report generator without changing its output."}),
        ];
        for r in 0..12 {
            msgs.push(json!({"role": "assistant", "content": decision(r)}));
            msgs.push(json!({"role": "user", "content": "Fine, carry on with the next part."}));
        }
        let log: String = (0..20)
            .map(|i| format!("tests/test_report_{i}.py::test_totals PASSED in 0.{i}s\n"))
            .collect();
        msgs.push(json!({"role": "user", "content": format!("Here is the suite's log:\n{log}")}));
        let request = json!({"model": "gpt-4o", "max_tokens": 100, "messages": msgs});
        // A decision's line: its text, the bullet and the line break.
        let one = Counter::for_model("gpt-4o").text(&decision(0)) + 3;
        let mut shortened = 0;
        for (window, target, report, text) in rewrites(&request, (560..=800).step_by(5)) {
            let kept = (0..12).filter(|&r| text.contains(&module(r))).count();
            let cut = report.notes.iter().any(|n| n.contains("summary shortened"));
            if kept == 12 || !cut {
                continue;
            }
            shortened += 1;
            assert!(report.fits, "{report}");
            assert!(
                report.tokens_after + one > target,
                "window {window}: {kept} of 12 decisions kept, a decision is {one} tokens, {report}"
            );
        }
        assert!(shortened > 10, "{shortened}");
    }

    #[test]
    fn a_digest_that_gives_up_facts_leaves_little_of_the_target_unused() {
        // Twenty rounds each failing with an error of its own (the column's name in
        // letters: errors that differ only in their digits are one error said again): at
        // small windows the digest cannot list them all. Written again once, in three
        // characters a token with a part of the room left, it left up to a tenth of the
        // target unused while errors were given up (101 tokens of 782, 6 errors lost).
        let column = |r: u8| format!("column_{}{}", char::from(b'a' + r), char::from(b'z' - r));
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a careful coding agent."}),
            json!({"role": "user", "content": "Make the importer pass its tests."}),
        ];
        for r in 0..20 {
            let id = format!("c{r}");
            msgs.push(
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
                "type": "function", "function": {"name": "bash",
                "arguments": format!("{{\"command\": \"pytest tests/test_part_{r}.py\"}}")}}]}),
            );
            msgs.push(json!({"role": "tool", "tool_call_id": id, "content": format!(
                "collected 3 items\nE   KeyError: '{}' is missing from the header row of the staging export\n1 failed in 0.{r}s",
                column(r))}));
            msgs.push(json!({"role": "assistant", "content": format!("Part {r} still fails.")}));
        }
        msgs.push(json!({"role": "user", "content": "Keep going."}));
        let request = json!({"model": "gpt-4o", "max_tokens": 100, "messages": msgs});
        let mut short = 0;
        for (window, target, report, text) in rewrites(&request, (300..=1400).step_by(50)) {
            let kept = (0..20).filter(|&r| text.contains(&column(r))).count();
            if kept == 20 {
                continue;
            }
            short += 1;
            assert!(report.fits, "{report}");
            assert!(
                report.tokens_after + 2 * REGROW_MIN > target,
                "window {window}: {kept} of 20 errors kept, {report}"
            );
        }
        assert!(short > 3, "{short}");
    }

    #[test]
    fn the_tail_leaves_the_digest_the_room_the_dropped_stretch_needs() {
        // A text agent's session: observations with errors and paths, a user's rule and
        // a choice, then long replies. The tail was chosen beside a tenth of the target for
        // the summary, below the room the digest of the dropped stretch is given: the last
        // reply kept took the difference (at a 1,000-token window 126 were left for a
        // digest given 220), and a digest built last was cut to what remained.
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a careful coding agent."}),
            json!({"role": "user", "content": "Port the billing exporter to the new queue client."}),
            json!({"role": "assistant", "content": "I will use the aioqueue client rather than the old pika wrapper."}),
            json!({"role": "user", "content": "Output: collected 12 items\nE   KeyError: 'queue_url'\nE   TimeoutError: broker did not answer in 30 s\nWrote reports/junit-queue.xml"}),
            json!({"role": "user", "content": "Keep batches under 7500 rows and never edit settings/prod.yaml."}),
            json!({"role": "assistant", "content": "Understood. I'll keep the retry limit at 5 attempts and log to logs/export.log."}),
            json!({"role": "user", "content": "Output: ValueError: batch size 9000 exceeds limit\nsaved dump to /var/tmp/batch-9000.json"}),
        ];
        for part in 0..3 {
            let line = format!(
                "The handler for part {part} reads each message, checks it and hands it on. "
            );
            msgs.push(json!({"role": "assistant", "content": line.repeat(20)}));
            msgs.push(json!({"role": "user", "content": "ok, next part"}));
        }
        *msgs.last_mut().unwrap() = json!({"role": "user", "content": "Go on with the port."});
        let request = json!({"model": "gpt-4o", "max_tokens": 100, "messages": msgs});
        let mut reduced = 0;
        for window in (700..=1100).step_by(50) {
            let opts = Options::with_window(window);
            let plan = plan(&request, &opts).unwrap();
            if !plan.needs_summary() {
                continue;
            }
            reduced += 1;
            let Limit::At(target) = plan.target else {
                panic!("a window gives a target");
            };
            let replaced: usize = plan.turns().iter().map(|m| m.tokens).sum();
            let need = opts.digest_budget(plan.target, replaced, 0).min(target / 4);
            let kept = plan.overhead
                + plan
                    .head()
                    .iter()
                    .chain(plan.tail())
                    .map(|m| m.tokens)
                    .sum::<usize>();
            assert!(
                kept + need <= target,
                "window {window}: {kept} kept, {need} for the digest, target {target}"
            );
            // The latest ask and the turn stay.
            assert_eq!(plan.tail().last().unwrap().text(), "Go on with the port.");
        }
        assert!(reduced > 3, "{reduced}");
    }

    /// The request compacted to each of `targets`, where it fits: the target and the
    /// rewritten body.
    fn fitting_at<'a>(
        request: &'a Value,
        targets: impl Iterator<Item = usize> + 'a,
    ) -> impl Iterator<Item = (usize, Value)> + 'a {
        targets.filter_map(move |target| {
            let opts = Options {
                target_tokens: Some(target),
                ..Options::default()
            };
            let outcome = compact(request, &opts).unwrap();
            let body = outcome.rewritten.filter(|_| outcome.report.fits)?;
            Some((target, body))
        })
    }

    #[test]
    fn user_messages_joined_to_the_task_past_its_statement_give_way_before_a_decision() {
        // An aider session: its command line, the request right after it, then a note the
        // user added before any answer; the decision is in the middle.
        let request_words = "make a flask app with a /hello endpoint";
        let note = format!(
            "For context, {}",
            "the staging box is slow today. ".repeat(6)
        );
        let decision = "Let's go with a per-tenant rate bucket named bucket_ce86, which keeps one noisy tenant from starving the rest.";
        let request = json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": "$ aider app.py\nAdded app.py to the chat"},
            {"role": "user", "content": request_words},
            {"role": "user", "content": note},
            {"role": "assistant", "content": decision},
            {"role": "user", "content": "ok"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "Now add an /add/3/5 endpoint."},
        ]});
        let mut kept = 0;
        for (target, body) in fitting_at(&request, (60..200).step_by(4)) {
            let text = body["messages"].to_string();
            // The request within the task's statement stays with it; the note never
            // outlasts the decision.
            assert!(text.contains(request_words), "{target}: {text}");
            if text.contains(decision) {
                kept += 1;
            } else {
                assert!(!text.contains("staging box"), "{target}: {text}");
            }
        }
        assert!(kept > 0);
    }

    #[test]
    fn the_task_statement_outlasts_every_line_of_the_digest() {
        // A long task, rules and decisions in the middle, a long latest message: at small
        // targets the room is for the task's statement or for a line of the digest.
        let task = format!(
            "Port the importer to the new queue API and keep the old CLI flags working. {}",
            "Some background on how the importer came to be follows here. ".repeat(12)
        );
        let statement: String = task.chars().take(200).collect();
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a careful agent."}),
            json!({"role": "user", "content": task}),
        ];
        for i in 0..4 {
            msgs.push(json!({"role": "assistant", "content": format!(
                "Decision: we keep ledger_{i} as the source of truth and drop cache layer {i}.")}));
            msgs.push(json!({"role": "user", "content": format!(
                "Never modify config/prod_{i}.yaml; the ops team deploys it by hand.")}));
        }
        msgs.push(json!({"role": "assistant", "content": "done"}));
        let latest = "Now run the whole test suite and report what failed. ".repeat(10);
        msgs.push(json!({"role": "user", "content": latest}));
        let request = json!({"model": "gpt-4o", "messages": msgs});
        // The least a request keeping the statement needs: the instructions, the task cut
        // to its statement, the summary's frame alone and the latest message.
        let note = format!(
            "\n[... {} characters omitted by compaction ...]",
            task.len() - statement.len()
        );
        let least = json!({"model": "gpt-4o", "messages": [
            msgs[0],
            {"role": "user", "content": format!("{statement}{note}")},
            {"role": "assistant", "content": summary::wrap("")},
            {"role": "user", "content": latest},
        ]});
        let least = count_request(&least);
        let mut gave_way = 0;
        for target in (least..least + 120).step_by(4) {
            let opts = Options {
                target_tokens: Some(target),
                ..Options::default()
            };
            let outcome = compact(&request, &opts).unwrap();
            let report = &outcome.report;
            assert!(report.fits, "{report}");
            let body = outcome.rewritten.unwrap();
            let text: Vec<&str> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["content"].as_str())
                .collect();
            assert!(text.concat().contains(&statement), "{report}\n{text:#?}");
            gave_way += usize::from(report.notes.iter().any(|n| n.contains("its statement")));
        }
        assert!(gave_way > 0);
    }

    #[test]
    fn the_task_past_its_statement_gives_way_to_a_fact_of_the_summary() {
        // The last cuts keep the task's first sentences (264 characters) while the request
        // fits with the summary at its floor; the summary then regrows into what is left.
        // The task's text past its statement (200 characters) holds no fact: while a
        // decision is missing and cutting that text frees the room of one, it goes.
        let background: String = (0..12)
            .map(|i| format!("Background note n{i}x on how the importer came to be. "))
            .collect();
        let task = format!(
            "Port the importer to the new queue API and keep the old CLI flags working. {background}"
        );
        let statement: String = task.chars().take(200).collect();
        // A note just past the statement, within the first sentences the last cuts keep.
        let past = (0..12)
            .map(|i| format!("n{i}x"))
            .find(|n| {
                task.find(n.as_str())
                    .is_some_and(|at| (200..250).contains(&at))
            })
            .unwrap();
        let mut msgs = vec![
            json!({"role": "system", "content": "You are a careful agent."}),
            json!({"role": "user", "content": task}),
        ];
        for i in 0..12 {
            msgs.push(json!({"role": "assistant", "content": format!(
                "Decision: we keep ledger_{i}.")}));
            msgs.push(json!({"role": "user", "content": "ok"}));
        }
        msgs.push(json!({"role": "assistant", "content": "done"}));
        let latest = "Now run the whole test suite and report what failed. ".repeat(10);
        msgs.push(json!({"role": "user", "content": latest}));
        let request = json!({"model": "gpt-4o", "messages": msgs});
        let decision = |i: usize| format!("- Decision: we keep ledger_{i}.");
        let mut past_kept = 0;
        for (target, body) in fitting_at(&request, (200..460).step_by(2)) {
            let text: Vec<&str> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["content"].as_str())
                .collect();
            let text = text.concat();
            assert!(text.contains(&statement), "{target}: {text}");
            let missing = (0..12).filter(|&i| !text.contains(&decision(i))).count();
            if text.contains(&past) {
                past_kept += 1;
                assert_eq!(missing, 0, "{target}: {text}");
            }
        }
        assert!(past_kept > 0);
    }

    #[test]
    fn an_unreachable_target_is_reported_not_hidden() {
        let request = session(6, 2000);
        let opts = Options {
            target_tokens: Some(5),
            ..Options::default()
        };
        let outcome = compact(&request, &opts).unwrap();
        assert!(!outcome.report.fits);
        assert!(outcome.report.tokens_after < outcome.report.tokens_before);
        assert!(outcome.report.to_string().contains("DOES NOT FIT"));
        assert!(outcome.report.to_string().contains("no form fits"));
    }

    #[test]
    fn bad_requests_are_named() {
        let opts = Options::default();
        assert_eq!(
            compact(&json!([]), &opts).unwrap_err(),
            EngineError::NotAnObject
        );
        assert_eq!(
            compact(&json!({}), &opts).unwrap_err(),
            EngineError::MissingMessages
        );
        assert_eq!(
            compact(&json!({"messages": 1}), &opts).unwrap_err(),
            EngineError::MessagesNotArray
        );
        assert_eq!(
            compact(&json!({"messages": []}), &opts).unwrap_err(),
            EngineError::NoMessages
        );
        assert_eq!(
            compact(
                &json!({"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}),
                &opts
            )
            .unwrap_err(),
            EngineError::MissingRole { index: 1 }
        );
        assert!(matches!(
            compact_bytes(b"{", &opts),
            Err(EngineError::InvalidJson(_))
        ));
    }

    #[test]
    fn reused_counts_give_the_same_result() {
        let request = session(10, 1500);
        let opts = Options {
            target_tokens: Some(600),
            ..Options::default()
        };
        let counts = count_messages(&request);
        let a = finish(
            plan_with_counts(&request, Some(&counts), &opts).unwrap(),
            None,
            &opts,
        );
        let b = compact(&request, &opts).unwrap();
        assert_eq!(a.rewritten, b.rewritten);
        assert_eq!(a.report, b.report);
    }
}
