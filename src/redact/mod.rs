//! Secret masking for text that leaves the client's own request: what the proxy sends to a
//! summariser and what it stores as a summary.
//!
//! One hand-written pass over the text, word by word (a word is a run of
//! `[A-Za-z0-9_-]`). At the start of each word a few shape checks run: a PEM private key
//! header, a vendor token prefix, a JWT, an AWS key id, a `Bearer` credential, a URL with a
//! password, and an assignment (`NAME=value`, `"name": "value"`, `name: value`,
//! `--name value`, `?name=value`, `.netrc`'s `password value`, `Cookie: ...`) whose name
//! looks secret. Every look-ahead is either
//! consumed by the match or bounded, so the cost stays linear in the input.
//!
//! A match is replaced by `[REDACTED:<kind>]`. Nothing of the secret is kept, not even its
//! vendor prefix: the kind says enough to debug with.
//!
//! False-positive policy: a summary that loses an ordinary word is cheap, a leaked key is not,
//! but masking prose and code wholesale would ruin the summary. So:
//! - vendor tokens must start a word (`task-force` holds no `sk-`) and have a body long
//!   enough and random-looking (a digit, or an uppercase letter past the first character);
//! - assignment names are split into words (`OPENAI_API_KEY` -> openai/api/key,
//!   `accessToken` -> access/token) and must contain a secret word; words such as `max`,
//!   `count`, `url`, `type`, `file` or `name` veto it (`max_tokens`, `token_url`,
//!   `password_file` are not secrets); a bare `key` or `pass` is too common to count;
//! - values must not be placeholders (`<redacted>`, `${VAR}`, `$VAR`, `{{x}}`, `***`,
//!   `null`, `true`, an earlier `[REDACTED:...]`) and must reach a minimum length (4 for
//!   passwords, 8 for tokens and keys; all-digit values of non-password names are counts);
//! - `name: value` without quotes is how prose and type annotations look (`password: str`,
//!   `token: Option<String>`), so there the value must also look random or be long;
//! - `name = identifier` with spaces around `=` is code reading a variable, not a literal;
//! - a value followed by `(` or `[` is a call or an index, not a literal.

use std::borrow::Cow;

use memchr::memmem;
#[cfg(test)]
use serde_json::Value;

/// Start of every placeholder; a value starting with it was masked already.
const PLACEHOLDER: &str = "[REDACTED";
/// Longest quoted or unquoted value a failed match may scan, so failures stay cheap.
const MAX_VALUE: usize = 4096;
/// Longest authority (`user:password@host:port`) looked at in a URL.
const MAX_AUTHORITY: usize = 512;
/// Longest assignment name considered.
const MAX_NAME: usize = 64;
/// Bytes read before a bare `password` for the `.netrc` words that lead it.
const NETRC_LOOKBACK: usize = 256;

/// Masks the secrets in `text`; borrows it back when there are none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut s = Scanner {
        text,
        b: text.as_bytes(),
        out: None,
        emitted: 0,
    };
    s.run();
    match s.out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[s.emitted..]);
            Cow::Owned(out)
        }
    }
}

/// Masks the secrets in every string of a JSON value, and the whole string value of any
/// object member whose key looks secret (`{"password": "hunter22"}`), since a parsed
/// value no longer shows its key next to it.
#[cfg(test)]
pub fn redact_value(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let Cow::Owned(r) = redact(s) {
                *s = r;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_value),
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                let secret = classify(key, false);
                match (secret, v.as_str()) {
                    (Some(class), Some(s)) if accepts(class, s, Style::Quoted) => {
                        *v = Value::String(placeholder(class.label));
                    }
                    _ => redact_value(v),
                }
            }
        }
        _ => {}
    }
}

fn placeholder(label: &str) -> String {
    format!("{PLACEHOLDER}:{label}]")
}

/// A span to mask and the kind written in its place.
struct Hit {
    from: usize,
    to: usize,
    label: &'static str,
}

struct Scanner<'a> {
    text: &'a str,
    b: &'a [u8],
    out: Option<String>,
    emitted: usize,
}

