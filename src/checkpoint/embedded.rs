//! Checkpoints in one file on this host, kept across restarts: the default store. The
//! engine is SQLite (bundled, so nothing is needed on the host), in WAL mode with every
//! commit synced: a process killed mid-write leaves the last commit intact, and the next
//! start recovers in milliseconds. The README gives the measurements it was picked by,
//! against redb.
//!
//! Which checkpoints exist is also kept in memory (an [`Lru`] of a few dozen bytes per
//! checkpoint, read back from the file at start), so that a request of a tenant with no
//! checkpoint never touches the file, and a lookup reads the one checkpoint it found. The
//! file is read and written on tokio's blocking threads, never on the threads that move
//! requests' bytes. `compaction-proxy cache stats|clear` may open the file while the proxy
//! runs: a checkpoint the index names but the file no longer holds is dropped from the
//! index when it is looked up. The time to live counts from a checkpoint's last write
//! across a restart, from its last use within one run.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};

use super::codec::{self, now_secs};
use super::hash::{Partition, Tenant};
use super::memory::{Held, Lru};
use super::store::{Backend, Key, Stats, Store, StoreError, StoreFuture};
use crate::model_record::ModelRecord;
use super::Checkpoint;

const BACKEND: &str = "embedded";

/// The layout. Ids are 16-byte big-endian blobs; the index's columns come before the value,
/// so that reading them at start does not read the checkpoints.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS checkpoints (
    tenant BLOB NOT NULL,
    scope BLOB NOT NULL,
    prefix BLOB NOT NULL,
    prefix_len INTEGER NOT NULL,
    size INTEGER NOT NULL,
    at INTEGER NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (tenant, scope, prefix)
);
CREATE TABLE IF NOT EXISTS models (
    upstream TEXT NOT NULL,
    model TEXT NOT NULL,
    window INTEGER,
    refusal REAL,
    usage REAL,
    PRIMARY KEY (upstream, model)
);
";

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

/// The file's two connections: lookups read while a write commits (WAL).
struct File {
    reader: Mutex<Connection>,
    writer: Mutex<Connection>,
}

fn lock(connection: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    connection.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct EmbeddedStore {
    file: Arc<File>,
    index: Mutex<Lru<Meta>>,
}

fn id(n: u128) -> [u8; 16] {
    n.to_be_bytes()
}

fn from_id(bytes: &[u8]) -> u128 {
    let mut id = [0u8; 16];
    let n = bytes.len().min(16);
    id[16 - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    u128::from_be_bytes(id)
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable {
        backend: BACKEND,
        reason: error.to_string(),
    }
}

fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open(path)?;
    // Another process (the `cache` command) may hold the write lock for a moment.
    connection.busy_timeout(Duration::from_secs(2))?;
    connection.pragma_update(None, "journal_mode", "WAL")?;
    // Every commit is on the disk when it returns: a checkpoint the client was answered
    // with is there after a crash.
    connection.pragma_update(None, "synchronous", "FULL")?;
    Ok(connection)
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
        let open = || -> rusqlite::Result<File> {
            let writer = connect(path)?;
            writer.execute_batch(SCHEMA)?;
            Ok(File {
                reader: Mutex::new(connect(path)?),
                writer: Mutex::new(writer),
            })
        };
        let file = open().map_err(|e| format!("cannot be opened as a cache: {e}"))?;
        let store = EmbeddedStore {
            file: Arc::new(file),
            index: Mutex::new(Lru::new(max_bytes, ttl)),
        };
        store.load().map_err(|e| e.to_string())?;
        Ok(store)
    }

    /// Rebuilds the index in memory from the file, oldest first so that use order
    /// survives the restart, and drops from the file what has expired or no longer fits.
    fn load(&self) -> Result<(), StoreError> {
        let rows = {
            let connection = lock(&self.file.reader);
            let mut statement = connection
                .prepare("SELECT tenant, scope, prefix, prefix_len, size, at FROM checkpoints ORDER BY at")
                .map_err(unavailable)?;
            let rows = statement
                .query_map([], |row| {
                    let key = Key {
                        partition: Partition {
                            tenant: Tenant(from_id(&row.get::<_, Vec<u8>>(0)?)),
                            scope: from_id(&row.get::<_, Vec<u8>>(1)?),
                        },
                        prefix: from_id(&row.get::<_, Vec<u8>>(2)?),
                    };
                    let meta = Meta {
                        prefix_len: unsigned(row.get(3)?),
                        size: unsigned(row.get(4)?),
                    };
                    Ok((key, meta, unsigned(row.get(5)?)))
                })
                .map_err(unavailable)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)?
        };
        let now = now_secs();
        let mut dropped = Vec::new();
        {
            let mut index = self.lock();
            for (key, meta, at) in rows {
                let age = Duration::from_secs(now.saturating_sub(at));
                dropped.extend(index.insert(key, meta, None, age));
            }
        }
        remove_rows(&mut lock(&self.file.writer), &dropped)
    }

    fn lock(&self) -> MutexGuard<'_, Lru<Meta>> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `work` on the file, on a blocking thread.
    async fn on_file<T: Send + 'static>(
        &self,
        work: impl FnOnce(&File) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let file = Arc::clone(&self.file);
        tokio::task::spawn_blocking(move || work(&file))
            .await
            .map_err(unavailable)?
    }

    /// Drops expired checkpoints from the file, in the background: nothing waits on it.
    fn forget(&self, keys: Vec<Key>) {
        if keys.is_empty() {
            return;
        }
        let file = Arc::clone(&self.file);
        tokio::task::spawn_blocking(move || {
            if let Err(error) = remove_rows(&mut lock(&file.writer), &keys) {
                tracing::warn!(error = %error, "could not drop expired checkpoints from the file");
            }
        });
    }
}

