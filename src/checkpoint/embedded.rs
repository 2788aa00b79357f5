//! Checkpoints in one file on this host, kept across restarts: the default store. The
//! engine is redb (pure Rust, one file, copy-on-write B-trees committed with a checksum
//! and fsync, so a process killed mid-write leaves the last commit intact); see the README
//! for the measurements it was picked by.
//!
//! Which checkpoints exist is kept in memory too (an [`Lru`] of a few dozen bytes per
//! checkpoint, read back from the file at start), so that a request of a tenant with no
//! checkpoint never touches the disk, and a lookup reads the file only for the one
//! checkpoint it found. The file's reads and writes run on tokio's blocking threads,
//! never on the threads that move requests' bytes. The time to live counts from a
//! checkpoint's last write across a restart, from its last use within one run.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::codec;
use super::hash::{Partition, Tenant};
use super::memory::{Held, Lru};
use super::store::{Backend, Key, ModelRecord, Stats, Store, StoreError, StoreFuture};
use super::Checkpoint;

/// (tenant, partition scope, prefix hash) -> the checkpoint, as [`codec`] writes it.
const CHECKPOINTS: TableDefinition<(u128, u128, u128), &[u8]> = TableDefinition::new("checkpoints");
/// The same keys -> (prefix length, bytes of the value, seconds since the epoch of the
/// write): what the index in memory is rebuilt from at start, without reading checkpoints.
const INDEX: TableDefinition<(u128, u128, u128), (u64, u64, u64)> = TableDefinition::new("index");
/// "upstream\nmodel" -> a [`ModelRecord`] as JSON.
const MODELS: TableDefinition<&str, &[u8]> = TableDefinition::new("models");

const BACKEND: &str = "embedded";

/// Where a checkpoint is, for the index in memory.
#[derive(Clone, Copy)]
struct Meta {
    prefix_len: usize,
    size: usize,
}

impl Held for Meta {
    fn prefix_len(&self) -> usize {
        self.prefix_len
    }
    fn size(&self) -> usize {
        self.size
    }
}

pub struct EmbeddedStore {
    db: Arc<Database>,
    index: Mutex<Lru<Meta>>,
}

fn row(key: &Key) -> (u128, u128, u128) {
    (key.partition.tenant.0, key.partition.scope, key.prefix)
}

fn key_of((tenant, scope, prefix): (u128, u128, u128)) -> Key {
    Key {
        partition: Partition {
            tenant: Tenant(tenant),
            scope,
        },
        prefix,
    }
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        reason: error.to_string(),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl EmbeddedStore {
    /// Opens the file at `path`, creating it and its folder on first use, and reads back
    /// which checkpoints it holds. `Err` says why it cannot be used, for the message at
    /// start.
    pub fn open(path: &Path, max_bytes: usize, ttl: Duration) -> Result<EmbeddedStore, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create its folder {}: {e}", dir.display()))?;
        }
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                "in use by another process (another compaction-proxy?); give each process its own cache.path, or use cache.backend = \"redis\" to share one cache".to_string()
            }
            other => other.to_string(),
        })?;
        let store = EmbeddedStore {
            db: Arc::new(db),
            index: Mutex::new(Lru::new(max_bytes, ttl)),
        };
        store.load().map_err(|e| e.to_string())?;
        Ok(store)
    }

    /// Rebuilds the index in memory from the file, dropping from the file what has
    /// expired or no longer fits.
    fn load(&self) -> Result<(), StoreError> {
        let write = self.db.begin_write().map_err(unavailable)?;
        let mut rows = Vec::new();
        {
            let index = write.open_table(INDEX).map_err(unavailable)?;
            write.open_table(CHECKPOINTS).map_err(unavailable)?;
            write.open_table(MODELS).map_err(unavailable)?;
            for entry in index.iter().map_err(unavailable)? {
                let (key, meta) = entry.map_err(unavailable)?;
                rows.push((key.value(), meta.value()));
            }
        }
        // Oldest first, so that use order survives the restart.
        rows.sort_by_key(|(_, (_, _, at))| *at);
        let now = now_secs();
        let mut dropped = Vec::new();
        {
            let mut lru = self.lock();
            for (key, (prefix_len, size, at)) in rows {
                let meta = Meta {
                    prefix_len: usize::try_from(prefix_len).unwrap_or(usize::MAX),
                    size: usize::try_from(size).unwrap_or(usize::MAX),
                };
                let age = Duration::from_secs(now.saturating_sub(at));
                dropped.extend(lru.insert(key_of(key), meta, None, age));
            }
        }
        remove_rows(&write, &dropped)?;
        write.commit().map_err(unavailable)
    }

    fn lock(&self) -> MutexGuard<'_, Lru<Meta>> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `work` on the file, on a blocking thread.
    async fn on_file<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || work(&db))
            .await
            .map_err(unavailable)?
    }

    /// Drops expired checkpoints from the file, in the background: nothing waits on it.
    fn forget(&self, keys: Vec<Key>) {
        if keys.is_empty() {
            return;
        }
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let result = db.begin_write().map_err(unavailable).and_then(|write| {
                remove_rows(&write, &keys)?;
                write.commit().map_err(unavailable)
            });
            if let Err(error) = result {
                tracing::warn!(error = %error, "could not drop expired checkpoints from the file");
            }
        });
    }
}

