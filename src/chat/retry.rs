//! The one loop that owns a chat request's upstream attempts: predict an overflow and
//! compact before the first call (preflight), send, and on an answer compaction can fix
//! (context overflow, output cap, body too large) learn from it, rewrite and retry, up to
//! `compaction.max_attempts` calls. The client gets the first answer that is not such a
//! refusal, or the upstream's own last refusal.
//!
//! A conversation compacted before starts from its checkpoint (see [`crate::checkpoint`]):
//! the stored compacted prefix replaces the client's, and only new turns are counted.

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use memchr::memmem::Finder;
use serde_json::Value;

use crate::app::App;
use crate::body::{self, ProxyBody};
use crate::chat::inspect::{self, Verdict};
use crate::chat::request::ChatHead;
use crate::chat::summarizer::Call;
use crate::chat::x_compaction::{Outcome, XCompaction};
use crate::checkpoint::{self, Applied, Checkpoint, Key, Partition};
use crate::classify::{Classification, Kind};
use crate::compact::{self, budget};
use crate::error::ProxyError;
use crate::metrics::{SummarySource, Trigger};
use crate::wire::Dialect;

/// Share of the window left free on a retry, for the difference between our token
/// count and the upstream's that calibration has not yet learned.
const RETRY_MARGIN: f64 = 0.05;
/// Without any window to aim at, each retry aims at this share of the last prompt.
const BLIND_SHRINK: f64 = 0.6;
/// Each further retry tightens the target by this factor.
const ESCALATION: f64 = 0.8;
/// Upper bound on the tokens an image part can cost, for the cheap "surely fits" test.
const MAX_IMAGE_TOKENS: u64 = 1_600;
/// Bodies above this size are parsed and counted on a thread that may block.
const LARGE_BODY: usize = 256 * 1024;
/// Built once: building a searcher costs more than running it on a small body.
static IMAGE_URL: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("image_url"));

pub async fn run(
    app: &App,
    parts: Parts,
    original: Bytes,
    head: ChatHead,
    dialect: Dialect,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut attempt = Attempts::new(app, &parts, original, head, dialect, id);
    attempt.preflight().await;
    loop {
        attempt.count += 1;
        app.metrics.upstream_attempt();
        let response = app
            .upstream
            .send(
                parts.method.clone(),
                &parts.uri,
                &parts.headers,
                body::full(attempt.body.clone()),
            )
            .await?;
        let verdict = inspect::inspect(
            response,
            attempt.head.stream,
            app.config.first_event_timeout(),
        )
        .await?;
        match verdict {
            Verdict::Deliver(response) => return Ok(attempt.deliver(response)),
            Verdict::Refused { parts, body, class } => {
                if attempt.count >= app.config.compaction.max_attempts
                    || !attempt.recover(&class).await
                {
                    return Ok(attempt.fail(inspect::deliver_refused(parts, body)));
                }
            }
        }
    }
}

/// The state of one chat request across its attempts.
struct Attempts<'a> {
    app: &'a App,
    /// The client's method, path and headers, which a summariser call reuses.
    parts: &'a Parts,
    /// The request id, for log lines.
    id: u64,
    head: ChatHead,
    /// The client's bytes, sent as they are until a rewrite is needed.
    original: Bytes,
    /// The request compaction starts from (the client's, with a lowered output cap if
    /// one was needed), parsed only once a rewrite is considered.
    parsed: Option<Value>,
    /// What the next attempt sends.
    body: Bytes,
    /// Upstream calls made.
    count: u32,
    /// Compactions done so far, to tighten each retry.
    rewrites: u32,
    trigger: Option<Trigger>,
    /// The engine accepted the request (whether or not it could shrink it): a refusal
    /// returned after that is a compaction that failed, not an untouched request.
    tried: bool,
    report: Option<compact::Report>,
    /// Our token count of the original request, once counted.
    tokens_original: Option<u64>,
    /// Whether the LLM summariser may still be asked: when a summarised compaction saved
    /// under a tenth, the middle is small beside what is kept, and another paid summary
    /// of it would not save more; further attempts escalate with the deterministic one.
    llm: bool,
    /// Per-message counts of the request compaction starts from, kept so the engine does
    /// not count the same messages again.
    counts: Option<Vec<usize>>,
    /// The conversation's partition in the summary cache, once `resume` computed it.
    partition: Option<Partition>,
    /// The hash of every prefix of the client's messages, once computed.
    hashes: Option<Vec<u128>>,
    /// The checkpoint applied before the first attempt.
    hit: Option<Hit>,
    /// The checkpoint this request's compaction made, stored once the upstream takes it.
    pending: Option<Pending>,
    /// The API the client speaks, and for the Responses API its request as parsed, which
    /// the compacted view is written back into.
    dialect: Dialect,
    source: Option<Value>,
    /// The completion cap as the client asked it and as lowered to fit the window.
    output: Option<(u64, u64)>,
    /// `parsed` holds a change (a lowered completion cap) that the body does not have yet.
    unsent: bool,
}