impl Scanner<'_> {
    fn run(&mut self) {
        let mut i = 0;
        while i < self.b.len() {
            if !is_word(self.b[i]) {
                i += 1;
                continue;
            }
            let end = word_end(self.b, i);
            i = match self.at_word(i, end) {
                Some(hit) => self.emit(hit),
                None => end,
            };
        }
    }

    fn at_word(&self, start: usize, end: usize) -> Option<Hit> {
        let b = self.b;
        pem(b, start, end)
            .or_else(|| vendor_token(b, start, end))
            .or_else(|| jwt(b, start, end))
            .or_else(|| bearer(b, start, end))
            .or_else(|| url_password(b, start, end))
            .or_else(|| assignment(b, start, end))
    }

    /// Writes the text up to the hit and its placeholder; returns where scanning resumes.
    fn emit(&mut self, hit: Hit) -> usize {
        let out = self
            .out
            .get_or_insert_with(|| String::with_capacity(self.text.len()));
        out.push_str(&self.text[self.emitted..hit.from]);
        out.push_str(&placeholder(hit.label));
        self.emitted = hit.to;
        hit.to
    }
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

fn word_end(b: &[u8], start: usize) -> usize {
    b[start..]
        .iter()
        .position(|&c| !is_word(c))
        .map_or(b.len(), |n| start + n)
}

/// A digit, or an uppercase letter past the first character: true of generated tokens,
/// rare in words and identifiers of prose.
fn looks_random(s: &[u8]) -> bool {
    s.iter().any(u8::is_ascii_digit) || s.iter().skip(1).any(u8::is_ascii_uppercase)
}

/// `-----BEGIN ... PRIVATE KEY-----` through its END line; without an END line, to the end
/// of the text, since whatever follows is key material.
fn pem(b: &[u8], start: usize, end: usize) -> Option<Hit> {
    if &b[start..end] != b"-----BEGIN" {
        return None;
    }
    // The header label is uppercase words (`RSA PRIVATE KEY`, `PGP PRIVATE KEY BLOCK`), so
    // nothing the scanner masks can sit inside it and change the match on a second pass.
    let label_len = b[end..]
        .iter()
        .take(64)
        .position(|&c| !(c.is_ascii_uppercase() || c == b' '))?;
    let line_end = end + label_len;
    if !b[line_end..].starts_with(b"-----")
        || memmem::find(&b[end..line_end], b"PRIVATE KEY").is_none()
    {
        return None;
    }
    let to = match memmem::find(&b[line_end..], b"-----END") {
        Some(n) => {
            let after = line_end + n + b"-----END".len();
            let close = b[after..].iter().take(100).position(|&c| c == b'\n');
            let dashes = memmem::find(&b[after..(after + 100).min(b.len())], b"-----");
            match (dashes, close) {
                (Some(d), Some(c)) if d < c => after + d + 5,
                (Some(d), None) => after + d + 5,
                _ => after,
            }
        }
        None => b.len(),
    };
    Some(Hit {
        from: start,
        to,
        label: "private-key",
    })
}

/// Vendor prefixes, most specific first, with the shortest plausible body after them.
const VENDORS: &[(&str, &str, usize)] = &[
    ("sk-ant-", "anthropic-key", 20),
    ("sk-proj-", "openai-key", 20),
    ("sk-svcacct-", "openai-key", 20),
    ("sk-admin-", "openai-key", 20),
    ("sk-or-v1-", "openrouter-key", 20),
    ("sk-", "openai-key", 20),
    ("sk_live_", "stripe-key", 16),
    ("sk_test_", "stripe-key", 16),
    ("rk_live_", "stripe-key", 16),
    ("rk_test_", "stripe-key", 16),
    ("whsec_", "stripe-key", 20),
    ("github_pat_", "github-token", 20),
    ("ghp_", "github-token", 30),
    ("gho_", "github-token", 30),
    ("ghs_", "github-token", 30),
    ("ghu_", "github-token", 30),
    ("ghr_", "github-token", 30),
    ("glpat-", "gitlab-token", 20),
    ("xoxb-", "slack-token", 10),
    ("xoxa-", "slack-token", 10),
    ("xoxp-", "slack-token", 10),
    ("xoxr-", "slack-token", 10),
    ("xoxs-", "slack-token", 10),
    ("xapp-", "slack-token", 10),
    ("hf_", "huggingface-token", 30),
    ("npm_", "npm-token", 30),
    ("pypi-", "pypi-token", 40),
    ("gsk_", "groq-key", 40),
    ("xai-", "xai-key", 40),
    ("pplx-", "perplexity-key", 40),
    ("r8_", "replicate-token", 30),
    ("dop_v1_", "digitalocean-token", 40),
    ("shpat_", "shopify-token", 30),
    ("shpss_", "shopify-token", 30),
    ("lin_api_", "linear-key", 30),
    ("tskey-", "tailscale-key", 20),
];

