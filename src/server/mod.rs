//! Listening: accept connections (at most `server.max_connections` at once), serve
//! HTTP/1.1 on each, and on SIGINT/SIGTERM stop accepting and let in-flight requests
//! finish (bounded by the grace period). A connection switched to another protocol (see
//! `upgrade`) keeps its place under the cap while it is relayed or bridged, and is closed
//! cleanly at shutdown (see `shutdown`).
//!
//! The HTTP/1.1 server side is the proxy's own, in place of hyper's: lean by design, since
//! every idle keep-alive connection costs what it holds. An idle connection holds its
//! socket, its task and one timer, and no buffer; a request costs one read buffer, its
//! header map, and one `writev` for its answer's head (with the first frame of the body
//! when that is ready). The request body reads itself from the socket, in the
//! connection's task, when its reader polls it: no channel, no task of its own. Files
//! follow the connection: [`conn`] (the phases), [`head`] (parse and limits),
//! [`request_body`] (its framing decoded), [`response`] (the answer's head and framing),
//! [`upgrade`] (the socket handed over after a 101), [`io`] (the socket as they share it);
//! what frames a message on either side is [`crate::http1`]'s.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::body::ProxyBody;
use crate::memory_trim;
use crate::shutdown::Shutdown;

pub mod conn;
pub mod head;
mod io;
pub mod request_body;
mod response;
pub mod upgrade;

pub use request_body::RequestBody;

/// What the server serves: each request's handling, and the measure of load the memory
/// trimmer reads. The server knows nothing of what a request is for.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request; `slot` is its connection's place under `max_connections`,
    /// which a switched connection keeps for as long as it is relayed.
    fn handle(
        &self,
        request: http::Request<RequestBody>,
        slot: Arc<OwnedSemaphorePermit>,
    ) -> Handling;
    /// Requests handled so far (a bridged WebSocket's among them).
    fn requests(&self) -> u64;
    /// Freed heap went back to the OS.
    fn memory_trimmed(&self);
}

/// How the server serves.
pub struct Settings {
    /// How long a connection waits for each request head, from the end of the last answer.
    pub keep_alive: Duration,
    pub max_connections: usize,
    /// How long in-flight requests get to finish after the shutdown signal.
    pub grace: Duration,
    /// How often freed heap may go back to the OS after a burst (`None`: never).
    pub memory_trim: Option<Duration>,
}

/// Serves connections from `listener` until `shutdown` completes, then drains.
/// Each connection holds a watch of `connections` until it ends, so the server sees the
/// last one go.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    settings: &Settings,
    connections: &Shutdown,
    shutdown: impl Future<Output = ()>,
) {
    // The keep-alive idle timeout also drops a client that opens a connection and never
    // finishes its headers.
    let keep_alive = settings.keep_alive;
    let slots = Arc::new(Semaphore::new(settings.max_connections));
    let trimmer = start_memory_trim(settings, &handler, &slots);
    let mut full = false;
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            Some(slot) = connection_slot(&slots, &mut full) => slot,
            () = &mut shutdown => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // The slot is free again when the connection ends, or its relay if it
                    // is switched to another protocol.
                    let slot = Arc::new(slot);
                    let stream = stream_nodelay(stream, peer);
                    let watch = connections.watch();
                    let handler = handling(&handler, slot);
                    tokio::spawn(conn::serve(stream, keep_alive, watch, handler));
                }
                // Out of file descriptors and the like: pause instead of spinning.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if let Some(trimmer) = trimmer {
        trimmer.abort();
    }
    tracing::info!("shutting down: draining in-flight requests");
    connections.drain();
    tokio::select! {
        () = connections.all_closed() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(settings.grace) => {
            // Switched connections close now, each side with a close of its own; HTTP
            // requests still in flight are cut by the exit.
            connections.close();
            let closed = tokio::time::timeout(SWITCHED_CLOSE, connections.switched_closed());
            let _ = closed.await;
            if connections.all_ended() {
                tracing::info!("all connections closed");
            } else {
                tracing::warn!("grace period over; exiting with requests in flight");
            }
        }
    }
}

/// Starts the timer that returns freed heap to the OS after a burst, where the build can.
fn start_memory_trim<H: Handler>(
    settings: &Settings,
    handler: &Arc<H>,
    slots: &Arc<Semaphore>,
) -> Option<tokio::task::JoinHandle<()>> {
    let every = settings.memory_trim.filter(|_| memory_trim::AVAILABLE)?;
    let max = settings.max_connections;
    let (slots, measured, told) = (Arc::clone(slots), Arc::clone(handler), Arc::clone(handler));
    let load = move || memory_trim::Load {
        connections: max.saturating_sub(slots.available_permits()),
        requests: measured.requests(),
    };
    let trimmed = move || told.memory_trimmed();
    Some(tokio::spawn(memory_trim::run(every, load, trimmed)))
}

/// How long, past the grace period, connections switched to another protocol get to send
/// their close: a write to a socket, which a live peer takes at once.
const SWITCHED_CLOSE: Duration = Duration::from_secs(1);

/// A slot for one more connection, waiting for one to close when all are taken: new
/// connections then wait in the listen backlog, as at nginx's `worker_connections`.
/// `full` remembers that the cap was hit, so it is logged once per episode, not once
/// per connection let in. `None` only if the semaphore were closed, which it never is.
async fn connection_slot(slots: &Arc<Semaphore>, full: &mut bool) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        *full = false;
        return Some(slot);
    }
    if !std::mem::replace(full, true) {
        tracing::warn!("server.max_connections reached: new connections wait until one closes");
    }
    Arc::clone(slots).acquire_owned().await.ok()
}

/// Answers each request of a connection, which holds `slot` while it lives.
fn handling<H: Handler>(
    handler: &Arc<H>,
    slot: Arc<OwnedSemaphorePermit>,
) -> impl FnMut(http::Request<RequestBody>) -> Handling {
    let handler = Arc::clone(handler);
    move |request| handler.handle(request, Arc::clone(&slot))
}

/// One request's handling, boxed: the connection's task holds a pointer to it while it
/// runs, and nothing once it has answered. The whole request path inline is 23.6 KB in a
/// debug build, which every idle keep-alive connection's task would hold; boxed, each
/// request pays one allocation.
pub type Handling = Pin<Box<dyn Future<Output = http::Response<ProxyBody>> + Send>>;

/// Small SSE events must leave as soon as they are written, not wait for Nagle.
fn stream_nodelay(stream: tokio::net::TcpStream, peer: SocketAddr) -> tokio::net::TcpStream {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    stream
}

/// SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
