//! Checkpoints in this process's memory, bounded by bytes, least recently used first out,
//! and forgotten when unused past their time to live. [`Lru`] is that bookkeeping alone:
//! the memory store keeps the checkpoints in it, the embedded store keeps there where its
//! checkpoints are, so that a lookup costs no disk read unless it hits.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::checkpoint_store::{CheckpointStore, Tally};
use super::hash::{Key, Partition, Tenant};
use super::seal::AtRest;
use super::store::{Backend, StoreFuture};
use super::Checkpoint;

/// What an [`Lru`] holds for each key.
pub trait Held {
    /// How many client messages the checkpoint replaces: a hash found at another position
    /// is a collision, not a match.
    fn prefix_len(&self) -> usize;
    /// The bytes it stands for, against the bound.
    fn size(&self) -> usize;
}

impl Held for Arc<Checkpoint> {
    fn prefix_len(&self) -> usize {
        self.prefix_len
    }
    fn size(&self) -> usize {
        self.size
    }
}

/// Keys in use order, bounded by the sizes of what they hold and by a time to live.
pub struct Lru<V> {
    max_bytes: usize,
    ttl: Duration,
    entries: HashMap<Key, Resident<V>>,
    /// Use order: tick of last use -> key. With a time to live measured from the last use,
    /// the least recently used entry is also the first to expire.
    order: BTreeMap<u64, Key>,
    tick: u64,
    bytes: usize,
    /// Entries held per partition.
    partitions: HashMap<Partition, usize>,
}

struct Resident<V> {
    value: V,
    tick: u64,
    used: Instant,
}

impl<V: Held> Lru<V> {
    pub fn new(max_bytes: usize, ttl: Duration) -> Lru<V> {
        Lru {
            max_bytes,
            ttl,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            partitions: HashMap::new(),
        }
    }

    pub fn remove(&mut self, key: &Key) -> Option<V> {
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.tick);
        self.bytes -= entry.value.size();
        if let Some(n) = self.partitions.get_mut(&key.partition) {
            *n -= 1;
            if *n == 0 {
                self.partitions.remove(&key.partition);
            }
        }
        Some(entry.value)
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drops what has outlived the time to live, oldest first; returns the keys dropped.
    pub fn expire(&mut self, now: Instant) -> Vec<Key> {
        let mut dropped = Vec::new();
        while let Some((_, key)) = self.order.first_key_value() {
            let key = *key;
            let stale = self
                .entries
                .get(&key)
                .is_some_and(|e| now.duration_since(e.used) > self.ttl);
            if !stale {
                break;
            }
            self.remove(&key);
            dropped.push(key);
        }
        dropped
    }

    /// The longest prefix among `prefixes` held for `partition`, marked as used.
    pub fn longest(&mut self, partition: Partition, prefixes: &[u128]) -> Option<(usize, &V)> {
        let now = Instant::now();
        self.expire(now);
        if !self.partitions.contains_key(&partition) {
            return None;
        }
        // The empty prefix (index 0) is never stored.
        let (len, key) = (1..prefixes.len()).rev().find_map(|i| {
            let key = Key {
                partition,
                prefix: prefixes[i],
            };
            self.entries
                .get(&key)
                .filter(|e| e.value.prefix_len() == i)
                .map(|_| (i, key))
        })?;
        let tick = self.next_tick();
        let entry = self.entries.get_mut(&key)?;
        let old = std::mem::replace(&mut entry.tick, tick);
        entry.used = now;
        self.order.remove(&old);
        self.order.insert(tick, key);
        self.entries.get(&key).map(|e| (len, &e.value))
    }

    /// Holds `value` under `key`, as used `age` ago, dropping `replaces` and then the least
    /// recently used entries until it fits. Returns every key dropped, `key` itself among
    /// them when `value` is larger than the whole bound.
    ///
    /// A checkpoint may replace one of its own prefix (the resumed form compacted further,
    /// with no newer client message folded in): it overwrites it, and `key` is not reported
    /// dropped, since the embedded store deletes the rows of the keys reported (that lost
    /// the new checkpoint, and every later turn was compacted anew from the whole history).
    pub fn insert(&mut self, key: Key, value: V, replaces: Option<Key>, age: Duration) -> Vec<Key> {
        let now = Instant::now();
        let mut dropped: Vec<Key> = replaces
            .into_iter()
            .filter(|old| *old != key && self.remove(old).is_some())
            .collect();
        self.remove(&key);
        dropped.extend(self.expire(now));
        if value.size() > self.max_bytes || age > self.ttl {
            dropped.push(key);
            return dropped;
        }
        while self.bytes + value.size() > self.max_bytes {
            let Some((_, oldest)) = self.order.first_key_value() else {
                break;
            };
            let oldest = *oldest;
            self.remove(&oldest);
            dropped.push(oldest);
        }
        let tick = self.next_tick();
        self.bytes += value.size();
        self.order.insert(tick, key);
        *self.partitions.entry(key.partition).or_default() += 1;
        let used = now.checked_sub(age).unwrap_or(now);
        self.entries.insert(key, Resident { value, tick, used });
        dropped
    }

    pub fn may_hold(&self, partition: Partition) -> bool {
        self.partitions.contains_key(&partition)
    }

    /// Entries held and their bytes.
    pub fn held(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }

    pub fn tenants(&self) -> usize {
        let mut tenants: Vec<Tenant> = self.partitions.keys().map(|p| p.tenant).collect();
        tenants.sort_unstable();
        tenants.dedup();
        tenants.len()
    }