/// Shortest word that can be a vendor token (`xoxb-` and a 10-byte body).
const MIN_TOKEN: usize = 15;
/// First bytes of the vendor prefixes and of the fixed-shape keys.
const TOKEN_INITIALS: &[u8] = b"srwgxhnpdltA";

fn vendor_token(b: &[u8], start: usize, end: usize) -> Option<Hit> {
    let word = &b[start..end];
    // Most words are short or start with a letter no prefix has: skip the table for them.
    if word.len() < MIN_TOKEN || !TOKEN_INITIALS.contains(&word[0]) {
        return None;
    }
    let fixed = fixed_shape(word);
    let label = fixed.or_else(|| {
        VENDORS.iter().find_map(|(prefix, label, min)| {
            let body = word.strip_prefix(prefix.as_bytes())?;
            (body.len() >= *min && looks_random(body)).then_some(*label)
        })
    })?;
    Some(Hit {
        from: start,
        to: end,
        label,
    })
}

/// Keys whose length is fixed: AWS access key ids and Google API keys.
fn fixed_shape(word: &[u8]) -> Option<&'static str> {
    let aws = word.len() == 20
        && (word.starts_with(b"AKIA") || word.starts_with(b"ASIA"))
        && word[4..]
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    if aws {
        return Some("aws-access-key");
    }
    (word.len() == 39 && word.starts_with(b"AIza")).then_some("google-key")
}

/// Three base64url segments joined by dots, the first (a JSON header) starting `eyJ`.
/// An empty signature (an unsigned token) still leaks its claims, so it counts.
fn jwt(b: &[u8], start: usize, end: usize) -> Option<Hit> {
    if !b[start..end].starts_with(b"eyJ") || end - start < 10 || b.get(end) != Some(&b'.') {
        return None;
    }
    let payload_end = word_end(b, end + 1);
    if payload_end - (end + 1) < 4 || b.get(payload_end) != Some(&b'.') {
        return None;
    }
    let to = if payload_end + 1 < b.len() && is_word(b[payload_end + 1]) {
        word_end(b, payload_end + 1)
    } else {
        payload_end + 1
    };
    Some(Hit {
        from: start,
        to,
        label: "jwt",
    })
}

/// Characters of an HTTP credential (RFC 6750 token68).
fn is_cred(c: u8) -> bool {
    is_word(c) || matches!(c, b'.' | b'~' | b'+' | b'/' | b'=')
}

/// `Bearer <token>`, with a token long and random enough not to be prose ("bearer tokens").
fn bearer(b: &[u8], start: usize, end: usize) -> Option<Hit> {
    if !b[start..end].eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    scheme_credential(b, end, "bearer")
}

/// The credential after an authorization scheme word ending at `at`.
fn scheme_credential(b: &[u8], at: usize, label: &'static str) -> Option<Hit> {
    let from = skip_blanks(b, at);
    if from == at {
        return None;
    }
    let to = scan(b, from, is_cred);
    let cred = &b[from..to];
    (cred.len() >= 8 && looks_random(cred) && !is_placeholder(cred)).then_some(Hit {
        from,
        to,
        label,
    })
}

