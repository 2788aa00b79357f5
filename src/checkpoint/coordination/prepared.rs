//! Compactions prepared ahead. When a conversation passes the prepare mark, the proxy
//! compacts it in the background, as the next compaction event would, and keeps the
//! resulting checkpoint aside, unused: until the event the conversation is sent as it was,
//! byte for byte. The event then only puts the prepared checkpoint in place, without
//! waiting for the summariser; if the preparation is still running it waits for that one,
//! never starting a second.
//!
//! With a store shared by replicas, one replica prepares a conversation's event; the
//! others only note that it is under way elsewhere, and their event takes its result from
//! the store. Each entry belongs to a stage of its conversation (the stretch between two
//! of its compactions): once the conversation has moved on, by an event here or on another
//! replica, an entry of an earlier stage is neither under way nor held, and is dropped the
//! next time the conversation is looked at.
//!
//! Bounded: a few preparations run at once (more are not started), a tenant holds a few
//! entries, the registry a few hundred; an entry pushed out is wasted, and a preparation
//! pushed out while running is cancelled with its summariser call. Only the replica that
//! made a checkpoint counts it made or wasted, so that a fleet's counts add up to its
//! summariser calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use super::flight::Share;
use crate::checkpoint::{Checkpoint, Key, Partition};

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

/// A conversation as one request has it, for its preparations.
#[derive(Clone, Copy)]
pub struct Conversation<'a> {
    pub partition: Partition,
    /// `prefixes[i]`: the hash of its first `i` messages.
    pub prefixes: &'a [u128],
    /// Names the stage the conversation is at: the same on every turn between two of its
    /// compactions, and on every replica.
    pub stage: u128,
    /// The checkpoint the request is resumed from.
    pub resumed: Option<&'a Checkpoint>,
}

/// A prepared checkpoint as an event finds it.
#[derive(Clone)]
pub struct Found {
    pub checkpoint: Arc<Checkpoint>,
    /// This replica made it, rather than took it from the one that did.
    ours: bool,
}

impl Found {
    /// A checkpoint another replica prepared, found in the shared store.
    pub fn elsewhere(checkpoint: Arc<Checkpoint>) -> Found {
        Found {
            checkpoint,
            ours: false,
        }
    }
}

/// What a preparation ended with, for the events waiting on it.
type Ended = Option<Found>;

/// Where a conversation's preparation is under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Underway {
    Here,
    /// On another replica, whose result the shared store will hold.
    Elsewhere,
}

/// A prepared checkpoint, or the preparation that will make it, of one stage.
enum Entry {
    Running {
        done: watch::Receiver<Option<Ended>>,
        abort: Option<AbortHandle>,
        since: Instant,
        stage: u128,
    },
    Ready {
        found: Found,
        since: Instant,
        stage: u128,
    },
    /// Another replica prepares it.
    Elsewhere { since: Instant, stage: u128 },
}

impl Entry {
    fn since(&self) -> Instant {
        match self {
            Entry::Running { since, .. }
            | Entry::Ready { since, .. }
            | Entry::Elsewhere { since, .. } => *since,
        }
    }

    fn stage(&self) -> u128 {
        match self {
            Entry::Running { stage, .. }
            | Entry::Ready { stage, .. }
            | Entry::Elsewhere { stage, .. } => *stage,
        }
    }

