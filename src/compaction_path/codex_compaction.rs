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
use serde_json::Value;

use super::inspect::read_to_end;
use super::report::{record, LogLine};
use super::{read_body, send};
use crate::app::App;
use crate::body::{self, ProxyBody, Replay};
use crate::classify::{self, Kind};
use crate::compaction_report::{Outcome, Trigger, XCompaction};
use crate::compactor::Caller;
use crate::config::RemoteCompaction;
use crate::dialect::{codex_items as items, responses, Dialect};
use crate::engine::{summary, Counter, Message};
use crate::error::ProxyError;
use crate::limits::ClientBody;
use crate::server::RequestBody;
use crate::units::Ours;

/// The API name of these requests in traces: their span is "responses.compact {model}".
pub(super) const API: &str = "responses.compact";

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
    fn as_str(self) -> &'static str {
        match self {
            Ask::Endpoint => "endpoint",
            Ask::Trigger => "trigger",
        }
    }

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
    request: Request<ClientBody<RequestBody>>,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, incoming) = request.into_parts();
    let body = read_body(incoming, app.config.limits.max_body_bytes).await?;
    let body = items::expand(&body).map_or(body, Bytes::from);
    let model = Dialect::Responses
        .steering(&body)
        .map(|steering| steering.model);
    let future = handle(app, &parts, body, Ask::Endpoint, id);
    super::with_span(app, API, model, &parts.headers, None, future).await
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
    let upstream = app.upstream.base_url();
    let window = app.models.window_for(upstream, model).map(|w| w.window);
    let partition = app.tenants.partition(&parts.headers, upstream, model);
    let caller = Caller::new(parts, model, Dialect::Responses, id, partition);
    let summary = app
        .compactor()
        .summarise(
            &history.turns,
            history.previous.as_deref(),
            history.tokens,
            &caller,
            window,
        )
        .await;
    let (text, source) = (summary.text, summary.source);
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
        tokens_before: history.tokens.0,
        tokens_after: tokens,
        output: None,
        media: None,
    };
    let line = LogLine {
        id,
        dialect: Dialect::Responses,
        passes: "",
        window,
        ask: ask.as_str(),
    };
    record(&app.metrics, &x, true, &line);
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
    tokens: Ours,
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
            tokens: Ours(tokens as u64),
        })
    }
}
