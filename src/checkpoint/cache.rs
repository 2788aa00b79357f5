//! The cache as the proxy uses it: the configured store, and this process's memory while a
//! shared store is out of reach. A store's failure never fails a request: the lookup or
//! write goes to memory instead, the outage is logged once when it starts and once when it
//! ends, counted by backend, and shown at `/healthz`; the store is tried again a second
//! later, so a Redis that comes back is used again without a restart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::flight::{self, Flights};
use super::hash::{Partition, Tenant};
use super::memory::MemoryStore;
use super::prepared::Prepared;
use super::store::{Backend, Key, Stats, Store, StoreError};
use crate::model_record::ModelRecord;
use super::{codec, embedded, redis, redis_protocol, Checkpoint};
use crate::config::{CacheBackend, CacheConfig};
use crate::engine::Summary;
use crate::windows::ModelWindows;

/// How long an unreachable store is left alone before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often calibration learned is written.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How often a shared store is read for what other replicas learned of the models.
const PULL_EVERY: Duration = Duration::from_secs(2);
/// A summary made for replicas waiting on it: they take it within the minute.
const SUMMARY: flight::Kind<Option<Summary>> = flight::Kind {
    encode: |summary| codec::encode_summary(summary.as_ref()),
    decode: codec::decode_summary,
    keep: Duration::from_secs(60),
};
/// A prepared compaction: the replicas of its conversation take it at their first turn
/// past the prepare mark, or at the event, which may come many turns later.
const PREPARED: flight::Kind<Option<(u128, Checkpoint)>> = flight::Kind {
    encode: codec::encode_prepared,
    decode: codec::decode_prepared,
    keep: Duration::from_secs(30 * 60),
};

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

pub struct Checkpoints {
    store: Box<dyn Store>,
    /// Memory, for a store shared with other processes: holds this process's checkpoints
    /// too, so that an outage of the store costs its conversations nothing.
    fallback: Option<MemoryStore>,
    outage: Mutex<Option<Outage>>,
    timeout: Duration,
    /// This process, when it holds a summariser call others wait on.
    holder: u128,
    flights: Flights<Option<Summary>>,
    pub prepared: Option<Prepared>,
    counters: [Counters; 2],
}

/// Why the cache could not be set up, for the message at start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cache.path {path}: {reason}")]
    Embedded { path: String, reason: String },
    #[error("cache.redis_url: {0}")]
    Redis(String),
    #[error("cache.redis_ca_file {path}: {reason}")]
    RedisCa { path: String, reason: String },
}

impl Checkpoints {
    /// The cache `config` describes; `None` when it is disabled.
    pub fn open(
        config: &CacheConfig,
        prepare_concurrency: usize,
    ) -> Result<Option<Checkpoints>, OpenError> {
        if !config.enabled {
            return Ok(None);
        }
        let ttl = config.ttl();
        let max_bytes = usize::try_from(config.max_bytes).unwrap_or(usize::MAX);
        let (store, fallback): (Box<dyn Store>, _) = match config.backend {
            CacheBackend::Memory => (Box::new(MemoryStore::new(max_bytes, ttl)), None),
            CacheBackend::Embedded => {
                let path = config.embedded_path();
                let store =
                    embedded::EmbeddedStore::open(&path, max_bytes, ttl).map_err(|reason| {
                        OpenError::Embedded {
                            path: path.display().to_string(),
                            reason,
                        }
                    })?;
                (Box::new(store), None)
            }
            CacheBackend::Redis => {
                let roots = match config.redis_ca_file.as_str() {
                    "" => Vec::new(),
                    path => redis_protocol::read_roots(std::path::Path::new(path)).map_err(
                        |reason| OpenError::RedisCa {
                            path: path.to_owned(),
                            reason,
                        },
                    )?,
                };
                let store = redis::open(&config.redis_url, &config.redis_namespace, ttl, roots)
                    .map_err(OpenError::Redis)?;
                (store, Some(MemoryStore::new(max_bytes, ttl)))
            }
        };
        Ok(Some(Checkpoints::with_store(
            store,
            fallback,
            config,
            prepare_concurrency,
        )))
    }

