//! Single-flight: concurrent requests of one conversation that need the same summary wait
//! for one summariser call instead of each paying for their own. Within a process, they
//! share one future ([`Flights`]); across the processes sharing a store, one of them claims
//! the call for a short lease it renews while the call runs, and leaves the result in the
//! store for the others ([`across`]). A holder that dies stops renewing: its lease lapses
//! and a waiter takes the call over.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::checkpoint::codec::CodecError;
use crate::checkpoint::lease_store::{LeaseStore, Peek};
use crate::checkpoint::outage::Guard;
use crate::checkpoint::seal::{AtRest, Place};
use crate::checkpoint::store::render;

/// How long a claim lasts unless renewed: the longest a dead holder keeps others waiting.
const LEASE: Duration = Duration::from_secs(10);
/// How often a running holder renews its claim.
const RENEW_EVERY: Duration = Duration::from_secs(3);
/// How often a waiter looks for the result.
const POLL: Duration = Duration::from_millis(100);
/// How often a request that waits a moment for another process's result looks for it: a
/// poll's lag is time the request waits.
const BRIEF_POLL: Duration = Duration::from_millis(25);

/// An identity for this process's claims, unlikely to be any other's.
pub fn holder_id() -> u128 {
    let mut bytes = [0u8; 16];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        // No randomness: the process id and the time still tell replicas apart.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return nanos ^ (u128::from(std::process::id()) << 96);
    }
    u128::from_le_bytes(bytes)
}

/// How a flight's result is kept in a shared store.
pub(in crate::checkpoint) struct Sharing<T> {
    /// Names the kind of result in what its seal binds it to.
    pub label: &'static str,
    pub encode: fn(&T) -> Vec<u8>,
    pub decode: fn(&[u8]) -> Result<T, CodecError>,
    /// How long the result is left for the processes that come for it after the call.
    pub keep: Duration,
}

impl<T> Sharing<T> {
    /// The result a store's bytes hold for `flight`: `None` when they do not open with this
    /// request's seal or this build cannot read them.
    fn read(&self, rest: AtRest<'_>, flight: u128, bytes: Vec<u8>) -> Option<T> {
        let opened = rest
            .open(&Place::Flight(self.label, flight), bytes)
            .and_then(|clear| (self.decode)(&clear));
        match opened {
            Ok(result) => Some(result),
            Err(error) => {
                tracing::warn!(
                    error = %render(&error),
                    kind = self.label,
                    "a result shared by another replica was unreadable and is ignored"
                );
                None
            }
        }
    }
}

/// The shared store a flight across processes goes through: its leases, within the
/// cache's time limit, as `holder`.
#[derive(Clone, Copy)]
pub(in crate::checkpoint) struct Across<'a> {
    pub guard: &'a Guard,
    pub leases: &'a dyn LeaseStore,
    pub holder: u128,
    pub rest: AtRest<'a>,
}

/// Where a flight stands for this process, after one look at the store.
enum Stand<T> {
    /// Another process made its result.
    Done(T),
    /// Another process holds it.
    Running,
    /// This process claimed it: its work runs here, for every process.
    Claimed,
    /// The store failed, or left a result this build (or this request's seal) cannot
    /// read: the work runs here, unshared.
    Alone,
}

/// One look at `key` in the store, claiming it when no process holds it.
async fn stand<T>(via: Across<'_>, key: u128, sharing: &Sharing<T>) -> Stand<T> {
    let Across {
        guard,
        leases,
        holder,
        rest,
    } = via;
    match guard.bounded(leases.peek(key)).await {
        Ok(Peek::Done(bytes)) => sharing
            .read(rest, key, bytes)
            .map_or(Stand::Alone, Stand::Done),
        Ok(Peek::Running) => Stand::Running,
        Ok(Peek::Free) => match guard.bounded(leases.claim(key, holder, LEASE)).await {
            Ok(true) => Stand::Claimed,
            // Claimed by another process since the look.
            Ok(false) => Stand::Running,
            Err(error) => {
                guard.failed(&error);
                Stand::Alone
            }
        },
        Err(error) => {
            guard.failed(&error);
            Stand::Alone
        }
    }
}

/// The result of `work` for `key`, made here or by the process that claimed it first, or
/// left by one that made it already. A store that fails along the way, or a result this
/// build (or this request's seal) cannot read, leaves this process to do the work itself:
/// a request is never kept waiting on a store that is gone.
pub(in crate::checkpoint) async fn across<T, F, Fut>(
    via: Across<'_>,
    key: u128,
    sharing: &Sharing<T>,
    work: F,
) -> T
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    loop {
        match stand(via, key, sharing).await {
            Stand::Done(result) => return result,
            Stand::Running => tokio::time::sleep(POLL).await,
            Stand::Claimed => return hold(via, key, sharing, work).await,
            Stand::Alone => return work().await,
        }
    }
}

