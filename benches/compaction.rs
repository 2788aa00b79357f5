//! Token counting throughput and whole-request compaction (deterministic summary) of agent
//! sessions of about 10k, 128k and 1M tokens, each compacted to half its size.
//!
//! cargo bench --bench compaction -- --warm-up-time 1 --measurement-time 3
//!
//! Measured on the shared 2-core development machine (load average 2.6-4.3 from other
//! builds), release profile:
//!
//! | benchmark | time | throughput |
//! | --- | --- | --- |
//! | count, synthetic 128k-token session | 4.78 ms | 110 MiB/s |
//! | count, this crate's sources + a fixture | 4.79 ms | 53.5 MiB/s |
//! | compact 10k tokens (counting included) | 0.50 ms | |
//! | compact 128k tokens | 5.37 ms | |
//! | compact 1M tokens | 47.4 ms | |
//! | compact 10k / 128k / 1M, per-message counts reused | 0.13 / 2.09 / 18.3 ms | |

// Benchmark setup: a failed step should stop the run where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;

use compaction_proxy::dialect::responses;
use compaction_proxy::engine::{self, count_messages, count_request, Options};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::{json, Value};

mod common;
use common::{one_turn, session};

fn counting(c: &mut Criterion) {
    let mut g = c.benchmark_group("count");
    let request = session(128_000);
    let bytes = serde_json::to_vec(&request).unwrap().len();
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("request_128k", |b| {
        b.iter(|| count_request(black_box(&request)))
    });
    // Real, varied text: this crate's own sources and fixtures as tool outputs.
    let sources = [
        include_str!("../src/engine/mod.rs"),
        include_str!("../src/engine/summary.rs"),
        include_str!("../src/engine/tokens.rs"),
        include_str!("../src/engine/validate.rs"),
        include_str!("../src/engine/prune.rs"),
        include_str!("../fixtures/conversations/parallel_tools.json"),
    ];
    let messages: Vec<Value> = sources
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": s}))
        .collect();
    let request = json!({"model": "gpt-4o", "messages": messages});
    let bytes = serde_json::to_vec(&request).unwrap().len();
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("sources", |b| b.iter(|| count_request(black_box(&request))));
    g.finish();
}

fn compaction(c: &mut Criterion) {
    let mut g = c.benchmark_group("compact");
    g.sample_size(10);
    for (label, size) in [("10k", 10_000), ("128k", 128_000), ("1M", 1_000_000)] {
        let request = session(size);
        let before = count_request(&request);
        let opts = Options {
            target_tokens: Some(before / 2),
            ..Options::with_window(before)
        };
        let check = engine::compact(&request, &opts).unwrap();
        assert!(
            check.report.fits && !check.report.unchanged,
            "{}",
            check.report
        );
        g.throughput(Throughput::Elements(before as u64));
        g.bench_with_input(BenchmarkId::new("full", label), &request, |b, r| {
            b.iter(|| engine::compact(black_box(r), &opts).unwrap())
        });
        // What the proxy pays when it reuses the per-message counts of its preflight check.
        let counts = count_messages(&request);
        g.bench_with_input(BenchmarkId::new("with_counts", label), &request, |b, r| {
            b.iter(|| {
                engine::compact_with(black_box(r), Some(&counts), &opts, &engine::Deterministic)
                    .unwrap()
            })
        });
    }
    g.finish();
    // A turn of many rounds, a quarter of it allowed: how the cost grows with the rounds
    // escalation folds (it searches for the fewest that fit in a number of builds that
    // grows with their log).
    let mut g = c.benchmark_group("one_turn");
    g.sample_size(10);
    for rounds in [250, 500, 1000] {
        let request = one_turn(rounds);
        let before = count_request(&request);
        let opts = Options {
            target_tokens: Some(before / 4),
            ..Options::with_window(before)
        };
        let check = engine::compact(&request, &opts).unwrap();
        assert!(check.report.fits, "{}", check.report);
        g.throughput(Throughput::Elements(rounds as u64));
        g.bench_with_input(BenchmarkId::from_parameter(rounds), &request, |b, r| {
            b.iter(|| engine::compact(black_box(r), &opts).unwrap())
        });
    }
    g.finish();
}

/// The chat session as a Responses API request: the system prompt as `instructions`,
/// calls and outputs as items.
fn as_responses(chat: &Value) -> Value {
    let mut instructions = Value::Null;
    let mut input = Vec::new();
    for m in chat["messages"].as_array().unwrap() {
        match m["role"].as_str().unwrap() {
            "system" => instructions = m["content"].clone(),
            "tool" => input.push(json!({"type": "function_call_output",
                "call_id": m["tool_call_id"], "output": m["content"]})),
            "assistant" if m["tool_calls"].is_array() => {
                for call in m["tool_calls"].as_array().unwrap() {
                    input.push(json!({"type": "function_call", "call_id": call["id"],
                        "name": call["function"]["name"], "arguments": call["function"]["arguments"]}));
                }
            }
            role => input.push(json!({"role": role, "content": m["content"]})),
        }
    }
    json!({"model": chat["model"], "instructions": instructions, "input": input})
}

/// The Responses path: the view, the same engine, the items written back as bytes; beside
/// it the chat path on the same session, to the same bytes-out point.
fn responses(c: &mut Criterion) {
    let mut g = c.benchmark_group("responses");
    g.sample_size(10);
    let chat = session(128_000);
    let request = as_responses(&chat);
    let view = responses::to_chat(&request).unwrap();
    let before = count_request(&view);
    let opts = Options {
        target_tokens: Some(before / 2),
        ..Options::with_window(before)
    };
    g.bench_function("compact_128k", |b| {
        b.iter(|| {
            let view = responses::to_chat(black_box(&request)).unwrap();
            let outcome = engine::compact(&view, &opts).unwrap();
            responses::encode(outcome.body(&view), &request).unwrap()
        })
    });
    let chat_opts = Options {
        target_tokens: Some(count_request(&chat) / 2),
        ..Options::with_window(count_request(&chat))
    };
    g.bench_function("chat_128k", |b| {
        b.iter(|| {
            let outcome = engine::compact(black_box(&chat), &chat_opts).unwrap();
            serde_json::to_vec(outcome.body(&chat)).unwrap()
        })
    });
    // The adapter's share: reading the items as a view, and writing a view back.
    g.bench_function("to_chat_128k", |b| {
        b.iter(|| responses::to_chat(black_box(&request)).unwrap())
    });
    let outcome = engine::compact(&view, &opts).unwrap();
    let compacted = outcome.body(&view);
    g.bench_function("encode_128k", |b| {
        b.iter(|| responses::encode(black_box(compacted), &request).unwrap())
    });
    g.finish();
}

criterion_group!(benches, counting, compaction, responses);
criterion_main!(benches);