    pub fn with_store(
        store: Box<dyn Store>,
        fallback: Option<MemoryStore>,
        config: &CacheConfig,
        prepare_concurrency: usize,
    ) -> Checkpoints {
        Checkpoints {
            store,
            fallback,
            outage: Mutex::new(None),
            timeout: config.timeout(),
            holder: flight::holder_id(),
            flights: Flights::default(),
            prepared: (prepare_concurrency > 0)
                .then(|| Prepared::new(prepare_concurrency, config.ttl())),
            counters: Default::default(),
        }
    }

    pub fn backend(&self) -> Backend {
        self.store.backend()
    }

    /// Whether any tenant may have checkpoints, from memory alone.
    pub fn any(&self) -> bool {
        self.store.any() || self.fallback.as_ref().is_some_and(Store::any)
    }

    /// Whether `partition` may have checkpoints, from memory alone.
    pub fn may_hold(&self, partition: Partition) -> bool {
        self.store.may_hold(partition)
            || self
                .fallback
                .as_ref()
                .is_some_and(|f| f.may_hold(partition))
    }

    /// Checkpoints held and their bytes, as this process knows them: a shared store's are
    /// counted by `cache stats`, the copies this process keeps in memory here.
    pub fn held(&self) -> (usize, usize) {
        match &self.fallback {
            Some(fallback) => fallback.held(),
            None => self.store.held(),
        }
    }

    /// The checkpoint of the longest stored prefix of a conversation, from the store, or
    /// from memory while the store is out of reach.
    pub async fn longest(
        &self,
        partition: Partition,
        prefixes: &[u128],
    ) -> Option<(usize, Arc<Checkpoint>)> {
        if self.reachable() {
            match self.bounded(self.store.longest(partition, prefixes)).await {
                Ok(found) => {
                    self.count(self.store.backend(), found.is_some());
                    if found.is_some() || self.fallback.is_none() {
                        return found;
                    }
                }
                Err(error) => self.failed(&error),
            }
        }
        let fallback = self.fallback.as_ref()?;
        let found = fallback.get(partition, prefixes);
        self.count(Backend::Memory, found.is_some());
        found
    }

    /// Keeps a checkpoint; in memory too when the store is shared, and in memory alone
    /// while the store is out of reach.
    pub async fn put(&self, key: Key, checkpoint: Arc<Checkpoint>, replaces: Option<Key>) {
        if let Some(fallback) = &self.fallback {
            fallback.insert(key, Arc::clone(&checkpoint), replaces);
        }
        if self.reachable() {
            if let Err(error) = self
                .bounded(self.store.put(key, checkpoint, replaces))
                .await
            {
                self.failed(&error);
            }
        }
    }

    /// The models learned so far, by this process or, for a shared store, by others.
    pub async fn models(&self) -> Vec<ModelRecord> {
        if !self.reachable() {
            return Vec::new();
        }
        self.bounded(self.store.models())
            .await
            .inspect_err(|e| self.failed(e))
            .unwrap_or_default()
    }

    pub async fn put_model(&self, record: ModelRecord) {
        if self.reachable() {
            if let Err(error) = self.bounded(self.store.put_model(record)).await {
                self.failed(&error);
            }
        }
    }

    /// The summary for `key`: one call for the concurrent requests of this process, and,
    /// with a shared store, of every process sharing it.
    pub async fn summarise<F, Fut>(&self, key: u128, work: F) -> Option<Summary>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<Summary>>,
    {
        self.flights
            .run(key, || async {
                if !self.shared() {
                    return work().await;
                }
                flight::across(self, key, &SUMMARY, work).await
            })
            .await
    }

    /// The compaction prepared for a conversation (`key` names it): made here, or, with a
    /// shared store, taken from the replica that prepared it first, so that a conversation
    /// whose turns go to several replicas pays for one preparation. The result is the hash
    /// of the prefix its checkpoint replaces, and the checkpoint.
    pub async fn prepare_once<F, Fut>(&self, key: u128, work: F) -> Option<(u128, Checkpoint)>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<(u128, Checkpoint)>>,
    {
        if !self.shared() {
            return work().await;
        }
        flight::across(self, key, &PREPARED, work).await
    }

