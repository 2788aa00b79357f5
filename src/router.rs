//! Where each request goes: the proxy's own endpoints, the compaction path for chat
//! completions, the Responses API and Anthropic's Messages API, or plain pass-through. Also the one place a request is counted, its
//! client key checked and its outcome logged.

use std::future::{ready, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{Either, FutureExt};

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::OwnedSemaphorePermit;

use crate::app::App;
use crate::body::{self, ProxyBody};
use crate::cause::Chain;
use crate::checkpoint::cache::Health;
use crate::compaction_path::ClientEconomy;
use crate::dialect::Dialect;
use crate::error::ProxyError;
use crate::limits::{ClientBody, Reservation};
use crate::server::RequestBody;
use crate::summarize::ClientFocus;
use crate::{codex_ws, compaction_path, passthrough, upgrade};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Metrics,
    /// A conversation the proxy may compact, in one of its dialects.
    Compact(Dialect),
    /// Codex's `POST .../responses/compact`, which the proxy answers for upstreams that
    /// lack it.
    RemoteCompaction,
    Passthrough,
    /// A request to switch protocols (a WebSocket's handshake), relayed once switched.
    Upgrade,
    /// `CONNECT`, refused: there is no upstream request it could become.
    Connect,
}

impl Route {
    fn of<B>(request: &Request<B>) -> Self {
        let path = request.uri().path();
        match (request.method(), path) {
            (&Method::GET, "/healthz") => Self::Health,
            (&Method::GET, "/metrics") => Self::Metrics,
            (&Method::CONNECT, _) => Self::Connect,
            _ if upgrade::asked(request) => Self::Upgrade,
            (&Method::POST, p) if p.ends_with("/responses/compact") => Self::RemoteCompaction,
            (&Method::POST, p) => Dialect::of_path(p).map_or(Self::Passthrough, Self::Compact),
            _ => Self::Passthrough,
        }
    }
}

/// Answers one request; `slot` is its connection's place under `server.max_connections`,
/// which a switched connection keeps for as long as it is relayed.
pub async fn handle(
    app: Arc<App>,
    mut request: Request<RequestBody>,
    slot: Arc<OwnedSemaphorePermit>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let id = app.next_request_id();
    let method = request.method().clone();
    // Copied for the log line only when it is written: an allocation per request else.
    let path = tracing::enabled!(tracing::Level::INFO).then(|| request.uri().path().to_owned());
    // Dot segments are resolved before anything looks at the path, so the route and the
    // upstream see the same one, and it stays under the base URL's path.
    let normalised = crate::path::normalise(request.uri());
    let response = match normalised {
        Err(e) => {
            tracing::warn!(id, error = %e, "refused path");
            ProxyError::from(e).into_response()
        }
        Ok(normal) => {
            if let Some(uri) = normal {
                *request.uri_mut() = uri;
            }
            let ours = carries_ours(&request);
            if ours {
                take_focus(&mut request);
                take_economy(&mut request);
            }
            let off = ours && compaction_off(&mut request);
            let route = match (Route::of(&request), off) {
                (Route::Compact(_) | Route::RemoteCompaction, true) => Route::Passthrough,
                // A bridged WebSocket's requests then go upstream as Codex sent them.
                (Route::Upgrade, true) => {
                    request.extensions_mut().insert(codex_ws::CompactionOff);
                    Route::Upgrade
                }
                (route, _) => route,
            };
            // The id is a field of each line rather than a span: entering a span on every
            // poll of every request costs more than the log lines themselves.
            dispatch(&app, route, request, id, slot).await
        }
    };
    tracing::info!(
        id,
        %method,
        path = path.as_deref().unwrap_or_default(),
        status = response.status().as_u16(),
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "answered"
    );
    response
}

/// `ok`, always with 200: the proxy serves whatever its store's state (a load balancer
/// must not take replicas out because Redis is down). A second line says how the checkpoint
/// store is doing, for operators.
fn health(app: &App) -> String {
    let Some(cache) = &app.checkpoints else {
        return "ok\ncache: off\n".into();
    };
    let backend = cache.backend().as_str();
    let mut text = match cache.health() {
        Health::Up => format!("ok\ncache: {backend} up\n"),
        Health::Degraded { for_secs, reason } => format!(
            "ok\ncache: {backend} degraded for {for_secs} s, serving from memory: {reason}\n"
        ),
    };
    if let Some(why) = cache.in_memory_instead() {
        text.push_str(&format!("cache embedded: {why}\n"));
    }
    if let Some(exposure) = cache.exposed() {
        text.push_str(&format!("cache files: {exposure}\n"));
    }
    text
}