fn remove_rows(write: &redb::WriteTransaction, keys: &[Key]) -> Result<(), StoreError> {
    let mut checkpoints = write.open_table(CHECKPOINTS).map_err(unavailable)?;
    let mut index = write.open_table(INDEX).map_err(unavailable)?;
    for key in keys {
        checkpoints.remove(row(key)).map_err(unavailable)?;
        index.remove(row(key)).map_err(unavailable)?;
    }
    Ok(())
}

impl Store for EmbeddedStore {
    fn backend(&self) -> Backend {
        Backend::Embedded
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
    ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>> {
        Box::pin(async move {
            let (found, expired) = {
                let mut lru = self.lock();
                let expired = lru.expire(std::time::Instant::now());
                let found = lru.longest(partition, prefixes).map(|(len, _)| len);
                (found, expired)
            };
            self.forget(expired);
            let Some(len) = found else { return Ok(None) };
            let key = row(&Key {
                partition,
                prefix: prefixes[len],
            });
            let bytes = self
                .on_file(move |db| {
                    let read = db.begin_read().map_err(unavailable)?;
                    let table = read.open_table(CHECKPOINTS).map_err(unavailable)?;
                    let value = table.get(key).map_err(unavailable)?;
                    Ok(value.map(|v| v.value().to_vec()))
                })
                .await?;
            let Some(bytes) = bytes else { return Ok(None) };
            let (checkpoint, _) = codec::decode(&bytes).map_err(|reason| StoreError::Corrupt {
                backend: BACKEND,
                reason,
            })?;
            Ok(Some((len, Arc::new(checkpoint))))
        })
    }

    fn put(
        &self,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
    ) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let bytes = codec::encode(&checkpoint);
            let meta = Meta {
                prefix_len: checkpoint.prefix_len,
                size: bytes.len(),
            };
            let dropped = self.lock().insert(key, meta, replaces, Duration::ZERO);
            let kept = !dropped.contains(&key);
            self.on_file(move |db| {
                let write = db.begin_write().map_err(unavailable)?;
                remove_rows(&write, &dropped)?;
                if kept {
                    let mut checkpoints = write.open_table(CHECKPOINTS).map_err(unavailable)?;
                    checkpoints
                        .insert(row(&key), bytes.as_slice())
                        .map_err(unavailable)?;
                    let mut index = write.open_table(INDEX).map_err(unavailable)?;
                    let at = now_secs();
                    index
                        .insert(row(&key), (meta.prefix_len as u64, meta.size as u64, at))
                        .map_err(unavailable)?;
                }
                write.commit().map_err(unavailable)
            })
            .await
        })
    }

    fn held(&self) -> (usize, usize) {
        self.lock().held()
    }

    fn models(&self) -> StoreFuture<'_, Vec<ModelRecord>> {
        Box::pin(self.on_file(|db| {
            let read = db.begin_read().map_err(unavailable)?;
            let table = read.open_table(MODELS).map_err(unavailable)?;
            let mut records = Vec::new();
            for entry in table.iter().map_err(unavailable)? {
                let (_, value) = entry.map_err(unavailable)?;
                // A record this build cannot read is skipped: it is relearned.
                if let Ok(record) = serde_json::from_slice(value.value()) {
                    records.push(record);
                }
            }
            Ok(records)
        }))
    }

    fn put_model(&self, record: ModelRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.on_file(move |db| {
            let name = format!("{}\n{}", record.upstream, record.model);
            let write = db.begin_write().map_err(unavailable)?;
            {
                let mut table = write.open_table(MODELS).map_err(unavailable)?;
                let old: Option<ModelRecord> = table
                    .get(name.as_str())
                    .map_err(unavailable)?
                    .and_then(|v| serde_json::from_slice(v.value()).ok());
                let merged = merge(old, record);
                let bytes = serde_json::to_vec(&merged).map_err(unavailable)?;
                table
                    .insert(name.as_str(), bytes.as_slice())
                    .map_err(unavailable)?;
            }
            write.commit().map_err(unavailable)
        }))
    }

    fn stats(&self) -> StoreFuture<'_, Stats> {
        Box::pin(async move {
            let (checkpoints, bytes, tenants) = {
                let lru = self.lock();
                let (n, bytes) = lru.held();
                (n, bytes, lru.tenants())
            };
            let models = self
                .on_file(|db| {
                    let read = db.begin_read().map_err(unavailable)?;
                    let table = read.open_table(MODELS).map_err(unavailable)?;
                    table.len().map_err(unavailable)
                })
                .await?;
            Ok(Stats {
                checkpoints: checkpoints as u64,
                bytes: bytes as u64,
                tenants: tenants as u64,
                models,
            })
        })
    }

    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let keys = {
                let mut lru = self.lock();
                let keys = lru.keys(tenant);
                for key in &keys {
                    lru.remove(key);
                }
                keys
            };
            let dropped = keys.len() as u64;
            self.on_file(move |db| {
                let write = db.begin_write().map_err(unavailable)?;
                remove_rows(&write, &keys)?;
                if tenant.is_none() {
                    write.delete_table(MODELS).map_err(unavailable)?;
                }
                write.commit().map_err(unavailable)
            })
            .await?;
            Ok(dropped)
        })
    }
}

/// `update` over `old`: the fields it sets replace those of `old`.
pub fn merge(old: Option<ModelRecord>, update: ModelRecord) -> ModelRecord {
    match old {
        None => update,
        Some(old) => ModelRecord {
            window: update.window.or(old.window),
            refusal: update.refusal.or(old.refusal),
            usage: update.usage.or(old.usage),
            ..update
        },
    }
}
