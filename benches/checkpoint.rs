//! The summary cache on a 1M-token, 2,000-message agent session: finding the checkpoint of
//! a later turn (hashing every prefix of the parsed messages, then the longest-prefix
//! lookup) in each store backend holding a thousand other conversations: memory, the
//! embedded SQLite file (on this disk), and Redis on loopback when `BENCH_REDIS_URL` names
//! one (`bench/store.sh` starts a redis-server and sets it). Also: what a request of a
//! tenant without checkpoints pays (a look in memory, no store round trip), and the memory
//! one stored conversation takes in each (counted by the allocator). The embedded store and
//! Redis are measured with `cache.seal` off and on, in one run: what sealing adds to the
//! lookup and the store of this checkpoint, and to its bytes alone (`to_bytes`,
//! `from_bytes`).
//!
//! cargo bench --bench checkpoint -- --warm-up-time 1 --measurement-time 3
//!
//! Figures: see the README, "Running several replicas".

// Benchmark setup: a failed step should stop the run where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use tokio::runtime::Runtime;

use cap::Cap;
use compaction_proxy::checkpoint::seal::{AtRest, Sealer};
use compaction_proxy::checkpoint::{self, Checkpoint, Checkpoints, Key, Partition, Seal};
use compaction_proxy::config::{CacheBackend, CacheConfig};
use compaction_proxy::engine::{self, Counter, Options};
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

mod common;

/// Counts the bytes live on the heap, to weigh a checkpoint. A crate's allocator, not our
/// own: the crate forbids unsafe code, which a `GlobalAlloc` needs.
#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// Bytes live on the heap now.
fn live() -> isize {
    ALLOCATOR.allocated() as isize
}

fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().unwrap()
}

fn partition(tenant: usize) -> Partition {
    let mut headers = HeaderMap::new();
    let key = HeaderValue::from_str(&format!("Bearer sk-tenant-{tenant}")).unwrap();
    headers.insert("authorization", key);
    Partition::new(&headers, "https://api.openai.com/v1", "gpt-4o")
}

/// The checkpoint the proxy stores after compacting `request` for a 128k window.
fn checkpoint_of(request: &Value) -> Checkpoint {
    let outcome = engine::compact(request, &Options::with_window(128_000)).unwrap();
    let output = outcome
        .rewritten
        .expect("a 1M-token session needs compacting");
    let (replaced, form) = checkpoint::derive(messages(request), messages(&output), None).unwrap();
    let counts = Counter::for_request(request).messages(&form);
    let role = messages(request)[replaced]["role"]
        .as_str()
        .map(str::to_owned);
    Checkpoint::new(replaced, 900_000, form, counts, role, 0)
}

fn seal(tenant: usize) -> Seal {
    Sealer::new(None).seal_credential(format!("Bearer sk-tenant-{tenant}").as_bytes())
}

