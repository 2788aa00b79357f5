//! The compaction path, for every dialect [`crate::dialect`] reads and writes
//! (`POST .../chat/completions`, `POST .../responses`, `POST .../messages`). The body is
//! read (bounded) so a request too long for its model can be rewritten; one that needs
//! nothing goes upstream as the client's original bytes.
//!
//! One loop, in [`run`], drives a request's upstream calls; each phase of it has its file:
//! - `preflight.rs`: before the first call, resume the conversation from its checkpoint,
//!   predict an overflow, fit the completion cap;
//! - `inspect.rs`: read just enough of an answer to know whether compaction could fix it;
//! - `recover.rs`: after such a refusal, learn from it and decide what to send next (the
//!   retry policy);
//! - `policy.rs`: the pure decisions over typed state: what a request needs before its
//!   first call, and the goal of a retry;
//! - `rewrite.rs`: drive the [`Compactor`](crate::compactor::Compactor) towards a goal and
//!   send what it made;
//! - `prepare.rs`: the compaction the threshold will need, made in the background;
//! - `cap.rs`: the completion cap, lowered where prompt plus cap would overflow the
//!   window;
//! - `count_caps.rs`: upstreams that take only so many media parts or messages in one
//!   request;
//! - `usage.rs`: after a successful answer, the upstream's own count of the prompt,
//!   learned against ours;
//! - `report.rs`: what was done, told once, in the `x-compaction` header, the metrics and
//!   the log line;
//! - `codex_compaction.rs`: Codex's own compaction requests, answered for upstreams that
//!   lack them;
//! - `economy.rs`: economy mode, which shortens old tool outputs before the loop sees the
//!   request, and marks the answer with what it saved.
//!
//! Each phase reads what it needs and says what to change; `request.rs` is the one owner
//! of a request's state across its attempts, which sequences the phases and makes their
//! changes: `work.rs` holds the request as it is being rewritten, `done.rs` what has been
//! done to it.

// No function longer than a screen: a phase that grows past it is two phases.

use std::future::Future;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::future::Either;
use http::request::Parts;
use http::Response;
use http_body_util::{BodyExt, Limited};

use crate::app::App;
use crate::body::{self, ProxyBody};
use crate::checkpoint::{Checkpoint, Checkpoints, Key, Partition, Seal};
use crate::compactor::Caller;
use crate::dialect::{self, Dialect, Steering};
use crate::error::ProxyError;
use crate::growth::Growth;
use crate::limits::ClientBody;
use crate::server::RequestBody;
use crate::telemetry;
use crate::units::{Factor, Window};

mod cap;
pub mod codex_compaction;
mod count_caps;
mod done;
mod economy;
pub mod inspect;
mod policy;
mod preflight;
mod prepare;
mod recover;
mod report;
mod request;
mod rewrite;
mod usage;
mod work;

pub use economy::ClientEconomy;
use inspect::Verdict;
use request::Request;
use work::Work;

pub async fn handle(
    app: &Arc<App>,
    request: http::Request<ClientBody<RequestBody>>,
    dialect: Dialect,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, incoming) = request.into_parts();
    let original = read_body(incoming, app.config.limits.max_body_bytes).await?;
    handle_body(app, &parts, original, dialect, id).await
}

/// A request whose body is in memory already: read from an HTTP request, or made from a
/// bridged WebSocket's frame (see [`crate::codex_ws`]).
pub async fn handle_body(
    app: &Arc<App>,
    parts: &Parts,
    original: Bytes,
    dialect: Dialect,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let original = match dialect {
        // The proxy's own compaction items, which no upstream can read, become text.
        Dialect::Responses => dialect::codex_items::expand(&original).map_or(original, Bytes::from),
        Dialect::Chat | Dialect::Messages => original,
    };
    if dialect == Dialect::Responses && dialect::codex_items::is_trigger(&original) {
        let ask = codex_compaction::Ask::Trigger;
        let model = dialect.steering(&original).map(|steering| steering.model);
        let future = Box::pin(codex_compaction::handle(app, parts, original, ask, id));
        return with_span(
            app,
            codex_compaction::API,
            model,
            &parts.headers,
            None,
            future,
        )
        .await;
    }
    match dialect.steering(&original) {
        Some(steering) => {
            // The name is copied only for a span; without traces it would be an
            // allocation per request for nothing.
            let model = app.telemetry.as_ref().map(|_| steering.model.clone());
            let (original, economized) = economy::apply(app, parts, dialect, original);
            let future = run(app, parts, original, steering, dialect, id);
            let saved = economized.as_ref().map(economy::Economized::stats);
            let answer = with_span(app, dialect.as_str(), model, &parts.headers, saved, future);
            let answer = answer.await;
            match economized {
                Some(e) => economy::mark(app, answer, e),
                None => answer,
            }
        }
        // Not a request the proxy understands: the upstream is the judge of it.
        None => send(app, parts, original).await,
    }
}

