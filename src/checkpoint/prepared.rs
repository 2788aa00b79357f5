//! Compactions prepared ahead. When a conversation passes the prepare mark, the proxy
//! compacts it in the background, as the next compaction event would, and keeps the
//! resulting checkpoint aside, unused: until the event the conversation is sent as it was,
//! byte for byte. The event then only puts the prepared checkpoint in place, without
//! waiting for the summariser; if the preparation is still running it waits for that one,
//! never starting a second.
//!
//! Bounded: a few preparations run at once (more are not started), a tenant holds a few
//! entries, the registry a few hundred; an entry pushed out is wasted, and a preparation
//! pushed out while running is cancelled with its summariser call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use super::{Checkpoint, Key, Partition};

/// Entries a tenant (a partition) may hold: its conversations in progress.
const PER_TENANT: usize = 4;
/// Entries held in all.
const CAPACITY: usize = 512;

/// The outcome of a prepared compaction, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// A preparation finished with a checkpoint.
    Made,
    /// A compaction event put a prepared checkpoint in place.
    Used,
    /// A preparation or its checkpoint was dropped unused.
    Wasted,
}

impl Fate {
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Made => "made",
            Fate::Used => "used",
            Fate::Wasted => "wasted",
        }
    }
}

/// A prepared checkpoint, or the preparation that will make it.
enum Entry {
    Running {
        done: watch::Receiver<Option<Option<Arc<Checkpoint>>>>,
        abort: Option<AbortHandle>,
        since: Instant,
    },
    Ready {
        checkpoint: Arc<Checkpoint>,
        since: Instant,
    },
}

impl Entry {
    fn since(&self) -> Instant {
        match self {
            Entry::Running { since, .. } | Entry::Ready { since, .. } => *since,
        }
    }
}

pub struct Prepared {
    permits: Arc<Semaphore>,
    entries: Mutex<HashMap<Key, Entry>>,
    ttl: Duration,
    /// How many entries met each [`Fate`], for the metrics.
    fates: [AtomicU64; 3],
}

/// The right to run one preparation, keyed by the conversation prefix it covers.
pub struct Ticket {
    key: Key,
    done: watch::Sender<Option<Option<Arc<Checkpoint>>>>,
    _permit: OwnedSemaphorePermit,
}

impl Prepared {
    pub fn new(concurrency: usize, ttl: Duration) -> Prepared {
        Prepared {
            permits: Arc::new(Semaphore::new(concurrency)),
            entries: Mutex::new(HashMap::new()),
            ttl,
            fates: Default::default(),
        }
    }

