//! The proxy's own errors, rendered once as OpenAI-style JSON. Errors the upstream
//! returns are never turned into these: they pass through as the upstream sent them.
//!
//! A variant keeps what caused it as its `source()`, of the cause's own type, and says
//! only what happened at this level; the message a client reads is the whole chain,
//! written out here and nowhere earlier.

use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{self, BodyReadError, ProxyBody};
use crate::cause::{BoxError, Chain};
use crate::limits::{BodyError, Overloaded};
use crate::path::PathError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The upstream could not be connected to, or dropped the connection before answering.
    #[error("the upstream could not be reached")]
    UpstreamUnreachable(#[source] BoxError),
    /// The upstream sent no answer within the idle timeout.
    #[error("the upstream sent nothing for {} s", .0.as_secs_f64())]
    UpstreamTimeout(Duration),
    /// A chat request body larger than `limits.max_body_bytes`.
    #[error("the request body is larger than this proxy's limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// The client's body could not be read (connection cut, bad framing).
    #[error("the request body could not be read")]
    ClientBody(#[source] BoxError),
    /// The client's body went silent for `server.body_read_timeout_ms`.
    #[error("the client sent no request body for {} s", .0.as_secs_f64())]
    ClientTimeout(Duration),
    /// A chat body would take the bodies held in memory past `limits.max_buffered_bytes`.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// A client key was required and the request had none, or an unknown one.
    #[error("invalid or missing API key for this proxy")]
    Unauthorized,
    /// A path with dot segments that cannot be resolved inside its root.
    #[error("invalid request path")]
    InvalidPath(#[from] PathError),
    /// A WebSocket handshake the bridge cannot answer (no `Sec-WebSocket-Key`).
    #[error("invalid WebSocket handshake: no usable Sec-WebSocket-Key")]
    WebSocketHandshake,
    /// `CONNECT`: a forward proxy's tunnel, which a reverse proxy does not open.
    #[error("CONNECT is not supported: this proxy forwards requests to its upstream and opens no tunnels")]
    Connect,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ClientBody(_) => StatusCode::BAD_REQUEST,
            Self::ClientTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::InvalidPath(_) => StatusCode::BAD_REQUEST,
            Self::WebSocketHandshake => StatusCode::BAD_REQUEST,
            Self::Connect => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The error's `code`, as its answer and a trace's `error.type` name it.
    pub fn code(&self) -> &'static str {
        self.kind().1
    }

    /// OpenAI's `type` and `code` for this error, so SDKs raise their usual exceptions.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Self::UpstreamUnreachable(_) => ("upstream_error", "upstream_unreachable"),
            Self::UpstreamTimeout(_) => ("upstream_error", "upstream_timeout"),
            Self::BodyTooLarge { .. } => ("invalid_request_error", "request_too_large"),
            Self::ClientBody(_) => ("invalid_request_error", "invalid_body"),
            Self::ClientTimeout(_) => ("invalid_request_error", "request_timeout"),
            Self::Overloaded(_) => ("server_error", "overloaded"),
            Self::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            Self::InvalidPath(_) => ("invalid_request_error", "invalid_path"),
            Self::WebSocketHandshake => ("invalid_request_error", "invalid_websocket_handshake"),
            Self::Connect => ("invalid_request_error", "method_not_allowed"),
        }
    }

    /// The error for a client's body that failed: too slow, over the memory bound, or
    /// unreadable (cut off, badly framed).
    pub fn client_body(error: BoxError) -> Self {
        match error.downcast::<BodyError<BodyReadError>>().map(|e| *e) {
            Ok(BodyError::Timeout(idle)) => Self::ClientTimeout(idle),
            Ok(BodyError::Overloaded(overloaded)) => Self::Overloaded(overloaded),
            Ok(BodyError::Read(e)) => Self::ClientBody(Box::new(e)),
            Err(e) => Self::ClientBody(e),
        }
    }

    pub fn into_response(self) -> Response<ProxyBody> {
        let (kind, code) = self.kind();
        let payload = serde_json::json!({
            "error": {
                "message": format!("compaction-proxy: {}", Chain(&self)),
                "type": kind,
                "param": null,
                "code": code,
            }
        });
        let mut response = Response::new(body::full(payload.to_string()));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, Self::Connect) {
            // A 405 names what the target allows (RFC 9110 section 15.5.6): every method
            // goes upstream but CONNECT.
            response.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn renders_openai_shaped_json() {
        let response = ProxyError::BodyTooLarge { limit: 10 }.into_response();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["error"]["code"], "request_too_large");
        assert_eq!(value["error"]["type"], "invalid_request_error");
        assert!(value["error"]["message"]
            .as_str()
            .unwrap()
            .contains("10 bytes"));
    }

    #[tokio::test]
    async fn the_cause_is_kept_and_told_to_the_client_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = ProxyError::UpstreamUnreachable(Box::new(refused));
        let cause = std::error::Error::source(&error).unwrap();
        assert!(cause.downcast_ref::<std::io::Error>().is_some());
        let bytes = error.into_response().into_body().collect().await.unwrap();
        let value: serde_json::Value = serde_json::from_slice(&bytes.to_bytes()).unwrap();
        assert_eq!(
            value["error"]["message"],
            "compaction-proxy: the upstream could not be reached: refused"
        );
    }

    #[test]
    fn status_follows_origin() {
        assert_eq!(
            ProxyError::UpstreamUnreachable("refused".into()).status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            ProxyError::UpstreamTimeout(Duration::from_secs(1)).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(ProxyError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
    }
}
