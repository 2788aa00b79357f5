//! Where checkpoints live. The proxy uses [`MemoryStore`]; the [`Store`] trait is the seam
//! a store shared between proxy processes would fill.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::hash::Partition;
use super::Checkpoint;

/// A checkpoint's address: the hash of the client's message prefix it replaces, within a
/// partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub partition: Partition,
    pub prefix: u128,
}

pub trait Store: Send + Sync {
    /// The checkpoint for the longest prefix among `prefixes` (where `prefixes[i]` is the
    /// hash of the first `i` messages), with that `i`.
    fn longest(&self, partition: Partition, prefixes: &[u128]) -> Option<(usize, Arc<Checkpoint>)>;

    /// Stores `checkpoint`, dropping `replaces` (the shorter checkpoint of the same
    /// conversation it extends), which no request would match again.
    fn put(&self, key: Key, checkpoint: Arc<Checkpoint>, replaces: Option<Key>);

    /// Whether `partition` may have checkpoints at all: requests of tenants that never
    /// needed compaction skip parsing and hashing.
    fn may_hold(&self, partition: Partition) -> bool;

    /// Checkpoints held, and their bytes by [`Checkpoint::size`], for the metrics.
    fn held(&self) -> (usize, usize);
}

/// An in-process store bounded by bytes, evicting the least recently used checkpoint first,
/// and forgetting a checkpoint unused for longer than its time to live.
pub struct MemoryStore {
    max_bytes: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Use order: tick of last use -> key. With a time to live measured from the last use,
    /// the least recently used entry is also the first to expire.
    order: BTreeMap<u64, Key>,
    tick: u64,
    bytes: usize,
    /// Checkpoints held per partition.
    partitions: HashMap<Partition, usize>,
}

struct Entry {
    checkpoint: Arc<Checkpoint>,
    tick: u64,
    used: Instant,
}

impl MemoryStore {
    pub fn new(max_bytes: usize, ttl: Duration) -> MemoryStore {
        MemoryStore {
            max_bytes,
            ttl,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.tick);
        self.bytes -= entry.checkpoint.size;
        if let Some(n) = self.partitions.get_mut(&key.partition) {
            *n -= 1;
            if *n == 0 {
                self.partitions.remove(&key.partition);
            }
        }
        Some(entry)
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drops what has outlived `ttl`, oldest first.
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((_, key)) = self.order.first_key_value() {
            let key = *key;
            let stale = self
                .entries
                .get(&key)
                .is_some_and(|e| now.duration_since(e.used) > ttl);
            if !stale {
                break;
            }
            self.remove(&key);
        }
    }
}

impl Store for MemoryStore {
    fn longest(&self, partition: Partition, prefixes: &[u128]) -> Option<(usize, Arc<Checkpoint>)> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now, self.ttl);
        if !inner.partitions.contains_key(&partition) {
            return None;
        }
        // The empty prefix (index 0) is never stored.
        let (len, key) = (1..prefixes.len()).rev().find_map(|i| {
            let key = Key {
                partition,
                prefix: prefixes[i],
            };
            inner
                .entries
                .get(&key)
                .filter(|e| e.checkpoint.prefix_len == i)
                .map(|_| (i, key))
        })?;
        let tick = inner.next_tick();
        let entry = inner.entries.get_mut(&key)?;
        let old = std::mem::replace(&mut entry.tick, tick);
        entry.used = now;
        let checkpoint = Arc::clone(&entry.checkpoint);
        inner.order.remove(&old);
        inner.order.insert(tick, key);
        Some((len, checkpoint))
    }

    fn put(&self, key: Key, checkpoint: Arc<Checkpoint>, replaces: Option<Key>) {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(old) = replaces {
            inner.remove(&old);
        }
        inner.remove(&key);
        inner.expire(now, self.ttl);
        if checkpoint.size > self.max_bytes {
            return;
        }
        while inner.bytes + checkpoint.size > self.max_bytes {
            let Some((_, oldest)) = inner.order.first_key_value() else {
                break;
            };
            let oldest = *oldest;
            inner.remove(&oldest);
        }
        let tick = inner.next_tick();
        inner.bytes += checkpoint.size;
        inner.order.insert(tick, key);
        *inner.partitions.entry(key.partition).or_default() += 1;
        inner.entries.insert(
            key,
            Entry {
                checkpoint,
                tick,
                used: now,
            },
        );
    }

    fn may_hold(&self, partition: Partition) -> bool {
        self.lock().partitions.contains_key(&partition)
    }

    fn held(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn checkpoint(prefix_len: usize, text: &str) -> Arc<Checkpoint> {
        Arc::new(Checkpoint::new(
            prefix_len,
            10,
            vec![json!({"role": "user", "content": text})],
            vec![5],
            None,
            0,
        ))
    }

    fn key(partition: u128, prefix: u128) -> Key {
        Key {
            partition: Partition::for_tests(partition),
            prefix,
        }
    }

    #[test]
    fn finds_the_longest_stored_prefix_of_its_partition() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        let p = Partition::for_tests(1);
        store.put(key(1, 20), checkpoint(2, "two"), None);
        store.put(key(1, 40), checkpoint(4, "four"), None);
        store.put(key(2, 50), checkpoint(5, "other tenant"), None);
        let hashes = [0, 10, 20, 30, 40, 50, 60];
        let (len, found) = store.longest(p, &hashes).unwrap();
        assert_eq!((len, found.prefix_len), (4, 4));
        assert_eq!(store.longest(p, &hashes[..4]).unwrap().0, 2);
        assert!(store.longest(p, &hashes[..2]).is_none());
        assert!(!store.may_hold(Partition::for_tests(3)));
        // A hash found at the wrong position is a collision, not a match.
        assert!(store.longest(p, &[0, 40]).is_none());
    }

    #[test]
    fn an_extending_checkpoint_replaces_the_one_it_extends() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        store.put(key(1, 20), checkpoint(2, "a"), None);
        store.put(key(1, 40), checkpoint(4, "b"), Some(key(1, 20)));
        assert_eq!(store.held().0, 1);
        assert!(store
            .longest(Partition::for_tests(1), &[0, 10, 20])
            .is_none());
    }

    #[test]
    fn evicts_the_least_recently_used_when_over_its_bytes() {
        let size = checkpoint(1, "x").size;
        let store = MemoryStore::new(size * 2, Duration::from_secs(60));
        let p = Partition::for_tests(1);
        store.put(key(1, 1), checkpoint(1, "x"), None);
        store.put(key(1, 2), checkpoint(1, "x"), None);
        // Using the first makes the second the least recently used.
        assert!(store.longest(p, &[0, 1]).is_some());
        store.put(key(1, 3), checkpoint(1, "x"), None);
        assert_eq!(store.held(), (2, size * 2));
        assert!(store.longest(p, &[0, 1]).is_some());
        assert!(store.longest(p, &[0, 2]).is_none());
        assert!(store.longest(p, &[0, 3]).is_some());
    }

    #[test]
    fn forgets_checkpoints_unused_past_their_time_to_live() {
        let store = MemoryStore::new(1 << 20, Duration::from_millis(30));
        let p = Partition::for_tests(1);
        store.put(key(1, 1), checkpoint(1, "x"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert!(store.longest(p, &[0, 1]).is_none());
        assert_eq!(store.held(), (0, 0));
        assert!(!store.may_hold(p));
    }

    #[test]
    fn a_checkpoint_larger_than_the_whole_store_is_not_kept() {
        let store = MemoryStore::new(8, Duration::from_secs(60));
        store.put(key(1, 1), checkpoint(1, "x"), None);
        assert_eq!(store.held().0, 0);
    }
}