/// What a compaction aims at: prompt tokens by our count, the most it may keep when the
/// answer's room is cut to its minimum, and the window (the upstream's tokens).
#[derive(Clone, Copy, Debug)]
struct Goal {
    target: u64,
    ceiling: u64,
    window: u64,
}

/// A stored checkpoint put in place of the client's prefix.
struct Hit {
    key: Key,
    checkpoint: Arc<Checkpoint>,
    applied: Applied,
    /// The client's request, for the header and the metrics.
    messages_before: usize,
    tokens_before: u64,
}

struct Pending {
    key: Key,
    checkpoint: Checkpoint,
    replaces: Option<Key>,
}

impl<'a> Attempts<'a> {
    fn new(
        app: &'a App,
        parts: &'a Parts,
        original: Bytes,
        head: ChatHead,
        dialect: Dialect,
        id: u64,
    ) -> Self {
        Self {
            app,
            parts,
            id,
            head,
            body: original.clone(),
            original,
            parsed: None,
            count: 0,
            rewrites: 0,
            trigger: None,
            tried: false,
            report: None,
            tokens_original: None,
            llm: true,
            counts: None,
            partition: None,
            hashes: None,
            hit: None,
            pending: None,
            output: None,
            unsent: false,
            dialect,
            source: None,
        }
    }

    /// The conversation's partition in the summary cache: the one `resume` found, or
    /// computed now (`resume` skips it while the cache is empty).
    fn partition(&self) -> Partition {
        self.partition.unwrap_or_else(|| self.partition_now())
    }

    fn partition_now(&self) -> Partition {
        Partition::new(&self.parts.headers, self.upstream(), &self.head.model)
    }

    fn upstream(&self) -> &str {
        self.app.upstream.base_url()
    }

    fn window(&self) -> Option<u64> {
        self.app
            .models
            .window_for(self.upstream(), &self.head.model)
            .map(|w| w.tokens)
    }

    /// Completion tokens to leave room for: what the request asked for, else the
    /// configured reserve, and never more than a quarter of the window. A huge
    /// `max_tokens` is an output-cap problem that lowering it fixes losslessly (after the
    /// upstream says so); it must not make the proxy cut the conversation to make room.
    fn output_budget(&self, window: u64) -> u64 {
        let reserve = self.app.config.compaction.output_reserve_tokens;
        budget::reserve(self.head.max_output, reserve, window)
    }

    /// The most prompt tokens (the upstream's) a request may carry when the answer's room
    /// is cut to its minimum to keep the turn in progress whole.
    fn ceiling(&self, usable: f64, window: u64) -> f64 {
        let least = self.output_budget(window).min(budget::MIN_OUTPUT_ROOM);
        (usable - least as f64).max(0.0)
    }

    /// Lowers the completion cap of the request compaction starts from when prompt plus
    /// cap would overflow the window: the lossless fix, made before the upstream refuses.
    fn fit_output(&mut self, window: u64, prompt: u64) {
        // Checked on the head first: most requests need no parsing for it.
        if budget::cap_fits(window, prompt, self.head.max_output) {
            return;
        }
        let Some(request) = self.base_request_mut() else {
            return;
        };
        if let Some((before, after)) = budget::fit_output(request, window, prompt) {
            self.lowered(before, after);
            self.unsent = true;
        }
    }

    fn lowered(&mut self, before: u64, after: u64) {
        let first = self.output.map_or(before, |(first, _)| first);
        self.output = Some((first, after));
        self.head.max_output = Some(after);
        self.tried = true;
    }

