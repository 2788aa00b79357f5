//! The compaction engine: pure transcript surgery that shrinks a chat-completions request
//! to a token target while keeping what the model needs to continue.
//!
//! Two phases, so that an asynchronous LLM summariser can sit between them outside the
//! engine:
//!
//! ```text
//! let plan = compact::plan(&request, &opts)?;          // passes 1-4
//! let summary = if plan.needs_summary() { Some(/* LLM or */ summarize_deterministic(&plan)) } else { None };
//! let outcome = compact::finish(plan, summary, &opts);  // passes 5-8
//! ```
//!
//! [`compact`] does both with the deterministic summary. Passes, cheapest first, stopping as
//! soon as the request fits: merge same-role runs, strip old media, prune old tool traffic,
//! then head/tail boundaries, summary, assembly, sanitising and bounded escalation.

mod assemble;
mod boundary;
mod calls;
mod escalate;
mod media;
mod merge;
pub mod message;
mod pretoken;
mod prune;
mod sanitize;
pub mod summary;
pub mod tokens;
mod validate;

use serde_json::{Map, Value};

pub use message::{Message, Role};
pub use summary::{Summary, SummarySource, END_MARKER, MARKER};
pub use tokens::{count_messages, count_request, Counter};
pub use validate::{validate, ValidationError};

use assemble::Placement;

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

/// The window assumed when nothing says otherwise.
pub const DEFAULT_CONTEXT_WINDOW: usize = 128_000;

/// Limits and knobs. Defaults suit real models; tests use small windows.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The model's context window in tokens (prompt plus completion).
    pub context_window: usize,
    /// Model whose tokenizer to count with; by default the request's own `model`.
    pub model: Option<String>,
    /// Prompt-token target to reach; by default the window minus the completion budget
    /// and a safety margin.
    pub target_tokens: Option<usize>,
    /// Completion budget assumed when the request sets neither `max_completion_tokens` nor
    /// `max_tokens` (capped at a quarter of the window).
    pub default_output_reserve: usize,
    /// Share of the window, in percent, left free because the upstream's own count of tool
    /// definitions and framing can differ slightly from ours.
    pub safety_margin_percent: usize,
    /// Non-system messages kept verbatim at the start on a first compaction.
    pub protect_first_n: usize,
    /// Share of the target, in percent, the verbatim tail may use.
    pub tail_percent: usize,
    /// The tail keeps at least this many messages.
    pub min_tail_messages: usize,
    /// Tool outputs longer than this many characters are pruned outside the tail.
    pub prune_min_chars: usize,
    /// String values in old tool-call arguments are cut to this many characters.
    pub arg_max_chars: usize,
    /// Upper bound on the summary's size in tokens.
    pub summary_max_tokens: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            context_window: DEFAULT_CONTEXT_WINDOW,
            model: None,
            target_tokens: None,
            default_output_reserve: 4096,
            safety_margin_percent: 2,
            protect_first_n: 2,
            tail_percent: 40,
            min_tail_messages: 3,
            prune_min_chars: 400,
            arg_max_chars: 300,
            summary_max_tokens: 4000,
        }
    }
}

impl Options {
    pub fn with_window(context_window: usize) -> Options {
        Options {
            context_window,
            ..Options::default()
        }
    }

    /// The prompt-token target for this request.
    pub fn target_for(&self, request: &Value) -> usize {
        if let Some(t) = self.target_tokens {
            return t;
        }
        let asked = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| request.get(*k).and_then(Value::as_u64));
        let reserve = match asked {
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None => self.default_output_reserve.min(self.context_window / 4),
        };
        let margin = (self.context_window / 100).saturating_mul(self.safety_margin_percent);
        self.context_window
            .saturating_sub(reserve)
            .saturating_sub(margin)
    }

    fn tail_budget(&self, target: usize) -> usize {
        (target / 100)
            .saturating_mul(self.tail_percent)
            .saturating_add((target % 100).saturating_mul(self.tail_percent) / 100)
    }

    /// Summary budget: a tenth of the target, capped.
    fn summary_budget(&self, target: usize) -> usize {
        (target / 10).min(self.summary_max_tokens).max(64)
    }
}

