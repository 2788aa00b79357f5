//! The compaction path: `POST .../chat/completions` and `POST .../responses` (see
//! [`crate::wire`] for how each dialect is read and written). The body is read (bounded) so a
//! request that is too long for its model can be rewritten; one that needs nothing goes
//! upstream as the client's original bytes.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::app::App;
use crate::body::{self, ProxyBody};
use crate::error::ProxyError;
use crate::limits::ClientBody;
use crate::wire::Dialect;

pub mod inspect;
pub mod request;
pub mod retry;
pub mod summarizer;
pub mod x_compaction;

pub async fn handle(
    app: &App,
    request: Request<ClientBody<Incoming>>,
    dialect: Dialect,
    id: u64,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, incoming) = request.into_parts();
    let original = read_body(incoming, &parts.headers, app.config.limits.max_body_bytes).await?;
    match dialect.head(&original) {
        Some(head) => retry::run(app, parts, original, head, dialect, id).await,
        // Not a chat request the proxy understands: the upstream is the judge of it.
        None => {
            app.metrics.upstream_attempt();
            app.upstream
                .send(
                    parts.method,
                    &parts.uri,
                    &parts.headers,
                    body::full(original),
                )
                .await
        }
    }
}

/// Reads the whole body, refusing early when `Content-Length` already says it is over
/// the limit, and stopping as soon as a body without one crosses it.
async fn read_body(
    incoming: ClientBody<Incoming>,
    headers: &HeaderMap,
    limit: u64,
) -> Result<Bytes, ProxyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let max = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(incoming, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(e) => Err(ProxyError::client_body(e)),
    }
}