/// What [`once`] did about a flight.
pub enum Share<T> {
    /// This process made the result (for the others too, when the store is shared).
    Made(T),
    /// Another process had made it: this one took it.
    Taken(T),
    /// Another process is making it; this one left it to them.
    Elsewhere,
}

impl<T> Share<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Share<U> {
        match self {
            Share::Made(result) => Share::Made(f(result)),
            Share::Taken(result) => Share::Taken(f(result)),
            Share::Elsewhere => Share::Elsewhere,
        }
    }
}

/// The result of `work` for `key`, made here unless another process made it already or is
/// making it now; unlike [`across`], a flight running elsewhere is not waited for. For
/// work that no request waits on (a compaction prepared ahead), which the process whose
/// request needs the result takes from the store then.
pub(in crate::checkpoint) async fn once<T, F, Fut>(
    via: Across<'_>,
    key: u128,
    sharing: &Sharing<T>,
    work: F,
) -> Share<T>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    match stand(via, key, sharing).await {
        Stand::Done(result) => Share::Taken(result),
        Stand::Running => Share::Elsewhere,
        Stand::Claimed => Share::Made(hold(via, key, sharing, work).await),
        Stand::Alone => Share::Made(work().await),
    }
}

/// Runs `work` for the flight `key` this process claimed, renewing the claim while it
/// runs, and leaves its result for the others.
async fn hold<T, F, Fut>(via: Across<'_>, key: u128, sharing: &Sharing<T>, work: F) -> T
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    let Across {
        guard,
        leases,
        holder,
        rest,
    } = via;
    let mut work = pin!(work());
    let mut renewing = true;
    let result = loop {
        tokio::select! {
            result = &mut work => break result,
            () = tokio::time::sleep(RENEW_EVERY), if renewing => {
                match guard.bounded(leases.claim(key, holder, LEASE)).await {
                    Ok(true) => {}
                    // Another process took the call over: this one still finishes its own.
                    Ok(false) => renewing = false,
                    Err(error) => guard.failed(&error),
                }
            }
        }
    };
    let settled = rest.seal(
        &Place::Flight(sharing.label, key),
        &(sharing.encode)(&result),
    );
    if let Err(error) = guard
        .bounded(leases.settle(key, holder, settled, sharing.keep))
        .await
    {
        guard.failed(&error);
    }
    result
}

/// The result another process made or is making for `key`, waiting for it while it runs;
/// `None` when no process has it, or the store cannot tell.
pub(in crate::checkpoint) async fn made_elsewhere<T>(
    via: Across<'_>,
    key: u128,
    sharing: &Sharing<T>,
) -> Option<T> {
    loop {
        match via.guard.bounded(via.leases.peek(key)).await {
            Ok(Peek::Done(bytes)) => return sharing.read(via.rest, key, bytes),
            Ok(Peek::Running) => tokio::time::sleep(POLL).await,
            Ok(Peek::Free) => return None,
            Err(error) => {
                via.guard.failed(&error);
                return None;
            }
        }
    }
}

/// Whether the flight `key` another process holds ends within `wait`: its result is left,
/// or its claim lapsed. `false` too when the store cannot tell.
pub(in crate::checkpoint) async fn ends_within(via: Across<'_>, key: u128, wait: Duration) -> bool {
    let ended = async {
        loop {
            match via.guard.bounded(via.leases.peek(key)).await {
                Ok(Peek::Running) => tokio::time::sleep(BRIEF_POLL).await,
                Ok(Peek::Done(_) | Peek::Free) => return true,
                Err(error) => {
                    via.guard.failed(&error);
                    return false;
                }
            }
        }
    };
    tokio::time::timeout(wait, ended).await.unwrap_or(false)
}

/// Each running flight with the number of callers holding it.
type Running<T> = HashMap<u128, (Arc<OnceCell<T>>, usize)>;

