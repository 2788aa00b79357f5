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
//! index when it is looked up, unless its write is still under way (a checkpoint being
//! written is looked up in memory). The time to live counts from a checkpoint's last write
//! across a restart, from its last use within one run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};

use super::checkpoint_store::{CheckpointStore, Tally};
use super::codec::{now_secs, CodecError};
use super::file_modes::{self, Exposure};
use super::hash::{Key, Partition, Tenant};
use super::memory::{Held, Lru};
use super::seal::AtRest;
use super::store::{render, Backend, StoreError, StoreFuture};
use super::window_store::WindowStore;
use super::Checkpoint;
use crate::model_record::ModelRecord;

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
    /// The checkpoints indexed whose rows are not in the file yet: a write may outlast the
    /// store's time limit (the `cache` command holding the file's lock, a disk slow to
    /// sync), and a lookup in the meantime is answered from here. Taken for a checkpoint
    /// cleared by another process instead, it would be dropped from the index, and unused
    /// until a restart although its row lands a moment later.
    writing: Arc<Mutex<HashMap<Key, Arc<Checkpoint>>>>,
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

fn corrupt(source: CodecError) -> StoreError {
    StoreError::Corrupt {
        backend: BACKEND,
        source,
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
    /// Opens the file at `path`, creating it and its folder on first use, its user's
    /// alone, and reads back which checkpoints it holds. `own_folder`: the folder is the
    /// proxy's (the default place), and is made private too if it is not; a folder the
    /// operator chose is left as it is. Returns, besides the store, what could not be made
    /// private. `Err` says why it cannot be used, for the message at start.
    pub fn open(
        path: &Path,
        max_bytes: usize,
        ttl: Duration,
        own_folder: bool,
    ) -> Result<(EmbeddedStore, Option<Exposure>), StoreError> {
        let folder = path.parent().filter(|d| !d.as_os_str().is_empty());
        let created = match folder {
            Some(dir) => file_modes::create_folder(dir).map_err(|source| StoreError::Folder {
                path: dir.to_owned(),
                source,
            })?,
            None => false,
        };
        file_modes::create_file(path).map_err(|source| StoreError::Folder {
            path: path.to_owned(),
            source,
        })?;
        let open = || -> rusqlite::Result<File> {
            let writer = connect(path)?;
            writer.execute_batch(SCHEMA)?;
            Ok(File {
                reader: Mutex::new(connect(path)?),
                writer: Mutex::new(writer),
            })
        };
        let file = open().map_err(StoreError::File)?;
        let store = EmbeddedStore {
            file: Arc::new(file),
            index: Mutex::new(Lru::new(max_bytes, ttl)),
            writing: Arc::default(),
        };
        store.load()?;
        let folder = folder.filter(|_| own_folder || created);
        Ok((store, make_private(folder, path)))
    }

    /// Rebuilds the index in memory from the file, oldest first so that use order
    /// survives the restart, and drops from the file what has expired or no longer fits.
    fn load(&self) -> Result<(), StoreError> {
        let rows = {
            let connection = lock(&self.file.reader);
            let mut statement = connection
                .prepare("SELECT tenant, scope, prefix, prefix_len, size, at FROM checkpoints ORDER BY at")
                .map_err(StoreError::File)?;
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
                .map_err(StoreError::File)?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(StoreError::File)?
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

    fn in_writing(&self) -> MutexGuard<'_, HashMap<Key, Arc<Checkpoint>>> {
        self.writing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `work` on the file, on a blocking thread: to its end, even when the caller
    /// stops waiting for it (a write that outlasts the store's time limit still lands).
    async fn on_file<T: Send + 'static>(
        &self,
        work: impl FnOnce(&File) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let file = Arc::clone(&self.file);
        tokio::task::spawn_blocking(move || work(&file))
            .await
            .map_err(StoreError::Worker)?
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

/// Makes the folder (when it is the proxy's) and the database with its WAL and shared
/// memory their user's alone; what cannot be is logged, and the first returned.
fn make_private(folder: Option<&Path>, path: &Path) -> Option<Exposure> {
    let mut files = vec![path.to_owned()];
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        files.push(name.into());
    }
    let paths = folder.map(Path::to_owned).into_iter().chain(files);
    let mut exposures = paths.filter_map(|p| file_modes::tighten(&p).err());
    let first = exposures.next()?;
    for exposure in std::iter::once(&first).chain(exposures.by_ref().collect::<Vec<_>>().iter()) {
        tracing::warn!(
            error = %render(exposure),
            "the checkpoint store's files are readable by other users"
        );
    }
    Some(first)
}

/// Deletes `keys`' rows in one transaction.
fn remove_rows(connection: &mut Connection, keys: &[Key]) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    let transaction = connection.transaction().map_err(StoreError::File)?;
    {
        let mut delete = transaction
            .prepare_cached(
                "DELETE FROM checkpoints WHERE tenant = ?1 AND scope = ?2 AND prefix = ?3",
            )
            .map_err(StoreError::File)?;
        for key in keys {
            delete
                .execute(params![
                    id(key.partition.tenant.0),
                    id(key.partition.scope),
                    id(key.prefix)
                ])
                .map_err(StoreError::File)?;
        }
    }
    transaction.commit().map_err(StoreError::File)
}

/// Writes a checkpoint's row (when `kept`, that is, when it fitted) and deletes the rows of
/// the checkpoints it made room for.
fn write(
    file: &File,
    key: Key,
    meta: Meta,
    kept: bool,
    dropped: &[Key],
    bytes: Vec<u8>,
) -> Result<(), StoreError> {
    let mut connection = lock(&file.writer);
    remove_rows(&mut connection, dropped)?;
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
            .map_err(StoreError::File)?;
    }
    Ok(())
}

impl CheckpointStore for EmbeddedStore {
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
        rest: AtRest<'a>,
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
            // Looked for before the file, not after: a write that ends in between has left
            // its row there, and a row missing after it is no late write.
            if let Some(checkpoint) = self.in_writing().get(&key) {
                return Ok(Some((len, Arc::clone(checkpoint))));
            }
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
                        .map_err(StoreError::File)
                })
                .await?;
            let Some(bytes) = bytes else {
                // Cleared from the file by another process since it was indexed.
                self.lock().remove(&key);
                return Ok(None);
            };
            let (checkpoint, _) = rest.open_checkpoint(key, bytes).map_err(corrupt)?;
            Ok(Some((len, Arc::new(checkpoint))))
        })
    }

    fn put<'a>(
        &'a self,
        key: Key,
        checkpoint: Arc<Checkpoint>,
        replaces: Option<Key>,
        rest: AtRest<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let bytes = rest.checkpoint(key, &checkpoint);
            let meta = Meta {
                prefix_len: checkpoint.prefix_len,
                size: bytes.len(),
            };
            // In `writing` before the index: a lookup that finds it indexed finds it there.
            self.in_writing().insert(key, Arc::clone(&checkpoint));
            let dropped = self.lock().insert(key, meta, replaces, Duration::ZERO);
            let kept = !dropped.contains(&key);
            let writing = Arc::clone(&self.writing);
            self.on_file(move |file| {
                let written = write(file, key, meta, kept, &dropped, bytes);
                // Landed or failed, the file now answers for it; a later write of the same
                // key, still under way, keeps its own entry.
                let mut writing = writing.lock().unwrap_or_else(PoisonError::into_inner);
                if writing
                    .get(&key)
                    .is_some_and(|c| Arc::ptr_eq(c, &checkpoint))
                {
                    writing.remove(&key);
                }
                written
            })
            .await
        })
    }

    fn held(&self) -> (usize, usize) {
        self.lock().held()
    }

    fn tally(&self) -> StoreFuture<'_, Tally> {
        // Read from the file, not the index: the `cache` command runs in its own process.
        Box::pin(self.on_file(|file| {
            lock(&file.reader)
                .query_row(
                    "SELECT count(*), coalesce(sum(size), 0), count(DISTINCT tenant) FROM checkpoints",
                    [],
                    |row| {
                        Ok(Tally {
                            checkpoints: unsigned(row.get(0)?),
                            bytes: unsigned(row.get(1)?),
                            tenants: unsigned(row.get(2)?),
                        })
                    },
                )
                .map_err(StoreError::File)
        }))
    }

    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            self.lock().remove_tenant(tenant);
            self.on_file(move |file| {
                let connection = lock(&file.writer);
                let dropped = match tenant {
                    Some(t) => connection.execute(
                        "DELETE FROM checkpoints WHERE tenant = ?1",
                        params![id(t.0)],
                    ),
                    None => connection.execute("DELETE FROM checkpoints", []),
                }
                .map_err(StoreError::File)?;
                Ok(dropped as u64)
            })
            .await
        })
    }
}

