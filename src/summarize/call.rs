//! The LLM summariser's calls: the network half of [`crate::summarize`]. It asks a model for the checkpoint of a plan's middle (in chunks
//! when the middle exceeds the summariser's window), streaming the answer so a long
//! checkpoint does not trip an idle timeout, and checks it. Any failure falls back: the
//! configured model, then the request's own model, then `None`, which makes the engine use
//! its deterministic summary. A model that failed is left alone for `cooldown_ms`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header;
use http::request::Parts;
use http::{Method, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::Value;

use super::chunk::{Chunks, TooLong, MIN_INPUT};
use super::{
    check_answer, focus, min_tokens, summary_budget, summary_floor, AnswerProblem, AnswerStream,
    ChunkRoom, ClientFocus, Expect, SummaryRequest,
};
use crate::body;
use crate::cause::{BoxError, Chain};
use crate::classify::{self, Kind};
use crate::config::Config;
use crate::dialect::{messages, responses, Dialect};
use crate::engine::{Counter, Message, Options, Plan, Summary, SummarySource};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::units::{Limit, Window, DEFAULT_WINDOW};
use crate::upstream::{own_body_headers, Upstream, UpstreamInitError};
use crate::windows::{Count, ModelWindows};

pub struct Summarizer {
    upstream: Upstream,
    /// The configured model; empty: the request's own.
    model: String,
    /// The summariser's input window; `None`: the request's.
    window: Option<usize>,
    cooldown: Duration,
    /// When each model's cooldown ends. The summariser has one upstream per process, so
    /// the model names the upstream+model pair.
    cooling: Mutex<HashMap<String, Instant>>,
}

/// The client's request a summary is made for.
pub struct Call<'a> {
    /// Its method, path and headers (whose credentials pay for the summary by default).
    pub parts: &'a Parts,
    pub model: &'a str,
    /// Its context window, when known.
    pub window: Option<Window>,
    /// The request id, for log lines.
    pub id: u64,
    /// The API the client speaks, which its summariser calls speak too.
    pub dialect: Dialect,
}

impl Call<'_> {
    /// Where the summariser's calls go: the client's own path, except that a request to
    /// `/responses/compact` is summarised by the Responses endpoint beside it.
    fn uri(&self) -> Uri {
        let uri = &self.parts.uri;
        let Some(base) = uri.path().strip_suffix("/compact") else {
            return uri.clone();
        };
        let path_and_query = match uri.query() {
            Some(query) => format!("{base}?{query}"),
            None => base.to_owned(),
        };
        let mut parts = uri.clone().into_parts();
        match path_and_query.parse() {
            Ok(pq) => parts.path_and_query = Some(pq),
            Err(_) => return uri.clone(),
        }
        Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
    }
}

/// What a summary is asked of.
pub struct Middle<'a> {
    /// The messages it replaces, in order.
    pub turns: &'a [Message],
    /// The summary those messages continue, carried forward.
    pub previous: Option<&'a str>,
    /// What comes after them, where the focus is read from.
    pub after: &'a [Message],
    /// The most tokens the summary may take above the floor ([`super::summary_floor`]):
    /// what is left of the target beside what is kept; none when the summary stands for a
    /// whole history and nothing is kept beside it.
    pub budget_cap: Limit,
    /// The window of the request, for the summary's share of it; `None`: not known, and
    /// the summariser's own window bounds the share alone.
    pub context_window: Option<Window>,
}

