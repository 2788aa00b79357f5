//! Checkpoints in Redis, shared by replicas: a conversation compacted on one replica
//! resumes on any other, the windows learned from the upstream are learned once for all,
//! and a summariser call several replicas need at once is made by one of them.
//!
//! RedisKeys, under the namespace `ns` (ids in 32 hex digits):
//! - `ns:cp:TENANT:SCOPE:PREFIX`: a checkpoint, as [`codec`] writes it, with the time to
//!   live (renewed by each use).
//! - `ns:ix:TENANT:SCOPE`: the partition's index, a hash of prefix hash -> the number of
//!   messages it covers. A lookup asks it for every prefix of the request at once
//!   (`HMGET`), so it costs one round trip whatever the number of messages, and a second
//!   for the checkpoint found. The index is per partition, not per conversation, because
//!   a store is told only a checkpoint's own prefix hash when it is put, not the hash of
//!   the conversation's first messages. A field whose checkpoint expired is dropped when
//!   a lookup finds it so.
//! - `ns:partitions`: a sorted set of `TENANT:SCOPE` by the time of their last write, and
//!   `ns:events`, the channel a replica announces a partition on when it writes one: each
//!   replica keeps the partitions that may have checkpoints in its memory, so that the
//!   requests of tenants that never needed compaction make no round trip at all.
//! - `ns:models`: one hash of `w|r|u TAB upstream TAB model` -> window, refusal factor,
//!   usage factor; a replica writes only the fields it learned, never over another's.
//! - `ns:lock:FLIGHT` and `ns:flight:FLIGHT`: who makes a summariser call, and its result.
//!
//! The client is the `redis` crate's: every operation of the process shares one
//! multiplexed connection (its `ConnectionManager`, which replaces a connection that
//! broke), and the subscription to the events has a connection of its own.
//!
//! Redis bounds its own memory (`maxmemory` with a `volatile-*` policy evicts checkpoints
//! first); `cache.max_bytes` does not apply here.
//!
//! [`codec`]: super::codec

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSub};
use ::redis::io::tcp::TcpSettings;
use ::redis::{
    Client, Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError, RedisResult, Script,
    TlsCertificates,
};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::checkpoint_store::{CheckpointStore, Tally};
use super::codec::CodecError;
use super::hash::{Key, Partition, Tenant};
use super::lease_store::{LeaseStore, Peek};
use super::seal::AtRest;
use super::store::{Backend, StoreError, StoreFuture};
use super::window_store::WindowStore;
use super::Checkpoint;
use crate::model_record::ModelRecord;

const BACKEND: &str = "redis";
/// How long opening a connection, or one reply, may take. The cache bounds each operation
/// more tightly; this bounds the upkeep's, which nothing else does.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the partitions other replicas wrote are read again whole: what a missed
/// announcement (during a reconnection, say) costs at most.
const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// The upkeep's wait before reconnecting to a Redis out of reach, doubling up to the most.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MOST: Duration = Duration::from_secs(5);
/// RedisKeys asked for per `SCAN` step.
const SCAN_COUNT: u32 = 1000;

/// Sets the lock to the holder unless another holds it; renews it if the holder does.
const CLAIM: &str = "local v = redis.call('GET', KEYS[1]) \
if v == false then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end \
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end \
return 0";
/// Leaves the result, and releases the lock only if the holder still holds it: a holder
/// whose lease lapsed must not release the claim of the process that took over.
const SETTLE: &str = "redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) \
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end \
return 1";

/// Why `cache.redis_ca_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("it cannot be read")]
    Read(#[from] std::io::Error),
    #[error("not a PEM file of certificates")]
    Pem(#[source] rustls_pki_types::pem::Error),
    #[error("no certificate in it")]
    NoCertificate,
}

/// The PEM file at `path`, once it is known to hold certificates: the certificate
/// authorities an operator trusts for `rediss://`. (The `redis` crate would take a file
/// without any and fail only at the first connection.)
pub fn read_roots(path: &Path) -> Result<Vec<u8>, CaError> {
    let pem = std::fs::read(path)?;
    let found = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(CaError::Pem)?;
    if found.is_empty() {
        return Err(CaError::NoCertificate);
    }
    Ok(pem)
}

/// The store at `url`, its keys under `namespace`. `rediss://` trusts the Mozilla roots,
/// or, given `roots` (a PEM file's certificates), those alone. Nothing is connected: a
/// Redis out of reach at start costs requests nothing (the cache serves from memory until
/// it is back). An error names what is wrong with the URL, never the password.
pub fn open(
    url: &str,
    namespace: &str,
    ttl: Duration,
    roots: Option<Vec<u8>>,
) -> Result<RedisStore, RedisError> {
    // Pipelines are written whole and read whole: nothing gains from Nagle's delay.
    let tcp = TcpSettings::default().set_nodelay(true);
    // The manager replaces a connection that fails, not one on which operations time out:
    // a Redis host gone without a reset (a dead machine, a dropped route) would hold the
    // shared connection for the kernel's retransmissions, some fifteen minutes. Data left
    // unacknowledged this long fails it instead.
    #[cfg(target_os = "linux")]
    let tcp = tcp.set_user_timeout(CONNECT_TIMEOUT);
    let info = url.into_connection_info()?.set_tcp_settings(tcp);
    let client = match roots {
        None => Client::open(info)?,
        Some(pem) => Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            },
        )?,
    };
    Ok(RedisStore {
        shared: Arc::new(Core {
            client,
            manager: Mutex::new(None),
            claim: Script::new(CLAIM),
            settle: Script::new(SETTLE),
            keys: RedisKeys {
                ns: namespace.to_owned(),
            },
            ttl,
            known: Mutex::new(Known::default()),
        }),
    })
}

