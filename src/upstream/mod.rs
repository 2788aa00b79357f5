//! Sending a request to the upstream: where it goes (the path-join rule), which headers
//! travel, the connection pool, and the timeouts suited to LLM traffic; and a request to
//! switch protocols, whose connection, once switched, is handed to the caller.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Method, Response, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Sleep;

use crate::auth;
use crate::body::{IdleTimeout, ProxyBody, Replay};
use crate::config::Config;
use crate::error::ProxyError;

mod own_body;
mod pool;

pub use own_body::own_body_headers;

use crate::http1::{self, RequestFraming};
pub use pool::Tunnel;
use pool::{Answer, Pool, PooledBody, SendError};

/// The hop-by-hop headers (see [`is_hop_by_hop`]) that are not among `http`'s standard
/// names.
static HOP_BY_HOP_OTHER: [HeaderName; 2] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

#[derive(Debug, thiserror::Error)]
pub enum UpstreamInitError {
    #[error("{0}.api_key_env names {1}, which is not set in the environment")]
    MissingKey(&'static str, String),
    #[error("the {0} key in {1} is not a valid header value")]
    BadKey(&'static str, String),
    #[error("{0} is not an http(s) base URL")]
    BadUrl(String),
}

pub struct Upstream {
    pool: Arc<Pool>,
    base: String,
    /// The base URL's path (without a trailing `/`), which every request path extends.
    prefix: String,
    /// The `Host` header every request gets: the base URL's host, and its port unless it
    /// is the scheme's default.
    host: HeaderValue,
    idle: Duration,
    api_key: Option<ApiKey>,
}

/// A key the proxy sends in place of the client's credentials (sidecar mode), in the two
/// forms upstreams read: `Authorization: Bearer KEY` (OpenAI and its kin), and
/// `x-api-key: KEY` (Anthropic's Messages API, which ignores `Authorization`).
#[derive(Clone)]
struct ApiKey {
    bearer: HeaderValue,
    bare: HeaderValue,
}

impl ApiKey {
    fn new(key: &str) -> Option<ApiKey> {
        let mut bearer = HeaderValue::try_from(format!("Bearer {key}")).ok()?;
        let mut bare = HeaderValue::try_from(key).ok()?;
        bearer.set_sensitive(true);
        bare.set_sensitive(true);
        Some(ApiKey { bearer, bare })
    }

    /// The header a request to `path` carries the key in.
    fn header(&self, path: &str) -> (&'static str, &HeaderValue) {
        if is_messages(path) {
            ("x-api-key", &self.bare)
        } else {
            (header::AUTHORIZATION.as_str(), &self.bearer)
        }
    }
}

/// Whether `path` is one of Anthropic's Messages API (`/v1/messages`, its token count and
/// batches).
fn is_messages(path: &str) -> bool {
    path.ends_with("/messages") || path.contains("/messages/")
}

impl Upstream {
    pub fn new(config: &Config) -> Result<Self, UpstreamInitError> {
        let upstream = &config.upstream;
        let key = upstream_key("upstream", upstream.api_key_env.as_deref())?;
        Self::build(config, &upstream.base_url, config.idle_timeout(), key)
    }

    /// The summariser's own sender: its base URL (else the upstream's), its idle timeout,
    /// and its key (else, when it is the upstream, the upstream's injected key).
    pub fn summarizer(config: &Config) -> Result<Self, UpstreamInitError> {
        let summarizer = &config.summarizer;
        let key = match (&summarizer.api_key_env, summarizer.base_url.is_empty()) {
            (Some(name), _) => upstream_key("summarizer", Some(name))?,
            (None, true) => upstream_key("upstream", config.upstream.api_key_env.as_deref())?,
            (None, false) => None,
        };
        let base = match summarizer.base_url.is_empty() {
            true => &config.upstream.base_url,
            false => &summarizer.base_url,
        };
        Self::build(config, base, summarizer.timeout(), key)
    }

    /// A sender to a trace collector at `origin` (`http://host:port`): no key, and the
    /// upstream's connection settings.
    pub fn collector(config: &Config, origin: &str) -> Result<Self, UpstreamInitError> {
        Self::build(config, origin, config.idle_timeout(), None)
    }

    fn build(
        config: &Config,
        base: &str,
        idle: Duration,
        api_key: Option<ApiKey>,
    ) -> Result<Self, UpstreamInitError> {
        let base = base.trim_end_matches('/');
        let bad_url = || UpstreamInitError::BadUrl(base.to_owned());
        let uri: Uri = base.parse().map_err(|_| bad_url())?;
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return Err(bad_url());
        };
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|_| bad_url())?;
        let host = host_header(scheme, authority).ok_or_else(bad_url)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout()));
        // Keep-alive probes find dead peers; no TCP user timeout is set, so a slow model
        // that keeps the socket quiet for minutes is not cut off by the kernel.
        http.set_keepalive(Some(Duration::from_secs(30)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            pool: Pool::new(https, origin, config.pool_idle_timeout()),
            prefix: uri.path().trim_end_matches('/').to_owned(),
            base: base.to_owned(),
            host,
            idle,
            api_key,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends one request and returns the upstream's answer with its body still streaming.
    /// Only the proxy's own failures are errors; any status the upstream answers is `Ok`.
    pub async fn send(
        &self,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let length = http_body::Body::size_hint(&body).exact();
        let (head, framing) = self.head(&method, uri, headers, length, false);
        let mut timer = Box::pin(tokio::time::sleep(self.idle));
        let response = tokio::select! {
            response = self.pool.send(&method, head, framing, body) => response,
            () = timer.as_mut() => return Err(ProxyError::UpstreamTimeout(self.idle)),
        };
        self.streaming(response.map_err(sent)?, timer)
    }

    /// Sends a request that asks to switch protocols (a WebSocket's handshake) with its
    /// `Upgrade` header and `Connection: upgrade`. A 101 comes back with the connection it
    /// switched, for the caller to relay; any other answer is the client's, as `send`
    /// returns it.
    pub async fn upgrade(
        &self,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: ProxyBody,
    ) -> Result<Upgrade, ProxyError> {
        let length = http_body::Body::size_hint(&body).exact();
        let (head, framing) = self.head(&method, uri, headers, length, true);
        let mut timer = Box::pin(tokio::time::sleep(self.idle));
        let answer = tokio::select! {
            answer = self.pool.upgrade(&method, head, framing, body) => answer,
            () = timer.as_mut() => return Err(ProxyError::UpstreamTimeout(self.idle)),
        };
        match answer.map_err(sent)? {
            Answer::Other(response) => self.streaming(response, timer).map(Upgrade::Refused),
            Answer::Switched(head, tunnel) => {
                let mut response = Response::new(());
                *response.status_mut() = head.status;
                *response.headers_mut() = head.headers;
                strip_hop_by_hop_but_upgrade(response.headers_mut());
                Ok(Upgrade::Switched(response, tunnel))
            }
        }
    }

    /// An answer for the client: its connection's headers dropped, its body streaming
    /// under the idle timeout, with `timer` (which guarded the wait for its head) reused.
    fn streaming(
        &self,
        response: Response<PooledBody>,
        timer: Pin<Box<Sleep>>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (mut parts, mut body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // A body that fails at its very start would reach the client as an empty reply:
        // hyper drops the connection before it has flushed the head. When the failure is
        // in what came with the head, the client gets a 502 like any failed answer.
        let first = match body.frame().now_or_never() {
            Some(Some(Err(e))) => return Err(ProxyError::UpstreamUnreachable(e)),
            // The pool's bodies carry data frames only.
            Some(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
            Some(None) | None => Bytes::new(),
        };
        let body = Replay::new(first, body);
        let body = IdleTimeout::with_timer(body, self.idle, timer).boxed_unsync();
        Ok(Response::from_parts(parts, body))
    }

    /// Requests sent again on a new connection because the reused one was closed under
    /// them before any answer.
    pub fn stale_retries(&self) -> u64 {
        self.pool.stale_retries()
    }

    /// How long a switched connection may stay silent both ways: the idle timeout of any
    /// other exchange with this upstream.
    pub fn idle_timeout(&self) -> Duration {
        self.idle
    }

    /// The request head for the upstream, written straight from the client's: the joined
    /// path (origin-form: the connection knows scheme and host), the client's headers in
    /// their order less those that describe its connection to us, then `Host`. A body
    /// of known length gets its own `Content-Length` (a rewritten body has a new length,
    /// and the client's would lie), in the place of the client's if it sent one; so does
    /// an injected key, in the place of the client's first credential header. With a key
    /// injected, every credential header of the client's is dropped: in sidecar mode they
    /// carry this proxy's client keys, which the upstream must never see. With `upgrade`,
    /// the client's `Upgrade` header goes too, and `Connection: upgrade` after `Host`: the
    /// one hop-by-hop request the proxy passes on, as the handshake is the upstream's to
    /// answer.
    fn head(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        length: Option<u64>,
        upgrade: bool,
    ) -> (Vec<u8>, RequestFraming) {
        let mut head = Vec::with_capacity(256 + 64 * headers.len());
        let (path, query) = target(&self.prefix, uri);
        match query {
            Some(query) => {
                http1::request_line(&mut head, method, &[&self.prefix, path, "?", query])
            }
            None => http1::request_line(&mut head, method, &[&self.prefix, path]),
        }
        let content_length =
            length.filter(|&len| len > 0 || headers.contains_key(header::CONTENT_LENGTH));
        let mut length_written = false;
        let mut key_written = false;
        let named = connection_named(headers);
        for (name, value) in headers {
            let passed = upgrade && name == header::UPGRADE;
            if name == header::HOST || (is_hop_by_hop(name, &named) && !passed) {
                continue;
            }
            if name == header::CONTENT_LENGTH {
                if let Some(len) = content_length {
                    if !std::mem::replace(&mut length_written, true) {
                        http1::content_length(&mut head, len);
                    }
                    continue;
                }
            }
            if auth::is_credential(name) {
                if let Some(key) = &self.api_key {
                    if !std::mem::replace(&mut key_written, true) {
                        let (name, value) = key.header(uri.path());
                        http1::header(&mut head, name, value.as_bytes());
                    }
                    continue;
                }
            }
            http1::header(&mut head, name.as_str(), value.as_bytes());
        }
        http1::header(&mut head, header::HOST.as_str(), self.host.as_bytes());
        if upgrade {
            http1::header(&mut head, header::CONNECTION.as_str(), b"upgrade");
        }
        if let (Some(len), false) = (content_length, length_written) {
            http1::content_length(&mut head, len);
        }
        if let (Some(key), false) = (&self.api_key, key_written) {
            let (name, value) = key.header(uri.path());
            http1::header(&mut head, name, value.as_bytes());
        }
        let has_length = content_length.is_some() || headers.contains_key(header::CONTENT_LENGTH);
        (head, http1::request_framing(method, length, has_length))
    }
}

/// The `Host` value for an upstream: its host, and the port when it is not the scheme's
/// default (as browsers and hyper-util's client send it).
fn host_header(scheme: &Scheme, authority: &Authority) -> Option<HeaderValue> {
    let default_port = match scheme.as_str() {
        "https" => 443,
        _ => 80,
    };
    let host = match authority.port_u16() {
        Some(port) if port != default_port => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    HeaderValue::try_from(host).ok()
}

/// The `Authorization` value for the key in the environment variable `env_name`; `section`
/// names the config section for error messages.
fn upstream_key(
    section: &'static str,
    env_name: Option<&str>,
) -> Result<Option<ApiKey>, UpstreamInitError> {
    let Some(name) = env_name else {
        return Ok(None);
    };
    let key =
        std::env::var(name).map_err(|_| UpstreamInitError::MissingKey(section, name.to_owned()))?;
    ApiKey::new(key.trim())
        .map(Some)
        .ok_or_else(|| UpstreamInitError::BadKey(section, name.to_owned()))
}

/// Where a client's request goes on the upstream, as what is appended to the base URL's
/// path: the client's path, less a `/v1` that both ends the base and starts the path
/// (counted once), and the query as it is.
fn target<'a>(base: &str, uri: &'a Uri) -> (&'a str, Option<&'a str>) {
    let path = uri.path();
    let path = match base.ends_with("/v1") {
        true if path == "/v1" || path.starts_with("/v1/") => &path[3..],
        _ => path,
    };
    (path, uri.query())
}

/// What the upstream answered a request to switch protocols.
pub enum Upgrade {
    /// 101: the head for the client (its `Upgrade` and `Connection` kept, as the client's
    /// handshake needs them), and the upstream connection, which now carries the new
    /// protocol.
    Switched(Response<()>, Tunnel),
    /// Any other answer: the client's as it is.
    Refused(Response<ProxyBody>),
}

/// The proxy's failure to get an answer, by whose fault.
fn sent(error: SendError) -> ProxyError {
    match error {
        SendError::Client(e) => ProxyError::client_body(e),
        SendError::Upstream(e) => ProxyError::UpstreamUnreachable(e),
    }
}

/// Removes the hop-by-hop headers of a 101 but `Upgrade`, and says `Connection: upgrade`
/// whatever else the upstream's `Connection` named.
fn strip_hop_by_hop_but_upgrade(headers: &mut HeaderMap) {
    let upgrade = headers.remove(header::UPGRADE);
    strip_hop_by_hop(headers);
    if let Some(upgrade) = upgrade {
        headers.insert(header::UPGRADE, upgrade);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Removes hop-by-hop headers, including any named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named = connection_named(headers);
    // One pass over the few headers present rather than a lookup for every name that
    // might be: most messages carry none of them.
    let present: Vec<HeaderName> = headers
        .keys()
        .filter(|name| is_hop_by_hop(name, &named))
        .cloned()
        .collect();
    for name in present {
        headers.remove(name);
    }
}

/// The header names a `Connection` header lists.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    // Most messages carry no `Connection`: a pass over the few names present costs less
    // than the lookup, which hashes the name.
    if !headers.keys().any(|name| name == header::CONNECTION) {
        return Vec::new();
    }
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// Hop-by-hop headers (RFC 9110 section 7.6.1) plus `expect`, and those `Connection`
/// names: they describe one connection, not the message, so they never cross the proxy.
/// (`host` is set anew for the upstream.) Asked for every header of every request and
/// answer, so the standard names are one match on their tag rather than a list compared
/// in turn.
fn is_hop_by_hop(name: &HeaderName, named: &[HeaderName]) -> bool {
    let standard = matches!(
        *name,
        header::CONNECTION
            | header::PROXY_AUTHENTICATE
            | header::PROXY_AUTHORIZATION
            | header::TE
            | header::TRAILER
            | header::TRANSFER_ENCODING
            | header::UPGRADE
            | header::EXPECT
    );
    standard || HOP_BY_HOP_OTHER.contains(name) || named.contains(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upstream URL a client's `uri` maps to under the base URL `base`.
    fn joined(base: &str, uri: &str) -> String {
        let uri: Uri = uri.parse().unwrap();
        let (path, query) = target(base, &uri);
        match query {
            Some(query) => format!("{base}{path}?{query}"),
            None => format!("{base}{path}"),
        }
    }

    #[test]
    fn v1_counted_once() {
        assert_eq!(joined("http://h/v1", "/v1/models"), "http://h/v1/models");
        assert_eq!(
            joined("http://h/v1", "/v1/chat/completions?x=1"),
            "http://h/v1/chat/completions?x=1"
        );
    }

    #[test]
    fn path_appended_to_base_without_v1() {
        assert_eq!(
            joined("http://h:8000", "/v1/models"),
            "http://h:8000/v1/models"
        );
        assert_eq!(
            joined("https://openrouter.ai/api/v1", "/v1/models"),
            "https://openrouter.ai/api/v1/models"
        );
        assert_eq!(joined("http://h/v1", "/models"), "http://h/v1/models");
        assert_eq!(joined("http://h/v1", "/v1beta/x"), "http://h/v1/v1beta/x");
    }

    /// The head `upstream` writes for `headers`, as text.
    fn head_of(upstream: &Upstream, headers: &HeaderMap, length: Option<u64>) -> String {
        let uri = "/v1/chat/completions?x=1".parse().unwrap();
        let (mut head, framing) = upstream.head(&Method::POST, &uri, headers, length, false);
        http1::end_head(&mut head, framing);
        String::from_utf8(head).unwrap()
    }

    fn upstream(key: Option<&'static str>) -> Upstream {
        let key = key.and_then(|k| ApiKey::new(k.strip_prefix("Bearer ").unwrap_or(k)));
        Upstream::build(
            &Config::default(),
            "http://up:8000/api/v1",
            Duration::from_secs(1),
            key,
        )
        .unwrap()
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-secret-hop"),
        );
        headers.insert("x-secret-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::HOST, HeaderValue::from_static("proxy:8080"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        headers.insert("x-session-id", HeaderValue::from_static("s1"));
        assert_eq!(
            head_of(&upstream(None), &headers, None),
            "POST /api/v1/chat/completions?x=1 HTTP/1.1\r\nauthorization: Bearer k\r\nx-session-id: s1\r\n\
             host: up:8000\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn every_hop_by_hop_header_is_stripped_and_no_other() {
        let hop = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "expect",
        ];
        let kept = [
            "content-type",
            "content-length",
            "x-keep-alive",
            "authorization",
        ];
        let mut headers = HeaderMap::new();
        for name in hop.iter().chain(&kept) {
            headers.insert(*name, HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        let mut kept = kept.to_vec();
        kept.sort_unstable();
        assert_eq!(left, kept);
    }

    #[test]
    fn an_upgrade_keeps_its_upgrade_header_and_says_connection_upgrade() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("sec-websocket-key", HeaderValue::from_static("k=="));
        headers.insert("sec-websocket-version", HeaderValue::from_static("13"));
        let uri = "/v1/responses".parse().unwrap();
        let (mut head, framing) = upstream(None).head(&Method::GET, &uri, &headers, Some(0), true);
        http1::end_head(&mut head, framing);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /api/v1/responses HTTP/1.1\r\nupgrade: websocket\r\nsec-websocket-key: k==\r\n\
             sec-websocket-version: 13\r\nhost: up:8000\r\nconnection: upgrade\r\n\r\n"
        );
    }

    #[test]
    fn headers_keep_the_clients_order_and_repeated_values() {
        let mut headers = HeaderMap::new();
        headers.insert("x-b", HeaderValue::from_static("1"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.append("x-a", HeaderValue::from_static("3"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert_eq!(
            head_of(&upstream(None), &headers, Some(0)),
            "POST /api/v1/chat/completions?x=1 HTTP/1.1\r\nx-b: 1\r\nx-a: 2\r\nx-a: 3\r\naccept: */*\r\n\
             host: up:8000\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn length_and_injected_key_replace_the_clients_in_place() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer client"),
        );
        headers.insert("x-a", HeaderValue::from_static("1"));
        headers.insert("x-api-key", HeaderValue::from_static("client"));
        headers.insert("api-key", HeaderValue::from_static("client"));
        assert_eq!(
            head_of(&upstream(Some("Bearer injected")), &headers, Some(12)),
            "POST /api/v1/chat/completions?x=1 HTTP/1.1\r\ncontent-length: 12\r\nauthorization: Bearer injected\r\n\
             x-a: 1\r\nhost: up:8000\r\n\r\n"
        );
        // A key sent only as `x-api-key` gives its place to the injected one.
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static("client"));
        headers.insert("x-a", HeaderValue::from_static("1"));
        assert_eq!(
            head_of(&upstream(Some("Bearer injected")), &headers, None),
            "POST /api/v1/chat/completions?x=1 HTTP/1.1\r\nauthorization: Bearer injected\r\nx-a: 1\r\n\
             host: up:8000\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        // Without them from the client, they follow Host.
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("1"));
        assert_eq!(
            head_of(&upstream(Some("Bearer injected")), &headers, Some(12)),
            "POST /api/v1/chat/completions?x=1 HTTP/1.1\r\nx-a: 1\r\nhost: up:8000\r\n\
             content-length: 12\r\nauthorization: Bearer injected\r\n\r\n"
        );
    }

    #[test]
    fn an_injected_key_goes_to_the_messages_api_as_x_api_key() {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static("proxy-client-key"));
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let uri: Uri = "/v1/messages?beta=true".parse().unwrap();
        let (head, _) =
            upstream(Some("Bearer injected")).head(&Method::POST, &uri, &headers, Some(2), false);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /api/v1/messages?beta=true HTTP/1.1\r\nx-api-key: injected\r\n\
             anthropic-version: 2023-06-01\r\nhost: up:8000\r\ncontent-length: 2\r\n"
        );
        let uri: Uri = "/v1/messages/count_tokens".parse().unwrap();
        let (head, _) = upstream(Some("Bearer injected")).head(
            &Method::POST,
            &uri,
            &HeaderMap::new(),
            Some(2),
            false,
        );
        assert!(String::from_utf8(head)
            .unwrap()
            .contains("\r\nx-api-key: injected\r\n"));
    }
}
