//! What the property tests share: how many cases they run, and the words their generated
//! texts are made of. Included by path (`#[path = "support/props.rs"]`), apart from the
//! mock upstream, so that the property tests build without it.

// Each property test uses a different part.
#![allow(dead_code)]

use proptest::prelude::ProptestConfig;

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
