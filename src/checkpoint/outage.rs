//! What a store's failure costs: nothing but a line in the log. Each operation runs within
//! the store's time limit; an error is counted, an outage is logged once when it starts and
//! once when it ends and shown at `/healthz`, and the store is left alone for a second
//! before it is tried again, so that a Redis that comes back is used again without a
//! restart. A write to the embedded store's file that is only late is no outage (see
//! [`Guard::write_failed`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::store::{render, Backend, StoreError};

/// How long an unreachable store is left alone before it is tried again.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Lookups and errors of one backend, for the metrics.
#[derive(Debug, Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub errors: AtomicU64,
}

/// A store that failed, since when, and why.
#[derive(Debug)]
struct Outage {
    since: Instant,
    retry_at: Instant,
    reason: String,
}

/// The state of the configured store, for `/healthz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Up,
    /// Out of reach since this long ago: requests are served from memory.
    Degraded {
        for_secs: u64,
        reason: String,
    },
}

/// The configured store's time limit, its outage, and its counters.
pub(in crate::checkpoint) struct Guard {
    backend: Backend,
    timeout: Duration,
    outage: Mutex<Option<Outage>>,
    pub counters: Counters,
}

impl Guard {
    pub fn new(backend: Backend, timeout: Duration) -> Guard {
        Guard {
            backend,
            timeout,
            outage: Mutex::new(None),
            counters: Counters::default(),
        }
    }

    /// Runs a store operation within the store's time limit.
    pub async fn bounded<T>(
        &self,
        operation: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.timeout, operation).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                backend: self.backend.as_str(),
                after: self.timeout,
            }),
        };
        if result.is_ok() {
            self.recovered();
        }
        result
    }

    /// Whether the store may be asked: up, or down for long enough to be tried again.
    pub fn reachable(&self) -> bool {
        let outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        outage.as_ref().is_none_or(|o| Instant::now() >= o.retry_at)
    }

    /// Counts and logs a store error; an outage is logged when it starts, not on every
    /// request it costs. An unreadable value is an error of that value, not an outage.
    pub fn failed(&self, error: &StoreError) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        if matches!(error, StoreError::Corrupt { .. }) {
            tracing::warn!(
                error = %render(error),
                "a stored value was unreadable and is ignored (a miss)"
            );
            return;
        }
        let now = Instant::now();
        let mut outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        match outage.as_mut() {
            Some(o) => o.retry_at = now + RETRY_AFTER,
            None => {
                let reason = render(error);
                tracing::warn!(
                    backend = self.backend.as_str(),
                    error = %reason,
                    "the checkpoint store is out of reach: serving from memory until it is back"
                );
                *outage = Some(Outage {
                    since: now,
                    retry_at: now + RETRY_AFTER,
                    reason,
                });
            }
        }
    }

    /// Counts and logs a write that failed. A write to the embedded store's file that only
    /// outlasted the time limit is no outage: its blocking thread goes on and commits it
    /// (the request only stopped waiting), and lookups, which a write does not hold up in
    /// WAL mode, still answer. Left alone for a second instead, the store would give no
    /// conversation its checkpoint for that second, having none in memory: every turn in
    /// it would be compacted anew, and the first one after resumed from an older
    /// checkpoint, each a rewrite of the prompt the upstream had cached.
    pub fn write_failed(&self, error: &StoreError) {
        let late = self.backend == Backend::Embedded && matches!(error, StoreError::Timeout { .. });
        if late {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                backend = self.backend.as_str(),
                error = %render(error),
                "a write to the checkpoint store is late: it lands in the background"
            );
        } else {
            self.failed(error);
        }
    }

    fn recovered(&self) {
        let mut outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(o) = outage.take() {
            tracing::info!(
                backend = self.backend.as_str(),
                after_secs = o.since.elapsed().as_secs(),
                "the checkpoint store is back"
            );
        }
    }

    pub fn health(&self) -> Health {
        match &*self.outage.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Health::Up,
            Some(outage) => Health::Degraded {
                for_secs: outage.since.elapsed().as_secs(),
                reason: outage.reason.clone(),
            },
        }
    }
}
