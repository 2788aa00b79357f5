//! The o200k and cl100k pre-tokenizers: where tiktoken's regular expressions split text
//! into the pieces that are byte-pair encoded one by one.
//!
//! Pure-ASCII text goes through a hand-written splitter: the regex engine is the slowest
//! step of counting, and agent traffic (code, logs, JSON) is overwhelmingly ASCII. Anything
//! else goes through the patterns themselves, compiled at first use. The splits are checked
//! against tiktoken's piece for piece in the tests.

use std::sync::LazyLock;

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

/// Which split pattern to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    O200k,
    Cl100k,
}

/// Calls `piece` with each pre-token of `text`, which must be ASCII.
pub fn split_ascii<'a>(text: &'a [u8], pattern: Pattern, mut piece: impl FnMut(&'a [u8])) {
    let mut p = 0;
    while p < text.len() {
        let end = match pattern {
            Pattern::O200k => next_o200k(text, p),
            Pattern::Cl100k => next_cl100k(text, p),
        };
        piece(&text[p..end]);
        p = end;
    }
}

/// o200k's pattern, as tiktoken publishes it but for its last alternative `\s+(?!\S)|\s+`:
/// the regex crate has no look-ahead, so that becomes `\s+\s` (a pattern of its own whose
/// last character is given back, see [`Unicode`]) then `\s+`; `\s+$` keeps the look-ahead's
/// meaning at the end of the text.
const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+$",
);
/// cl100k's pattern, with the same rewriting of its look-ahead. tiktoken's current pattern
/// (possessive quantifiers, which change no split here, and `\s++$` before `\s*[\r\n]`,
/// which does: a run of whitespace that ends the text is one piece even across newlines).
const CL100K: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+$|\s*[\r\n]+",
);

/// A pattern compiled for any Unicode text: the main alternatives, then `\s+\s`, then `\s+`,
/// tried as one leftmost-first regex anchored at each piece's start. `\s+(?!\S)` is the
/// longest run of whitespace not followed by a non-space: where the text goes on after the
/// run, that is the run but its last character, which is what `\s+\s` matches less its last
/// character (the same emulation bpe-openai uses).
struct Unicode {
    regex: Regex,
}

/// The index of the `\s+\s` pattern.
const LOOKAHEAD: usize = 1;

impl Unicode {
    fn new(main: &str) -> Option<Unicode> {
        Regex::new_many(&[main, r"\s+\s", r"\s+"])
            .ok()
            .map(|regex| Unicode { regex })
    }

    /// The end of the piece starting at `start`.
    fn next(&self, text: &str, start: usize) -> usize {
        let input = Input::new(text).range(start..).anchored(Anchored::Yes);
        match self.regex.find(input) {
            Some(m) if m.pattern().as_usize() == LOOKAHEAD => {
                let last = text[..m.end()]
                    .chars()
                    .next_back()
                    .map_or(1, char::len_utf8);
                m.end() - last
            }
            Some(m) if m.end() > start => m.end(),
            // Every character matches one of the alternatives, so this is unreachable; one
            // character as a piece of its own keeps the split going.
            _ => start + text[start..].chars().next().map_or(1, char::len_utf8),
        }
    }
}

static O200K_UNICODE: LazyLock<Option<Unicode>> = LazyLock::new(|| Unicode::new(O200K));
static CL100K_UNICODE: LazyLock<Option<Unicode>> = LazyLock::new(|| Unicode::new(CL100K));

/// Calls `piece` with each pre-token of `text`, any Unicode text.
pub fn split<'a>(text: &'a str, pattern: Pattern, mut piece: impl FnMut(&'a [u8])) {
    if text.is_ascii() {
        return split_ascii(text.as_bytes(), pattern, piece);
    }
    let unicode = match pattern {
        Pattern::O200k => &*O200K_UNICODE,
        Pattern::Cl100k => &*CL100K_UNICODE,
    };
    let Some(unicode) = unicode else {
        // The patterns are constants that compile (the tests split with them), so this
        // cannot happen; the whole text as one piece still gives a count.
        return piece(text.as_bytes());
    };
    let mut p = 0;
    while p < text.len() {
        let end = unicode.next(text, p);
        piece(&text.as_bytes()[p..end]);
        p = end;
    }
}

fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn is_nl(c: u8) -> bool {
    c == b'\r' || c == b'\n'
}

/// `[^\s\p{L}\p{N}]`
fn is_other(c: u8) -> bool {
    !is_ws(c) && !c.is_ascii_alphanumeric()
}

/// `[^\r\n\p{L}\p{N}]`: the optional character before a word.
fn is_prefix(c: u8) -> bool {
    !is_nl(c) && !c.is_ascii_alphanumeric()
}

fn run(b: &[u8], from: usize, f: impl Fn(u8) -> bool) -> usize {
    b[from..]
        .iter()
        .position(|&c| !f(c))
        .map_or(b.len(), |n| from + n)
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `i`: its length, or 0.
fn contraction(b: &[u8], i: usize) -> usize {
    if b.get(i) != Some(&b'\'') {
        return 0;
    }
    let lower = |k: usize| b.get(k).map(u8::to_ascii_lowercase);
    match (lower(i + 1), lower(i + 2)) {
        (Some(b'r'), Some(b'e')) | (Some(b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => 3,
        (Some(b's' | b't' | b'm' | b'd'), _) => 2,
        _ => 0,
    }
}

/// Start of the letters of a word at `p`, taking one prefix character if there is one.
fn word_start(b: &[u8], p: usize) -> Option<usize> {
    if b[p].is_ascii_alphabetic() {
        Some(p)
    } else if is_prefix(b[p]) && b.get(p + 1).is_some_and(u8::is_ascii_alphabetic) {
        Some(p + 1)
    } else {
        None
    }
}

fn digits(b: &[u8], p: usize) -> usize {
    run(b, p, |c| c.is_ascii_digit()).min(p + 3)
}

/// ` ?[^\s\p{L}\p{N}]+` followed by any of `tail`.
fn punctuation(b: &[u8], p: usize, tail: impl Fn(u8) -> bool) -> Option<usize> {
    let q = if b[p] == b' ' && b.get(p + 1).is_some_and(|&c| is_other(c)) {
        p + 1
    } else {
        p
    };
    if !is_other(b[q]) {
        return None;
    }
    let e = run(b, q, is_other);
    Some(run(b, e, tail))
}

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at a whitespace character; with `whole_at_end`, a run that
/// ends the text is one piece (cl100k's `\s++$`, which tiktoken tries first).
fn whitespace(b: &[u8], p: usize, whole_at_end: bool) -> usize {
    let e = run(b, p, is_ws);
    if whole_at_end && e == b.len() {
        return e;
    }
    if let Some(k) = b[p..e].iter().rposition(|&c| is_nl(c)) {
        return p + k + 1;
    }
    if e == b.len() || e - p < 2 {
        e
    } else {
        e - 1
    }
}

fn next_o200k(b: &[u8], p: usize) -> usize {
    if let Some(r) = word_start(b, p) {
        let upper = run(b, r, |c| c.is_ascii_uppercase());
        let lower = run(b, upper, |c| c.is_ascii_lowercase());
        return lower + contraction(b, lower);
    }
    if b[p].is_ascii_digit() {
        return digits(b, p);
    }
    punctuation(b, p, |c| is_nl(c) || c == b'/').unwrap_or_else(|| whitespace(b, p, false))
}

fn next_cl100k(b: &[u8], p: usize) -> usize {
    let k = contraction(b, p);
    if k > 0 {
        return p + k;
    }
    if let Some(r) = word_start(b, p) {
        return run(b, r, |c| c.is_ascii_alphabetic());
    }
    if b[p].is_ascii_digit() {
        return digits(b, p);
    }
    punctuation(b, p, is_nl).unwrap_or_else(|| whitespace(b, p, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ours(text: &str, pattern: Pattern) -> Vec<String> {
        let mut out = Vec::new();
        split_ascii(text.as_bytes(), pattern, |p| {
            out.push(String::from_utf8(p.to_vec()).unwrap())
        });
        out
    }

    /// tiktoken's patterns, with their look-ahead, run by the engine tiktoken-rs uses.
    fn regex(text: &str, pattern: Pattern) -> Vec<String> {
        static O200K: LazyLock<fancy_regex::Regex> =
            LazyLock::new(|| fancy_regex::Regex::new(tiktoken_rs::O200K_BASE_PAT_STR).unwrap());
        // tiktoken-rs's cl100k_base() pattern (it does not export it).
        static CL100K: LazyLock<fancy_regex::Regex> = LazyLock::new(|| {
            fancy_regex::Regex::new(concat!(
                r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+",
                r"| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
            ))
            .unwrap()
        });
        let re = match pattern {
            Pattern::O200k => &*O200K,
            Pattern::Cl100k => &*CL100K,
        };
        re.find_iter(text)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn pieces(text: &str, pattern: Pattern) -> Vec<String> {
        let mut out = Vec::new();
        split(text, pattern, |p| {
            out.push(String::from_utf8(p.to_vec()).unwrap())
        });
        out
    }

    fn same(text: &str) {
        for p in [Pattern::O200k, Pattern::Cl100k] {
            let want = regex(text, p);
            if text.is_ascii() {
                assert_eq!(ours(text, p), want, "{p:?} on {text:?}");
            }
            assert_eq!(pieces(text, p), want, "{p:?} on {text:?}");
        }
    }

    #[test]
    fn matches_the_regex_on_tricky_cases() {
        for t in [
            "",
            " ",
            "  ",
            "a",
            "HTTPServer",
            "DON'T don't I'm we'LL they're 's 'sa",
            "((foo))",
            "x = 12345;\n\n  y",
            "  \n \t\r\n  z ",
            "trailing   ",
            "a/b//c\n/d",
            " (x) ,y",
            "\x0b\x0cA\x00b\x7f",
            "'",
            "it's'",
            "end\n",
            "path/to/file.rs:12:4",
            "ABC def GHi",
            "```rust\nfn main() {}\n```",
            "a  \n",
            " \n",
            "1 2  3   4",
        ] {
            same(t);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn matches_the_regex_on_any_ascii(text in "[ -~\t\n\r\x0b\x0c\x00\x7f]{0,80}") {
            same(&text);
        }

        #[test]
        fn matches_the_regex_on_code_like_text(
            text in proptest::collection::vec(prop_oneof![
                Just(" "), Just("\n"), Just("  "), Just("\r\n"), Just("'s"), Just("'LL"), Just("/"),
                Just("HTTP"), Just("Server"), Just("foo"), Just("123"), Just("4567"), Just("()"),
                Just("::"), Just("\t"), Just("'"), Just("x"), Just("Y"), Just(".")], 0..40)
                .prop_map(|parts| parts.concat())
        ) {
            same(&text);
        }

        #[test]
        fn matches_the_regex_on_any_unicode(text in "[\\PC\\s]{0,60}") {
            same(&text);
        }

        #[test]
        fn matches_the_regex_on_mixed_scripts_and_spaces(
            text in proptest::collection::vec(prop_oneof![
                Just(" "), Just("\n"), Just("  "), Just("\u{a0}"), Just("\u{3000}"), Just("\u{2028}"),
                Just("日本語"), Just("É"), Just("école"), Just("ÉCOLE's"), Just("ǅ"), Just("ʰ"),
                Just("\u{301}"), Just("٣٤٥"), Just("Ⅻ"), Just("🎉"), Just("—"), Just("/"),
                Just("'S"), Just("x"), Just("12"), Just("\t"), Just("Ωmega")], 0..40)
                .prop_map(|parts| parts.concat())
        ) {
            same(&text);
        }
    }

    #[test]
    fn matches_the_regex_on_real_unicode_text() {
        for t in [
            "日本語のテキスト and emoji 🎉",
            "Ünïcödé  \u{a0}\u{a0}x \u{3000}\n\u{3000}",
            "naïve café — «quoted» 'S ÉTÉ's",
            "Привет, мир! 123٤٥٦ Ⅻ",
            "  \u{2003}trailing\u{2003}\u{2003}",
        ] {
            same(t);
        }
    }
}