    /// Puts the conversation's checkpoint, when the cache holds one for a prefix of its
    /// messages, in place of that prefix: a conversation compacted before is sent
    /// compacted the same way from the first attempt, byte for byte, without a summary.
    /// Costs nothing for tenants whose conversations were never compacted.
    fn resume(&mut self) {
        let app = self.app;
        let Some(cache) = &app.checkpoints else {
            return;
        };
        // An empty store is the usual case; it spares every request the credential's
        // SHA-256.
        if cache.store.held().0 == 0 {
            return;
        }
        let partition = self.partition_now();
        self.partition = Some(partition);
        if !cache.store.may_hold(partition) {
            return;
        }
        let Some(messages) = self.base_request().and_then(messages_of) else {
            return;
        };
        let hashes = checkpoint::prefix_hashes(partition, messages);
        let found = cache
            .store
            .longest(partition, &hashes)
            .filter(|(len, checkpoint)| checkpoint.continues(messages.get(*len)));
        let key = found.as_ref().map(|(len, _)| Key {
            partition,
            prefix: hashes[*len],
        });
        self.hashes = Some(hashes);
        let (Some((len, checkpoint)), Some(key)) = (found, key) else {
            return;
        };
        let Some(request) = self.parsed.as_mut() else {
            return;
        };
        let counter = compact::Counter::for_request(request);
        let overhead = counter.request_overhead(request);
        let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) else {
            return;
        };
        let messages_before = messages.len();
        let form_len = checkpoint.messages.len();
        messages.splice(..len, checkpoint.messages.iter().cloned());
        let later = counter.messages(&messages[form_len..]);
        let later_tokens = later.iter().sum::<usize>();
        let mut counts = checkpoint.counts.clone();
        counts.extend(later);
        self.tokens_original = Some((counts.iter().sum::<usize>() + overhead) as u64);
        self.counts = Some(counts);
        if !checkpoint.worth_summarising() {
            self.llm = false;
        }
        self.hit = Some(Hit {
            key,
            tokens_before: (checkpoint.prefix_tokens + later_tokens + overhead) as u64,
            applied: Applied {
                form_len,
                prefix_len: len,
            },
            checkpoint,
            messages_before,
        });
        self.tried = true;
        self.trigger = Some(Trigger::Preflight);
    }

    /// A resumed conversation that needed no further compaction is sent as resumed, and
    /// a lowered completion cap is sent too.
    fn settle(&mut self) {
        if (self.hit.is_none() && !self.unsent) || self.rewrites > 0 {
            return;
        }
        self.unsent = false;
        if self.trigger.is_none() {
            self.trigger = Some(Trigger::Preflight);
        }
        match self.parsed.as_ref().and_then(|v| self.encode(v)) {
            Some(bytes) => self.body = bytes,
            // Not reachable for a request parsed from JSON; sending the client's own bytes
            // is the safe way out.
            _ => {
                self.hit = None;
                self.parsed = None;
                self.counts = None;
                self.tokens_original = None;
                self.tried = false;
                self.trigger = None;
                self.output = None;
            }
        }
    }

    /// Before the first call: resumes the conversation from its checkpoint, and compacts
    /// when the model's window is known and the request would fill more than the
    /// threshold of it.
    async fn preflight(&mut self) {
        // Parsing, hashing and counting a large body takes milliseconds: off the threads
        // that move other requests' bytes.
        let goal = if self.original.len() > LARGE_BODY {
            tokio::task::block_in_place(|| self.decide())
        } else {
            self.decide()
        };
        if let Some(goal) = goal {
            if self.rewrite(goal).await {
                self.trigger = Some(Trigger::Preflight);
            }
        }
        self.settle();
    }

    /// Resumes from a checkpoint, then the compaction goal if the request needs
    /// compacting before it is sent; one that needs none but asks for more completion
    /// tokens than the window leaves gets its cap lowered. Costs a byte-length comparison
    /// for the many requests that are obviously small, and one token count for the rest.
    fn decide(&mut self) -> Option<Goal> {
        self.resume();
        let window = self.window()?;
        let factor = self.app.models.factor(self.upstream(), &self.head.model);
        let limit = (window as f64 * self.app.config.compaction.threshold) as u64;
        let budget = self.output_budget(window);
        // A token is at least one byte of JSON, so the body's length bounds the prompt
        // from above, except for image parts whose cost is fixed and may exceed their
        // URL's length.
        let images = IMAGE_URL.find_iter(&self.original).count() as u64;
        let bound =
            ((self.original.len() as u64 + images * MAX_IMAGE_TOKENS) as f64 * factor) as u64;
        let asked = self.head.max_output;
        if self.hit.is_none() && bound + budget <= limit && budget::cap_fits(window, bound, asked) {
            return None;
        }
        let tokens = self.count_original()?;
        let prompt = (tokens as f64 * factor) as u64;
        if prompt + budget <= limit {
            self.fit_output(window, prompt);
            return None;
        }
        Some(Goal {
            target: ((limit.saturating_sub(budget)) as f64 / factor) as u64,
            ceiling: (self.ceiling(window as f64 - budget::margin(window) as f64, window) / factor)
                as u64,
            window,
        })
    }

    /// Learns what the refusal says and prepares the next attempt. `false` when there
    /// is nothing more to try.
    async fn recover(&mut self, class: &Classification) -> bool {
        self.learn(class);
        let changed = match class.kind {
            Kind::OutputCap => self.lower_output_cap(class) || self.shrink(class).await,
            Kind::ContextOverflow => {
                let (rewrites, cap) = (self.rewrites, self.head.max_output);
                let shrunk = self.shrink(class).await;
                // Nothing of the conversation could go: only the completion cap can make
                // room, by an amount the upstream did not say; halve it at least.
                let halved = self.rewrites == rewrites && self.halve_output_cap(cap);
                shrunk || halved
            }
            Kind::BodyTooLarge => self.shrink(class).await,
            Kind::Other => false,
        };
        if changed && self.trigger.is_none() {
            self.trigger = Some(Trigger::Error);
        }
        changed
    }

    /// Remembers the window the upstream reported and how its token count compares with
    /// ours, so the next request for this model is right the first time.
    fn learn(&mut self, class: &Classification) {
        let numbers = &class.numbers;
        let (upstream, model) = (self.upstream().to_owned(), self.head.model.clone());
        if let Some(window) = numbers.context_window {
            self.app.models.learn(&upstream, &model, window);
        } else if class.kind == Kind::ContextOverflow {
            // No numbers: the window is below what was just refused, prompt and requested
            // completion together (many upstreams count both; counting the prompt alone
            // could set the window far too small when the completion was the excess). A
            // 413 says nothing about tokens: its bytes may be images that cost few.
            if let Some(sent) = self.count_sent() {
                let factor = self.app.models.factor(&upstream, &model);
                let asked = self.head.max_output.unwrap_or(0) as f64;
                let bound = ((sent as f64 * factor + asked) * (1.0 - RETRY_MARGIN)) as u64;
                self.app.models.learn_at_most(&upstream, &model, bound);
            }
        }
        // Only a full count of the request as sent is comparable with ours.
        if let (Some(theirs), false) = (numbers.prompt_tokens, numbers.prompt_is_lower_bound) {
            if let Some(ours) = self.count_sent() {
                self.app.models.calibrate(&upstream, &model, ours, theirs);
            }
        }
    }

    /// The lossless fix for "prompt fits, prompt plus max_tokens does not": ask for fewer
    /// completion tokens, when the upstream said enough to know how many fit.
    fn lower_output_cap(&mut self, class: &Classification) -> bool {
        let numbers = &class.numbers;
        let (Some(field), Some(asked)) = (self.head.max_output_field, self.head.max_output) else {
            return false;
        };
        let room = match (
            numbers.completion_limit,
            numbers.context_window,
            numbers.prompt_tokens,
        ) {
            (Some(cap), _, _) if cap < asked => cap,
            (_, Some(window), Some(prompt)) if prompt < window => {
                budget::output_room(window, prompt)
            }
            _ => return false,
        };
        if room < budget::MIN_USEFUL_OUTPUT || room >= asked {
            return false;
        }
        self.set_output_cap(field, asked, room)
    }

    /// Sends the last request again with completion cap `cap` in place of `asked`.
    fn set_output_cap(&mut self, field: &str, asked: u64, cap: u64) -> bool {
        let Some(bytes) = self.dialect.with_output_cap(&self.body, field, cap) else {
            return false;
        };
        self.body = Bytes::from(bytes);
        self.lowered(asked, cap);
        // Later compactions start from the client's request with the lower cap too.
        if let Some(request) = self.parsed.as_mut().and_then(Value::as_object_mut) {
            request.insert(field.into(), Value::from(cap));
        }
        true
    }

    /// The last resort for an overflow with no numbers that compaction could not shrink
    /// further: the upstream counts more than we do, or counts the completion cap, so ask
    /// for half the completion tokens `before` asked for (never below a useful answer).
    fn halve_output_cap(&mut self, before: Option<u64>) -> bool {
        let (Some(field), Some(asked), Some(before)) =
            (self.head.max_output_field, self.head.max_output, before)
        else {
            return false;
        };
        let half = before / 2;
        if half < budget::MIN_USEFUL_OUTPUT || half >= asked {
            return false;
        }
        self.set_output_cap(field, asked, half)
    }

    /// Compacts to a tighter target than the last attempt's. A body too large is about
    /// bytes, not the window: it shrinks from what was sent, whatever the window.
    async fn shrink(&mut self, class: &Classification) -> bool {
        let window = class.numbers.context_window.or_else(|| self.window());
        let factor = self.app.models.factor(self.upstream(), &self.head.model);
        let tightening = ESCALATION.powi(self.rewrites as i32);
        let blind = match self.count_sent() {
            Some(sent) => (sent as f64 * BLIND_SHRINK * tightening) as u64,
            None if window.is_none() => return false,
            None => u64::MAX,
        };
        let goal = match window {
            Some(window) => {
                let budget = self.output_budget(window) as f64;
                let usable = window as f64 * (1.0 - RETRY_MARGIN);
                let target = ((usable - budget).max(0.0) / factor * tightening) as u64;
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

    /// Runs the engine on the client's original request towards `goal`, then lowers the
    /// completion cap if prompt plus cap would still overflow the window (the engine may
    /// have kept the turn in progress by taking room from the answer). `false` when there
    /// is nothing new to send.
    async fn rewrite(&mut self, goal: Goal) -> bool {
        let Some(outcome) = self.compact(goal).await else {
            return false;
        };
        self.tried = true;
        let report = outcome.report;
        if report.summary != compact::SummarySource::None
            && checkpoint::poor_savings_after(0, report.tokens_before, report.tokens_after) > 0
        {
            self.llm = false;
        }
        let compacted = outcome.rewritten.is_some();
        let Some(mut request) = outcome.rewritten.or_else(|| self.parsed.clone()) else {
            return false;
        };
        if goal.window != u64::MAX {
            let factor = self.app.models.factor(self.upstream(), &self.head.model);
            let prompt = (report.tokens_after as f64 * factor) as u64;
            if let Some((before, after)) = budget::fit_output(&mut request, goal.window, prompt) {
                self.lowered(before, after);
            }
        }
        let Some(bytes) = self.encode(&request) else {
            return false;
        };
        if bytes[..] == self.body[..] {
            return false;
        }
        if !compacted {
            // Only the completion cap changed: the next compaction starts from it.
            self.body = bytes;
            self.parsed = Some(request);
            return true;
        }
        self.pending = self.checkpoint_of(&request, &report);
        self.rewrites += 1;
        self.body = bytes;
        self.tokens_original = Some(report.tokens_before as u64);
        self.report = Some(report);
        true
    }

    /// The checkpoint `output` makes for the client's conversation: the form that now
    /// stands for a prefix of the client's messages.
    fn checkpoint_of(&mut self, output: &Value, report: &compact::Report) -> Option<Pending> {
        self.app.checkpoints.as_ref()?;
        let partition = self.partition();
        if self.hashes.is_none() {
            // Not resumed: the request compacted holds the client's own messages.
            let messages = self.parsed.as_ref().and_then(messages_of)?;
            self.hashes = Some(checkpoint::prefix_hashes(partition, messages));
        }
        self.count_original()?;
        let input = self.parsed.as_ref().and_then(messages_of)?;
        let counts = self.counts.as_deref()?;
        let hashes = self.hashes.as_deref()?;
        let applied = self.hit.as_ref().map(|h| h.applied);
        let (replaced, form) = checkpoint::derive(input, messages_of(output)?, applied)?;
        let (prefix_len, form_len, earlier_tokens) = match &self.hit {
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
        let form_counts = compact::Counter::for_request(output).messages(&form);
        let poor_savings = checkpoint::poor_savings_after(
            self.hit.as_ref().map_or(0, |h| h.checkpoint.poor_savings),
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
            ),
            replaces: self.hit.as_ref().map(|h| h.key),
        })
    }

    /// Plans, asks the LLM summariser for the middle when the plan needs a summary, and
    /// finishes. `None` when the engine refused the request.
    async fn compact(&mut self, goal: Goal) -> Option<compact::Outcome> {
        self.base_request()?;
        // Moved into the blocking task and back rather than cloned: for a conversation of
        // a million tokens a clone costs as much as the compaction.
        let request = self.parsed.take()?;
        let tokens = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let options = compact::Options {
            context_window: tokens(goal.window),
            target_tokens: Some(tokens(goal.target)),
            ceiling_tokens: Some(tokens(goal.ceiling.max(goal.target))),
            ..compact::Options::default()
        };
        let window = goal.window;
        let counts = self.counts.take();
        let started = Instant::now();
        // Compaction is CPU work measured in milliseconds for huge conversations: keep
        // it off the threads that move other requests' bytes.
        let (request, counts, options, plan) = tokio::task::spawn_blocking(move || {
            let plan = compact::plan_with_counts(&request, counts.as_deref(), &options);
            (request, counts, options, plan)
        })
        .await
        .ok()?;
        self.parsed = Some(request);
        self.counts = counts;
        // The summariser's call is network time, not engine work: it is left out.
        let planning = started.elapsed();
        let plan = plan
            .inspect_err(|_| self.app.metrics.compaction_time(planning))
            .ok()?;
        let summary = self.llm_summary(&plan, &options, window).await;
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || compact::finish(plan, summary, &options))
            .await
            .ok()?;
        self.app
            .metrics
            .compaction_time(planning + started.elapsed());
        Some(outcome)
    }

    /// The LLM's summary of the plan's middle, when it needs one and the summariser may
    /// be asked; `None` leaves the engine to its deterministic summary.
    async fn llm_summary(
        &self,
        plan: &compact::Plan,
        options: &compact::Options,
        window: u64,
    ) -> Option<compact::Summary> {
        let summarizer = self.app.summarizer.as_ref()?;
        if !self.llm || !plan.needs_summary() {
            return None;
        }
        let call = Call {
            parts: self.parts,
            model: &self.head.model,
            window,
            id: self.id,
            dialect: self.dialect,
        };
        let work = || summarizer.summarize(&self.app.metrics, &call, plan, options);
        match &self.app.checkpoints {
            // Concurrent requests of one conversation wait for one call.
            Some(cache) => {
                let key = checkpoint::hash::middle_key(
                    self.partition(),
                    plan.previous_summary(),
                    plan.turns(),
                );
                cache.flights.run(key, work).await
            }
            None => work().await,
        }
    }

    /// The request compaction starts from, parsed once: the client's, with a lowered
    /// output cap if one was needed.
    fn base_request(&mut self) -> Option<&Value> {
        self.base_request_mut().map(|v| &*v)
    }

    fn base_request_mut(&mut self) -> Option<&mut Value> {
        if self.parsed.is_none() {
            let (view, source) = self.dialect.view(&self.original)?;
            self.parsed = Some(view);
            self.source = source;
        }
        self.parsed.as_mut()
    }

    /// The bytes to send for `view`, in the client's dialect.
    fn encode(&self, view: &Value) -> Option<Bytes> {
        self.dialect
            .encode(view, self.source.as_ref())
            .map(Bytes::from)
    }

    fn count_original(&mut self) -> Option<u64> {
        if self.tokens_original.is_none() {
            let value = self.base_request()?;
            let counts = compact::count_messages(value);
            let overhead = compact::Counter::for_request(value).request_overhead(value);
            self.tokens_original = Some((counts.iter().sum::<usize>() + overhead) as u64);
            self.counts = Some(counts);
        }
        self.tokens_original
    }

    /// Our token count of what the last attempt sent.
    fn count_sent(&mut self) -> Option<u64> {
        match &self.report {
            Some(report) => Some(report.tokens_after as u64),
            None => self.count_original(),
        }
    }

    fn x_compaction(&self, outcome: Outcome) -> Option<XCompaction> {
        let trigger = self.trigger?;
        let report = self.report.as_ref();
        let hit = self.hit.as_ref();
        // A resumed request is measured from the client's own; one compacted again after
        // that says where its summary came from, one sent as resumed says `cache`.
        let summary = match (report, hit) {
            // Compacted again without a new summary: the stored one is what it carries.
            (Some(r), Some(_)) if r.summary == compact::SummarySource::None => {
                Some(SummarySource::Cache)
            }
            (Some(r), _) => summary_source(r.summary),
            (None, Some(_)) => Some(SummarySource::Cache),
            (None, None) => None,
        };
        // Without a compaction the messages went as they were (resumed, or with only the
        // completion cap lowered).
        let sent_messages = || {
            self.parsed
                .as_ref()
                .and_then(messages_of)
                .map_or(0, Vec::len)
        };
        let sent_tokens = self.tokens_original.unwrap_or(0);
        Some(XCompaction {
            outcome,
            trigger,
            attempts: self.count,
            messages_before: hit.map_or_else(
                || report.map_or_else(sent_messages, |r| r.messages_before),
                |h| h.messages_before,
            ),
            messages_after: report.map_or_else(sent_messages, |r| r.messages_after),
            summary,
            tokens_before: hit.map_or(
                report.map_or(sent_tokens, |r| r.tokens_before as u64),
                |h| h.tokens_before,
            ),
            tokens_after: report.map_or(sent_tokens, |r| r.tokens_after as u64),
            output: self.output,
        })
    }

    /// The successful answer, marked when the request was rewritten. The upstream took
    /// the compacted request: its checkpoint can serve the conversation's next turns.
    fn deliver(&mut self, mut response: Response<ProxyBody>) -> Response<ProxyBody> {
        if let (Some(cache), Some(pending)) = (&self.app.checkpoints, self.pending.take()) {
            cache
                .store
                .put(pending.key, Arc::new(pending.checkpoint), pending.replaces);
        }
        if let Some(x) = self.x_compaction(Outcome::Applied) {
            self.record(&x);
            response.headers_mut().insert("x-compaction", x.to_header());
        }
        response
    }

    /// The upstream's own last refusal, marked as a compaction that did not succeed
    /// when the engine had a go at it.
    fn fail(&self, mut response: Response<ProxyBody>) -> Response<ProxyBody> {
        if !self.tried {
            return response;
        }
        let x = self.x_compaction(Outcome::Failed).unwrap_or(XCompaction {
            outcome: Outcome::Failed,
            trigger: Trigger::Error,
            attempts: self.count,
            messages_before: 0,
            messages_after: 0,
            summary: None,
            tokens_before: 0,
            tokens_after: 0,
            output: self.output,
        });
        self.record(&x);
        response.headers_mut().insert("x-compaction", x.to_header());
        response
    }

    fn record(&self, x: &XCompaction) {
        let metrics = &self.app.metrics;
        if self.report.is_some() || self.hit.is_some() || self.output.is_some() {
            metrics.compaction(x.trigger);
            metrics.compaction_of_api(self.dialect.api());
            if let Some(source) = x.summary {
                metrics.summary(source);
            }
            metrics.tokens_saved(x.tokens_before.saturating_sub(x.tokens_after));
        }
        if self.output.is_some() {
            metrics.output_lowered(x.trigger);
        }
        let passes = self.report.as_ref().map(|r| r.notes.join("; "));
        tracing::info!(
            id = self.id,
            outcome = ?x.outcome,
            api = self.dialect.api().as_str(),
            trigger = x.trigger.as_str(),
            attempts = x.attempts,
            messages_before = x.messages_before,
            messages_after = x.messages_after,
            tokens_before = x.tokens_before,
            tokens_after = x.tokens_after,
            summary = x.summary.map_or("none", SummarySource::as_str),
            passes = passes.as_deref().unwrap_or(""),
            output = ?self.output,
            window = ?self.window(),
            "compaction"
        );
    }
}

fn messages_of(request: &Value) -> Option<&Vec<Value>> {
    request.get("messages").and_then(Value::as_array)
}

fn summary_source(source: compact::SummarySource) -> Option<SummarySource> {
    match source {
        compact::SummarySource::Llm => Some(SummarySource::Llm),
        compact::SummarySource::Fallback => Some(SummarySource::Fallback),
        compact::SummarySource::Cache => Some(SummarySource::Cache),
        compact::SummarySource::None => None,
    }
}