/// Runs one client request of `api` inside its span when traces are on. A body that names
/// no model still gets its span: the compaction it asks for is worth seeing. Not an
/// `async fn`: one would hold `future`, and the future awaiting it, side by side in its
/// own state, which tripled the size of every request's future (see docs/performance.md).
/// `economy`: what economy mode saved on the request, told on its span.
fn with_span<F>(
    app: &App,
    api: &str,
    model: Option<String>,
    headers: &http::HeaderMap,
    economy: Option<crate::engine::economy::EconomyStats>,
    future: F,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>>
where
    F: Future<Output = Result<Response<ProxyBody>, ProxyError>>,
{
    match &app.telemetry {
        Some(tracer) => {
            let span = tracer.request(api, model.as_deref().unwrap_or(""), headers);
            if let Some(stats) = &economy {
                span.economy(stats);
            }
            // Boxed, as traces are the rarer setting: inline, the traced future would be
            // moved with every request's.
            let in_span = async move { traced(span.clone(), telemetry::scope(span, future).await) };
            Either::Left(Box::pin(in_span))
        }
        None => Either::Right(future),
    }
}

/// The request's span ends with the answer's body, or now when there is none.
fn traced(
    span: telemetry::RequestSpan,
    result: Result<Response<ProxyBody>, ProxyError>,
) -> Result<Response<ProxyBody>, ProxyError> {
    match result {
        Ok(response) => {
            span.status(response.status().as_u16());
            Ok(response.map(|body| span.traced(body)))
        }
        Err(e) => {
            span.failed(e.code());
            span.end();
            Err(e)
        }
    }
}

/// One upstream attempt: `body` with the client's method, path and headers.
async fn send(app: &App, parts: &Parts, body: Bytes) -> Result<Response<ProxyBody>, ProxyError> {
    app.metrics.upstream_attempt();
    let mut span = telemetry::child("upstream attempt");
    let sent = app
        .upstream
        .send(
            parts.method.clone(),
            &parts.uri,
            &parts.headers,
            body::full(body),
        )
        .await;
    if let Some(span) = &mut span {
        match &sent {
            Ok(response) => span.status(response.status().as_u16()),
            Err(e) => span.failed(e.code()),
        }
    }
    sent
}

/// The one loop: prepare the first attempt, send, and on an answer compaction can fix
/// (context overflow, output cap, body too large) let the policy prepare the next, up to
/// `compaction.max_attempts` calls. The client gets the first answer that is not such a
/// refusal, or the upstream's own last refusal.
async fn run(
    app: &Arc<App>,
    parts: &Parts,
    original: Bytes,
    steering: Steering,
    dialect: Dialect,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut work = Work::new(original, &steering);
    let growth = observe_growth(app, parts, &steering, &mut work);
    let mut request = Request {
        ctx: Ctx {
            app,
            parts,
            id,
            dialect,
            steering,
            growth,
        },
        work,
        done: Default::default(),
    };
    request.preflight().await;
    loop {
        request.done.calls += 1;
        let response = send(app, parts, request.work.body.clone()).await?;
        let hold = app.config.first_event_timeout();
        let verdict = inspect::inspect(response, request.ctx.steering.stream, hold).await?;
        match verdict {
            Verdict::Deliver(response) => return Ok(request.deliver(response).await),
            Verdict::Refused { parts, body, class } => {
                // Boxed, as the rare path: inline, its state would be moved with
                // every request's future (see docs/performance.md).
                if request.done.calls >= app.config.compaction.max_attempts
                    || !Box::pin(request.recover(&class)).await
                {
                    return Ok(request.fail(inspect::deliver_refused(parts, body)));
                }
            }
        }
    }
}

/// Bodies below this size are not followed for growth: far from any window, their
/// growth decides nothing, and following them would cost every small request a hash.
const FOLLOWED: usize = 16 * 1024;

/// Records this turn of the request's conversation and gives its expected growth a turn
/// (see [`Growth`]); the partition it computes serves the summary cache too.
fn observe_growth(app: &App, parts: &Parts, steering: &Steering, work: &mut Work) -> Option<u64> {
    let original = work.original();
    if original.len() < FOLLOWED {
        return None;
    }
    let partition = app
        .tenants
        .partition(&parts.headers, app.upstream.base_url(), &steering.model);
    let conversation = Growth::conversation(partition.scope, original);
    let growth = app.growth.observe(conversation, original.len() as u64);
    work.partition = Some(partition);
    growth
}

/// What stays fixed across a request's attempts.
struct Ctx<'a> {
    /// Shared, for the work that outlives the request (a compaction prepared ahead).
    app: &'a Arc<App>,
    /// The client's method, path and headers, which a summariser call reuses.
    parts: &'a Parts,
    /// The request id, for log lines.
    id: u64,
    dialect: Dialect,
    /// The client's steering fields, as it sent them.
    steering: Steering,
    /// How much the conversation is expected to grow on its next turn, in bytes, when
    /// its size is worth following.
    growth: Option<u64>,
}

