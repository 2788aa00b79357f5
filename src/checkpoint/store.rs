//! The one seam every place checkpoints are kept fills: this process's memory
//! ([`super::memory`]), a file on this host ([`super::embedded`], the default, which a
//! restart resumes from), or Redis ([`super::redis`], shared by replicas). Besides the
//! checkpoints, a store keeps the windows and token-count calibration learned from the
//! upstream, and, when it is shared, settles which replica makes a summariser call that
//! several need at once.
//!
//! Every method that may leave the process returns a future and an error that keeps its
//! cause; [`super::Checkpoints`] decides what an error costs (nothing: it falls back to
//! memory, and says so once per outage).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::hash::{Partition, Tenant};
use super::Checkpoint;
use crate::model_record::ModelRecord;

/// A checkpoint's address: the hash of the client's message prefix it replaces, within a
/// partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub partition: Partition,
    pub prefix: u128,
}

/// Which kind of store: the label of its metrics and of `/healthz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Memory,
    Embedded,
    Redis,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Embedded => "embedded",
            Backend::Redis => "redis",
        }
    }
}

/// What a store operation failed on, kept until it is logged.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or answered with an error.
    #[error("{backend} store unavailable: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
    /// It did not answer in time.
    #[error("{backend} store did not answer within {after:?}")]
    Timeout {
        backend: &'static str,
        after: Duration,
    },
    /// It answered with something this version cannot read (written by another version,
    /// or damaged): treated as a miss by the caller, never served.
    #[error("{backend} store holds an unreadable value: {reason}")]
    Corrupt {
        backend: &'static str,
        reason: String,
    },
}

/// What is known of a summariser call that another process may be making.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    /// Its result, as [`Store::settle`] left it.
    Done(Vec<u8>),
    /// Someone holds it and has not finished.
    Running,
    /// No one holds it and no result is left: the caller may claim it.
    Free,
}

/// What a store holds, for `compaction-proxy cache stats`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub checkpoints: u64,
    pub bytes: u64,
    pub tenants: u64,
    pub models: u64,
}

pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

pub trait Store: Send + Sync {
    fn backend(&self) -> Backend;

    /// The store's own upkeep while the proxy serves (a shared store's subscription to
    /// what other replicas store, say), run as a background task from the start.
    fn upkeep(&self) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// Whether `partition` may have checkpoints, from this process's memory alone: the
    /// requests of tenants that never needed compaction make no round trip to the store,
    /// nor parse and hash their messages.
    fn may_hold(&self, partition: Partition) -> bool;

    /// Whether any tenant may have checkpoints, from memory: when none does, requests
    /// skip even the credential's hash.
    fn any(&self) -> bool;

    /// The checkpoint for the longest prefix among `prefixes` (where `prefixes[i]` is the
    /// hash of the first `i` messages), with that `i`.
    fn longest<'a>(
        &'a self,
        partition: Partition,
        prefixes: &'a [u128],
    ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>>;

    /// Stores `checkpoint`, dropping `replaces` (the shorter checkpoint of the same
    /// conversation it extends), which no request would match again.
    fn put(
        &self,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
    ) -> StoreFuture<'_, ()>;

    /// Checkpoints held, and their bytes by [`Checkpoint::size`], as this process knows
    /// them, for the metrics.
    fn held(&self) -> (usize, usize);

    /// Every model learned so far, to start from.
    fn models(&self) -> StoreFuture<'_, Vec<ModelRecord>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Keeps what was learned of one model.
    fn put_model(&self, _record: ModelRecord) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    /// Claims the summariser call `flight` for `holder` for `lease`, or extends the claim
    /// `holder` already has. `false`: another process holds it. A store no other process
    /// shares always grants it; the process's own callers share one call anyway.
    fn claim(&self, _flight: u128, _holder: u128, _lease: Duration) -> StoreFuture<'_, bool> {
        Box::pin(async { Ok(true) })
    }

    /// Leaves the result of `flight` for `keep`, for the processes waiting on it or coming
    /// for it later, and releases the claim.
    fn settle(
        &self,
        _flight: u128,
        _holder: u128,
        _result: Vec<u8>,
        _keep: Duration,
    ) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    /// What is known of `flight`.
    fn peek(&self, _flight: u128) -> StoreFuture<'_, Peek> {
        Box::pin(async { Ok(Peek::Free) })
    }

    /// What the store holds in all (it may count what other processes put).
    fn stats(&self) -> StoreFuture<'_, Stats>;

    /// Drops every checkpoint, or `tenant`'s only; learned models are kept unless all are
    /// cleared. Returns the number of checkpoints dropped.
    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64>;
}
