//! The compaction engine's own work, for `bench/compare.sh`: exact token counting and
//! deterministic compaction (no model: the summary is built from the dropped turns) of
//! agent sessions of about 10k, 128k and 1M tokens, each compacted to half its size.
//! The same conversations are written as JSON files so that `bench/hermes_compress.py`
//! can time Hermes Agent's ContextCompressor on identical inputs.
//!
//!     cargo run --release --example bench_engine -- --out-dir DIR
//!         [--sizes 10000,128000,1000000] [--iterations 20] [--seconds 2]
//!
//! Per size: `DIR/session-SIZE.json` (`{"model":..., "messages": [...]}`), a markdown
//! row, and one `RESULT impl=compaction-proxy ...` line with medians in milliseconds.
//! Timings start from the parsed request (as Hermes' compressor gets a parsed list):
//! `count` is the exact tokenizer count of the whole request, `compact` is a whole
//! compaction with counting included, `parse` is serde_json on the request's bytes,
//! which the proxy pays on top when it has to look inside a body.

use std::hint::black_box;
use std::time::{Duration, Instant};

use compaction_proxy::engine::{self, count_request, Options};
use serde_json::Value;

// The same sessions as benches/compaction.rs: code, tool output and compiler messages,
// so token counting works on realistic text.
#[path = "../benches/common/mod.rs"]
mod common;
use common::session;

/// Runs `f` at least `min_iter` times and for at least `budget`; per-call milliseconds.
fn time<T>(min_iter: usize, budget: Duration, mut f: impl FnMut() -> T) -> Vec<f64> {
    black_box(f()); // warm-up
    let started = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < min_iter || (started.elapsed() < budget && samples.len() < 1000) {
        let t = Instant::now();
        black_box(f());
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    samples.sort_by(f64::total_cmp);
    samples
}

fn median(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

fn label(size: usize) -> String {
    if size >= 1_000_000 && size.is_multiple_of(1_000_000) {
        format!("{}M", size / 1_000_000)
    } else {
        format!("{}k", size / 1000)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut out_dir = None;
    let mut sizes = vec![10_000, 128_000, 1_000_000];
    let mut iterations = 5;
    let mut seconds = 2.0;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--out-dir" => out_dir = Some(std::path::PathBuf::from(value)),
            "--sizes" => {
                sizes = value.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--iterations" => iterations = value.parse()?,
            "--seconds" => seconds = value.parse()?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let budget = Duration::from_secs_f64(seconds);
    println!("| conversation | tokens (exact) | bytes | parse ms | count ms | compact ms | tokens after | messages |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for size in sizes {
        let request = session(size);
        let bytes = serde_json::to_vec(&request)?;
        if let Some(dir) = &out_dir {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join(format!("session-{}.json", label(size))), &bytes)?;
        }
        let tokens = count_request(&request);
        let opts = Options {
            target_tokens: Some(tokens / 2),
            ..Options::with_window(tokens)
        };
        let outcome = engine::compact(&request, &opts)?;
        let report = &outcome.report;
        if !report.fits || report.unchanged {
            return Err(format!(
                "{}: compaction did not reach its target: {report}",
                label(size)
            )
            .into());
        }
        let parse = time(iterations, budget / 4, || {
            serde_json::from_slice::<Value>(&bytes).map(drop)
        });
        let count = time(iterations, budget / 4, || count_request(&request));
        let full = time(iterations, budget / 2, || {
            engine::compact(&request, &opts).map(drop)
        });
        let (parse, count, compact) = (median(&parse), median(&count), median(&full));
        let (fastest, slowest) = (full[0], full[full.len() - 1]);
        let (name, len, after) = (label(size), bytes.len(), report.tokens_after);
        let (before_msgs, after_msgs) = (report.messages_before, report.messages_after);
        println!(
            "| {name} | {tokens} | {len} | {parse:.2} | {count:.2} | {compact:.2} [{fastest:.2}..{slowest:.2}] | {after} | {before_msgs} -> {after_msgs} |"
        );
        results.push(format!(
            "RESULT impl=compaction-proxy size={name} tokens={tokens} bytes={len} parse_ms={parse:.3} count_ms={count:.3} compact_ms={compact:.3} compact_min_ms={fastest:.3} compact_max_ms={slowest:.3} samples={} tokens_after={after} messages_before={before_msgs} messages_after={after_msgs}",
            full.len(),
        ));
    }
    println!();
    for line in results {
        println!("{line}");
    }
    Ok(())
}
