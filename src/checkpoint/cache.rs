//! The cache as the proxy uses it: the configured stores, and this process's memory while a
//! shared store is out of reach. A store's failure never fails a request: the lookup or
//! write goes to memory instead ([`super::outage`] says what else it costs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::checkpoint_store::{CheckpointStore, Tally};
use super::coordination::flight::{self, Across, Flights, Share, Sharing};
use super::coordination::prepared::Prepared;
use super::hash::{Key, Partition, Tenant};
use super::lease_store::LeaseStore;
use super::memory::MemoryStore;
use super::outage::Guard;
pub use super::outage::{Counters, Health};
use super::seal::{AtRest, Seal, Sealer};
use super::store::{render, Backend, StoreError};
use super::window_store::WindowStore;
use super::{codec, embedded, redis, Checkpoint};
use crate::config::{CacheBackend, CacheConfig};
use crate::engine::Summary;
use crate::model_record::ModelRecord;
use crate::windows::ModelWindows;

/// How often calibration learned is written.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How often a shared store is read for what other replicas learned of the models.
const PULL_EVERY: Duration = Duration::from_secs(2);
/// A summary made for replicas waiting on it: they take it within the minute.
const SUMMARY: Sharing<Option<Summary>> = Sharing {
    label: "summary",
    encode: |summary| codec::encode_summary(summary.as_ref()),
    decode: codec::decode_summary,
    keep: Duration::from_secs(60),
};
/// A prepared compaction: the replicas of its conversation take it at their first turn
/// past the prepare mark, or at the event, which may come many turns later.
const PREPARED: Sharing<Option<(u128, Checkpoint)>> = Sharing {
    label: "prepared",
    encode: codec::encode_prepared,
    decode: codec::decode_prepared,
    keep: Duration::from_secs(30 * 60),
};

/// The stores of one backend, by job: each backend does the jobs it can.
pub struct Stores {
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// Where learned windows are kept across restarts and replicas; `None`: nowhere.
    pub windows: Option<Arc<dyn WindowStore>>,
    /// Where processes sharing the store settle who makes a call; `None`: not shared.
    pub leases: Option<Arc<dyn LeaseStore>>,
}

/// What `compaction-proxy cache stats` prints.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub checkpoints: u64,
    pub bytes: u64,
    pub tenants: u64,
    pub models: u64,
}

pub struct Checkpoints {
    stores: Stores,
    /// Memory, for a store shared with other processes: holds this process's checkpoints
    /// too, so that an outage of the store costs its conversations nothing.
    fallback: Option<MemoryStore>,
    guard: Guard,
    /// Whether what is written is sealed (`cache.seal`).
    sealing: bool,
    sealer: Sealer,
    /// This process, when it holds a summariser call others wait on.
    holder: u128,
    flights: Flights<Option<Summary>>,
    pub prepared: Option<Prepared>,
    /// Lookups of the memory fallback.
    fallback_counters: Counters,
    /// Whether the state folder or file was left readable by others (see
    /// [`embedded::Exposure`]), for `/healthz`.
    exposed: Option<String>,
    /// Why the embedded store's default place could not be used and the checkpoints are
    /// kept in memory instead, for `/healthz`.
    in_memory_instead: Option<String>,
}

/// Why the cache could not be set up, for the message at start (which renders it whole).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cache.path {path}: {}", render(source))]
    Embedded { path: String, source: StoreError },
    #[error("cache.redis_url: {}", render(source))]
    Redis { source: ::redis::RedisError },
    #[error("cache.redis_ca_file {path}: {}", render(source))]
    RedisCa {
        path: String,
        source: redis::CaError,
    },
}

/// What became of the embedded store asked for.
enum EmbeddedOpen {
    Opened(embedded::EmbeddedStore, Option<super::file_modes::Exposure>),
    /// Why its default place could not be used.
    InMemory(String),
}