impl<'a> Middle<'a> {
    /// The middle of an engine plan.
    pub fn of_plan(plan: &'a Plan, opts: &Options) -> Middle<'a> {
        Middle {
            turns: plan.turns(),
            previous: plan.previous_summary(),
            after: plan.tail(),
            budget_cap: Limit::At(plan.summary_budget_tokens(opts)),
            context_window: opts.context_window,
        }
    }

    /// The summary's budget in a summariser window of `window` tokens, beside a previous
    /// summary of `previous` tokens. What is left of the target beside what the plan keeps
    /// bounds it, but never below the floor a model can write a checkpoint in: a
    /// preparation aims below its event's fill, and in a 30k window that left 64 tokens
    /// for 15k of turns (issue 40). A longer summary than the plan made room for folds the
    /// oldest kept turns into it, where the request is over its target.
    fn budget(&self, window: usize, previous: usize) -> usize {
        let content = self.turns.iter().map(|m| m.tokens).sum::<usize>() + previous;
        let share_of = self
            .context_window
            .map_or(window, |w| window.min(w.usize()));
        self.budget_cap
            .clamp(summary_budget(content, share_of))
            .max(summary_floor(share_of))
    }
}

/// Why one summariser call gave nothing usable. Messages never quote the conversation.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Send(#[from] ProxyError),
    #[error("the summariser answered {0}")]
    Status(StatusCode),
    #[error("the summariser answered {0}: the request was too long")]
    TooLong(StatusCode, TooLong),
    #[error("the summariser's stream broke: {0}")]
    Stream(BoxError),
    #[error("the summariser reported an error in its stream")]
    InBand,
    #[error("answer rejected: {0}")]
    Rejected(#[from] AnswerProblem),
    /// No call was made: the prompt alone would not leave room for the turns.
    #[error("a window of {0} tokens cannot hold the summariser's prompt and any turns")]
    NoRoom(usize),
}

/// The most of a refused summariser call's body read to learn from it.
const ERROR_BODY_MAX: usize = 64 * 1024;
/// Attempts at cutting a chunk's turns until its counted body fits the room.
const FIT_ROUNDS: usize = 4;
/// Calls of one model for one middle asked again after a refusal as too long: one, in the
/// room the refusal shows; a second refusal means the upstream's count is not what we
/// can learn it to be, and the next model or the digest takes over.
const TOO_LONG_RETRIES: usize = 1;

impl Summarizer {
    /// The summariser `config` describes; `None` when it is disabled.
    pub fn new(config: &Config) -> Result<Option<Self>, UpstreamInitError> {
        let settings = &config.summarizer;
        if !settings.enabled {
            return Ok(None);
        }
        Ok(Some(Self {
            upstream: Upstream::summarizer(config)?,
            model: settings.model.clone(),
            window: settings
                .context_window
                .map(|w| usize::try_from(w).unwrap_or(usize::MAX)),
            cooldown: settings.cooldown(),
            cooling: Mutex::new(HashMap::new()),
        }))
    }

    /// An LLM-written summary of `middle`, or `None` when every model in the fallback
    /// chain failed or is cooling down (the engine then uses its own digest).
    pub async fn summarize(
        &self,
        ledger: Ledger<'_>,
        call: &Call<'_>,
        middle: &Middle<'_>,
    ) -> Option<Summary> {
        // Only an earlier summary to carry: the deterministic digest carries it as it is.
        if middle.turns.is_empty() {
            return None;
        }
        for model in self.chain(call.model) {
            if self.cooling_down(model) {
                continue;
            }
            match self.checkpoint(ledger, call, model, middle).await {
                Ok(text) => {
                    return Some(Summary {
                        text,
                        source: SummarySource::Llm,
                    })
                }
                Err(failure) => {
                    match &failure {
                        // Each rejected answer was logged (and counted) as it came:
                        // this line says what became of the whole.
                        Failure::Rejected(problem) => tracing::warn!(
                            id = call.id,
                            model,
                            reason = problem.reason().label(),
                            error = %failure,
                            "no summary accepted from the summariser; falling back"
                        ),
                        _ => tracing::warn!(
                            id = call.id,
                            model,
                            error = %Chain(&failure),
                            "summariser failed; falling back"
                        ),
                    }
                    self.start_cooldown(model);
                }
            }
        }
        None
    }

    /// Whether a call for `request_model` would be tried now: some model of its fallback
    /// chain is not cooling down after a failure.
    pub fn ready(&self, request_model: &str) -> bool {
        self.chain(request_model).any(|m| !self.cooling_down(m))
    }

    /// The models to try, in order: the configured one, then the request's.
    fn chain<'m>(&'m self, request_model: &'m str) -> impl Iterator<Item = &'m str> {
        let configured =
            (!self.model.is_empty() && self.model != request_model).then_some(self.model.as_str());
        configured.into_iter().chain(std::iter::once(request_model))
    }

    fn cooling_down(&self, model: &str) -> bool {
        let mut cooling = self.cooling.lock().unwrap_or_else(PoisonError::into_inner);
        match cooling.get(model) {
            Some(until) if Instant::now() < *until => true,
            Some(_) => {
                cooling.remove(model);
                false
            }
            None => false,
        }
    }