/// What happened, for logs, response headers and the offline command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub messages_before: usize,
    pub messages_after: usize,
    pub tokens_before: usize,
    pub tokens_after: usize,
    pub target_tokens: usize,
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
pub struct Outcome {
    /// The new request body; `None` when the original should be sent as it is (it already
    /// fit, or nothing could be gained), so a proxy can forward the original bytes.
    pub rewritten: Option<Value>,
    pub report: Report,
}

impl Outcome {
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
    /// The middle must be summarised.
    Summarize,
}

/// The state between the two phases: the conversation after passes 1-3 and the chosen
/// head/tail boundaries.
#[derive(Clone, Debug)]
pub struct Plan {
    stage: Stage,
    /// The request with `messages` emptied (so its key keeps its position).
    envelope: Map<String, Value>,
    counter: Counter,
    overhead: usize,
    target: usize,
    messages_before: usize,
    tokens_before: usize,
    messages: Vec<Message>,
    head_end: usize,
    tail_start: usize,
    /// System/developer messages found in the middle: kept, placed before the summary.
    kept_instructions: Vec<Message>,
    /// The middle without instructions or earlier summaries: what the summary replaces.
    turns: Vec<Message>,
    previous_summary: Option<String>,
    notes: Vec<String>,
}

impl Plan {
    /// Whether `finish` needs a summary (of [`Plan::turns`], carrying
    /// [`Plan::previous_summary`] forward).
    pub fn needs_summary(&self) -> bool {
        self.stage == Stage::Summarize
            && (!self.turns.is_empty() || self.previous_summary.is_some())
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

    /// The messages kept verbatim after the summary.
    pub fn tail(&self) -> &[Message] {
        &self.messages[self.tail_start..]
    }

    pub fn target_tokens(&self) -> usize {
        self.target
    }

    /// How long a summary may be, in tokens.
    pub fn summary_budget_tokens(&self, opts: &Options) -> usize {
        opts.summary_budget(self.target)
    }

    fn total(&self, messages: &[Message]) -> usize {
        messages.iter().map(|m| m.tokens).sum::<usize>() + self.overhead
    }

    fn fits(&self) -> bool {
        self.total(&self.messages) <= self.target
    }
}

/// Parses a request body and compacts it with the deterministic summary.
pub fn compact_bytes(body: &[u8], opts: &Options) -> Result<(Value, Outcome), EngineError> {
    let request: Value =
        serde_json::from_slice(body).map_err(|e| EngineError::InvalidJson(e.to_string()))?;
    let outcome = compact(&request, opts)?;
    Ok((request, outcome))
}

/// Writes the summary of a plan's middle; [`compact_with`] calls it between planning
/// and finishing, only when a summary is needed. A summariser that must wait on the
/// network (an LLM call) drives [`plan`] and [`finish`] itself instead, so the engine
/// stays free of I/O and async.
pub trait Summarizer {
    fn summarize(&self, plan: &Plan, opts: &Options) -> Summary;
}

/// The summary made from the dropped turns themselves, with no model: it cannot fail,
/// which makes it the fallback of every other summariser.
#[derive(Debug, Clone, Copy, Default)]
pub struct Deterministic;

impl Summarizer for Deterministic {
    fn summarize(&self, plan: &Plan, opts: &Options) -> Summary {
        summarize_deterministic(plan, opts)
    }
}

/// Passes 1-8 with the deterministic summary.
pub fn compact(request: &Value, opts: &Options) -> Result<Outcome, EngineError> {
    compact_with(request, None, opts, &Deterministic)
}

/// Passes 1-8 with `summarizer`, reusing per-message counts the caller already has
/// (from [`count_messages`] on the same request).
pub fn compact_with(
    request: &Value,
    counts: Option<&[usize]>,
    opts: &Options,
    summarizer: &dyn Summarizer,
) -> Result<Outcome, EngineError> {
    let plan = plan_with_counts(request, counts, opts)?;
    let summary = plan
        .needs_summary()
        .then(|| summarizer.summarize(&plan, opts));
    Ok(finish(plan, summary, opts))
}

/// The deterministic summary of a plan's middle.
pub fn summarize_deterministic(plan: &Plan, opts: &Options) -> Summary {
    Summary {
        text: summary::digest(
            plan.previous_summary(),
            plan.turns(),
            chars_for(plan.summary_budget_tokens(opts)),
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
        messages_before: raw.len(),
        tokens_before,
        messages: Vec::new(),
        head_end: 0,
        tail_start: 0,
        kept_instructions: Vec::new(),
        turns: Vec::new(),
        previous_summary: None,
        notes: Vec::new(),
    };
    if tokens_before <= target {
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
    let merged = merge::merge_same_role(&mut plan.messages, &counter);
    if merged > 0 {
        plan.notes.push(format!("merge: joined {merged}"));
    }
    plan.stage = Stage::Fits;
    if plan.fits() {
        return;
    }
    let stripped = media::strip_old_media(&mut plan.messages, &counter);
    if stripped > 0 {
        plan.notes.push(format!("media: stripped {stripped}"));
    }
    if plan.fits() {
        return;
    }
    let already_compacted = plan.messages.iter().any(|m| summary::has_marker(&m.text()));
    let first_n = if already_compacted {
        0
    } else {
        opts.protect_first_n
    };
    plan.head_end = boundary::head_end(&plan.messages, first_n);
    plan.tail_start = boundary::tail_start(
        &plan.messages,
        plan.head_end,
        opts.tail_budget(plan.target),
        opts.min_tail_messages,
    );
    let stats = prune::prune(&mut plan.messages, plan.tail_start, opts, &counter);
    if stats.total() > 0 {
        plan.notes.push(format!(
            "prune: {} outputs, {} duplicates, {} arguments",
            stats.summarized, stats.deduplicated, stats.arguments
        ));
    }
    if plan.fits() {
        return;
    }
    plan.stage = Stage::Summarize;
    split_middle(plan);
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

/// Passes 5-8: assemble head + summary + tail, sanitise, validate, escalate if needed.
/// `summary` is used when the plan needs one; an empty or missing one is replaced by the
/// deterministic digest.
pub fn finish(plan: Plan, summary: Option<Summary>, opts: &Options) -> Outcome {
    match plan.stage {
        Stage::Unchanged => unchanged(&plan, true, Vec::new()),
        Stage::Fits => {
            let mut notes = Vec::new();
            let messages = repair(plan.messages.clone(), &plan.counter, &mut notes);
            conclude(&plan, messages, SummarySource::None, notes)
        }
        Stage::Summarize => {
            let summary = match summary {
                Some(s) if !s.text.trim().is_empty() => s,
                _ => summarize_deterministic(&plan, opts),
            };
            let mut notes = vec![format!(
                "summarised {} messages{}",
                plan.turns.len(),
                if plan.previous_summary.is_some() {
                    ", earlier summary carried"
                } else {
                    ""
                }
            )];
            let (messages, more) = escalate::build_fitting(&plan, &summary.text, opts);
            notes.extend(more);
            conclude(&plan, messages, summary.source, notes)
        }
    }
}

/// Builds head + kept instructions + summary + tail and repairs the tool protocol.
fn build(
    plan: &Plan,
    head: &[Message],
    kept: &[Message],
    body: &str,
    tail: &[Message],
    notes: &mut Vec<String>,
) -> Vec<Message> {
    let mut head_part: Vec<Message> = head.to_vec();
    head_part.extend(kept.iter().cloned());
    let latest_user = tail.iter().rposition(|m| m.role == Role::User);
    let (assembled, placement) =
        assemble::assemble(head_part, body, tail.to_vec(), latest_user, &plan.counter);
    match placement {
        Placement::Own(_) => {}
        Placement::MergedIntoNext => notes.push("summary merged into the next message".into()),
        Placement::MergedIntoPrevious => {
            notes.push("summary merged into the previous message".into())
        }
    }
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
    clean
}

fn unchanged(plan: &Plan, fits: bool, notes: Vec<String>) -> Outcome {
    Outcome {
        rewritten: None,
        report: Report {
            messages_before: plan.messages_before,
            messages_after: plan.messages_before,
            tokens_before: plan.tokens_before,
            tokens_after: plan.tokens_before,
            target_tokens: plan.target,
            fits,
            unchanged: true,
            summary: SummarySource::None,
            notes,
        },
    }
}

/// Final checks: the result must validate and must be smaller than the input, otherwise
/// the original goes out unchanged.
fn conclude(
    plan: &Plan,
    messages: Vec<Message>,
    source: SummarySource,
    extra: Vec<String>,
) -> Outcome {
    let mut notes = plan.notes.clone();
    notes.extend(extra);
    let tokens_after = plan.total(&messages);
    if tokens_after >= plan.tokens_before {
        notes.push("no smaller form found".into());
        return unchanged(plan, false, notes);
    }
    let values: Vec<Value> = messages
        .into_iter()
        .map(|m| Value::Object(m.body))
        .collect();
    if let Err(e) = validate(&values) {
        notes.push(format!("result failed validation ({e}); sent unchanged"));
        return unchanged(plan, false, notes);
    }
    let messages_after = values.len();
    let mut body = plan.envelope.clone();
    body.insert("messages".into(), Value::Array(values));
    Outcome {
        rewritten: Some(Value::Object(body)),
        report: Report {
            messages_before: plan.messages_before,
            messages_after,
            tokens_before: plan.tokens_before,
            tokens_after,
            target_tokens: plan.target,
            fits: tokens_after <= plan.target,
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

    #[test]
    fn target_leaves_room_for_the_completion_and_a_margin() {
        let opts = Options::with_window(10_000);
        assert_eq!(
            opts.target_for(&json!({"max_tokens": 1000})),
            10_000 - 1000 - 200
        );
        assert_eq!(
            opts.target_for(&json!({"max_completion_tokens": 500, "max_tokens": 9})),
            9_300
        );
        assert_eq!(opts.target_for(&json!({})), 10_000 - 2500 - 200);
        let fixed = Options {
            target_tokens: Some(42),
            ..opts
        };
        assert_eq!(fixed.target_for(&json!({"max_tokens": 1})), 42);
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
    fn compact_with_asks_the_summarizer_only_when_a_summary_is_needed() {
        struct Canned(std::cell::Cell<usize>);
        impl Summarizer for Canned {
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
    fn escalation_ends_at_instructions_summary_and_latest_user() {
        // A huge reply after the latest user message: no tail can drop it, and even cut to
        // its ends it is over the target.
        let mut request = session(3, 500);
        let msgs = request["messages"].as_array_mut().unwrap();
        msgs.push(json!({"role": "assistant", "content": "x ".repeat(20_000)}));
        let opts = Options {
            target_tokens: Some(160),
            ..Options::default()
        };
        let outcome = compact(&request, &opts).unwrap();
        let body = outcome.rewritten.unwrap();
        assert_eq!(
            roles(&body),
            ["system", "assistant", "user"],
            "{}",
            outcome.report
        );
        assert!(outcome.report.fits, "{}", outcome.report);
        assert!(outcome
            .report
            .notes
            .iter()
            .any(|n| n.contains("last resort")));
        assert_eq!(body["messages"][2]["content"], "finish up");
        assert!(body["messages"][1]["content"]
            .as_str()
            .unwrap()
            .starts_with(MARKER));
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
