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
/// The last line of a summary in the tight frame. Not a substring of [`END_MARKER`] (the
/// bracket closes where the long one goes on), so each is found on its own.
pub const END_MARKER_SHORT: &str = "[end of summary]";

const PREAMBLE: &str = include_str!("summary_preamble.md");
/// The preamble of a summary of a few lines, where the full one would take a fifth of
/// what a small window leaves it (at a 256-token window, the room of a decision or an
/// error line).
const PREAMBLE_SHORT: &str = include_str!("summary_preamble_short.md");
/// A summary body shorter than this is framed with [`PREAMBLE_SHORT`].
const SHORT_FRAME_BELOW: usize = 800;
/// The preamble summaries of a few items had in earlier versions ("Not a new request."),
/// still found in summaries clients carry back. The tight frame now has none: the marker
/// line already says "summary of earlier turns", and the five tokens of this line are, in
/// the 25% windows of the real corpus (188-444 tokens), what a decision lacked
/// (bench/results/fidelity-2026-11-26g.md).
const PREAMBLE_TIGHT: &str = include_str!("summary_preamble_tight.md");
/// A summary body shorter than this (about 150 tokens, where the short frame of about 30
/// would be a fifth of the message) is framed by the marker and [`END_MARKER_SHORT`]
/// alone, and the digest is written in its tight layout. At 400 a decision that took the
/// body past it cost its own 25 tokens and 27 more of frame and headings: measured
/// (bench/results/fidelity-2026-11-26g.md), 600 and 800 keep one decision more at the 25%
/// window and lose nothing; 600 keeps the short frame for the bodies in between.
pub(super) const TIGHT_FRAME_BELOW: usize = 600;
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
    if body.len() < TIGHT_FRAME_BELOW {
        return format!("{MARKER}\n{body}\n{END_MARKER_SHORT}");
    }
    let (preamble, end) = if body.len() < SHORT_FRAME_BELOW {
        (PREAMBLE_SHORT, END_MARKER)
    } else {
        (PREAMBLE, END_MARKER)
    };
    format!("{MARKER}\n{}\n{body}\n\n{end}", preamble.trim())
}

/// Where the first end marker of either form stands in `text`: (byte offset, length).
pub fn find_end(text: &str) -> Option<(usize, usize)> {
    [END_MARKER, END_MARKER_SHORT]
        .into_iter()
        .filter_map(|m| text.find(m).map(|at| (at, m.len())))
        .min()
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
        .or_else(|| after.strip_prefix(PREAMBLE_TIGHT.trim()))
        .or_else(|| after.strip_prefix(PREAMBLE_V1.trim()))
        .unwrap_or(after);
    let (body, rest) = match find_end(after) {
        Some((end, len)) => (&after[..end], &after[end + len..]),
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
        assert!(wrapped.starts_with(MARKER) && wrapped.ends_with(END_MARKER_SHORT));
        assert!(has_marker(&wrapped));
        let merged = format!("before\n\n{wrapped}\n\nplease continue");
        let (found, rest) = extract(&merged).unwrap();
        assert_eq!(found, body);
        assert_eq!(rest, "before\n\nplease continue");
    }

    #[test]
    fn each_size_of_summary_gets_its_frame_and_every_frame_reads_back() {
        let item = |n: usize| format!("## Errors\n- bash: error: {}", "x".repeat(n));
        // Each body one character either side of a threshold.
        let sizes = [
            TIGHT_FRAME_BELOW - 1,
            TIGHT_FRAME_BELOW,
            SHORT_FRAME_BELOW - 1,
            SHORT_FRAME_BELOW,
        ];
        for size in sizes {
            let body = item(size - item(0).len());
            assert_eq!(body.len(), size);
            let wrapped = wrap(&body);
            let tight = size < TIGHT_FRAME_BELOW;
            let short = !tight && size < SHORT_FRAME_BELOW;
            assert!(!wrapped.contains(PREAMBLE_TIGHT.trim()), "{size}");
            if tight {
                assert_eq!(wrapped, format!("{MARKER}\n{body}\n{END_MARKER_SHORT}"));
            }
            assert_eq!(wrapped.ends_with(END_MARKER_SHORT), tight, "{size}");
            assert_eq!(wrapped.ends_with(END_MARKER), !tight, "{size}");
            assert_eq!(wrapped.contains(PREAMBLE_SHORT.trim()), short, "{size}");
            assert_eq!(
                wrapped.contains(PREAMBLE.trim()),
                !tight && !short,
                "{size}"
            );
            let merged = format!("task\n\n{wrapped}\n\nnext");
            let (found, rest) = extract(&merged).unwrap();
            assert_eq!((found, rest.as_str()), (body, "task\n\nnext"), "{size}");
        }
    }

    #[test]
    fn a_summary_of_a_few_items_has_the_tight_frame() {
        // Five items of a 25% window (a rule, a decision, an error and two paths) come to
        // 450 characters: the short frame would add 27 tokens, a decision's room.
        let body = format!("Requests:\n- {}", "x".repeat(450));
        assert_eq!(wrap(&body), format!("{MARKER}\n{body}\n{END_MARKER_SHORT}"));
    }

    #[test]
    fn either_end_marker_ends_a_summary_whichever_preamble_it_has() {
        let body = "## Files\n- src/app.py";
        for preamble in [PREAMBLE, PREAMBLE_SHORT, PREAMBLE_TIGHT, PREAMBLE_V1] {
            for end in [END_MARKER, END_MARKER_SHORT] {
                let text = format!("{MARKER}\n{}\n{body}\n\n{end}\nlatest", preamble.trim());
                let (found, rest) = extract(&text).unwrap();
                assert_eq!((found.as_str(), rest.as_str()), (body, "latest"), "{end}");
                assert_eq!(find_end(&text), text.find(end).map(|at| (at, end.len())));
            }
        }
        // The first end marker closes the summary, whichever form comes later.
        let both = format!("{MARKER}\n{body}\n{END_MARKER_SHORT}\nsaid: {END_MARKER}");
        assert_eq!(extract(&both).unwrap().1, format!("said: {END_MARKER}"));
    }
}