fn skip_blanks(b: &[u8], at: usize) -> usize {
    scan(b, at, |c| c == b' ' || c == b'\t')
}

/// The end of the run of bytes from `from` that satisfy `keep`, at most [`MAX_VALUE`] long.
fn scan(b: &[u8], from: usize, keep: impl Fn(u8) -> bool) -> usize {
    let mut limit = (from + MAX_VALUE).min(b.len());
    // Stop on a character boundary, so a value cut by the limit is still valid UTF-8.
    while limit > from && limit < b.len() && (b[limit] & 0xC0) == 0x80 {
        limit -= 1;
    }
    b[from..limit]
        .iter()
        .position(|&c| !keep(c))
        .map_or(limit, |n| from + n)
}

/// `scheme://user:password@host`: masks the password and keeps the user, unless the user
/// part itself looks like a token (`https://ghp_...@github.com`), then masks it all.
fn url_password(b: &[u8], start: usize, end: usize) -> Option<Hit> {
    if !b[end..].starts_with(b"://") || !b[start].is_ascii_alphabetic() {
        return None;
    }
    let auth = end + 3;
    let limit = (auth + MAX_AUTHORITY).min(b.len());
    let auth_end = b[auth..limit]
        .iter()
        .position(|&c| {
            c.is_ascii_whitespace() || matches!(c, b'/' | b'?' | b'#' | b'"' | b'\'' | b'<' | b'>')
        })
        .map_or(limit, |n| auth + n);
    let at = auth + memchr::memrchr(b'@', &b[auth..auth_end])?;
    let userinfo = &b[auth..at];
    // Masked already, by an earlier pass or by this one's assignment rule.
    if memmem::find(userinfo, PLACEHOLDER.as_bytes()).is_some() {
        return None;
    }
    match memchr::memchr(b':', userinfo) {
        Some(colon) => {
            let user = &userinfo[..colon];
            let password = &userinfo[colon + 1..];
            if password.is_empty() || is_placeholder(password) {
                return None;
            }
            let from = if user.len() >= 16 && looks_random(user) {
                auth
            } else {
                auth + colon + 1
            };
            Some(Hit {
                from,
                to: at,
                label: "password",
            })
        }
        None => (userinfo.len() >= 16 && looks_random(userinfo) && !is_placeholder(userinfo))
            .then_some(Hit {
                from: auth,
                to: at,
                label: "url-credentials",
            }),
    }
}

/// How a value was written, which sets how sure a match must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Between quotes: a literal.
    Quoted,
    /// `NAME=value`, `--name value`, `?name=value`: environment, command line, query.
    Bare,
    /// `name = value`: code, where a bare identifier is a variable.
    Spaced,
    /// `name: value` without quotes: YAML, headers, but also prose and type annotations.
    Colon,
    /// `password value` in a sentence: prose, where the next word is most often a word
    /// (`password authentication failed`) and only a random-looking one is a value.
    Worded,
}

/// What kind of secret a name announces.
#[derive(Clone, Copy)]
struct Class {
    label: &'static str,
    min_len: usize,
    password: bool,
}

impl Class {
    const fn new(label: &'static str, min_len: usize) -> Class {
        Class {
            label,
            min_len,
            password: false,
        }
    }
}

const PASSWORD: Class = Class {
    password: true,
    ..Class::new("password", 4)
};
const SECRET: Class = Class::new("secret", 6);
const TOKEN: Class = Class::new("token", 8);
const KEY: Class = Class::new("key", 8);
const AUTH: Class = Class::new("auth", 8);
const COOKIE: Class = Class::new("cookie", 8);
const QUERY: Class = Class::new("secret", 4);