    /// Drops `tenant`'s entries, or every entry; how many went.
    pub fn remove_tenant(&mut self, tenant: Option<Tenant>) -> usize {
        let keys: Vec<Key> = self
            .entries
            .keys()
            .filter(|k| tenant.is_none_or(|t| k.partition.tenant == t))
            .copied()
            .collect();
        for key in &keys {
            self.remove(key);
        }
        keys.len()
    }
}

/// The store of a proxy configured with `cache.backend = "memory"`, and the one a proxy
/// with a shared store falls back to while that store is out of reach.
pub struct MemoryStore {
    lru: Mutex<Lru<Arc<Checkpoint>>>,
}

impl MemoryStore {
    pub fn new(max_bytes: usize, ttl: Duration) -> MemoryStore {
        MemoryStore {
            lru: Mutex::new(Lru::new(max_bytes, ttl)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lru<Arc<Checkpoint>>> {
        self.lru.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, partition: Partition, prefixes: &[u128]) -> Option<(usize, Arc<Checkpoint>)> {
        self.lock()
            .longest(partition, prefixes)
            .map(|(len, checkpoint)| (len, Arc::clone(checkpoint)))
    }

    pub fn insert(&self, key: Key, checkpoint: Arc<Checkpoint>, replaces: Option<Key>) {
        self.lock()
            .insert(key, checkpoint, replaces, Duration::ZERO);
    }

    pub fn remove_tenant(&self, tenant: Option<Tenant>) -> u64 {
        self.lock().remove_tenant(tenant) as u64
    }
}

/// Checkpoints in memory are never bytes: the seal is for what leaves the process.
impl CheckpointStore for MemoryStore {
    fn backend(&self) -> Backend {
        Backend::Memory
    }

    fn may_hold(&self, partition: Partition) -> bool {
        self.lock().may_hold(partition)
    }

    fn any(&self) -> bool {
        self.lock().held().0 > 0
    }

    fn longest<'a>(
        &'a self,
        partition: Partition,
        prefixes: &'a [u128],
        _rest: AtRest<'a>,
    ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>> {
        let found = self.get(partition, prefixes);
        Box::pin(async move { Ok(found) })
    }

    fn put<'a>(
        &'a self,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
        _rest: AtRest<'a>,
    ) -> StoreFuture<'a, ()> {
        self.insert(key, checkpoint, replaces);
        Box::pin(async { Ok(()) })
    }

    fn held(&self) -> (usize, usize) {
        self.lock().held()
    }

    fn tally(&self) -> StoreFuture<'_, Tally> {
        let lru = self.lock();
        let (checkpoints, bytes) = lru.held();
        let stats = Tally {
            checkpoints: checkpoints as u64,
            bytes: bytes as u64,
            tenants: lru.tenants() as u64,
        };
        Box::pin(async move { Ok(stats) })
    }

    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64> {
        let dropped = self.remove_tenant(tenant);
        Box::pin(async move { Ok(dropped) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixtures::{checkpoint, key};

    #[test]
    fn finds_the_longest_stored_prefix_of_its_partition() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        let p = Partition::for_tests(1);
        store.insert(key(1, 20), checkpoint(2, "two"), None);
        store.insert(key(1, 40), checkpoint(4, "four"), None);
        store.insert(key(2, 50), checkpoint(5, "other tenant"), None);
        let hashes = [0, 10, 20, 30, 40, 50, 60];
        let (len, found) = store.get(p, &hashes).unwrap();
        assert_eq!((len, found.prefix_len), (4, 4));
        assert_eq!(store.get(p, &hashes[..4]).unwrap().0, 2);
        assert!(store.get(p, &hashes[..2]).is_none());
        assert!(!store.may_hold(Partition::for_tests(3)));
        // A hash found at the wrong position is a collision, not a match.
        assert!(store.get(p, &[0, 40]).is_none());
    }

    #[test]
    fn an_extending_checkpoint_replaces_the_one_it_extends() {
        let store = MemoryStore::new(1 << 20, Duration::from_secs(60));
        store.insert(key(1, 20), checkpoint(2, "a"), None);
        store.insert(key(1, 40), checkpoint(4, "b"), Some(key(1, 20)));
        assert_eq!(store.held().0, 1);
        assert!(store.get(Partition::for_tests(1), &[0, 10, 20]).is_none());
    }

    #[test]
    fn evicts_the_least_recently_used_when_over_its_bytes() {
        let size = checkpoint(1, "x").size;
        let store = MemoryStore::new(size * 2, Duration::from_secs(60));
        let p = Partition::for_tests(1);
        store.insert(key(1, 1), checkpoint(1, "x"), None);
        store.insert(key(1, 2), checkpoint(1, "x"), None);
        // Using the first makes the second the least recently used.
        assert!(store.get(p, &[0, 1]).is_some());
        store.insert(key(1, 3), checkpoint(1, "x"), None);
        assert_eq!(store.held(), (2, size * 2));
        assert!(store.get(p, &[0, 1]).is_some());
        assert!(store.get(p, &[0, 2]).is_none());
        assert!(store.get(p, &[0, 3]).is_some());
    }

    #[test]
    fn forgets_checkpoints_unused_past_their_time_to_live() {
        let store = MemoryStore::new(1 << 20, Duration::from_millis(30));
        let p = Partition::for_tests(1);
        store.insert(key(1, 1), checkpoint(1, "x"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert!(store.get(p, &[0, 1]).is_none());
        assert_eq!(store.held(), (0, 0));
        assert!(!store.may_hold(p));
    }

    #[test]
    fn a_checkpoint_larger_than_the_whole_store_is_not_kept() {
        let store = MemoryStore::new(8, Duration::from_secs(60));
        store.insert(key(1, 1), checkpoint(1, "x"), None);
        assert_eq!(store.held().0, 0);
    }
}