    /// The compaction another replica prepared for the conversation `key` names, waited
    /// for while it runs: for an event on a replica that prepared nothing itself.
    pub async fn prepared_elsewhere(&self, key: u128) -> Option<(u128, Checkpoint)> {
        if !self.shared() {
            return None;
        }
        flight::made_elsewhere(self, key, &PREPARED).await.flatten()
    }

    /// Whether the store is shared with other processes and reachable now.
    fn shared(&self) -> bool {
        self.fallback.is_some() && self.reachable()
    }

    pub(super) fn shared_store(&self) -> (&dyn Store, u128, Duration) {
        (self.store.as_ref(), self.holder, self.timeout)
    }

    /// Starts the store's upkeep, and keeps the learned windows and calibration in the store
    /// for as long as the proxy runs: read at start, written as they are learned (windows at once, factors at most
    /// once a second), and, with a shared store, read again every few seconds for what
    /// other replicas learned.
    pub async fn keep_models(&self, models: &ModelWindows) {
        if let Some(upkeep) = self.store.upkeep() {
            tokio::spawn(upkeep);
        }
        models.absorb(self.models().await);
        let mut pulled = Instant::now();
        loop {
            tokio::select! {
                () = models.window_learned.notified() => {}
                () = tokio::time::sleep(SAVE_EVERY) => {}
            }
            self.save_models(models).await;
            if self.fallback.is_some() && pulled.elapsed() >= PULL_EVERY {
                models.absorb(self.models().await);
                pulled = Instant::now();
            }
        }
    }

    /// Writes what was learned and not yet written.
    pub async fn save_models(&self, models: &ModelWindows) {
        for record in models.take_unsaved() {
            self.put_model(record).await;
        }
    }

    pub async fn stats(&self) -> Result<Stats, StoreError> {
        self.store.stats().await
    }

    pub async fn clear(&self, tenant: Option<Tenant>) -> Result<u64, StoreError> {
        if let Some(fallback) = &self.fallback {
            fallback.remove_tenant(tenant);
        }
        self.store.clear(tenant).await
    }

