//! The LLM summariser's calls: the network half of [`crate::summarize`]. It asks a model for the checkpoint of a plan's middle (in chunks
//! when the middle exceeds the summariser's window), streaming the answer so a long
//! checkpoint does not trip an idle timeout, and checks it. Any failure falls back: the
//! configured model, then the request's own model, then `None`, which makes the engine use
//! its deterministic summary. A model that failed is left alone for `cooldown_ms`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, StatusCode, Uri};
use http_body_util::BodyExt;
use serde_json::Value;

use super::{
    check_answer, chunk_input_limit, chunk_turns, focus_topic, summary_budget, AnswerProblem,
    AnswerStream, SummaryRequest,
};
use crate::body;
use crate::compact::{self, Counter, Message, Options, Plan, Summary, SummarySource};
use crate::config::Config;
use crate::error::{BoxError, ProxyError};
use crate::metrics::Metrics;
use crate::upstream::{Upstream, UpstreamInitError};
use crate::wire::{responses, Dialect};

/// Client headers that must not travel with the summariser's call: its body is new (its
/// own length and type), its answer is read by the proxy (no compression asked for), and
/// an idempotency key would make the upstream replay the client's own answer.
const DROPPED_HEADERS: [&str; 5] = [
    "content-length",
    "content-type",
    "content-encoding",
    "accept-encoding",
    "idempotency-key",
];

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
    /// Its context window in tokens; `u64::MAX` when unknown.
    pub window: u64,
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
    /// The most tokens the summary may take: what is left of the target beside what is
    /// kept (asking for more would pay for text that is thrown away).
    pub budget_cap: usize,
    /// The window of the request, for the summary's share of it.
    pub context_window: usize,
}

impl<'a> Middle<'a> {
    /// The middle of an engine plan.
    pub fn of_plan(plan: &'a Plan, opts: &Options) -> Middle<'a> {
        Middle {
            turns: plan.turns(),
            previous: plan.previous_summary(),
            after: plan.tail(),
            budget_cap: plan.summary_budget_tokens(opts),
            context_window: opts.context_window,
        }
    }
}

/// Why one summariser call gave nothing usable. Messages never quote the conversation.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Send(#[from] ProxyError),
    #[error("the summariser answered {0}")]
    Status(StatusCode),
    #[error("the summariser's stream broke: {0}")]
    Stream(BoxError),
    #[error("the summariser reported an error in its stream")]
    InBand,
    #[error("the summariser's answer was empty")]
    Empty,
    #[error("the summariser refused")]
    Refused,
}

impl From<AnswerProblem> for Failure {
    fn from(problem: AnswerProblem) -> Self {
        match problem {
            AnswerProblem::Empty => Failure::Empty,
            AnswerProblem::Refusal(_) => Failure::Refused,
        }
    }
}

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
        metrics: &Metrics,
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
            match self.checkpoint(metrics, call, model, middle).await {
                Ok(text) => {
                    return Some(Summary {
                        text,
                        source: SummarySource::Llm,
                    })
                }
                Err(failure) => {
                    tracing::warn!(
                        id = call.id,
                        model,
                        error = %failure,
                        "summariser failed; falling back"
                    );
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
    /// summariser's window, each updating the checkpoint the one before wrote.
    async fn checkpoint(
        &self,
        metrics: &Metrics,
        call: &Call<'_>,
        model: &str,
        middle: &Middle<'_>,
    ) -> Result<String, Failure> {
        let window = self.window.unwrap_or_else(|| request_window(call.window));
        let counter = Counter::for_model(model);
        let content = middle.turns.iter().map(|m| m.tokens).sum::<usize>()
            + middle.previous.map_or(0, |p| counter.text(p));
        let budget =
            summary_budget(content, window.min(middle.context_window)).min(middle.budget_cap);
        let focus = focus_topic(middle.after);
        let limit = chunk_input_limit(window, budget, &counter);
        let date = today();
        let mut summary = middle.previous.map(str::to_owned);
        for range in chunk_turns(middle.turns, window, budget, &counter) {
            let body = SummaryRequest::new(model, &middle.turns[range], budget, counter)
                .previous_summary(summary.as_deref())
                .focus(focus.as_deref())
                .date(Some(&date))
                .input_limit(limit)
                .body();
            let body = match call.dialect {
                Dialect::Chat => body,
                Dialect::Responses => responses::summary_request(&body),
            };
            let result = self.send(call, &body).await;
            metrics.summarizer_call(result.is_ok());
            summary = Some(result?);
        }
        summary.ok_or(Failure::Empty)
    }

    /// One summariser call: the client's path and end-to-end headers with a new body;
    /// the streamed answer collected and checked.
    async fn send(&self, call: &Call<'_>, body: &Value) -> Result<String, Failure> {
        let headers = summary_headers(&call.parts.headers);
        let bytes = Bytes::from(body.to_string());
        let response = self
            .upstream
            .send(Method::POST, &call.uri(), &headers, body::full(bytes))
            .await?;
        if !response.status().is_success() {
            return Err(Failure::Status(response.status()));
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
        Ok(check_answer(&answer.text)?)
    }
}

/// The client's headers for the summariser's call (see [`DROPPED_HEADERS`]).
fn summary_headers(client: &HeaderMap) -> HeaderMap {
    let mut headers = client.clone();
    for name in DROPPED_HEADERS {
        headers.remove(name);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static("text/event-stream"),
    );
    headers
}

/// The request's window as the summariser's, with the engine's default when unknown.
fn request_window(window: u64) -> usize {
    match window {
        u64::MAX => compact::DEFAULT_CONTEXT_WINDOW,
        w => usize::try_from(w).unwrap_or(usize::MAX),
    }
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

    #[test]
    fn dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
    }

    #[test]
    fn summariser_headers_keep_credentials_and_drop_the_bodys() {
        let mut client = HeaderMap::new();
        client.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        client.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        client.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        client.insert("idempotency-key", HeaderValue::from_static("x"));
        let headers = summary_headers(&client);
        assert_eq!(headers[header::AUTHORIZATION], "Bearer k");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        assert!(!headers.contains_key(header::CONTENT_LENGTH));
        assert!(!headers.contains_key(header::ACCEPT_ENCODING));
        assert!(!headers.contains_key("idempotency-key"));
    }
}
