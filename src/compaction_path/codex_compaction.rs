//! Codex's remote compaction requests: `POST .../responses/compact`, and a Responses
//! request whose last input item is a `compaction_trigger`. An upstream that implements
//! them (OpenAI) gets them untouched; for one that does not (it answers 404, 405 or 501
//! for the endpoint, 400 or 422 for the item) the proxy answers them itself: it summarises
//! the input with its summariser (the deterministic digest when no model answers) and
//! returns one `compaction` item holding the summary, which later requests carry back and
//! [`crate::dialect::codex_items::expand`] turns into text. Once an upstream has shown it
//! lacks them, later requests are answered without asking it again.
//!
//! `compaction.remote_compaction` sets who answers: `auto` (as above), `proxy` (always
//! the proxy) or `upstream` (always the upstream, whatever it answers).

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use super::inspect::read_to_end;
use super::report::{Outcome, XCompaction};
use super::{read_body, send, Trigger};
use crate::app::App;
use crate::body::{self, ProxyBody, Replay};
use crate::checkpoint;
use crate::classify::{self, Kind};
use crate::config::RemoteCompaction;
use crate::dialect::{codex_items as items, responses, Dialect};
use crate::engine::{self, summary, Counter, Message, SummarySource};
use crate::error::ProxyError;
use crate::limits::ClientBody;
use crate::summarize::{summary_budget, Call, Middle};

/// How much of a refusal is read to tell an overflow from a missing feature.
const MAX_REFUSAL: usize = 64 * 1024;

/// The two ways Codex asks for a compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `POST .../responses/compact`, answered with a `response.compaction` object.
    Endpoint,
    /// A Responses request ending in `compaction_trigger`, answered with a Response
    /// (streamed when asked) whose one output item is the compaction.
    Trigger,
}

impl Ask {
    /// Whether `status` says the upstream does not know this kind of request.
    fn unsupported(self, status: StatusCode) -> bool {
        match self {
            Ask::Endpoint => matches!(status.as_u16(), 404 | 405 | 501),
            Ask::Trigger => matches!(status.as_u16(), 400 | 404 | 422),
        }
    }
}

/// `POST .../responses/compact`.
pub async fn handle_endpoint(
    app: &App,
    request: Request<ClientBody<Incoming>>,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, incoming) = request.into_parts();
    let body = read_body(incoming, &parts.headers, app.config.limits.max_body_bytes).await?;
    let body = items::expand(&body).map_or(body, Bytes::from);
    handle(app, &parts, body, Ask::Endpoint, id).await
}

/// Either request, its body read (and the proxy's earlier items expanded).
pub(super) async fn handle(
    app: &App,
    parts: &Parts,
    body: Bytes,
    ask: Ask,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mode = app.config.compaction.remote_compaction;
    let known_missing = app.remote_compaction_missing.load(Ordering::Relaxed);
    let mut attempts = 0;
    if mode == RemoteCompaction::Upstream || (mode == RemoteCompaction::Auto && !known_missing) {
        attempts = 1;
        let response = send(app, parts, body.clone()).await?;
        if mode == RemoteCompaction::Upstream || !ask.unsupported(response.status()) {
            return Ok(response);
        }
        let status = response.status();
        let (head, mut rest) = response.into_parts();
        let (refusal, complete) = read_to_end(&mut rest, Bytes::new(), MAX_REFUSAL).await?;
        // A refusal too long to judge is no sign of a missing feature: the client gets it
        // as the upstream sent it.
        if !complete {
            let replay = Replay::new(refusal, rest).boxed_unsync();
            return Ok(Response::from_parts(head, replay));
        }
        let content_type = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let class = classify::classify(status.as_u16(), content_type, &refusal);
        // An overflow says the history was too long, not that compaction is missing: it
        // is answered here this time, and the upstream asked again next time.
        if class.kind != Kind::ContextOverflow {
            app.remote_compaction_missing.store(true, Ordering::Relaxed);
            tracing::info!(
                id,
                status = status.as_u16(),
                "the upstream lacks remote compaction; the proxy answers it from now on"
            );
        }
        let emulated = emulate(app, parts, &body, ask, id, attempts).await;
        return Ok(emulated.unwrap_or_else(|| Response::from_parts(head, body::full(refusal))));
    }
    match emulate(app, parts, &body, ask, id, attempts).await {
        Some(response) => Ok(response),
        // Not a request the proxy can read: the upstream is the judge of it.
        None => send(app, parts, body).await,
    }
}

