//! The summary cache on a 1M-token, 2,000-message agent session: finding the checkpoint of
//! a later turn (hashing every prefix of the parsed messages, then the longest-prefix probe in
//! a store holding a thousand other conversations), and the memory one conversation's
//! checkpoint holds (counted by the allocator, next to the store's own estimate).
//!
//! cargo bench --bench checkpoint -- --warm-up-time 1 --measurement-time 3
//!
//! Measured on the shared 2-core development machine (load average 5-7 from other builds),
//! release profile, a 2,054-message session of 999k tokens (4.1 MiB of JSON):
//!
//! | benchmark | time |
//! | --- | --- |
//! | find: hash every prefix + longest-prefix probe (1,001 conversations stored) | 0.67 ms |
//! | for scale: parsing the request body, which any compaction needs | 6.7 ms |
//!
//! One conversation's checkpoint (compacted for a 128k window: 5 messages, head and
//! summary, standing for 1,954) holds 14.0 KiB on the heap; the store counts it as 12.9 KiB.

// Benchmark setup: a failed step should stop the run where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use compaction_proxy::checkpoint::{self, Checkpoint, Key, MemoryStore, Partition};
use compaction_proxy::compact::{self, Counter, Options};
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

mod common;

/// Counts the bytes live on the heap, to weigh a checkpoint.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's own layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
    let outcome = compact::compact(request, &Options::with_window(128_000)).unwrap();
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

fn find(c: &mut Criterion) {
    let mut request = common::session_with(1_000_000, 1_020);
    let n = messages(&request).len();
    let tokens = compact::count_request(&request);
    let body = serde_json::to_vec(&request).unwrap();
    println!(
        "session: {n} messages, {tokens} tokens, {:.1} MiB",
        body.len() as f64 / 1048576.0
    );

    // A first compaction initialises what lives for the whole process (tokenizer tables,
    // searchers); weigh a second one.
    drop(checkpoint_of(&request));
    let live = LIVE.load(Ordering::Relaxed);
    let stored = Arc::new(checkpoint_of(&request));
    let held = LIVE.load(Ordering::Relaxed) - live;
    println!(
        "one conversation's checkpoint: {} messages replacing {}, {:.1} KiB on the heap \
         (the store counts {:.1} KiB)",
        stored.messages.len(),
        stored.prefix_len,
        held as f64 / 1024.0,
        stored.size as f64 / 1024.0
    );

    let store = MemoryStore::new(1 << 30, Duration::from_secs(3600));
    let ours = partition(0);
    let hashes = checkpoint::prefix_hashes(ours, messages(&request));
    store.insert(
        Key {
            partition: ours,
            prefix: hashes[stored.prefix_len],
        },
        Arc::clone(&stored),
        None,
    );
    for tenant in 1..=1000 {
        let key = Key {
            partition: partition(tenant),
            prefix: tenant as u128,
        };
        store.insert(key, Arc::clone(&stored), None);
    }

    // The next turn: the agent's answer and a new ask.
    let later = request["messages"].as_array_mut().unwrap();
    later.push(json!({"role": "assistant", "content": "Done; the suite passes."}));
    later.push(json!({"role": "user", "content": "Now update the changelog."}));
    let body = serde_json::to_vec(&request).unwrap();

    let mut g = c.benchmark_group("checkpoint_1M");
    g.sample_size(20);
    g.bench_function("find", |b| {
        b.iter(|| {
            let hashes = checkpoint::prefix_hashes(ours, messages(black_box(&request)));
            let (len, found) = store.get(ours, &hashes).unwrap();
            assert_eq!(len, found.prefix_len);
        })
    });
    // For scale: the parse every compacted request needs anyway.
    g.bench_function("parse_body", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, find);
criterion_main!(benches);
