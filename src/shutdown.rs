//! Graceful shutdown, as every open connection sees it. On SIGINT/SIGTERM the server
//! stops accepting and says *draining*: an HTTP connection finishes its request in flight
//! and closes, a WebSocket of Codex's Responses API, bridged or relayed, finishes its
//! response in flight and says goodbye (1001), and another relayed WebSocket, which has
//! no request to finish, goes on. When the grace period is over the server says
//! *closing*: what is still switched to another protocol closes now, both sides
//! cleanly, instead of being cut by the exit.
//!
//! Each connection holds a [`Watch`] until it ends, so the server sees the last one go.

use tokio::sync::watch;

/// Where the shutdown is; ordered, as each phase includes the ones before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    Draining,
    Closing,
}

/// The server's side: it moves the phase on and waits for the connections to end.
pub struct Shutdown {
    phase: watch::Sender<Phase>,
    /// Held by connections switched to another protocol only: at the end of the grace
    /// period the server waits for these (they were told to close), not for HTTP
    /// requests still in flight, which the exit cuts.
    switched: watch::Sender<()>,
}

/// A connection's side: held for its life, and asked what to do.
pub struct Watch {
    phase: watch::Receiver<Phase>,
    /// Present for a switched connection (see [`Shutdown::switched`]).
    _switched: Option<watch::Receiver<()>>,
}

impl Default for Shutdown {
    fn default() -> Shutdown {
        Shutdown {
            phase: watch::Sender::new(Phase::Serving),
            switched: watch::Sender::new(()),
        }
    }
}

impl Shutdown {
    /// For an HTTP connection.
    pub fn watch(&self) -> Watch {
        Watch {
            phase: self.phase.subscribe(),
            _switched: None,
        }
    }

    /// For a connection switched to another protocol (relayed or bridged).
    pub fn watch_switched(&self) -> Watch {
        Watch {
            phase: self.phase.subscribe(),
            _switched: Some(self.switched.subscribe()),
        }
    }

    /// Connections finish what they are doing and close.
    pub fn drain(&self) {
        self.phase.send_replace(Phase::Draining);
    }

    /// The grace period is over: switched connections close now.
    pub fn close(&self) {
        self.phase.send_replace(Phase::Closing);
    }

    /// Completes once every connection has ended.
    pub async fn all_closed(&self) {
        self.phase.closed().await;
    }

    /// Whether every connection has ended.
    pub fn all_ended(&self) -> bool {
        self.phase.is_closed()
    }

    /// Completes once every switched connection has ended.
    pub async fn switched_closed(&self) {
        self.switched.closed().await;
    }
}

impl Watch {
    /// Completes once the server drains (at once if it already does).
    pub async fn draining(&mut self) {
        self.reached(Phase::Draining).await;
    }

    /// Whether the server drains (or closes) already.
    pub fn is_draining(&self) -> bool {
        *self.phase.borrow() >= Phase::Draining
    }

    /// Completes once the grace period is over (at once if it already is).
    pub async fn closing(&mut self) {
        self.reached(Phase::Closing).await;
    }

    async fn reached(&mut self, phase: Phase) {
        // The sender lives in the `App` the connection's task holds: it is never dropped
        // first. Were it dropped, nothing would ever be asked of the connection.
        if self.phase.wait_for(|&now| now >= phase).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_watch_taken_late_still_sees_the_phase_reached() {
        let shutdown = Shutdown::default();
        shutdown.drain();
        let mut late = shutdown.watch();
        assert!(completes(late.draining()).await);
        assert!(!completes(late.closing()).await, "draining is not closing");
    }

    /// Whether `future` completes within a moment.
    async fn completes(future: impl std::future::Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), future)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn the_server_waits_for_switched_connections_apart() {
        let shutdown = Shutdown::default();
        let http = shutdown.watch();
        let switched = shutdown.watch_switched();
        assert!(!completes(shutdown.switched_closed()).await);
        drop(switched);
        assert!(completes(shutdown.switched_closed()).await);
        assert!(!completes(shutdown.all_closed()).await);
        assert!(!shutdown.all_ended());
        drop(http);
        assert!(completes(shutdown.all_closed()).await);
        assert!(shutdown.all_ended());
    }
}