pub struct Flights<T> {
    running: Mutex<Running<T>>,
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Self {
            running: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Clone> Flights<T> {
    /// The result of `work` for `key`: run here, or shared with a call already running for
    /// the same key. If the caller running the work goes away (its client disconnected), a
    /// waiting caller runs its own.
    pub async fn run<F, Fut>(&self, key: u128, work: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let cell = {
            let mut running = self.lock();
            let (cell, holders) = running
                .entry(key)
                .or_insert_with(|| (Arc::new(OnceCell::new()), 0));
            *holders += 1;
            Arc::clone(cell)
        };
        let _leave = Leave { flights: self, key };
        cell.get_or_init(work).await.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Running<T>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Releases a caller's hold on a flight, finished or cancelled; the last to leave removes
/// it, so a finished flight's result is not served to requests that come later (they find
/// the stored checkpoint instead).
struct Leave<'a, T> {
    flights: &'a Flights<T>,
    key: u128,
}

impl<T> Drop for Leave<'_, T> {
    fn drop(&mut self) {
        let mut running = self
            .flights
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, holders)) = running.get_mut(&self.key) {
            *holders -= 1;
            if *holders == 0 {
                running.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::checkpoint::seal::Sealer;
    use crate::checkpoint::store::{Backend, StoreFuture};

    /// Leases as a shared store keeps them, in memory: a claim's holder, or a result.
    #[derive(Default)]
    struct Leases(Mutex<HashMap<u128, Result<Vec<u8>, u128>>>);

    impl LeaseStore for Leases {
        fn claim(&self, flight: u128, holder: u128, _lease: Duration) -> StoreFuture<'_, bool> {
            let mut leases = self.0.lock().unwrap();
            let claimed = *leases.entry(flight).or_insert(Err(holder)) == Err(holder);
            Box::pin(async move { Ok(claimed) })
        }

        fn settle(
            &self,
            flight: u128,
            _holder: u128,
            result: Vec<u8>,
            _keep: Duration,
        ) -> StoreFuture<'_, ()> {
            self.0.lock().unwrap().insert(flight, Ok(result));
            Box::pin(async { Ok(()) })
        }

        fn peek(&self, flight: u128) -> StoreFuture<'_, Peek> {
            let peek = match self.0.lock().unwrap().get(&flight) {
                Some(Ok(result)) => Peek::Done(result.clone()),
                Some(Err(_)) => Peek::Running,
                None => Peek::Free,
            };
            Box::pin(async move { Ok(peek) })
        }

        fn clear_leases(&self) -> StoreFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
    }

    const NUMBER: Sharing<u32> = Sharing {
        label: "number",
        encode: |n| n.to_le_bytes().to_vec(),
        decode: |bytes| Ok(u32::from_le_bytes(bytes.try_into().unwrap_or_default())),
        keep: Duration::from_secs(60),
    };

    /// Work that no request waits on is made by one process; another that comes for it
    /// while it runs leaves it to that one, without waiting, and takes its result after.
    #[tokio::test]
    async fn work_under_way_in_another_process_is_left_to_it_and_taken_once_made() {
        let (leases, guard) = (
            Leases::default(),
            Guard::new(Backend::Redis, Duration::from_secs(1)),
        );
        let seal = Sealer::new(None).seal_credential(b"sk-1");
        let process = |holder| Across {
            guard: &guard,
            leases: &leases,
            holder,
            rest: AtRest::new(&seal, true),
        };
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let first = once(process(1), 9, &NUMBER, || async {
            released.await.unwrap();
            7
        });
        let second = async {
            tokio::task::yield_now().await;
            let under_way = once(process(2), 9, &NUMBER, || async { 8 }).await;
            assert!(matches!(under_way, Share::Elsewhere));
            assert!(!ends_within(process(2), 9, Duration::from_millis(50)).await);
            release.send(()).unwrap();
        };
        let (made, ()) = tokio::join!(first, second);
        assert!(matches!(made, Share::Made(7)));
        assert!(ends_within(process(2), 9, Duration::from_millis(50)).await);
        let taken = once(process(2), 9, &NUMBER, || async { 8 }).await;
        assert!(matches!(taken, Share::Taken(7)));
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_run() {
        let flights = Flights::<u32>::default();
        let runs = AtomicUsize::new(0);
        let work = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            7
        };
        let (a, b) = tokio::join!(flights.run(1, work), flights.run(1, work));
        assert_eq!((a, b), (7, 7));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test]
    async fn different_keys_run_apart_and_later_callers_run_again() {
        let flights = Flights::<u32>::default();
        let runs = AtomicUsize::new(0);
        let work = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            1
        };
        tokio::join!(flights.run(1, work), flights.run(2, work));
        flights.run(1, work).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test]
    async fn a_waiter_takes_over_when_the_runner_is_cancelled() {
        let flights = Arc::new(Flights::<u32>::default());
        let first = {
            let flights = Arc::clone(&flights);
            tokio::spawn(async move {
                flights
                    .run(1, || async {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        1
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = {
            let flights = Arc::clone(&flights);
            tokio::spawn(async move { flights.run(1, || async { 2 }).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.abort();
        assert_eq!(second.await.unwrap(), 2);
        assert_eq!(flights.len(), 0);
    }
}