/// The proxy's own answer, or `None` for a body it cannot read as a Responses request.
async fn emulate(
    app: &App,
    parts: &Parts,
    body: &[u8],
    ask: Ask,
    id: u64,
    attempts: u32,
) -> Option<Response<ProxyBody>> {
    let request: Value = serde_json::from_slice(body).ok()?;
    let model = request.get("model").and_then(Value::as_str).unwrap_or("");
    let stream = ask == Ask::Trigger && request.get("stream") == Some(&Value::Bool(true));
    let mut input = match request.get("input")? {
        Value::Array(items) => items.clone(),
        text @ Value::String(_) => vec![serde_json::json!({"role": "user", "content": text})],
        _ => return None,
    };
    if ask == Ask::Trigger {
        input.pop();
    }
    let history = History::read(model, &input)?;
    let window = app
        .models
        .window_for(app.upstream.base_url(), model)
        .map(|w| w.tokens);
    let (text, source) = history.summarise(app, parts, model, window, id).await;
    let counter = Counter::for_model(model);
    let tokens = counter.text(&text) as u64;

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let suffix = format!("{:x}{id:x}", now.as_nanos());
    let item = items::item(&format!("cmp_{suffix}"), &text);
    let (id_resp, created_at) = (format!("resp_{suffix}"), now.as_secs());
    let (answer, content_type, after) = match ask {
        Ask::Endpoint => {
            let object = items::compacted(&id_resp, created_at, &input, item, tokens);
            let after = object["output"].as_array().map_or(1, Vec::len);
            (object.to_string(), "application/json", after)
        }
        Ask::Trigger if stream => (
            items::response_events(&id_resp, created_at, &request, item, tokens),
            "text/event-stream",
            1,
        ),
        Ask::Trigger => (
            items::response(&id_resp, created_at, &request, item, tokens).to_string(),
            "application/json",
            1,
        ),
    };
    let x = XCompaction {
        outcome: Outcome::Applied,
        trigger: Trigger::Client,
        attempts,
        messages_before: input.len(),
        messages_after: after,
        summary: source,
        tokens_before: history.tokens,
        tokens_after: tokens,
        output: None,
    };
    let metrics = &app.metrics;
    metrics.compaction(Trigger::Client);
    metrics.compaction_of_api(Dialect::Responses);
    metrics.summary(source);
    metrics.tokens_saved(history.tokens.saturating_sub(tokens));
    tracing::info!(
        id,
        outcome = ?x.outcome,
        api = Dialect::Responses.as_str(),
        trigger = x.trigger.as_str(),
        attempts,
        messages_before = x.messages_before,
        messages_after = x.messages_after,
        tokens_before = x.tokens_before,
        tokens_after = x.tokens_after,
        summary = source.as_str(),
        ask = ?ask,
        "compaction"
    );
    let mut response = Response::new(body::full(answer));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("x-compaction", x.to_header());
    Some(response)
}

/// The history a compaction is asked of, as the engine's messages: the instructions
/// (kept by the client, not summarised), the summary of an earlier compaction, and the
/// turns since.
struct History {
    turns: Vec<Message>,
    previous: Option<String>,
    /// Our count of the turns and the earlier summary.
    tokens: u64,
}

impl History {
    fn read(model: &str, input: &[Value]) -> Option<History> {
        let view = responses::to_chat(&serde_json::json!({"model": model, "input": input}))?;
        let counter = Counter::for_request(&view);
        let mut turns = Vec::new();
        let mut previous = None;
        for (i, value) in view.get("messages")?.as_array()?.iter().enumerate() {
            let message = Message::parse(i, value, &counter).ok()?;
            if message.role.is_instruction() {
                continue;
            }
            if let Some((body, _)) = summary::extract(&message.text()) {
                previous = Some(body);
                continue;
            }
            turns.push(message);
        }
        let tokens = turns.iter().map(|m| m.tokens).sum::<usize>()
            + previous.as_deref().map_or(0, |p| counter.text(p));
        Some(History {
            turns,
            previous,
            tokens: tokens as u64,
        })
    }

    /// The summary: the LLM's when the summariser answers, else the deterministic digest.
    async fn summarise(
        &self,
        app: &App,
        parts: &Parts,
        model: &str,
        window: Option<u64>,
        id: u64,
    ) -> (String, SummarySource) {
        let context_window = window.map_or(engine::DEFAULT_CONTEXT_WINDOW, |w| {
            usize::try_from(w).unwrap_or(usize::MAX)
        });
        let middle = Middle {
            turns: &self.turns,
            previous: self.previous.as_deref(),
            after: &self.turns,
            budget_cap: usize::MAX,
            context_window,
        };
        if let Some(summarizer) = &app.summarizer {
            let call = Call {
                parts,
                model,
                window: window.unwrap_or(u64::MAX),
                id,
                dialect: Dialect::Responses,
            };
            let work = || summarizer.summarize(app.shared(), &call, &middle);
            let summary = match &app.checkpoints {
                // Concurrent requests of one conversation wait for one call.
                Some(cache) => {
                    let partition =
                        checkpoint::Partition::new(&parts.headers, app.upstream.base_url(), model);
                    let key =
                        checkpoint::hash::middle_key(partition, middle.previous, middle.turns);
                    let seal = cache.seal(&parts.headers);
                    cache.summarise(&seal, key, work).await
                }
                None => work().await,
            };
            if let Some(summary) = summary {
                return (summary.text, summary.source);
            }
        }
        // Only an earlier summary: it stands as it is.
        if self.turns.is_empty() {
            if let Some(previous) = &self.previous {
                return (previous.clone(), SummarySource::Cache);
            }
        }
        let budget = summary_budget(self.tokens as usize, context_window);
        let digest = engine::digest::digest(self.previous.as_deref(), &self.turns, budget * 4);
        (digest, SummarySource::Fallback)
    }
}