/// The embedded store at `cache.path`, or at the default place for a user's state. A
/// configured path that cannot be used is an error; so that the proxy starts anywhere (a
/// scratch container with no environment, a home it cannot write), a default one that
/// cannot is not: the checkpoints go to memory, and [`EmbeddedOpen::InMemory`] says why.
fn open_embedded(
    config: &CacheConfig,
    max_bytes: usize,
    ttl: Duration,
) -> Result<EmbeddedOpen, OpenError> {
    const INSTEAD: &str = "checkpoints are kept in memory only, until the process exits; \
                           set cache.path or XDG_STATE_HOME to keep them across restarts";
    let Some(path) = config.embedded_path() else {
        return Ok(EmbeddedOpen::InMemory(format!(
            "no state folder (neither XDG_STATE_HOME nor HOME is set): {INSTEAD}"
        )));
    };
    let configured = !config.path.is_empty();
    match embedded::EmbeddedStore::open(&path, max_bytes, ttl, !configured) {
        Ok((store, exposure)) => Ok(EmbeddedOpen::Opened(store, exposure)),
        Err(source) if configured => Err(OpenError::Embedded {
            path: path.display().to_string(),
            source,
        }),
        Err(source) => Ok(EmbeddedOpen::InMemory(format!(
            "the default store {} cannot be used ({}): {INSTEAD}",
            path.display(),
            render(&source)
        ))),
    }
}

impl Checkpoints {
    /// The cache `config` describes; `None` when it is disabled. `injected_key_env`: the
    /// variable holding the key the proxy sends upstream in sidecar mode, which every seal
    /// is derived with too.
    pub fn open(
        config: &CacheConfig,
        prepare_concurrency: usize,
        injected_key_env: Option<&str>,
    ) -> Result<Option<Checkpoints>, OpenError> {
        if !config.enabled {
            return Ok(None);
        }
        let ttl = config.ttl();
        let max_bytes = usize::try_from(config.max_bytes).unwrap_or(usize::MAX);
        let mut exposed = None;
        let mut in_memory_instead = None;
        let memory = || Stores {
            checkpoints: Arc::new(MemoryStore::new(max_bytes, ttl)),
            windows: None,
            leases: None,
        };
        let (stores, fallback) = match config.backend {
            CacheBackend::Memory => (memory(), None),
            CacheBackend::Embedded => match open_embedded(config, max_bytes, ttl)? {
                EmbeddedOpen::Opened(store, exposure) => {
                    exposed = exposure.map(|e| render(&e));
                    let store = Arc::new(store);
                    let embedded = Stores {
                        checkpoints: Arc::clone(&store) as Arc<dyn CheckpointStore>,
                        windows: Some(store),
                        leases: None,
                    };
                    (embedded, None)
                }
                EmbeddedOpen::InMemory(why) => {
                    tracing::warn!("{why}");
                    in_memory_instead = Some(why);
                    (memory(), None)
                }
            },
            CacheBackend::Redis => {
                let roots = match config.redis_ca_file.as_str() {
                    "" => None,
                    path => Some(redis::read_roots(std::path::Path::new(path)).map_err(
                        |source| OpenError::RedisCa {
                            path: path.to_owned(),
                            source,
                        },
                    )?),
                };
                let store = redis::open(&config.redis_url, &config.redis_namespace, ttl, roots)
                    .map_err(|source| OpenError::Redis { source })?;
                let store = Arc::new(store);
                let shared = Stores {
                    checkpoints: Arc::clone(&store) as Arc<dyn CheckpointStore>,
                    windows: Some(Arc::clone(&store) as Arc<dyn WindowStore>),
                    leases: Some(store),
                };
                (shared, Some(MemoryStore::new(max_bytes, ttl)))
            }
        };
        let mut checkpoints =
            Checkpoints::with_stores(stores, fallback, config, prepare_concurrency);
        checkpoints.exposed = exposed;
        checkpoints.in_memory_instead = in_memory_instead;
        let injected = injected_key_env.and_then(|name| std::env::var(name).ok());
        checkpoints.sealer = Sealer::new(injected.as_deref().map(str::as_bytes));
        Ok(Some(checkpoints))
    }

