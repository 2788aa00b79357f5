//! Pass 5: the summary of the removed middle. This file holds the marker that makes a
//! summary recognisable in later requests and the wrapper that frames it as reference
//! material; the deterministic summary used when no LLM summary is available is in
//! [`super::digest`].

use std::sync::LazyLock;

use memchr::memmem::Finder;

/// First line of every summary the engine writes. Stable across versions: later requests
/// carry it back and it is how the previous summary is found.
pub const MARKER: &str = "[compaction-proxy: summary of earlier turns]";
/// Last line of every summary, so a model can tell where the digest stops when it shares a
/// message with real conversation text.
pub const END_MARKER: &str = "[end of summary; the conversation continues below]";

const PREAMBLE: &str = include_str!("summary_preamble.md");
/// The preamble of a summary of a few lines, where the full one would take a fifth of
/// what a small window leaves it (at a 256-token window, the room of a decision or an
/// error line).
const PREAMBLE_SHORT: &str = include_str!("summary_preamble_short.md");
/// A summary body shorter than this is framed with [`PREAMBLE_SHORT`].
const SHORT_FRAME_BELOW: usize = 800;
/// The longer preamble of earlier versions, still found in summaries clients carry back.
const PREAMBLE_V1: &str = include_str!("summary_preamble_v1.md");

/// Where a summary came from, for reports, headers and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummarySource {
    /// Written by an LLM.
    Llm,
    /// The deterministic digest.
    Fallback,
    /// Reused from an earlier compaction.
    Cache,
    /// The deterministic digest of an earlier compaction, reused: still a degraded
    /// summary, and reported as one.
    CachedFallback,
    /// No summary was needed.
    None,
}

impl SummarySource {
    pub fn as_str(self) -> &'static str {
        match self {
            SummarySource::Llm => "llm",
            SummarySource::Fallback => "fallback",
            SummarySource::Cache => "cache",
            SummarySource::CachedFallback => "cached-fallback",
            SummarySource::None => "none",
        }
    }

    /// The source [`SummarySource::as_str`] names.
    pub fn parse(name: &str) -> Option<SummarySource> {
        [
            SummarySource::Llm,
            SummarySource::Fallback,
            SummarySource::Cache,
            SummarySource::CachedFallback,
            SummarySource::None,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// A summary body (without marker or framing) and its origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    pub source: SummarySource,
}

/// Whether a text holds a summary. Runs over every message of every compacted request,
/// hence the SIMD searcher built once.
pub fn has_marker(text: &str) -> bool {
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(MARKER));
    FINDER.find(text.as_bytes()).is_some()
}

/// The full message text for a summary body.
pub fn wrap(body: &str) -> String {
    let body = body.trim();
    let preamble = if body.len() < SHORT_FRAME_BELOW {
        PREAMBLE_SHORT
    } else {
        PREAMBLE
    };
    format!("{MARKER}\n{}\n{body}\n\n{END_MARKER}", preamble.trim())
}

/// Splits a text holding a summary into (summary body, the rest of the text).
pub fn extract(text: &str) -> Option<(String, String)> {
    let at = text.find(MARKER)?;
    let before = &text[..at];
    let after = &text[at + MARKER.len()..];
    let after = after.trim_start();
    let after = after
        .strip_prefix(PREAMBLE.trim())
        .or_else(|| after.strip_prefix(PREAMBLE_SHORT.trim()))
        .or_else(|| after.strip_prefix(PREAMBLE_V1.trim()))
        .unwrap_or(after);
    let (body, rest) = match after.find(END_MARKER) {
        Some(end) => (&after[..end], &after[end + END_MARKER.len()..]),
        None => (after, ""),
    };
    let rest = format!("{}\n\n{}", before.trim(), rest.trim());
    Some((body.trim().to_string(), rest.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapped_summary_round_trips() {
        let body = "## Errors seen\n- bash: error: boom";
        let wrapped = wrap(body);
        assert!(wrapped.starts_with(MARKER) && wrapped.ends_with(END_MARKER));
        assert!(has_marker(&wrapped));
        let merged = format!("before\n\n{wrapped}\n\nplease continue");
        let (found, rest) = extract(&merged).unwrap();
        assert_eq!(found, body);
        assert_eq!(rest, "before\n\nplease continue");
    }

    #[test]
    fn a_summary_of_a_few_lines_gets_the_short_frame_and_either_reads_back() {
        let small = "## Errors\n- bash: error: boom".to_string();
        let large = format!("## Errors seen\n- {}", "x".repeat(SHORT_FRAME_BELOW));
        for body in [small, large] {
            let wrapped = wrap(&body);
            let short = body.len() < SHORT_FRAME_BELOW;
            assert_eq!(wrapped.contains(PREAMBLE_SHORT.trim()), short);
            assert_eq!(wrapped.contains(PREAMBLE.trim()), !short);
            assert_eq!(extract(&wrapped).unwrap().0, body);
        }
    }
}