    fn start_cooldown(&self, model: &str) {
        let now = Instant::now();
        let mut cooling = self.cooling.lock().unwrap_or_else(PoisonError::into_inner);
        // Model names come from clients: forget the cooldowns that are over, so the map
        // holds only the models that failed within the last `cooldown_ms`.
        cooling.retain(|_, until| *until > now);
        cooling.insert(model.to_owned(), now + self.cooldown);
    }

    /// The checkpoint of `middle` written by `model`: one call per chunk that fits the
    /// summariser's window, each updating the checkpoint the one before wrote. A rejected
    /// answer is never carried into the next chunk: that chunk's turns are digested
    /// instead ([`Progress`]), as are those of a chunk the checkpoint so far leaves no
    /// room for, and the next chunk updates the checkpoint with the digest beside it: one
    /// bad answer costs one chunk's prose, not the work of the chunks before it. Two
    /// failures in a row end the calls (a model writing junk keeps writing it): what is
    /// left is digested. No chunk accepted is a failure, and the next model or the
    /// engine's digest takes over.
    async fn checkpoint(
        &self,
        ledger: Ledger<'_>,
        call: &Call<'_>,
        model: &str,
        middle: &Middle<'_>,
    ) -> Result<String, Failure> {
        let window = self.window_for(ledger.windows, call, model);
        let counter = Counter::for_model(model);
        let room = ChunkRoom::new(window, ledger.windows.factor(self.base_url(), model));
        let previous = middle.previous.map_or(0, |p| counter.text(p));
        let budget = middle.budget(window, previous);
        let Some(mut chunks) = Chunks::plan(room, middle.turns, 0, previous, budget, &counter)
        else {
            ledger.metrics.summarizer_skipped();
            return Err(Failure::NoRoom(window));
        };
        let focus = focus(call.parts.extensions.get::<ClientFocus>(), middle.after);
        let date = today();
        let mut progress = Progress::new(middle.previous);
        let mut retries = TOO_LONG_RETRIES;
        while let Some(range) = chunks.ranges.pop_front() {
            let turns = &middle.turns[range.clone()];
            if progress.failed_in_a_row >= MAX_FAILED_IN_A_ROW {
                progress.digest(turns, budget);
                continue;
            }
            let replaced: usize = turns.iter().map(|m| m.tokens).sum();
            let so_far = progress.so_far();
            let request = SummaryRequest::new(model, turns, budget, counter)
                .prompt(chunks.prompt)
                .previous_summary(so_far.as_deref())
                .focus(focus.as_deref())
                .date(Some(&date))
                .input_limit(chunks.limit);
            let Some((request, body, tokens)) = fit(request, &chunks.room, &counter) else {
                // The checkpoint so far leaves this chunk too little room: it is
                // digested, like a chunk whose answer was rejected.
                ledger.metrics.summarizer_skipped();
                progress.failed(Failure::NoRoom(window), turns, budget);
                continue;
            };
            let cap = request.answer_cap();
            let instructions = request.instructions();
            let expect = Expect {
                instructions: &instructions,
                min_tokens: min_tokens(replaced, budget),
                counter: &counter,
            };
            let body = match call.dialect {
                Dialect::Responses => responses::summary_request(&body),
                Dialect::Messages => messages::summary_request(&body),
                Dialect::Chat => body,
            };
            let sent = Sent {
                model,
                tokens,
                window: chunks.room.window(),
                cap,
                expect: &expect,
            };
            match self.send(ledger, call, &body, &sent).await {
                Ok(text) => {
                    ledger.metrics.summarizer_call(true);
                    progress.accept(text);
                }
                Err(Failure::Rejected(problem)) => {
                    ledger.metrics.summarizer_rejected(problem.reason());
                    tracing::warn!(
                        id = call.id,
                        model,
                        reason = problem.reason().label(),
                        error = %problem,
                        "summariser answer rejected; its turns are digested"
                    );
                    progress.failed(Failure::Rejected(problem), turns, budget);
                }
                // Our count is an estimate: the upstream's refusal corrects it, and this
                // chunk and the ones after it are asked again in the room it shows, rather
                // than the whole middle falling back to the digest.
                Err(Failure::TooLong(status, refusal)) if retries > 0 => {
                    retries -= 1;
                    ledger.metrics.summarizer_call(false);
                    let room = chunks.room.after_refusal(refusal, tokens, cap);
                    tracing::warn!(
                        id = call.id,
                        model,
                        status = status.as_u16(),
                        tokens,
                        "summariser request refused as too long; asking again in smaller chunks"
                    );
                    let carried = so_far.as_deref().map_or(0, |s| counter.text(s));
                    let rest = range.start;
                    match Chunks::plan(room, middle.turns, rest, carried, budget, &counter) {
                        Some(smaller) => chunks = smaller,
                        None => {
                            ledger.metrics.summarizer_skipped();
                            let left = &middle.turns[rest..];
                            progress.failed(Failure::NoRoom(window), left, budget);
                            break;
                        }
                    }
                }
                Err(failure) => {
                    ledger.metrics.summarizer_call(false);
                    return Err(failure);
                }
            }
        }
        progress.finish()
    }