/// The cache with `backend`, sealing or not, holding `stored` for `ours` and a thousand
/// other tenants' conversations.
fn filled(
    runtime: &Runtime,
    backend: CacheBackend,
    seal: bool,
    ours: Partition,
    hashes: &[u128],
    stored: &Arc<Checkpoint>,
) -> Checkpoints {
    let dir = std::env::temp_dir().join(format!("checkpoint-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = CacheConfig {
        backend,
        path: dir.join("cache.sqlite3").display().to_string(),
        redis_url: std::env::var("BENCH_REDIS_URL").unwrap_or_default(),
        redis_namespace: format!("bench-{}", std::process::id()),
        max_bytes: 1 << 30,
        timeout_ms: 5_000,
        seal,
        ..CacheConfig::default()
    };
    let cache = Checkpoints::open(&config, 0, None).unwrap().unwrap();
    runtime.block_on(async {
        let key = Key {
            partition: ours,
            prefix: hashes[stored.prefix_len],
        };
        cache
            .put(&self::seal(0), key, Arc::clone(stored), None)
            .await;
        for tenant in 1..=1000 {
            let key = Key {
                partition: partition(tenant),
                prefix: tenant as u128,
            };
            cache
                .put(&self::seal(tenant), key, Arc::clone(stored), None)
                .await;
        }
    });
    cache
}

// One group, a bench per store and seal, read top to bottom like the tests.
#[allow(clippy::too_many_lines)]
fn find(c: &mut Criterion) {
    let mut request = common::session_with(1_000_000, 1_020);
    let n = messages(&request).len();
    let tokens = engine::count_request(&request);
    let body = serde_json::to_vec(&request).unwrap();
    println!(
        "session: {n} messages, {tokens} tokens, {:.1} MiB",
        body.len() as f64 / 1048576.0
    );

    // A first compaction initialises what lives for the whole process (tokenizer tables,
    // searchers); weigh a second one.
    drop(checkpoint_of(&request));
    let before = live();
    let stored = Arc::new(checkpoint_of(&request));
    let held = live() - before;
    println!(
        "one conversation's checkpoint: {} messages replacing {}, {:.1} KiB on the heap \
         (the store counts {:.1} KiB)",
        stored.messages.len(),
        stored.prefix_len,
        held as f64 / 1024.0,
        stored.size as f64 / 1024.0
    );

    let ours = partition(0);
    let hashes = checkpoint::prefix_hashes(ours, messages(&request));
    // The next turn: the agent's answer and a new ask.
    let later = request["messages"].as_array_mut().unwrap();
    later.push(json!({"role": "assistant", "content": "Done; the suite passes."}));
    later.push(json!({"role": "user", "content": "Now update the changelog."}));
    let body = serde_json::to_vec(&request).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut backends = vec![CacheBackend::Memory, CacheBackend::Embedded];
    if std::env::var("BENCH_REDIS_URL").is_ok() {
        backends.push(CacheBackend::Redis);
    } else {
        println!("BENCH_REDIS_URL is not set: Redis is not measured (bench/store.sh sets it)");
    }
    let stranger = partition(5000);
    let mut g = c.benchmark_group("checkpoint_1M");
    g.sample_size(20);
    let ours_seal = seal(0);
    for backend in backends {
        // The memory store keeps checkpoints as values, never as bytes: nothing to seal.
        let sealing: &[bool] = match backend {
            CacheBackend::Memory => &[true],
            _ => &[false, true],
        };
        for &sealed in sealing {
            let mode = if sealed { "sealed" } else { "clear" };
            let before = live();
            let cache = filled(&runtime, backend, sealed, ours, &hashes, &stored);
            let memory = live() - before;
            println!(
                "{backend:?} ({mode}): 1,001 conversations stored, {:.0} bytes of this process's \
                 memory each besides the checkpoint itself, which the memory store and Redis's \
                 fallback copy hold too (shared in this bench)",
                memory as f64 / 1001.0
            );
            g.bench_function(format!("find/{backend:?}/{mode}"), |b| {
                b.iter(|| {
                    let hashes = checkpoint::prefix_hashes(ours, messages(black_box(&request)));
                    let found = cache.longest(&ours_seal, ours, &hashes);
                    let (len, found) = runtime.block_on(found).unwrap();
                    assert_eq!(len, found.prefix_len);
                })
            });
            let key = Key {
                partition: ours,
                prefix: hashes[stored.prefix_len],
            };
            g.bench_function(format!("store/{backend:?}/{mode}"), |b| {
                b.iter(|| {
                    let put = cache.put(&ours_seal, key, Arc::clone(&stored), None);
                    runtime.block_on(put);
                })
            });
            // A tenant without checkpoints: answered from memory, before any parsing.
            g.bench_function(format!("no_checkpoints/{backend:?}/{mode}"), |b| {
                b.iter(|| assert!(!cache.may_hold(black_box(stranger))))
            });
            if backend != CacheBackend::Memory {
                runtime.block_on(cache.clear(None)).unwrap();
            }
        }
    }
    // The seal alone, without the store's I/O: the checkpoint to bytes and back, clear and
    // sealed.
    for sealed in [false, true] {
        let mode = if sealed { "sealed" } else { "clear" };
        let rest = AtRest::new(&ours_seal, sealed);
        let key = Key {
            partition: ours,
            prefix: hashes[stored.prefix_len],
        };
        let bytes = rest.checkpoint(key, &stored);
        g.bench_function(format!("to_bytes/{mode}"), |b| {
            b.iter(|| rest.checkpoint(key, black_box(&stored)))
        });
        g.bench_function(format!("from_bytes/{mode}"), |b| {
            b.iter(|| rest.open_checkpoint(key, black_box(bytes.clone())).unwrap())
        });
    }
    // For scale: the parse every compacted request needs anyway.
    g.bench_function("parse_body", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, find);
criterion_main!(benches);