pub struct RedisStore {
    /// Core with the upkeep task, which outlives any borrow of the store.
    shared: Arc<Core>,
}

struct Core {
    client: Client,
    /// The connection every operation shares, made at the first (it needs the runtime,
    /// which a store opened before it starts does not have yet).
    manager: Mutex<Option<ConnectionManager>>,
    claim: Script,
    settle: Script,
    keys: RedisKeys,
    ttl: Duration,
    known: Mutex<Known>,
}

/// The partitions that may have checkpoints, as this process knows them.
#[derive(Default)]
struct Known {
    partitions: HashSet<Partition>,
    /// Those learned since the last refresh started: a refresh replaces the set with what
    /// Redis listed, and must not lose what arrived while it was asking.
    since_refresh: HashSet<Partition>,
}

impl Known {
    fn add(&mut self, partition: Partition) {
        self.partitions.insert(partition);
        self.since_refresh.insert(partition);
    }

    fn drop_tenant(&mut self, tenant: Option<Tenant>) {
        let keep = |p: &Partition| tenant.is_some_and(|t| p.tenant != t);
        self.partitions.retain(keep);
        self.since_refresh.retain(keep);
    }
}

/// The names of the keys, under the namespace.
struct RedisKeys {
    ns: String,
}

impl RedisKeys {
    fn checkpoint(&self, key: &Key) -> String {
        format!(
            "{}:cp:{}:{}",
            self.ns,
            member(key.partition),
            hex(key.prefix)
        )
    }

    fn index(&self, partition: Partition) -> String {
        format!("{}:ix:{}", self.ns, member(partition))
    }

    fn partitions(&self) -> String {
        format!("{}:partitions", self.ns)
    }

    fn events(&self) -> String {
        format!("{}:events", self.ns)
    }

    fn models(&self) -> String {
        format!("{}:models", self.ns)
    }

    fn lock(&self, flight: u128) -> String {
        format!("{}:lock:{}", self.ns, hex(flight))
    }

    fn flight(&self, flight: u128) -> String {
        format!("{}:flight:{}", self.ns, hex(flight))
    }

    /// A `SCAN` pattern for the keys of `kind`, of `tenant` or all. The namespace is
    /// escaped: it is a name, not a pattern.
    fn pattern(&self, kind: &str, tenant: Option<Tenant>) -> String {
        let mut pattern = String::with_capacity(self.ns.len() + 48);
        for c in self.ns.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        match tenant {
            Some(tenant) => format!("{pattern}:{kind}:{}:*", hex(tenant.0)),
            None => format!("{pattern}:{kind}:*"),
        }
    }
}

fn hex(id: u128) -> String {
    format!("{id:032x}")
}

/// A partition as it is named in keys, in the sorted set and in announcements.
fn member(partition: Partition) -> String {
    format!("{}:{}", hex(partition.tenant.0), hex(partition.scope))
}

fn parse_member(text: &[u8]) -> Option<Partition> {
    let text = std::str::from_utf8(text).ok()?;
    let (tenant, scope) = text.split_once(':')?;
    Some(Partition {
        tenant: Tenant(u128::from_str_radix(tenant, 16).ok()?),
        scope: u128::from_str_radix(scope, 16).ok()?,
    })
}

/// What a replica announces on the events channel.
enum Event {
    /// `+TENANT:SCOPE`: the partition has a new checkpoint.
    Wrote(Partition),
    /// `-TENANT`, or `-` for all: checkpoints were cleared.
    Cleared(Option<Tenant>),
}

impl Event {
    fn encode(&self) -> String {
        match self {
            Event::Wrote(partition) => format!("+{}", member(*partition)),
            Event::Cleared(Some(tenant)) => format!("-{}", hex(tenant.0)),
            Event::Cleared(None) => "-".into(),
        }
    }

