//! Keep-alive connections to one upstream, reused across requests.
//!
//! Each TCP (or TLS) connection is a task of its own running hyper's HTTP/1 client
//! connection; the pool keeps the `SendRequest` handles of the idle ones. A request takes
//! the most recently used idle handle (its socket is the likeliest to still be open),
//! else dials. The handle travels with the response body and goes back to the pool the
//! moment that body ends, from inside the body itself: no task, channel or timer per
//! request, which is what hyper-util's general-purpose pool costs.
//!
//! Idle connections are bounded in number and age. Age is checked whenever the pool is
//! used rather than by a reaper task: an idle proxy holds at most [`MAX_IDLE`] sockets,
//! which the upstream usually closes on its own, and a closed one is dropped on sight.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use crate::body::ProxyBody;
use crate::error::BoxError;

/// Idle connections kept at most; more are closed when they fall idle. Well above the
/// concurrency one proxy sees from its clients, so a busy proxy does not re-dial.
const MAX_IDLE: usize = 512;
/// An idle connection older than this is closed rather than reused: upstreams and
/// middleboxes drop quiet connections after a minute or two, and a request sent on one
/// they already dropped fails.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

pub struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// Scheme and authority of the upstream: what the connector dials.
    origin: Uri,
    /// Idle connections, the most recently used last.
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    sender: SendRequest<ProxyBody>,
    since: Instant,
}

impl Pool {
    pub fn new(connector: HttpsConnector<HttpConnector>, origin: Uri) -> Arc<Self> {
        Arc::new(Self {
            connector,
            origin,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Sends `request` (origin-form URI, `Host` set) on an idle connection, else on a new
    /// one. The response's body hands the connection back when it ends.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, BoxError> {
        while let Some(mut sender) = self.checkout() {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.lease(response, sender)),
                Err(mut e) => match e.take_message() {
                    // The connection closed before a byte of the request was written (the
                    // upstream dropped it while it sat idle): the request is untouched,
                    // so it goes out on the next connection as if nothing happened.
                    Some(unsent) => {
                        tracing::debug!(error = %e.error(), "idle upstream connection was closed; retrying on another");
                        request = unsent;
                    }
                    // Written, at least in part: only the client may decide to repeat it.
                    None => return Err(e.into_error().into()),
                },
            }
        }
        let mut sender = self.connect().await?;
        let response = sender.send_request(request).await?;
        Ok(self.lease(response, sender))
    }

    async fn connect(&self) -> Result<SendRequest<ProxyBody>, BoxError> {
        let io = self.connector.clone().call(self.origin.clone()).await?;
        let (sender, connection) = http1::handshake(io).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    fn lease(
        self: &Arc<Self>,
        response: Response<Incoming>,
        sender: SendRequest<ProxyBody>,
    ) -> Response<PooledBody> {
        response.map(|inner| PooledBody {
            inner,
            lease: Some((Arc::clone(self), sender)),
        })
    }

    /// The most recently used idle connection that can take a request now.
    fn checkout(&self) -> Option<SendRequest<ProxyBody>> {
        let mut idle = self.lock();
        while let Some(entry) = idle.pop() {
            if entry.since.elapsed() > IDLE_TIMEOUT {
                // The rest are older still.
                idle.clear();
                return None;
            }
            if entry.sender.is_ready() {
                return Some(entry.sender);
            }
            // Closed by the upstream: dropping the handle lets its task finish.
        }
        None
    }

    /// Takes back a connection whose response has ended, unless it cannot take another
    /// request (closed, or still sending a request body the upstream answered early);
    /// dropping the handle then closes it once that exchange is over.
    fn checkin(&self, sender: SendRequest<ProxyBody>) {
        if !sender.is_ready() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock();
        let expired = idle
            .iter()
            .take_while(|e| now.duration_since(e.since) > IDLE_TIMEOUT)
            .count();
        idle.drain(..expired);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { sender, since: now });
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

/// An upstream response body that returns its connection to the pool when it ends. A
/// body dropped before its end (the client went away) takes the connection with it:
/// hyper closes a connection whose response was not read to the end.
pub struct PooledBody {
    inner: Incoming,
    lease: Option<(Arc<Pool>, SendRequest<ProxyBody>)>,
}

impl PooledBody {
    fn release(&mut self) {
        if let Some((pool, sender)) = self.lease.take() {
            pool.checkin(sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        match &frame {
            Poll::Ready(None) => self.release(),
            Poll::Ready(Some(Err(_))) => self.lease = None,
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    /// hyper stops polling a body whose length says it is complete, so the end is often
    /// seen here rather than as a last `None` frame.
    fn drop(&mut self) {
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// A raw upstream that answers every request with `ANSWER` and counts connections.
    /// With `close_after_answer`, it closes each connection right after answering,
    /// without saying so (no `Connection: close`), the way an upstream's idle timeout
    /// does.
    async fn upstream(close_after_answer: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    // Requests here have no body, so one read with the blank line is one request.
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        if !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                        if stream.write_all(ANSWER).await.is_err() || close_after_answer {
                            return;
                        }
                    }
                });
            }
        });
        (origin.parse().unwrap(), accepted)
    }

    fn pool(origin: Uri) -> Arc<Pool> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Pool::new(https, origin)
    }

    fn get(origin: &Uri) -> Request<ProxyBody> {
        Request::builder()
            .uri("/x")
            .header(http::header::HOST, origin.authority().unwrap().as_str())
            .body(crate::body::empty())
            .unwrap()
    }

    async fn send_and_read(pool: &Arc<Pool>, origin: &Uri) -> Bytes {
        let response = pool.send(get(origin)).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_has_ended() {
        let (origin, accepted) = upstream(false).await;
        let pool = pool(origin.clone());
        for _ in 0..20 {
            assert_eq!(send_and_read(&pool, &origin).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_does_not_return_the_connection() {
        let (origin, _) = upstream(false).await;
        let pool = pool(origin.clone());
        let response = pool.send(get(&origin)).await.unwrap();
        drop(response);
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn idle_connections_the_upstream_closed_are_replaced_transparently() {
        let (origin, accepted) = upstream(true).await;
        let pool = pool(origin.clone());
        for i in 0..20 {
            assert_eq!(send_and_read(&pool, &origin).await, "ok", "request {i}");
            // Alternate between finding the close already seen and racing it.
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 20);
    }
}
