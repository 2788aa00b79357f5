//! Listening: accept connections (at most `server.max_connections` at once), serve
//! HTTP/1.1 on each, and on SIGINT/SIGTERM stop accepting and let in-flight requests
//! finish (bounded by the grace period). A connection switched to another protocol (see
//! `upgrade`) keeps its place under the cap while it is relayed or bridged, and is closed
//! cleanly at shutdown (see `shutdown`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::app::App;
use crate::body::ProxyBody;
use crate::memory_trim;
use crate::router;

pub mod http1;

/// Binds, prints the start-up line and serves until a shutdown signal.
pub async fn run(app: App) -> std::io::Result<()> {
    let addr = app
        .config
        .listen_addr()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    eprintln!("listening on http://{local} ({})", app.upstream.base_url());
    let grace = app.config.shutdown_grace();
    let app = Arc::new(app);
    let models = tokio::spawn(keep_models(Arc::clone(&app)));
    serve(listener, Arc::clone(&app), shutdown_signal(), grace).await;
    models.abort();
    if let Some(cache) = &app.checkpoints {
        cache.save_models(&app.models).await;
    }
    Ok(())
}

/// What the proxy learns of the models outlives it, in the checkpoint store.
async fn keep_models(app: Arc<App>) {
    if let Some(cache) = &app.checkpoints {
        cache.keep_models(&app.models).await;
    }
}

/// Serves connections from `listener` until `shutdown` completes, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    // The connection waits this long for each request head, from the end of the last
    // answer: it is the keep-alive idle timeout, and it also drops a client that opens a
    // connection and never finishes its headers.
    let keep_alive = app.config.keep_alive_timeout();
    // Each connection holds a watch of the shutdown until it ends, so the server sees the
    // last one go.
    let slots = Arc::new(Semaphore::new(app.config.server.max_connections));
    let trimmer = start_memory_trim(&app, &slots);
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
                    let watch = app.shutdown.watch();
                    let handler = handler(&app, slot);
                    tokio::spawn(http1::conn::serve(stream, keep_alive, watch, handler));
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
    app.shutdown.drain();
    tokio::select! {
        () = app.shutdown.all_closed() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(grace) => {
            // Switched connections close now, each side with a close of its own; HTTP
            // requests still in flight are cut by the exit.
            app.shutdown.close();
            let closed = tokio::time::timeout(SWITCHED_CLOSE, app.shutdown.switched_closed());
            let _ = closed.await;
            if app.shutdown.all_ended() {
                tracing::info!("all connections closed");
            } else {
                tracing::warn!("grace period over; exiting with requests in flight");
            }
        }
    }
}

/// Starts the timer that returns freed heap to the OS after a burst, where the build can.
fn start_memory_trim(
    app: &Arc<App>,
    slots: &Arc<Semaphore>,
) -> Option<tokio::task::JoinHandle<()>> {
    let every = app
        .config
        .memory_trim_interval()
        .filter(|_| memory_trim::AVAILABLE)?;
    let max = app.config.server.max_connections;
    let (slots, load_app, app) = (Arc::clone(slots), Arc::clone(app), Arc::clone(app));
    let load = move || memory_trim::Load {
        connections: max.saturating_sub(slots.available_permits()),
        requests: load_app.metrics.requests(),
    };
    let trimmed = move || app.metrics.memory_trim();
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

/// Answers each request of a connection; `slot` is the connection's place under
/// `server.max_connections`, which a switched connection keeps for as long as it is
/// relayed.
fn handler(
    app: &Arc<App>,
    slot: Arc<OwnedSemaphorePermit>,
) -> impl FnMut(http::Request<http1::RequestBody>) -> Handling {
    let app = Arc::clone(app);
    move |request| Box::pin(router::handle(Arc::clone(&app), request, Arc::clone(&slot)))
}

/// One request's handling, boxed: the connection's task holds a pointer to it while it
/// runs, and nothing once it has answered. The whole request path inline is 23.6 KB in a
/// debug build, which every idle keep-alive connection's task would hold; boxed, each
/// request pays one allocation.
type Handling = Pin<Box<dyn Future<Output = http::Response<ProxyBody>> + Send>>;

/// Small SSE events must leave as soon as they are written, not wait for Nagle.
fn stream_nodelay(stream: tokio::net::TcpStream, peer: SocketAddr) -> tokio::net::TcpStream {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    stream
}

async fn shutdown_signal() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Every request's handling is built, moved into its box and moved again by each
    /// future that awaits it, so the rare paths (compaction, upgrades, Codex's endpoints,
    /// traces) are boxed where they are taken. One awaited inline grows it by its whole
    /// state: the traced path's wrapper alone made it 10.7 KB (4.9 KB without).
    #[test]
    fn a_request_s_handling_stays_small() {
        let app = Arc::new(App::new(Config::default()).unwrap());
        let slot = Arc::new(Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap());
        let request = http::Request::new(http1::request_body::RequestBody::empty());
        let handling = handler(&app, slot)(request);
        let size = std::mem::size_of_val(&*handling);
        assert!(size <= 6 * 1024, "a request's handling is {size} bytes");
    }
}