    fn parse(text: &[u8]) -> Option<Event> {
        match text.split_first()? {
            (b'+', rest) => parse_member(rest).map(Event::Wrote),
            (b'-', []) => Some(Event::Cleared(None)),
            (b'-', rest) => {
                let tenant = u128::from_str_radix(std::str::from_utf8(rest).ok()?, 16).ok()?;
                Some(Event::Cleared(Some(Tenant(tenant))))
            }
            _ => None,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(duration: Duration) -> u64 {
    // PX 0 is an error: a time to live rounds up to a millisecond.
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn corrupt(source: CodecError) -> StoreError {
    StoreError::Corrupt {
        backend: BACKEND,
        source,
    }
}

fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

impl Core {
    fn known(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Names where Redis is, never how to log in.
    fn unavailable(&self, source: RedisError) -> StoreError {
        StoreError::Redis {
            address: self.client.get_connection_info().addr().to_string(),
            source,
        }
    }

    /// The shared connection, connected on demand: a manager that could not connect
    /// tries again at the next operation.
    fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let mut manager = self.manager.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(manager) = manager.as_ref() {
            return Ok(manager.clone());
        }
        // One attempt per operation: the cache decides when to try again (a second after
        // a failure), and an operation must not wait on the manager's own backoff.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(0);
        let made = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|e| self.unavailable(e))?;
        *manager = Some(made.clone());
        Ok(made)
    }

    /// Runs `operation` on the shared connection. A connection that broke (Redis
    /// restarted) fails the first try while the manager replaces it, so it is tried once
    /// more, on the new one. Sending twice is safe for what the store sends: each command
    /// sets a value, or reads one, or announces a partition again.
    async fn call<T, F, Fut>(&self, operation: F) -> Result<T, StoreError>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let connection = self.connection()?;
        let result = match operation(connection.clone()).await {
            Err(error) if error.is_connection_dropped() => operation(connection).await,
            result => result,
        };
        result.map_err(|e| self.unavailable(e))
    }

    async fn query<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        self.call(|mut c| async move { command.query_async(&mut c).await })
            .await
    }

    /// Runs `pipeline` in one round trip; any error reply fails the whole.
    async fn run<T: FromRedisValue>(&self, pipeline: &Pipeline) -> Result<T, StoreError> {
        self.call(|mut c| async move { pipeline.query_async(&mut c).await })
            .await
    }

    /// The prefix lengths `i` (longest first) whose hash `prefixes[i]` the partition's
    /// index holds at length `i`: a hash found at another length is a collision.
    async fn candidates(
        &self,
        partition: Partition,
        prefixes: &[u128],
    ) -> Result<Vec<usize>, StoreError> {
        let mut command = ::redis::cmd("HMGET");
        command.arg(self.keys.index(partition));
        // The empty prefix (index 0) is never stored.
        for prefix in prefixes.iter().skip(1) {
            command.arg(hex(*prefix));
        }
        let values: Vec<Option<String>> = self.query(&command).await?;
        let mut found: Vec<usize> = values
            .into_iter()
            .enumerate()
            .filter_map(|(j, value)| {
                let len: usize = value?.parse().ok()?;
                (len == j + 1).then_some(len)
            })
            .collect();
        found.reverse();
        Ok(found)
    }

    /// The checkpoint at prefix length `len`, its time to live renewed; `None` when it
    /// has expired, its index entry then dropped.
    async fn fetch(
        &self,
        key: Key,
        len: usize,
        rest: AtRest<'_>,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let (checkpoint, index) = (self.keys.checkpoint(&key), self.keys.index(key.partition));
        let ttl = millis(self.ttl);
        let mut pipeline = ::redis::pipe();
        pipeline.cmd("GET").arg(&checkpoint);
        pipeline.cmd("PEXPIRE").arg(&checkpoint).arg(ttl).ignore();
        pipeline.cmd("PEXPIRE").arg(&index).arg(ttl).ignore();
        let (bytes,): (Option<Vec<u8>>,) = self.run(&pipeline).await?;
        let Some(bytes) = bytes else {
            let mut drop_entry = ::redis::cmd("HDEL");
            drop_entry.arg(&index).arg(hex(key.prefix));
            self.query::<()>(&drop_entry).await?;
            return Ok(None);
        };
        let (checkpoint, _) = rest.open_checkpoint(key, bytes).map_err(corrupt)?;
        if checkpoint.prefix_len != len {
            return Err(corrupt(CodecError::Misplaced {
                found: checkpoint.prefix_len,
                at: len,
            }));
        }
        Ok(Some(checkpoint))
    }

    /// Replaces the partitions known with those written within the time to live, and
    /// drops the older ones from the sorted set.
    async fn refresh(&self) -> Result<(), StoreError> {
        self.known().since_refresh.clear();
        let oldest = now_ms().saturating_sub(millis(self.ttl));
        let partitions = self.keys.partitions();
        let mut pipeline = ::redis::pipe();
        pipeline
            .cmd("ZREMRANGEBYSCORE")
            .arg(&partitions)
            .arg("-inf")
            .arg(format!("({oldest}"))
            .ignore();
        pipeline.cmd("ZRANGE").arg(&partitions).arg(0).arg(-1);
        let (listed,): (Vec<Vec<u8>>,) = self.run(&pipeline).await?;
        let mut fresh: HashSet<Partition> = listed.iter().filter_map(|m| parse_member(m)).collect();
        let mut known = self.known();
        fresh.extend(known.since_refresh.drain());
        known.partitions = fresh;
        Ok(())
    }

    /// A connection subscribed to the events channel, with the partitions known read
    /// whole after the subscription started, so that nothing announced in between is
    /// missed.
    async fn subscribe(&self) -> Result<PubSub, StoreError> {
        let subscribed = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(self.keys.events()).await?;
            Ok(pubsub)
        };
        let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, subscribed)
            .await
            .map_err(|_| self.timed_out())?
            .map_err(|e| self.unavailable(e))?;
        tokio::time::timeout(CONNECT_TIMEOUT, self.refresh())
            .await
            .map_err(|_| self.timed_out())??;
        Ok(pubsub)
    }

    fn timed_out(&self) -> StoreError {
        StoreError::Timeout {
            backend: BACKEND,
            after: CONNECT_TIMEOUT,
        }
    }

    /// Follows the announcements on `pubsub`, and refreshes the partitions known every
    /// few seconds, until either fails.
    async fn follow(&self, mut pubsub: PubSub) -> StoreError {
        let mut messages = pubsub.on_message();
        let mut refresh_at = tokio::time::Instant::now() + REFRESH_EVERY;
        loop {
            tokio::select! {
                message = messages.next() => match message {
                    Some(message) => self.heard(message.get_payload_bytes()),
                    None => {
                        let closed = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                        return self.unavailable(closed.into());
                    }
                },
                () = tokio::time::sleep_until(refresh_at) => {
                    // A Redis that stopped answering without closing the connection is
                    // found here: the subscription alone would wait on it forever.
                    match tokio::time::timeout(CONNECT_TIMEOUT, self.refresh()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => return error,
                        Err(_) => return self.timed_out(),
                    }
                    refresh_at = tokio::time::Instant::now() + REFRESH_EVERY;
                }
            }
        }
    }

    /// Applies an announcement.
    fn heard(&self, payload: &[u8]) {
        match Event::parse(payload) {
            Some(Event::Wrote(partition)) => self.known().add(partition),
            Some(Event::Cleared(tenant)) => self.known().drop_tenant(tenant),
            None => {}
        }
    }

    /// The upkeep: follows what other replicas write for as long as the proxy runs,
    /// reconnecting with a growing pause while Redis is out of reach. The cache logs the
    /// outage (once) when a request finds it; this logs only at debug level, so that an
    /// outage is one line in the log.
    async fn upkeep(self: Arc<Self>) {
        let mut backoff = BACKOFF_FIRST;
        let mut down = false;
        loop {
            let error = match self.subscribe().await {
                Ok(pubsub) => {
                    if down {
                        tracing::debug!("following other replicas' checkpoints again");
                        down = false;
                    }
                    backoff = BACKOFF_FIRST;
                    self.follow(pubsub).await
                }
                Err(error) => error,
            };
            if !down {
                tracing::debug!(error = %error, "not following other replicas' checkpoints until redis is back");
                down = true;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MOST);
        }
    }

    /// Each key `SCAN` finds for `pattern`, a batch at a time, given to `batch`, which
    /// returns the commands to run on it; returns the number of keys found and the sum of
    /// the commands' integer replies.
    async fn scan(
        &self,
        pattern: &str,
        batch: impl Fn(&[Vec<u8>]) -> Pipeline,
    ) -> Result<(u64, u64), StoreError> {
        let mut cursor = 0u64;
        let (mut found, mut total) = (0u64, 0u64);
        loop {
            let mut step = ::redis::cmd("SCAN");
            step.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<Vec<u8>>) = self.query(&step).await?;
            if !keys.is_empty() {
                found += keys.len() as u64;
                let counts: Vec<u64> = self.run(&batch(&keys)).await?;
                total += counts.iter().sum::<u64>();
            }
            if next == 0 {
                return Ok((found, total));
            }
            cursor = next;
        }
    }

    /// The members of the partitions' sorted set.
    async fn members(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut command = ::redis::cmd("ZRANGE");
        command.arg(self.keys.partitions()).arg(0).arg(-1);
        self.query(&command).await
    }

    async fn publish(&self, event: Event) -> Result<(), StoreError> {
        let mut command = ::redis::cmd("PUBLISH");
        command.arg(self.keys.events()).arg(event.encode());
        self.query(&command).await
    }
}

