//! The seam of the places checkpoints are kept: this process's memory
//! ([`super::memory`]), a file on this host ([`super::embedded`], the default, which a
//! restart resumes from), or Redis ([`super::redis`], shared by replicas).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;

use super::hash::{Key, Partition, Tenant};
use super::seal::AtRest;
use super::store::{Backend, StoreFuture};
use super::Checkpoint;

/// What a store holds of checkpoints, counted without opening any.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Tally {
    pub checkpoints: u64,
    pub bytes: u64,
    pub tenants: u64,
}

pub trait CheckpointStore: Send + Sync {
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
    /// hash of the first `i` messages), with that `i`; opened with the request's seal
    /// when the store keeps it as bytes.
    fn longest<'a>(
        &'a self,
        partition: Partition,
        prefixes: &'a [u128],
        rest: AtRest<'a>,
    ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>>;

    /// Stores `checkpoint`, dropping `replaces` (the shorter checkpoint of the same
    /// conversation it extends), which no request would match again; sealed with the
    /// request's seal when the store keeps it as bytes.
    fn put<'a>(
        &'a self,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
        rest: AtRest<'a>,
    ) -> StoreFuture<'a, ()>;

    /// Checkpoints held, and their bytes by [`Checkpoint::size`], as this process knows
    /// them, for the metrics.
    fn held(&self) -> (usize, usize);

    /// What the store holds in all (it may count what other processes put).
    fn tally(&self) -> StoreFuture<'_, Tally>;

    /// Drops every checkpoint, or `tenant`'s only. Returns the number dropped.
    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64>;
}