/// The proxy's own endpoints are answered at once; every other request is forwarded.
/// Not an `async fn`, and neither is [`forward`]: each would keep the request in its own
/// state beside the future it awaits, and move that future once more per request (see
/// docs/performance.md).
fn dispatch(
    app: &Arc<App>,
    route: Route,
    request: Request<RequestBody>,
    id: u64,
    slot: Arc<OwnedSemaphorePermit>,
) -> impl Future<Output = Response<ProxyBody>> + Send + '_ {
    let forwarding = match route {
        Route::Health => {
            let health = text(StatusCode::OK, "text/plain; charset=utf-8", health(app));
            return Either::Left(ready(health));
        }
        Route::Metrics => return Either::Left(ready(metrics(app))),
        Route::Compact(_)
        | Route::RemoteCompaction
        | Route::Passthrough
        | Route::Upgrade
        | Route::Connect => {
            app.metrics.request();
            forward(app, route, request, id, slot)
        }
    };
    let answer = match forwarding {
        Ok(forwarding) => Either::Left(forwarding),
        Err(e) => Either::Right(ready(Err(e))),
    };
    Either::Right(answer.map(move |answer| {
        answer.unwrap_or_else(|e| {
            tracing::warn!(id, error = %Chain(&e), "proxy error");
            e.into_response()
        })
    }))
}

fn metrics(app: &App) -> Response<ProxyBody> {
    let mut metrics = app
        .metrics
        .render(app.checkpoints.as_ref(), app.upstream.stale_retries());
    if let Some(telemetry) = &app.telemetry {
        telemetry.render(&mut metrics);
    }
    text(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        metrics,
    )
}

/// The request header a client turns compaction off with, for one request.
const COMPACTION: &str = "x-compaction";

/// Whether the request carries any of the proxy's own headers (`x-compaction`,
/// `x-compaction-focus`): one pass over the few names present, where removing each by
/// name would parse and hash it, on every request, for headers few clients send.
fn carries_ours<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .keys()
        .any(|name| name.as_str().starts_with(COMPACTION))
}

/// Whether the request says `x-compaction: off`. The header is the proxy's, whatever its
/// value: it is taken off the request, so it never reaches the upstream.
fn compaction_off<B>(request: &mut Request<B>) -> bool {
    request
        .headers_mut()
        .remove(COMPACTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"off"))
}

/// The request header a client steers the summary of its conversation with.
const FOCUS: &str = "x-compaction-focus";

/// Takes `x-compaction-focus` off the request, so it never reaches the upstream, and
/// keeps its text in the request's extensions for the summariser.
fn take_focus<B>(request: &mut Request<B>) {
    let Some(value) = request.headers_mut().remove(FOCUS) else {
        return;
    };
    let text = String::from_utf8_lossy(value.as_bytes()).trim().to_owned();
    if !text.is_empty() {
        request.extensions_mut().insert(ClientFocus(text));
    }
}

/// The request header that turns economy mode on or off for one request.
const ECONOMY: &str = "x-compaction-economy";

/// Takes `x-compaction-economy` off the request, so it never reaches the upstream, and
/// keeps an `on` or `off` in the request's extensions; any other value is ignored (the
/// configured default then holds).
fn take_economy<B>(request: &mut Request<B>) {
    let Some(value) = request.headers_mut().remove(ECONOMY) else {
        return;
    };
    let on = match value.as_bytes().trim_ascii() {
        v if v.eq_ignore_ascii_case(b"on") => true,
        v if v.eq_ignore_ascii_case(b"off") => false,
        _ => return,
    };
    request.extensions_mut().insert(ClientEconomy(on));
}

/// A rare path's answer, boxed where it is taken: inline, its state would be moved with
/// every request's future.
type Boxed<'a> = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send + 'a>>;

/// A client's request on its way upstream: its key checked, its body bounded (see
/// [`ClientBody`]), then the compaction path or pass-through, still to be awaited.
fn forward(
    app: &Arc<App>,
    route: Route,
    request: Request<RequestBody>,
    id: u64,
    slot: Arc<OwnedSemaphorePermit>,
) -> Result<impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send + '_, ProxyError> {
    app.auth.check(request.headers())?;
    let timeout = app.config.body_read_timeout();
    let forwarding = match route {
        Route::Compact(dialect) => {
            let (request, reservation) = reserved(app, request, timeout)?;
            let answer = compaction_path::handle(app, request, dialect, id);
            Either::Left(Either::Left(holding(reservation, answer)))
        }
        Route::RemoteCompaction => {
            let (request, reservation) = reserved(app, request, timeout)?;
            let answer = compaction_path::codex_compaction::handle_endpoint(app, request, id);
            Either::Right(Box::pin(holding(reservation, answer)) as Boxed)
        }
        Route::Connect => return Err(ProxyError::Connect),
        Route::Upgrade => {
            let request = request.map(|body| ClientBody::new(body, timeout, None));
            Either::Right(Box::pin(upgrade::forward(app, request, slot)) as Boxed)
        }
        Route::Health | Route::Metrics | Route::Passthrough => {
            let request = request.map(|body| ClientBody::new(body, timeout, None));
            Either::Left(Either::Right(passthrough::forward(app, request)))
        }
    };
    Ok(forwarding)
}

