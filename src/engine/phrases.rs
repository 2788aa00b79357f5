//! Lists of phrases found in one pass over a text: the engine's readers (what a sentence
//! says in [`super::scan`], which numbers count in [`super::quantity`]) ask it of every
//! sentence and line they read.

use aho_corasick::AhoCorasick;

/// Lists of lowercase phrases looked for in one pass over a text, ASCII case ignored and
/// a typographic apostrophe read as a straight one. The digest asks this of every
/// sentence and every line of output: a search per phrase, each setting up its own
/// searcher, was most of the digest's time.
pub struct Phrases {
    /// `None` only if the automaton could not be built; then each phrase is searched
    /// for on its own.
    automaton: Option<AhoCorasick>,
    /// Per pattern: the list it came from, and its text.
    patterns: Vec<(usize, String)>,
}

impl Phrases {
    pub fn new(lists: &[&[&str]]) -> Phrases {
        let mut patterns = Vec::new();
        for (list, phrases) in lists.iter().enumerate() {
            for p in phrases.iter() {
                patterns.push((list, (*p).to_string()));
                if p.contains('\'') {
                    patterns.push((list, p.replace('\'', "\u{2019}")));
                }
            }
        }
        let automaton = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(patterns.iter().map(|(_, p)| p))
            .ok();
        Phrases {
            automaton,
            patterns,
        }
    }

    /// The lowest list any phrase found in `text` belongs to; with `words`, only a phrase
    /// with no letter or digit right before or after it counts.
    pub fn find(&self, text: &str, words: bool) -> Option<usize> {
        let b = text.as_bytes();
        let whole = |at: usize, end: usize| {
            !words
                || ((at == 0 || !b[at - 1].is_ascii_alphanumeric())
                    && (end == b.len() || !b[end].is_ascii_alphanumeric()))
        };
        let mut best: Option<usize> = None;
        self.any(text, whole, |list, _, _| {
            best = Some(best.map_or(list, |b| b.min(list)));
            list == 0
        });
        best
    }

    /// The lists any phrase found in `text` belongs to, as bits (list `i` is bit `i`),
    /// in the same one pass; with `words`, as in [`Phrases::find`]. For a reader that
    /// asks of several lists, where a search per list would read the text again.
    pub fn lists(&self, text: &str, words: bool) -> u64 {
        let b = text.as_bytes();
        let whole = |at: usize, end: usize| {
            !words
                || ((at == 0 || !b[at - 1].is_ascii_alphanumeric())
                    && (end == b.len() || !b[end].is_ascii_alphanumeric()))
        };
        let mut found = 0u64;
        self.any(text, whole, |list, _, _| {
            found |= 1 << list;
            false
        });
        found
    }

    /// Whether `test` holds for any phrase found in `text` where `whole` says it stands
    /// alone, given its list, start and end; it is asked of each such find until it holds.
    pub fn any(
        &self,
        text: &str,
        whole: impl Fn(usize, usize) -> bool,
        mut test: impl FnMut(usize, usize, usize) -> bool,
    ) -> bool {
        let Some(ac) = &self.automaton else {
            // ASCII lowercasing keeps every byte where it was.
            let lower = text.to_ascii_lowercase();
            return self.patterns.iter().any(|(list, p)| {
                lower
                    .match_indices(p.as_str())
                    .any(|(at, _)| whole(at, at + p.len()) && test(*list, at, at + p.len()))
            });
        };
        ac.find_overlapping_iter(text).any(|m| {
            let list = self.patterns[m.pattern().as_usize()].0;
            whole(m.start(), m.end()) && test(list, m.start(), m.end())
        })
    }
}