    fn base_url(&self) -> &str {
        self.upstream.base_url()
    }

    /// One summariser call: the client's path and end-to-end headers with a new body;
    /// the streamed answer collected and checked. The upstream's count of the prompt, in
    /// its answer or its refusal, is learned for the next call.
    async fn send(
        &self,
        ledger: Ledger<'_>,
        call: &Call<'_>,
        body: &Value,
        sent: &Sent<'_>,
    ) -> Result<String, Failure> {
        let mut headers = call.parts.headers.clone();
        own_body_headers(&mut headers);
        let bytes = Bytes::from(body.to_string());
        let response = self
            .upstream
            .send(Method::POST, &call.uri(), &headers, body::full(bytes))
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(
                match self
                    .learn_from_refusal(ledger.windows, sent, response)
                    .await
                {
                    Some(too_long) => Failure::TooLong(status, too_long),
                    None => Failure::Status(status),
                },
            );
        }
        let mut stream = AnswerStream::new();
        let mut body = response.into_body();
        // The upstream's idle timeout (`summarizer.timeout_ms`) bounds each wait here.
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame.map_err(Failure::Stream)?.data_ref() {
                stream.feed(data);
            }
            if stream.is_done() {
                break;
            }
        }
        let answer = stream.finish();
        if answer.error.is_some() {
            return Err(Failure::InBand);
        }
        if let Some(theirs) = answer.prompt_tokens {
            let ours = sent.tokens as u64;
            ledger
                .windows
                .calibrate(self.base_url(), sent.model, Count::Usage, ours, theirs);
        }
        Ok(check_answer(&answer, sent.expect)?)
    }

    /// The window `model`'s calls must fit: the summariser's own, else the request's, but
    /// never past what its upstream and model are known to hold (configured, learned from
    /// an earlier refusal of its calls, built in): a smaller summariser model, or one whose
    /// refusal taught its window, would be refused again at every event.
    fn window_for(&self, windows: &ModelWindows, call: &Call<'_>, model: &str) -> usize {
        self.window.unwrap_or_else(|| {
            let request = call.window.unwrap_or(DEFAULT_WINDOW).usize();
            windows
                .window_for(self.base_url(), model)
                .map_or(request, |own| request.min(own.window.usize()))
        })
    }

    /// Reads what a refused call says of the upstream's count and of the window, so the
    /// next call to this model fits; returns what it said when it refused the call as too
    /// long. The window is learned only by a summariser without a
    /// window of its own: its calls are then sized by the request's window, bounded by
    /// what its own upstream and model are known to hold, this window among it. One with
    /// its own window never reads a learned one, and what its refusal named would shrink
    /// only the window the client's requests to that upstream and model are compacted
    /// against.
    async fn learn_from_refusal(
        &self,
        models: &ModelWindows,
        sent: &Sent<'_>,
        response: http::Response<crate::body::ProxyBody>,
    ) -> Option<TooLong> {
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                bytes.extend_from_slice(data);
            }
            if bytes.len() >= ERROR_BODY_MAX {
                break;
            }
        }
        let class = classify::classify(status, content_type.as_deref(), &bytes);
        // A call's answer cap is sized with its prompt to fit the window, so a refusal of
        // the two together that names the window ("you requested 6289 tokens (5559 in the
        // messages, 730 in the completion)", OpenAI's wording whenever a cap is set) says
        // the prompt counted more than we thought, as an overflow does. One that names no
        // window (a cap over the model's own) is not fixed by smaller chunks.
        let too_long = match class.kind {
            Kind::ContextOverflow => true,
            Kind::OutputCap => class.numbers.context_window.is_some(),
            _ => false,
        };
        if !too_long {
            return None;
        }
        let numbers = &class.numbers;
        if let Some(window) = numbers.context_window.filter(|_| self.window.is_none()) {
            models.learn(self.base_url(), sent.model, window);
        }
        if let Some(theirs) = numbers
            .prompt_tokens
            .filter(|_| !numbers.prompt_is_lower_bound)
        {
            models.calibrate(
                self.base_url(),
                sent.model,
                Count::Refusal,
                sent.tokens as u64,
                theirs,
            );
        }
        // A refusal that names no number (OpenAI's Responses API) still says the upstream
        // counted more of the prompt than the window left it beside the answer's cap: a
        // lower bound on its count, which the next event's first call is sized by (asked
        // again smaller now, that call would otherwise be refused at every event).
        if numbers.context_window.is_none() && numbers.prompt_tokens.is_none() {
            let least = sent.window.saturating_sub(sent.cap) as u64;
            models.raise(
                self.base_url(),
                sent.model,
                Count::Refusal,
                sent.tokens as u64,
                least,
            );
        }
        let tokens = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Some(TooLong {
            window: numbers.context_window.map(tokens),
            prompt: numbers.prompt_tokens.map(tokens),
        })
    }
}