impl Ctx<'_> {
    fn upstream(&self) -> &str {
        self.app.upstream.base_url()
    }

    /// The model's window, when known or learned.
    fn window(&self) -> Option<Window> {
        self.app
            .models
            .window_for(self.upstream(), &self.steering.model)
            .map(|w| w.window)
    }

    /// Upstream tokens per token of ours, as learned for this model.
    fn factor(&self) -> Factor {
        Factor(
            self.app
                .models
                .factor(self.upstream(), &self.steering.model),
        )
    }

    /// The conversation's partition in the summary cache.
    fn partition(&self) -> Partition {
        self.app
            .tenants
            .partition(&self.parts.headers, self.upstream(), &self.steering.model)
    }

    /// The key the conversation's checkpoints are sealed with, from the same credential
    /// as its partition; derived for this request and dropped with it.
    fn seal(&self, cache: &Checkpoints) -> Seal {
        cache.seal(&self.parts.headers)
    }

    /// Stores `checkpoint` sealed for this request's credential. The seal is made here,
    /// inside the boxed future that awaits this: a key schedule is hundreds of bytes,
    /// which every request's future would otherwise carry (see docs/performance.md).
    async fn put(
        &self,
        cache: &Checkpoints,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
    ) {
        let seal = self.seal(cache);
        cache.put(&seal, key, checkpoint, replaces).await;
    }

    /// The request as the summariser's caller, in `partition`.
    fn caller(&self, partition: Partition) -> Caller<'_> {
        Caller::new(
            self.parts,
            &self.steering.model,
            self.dialect,
            self.id,
            partition,
        )
    }
}

/// Reads the whole body, refusing early when its size hint already says it is over the
/// limit, and stopping as soon as a body that did not say crosses it. A body framed by
/// `Content-Length` hints that length exactly: the connection parsed it from the head, so
/// it is not looked up in the headers again.
pub(crate) async fn read_body<B>(incoming: B, limit: u64) -> Result<Bytes, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<crate::cause::BoxError>,
{
    if incoming.size_hint().lower() > limit {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let max = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut body = Limited::new(incoming, max);
    // Most bodies arrive as one frame, which is kept as it is: no copy, and none of
    // `collect`'s frame list (an allocation per request).
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ProxyError::BodyTooLarge { limit });
            }
            Err(e) => return Err(ProxyError::client_body(e)),
        };
        // Trailers are not part of the body.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut both = BytesMut::with_capacity(first.len() + data.len());
                both.extend_from_slice(&first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use proptest::prelude::*;
    use std::convert::Infallible;

    fn read(frames: Vec<Vec<u8>>, limit: u64) -> Result<Bytes, ProxyError> {
        let frames = frames
            .into_iter()
            .map(|f| Ok::<_, Infallible>(Frame::data(Bytes::from(f))));
        let body = StreamBody::new(stream::iter(frames));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(read_body(body, limit))
    }

    /// Once the store holds any checkpoint, every request asks for its partition: its
    /// credential's SHA-256 must come from the memo after the first request, not be
    /// computed again (bench/results/throughput-2026-11-26c.md).
    #[test]
    fn a_request_s_partition_is_hashed_once_per_credential() {
        let app = Arc::new(App::new(crate::config::Config::default()).unwrap());
        let request = http::Request::builder()
            .header(http::header::AUTHORIZATION, "Bearer sk-1")
            .body(())
            .unwrap();
        let (parts, ()) = request.into_parts();
        let ctx = Ctx {
            app: &app,
            parts: &parts,
            id: 1,
            dialect: Dialect::Chat,
            steering: Steering {
                model: "m".into(),
                stream: false,
                max_output: None,
                max_output_field: None,
            },
            growth: None,
        };
        let upstream = app.upstream.base_url();
        let partition = Partition::new(&parts.headers, upstream, "m");
        assert_eq!(ctx.partition(), partition);
        assert_eq!(app.tenants.held(), 1);
        assert_eq!(ctx.partition(), partition);
        assert_eq!(app.tenants.held(), 1);
    }

    proptest! {
        /// However the client's body is cut into frames (empty ones included), what is
        /// read is its bytes in order; past the limit, it is refused.
        #[test]
        fn any_framing_reads_the_same_bytes(
            frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..8),
            slack in 0u64..4,
        ) {
            let whole: Vec<u8> = frames.concat();
            let len = whole.len() as u64;
            prop_assert_eq!(&read(frames.clone(), len + slack).unwrap()[..], &whole[..]);
            if len > 0 {
                let over = read(frames, len - 1);
                let refused = matches!(over, Err(ProxyError::BodyTooLarge { .. }));
                prop_assert!(refused, "a body over the limit must be refused");
            }
        }
    }
}
