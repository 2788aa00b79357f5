//! A hand-written pre-tokenizer for pure-ASCII text, splitting exactly where the o200k and
//! cl100k regular expressions split. The regex engine is the slowest step of counting, and
//! agent traffic (code, logs, JSON) is overwhelmingly ASCII; anything else goes through the
//! regex. The splits are checked against the regex piece for piece in the tests.

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

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at a whitespace character.
fn whitespace(b: &[u8], p: usize) -> usize {
    let e = run(b, p, is_ws);
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
    punctuation(b, p, |c| is_nl(c) || c == b'/').unwrap_or_else(|| whitespace(b, p))
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
    punctuation(b, p, is_nl).unwrap_or_else(|| whitespace(b, p))
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

    fn regex(text: &str, pattern: Pattern) -> Vec<String> {
        let tok = match pattern {
            Pattern::O200k => bpe_openai::o200k_base(),
            Pattern::Cl100k => bpe_openai::cl100k_base(),
        };
        tok.split(text).map(str::to_string).collect()
    }

    fn same(text: &str) {
        for p in [Pattern::O200k, Pattern::Cl100k] {
            assert_eq!(ours(text, p), regex(text, p), "{p:?} on {text:?}");
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
    }
}