/// The request with its body bounded, and the reservation of memory for it, which the
/// caller holds until the answer is ready, as the body stays in memory that long. A
/// declared length is reserved before any of the body is read; one over
/// `max_body_bytes` is refused unread by the chat path instead.
fn reserved(
    app: &App,
    request: Request<RequestBody>,
    timeout: Duration,
) -> Result<(Request<ClientBody<RequestBody>>, Arc<Reservation>), ProxyError> {
    let reservation = Arc::new(app.buffers.reservation());
    // The server has read `Content-Length` into the body's size already.
    let declared = request.body().size_hint().exact();
    if let Some(len) = declared.filter(|&len| len <= app.config.limits.max_body_bytes) {
        reservation.grow_to(len)?;
    }
    let held = Some(Arc::clone(&reservation));
    let request = request.map(|body| ClientBody::new(body, timeout, held));
    Ok((request, reservation))
}

/// `answer`, with the memory reserved for its request's body held until it is ready.
fn holding<F: Future>(reservation: Arc<Reservation>, answer: F) -> impl Future<Output = F::Output> {
    answer.map(move |answer| {
        drop(reservation);
        answer
    })
}

fn text(status: StatusCode, content_type: &'static str, text: String) -> Response<ProxyBody> {
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: Method, uri: &str) -> Route {
        Route::of(&Request::builder().method(method).uri(uri).body(()).unwrap())
    }

    #[test]
    fn the_proxy_s_own_headers_are_found_among_the_client_s() {
        let with = |name: &str| {
            let request = Request::builder().header(name, "off").body(()).unwrap();
            carries_ours(&request)
        };
        assert!(with("x-compaction"));
        assert!(with("X-Compaction-Focus"));
        assert!(!with("x-compact"));
        assert!(!with("authorization"));
    }

    #[test]
    fn routes_by_method_and_path() {
        assert_eq!(route(Method::GET, "/healthz"), Route::Health);
        assert_eq!(route(Method::GET, "/metrics"), Route::Metrics);
        let chat = Route::Compact(Dialect::Chat);
        assert_eq!(route(Method::POST, "/v1/chat/completions"), chat);
        assert_eq!(
            route(
                Method::POST,
                "/openai/deployments/x/chat/completions?api-version=1"
            ),
            chat
        );
        assert_eq!(
            route(Method::GET, "/v1/chat/completions"),
            Route::Passthrough
        );
        assert_eq!(
            route(Method::POST, "/v1/responses"),
            Route::Compact(Dialect::Responses)
        );
        // Codex's compaction endpoint has its own route; a stored response is not a
        // conversation.
        assert_eq!(
            route(Method::POST, "/v1/responses/compact"),
            Route::RemoteCompaction
        );
        assert_eq!(
            route(Method::GET, "/v1/responses/resp_1"),
            Route::Passthrough
        );
        // Anthropic's Messages API; the query (Claude Code's `?beta=true`) is no part of
        // the path, and counting tokens or batching is not a conversation to compact.
        let messages = Route::Compact(Dialect::Messages);
        assert_eq!(route(Method::POST, "/v1/messages"), messages);
        assert_eq!(route(Method::POST, "/v1/messages?beta=true"), messages);
        assert_eq!(route(Method::POST, "/anthropic/messages"), messages);
        for other in ["/v1/messages/count_tokens", "/v1/messages/batches"] {
            assert_eq!(route(Method::POST, other), Route::Passthrough, "{other}");
        }
        assert_eq!(route(Method::POST, "/healthz"), Route::Passthrough);
        assert_eq!(route(Method::CONNECT, "/v1/models"), Route::Connect);
        // A WebSocket's handshake on any path, the compaction path's included.
        for path in ["/v1/responses", "/v1/chat/completions", "/ws"] {
            let request = Request::builder()
                .uri(path)
                .header("connection", "Upgrade")
                .header("upgrade", "websocket")
                .body(())
                .unwrap();
            assert_eq!(Route::of(&request), Route::Upgrade, "{path}");
        }
    }
}