/// Deletes `keys`' rows in one transaction.
fn remove_rows(connection: &mut Connection, keys: &[Key]) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    let transaction = connection.transaction().map_err(unavailable)?;
    {
        let mut delete = transaction
            .prepare_cached(
                "DELETE FROM checkpoints WHERE tenant = ?1 AND scope = ?2 AND prefix = ?3",
            )
            .map_err(unavailable)?;
        for key in keys {
            delete
                .execute(params![
                    id(key.partition.tenant.0),
                    id(key.partition.scope),
                    id(key.prefix)
                ])
                .map_err(unavailable)?;
        }
    }
    transaction.commit().map_err(unavailable)
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
                let mut index = self.lock();
                let expired = index.expire(Instant::now());
                let found = index.longest(partition, prefixes).map(|(len, _)| len);
                (found, expired)
            };
            self.forget(expired);
            let Some(len) = found else { return Ok(None) };
            let key = Key {
                partition,
                prefix: prefixes[len],
            };
            let bytes = self
                .on_file(move |file| {
                    lock(&file.reader)
                        .prepare_cached(
                            "SELECT value FROM checkpoints WHERE tenant = ?1 AND scope = ?2 AND prefix = ?3",
                        )
                        .and_then(|mut s| {
                            s.query_row(
                                params![id(key.partition.tenant.0), id(key.partition.scope), id(key.prefix)],
                                |row| row.get::<_, Vec<u8>>(0),
                            )
                            .optional()
                        })
                        .map_err(unavailable)
                })
                .await?;
            let Some(bytes) = bytes else {
                // Cleared from the file by another process since it was indexed.
                self.lock().remove(&key);
                return Ok(None);
            };
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
            self.on_file(move |file| {
                let mut connection = lock(&file.writer);
                remove_rows(&mut connection, &dropped)?;
                if kept {
                    connection
                        .prepare_cached(
                            "INSERT OR REPLACE INTO checkpoints (tenant, scope, prefix, prefix_len, size, at, value) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        )
                        .and_then(|mut s| {
                            s.execute(params![
                                id(key.partition.tenant.0),
                                id(key.partition.scope),
                                id(key.prefix),
                                signed(meta.prefix_len),
                                signed(meta.size),
                                signed(now_secs()),
                                bytes
                            ])
                        })
                        .map_err(unavailable)?;
                }
                Ok(())
            })
            .await
        })
    }

    fn held(&self) -> (usize, usize) {
        self.lock().held()
    }

    fn models(&self) -> StoreFuture<'_, Vec<ModelRecord>> {
        Box::pin(self.on_file(|file| read_models(&lock(&file.reader))))
    }

    fn put_model(&self, record: ModelRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.on_file(move |file| {
            // Only the fields learned are written; the others keep what was there.
            lock(&file.writer)
                .prepare_cached(
                    "INSERT INTO models (upstream, model, window, refusal, usage) VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (upstream, model) DO UPDATE SET \
                     window = coalesce(excluded.window, window), \
                     refusal = coalesce(excluded.refusal, refusal), \
                     usage = coalesce(excluded.usage, usage)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        record.upstream,
                        record.model,
                        record.window.map(signed),
                        record.refusal,
                        record.usage
                    ])
                })
                .map(drop)
                .map_err(unavailable)
        }))
    }

    fn stats(&self) -> StoreFuture<'_, Stats> {
        // Read from the file, not the index: the `cache` command runs in its own process.
        Box::pin(self.on_file(|file| {
            let connection = lock(&file.reader);
            let (checkpoints, bytes, tenants) = connection
                .query_row(
                    "SELECT count(*), coalesce(sum(size), 0), count(DISTINCT tenant) FROM checkpoints",
                    [],
                    |row| Ok((unsigned(row.get(0)?), unsigned(row.get(1)?), unsigned(row.get(2)?))),
                )
                .map_err(unavailable)?;
            let models = connection
                .query_row("SELECT count(*) FROM models", [], |row| row.get(0).map(unsigned))
                .map_err(unavailable)?;
            Ok(Stats {
                checkpoints,
                bytes,
                tenants,
                models,
            })
        }))
    }

    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            {
                let mut index = self.lock();
                for key in index.keys(tenant) {
                    index.remove(&key);
                }
            }
            self.on_file(move |file| {
                let connection = lock(&file.writer);
                let dropped = match tenant {
                    Some(t) => connection.execute(
                        "DELETE FROM checkpoints WHERE tenant = ?1",
                        params![id(t.0)],
                    ),
                    None => connection
                        .execute("DELETE FROM checkpoints", [])
                        .and_then(|n| connection.execute("DELETE FROM models", []).map(|_| n)),
                }
                .map_err(unavailable)?;
                Ok(dropped as u64)
            })
            .await
        })
    }
}