/// Deletes each key of a batch, counting those deleted.
fn delete(keys: &[Vec<u8>]) -> Pipeline {
    let mut pipeline = ::redis::pipe();
    pipeline.cmd("DEL").arg(keys);
    pipeline
}

/// The length of each value of a batch.
fn lengths(keys: &[Vec<u8>]) -> Pipeline {
    let mut pipeline = ::redis::pipe();
    for key in keys {
        pipeline.cmd("STRLEN").arg(key);
    }
    pipeline
}

/// The field of `upstream`'s `model` for what `kind` (`w`, `r`, `u`) says.
fn model_field(kind: char, upstream: &str, model: &str) -> String {
    format!("{kind}\t{upstream}\t{model}")
}

/// The models the `models` hash's fields and values describe; a field this build cannot
/// read is skipped (it is relearned).
fn model_records(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<ModelRecord> {
    let mut records: BTreeMap<(String, String), ModelRecord> = BTreeMap::new();
    for (field, value) in &pairs {
        let (Some(field), Some(value)) = (text(field), text(value)) else {
            continue;
        };
        let mut parts = field.splitn(3, '\t');
        let (Some(kind), Some(upstream), Some(model)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let record = records
            .entry((upstream.to_owned(), model.to_owned()))
            .or_insert_with(|| ModelRecord {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                window: None,
                refusal: None,
                usage: None,
            });
        match kind {
            "w" => record.window = value.parse().ok(),
            "r" => record.refusal = value.parse().ok(),
            "u" => record.usage = value.parse().ok(),
            _ => {}
        }
    }
    records.into_values().collect()
}

impl CheckpointStore for RedisStore {
    fn backend(&self) -> Backend {
        Backend::Redis
    }

    fn upkeep(&self) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(Arc::clone(&self.shared).upkeep()))
    }

    fn may_hold(&self, partition: Partition) -> bool {
        self.shared.known().partitions.contains(&partition)
    }

    fn any(&self) -> bool {
        !self.shared.known().partitions.is_empty()
    }

    fn longest<'a>(
        &'a self,
        partition: Partition,
        prefixes: &'a [u128],
        rest: AtRest<'a>,
    ) -> StoreFuture<'a, Option<(usize, Arc<Checkpoint>)>> {
        Box::pin(async move {
            let shared = &self.shared;
            if prefixes.len() < 2 {
                return Ok(None);
            }
            for len in shared.candidates(partition, prefixes).await? {
                let key = Key {
                    partition,
                    prefix: prefixes[len],
                };
                if let Some(checkpoint) = shared.fetch(key, len, rest).await? {
                    return Ok(Some((len, Arc::new(checkpoint))));
                }
            }
            Ok(None)
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
            let shared = &self.shared;
            let keys = &shared.keys;
            shared.known().add(key.partition);
            let ttl = millis(shared.ttl);
            let index = keys.index(key.partition);
            let partitions = keys.partitions();
            let mut pipeline = ::redis::pipe();
            pipeline
                .cmd("SET")
                .arg(keys.checkpoint(&key))
                .arg(rest.checkpoint(key, &checkpoint))
                .arg("PX")
                .arg(ttl)
                .ignore();
            pipeline
                .cmd("HSET")
                .arg(&index)
                .arg(hex(key.prefix))
                .arg(checkpoint.prefix_len)
                .ignore();
            pipeline.cmd("PEXPIRE").arg(&index).arg(ttl).ignore();
            pipeline
                .cmd("ZADD")
                .arg(&partitions)
                .arg(now_ms())
                .arg(member(key.partition))
                .ignore();
            pipeline.cmd("PEXPIRE").arg(&partitions).arg(ttl).ignore();
            if let Some(old) = replaces.filter(|old| *old != key) {
                pipeline.cmd("DEL").arg(keys.checkpoint(&old)).ignore();
                pipeline
                    .cmd("HDEL")
                    .arg(keys.index(old.partition))
                    .arg(hex(old.prefix))
                    .ignore();
            }
            pipeline
                .cmd("PUBLISH")
                .arg(keys.events())
                .arg(Event::Wrote(key.partition).encode())
                .ignore();
            shared.run(&pipeline).await
        })
    }

    /// Redis holds the checkpoints, not this process.
    fn held(&self) -> (usize, usize) {
        (0, 0)
    }

    fn tally(&self) -> StoreFuture<'_, Tally> {
        Box::pin(async move {
            let shared = &self.shared;
            let pattern = shared.keys.pattern("cp", None);
            // A key SCAN finds may expire before its STRLEN: it counts, for 0 bytes.
            let (checkpoints, bytes) = shared.scan(&pattern, lengths).await?;
            let tenants: HashSet<Tenant> = shared
                .members()
                .await?
                .iter()
                .filter_map(|m| parse_member(m))
                .map(|p| p.tenant)
                .collect();
            Ok(Tally {
                checkpoints,
                bytes,
                tenants: tenants.len() as u64,
            })
        })
    }

    fn clear(&self, tenant: Option<Tenant>) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let shared = &self.shared;
            let keys = &shared.keys;
            shared.known().drop_tenant(tenant);
            let (_, dropped) = shared.scan(&keys.pattern("cp", tenant), delete).await?;
            shared.scan(&keys.pattern("ix", tenant), delete).await?;
            match tenant {
                None => {
                    let mut command = ::redis::cmd("DEL");
                    command.arg(keys.partitions());
                    shared.query::<()>(&command).await?;
                }
                Some(tenant) => {
                    let prefix = format!("{}:", hex(tenant.0));
                    let theirs: Vec<Vec<u8>> = shared
                        .members()
                        .await?
                        .into_iter()
                        .filter(|m| m.starts_with(prefix.as_bytes()))
                        .collect();
                    if !theirs.is_empty() {
                        let mut command = ::redis::cmd("ZREM");
                        command.arg(keys.partitions()).arg(theirs);
                        shared.query::<()>(&command).await?;
                    }
                }
            }
            shared.publish(Event::Cleared(tenant)).await?;
            Ok(dropped)
        })
    }
}