/// Where a summariser call's counts and lessons go: the metrics it counts in, and the
/// windows and calibration it reads and teaches.
#[derive(Clone, Copy)]
pub struct Ledger<'a> {
    pub metrics: &'a Metrics,
    pub windows: &'a ModelWindows,
}

/// One call as sent: the model, its prompt by our count, and what its answer must be.
struct Sent<'a> {
    model: &'a str,
    tokens: usize,
    /// The window the call was sized to, in the upstream's tokens, and its answer cap.
    window: usize,
    cap: usize,
    expect: &'a Expect<'a>,
}

/// Chunks in a row without a usable answer after which a model is asked no more for
/// this middle.
const MAX_FAILED_IN_A_ROW: usize = 2;
/// Characters per token of the summary's budget, as the engine sizes its digest.
const CHARS_PER_TOKEN: usize = 3;

/// A middle's summary as its chunks go by: the checkpoint the model wrote, and beside it
/// the digest of the chunks that got no usable answer since. The checkpoint stays whole,
/// in its template, so the next update is still checked against every fact of it; the
/// next accepted update stands for both (it was given both to fold in).
struct Progress {
    checkpoint: Option<String>,
    digested: Option<String>,
    accepted: bool,
    failed_in_a_row: usize,
    last_failure: Failure,
}

impl Progress {
    fn new(previous: Option<&str>) -> Progress {
        Progress {
            checkpoint: previous.map(str::to_owned),
            digested: None,
            accepted: false,
            failed_in_a_row: 0,
            last_failure: Failure::Rejected(AnswerProblem::Empty),
        }
    }

    /// The summary so far: the checkpoint, then the digest of what came after it.
    fn so_far(&self) -> Option<String> {
        match (&self.checkpoint, &self.digested) {
            (Some(c), Some(d)) => Some(format!("{}\n\n{d}", c.trim_end())),
            (c, d) => c.clone().or_else(|| d.clone()),
        }
    }

    fn accept(&mut self, text: String) {
        self.checkpoint = Some(text);
        self.digested = None;
        self.accepted = true;
        self.failed_in_a_row = 0;
    }

    /// A chunk that got no usable answer: its turns are digested.
    fn failed(&mut self, failure: Failure, turns: &[Message], budget: usize) {
        self.failed_in_a_row += 1;
        self.last_failure = failure;
        self.digest(turns, budget);
    }

    /// `turns` added to the digest beside the checkpoint (merged item by item with the
    /// chunks digested before them), in half the summary's room: the checkpoint takes the
    /// rest.
    fn digest(&mut self, turns: &[Message], budget: usize) {
        let room = budget.saturating_mul(CHARS_PER_TOKEN) / 2;
        self.digested = Some(crate::engine::digest::digest(
            self.digested.as_deref(),
            turns,
            room,
        ));
    }