/// SQLite's integers are signed; ours are counts and sizes, never negative.
fn signed<T: TryInto<i64>>(n: T) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

fn unsigned<T: TryFrom<i64> + Default>(n: i64) -> T {
    T::try_from(n).unwrap_or_default()
}

fn read_models(connection: &Connection) -> Result<Vec<ModelRecord>, StoreError> {
    let mut statement = connection
        .prepare_cached("SELECT upstream, model, window, refusal, usage FROM models")
        .map_err(unavailable)?;
    let rows = statement
        .query_map([], |row| {
            Ok(ModelRecord {
                upstream: row.get(0)?,
                model: row.get(1)?,
                window: row.get::<_, Option<i64>>(2)?.map(unsigned),
                refusal: row.get(3)?,
                usage: row.get(4)?,
            })
        })
        .map_err(unavailable)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn checkpoint(prefix_len: usize, text: &str) -> Arc<Checkpoint> {
        Arc::new(Checkpoint::new(
            prefix_len,
            100,
            vec![json!({"role": "user", "content": text})],
            vec![5],
            Some("assistant".into()),
            0,
        ))
    }

    fn key(tenant: u128, prefix: u128) -> Key {
        Key {
            partition: Partition::for_tests(tenant),
            prefix,
        }
    }

    fn file() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "embedded-store-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("nested").join("cache.sqlite3")
    }

    fn open(path: &Path, ttl: Duration) -> EmbeddedStore {
        EmbeddedStore::open(path, 1 << 20, ttl).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn what_one_process_stored_the_next_finds_byte_for_byte() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        store
            .put(key(1, 20), checkpoint(2, "two"), None)
            .await
            .unwrap();
        store
            .put(key(1, 40), checkpoint(4, "four"), Some(key(1, 20)))
            .await
            .unwrap();
        store
            .put(key(2, 40), checkpoint(4, "other tenant"), None)
            .await
            .unwrap();
        drop(store);

        let store = open(&path, Duration::from_secs(60));
        assert_eq!(
            store.held().0,
            2,
            "the replaced checkpoint is gone from the file"
        );
        let p = Partition::for_tests(1);
        assert!(store.may_hold(p) && !store.may_hold(Partition::for_tests(3)));
        let (len, found) = store
            .longest(p, &[0, 10, 20, 30, 40, 50])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (len, found.messages[0]["content"].as_str()),
            (4, Some("four"))
        );
        assert_eq!(found.next_role.as_deref(), Some("assistant"));
        assert!(store.longest(p, &[0, 10, 20]).await.unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_checkpoint_past_its_time_to_live_is_dropped_at_start() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        store
            .put(key(1, 20), checkpoint(2, "old"), None)
            .await
            .unwrap();
        drop(store);
        // Its write is a second or more in the past by the time the file is reopened.
        std::thread::sleep(Duration::from_millis(1100));
        let store = open(&path, Duration::from_millis(500));
        assert_eq!(store.held(), (0, 0));
        assert_eq!(store.stats().await.unwrap().checkpoints, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn one_tenant_is_cleared_from_the_file_and_the_index() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        store
            .put(key(1, 20), checkpoint(2, "a"), None)
            .await
            .unwrap();
        store
            .put(key(2, 20), checkpoint(2, "b"), None)
            .await
            .unwrap();
        assert_eq!(store.clear(Some(Tenant(1))).await.unwrap(), 1);
        assert!(!store.may_hold(Partition::for_tests(1)));
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.checkpoints, stats.tenants), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_model_s_fields_are_written_one_at_a_time() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        let record = |window, usage| ModelRecord {
            upstream: "http://u".into(),
            model: "m".into(),
            window,
            refusal: None,
            usage,
        };
        store.put_model(record(Some(4096), None)).await.unwrap();
        store.put_model(record(None, Some(1.25))).await.unwrap();
        assert_eq!(
            store.models().await.unwrap(),
            vec![record(Some(4096), Some(1.25))]
        );
    }
}