impl WindowStore for EmbeddedStore {
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
                .map_err(StoreError::File)
        }))
    }

    fn clear_models(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.on_file(|file| {
            lock(&file.writer)
                .execute("DELETE FROM models", [])
                .map(drop)
                .map_err(StoreError::File)
        }))
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
        .map_err(StoreError::File)?;
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
        .map_err(StoreError::File)?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(StoreError::File)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::checkpoint::fixtures::{key, rest};

    /// Unlike [`crate::checkpoint::fixtures::checkpoint`], with the role that follows the
    /// form: the file must keep every field.
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
        EmbeddedStore::open(path, 1 << 20, ttl, true).unwrap().0
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn what_one_process_stored_the_next_finds_byte_for_byte() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        store
            .put(key(1, 20), checkpoint(2, "two"), None, rest())
            .await
            .unwrap();
        store
            .put(key(1, 40), checkpoint(4, "four"), Some(key(1, 20)), rest())
            .await
            .unwrap();
        store
            .put(key(2, 40), checkpoint(4, "other tenant"), None, rest())
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
            .longest(p, &[0, 10, 20, 30, 40, 50], rest())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (len, found.messages[0]["content"].as_str()),
            (4, Some("four"))
        );
        assert_eq!(found.next_role.as_deref(), Some("assistant"));
        assert!(store
            .longest(p, &[0, 10, 20], rest())
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_checkpoint_replacing_one_of_the_same_prefix_takes_its_place() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        let p = Partition::for_tests(1);
        let hashes = [0, 10, 20, 30];
        store
            .put(key(1, 20), checkpoint(2, "first"), None, rest())
            .await
            .unwrap();
        // The resumed form compacted further: the same client prefix, a new form.
        store
            .put(
                key(1, 20),
                checkpoint(2, "second"),
                Some(key(1, 20)),
                rest(),
            )
            .await
            .unwrap();
        let content = |found: Option<(usize, Arc<Checkpoint>)>| {
            found.and_then(|(_, c)| c.messages[0]["content"].as_str().map(str::to_owned))
        };
        let found = store.longest(p, &hashes, rest()).await.unwrap();
        assert_eq!(content(found).as_deref(), Some("second"));
        drop(store);
        let store = open(&path, Duration::from_secs(60));
        let found = store.longest(p, &hashes, rest()).await.unwrap();
        assert_eq!(content(found).as_deref(), Some("second"), "in the file too");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_checkpoint_past_its_time_to_live_is_dropped_at_start() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        store
            .put(key(1, 20), checkpoint(2, "old"), None, rest())
            .await
            .unwrap();
        drop(store);
        // Its write is a second or more in the past by the time the file is reopened.
        std::thread::sleep(Duration::from_millis(1100));
        let store = open(&path, Duration::from_millis(500));
        assert_eq!(store.held(), (0, 0));
        assert_eq!(store.tally().await.unwrap().checkpoints, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn one_tenant_is_cleared_from_the_file_and_the_index() {
        let path = file();
        let store = open(&path, Duration::from_secs(60));
        store
            .put(key(1, 20), checkpoint(2, "a"), None, rest())
            .await
            .unwrap();
        store
            .put(key(2, 20), checkpoint(2, "b"), None, rest())
            .await
            .unwrap();
        assert_eq!(store.clear(Some(Tenant(1))).await.unwrap(), 1);
        assert!(!store.may_hold(Partition::for_tests(1)));
        let stats = store.tally().await.unwrap();
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