    /// The summary, when any chunk's answer was accepted; else why the last one failed.
    fn finish(self) -> Result<String, Failure> {
        if !self.accepted {
            return Err(self.last_failure);
        }
        self.so_far().ok_or(Failure::Rejected(AnswerProblem::Empty))
    }
}

/// The request with its turns cut until its body, counted, fits the room beside its
/// answer; with the body and its count. A reasoning model's room for thinking is what the
/// window then leaves. `None` when even the fewest useful turns do not fit.
fn fit<'a>(
    mut request: SummaryRequest<'a>,
    room: &ChunkRoom,
    counter: &Counter,
) -> Option<(SummaryRequest<'a>, Value, usize)> {
    for _ in 0..FIT_ROUNDS {
        let body = request.body();
        let tokens = counter.request(&body);
        let most = room.prompt_limit(request.max_tokens());
        if tokens <= most {
            let spare = room
                .answer_limit(tokens)
                .saturating_sub(request.max_tokens());
            let request = request.reasoning_room(spare);
            let body = request.with_its_cap(body);
            return Some((request, body, tokens));
        }
        // Cut by the excess and a quarter more, for the notes the cuts add.
        let over = tokens - most;
        // A request not limited yet starts from its whole body, which holds the turns.
        let current = match request.limit() {
            Limit::At(turns) => turns,
            Limit::Unbounded => tokens,
        };
        let limit = current.checked_sub(over + over / 4)?;
        if limit < MIN_INPUT {
            return None;
        }
        request = request.input_limit(limit);
    }
    None
}

/// Today's UTC date as `YYYY-MM-DD`, for dating completed actions in the checkpoint.
fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`), to avoid a date library for one line of the prompt.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarize::tests::msg;
    use serde_json::json;

    #[test]
    fn a_request_with_no_input_limit_yet_is_cut_to_its_room() {
        // Each output is shown cut to its ends already; sixty of them still overflow.
        let big: Vec<Message> = (0..60)
            .map(|i| msg(json!({"role": "user", "content": format!("step {i}: {}", "lorem ipsum ".repeat(60))})))
            .collect();
        let counter = Counter::for_model("gpt-4o");
        let room = ChunkRoom::new(8_000, 1.0);
        let request = SummaryRequest::new("m", &big, 300, counter);
        assert_eq!(request.limit(), Limit::Unbounded);
        let (request, _, tokens) = fit(request, &room, &counter).expect("cut to fit");
        assert!(
            tokens <= room.prompt_limit(request.max_tokens()),
            "{tokens}"
        );
        assert!(matches!(request.limit(), Limit::At(_)));
    }

    #[test]
    fn a_reasoning_model_s_cap_takes_only_the_room_its_prompt_leaves() {
        let turns: Vec<Message> = (0..40)
            .map(|i| msg(json!({"role": "user", "content": format!("step {i}: {}", "lorem ipsum ".repeat(60))})))
            .collect();
        let counter = Counter::for_model("gpt-5");
        for (window, factor) in [(16_000, 1.0), (16_000, 1.3), (12_000, 1.1)] {
            let room = ChunkRoom::new(window, factor);
            let request = SummaryRequest::new("gpt-5", &turns, 2_000, counter);
            let (request, body, tokens) = fit(request, &room, &counter).expect("fits");
            let cap = body["max_completion_tokens"].as_u64().unwrap() as usize;
            assert_eq!(cap, request.answer_cap());
            assert!(cap >= request.max_tokens(), "{window}: cap {cap}");
            let upstream_prompt = (tokens as f64 * factor).ceil() as usize;
            assert!(
                upstream_prompt + cap <= window,
                "{window} x{factor}: prompt {upstream_prompt} + cap {cap}"
            );
        }
        // With room to spare, the whole headroom is asked for.
        let room = ChunkRoom::new(400_000, 1.0);
        let request = SummaryRequest::new("gpt-5", &turns, 2_000, counter);
        let (request, body, _) = fit(request, &room, &counter).expect("fits");
        assert_eq!(body["max_completion_tokens"], request.max_tokens() + 8192);
    }

    #[test]
    fn dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
    }
}
