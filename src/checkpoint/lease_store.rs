//! The seam of a store shared by several processes ([`super::redis`]) as the place that
//! settles which of them makes a summariser call several need at once: a lease on the
//! call, renewed while it runs, and its result left for the others. A store no other
//! process shares has no such job: the process's own callers share one call anyway
//! ([`super::coordination::flight::Flights`]).

use std::time::Duration;

use super::store::StoreFuture;

/// What is known of a summariser call that another process may be making.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    /// Its result, as [`LeaseStore::settle`] left it.
    Done(Vec<u8>),
    /// Someone holds it and has not finished.
    Running,
    /// No one holds it and no result is left: the caller may claim it.
    Free,
}

pub trait LeaseStore: Send + Sync {
    /// Claims the summariser call `flight` for `holder` for `lease`, or extends the claim
    /// `holder` already has. `false`: another process holds it.
    fn claim(&self, flight: u128, holder: u128, lease: Duration) -> StoreFuture<'_, bool>;

    /// Leaves the result of `flight` for `keep`, for the processes waiting on it or coming
    /// for it later, and releases the claim.
    fn settle(
        &self,
        flight: u128,
        holder: u128,
        result: Vec<u8>,
        keep: Duration,
    ) -> StoreFuture<'_, ()>;

    /// What is known of `flight`.
    fn peek(&self, flight: u128) -> StoreFuture<'_, Peek>;

    /// Drops every claim and every result left.
    fn clear_leases(&self) -> StoreFuture<'_, ()>;
}