    /// Whether dropping it unused wastes a summariser call of this replica's: a
    /// preparation running here, or a checkpoint made here.
    fn ours(&self) -> bool {
        match self {
            Entry::Running { .. } => true,
            Entry::Ready { found, .. } => found.ours,
            Entry::Elsewhere { .. } => false,
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
    stage: u128,
    done: watch::Sender<Option<Ended>>,
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

    /// Counts an entry's fate.
    pub fn count(&self, fate: Fate) {
        self.fates[fate as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `found`, taken by an event that could not use it, as wasted when this
    /// replica made it (the replica that did counts it otherwise).
    pub fn unused(&self, found: &Found) {
        if found.ours {
            self.count(Fate::Wasted);
        }
    }

    /// Entries made, used and wasted so far.
    pub fn fates(&self) -> [(Fate, u64); 3] {
        [Fate::Made, Fate::Used, Fate::Wasted]
            .map(|f| (f, self.fates[f as usize].load(Ordering::Relaxed)))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key of the entry of the conversation's current stage for its longest prefix
    /// that has one, after dropping the entries of its earlier stages.
    fn current(&self, entries: &mut HashMap<Key, Entry>, at: &Conversation<'_>) -> Option<Key> {
        if entries.is_empty() {
            return None;
        }
        let mut found = None;
        for &prefix in at.prefixes {
            let key = Key {
                partition: at.partition,
                prefix,
            };
            match entries.get(&key).map(Entry::stage) {
                Some(stage) if stage == at.stage => found = Some(key),
                Some(_) => self.drop_stale(entries, key, at.resumed),
                None => {}
            }
        }
        found
    }

    /// Drops an entry of a stage the conversation has left: wasted, unless its checkpoint
    /// is the one the conversation went on from (an event of another replica used it).
    fn drop_stale(
        &self,
        entries: &mut HashMap<Key, Entry>,
        key: Key,
        resumed: Option<&Checkpoint>,
    ) {
        let went_on_from = match entries.get(&key) {
            Some(Entry::Ready { found, .. }) => resumed.is_some_and(|resumed| {
                resumed.prefix_len == found.checkpoint.prefix_len
                    && resumed.messages == found.checkpoint.messages
            }),
            _ => false,
        };
        if went_on_from {
            entries.remove(&key);
        } else {
            self.drop_entry(entries, &key);
        }
    }

    /// Whether the conversation's current stage has a preparation, here or elsewhere, or a
    /// prepared checkpoint.
    pub fn holds(&self, at: &Conversation<'_>) -> bool {
        self.current(&mut self.lock(), at).is_some()
    }

    /// Where the preparation of the conversation's current stage runs, while it does.
    pub fn in_progress(&self, at: &Conversation<'_>) -> Option<Underway> {
        let mut entries = self.lock();
        let key = self.current(&mut entries, at)?;
        match entries.get(&key)? {
            Entry::Running { .. } => Some(Underway::Here),
            Entry::Elsewhere { .. } => Some(Underway::Elsewhere),
            Entry::Ready { .. } => None,
        }
    }

    /// A ticket to prepare the conversation whose messages hash to `key`, at `stage`,
    /// unless all preparation slots are busy or it is prepared already.
    pub fn start(&self, key: Key, stage: u128) -> Option<Ticket> {
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
                stage,
            },
        );
        Some(Ticket {
            key,
            stage,
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

    /// The preparation of `ticket` ended: with a checkpoint made here or taken from the
    /// replica that made it, with none, or left to the replica making it.
    pub fn finish(&self, ticket: Ticket, ended: Share<Option<Checkpoint>>) {
        let (since, stage) = (Instant::now(), ticket.stage);
        let ready = |checkpoint, ours| {
            let found = Found {
                checkpoint: Arc::new(checkpoint),
                ours,
            };
            let entry = Entry::Ready {
                found: found.clone(),
                since,
                stage,
            };
            (Some(entry), Some(found))
        };
        let (entry, found) = match ended {
            Share::Made(Some(checkpoint)) => ready(checkpoint, true),
            Share::Taken(Some(checkpoint)) => ready(checkpoint, false),
            Share::Elsewhere => (Some(Entry::Elsewhere { since, stage }), None),
            Share::Made(None) | Share::Taken(None) => (None, None),
        };
        let mut entries = self.lock();
        match entry {
            // Unless it was pushed out or discarded meanwhile.
            Some(entry) if entries.contains_key(&ticket.key) => {
                if found.as_ref().is_some_and(|found| found.ours) {
                    self.count(Fate::Made);
                }
                entries.insert(ticket.key, entry);
            }
            _ => {
                entries.remove(&ticket.key);
            }
        }
        drop(entries);
        // Events waiting for it take the result; a closed channel only means none waits.
        let _ = ticket.done.send(Some(found));
    }

    /// Takes the prepared checkpoint of the conversation's current stage, waiting for its
    /// preparation if it is running here; `None` when there is none here (one prepared
    /// elsewhere is in the shared store). The caller counts it used, or [`Self::unused`].
    pub async fn take(&self, at: &Conversation<'_>) -> Option<Found> {
        let (key, mut done) = {
            let mut entries = self.lock();
            let key = self.current(&mut entries, at)?;
            if let Some(Entry::Running { done, .. }) = entries.get(&key) {
                (key, done.clone())
            } else {
                // Prepared elsewhere: the event takes it from the shared store.
                let Some(Entry::Ready { found, since, .. }) = entries.remove(&key) else {
                    return None;
                };
                if since.elapsed() >= self.ttl {
                    self.unused(&found);
                    return None;
                }
                return Some(found);
            }
        };
        // Still running: this event waits for it rather than asking the summariser twice.
        let found = done.wait_for(Option::is_some).await.ok()?.clone().flatten();
        // `finish` stored it; the event takes it.
        self.lock().remove(&key);
        found
    }

    /// Whether the running preparation of the conversation's current stage ends within
    /// `wait` (at once when it has ended, or none runs here).
    pub async fn ends_within(&self, at: &Conversation<'_>, wait: Duration) -> bool {
        let running = {
            let mut entries = self.lock();
            let key = self.current(&mut entries, at);
            match key.and_then(|key| entries.get(&key)) {
                Some(Entry::Running { done, .. }) => Some(done.clone()),
                _ => None,
            }
        };
        let Some(mut done) = running else {
            return true;
        };
        tokio::time::timeout(wait, done.wait_for(Option::is_some))
            .await
            .is_ok_and(|ended| ended.is_ok())
    }

    /// Drops the conversation's preparations, cancelling the one running here: an event
    /// made without it leaves it behind the conversation, and a later event needs one
    /// made from where this one left it.
    pub fn discard(&self, at: &Conversation<'_>) {
        let mut entries = self.lock();
        if let Some(key) = self.current(&mut entries, at) {
            self.drop_entry(&mut entries, &key);
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

    /// Drops an entry unused, cancelling its preparation if it runs here; wasted if it
    /// was this replica's.
    fn drop_entry(&self, entries: &mut HashMap<Key, Entry>, key: &Key) {
        let Some(entry) = entries.remove(key) else {
            return;
        };
        if entry.ours() {
            self.count(Fate::Wasted);
        }
        if let Entry::Running {
            abort: Some(abort), ..
        } = entry
        {
            abort.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    /// The stage every conversation of these tests is at, unless one says otherwise.
    const STAGE: u128 = 1;

    fn key(prefix: u128) -> Key {
        Key {
            partition: Partition::new(&HeaderMap::new(), "http://up", "m"),
            prefix,
        }
    }

    /// A conversation whose prefixes hash to `prefixes`, at `stage`, resumed from `resumed`.
    fn at<'a>(
        prefixes: &'a [u128],
        stage: u128,
        resumed: Option<&'a Checkpoint>,
    ) -> Conversation<'a> {
        Conversation {
            partition: key(0).partition,
            prefixes,
            stage,
            resumed,
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
        let ticket = prepared.start(key(7), STAGE).unwrap();
        // The same conversation, one turn later: held, not started again.
        assert!(prepared.holds(&at(&[1, 7, 9], STAGE, None)));
        assert_eq!(
            prepared.in_progress(&at(&[1, 7, 9], STAGE, None)),
            Some(Underway::Here)
        );
        assert!(prepared.start(key(7), STAGE).is_none());
        let waiting = {
            let prepared = Arc::clone(&prepared);
            tokio::spawn(async move { prepared.take(&at(&[1, 7, 9], STAGE, None)).await })
        };
        tokio::task::yield_now().await;
        prepared.finish(ticket, Share::Made(Some(checkpoint())));
        let found = waiting.await.unwrap().unwrap();
        assert_eq!(found.checkpoint.prefix_len, 3);
        assert_eq!(fate(&prepared, Fate::Made), 1);
        assert!(!prepared.holds(&at(&[1, 7, 9], STAGE, None)));
    }

    #[tokio::test]
    async fn a_preparation_under_way_on_another_replica_is_held_and_left_to_the_store() {
        let prepared = Prepared::new(2, Duration::from_secs(60));
        let ticket = prepared.start(key(7), STAGE).unwrap();
        prepared.finish(ticket, Share::Elsewhere);
        let conversation = at(&[1, 7, 9], STAGE, None);
        // Not prepared again here; under way, elsewhere.
        assert!(prepared.holds(&conversation));
        assert_eq!(
            prepared.in_progress(&conversation),
            Some(Underway::Elsewhere)
        );
        // The event takes the result from the store: nothing here was made, used or
        // wasted.
        assert!(prepared.take(&conversation).await.is_none());
        assert!(!prepared.holds(&conversation));
        assert_eq!(prepared.fates().map(|(_, n)| n), [0, 0, 0]);
    }

    /// A replica's entries of a stage its conversation has left, by an event elsewhere,
    /// are neither under way nor held: the conversation's next event is prepared from
    /// where it is. A checkpoint made here that the event used is not wasted; one it did
    /// not use is.
    #[tokio::test]
    async fn entries_of_a_stage_the_conversation_has_left_are_dropped() {
        let prepared = Prepared::new(4, Duration::from_secs(60));
        let ticket = prepared.start(key(7), STAGE).unwrap();
        prepared.finish(ticket, Share::Made(Some(checkpoint())));
        // The other replica's event put this very checkpoint in place: the conversation
        // is resumed from it, at the next stage.
        let used = checkpoint();
        let next = at(&[1, 7, 9, 11], STAGE + 1, Some(&used));
        assert!(!prepared.holds(&next));
        assert_eq!(fate(&prepared, Fate::Wasted), 0);
        assert!(prepared.start(key(11), STAGE + 1).is_some());

        let ticket = prepared.start(key(20), STAGE).unwrap();
        prepared.finish(ticket, Share::Made(Some(checkpoint())));
        // The other replica's event went without it (a digest of its own).
        let digest = Checkpoint::new(5, 100, vec![serde_json::json!("digest")], vec![1], None, 0);
        assert_eq!(
            prepared.in_progress(&at(&[20, 21], STAGE + 1, Some(&digest))),
            None
        );
        assert_eq!(fate(&prepared, Fate::Wasted), 1);
    }

    #[tokio::test]
    async fn a_checkpoint_taken_from_another_replica_is_not_counted_here() {
        let prepared = Prepared::new(2, Duration::from_secs(60));
        let ticket = prepared.start(key(7), STAGE).unwrap();
        prepared.finish(ticket, Share::Taken(Some(checkpoint())));
        let found = prepared.take(&at(&[7], STAGE, None)).await.unwrap();
        prepared.unused(&found);
        assert_eq!(prepared.fates().map(|(_, n)| n), [0, 0, 0]);
    }

    #[tokio::test]
    async fn a_preparation_pushed_out_is_cancelled_and_counted_as_wasted() {
        let prepared = Prepared::new(PER_TENANT + 1, Duration::from_secs(60));
        let mut tasks = Vec::new();
        for prefix in 0..=PER_TENANT as u128 {
            let ticket = prepared.start(key(prefix), STAGE).unwrap();
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
        assert!(!prepared.holds(&at(&[0], STAGE, None)));
    }

    #[tokio::test]
    async fn a_preparation_left_behind_by_an_event_is_cancelled_and_a_new_one_may_start() {
        let prepared = Prepared::new(2, Duration::from_secs(60));
        let ticket = prepared.start(key(7), STAGE).unwrap();
        let task = tokio::spawn(async move {
            let _ticket = ticket;
            std::future::pending::<()>().await;
        });
        prepared.running(key(7), task.abort_handle());
        // Another conversation's is not touched.
        let other = prepared.start(key(40), STAGE).unwrap();
        prepared.discard(&at(&[1, 7, 9], STAGE, None));
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(fate(&prepared, Fate::Wasted), 1);
        assert!(!prepared.holds(&at(&[1, 7, 9], STAGE, None)));
        assert!(prepared.holds(&at(&[40], STAGE, None)));
        drop(other);
        assert!(prepared.start(key(9), STAGE).is_some());
    }

    #[tokio::test]
    async fn no_preparation_starts_while_every_slot_is_busy() {
        let prepared = Prepared::new(1, Duration::from_secs(60));
        let ticket = prepared.start(key(1), STAGE).unwrap();
        assert!(prepared.start(key(2), STAGE).is_none());
        prepared.finish(ticket, Share::Made(None));
        assert!(prepared.start(key(2), STAGE).is_some());
    }
}