/// Words that make a name describe a secret rather than hold one.
const VETO: &[&str] = &[
    "max",
    "min",
    "count",
    "num",
    "number",
    "limit",
    "length",
    "len",
    "size",
    "type",
    "kind",
    "url",
    "uri",
    "endpoint",
    "file",
    "path",
    "dir",
    "name",
    "env",
    "var",
    "header",
    "prefix",
    "suffix",
    "usage",
    "format",
    "expiry",
    "expires",
    "expiration",
    "ttl",
    "timeout",
    "field",
    "id",
    "budget",
    "policy",
    "mode",
    "method",
    "provider",
    "scheme",
    "required",
    "enabled",
    "hint",
    "label",
    "placeholder",
    "encoding",
    "source",
    "ref",
    "lifetime",
    "rotation",
    "reset",
    "strength",
    "input",
    "prompt",
    "validation",
    "sock",
    "socket",
];

/// Words before `key` that make it a credential rather than a map or keyboard key.
const KEY_KINDS: &[&str] = &[
    "api",
    "access",
    "private",
    "secret",
    "signing",
    "encryption",
    "master",
    "session",
    "client",
    "license",
    "auth",
    "account",
    "service",
    "ssh",
    "x",
];

/// Names that are secret only as URL query or form parameters.
const QUERY_NAMES: &[&str] = &[
    "key",
    "sig",
    "signature",
    "code",
    "credential",
    "session",
    "sessionid",
    "sid",
];

/// The kind of secret a variable, field or parameter name announces, if any.
fn classify(name: &str, query: bool) -> Option<Class> {
    if name.len() > MAX_NAME {
        return None;
    }
    let words = split_name(name);
    if words.iter().any(|w| VETO.contains(&w.as_str())) {
        return None;
    }
    let has = |set: &[&str]| words.iter().any(|w| set.contains(&w.as_str()));
    if has(&["password", "passwd", "pwd", "passphrase"]) {
        return Some(PASSWORD);
    }
    if has(&["secret", "secrets"]) {
        return Some(SECRET);
    }
    if has(&["token", "accesstoken", "authtoken", "refreshtoken"]) {
        return Some(TOKEN);
    }
    let key_pair = words
        .windows(2)
        .any(|w| matches!(w[1].as_str(), "key" | "keys") && KEY_KINDS.contains(&w[0].as_str()));
    if key_pair || has(&["apikey", "accesskey", "privatekey", "secretkey", "xapikey"]) {
        return Some(KEY);
    }
    if has(&["auth", "authorization", "credential", "credentials"]) {
        return Some(AUTH);
    }
    if has(&["cookie", "cookies"]) {
        return Some(COOKIE);
    }
    if query && words.len() <= 3 && has(QUERY_NAMES) {
        return Some(QUERY);
    }
    None
}

