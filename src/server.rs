//! Listening: accept connections (at most `server.max_connections` at once), serve
//! HTTP/1.1 on each, and on SIGINT/SIGTERM stop accepting and let in-flight requests
//! finish (bounded by the grace period).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::app::App;
use crate::router;

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
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // hyper starts this timer whenever a connection is ready for its next request
        // head: it is the keep-alive idle timeout, and it also drops a client that opens
        // a connection and never finishes its headers.
        .header_read_timeout(app.config.keep_alive_timeout());
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(app.config.server.max_connections));
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
                    let conn = builder.serve_connection(TokioIo::new(stream_nodelay(stream, peer)), service(&app));
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        // The slot is free again when the connection ends.
                        let _slot = slot;
                        conn.await
                    });
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
    tracing::info!("shutting down: draining in-flight requests");
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(grace) => tracing::warn!("grace period over; exiting with requests in flight"),
    }
}

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

fn service(
    app: &Arc<App>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = hyper::Response<crate::body::ProxyBody>,
    Error = std::convert::Infallible,
    Future = impl Future + Send,
> + Clone {
    let app = Arc::clone(app);
    service_fn(move |request| router::handle(Arc::clone(&app), request))
}

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
