//! Context windows of well-known models, for when the caller does not say.

/// Used for models not in the table.
pub const DEFAULT_CONTEXT_WINDOW: usize = 128_000;

/// Longest prefix first, so `gpt-4o` is not taken for `gpt-4`.
const KNOWN: &[(&str, usize)] = &[
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-5", 400_000),
    ("gpt-3.5-turbo", 16_385),
    ("o1-mini", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
];

/// The context window of `model` (provider prefixes such as `openai/` are ignored).
pub fn default_context_window(model: &str) -> usize {
    let m = model.rsplit('/').next().unwrap_or(model);
    KNOWN
        .iter()
        .find(|(prefix, _)| m.starts_with(prefix))
        .map_or(DEFAULT_CONTEXT_WINDOW, |(_, w)| *w)
}

/// The table as `prefix=window` pairs, for `--help`.
pub fn describe_table() -> String {
    KNOWN
        .iter()
        .map(|(p, w)| format!("{p}*={w}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_most_specific_prefix() {
        assert_eq!(default_context_window("gpt-4o-mini"), 128_000);
        assert_eq!(default_context_window("gpt-4-0613"), 8_192);
        assert_eq!(default_context_window("openai/gpt-4.1-mini"), 1_047_576);
        assert_eq!(default_context_window("llama3"), DEFAULT_CONTEXT_WINDOW);
    }
}