/// Lowercase words of a name: split at non-alphanumerics and at lower-to-upper changes.
fn split_name(name: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() {
            flush(&mut words, &mut current);
            prev_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && prev_lower {
            flush(&mut words, &mut current);
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        current.push(c.to_ascii_lowercase());
    }
    flush(&mut words, &mut current);
    words
}

fn flush(words: &mut Vec<String>, current: &mut String) {
    if !current.is_empty() {
        words.push(std::mem::take(current));
    }
}

/// Values that stand for a secret without being one.
fn is_placeholder(v: &[u8]) -> bool {
    let starts = |p: &[u8]| v.starts_with(p);
    if starts(PLACEHOLDER.as_bytes())
        || starts(b"<")
        || starts(b"${")
        || starts(b"$(")
        || starts(b"{{")
        || starts(b"%(")
        || starts(b"%s")
        || (v.first() == Some(&b'$') && v.get(1).is_some_and(|&c| is_word(c)))
    {
        return true;
    }
    if v.first().is_some_and(|&f| v.iter().all(|&c| c == f)) {
        return true;
    }
    const WORDS: &[&str] = &[
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "redacted",
        "hidden",
        "masked",
        "required",
        "optional",
        "string",
        "your_api_key",
        "your-api-key",
    ];
    WORDS.iter().any(|w| v.eq_ignore_ascii_case(w.as_bytes()))
}

/// Whether `value`, written in `style` under a name of `class`, is masked.
fn accepts(class: Class, value: &str, style: Style) -> bool {
    let v = value.as_bytes();
    if v.len() < class.min_len || is_placeholder(v) {
        return false;
    }
    if !class.password && v.iter().all(u8::is_ascii_digit) {
        return false;
    }
    match style {
        Style::Quoted | Style::Bare => true,
        Style::Spaced => !v
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.'),
        Style::Colon => looks_random(v) || v.len() >= 12,
        Style::Worded => looks_random(v),
    }
}

/// `NAME=value`, `"name": "value"`, `name: value`, `--name value`, `?name=value`.
fn assignment(b: &[u8], start: usize, end: usize) -> Option<Hit> {
    let name_end = dotted_end(b, start, end);
    if hides_token(b, end, name_end) {
        return None;
    }
    let (sep_end, style) = separator(b, start, name_end)?;
    let name = std::str::from_utf8(&b[start..name_end]).ok()?;
    let query = start > 0 && matches!(b[start - 1], b'?' | b'&' | b';');
    let class = classify(name, query)?;
    let (from, to, style) = value_span(b, sep_end, style)?;
    if b[from..].starts_with(b"-----BEGIN") {
        // A key file's content as a value: the whole block goes, not its first line.
        return pem(b, from, word_end(b, from));
    }
    let value = std::str::from_utf8(&b[from..to]).ok()?;
    if let Some((label, scheme_len)) = auth_scheme(value) {
        return scheme_credential(b, from + scheme_len, label);
    }
    if !accepts(class, value, style) {
        return None;
    }
    // The check looked at a bounded prefix; a value accepted whole is masked whole.
    let to = if style != Style::Quoted && to - from >= MAX_VALUE - 4 {
        b[to..]
            .iter()
            .position(|&c| !in_bare_value(c))
            .map_or(b.len(), |n| to + n)
    } else {
        to
    };
    Some(Hit {
        from,
        to,
        label: class.label,
    })
}

/// Whether a word after the first of a dotted name is itself a token, which the word-by-word
/// scan must then reach (`cfg.sk-proj-...=x`).
fn hides_token(b: &[u8], first_end: usize, name_end: usize) -> bool {
    let mut i = first_end + 1;
    while i < name_end {
        let end = word_end(b, i);
        if vendor_token(b, i, end).is_some() || jwt(b, i, end).is_some() {
            return true;
        }
        i = end + 1;
    }
    false
}

/// Extends a name over `.`-joined words (`spring.datasource.password`), within
/// [`MAX_NAME`] so that a long dotted run costs little at each of its words.
fn dotted_end(b: &[u8], start: usize, mut end: usize) -> usize {
    while end + 1 < b.len() && b[end] == b'.' && is_word(b[end + 1]) && end - start <= MAX_NAME {
        end = word_end(b, end + 1);
    }
    end
}

/// After a name: an optional closing quote, blanks, then `=`, `:`, `:=`, `=>` or `==`; or,
/// for a `--flag`, a single space. Returns where the value may start and its style.
fn separator(b: &[u8], start: usize, name_end: usize) -> Option<(usize, Style)> {
    let mut i = name_end;
    if b.get(i) == Some(&b'\\') && matches!(b.get(i + 1), Some(b'"' | b'\'')) {
        i += 2;
    } else if matches!(b.get(i), Some(b'"' | b'\'')) {
        i += 1;
    }
    let before = skip_blanks(b, i);
    let spaced_before = before > i;
    let style = match b.get(before) {
        Some(b'=') => Style::Bare,
        Some(b':') => Style::Colon,
        _ if b.get(name_end) == Some(&b' ') && b[start..].starts_with(b"--") => {
            return Some((name_end + 1, Style::Bare));
        }
        // `.netrc` and similar: `password hunter22`, held to the stricter colon rule; in
        // a sentence only a random-looking value: `FATAL: password authentication failed`
        // is Postgres's error, not a secret.
        _ if b.get(name_end) == Some(&b' ') && is_bare_password(&b[start..name_end]) => {
            let style = if in_netrc_place(b, start) {
                Style::Colon
            } else {
                Style::Worded
            };
            return Some((name_end + 1, style));
        }
        _ => return None,
    };
    let mut j = before + 1;
    if matches!(b.get(j), Some(b'=' | b'>')) {
        j += 1;
    }
    let after = skip_blanks(b, j);
    let spaced = spaced_before || after > j;
    let style = match style {
        Style::Bare if spaced => Style::Spaced,
        other => other,
    };
    Some((after, style))
}

/// Whether a word starting at `start` stands where `.netrc` puts its `password`: first on
/// its line, or after a `machine`, `login` or `account` and its value, or `default`.
fn in_netrc_place(b: &[u8], start: usize) -> bool {
    // The two words before it are all it takes (a host and a user name are short); a long
    // line is not read back to its start.
    let from = start.saturating_sub(NETRC_LOOKBACK);
    let line_start = b[from..start]
        .iter()
        .rposition(|&c| c == b'\n')
        .map(|at| from + at + 1);
    let before: Vec<&[u8]> = b[line_start.unwrap_or(from)..start]
        .split(|c| c.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    let is = |w: Option<&&[u8]>, names: &[&str]| {
        w.is_some_and(|w| names.iter().any(|n| w.eq_ignore_ascii_case(n.as_bytes())))
    };
    (before.is_empty() && (line_start.is_some() || from == 0))
        || is(before.last(), &["default"])
        || is(before.iter().rev().nth(1), &["machine", "login", "account"])
}

fn is_bare_password(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"password") || name.eq_ignore_ascii_case(b"passwd")
}

/// The value after a separator: a quoted string on one line, or a run up to a delimiter.
fn value_span(b: &[u8], at: usize, style: Style) -> Option<(usize, usize, Style)> {
    let (quote, open, escaped) = match (b.get(at), b.get(at + 1)) {
        (Some(b'\\'), Some(&q @ (b'"' | b'\''))) => (Some(q), at + 2, true),
        (Some(&q @ (b'"' | b'\'' | b'`')), _) => (Some(q), at + 1, false),
        _ => (None, at, false),
    };
    if let Some(to) = quote.and_then(|q| closing_quote(b, open, q, escaped)) {
        return Some((open, to, Style::Quoted));
    }
    let to = scan(b, open, in_bare_value);
    if matches!(b.get(to), Some(b'(' | b'[')) {
        return None;
    }
    Some((open, to, style))
}

/// Bytes of an unquoted value: up to whitespace, a quote, a bracket or a list separator.
fn in_bare_value(c: u8) -> bool {
    !c.is_ascii_whitespace()
        && !matches!(
            c,
            b',' | b';'
                | b'&'
                | b'"'
                | b'\''
                | b'`'
                | b')'
                | b']'
                | b'}'
                | b'('
                | b'['
                | b'{'
                | b'<'
                | b'>'
                | b'\\'
                | b'#'
        )
}

/// Where a quoted value opened at `open` ends, on the same line. Inside JSON that is itself
/// a string (`\"name\": \"value\"`, `escaped`), `\"` closes it; otherwise `\"` is an
/// escaped quote within the value. Any other backslash escapes the next byte.
fn closing_quote(b: &[u8], open: usize, q: u8, escaped: bool) -> Option<usize> {
    let limit = (open + MAX_VALUE).min(b.len());
    let mut i = open;
    while i < limit {
        match b[i] {
            c if c == q => return Some(i),
            b'\n' => return None,
            b'\\' if escaped && b.get(i + 1) == Some(&q) => return Some(i),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// When a value opens with an authorization scheme (`Bearer ...`, `Basic ...`), the label
/// for its credential and the scheme word's length: the credential alone is masked, so the
/// scheme stays readable.
fn auth_scheme(value: &str) -> Option<(&'static str, usize)> {
    let word = value.split([' ', '\t']).next().unwrap_or(value);
    let label = match word.to_ascii_lowercase().as_str() {
        "bearer" => "bearer",
        "basic" | "token" | "digest" => "auth",
        _ => return None,
    };
    Some((label, word.len()))
}

#[cfg(test)]
mod tests;
