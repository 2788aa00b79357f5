//! Listening: accept connections, serve HTTP/1.1 on each, and on SIGINT/SIGTERM stop
//! accepting and let in-flight requests finish (bounded by the grace period).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

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
    serve(listener, Arc::new(app), shutdown_signal(), grace).await;
    Ok(())
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
        // A client that opens a connection and never finishes its headers is dropped.
        .header_read_timeout(Duration::from_secs(30));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let conn = builder.serve_connection(TokioIo::new(stream_nodelay(stream, peer)), service(&app));
                    tokio::spawn(graceful.watch(conn));
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
