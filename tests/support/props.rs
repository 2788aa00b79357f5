//! What the property tests share: how many cases they run, the words their generated
//! texts are made of, and how tight a compaction they ask for.

use compaction_proxy::engine::{count_request, Options};
use proptest::prelude::ProptestConfig;
use serde_json::Value;

/// `default` cases per property, unless `PROPTEST_CASES` asks for another number.
pub fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default))
}

/// A text of `len` words, from words an agent session has (paths, errors, quotes,
/// line breaks, non-ASCII), varied by `seed`.
pub fn text(len: usize, seed: usize) -> String {
    let words = [
        "build",
        "fails",
        "in",
        "src/net.rs",
        "error:",
        "retry",
        "日本語",
        "\"q\"",
        "\n",
    ];
    (0..len)
        .map(|i| words[(i * 7 + seed) % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Options that aim a compaction of `request` at `ratio` percent of its tokens, in a
/// window of twice them.
pub fn aim_at(request: &Value, ratio: usize) -> Options {
    let before = count_request(request);
    Options {
        target_tokens: Some(before * ratio / 100),
        ..Options::with_window(before * 2)
    }
}