    pub fn with_stores(
        stores: Stores,
        fallback: Option<MemoryStore>,
        config: &CacheConfig,
        prepare_concurrency: usize,
    ) -> Checkpoints {
        Checkpoints {
            guard: Guard::new(stores.checkpoints.backend(), config.timeout()),
            stores,
            fallback,
            sealing: config.seal,
            sealer: Sealer::new(None),
            holder: flight::holder_id(),
            flights: Flights::default(),
            prepared: (prepare_concurrency > 0)
                .then(|| Prepared::new(prepare_concurrency, config.ttl())),
            fallback_counters: Counters::default(),
            exposed: None,
            in_memory_instead: None,
        }
    }

    pub fn backend(&self) -> Backend {
        self.stores.checkpoints.backend()
    }

    /// The key a request's checkpoints are sealed with, from its credential: derived for
    /// the request, kept by nothing else.
    pub fn seal(&self, headers: &http::HeaderMap) -> Seal {
        self.sealer.seal(headers)
    }

    fn at_rest<'a>(&self, seal: &'a Seal) -> AtRest<'a> {
        AtRest::new(seal, self.sealing)
    }

    /// Whether any tenant may have checkpoints, from memory alone.
    pub fn any(&self) -> bool {
        self.stores.checkpoints.any() || self.fallback.as_ref().is_some_and(MemoryStore::any)
    }

    /// Whether `partition` may have checkpoints, from memory alone.
    pub fn may_hold(&self, partition: Partition) -> bool {
        self.stores.checkpoints.may_hold(partition)
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
            None => self.stores.checkpoints.held(),
        }
    }

    /// The checkpoint of the longest stored prefix of a conversation, from the store, or
    /// from memory while the store is out of reach; opened with the request's `seal`.
    pub async fn longest(
        &self,
        seal: &Seal,
        partition: Partition,
        prefixes: &[u128],
    ) -> Option<(usize, Arc<Checkpoint>)> {
        if self.guard.reachable() {
            let store = &self.stores.checkpoints;
            let lookup = store.longest(partition, prefixes, self.at_rest(seal));
            match self.guard.bounded(lookup).await {
                Ok(found) => {
                    self.count(&self.guard.counters, found.is_some());
                    if found.is_some() || self.fallback.is_none() {
                        return found;
                    }
                }
                Err(error) => self.guard.failed(&error),
            }
        }
        let fallback = self.fallback.as_ref()?;
        let found = fallback.get(partition, prefixes);
        self.count(&self.fallback_counters, found.is_some());
        found
    }

    /// Keeps a checkpoint, sealed with the request's `seal`; in memory too when the store
    /// is shared, and in memory alone while the store is out of reach.
    pub async fn put(
        &self,
        seal: &Seal,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
    ) {
        if let Some(fallback) = &self.fallback {
            fallback.insert(key, Arc::clone(&checkpoint), replaces);
        }
        if self.guard.reachable() {
            let store = &self.stores.checkpoints;
            let put = store.put(key, checkpoint, replaces, self.at_rest(seal));
            if let Err(error) = self.guard.bounded(put).await {
                self.guard.write_failed(&error);
            }
        }
    }

    /// The store of learned windows, while its backend is reachable.
    fn windows(&self) -> Option<&Arc<dyn WindowStore>> {
        self.stores
            .windows
            .as_ref()
            .filter(|_| self.guard.reachable())
    }

    /// The models learned so far, by this process or, for a shared store, by others.
    pub async fn models(&self) -> Vec<ModelRecord> {
        let Some(windows) = self.windows() else {
            return Vec::new();
        };
        self.guard
            .bounded(windows.models())
            .await
            .inspect_err(|e| self.guard.failed(e))
            .unwrap_or_default()
    }

    pub async fn put_model(&self, record: ModelRecord) {
        let Some(windows) = self.windows() else {
            return;
        };
        if let Err(error) = self.guard.bounded(windows.put_model(record)).await {
            self.guard.write_failed(&error);
        }
    }

    /// The summary for `key`: one call for the concurrent requests of this process, and,
    /// with a shared store, of every process sharing it, which the request's `seal`
    /// opens.
    pub async fn summarise<F, Fut>(&self, seal: &Seal, key: u128, work: F) -> Option<Summary>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<Summary>>,
    {
        self.flights
            .run(key, || async {
                match self.across(seal) {
                    Some(via) => flight::across(via, key, &SUMMARY, work).await,
                    None => work().await,
                }
            })
            .await
    }

    /// The compaction prepared for a conversation (`key` names it): made here, or, with a
    /// shared store, taken from the replica that prepared it first, or left to the replica
    /// preparing it now, so that a conversation whose turns go to several replicas pays for
    /// one preparation. The result is the hash of the prefix its checkpoint replaces, and
    /// the checkpoint.
    pub async fn prepare_once<F, Fut>(
        &self,
        seal: &Seal,
        key: u128,
        work: F,
    ) -> Share<Option<(u128, Checkpoint)>>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<(u128, Checkpoint)>>,
    {
        match self.across(seal) {
            Some(via) => flight::once(via, key, &PREPARED, work).await,
            None => Share::Made(work().await),
        }
    }

    /// The compaction another replica prepared for the conversation `key` names, waited
    /// for while it runs: for an event on a replica that prepared nothing itself.
    pub async fn prepared_elsewhere(&self, seal: &Seal, key: u128) -> Option<(u128, Checkpoint)> {
        let via = self.across(seal)?;
        flight::made_elsewhere(via, key, &PREPARED).await.flatten()
    }

    /// Whether the compaction another replica is preparing for the conversation `key`
    /// names ends within `wait`.
    pub async fn prepared_elsewhere_within(&self, seal: &Seal, key: u128, wait: Duration) -> bool {
        match self.across(seal) {
            Some(via) => flight::ends_within(via, key, wait).await,
            None => false,
        }
    }

    /// The store shared with other processes, when there is one and it is reachable now.
    fn across<'a>(&'a self, seal: &'a Seal) -> Option<Across<'a>> {
        let leases = self.stores.leases.as_deref()?;
        self.guard.reachable().then(|| Across {
            guard: &self.guard,
            leases,
            holder: self.holder,
            rest: self.at_rest(seal),
        })
    }

    /// Starts the store's upkeep, and keeps the learned windows and calibration in the store
    /// for as long as the proxy runs: read at start, written as they are learned (windows at
    /// once, factors at most once a second), and, with a shared store, read again every few
    /// seconds for what other replicas learned.
    pub async fn keep_models(&self, models: &ModelWindows) {
        if let Some(upkeep) = self.stores.checkpoints.upkeep() {
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

    /// What the stores hold, counted without opening a checkpoint.
    pub async fn stats(&self) -> Result<Stats, StoreError> {
        let tally = self.stores.checkpoints.tally().await?;
        let models = match &self.stores.windows {
            Some(windows) => windows.models().await?.len() as u64,
            None => 0,
        };
        let Tally {
            checkpoints,
            bytes,
            tenants,
        } = tally;
        Ok(Stats {
            checkpoints,
            bytes,
            tenants,
            models,
        })
    }

    /// Drops every checkpoint (with the learned models and any shared call's lease and
    /// result), or `tenant`'s checkpoints only. Returns the number of checkpoints dropped.
    pub async fn clear(&self, tenant: Option<Tenant>) -> Result<u64, StoreError> {
        if let Some(fallback) = &self.fallback {
            fallback.remove_tenant(tenant);
        }
        if tenant.is_none() {
            if let Some(leases) = &self.stores.leases {
                leases.clear_leases().await?;
            }
            if let Some(windows) = &self.stores.windows {
                windows.clear_models().await?;
            }
        }
        self.stores.checkpoints.clear(tenant).await
    }

    /// Lookups that hit and missed, and errors, by backend: the configured one and, when
    /// it is shared, memory.
    pub fn counters(&self) -> impl Iterator<Item = (Backend, &Counters)> {
        let fallback = self
            .fallback
            .as_ref()
            .map(|_| (Backend::Memory, &self.fallback_counters));
        std::iter::once((self.backend(), &self.guard.counters)).chain(fallback)
    }

    pub fn health(&self) -> Health {
        self.guard.health()
    }

    /// Why the checkpoints are in memory although the embedded store was asked for: its
    /// default place could not be used. For `/healthz`.
    pub fn in_memory_instead(&self) -> Option<&str> {
        self.in_memory_instead.as_deref()
    }

    /// What is wrong with the store's files' modes, when the proxy could not make them
    /// its user's alone: for `/healthz`.
    pub fn exposed(&self) -> Option<&str> {
        self.exposed.as_deref()
    }

    fn count(&self, counters: &Counters, hit: bool) {
        let counter = if hit {
            &counters.hits
        } else {
            &counters.misses
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    use super::*;
    use crate::checkpoint::hash::Tenant;
    use crate::checkpoint::outage::RETRY_AFTER;
    use crate::checkpoint::store::StoreFuture;

    /// A shared store that can be switched off, in front of a memory store.
    struct Flaky {
        down: Arc<AtomicBool>,
        inner: MemoryStore,
    }

    impl Flaky {
        fn check(&self) -> Result<(), StoreError> {
            if self.down.load(Ordering::SeqCst) {
                let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                return Err(StoreError::Redis {
                    address: "127.0.0.1:6379".into(),
                    source: refused.into(),
                });
            }
            Ok(())
        }
    }

    impl CheckpointStore for Flaky {
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
            _rest: AtRest<'a>,
        ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>> {
            let result = self.check().map(|()| self.inner.get(partition, prefixes));
            Box::pin(async move { result })
        }
        fn put<'a>(
            &'a self,
            key: Key,
            checkpoint: Arc<Checkpoint>,
            replaces: Option<Key>,
            _rest: AtRest<'a>,
        ) -> StoreFuture<'a, ()> {
            let result = self
                .check()
                .map(|()| self.inner.insert(key, checkpoint, replaces));
            Box::pin(async move { result })
        }
        fn held(&self) -> (usize, usize) {
            (0, 0)
        }
        fn tally(&self) -> StoreFuture<'_, Tally> {
            Box::pin(async { Ok(Tally::default()) })
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
        let stores = Stores {
            checkpoints: Arc::new(store),
            windows: None,
            leases: None,
        };
        let cache = Checkpoints::with_stores(
            stores,
            Some(MemoryStore::new(1 << 20, Duration::from_secs(60))),
            &config,
            0,
        );
        let seal = Sealer::new(None).seal_credential(b"sk-1");
        let p = Partition::for_tests(1);
        let key = Key {
            partition: p,
            prefix: 7,
        };
        cache.put(&seal, key, checkpoint(), None).await;
        assert_eq!(cache.health(), Health::Up);

        down.store(true, Ordering::SeqCst);
        // Served from this process's copy while the store fails.
        assert!(cache.longest(&seal, p, &[0, 7]).await.is_some());
        let Health::Degraded { reason, .. } = cache.health() else {
            panic!("the outage shows")
        };
        // The error and its cause, rendered once.
        assert!(reason.contains("127.0.0.1:6379"), "{reason}");
        assert!(reason.contains("refused"), "{reason}");
        // Within the second after a failure, the store is not asked again.
        assert!(cache.longest(&seal, p, &[0, 7]).await.is_some());
        let counters: Vec<_> = cache.counters().collect();
        assert_eq!(counters[0].1.errors.load(Ordering::SeqCst), 1);
        assert_eq!(counters[1].0, Backend::Memory);
        assert_eq!(counters[1].1.hits.load(Ordering::SeqCst), 2);

        down.store(false, Ordering::SeqCst);
        tokio::time::sleep(RETRY_AFTER + Duration::from_millis(50)).await;
        assert!(cache.longest(&seal, p, &[0, 7]).await.is_some());
        assert_eq!(cache.health(), Health::Up);
        assert_eq!(cache.guard.counters.hits.load(Ordering::SeqCst), 1);
    }
}
