//! Single-flight: concurrent requests of one conversation that need the same summary wait
//! for one summariser call instead of each paying for their own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::OnceCell;

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