    /// Counts an entry's fate; the caller of [`Prepared::take`] says whether it used
    /// what it took.
    pub fn count(&self, fate: Fate) {
        self.fates[fate as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Entries made, used and wasted so far.
    pub fn fates(&self) -> [(Fate, u64); 3] {
        [Fate::Made, Fate::Used, Fate::Wasted]
            .map(|f| (f, self.fates[f as usize].load(Ordering::Relaxed)))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any prefix of the conversation (`prefixes[i]` the hash of its first `i`
    /// messages) has a preparation or a prepared checkpoint.
    pub fn holds(&self, partition: Partition, prefixes: &[u128]) -> bool {
        let entries = self.lock();
        if entries.is_empty() {
            return false;
        }
        prefixes
            .iter()
            .any(|&prefix| entries.contains_key(&Key { partition, prefix }))
    }

    /// Whether a preparation of any prefix of the conversation is still running.
    pub fn in_progress(&self, partition: Partition, prefixes: &[u128]) -> bool {
        let entries = self.lock();
        !entries.is_empty()
            && prefixes.iter().any(|&prefix| {
                matches!(
                    entries.get(&Key { partition, prefix }),
                    Some(Entry::Running { .. })
                )
            })
    }

    /// A ticket to prepare the conversation whose messages hash to `key`, unless all
    /// preparation slots are busy or it is prepared already.
    pub fn start(&self, key: Key) -> Option<Ticket> {
        let permit = Arc::clone(&self.permits).try_acquire_owned().ok()?;
        let mut entries = self.lock();
        if entries.contains_key(&key) {
            return None;
        }
        self.make_room(&mut entries, key.partition);
        let (done, receiver) = watch::channel(None);
        entries.insert(
            key,
            Entry::Running {
                done: receiver,
                abort: None,
                since: Instant::now(),
            },
        );
        Some(Ticket {
            key,
            done,
            _permit: permit,
        })
    }

    /// Lets the registry cancel the task preparing `key` when its entry is pushed out.
    pub fn running(&self, key: Key, abort: AbortHandle) {
        if let Some(Entry::Running { abort: slot, .. }) = self.lock().get_mut(&key) {
            *slot = Some(abort);
        }
    }

    /// The preparation of `ticket` ended, with a checkpoint or without.
    pub fn finish(&self, ticket: Ticket, checkpoint: Option<Checkpoint>) {
        let checkpoint = checkpoint.map(Arc::new);
        let mut entries = self.lock();
        match &checkpoint {
            Some(checkpoint) if entries.contains_key(&ticket.key) => {
                self.count(Fate::Made);
                entries.insert(
                    ticket.key,
                    Entry::Ready {
                        checkpoint: Arc::clone(checkpoint),
                        since: Instant::now(),
                    },
                );
            }
            _ => {
                entries.remove(&ticket.key);
            }
        }
        drop(entries);
        // Events waiting for it take the result; a closed channel only means none waits.
        let _ = ticket.done.send(Some(checkpoint));
    }

    /// Takes the prepared checkpoint for the longest prefix of the conversation, waiting
    /// for its preparation if it is still running. The caller counts it used or wasted.
    pub async fn take(&self, partition: Partition, prefixes: &[u128]) -> Option<Arc<Checkpoint>> {
        let (key, mut done) = {
            let mut entries = self.lock();
            let key = prefixes.iter().rev().find_map(|&prefix| {
                let key = Key { partition, prefix };
                entries.contains_key(&key).then_some(key)
            })?;
            if let Some(Entry::Running { done, .. }) = entries.get(&key) {
                (key, done.clone())
            } else {
                let Some(Entry::Ready { checkpoint, since }) = entries.remove(&key) else {
                    return None;
                };
                if since.elapsed() >= self.ttl {
                    self.count(Fate::Wasted);
                    return None;
                }
                return Some(checkpoint);
            }
        };
        // Still running: this event waits for it rather than asking the summariser twice.
        let checkpoint = done
            .wait_for(Option::is_some)
            .await
            .ok()?
            .clone()
            .flatten()?;
        // `finish` stored it as made; the event takes it.
        self.lock().remove(&key);
        Some(checkpoint)
    }

    /// Whether the running preparation of the conversation's longest prepared prefix ends
    /// within `wait` (at once when it has ended, or none runs).
    pub async fn ends_within(
        &self,
        partition: Partition,
        prefixes: &[u128],
        wait: Duration,
    ) -> bool {
        let running = {
            let entries = self.lock();
            prefixes.iter().rev().find_map(|&prefix| {
                match entries.get(&Key { partition, prefix }) {
                    Some(Entry::Running { done, .. }) => Some(done.clone()),
                    _ => None,
                }
            })
        };
        let Some(mut done) = running else {
            return true;
        };
        tokio::time::timeout(wait, done.wait_for(Option::is_some))
            .await
            .is_ok_and(|ended| ended.is_ok())
    }

    /// Drops every preparation of a prefix of the conversation, cancelling those still
    /// running: an event made without them leaves them behind the conversation, and a
    /// later event needs one made from where this one left it.
    pub fn discard(&self, partition: Partition, prefixes: &[u128]) {
        let mut entries = self.lock();
        if entries.is_empty() {
            return;
        }
        for &prefix in prefixes {
            self.drop_entry(&mut entries, &Key { partition, prefix });
        }
    }

    /// Pushes out the oldest entries of the partition past its share, and the oldest of
    /// all past the capacity or their time to live.
    fn make_room(&self, entries: &mut HashMap<Key, Entry>, partition: Partition) {
        let expired: Vec<Key> = entries
            .iter()
            .filter(|(_, e)| e.since().elapsed() >= self.ttl)
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            self.drop_entry(entries, &key);
        }
        let push_out = |entries: &mut HashMap<Key, Entry>, tenant: Option<Partition>| {
            let oldest = entries
                .iter()
                .filter(|(k, _)| tenant.is_none_or(|p| k.partition == p))
                .min_by_key(|(_, e)| e.since())
                .map(|(k, _)| *k);
            if let Some(key) = oldest {
                self.drop_entry(entries, &key);
            }
        };
        while entries.keys().filter(|k| k.partition == partition).count() >= PER_TENANT {
            push_out(entries, Some(partition));
        }
        while entries.len() >= CAPACITY {
            push_out(entries, None);
        }
    }

    fn drop_entry(&self, entries: &mut HashMap<Key, Entry>, key: &Key) {
        if let Some(entry) = entries.remove(key) {
            if let Entry::Running {
                abort: Some(abort), ..
            } = entry
            {
                abort.abort();
            }
            self.count(Fate::Wasted);
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn key(prefix: u128) -> Key {
        Key {
            partition: Partition::new(&HeaderMap::new(), "http://up", "m"),
            prefix,
        }
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint::new(3, 100, vec![], vec![], None, 0)
    }

    fn fate(prepared: &Prepared, fate: Fate) -> u64 {
        prepared.fates().iter().find(|(f, _)| *f == fate).unwrap().1
    }

    #[tokio::test]
    async fn an_event_waits_for_the_preparation_running_for_its_conversation() {
        let prepared = Arc::new(Prepared::new(2, Duration::from_secs(60)));
        let ticket = prepared.start(key(7)).unwrap();
        // The same conversation, one turn later: held, not started again.
        assert!(prepared.holds(key(7).partition, &[1, 7, 9]));
        assert!(prepared.start(key(7)).is_none());
        let waiting = {
            let prepared = Arc::clone(&prepared);
            tokio::spawn(async move { prepared.take(key(7).partition, &[1, 7, 9]).await })
        };
        tokio::task::yield_now().await;
        prepared.finish(ticket, Some(checkpoint()));
        let checkpoint = waiting.await.unwrap().unwrap();
        assert_eq!(checkpoint.prefix_len, 3);
        assert_eq!(fate(&prepared, Fate::Made), 1);
        assert!(!prepared.holds(key(7).partition, &[1, 7, 9]));
    }

    #[tokio::test]
    async fn a_preparation_pushed_out_is_cancelled_and_counted_as_wasted() {
        let prepared = Prepared::new(PER_TENANT + 1, Duration::from_secs(60));
        let mut tasks = Vec::new();
        for prefix in 0..=PER_TENANT as u128 {
            let ticket = prepared.start(key(prefix)).unwrap();
            // A summariser that never answers.
            let task = tokio::spawn(async move {
                let _ticket = ticket;
                std::future::pending::<()>().await;
            });
            prepared.running(key(prefix), task.abort_handle());
            tasks.push(task);
        }
        // The tenant's oldest preparation made room for the newest, and was cancelled.
        let first = tasks.remove(0);
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(fate(&prepared, Fate::Wasted), 1);
        assert!(tasks.iter().all(|t| !t.is_finished()));
        assert!(!prepared.holds(key(0).partition, &[0]));
    }

    #[tokio::test]
    async fn a_preparation_left_behind_by_an_event_is_cancelled_and_a_new_one_may_start() {
        let prepared = Prepared::new(2, Duration::from_secs(60));
        let ticket = prepared.start(key(7)).unwrap();
        let task = tokio::spawn(async move {
            let _ticket = ticket;
            std::future::pending::<()>().await;
        });
        prepared.running(key(7), task.abort_handle());
        // Another conversation's is not touched.
        let other = prepared.start(key(40)).unwrap();
        prepared.discard(key(7).partition, &[1, 7, 9]);
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(fate(&prepared, Fate::Wasted), 1);
        assert!(!prepared.holds(key(7).partition, &[1, 7, 9]));
        assert!(prepared.holds(key(40).partition, &[40]));
        drop(other);
        assert!(prepared.start(key(9)).is_some());
    }

    #[tokio::test]
    async fn no_preparation_starts_while_every_slot_is_busy() {
        let prepared = Prepared::new(1, Duration::from_secs(60));
        let ticket = prepared.start(key(1)).unwrap();
        assert!(prepared.start(key(2)).is_none());
        prepared.finish(ticket, None);
        assert!(prepared.start(key(2)).is_some());
    }
}