    /// Lookups that hit and missed, and errors, by backend: the configured one and, when
    /// it is shared, memory.
    pub fn counters(&self) -> impl Iterator<Item = (Backend, &Counters)> {
        let fallback = self
            .fallback
            .as_ref()
            .map(|_| (Backend::Memory, &self.counters[1]));
        std::iter::once((self.store.backend(), &self.counters[0])).chain(fallback)
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

    fn count(&self, backend: Backend, hit: bool) {
        let counters = &self.counters[usize::from(backend != self.store.backend())];
        let counter = if hit {
            &counters.hits
        } else {
            &counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs a store operation within the store's time limit.
    pub(super) async fn bounded<T>(
        &self,
        operation: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.timeout, operation).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                backend: self.store.backend().as_str(),
                after: self.timeout,
            }),
        };
        if result.is_ok() {
            self.recovered();
        }
        result
    }

    /// Whether the store may be asked: up, or down for long enough to be tried again.
    fn reachable(&self) -> bool {
        let outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        outage.as_ref().is_none_or(|o| Instant::now() >= o.retry_at)
    }

    /// Counts and logs a store error; an outage is logged when it starts, not on every
    /// request it costs. An unreadable value is an error of that value, not an outage.
    pub(super) fn failed(&self, error: &StoreError) {
        self.counters[0].errors.fetch_add(1, Ordering::Relaxed);
        if matches!(error, StoreError::Corrupt { .. }) {
            tracing::warn!(error = %error, "a stored checkpoint was unreadable and is ignored");
            return;
        }
        let now = Instant::now();
        let mut outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        match outage.as_mut() {
            Some(o) => o.retry_at = now + RETRY_AFTER,
            None => {
                tracing::warn!(
                    backend = self.store.backend().as_str(),
                    error = %error,
                    "the checkpoint store is out of reach: serving from memory until it is back"
                );
                *outage = Some(Outage {
                    since: now,
                    retry_at: now + RETRY_AFTER,
                    reason: error.to_string(),
                });
            }
        }
    }

    fn recovered(&self) {
        let mut outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(o) = outage.take() {
            tracing::info!(
                backend = self.store.backend().as_str(),
                after_secs = o.since.elapsed().as_secs(),
                "the checkpoint store is back"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use serde_json::json;

    use super::*;
    use crate::checkpoint::store::StoreFuture;

    /// A shared store that can be switched off, in front of a memory store.
    struct Flaky {
        down: Arc<AtomicBool>,
        inner: MemoryStore,
    }

    impl Flaky {
        fn check(&self) -> Result<(), StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable {
                    backend: "redis",
                    reason: "connection refused".into(),
                });
            }
            Ok(())
        }
    }

    impl Store for Flaky {
        fn backend(&self) -> Backend {
            Backend::Redis
        }
        fn may_hold(&self, partition: Partition) -> bool {
            self.inner.may_hold(partition)
        }
        fn any(&self) -> bool {
            self.inner.any()
        }
        fn longest<'a>(
            &'a self,
            partition: Partition,
            prefixes: &'a [u128],
        ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>> {
            let result = self.check().map(|()| self.inner.get(partition, prefixes));
            Box::pin(async move { result })
        }
        fn put(
            &self,
            key: Key,
            checkpoint: Arc<Checkpoint>,
            replaces: Option<Key>,
        ) -> StoreFuture<'_, ()> {
            let result = self
                .check()
                .map(|()| self.inner.insert(key, checkpoint, replaces));
            Box::pin(async move { result })
        }
        fn held(&self) -> (usize, usize) {
            (0, 0)
        }
        fn stats(&self) -> StoreFuture<'_, Stats> {
            Box::pin(async { Ok(Stats::default()) })
        }
        fn clear(&self, _tenant: Option<Tenant>) -> StoreFuture<'_, u64> {
            Box::pin(async { Ok(0) })
        }
    }

    fn checkpoint() -> Arc<Checkpoint> {
        Arc::new(Checkpoint::new(
            1,
            10,
            vec![json!({"role": "user", "content": "S"})],
            vec![1],
            None,
            0,
        ))
    }

    #[tokio::test]
    async fn an_outage_of_a_shared_store_is_served_from_memory_and_ends_when_it_answers() {
        let down = Arc::new(AtomicBool::new(false));
        let store = Flaky {
            down: Arc::clone(&down),
            inner: MemoryStore::new(1 << 20, Duration::from_secs(60)),
        };
        let config = CacheConfig::default();
        let cache = Checkpoints::with_store(
            Box::new(store),
            Some(MemoryStore::new(1 << 20, Duration::from_secs(60))),
            &config,
            0,
        );
        let p = Partition::for_tests(1);
        let key = Key {
            partition: p,
            prefix: 7,
        };
        cache.put(key, checkpoint(), None).await;
        assert_eq!(cache.health(), Health::Up);

        down.store(true, Ordering::SeqCst);
        // Served from this process's copy while the store fails.
        assert!(cache.longest(p, &[0, 7]).await.is_some());
        let Health::Degraded { reason, .. } = cache.health() else {
            panic!("the outage shows")
        };
        assert!(reason.contains("connection refused"), "{reason}");
        // Within the second after a failure, the store is not asked again.
        assert!(cache.longest(p, &[0, 7]).await.is_some());
        let counters: Vec<_> = cache.counters().collect();
        assert_eq!(counters[0].1.errors.load(Ordering::SeqCst), 1);
        assert_eq!(counters[1].0, Backend::Memory);
        assert_eq!(counters[1].1.hits.load(Ordering::SeqCst), 2);

        down.store(false, Ordering::SeqCst);
        tokio::time::sleep(RETRY_AFTER + Duration::from_millis(50)).await;
        assert!(cache.longest(p, &[0, 7]).await.is_some());
        assert_eq!(cache.health(), Health::Up);
        assert_eq!(counters_of(&cache, 0).hits.load(Ordering::SeqCst), 1);
    }

    fn counters_of(cache: &Checkpoints, i: usize) -> &Counters {
        &cache.counters[i]
    }
}