impl WindowStore for RedisStore {
    fn models(&self) -> StoreFuture<'_, Vec<ModelRecord>> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut command = ::redis::cmd("HGETALL");
            command.arg(shared.keys.models());
            Ok(model_records(shared.query(&command).await?))
        })
    }

    fn put_model(&self, record: ModelRecord) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let shared = &self.shared;
            let (upstream, model) = (&record.upstream, &record.model);
            let fields = [
                ('w', record.window.map(|w| w.to_string())),
                ('r', record.refusal.map(|r| r.to_string())),
                ('u', record.usage.map(|u| u.to_string())),
            ];
            let mut command = ::redis::cmd("HSET");
            command.arg(shared.keys.models());
            let mut any = false;
            for (kind, value) in fields {
                if let Some(value) = value {
                    command.arg(model_field(kind, upstream, model)).arg(value);
                    any = true;
                }
            }
            if any {
                shared.query::<()>(&command).await?;
            }
            Ok(())
        })
    }

    fn clear_models(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut command = ::redis::cmd("DEL");
            command.arg(shared.keys.models());
            shared.query(&command).await
        })
    }
}

impl LeaseStore for RedisStore {
    fn claim(&self, flight: u128, holder: u128, lease: Duration) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut claim = shared.claim.key(shared.keys.lock(flight));
            claim.arg(hex(holder)).arg(millis(lease));
            let claimed: i64 = shared
                .call(|mut c| {
                    let claim = &claim;
                    async move { claim.invoke_async(&mut c).await }
                })
                .await?;
            Ok(claimed == 1)
        })
    }

    fn settle(
        &self,
        flight: u128,
        holder: u128,
        result: Vec<u8>,
        keep: Duration,
    ) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut settle = shared.settle.key(shared.keys.lock(flight));
            settle
                .key(shared.keys.flight(flight))
                .arg(hex(holder))
                .arg(result)
                .arg(millis(keep));
            shared
                .call(|mut c| {
                    let settle = &settle;
                    async move { settle.invoke_async(&mut c).await }
                })
                .await
        })
    }

    fn peek(&self, flight: u128) -> StoreFuture<'_, Peek> {
        Box::pin(async move {
            let shared = &self.shared;
            let mut pipeline = ::redis::pipe();
            pipeline.cmd("GET").arg(shared.keys.flight(flight));
            pipeline.cmd("EXISTS").arg(shared.keys.lock(flight));
            let (result, held): (Option<Vec<u8>>, bool) = shared.run(&pipeline).await?;
            Ok(match result {
                Some(bytes) => Peek::Done(bytes),
                None if held => Peek::Running,
                None => Peek::Free,
            })
        })
    }

    fn clear_leases(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let shared = &self.shared;
            shared
                .scan(&shared.keys.pattern("lock", None), delete)
                .await?;
            shared
                .scan(&shared.keys.pattern("flight", None), delete)
                .await
                .map(drop)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command as Process, Stdio};

    use serde_json::json;

    use super::*;
    use crate::checkpoint::fixtures::{checkpoint, key, rest};

    /// A redis-server of its own on a free loopback port, or `None` (the test is skipped,
    /// and says so) when none is installed, unless `COMPACTION_PROXY_REQUIRE_REDIS` is set
    /// to anything but empty or `0` (the rule of every such switch, tests/support's `Needs`).
    struct Server {
        child: Child,
        port: u16,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn spawn(port: u16) -> std::io::Result<Child> {
        let path = std::env::var("COMPACTION_PROXY_REDIS_SERVER")
            .unwrap_or_else(|_| "redis-server".into());
        Process::new(&path)
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    async fn server() -> Option<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let Ok(child) = spawn(port) else {
            let path = std::env::var("COMPACTION_PROXY_REDIS_SERVER")
                .unwrap_or_else(|_| "redis-server".into());
            let switch = "COMPACTION_PROXY_REQUIRE_REDIS";
            let required = std::env::var_os(switch).is_some_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "{switch}: no redis-server at {path}");
            // Written to stderr itself: the harness keeps a passing test's output to itself,
            // and a skipped test must not pass unseen.
            let test = std::thread::current().name().unwrap_or("a test").to_owned();
            let line = format!(
                "SKIPPED {test}: no redis-server at {path} (scripts/setup-redis.sh installs \
                 it, or set {switch} to fail instead)\n"
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            return None;
        };
        let server = Server { child, port };
        server.answering().await;
        Some(server)
    }

    impl Server {
        async fn answering(&self) {
            for _ in 0..200 {
                if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .is_ok()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("redis-server did not start on port {}", self.port);
        }

        /// Killed (no goodbye to its clients) and started again, empty, on its port.
        async fn restart(&mut self) {
            self.child.kill().unwrap();
            self.child.wait().unwrap();
            self.child = spawn(self.port).unwrap();
            self.answering().await;
        }
    }

    /// Whether `check` holds within two seconds: announcements arrive on their own time.
    async fn until(check: impl Fn() -> bool) -> bool {
        for _ in 0..100 {
            if check() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    fn store(server: &Server, ns: &str) -> RedisStore {
        let url = format!("redis://127.0.0.1:{}", server.port);
        open(&url, ns, Duration::from_secs(60), None).unwrap()
    }

    #[test]
    fn open_connects_to_nothing() {
        // A port nothing listens on: opening still succeeds, as the proxy must start.
        assert!(open("redis://127.0.0.1:1", "ns", Duration::from_secs(1), None).is_ok());
        for url in ["redis://u:hunter2@host:x", "http://u:hunter2@host"] {
            let error = open(url, "ns", Duration::from_secs(1), None).err().unwrap();
            assert!(!format!("{error} {error:?}").contains("hunter2"), "{error}");
        }
    }

    #[tokio::test]
    async fn a_redis_out_of_reach_is_an_error_naming_where_not_how_to_log_in() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("redis://u:hunter2@127.0.0.1:{port}");
        let store = open(&url, "ns", Duration::from_secs(1), None).unwrap();
        let error = store.peek(1).await.unwrap_err();
        let shown = crate::checkpoint::store::render(&error);
        assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn an_operator_s_ca_file_is_read_and_a_file_without_certificates_is_named() {
        let dir = std::env::temp_dir().join(format!("redis-roots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["redis.internal".to_owned()]).unwrap();
        let bundle = dir.join("ca.pem");
        std::fs::write(&bundle, format!("# our CA\n{}", ca.cert.pem())).unwrap();
        let roots = read_roots(&bundle).unwrap();
        assert!(open(
            "rediss://redis.internal",
            "ns",
            Duration::from_secs(1),
            Some(roots)
        )
        .is_ok());

        let key_only = dir.join("key.pem");
        std::fs::write(&key_only, ca.key_pair.serialize_pem()).unwrap();
        assert!(matches!(
            read_roots(&key_only).unwrap_err(),
            CaError::NoCertificate
        ));
        assert!(matches!(
            read_roots(&dir.join("missing.pem")).unwrap_err(),
            CaError::Read(_)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn events_and_patterns_name_what_they_mean() {
        let p = Partition::for_tests(7);
        assert!(
            matches!(Event::parse(Event::Wrote(p).encode().as_bytes()), Some(Event::Wrote(q)) if q == p)
        );
        assert!(matches!(
            Event::parse(Event::Cleared(Some(Tenant(7))).encode().as_bytes()),
            Some(Event::Cleared(Some(Tenant(7))))
        ));
        assert!(matches!(Event::parse(b"-"), Some(Event::Cleared(None))));
        assert!(Event::parse(b"junk").is_none());
        let keys = RedisKeys { ns: "a*b".into() };
        assert_eq!(
            keys.pattern("cp", Some(Tenant(1))),
            format!("a\\*b:cp:{}:*", hex(1))
        );
    }

    #[tokio::test]
    async fn checkpoints_round_trip_and_an_extension_replaces_the_shorter() {
        let Some(server) = server().await else { return };
        let store = store(&server, "t1");
        let p = Partition::for_tests(1);
        let hashes = [0, 10, 20, 30, 40, 50, 60];
        assert!(store.longest(p, &hashes, rest()).await.unwrap().is_none());
        store
            .put(key(1, 20), checkpoint(2, "two"), None, rest())
            .await
            .unwrap();
        assert!(store.may_hold(p) && store.any());
        let (len, found) = store.longest(p, &hashes, rest()).await.unwrap().unwrap();
        assert_eq!((len, found.prefix_len), (2, 2));
        assert_eq!(found.messages, checkpoint(2, "two").messages);
        // A hash found at another position is a collision, not a match.
        assert!(store.longest(p, &[0, 20], rest()).await.unwrap().is_none());
        // Another partition sees nothing.
        let other = Partition::for_tests(2);
        assert!(store
            .longest(other, &hashes, rest())
            .await
            .unwrap()
            .is_none());

        store
            .put(key(1, 40), checkpoint(4, "four"), Some(key(1, 20)), rest())
            .await
            .unwrap();
        assert_eq!(
            store.longest(p, &hashes, rest()).await.unwrap().unwrap().0,
            4
        );
        assert!(store
            .longest(p, &hashes[..4], rest())
            .await
            .unwrap()
            .is_none());
        let stats = store.tally().await.unwrap();
        assert_eq!((stats.checkpoints, stats.tenants), (1, 1));
        assert!(stats.bytes > 0);

        // A checkpoint gone from Redis (expired) is skipped for the next one down, and
        // its index entry dropped.
        store
            .put(key(1, 30), checkpoint(3, "three"), None, rest())
            .await
            .unwrap();
        let mut shared = Client::open(format!("redis://127.0.0.1:{}", server.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys = RedisKeys { ns: "t1".into() };
        let deleted: i64 = ::redis::cmd("DEL")
            .arg(keys.checkpoint(&key(1, 40)))
            .query_async(&mut shared)
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        assert_eq!(
            store.longest(p, &hashes, rest()).await.unwrap().unwrap().0,
            3
        );
        let left: i64 = ::redis::cmd("HLEN")
            .arg(keys.index(p))
            .query_async(&mut shared)
            .await
            .unwrap();
        assert_eq!(left, 1);

        // What another version wrote, unreadable, is an error of that value.
        let () = ::redis::cmd("SET")
            .arg(keys.checkpoint(&key(1, 30)))
            .arg("junk")
            .query_async(&mut shared)
            .await
            .unwrap();
        let error = store.longest(p, &hashes, rest()).await.unwrap_err();
        assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");

        assert_eq!(store.clear(Some(Tenant(1))).await.unwrap(), 1);
        assert!(!store.may_hold(p));
        assert!(store.longest(p, &hashes, rest()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn replicas_learn_each_others_partitions_and_models() {
        let Some(server) = server().await else { return };
        let (a, b) = (store(&server, "t2"), store(&server, "t2"));
        // One partition written before B starts: the refresh at its start finds it.
        a.put(key(1, 10), checkpoint(1, "x"), None, rest())
            .await
            .unwrap();
        tokio::spawn(b.upkeep().unwrap());
        assert!(until(|| b.may_hold(Partition::for_tests(1))).await);
        // Later ones are announced.
        a.put(key(2, 10), checkpoint(1, "y"), None, rest())
            .await
            .unwrap();
        assert!(until(|| b.may_hold(Partition::for_tests(2))).await);
        a.clear(Some(Tenant(2))).await.unwrap();
        assert!(until(|| !b.may_hold(Partition::for_tests(2))).await);
        assert!(b.may_hold(Partition::for_tests(1)));

        // Each writes what it learned; neither overwrites the other's fields.
        let record = |window, refusal| ModelRecord {
            upstream: "http://u/v1".into(),
            model: "m".into(),
            window,
            refusal,
            usage: None,
        };
        a.put_model(record(Some(6000), None)).await.unwrap();
        b.put_model(record(None, Some(1.25))).await.unwrap();
        assert_eq!(b.models().await.unwrap(), [record(Some(6000), Some(1.25))]);
        assert_eq!(a.models().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn one_replica_claims_a_flight_and_leaves_its_result() {
        let Some(server) = server().await else { return };
        let (a, b) = (store(&server, "t3"), store(&server, "t3"));
        let lease = Duration::from_secs(10);
        assert_eq!(b.peek(9).await.unwrap(), Peek::Free);
        assert!(a.claim(9, 1, lease).await.unwrap());
        assert!(!b.claim(9, 2, lease).await.unwrap());
        // The holder renews its own claim.
        assert!(a.claim(9, 1, lease).await.unwrap());
        assert_eq!(b.peek(9).await.unwrap(), Peek::Running);
        // A holder whose lease lapsed does not release the claim of the one that took over.
        b.settle(9, 2, b"late".to_vec(), Duration::from_secs(60))
            .await
            .unwrap();
        assert!(!b.claim(9, 2, lease).await.unwrap());
        a.settle(9, 1, b"summary".to_vec(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(b.peek(9).await.unwrap(), Peek::Done(b"summary".to_vec()));
        a.clear_leases().await.unwrap();
        assert_eq!(b.peek(9).await.unwrap(), Peek::Free);
    }

    #[tokio::test]
    async fn an_operation_after_redis_restarted_is_sent_again_on_a_new_connection() {
        let Some(mut server) = server().await else {
            return;
        };
        let store = store(&server, "t5");
        assert_eq!(store.peek(3).await.unwrap(), Peek::Free);
        server.restart().await;
        // The shared connection broke with the restart; the operation does not fail for it.
        assert_eq!(store.peek(3).await.unwrap(), Peek::Free);
        assert!(store.claim(3, 1, Duration::from_secs(10)).await.unwrap());
    }

    /// The cost of a lookup for a long session: a conversation of about a million
    /// tokens, 4,000 messages, whose checkpoint (the compacted form) is found at its end.
    #[tokio::test]
    async fn what_a_lookup_of_a_long_conversation_costs() {
        let Some(server) = server().await else { return };
        let store = store(&server, "t4");
        let p = Partition::for_tests(1);
        let hashes: Vec<u128> = (0..4001u128).map(|i| i * 7919 + 1).collect();
        let form = vec![json!({"role": "user", "content": "summary ".repeat(4000)}); 4];
        let big = Arc::new(Checkpoint::new(
            3990,
            1_000_000,
            form,
            vec![8000; 4],
            None,
            0,
        ));
        store
            .put(
                Key {
                    partition: p,
                    prefix: hashes[3990],
                },
                big,
                None,
                rest(),
            )
            .await
            .unwrap();
        store.longest(p, &hashes, rest()).await.unwrap().unwrap();
        let started = std::time::Instant::now();
        let rounds = 20;
        for _ in 0..rounds {
            let (len, _) = store.longest(p, &hashes, rest()).await.unwrap().unwrap();
            assert_eq!(len, 3990);
        }
        eprintln!(
            "longest() of 4,000 prefixes, a 130 KB checkpoint: {:?} each",
            started.elapsed() / rounds
        );
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            assert!(store
                .longest(p, &hashes[..3000], rest())
                .await
                .unwrap()
                .is_none());
        }
        eprintln!(
            "a miss (the index alone): {:?} each",
            started.elapsed() / rounds
        );
    }
}
