//! Context windows by model, and how far the upstream's token counts drift from ours.
//!
//! A window is looked up in this order:
//! 1. the config's `[[models]]` rules, in file order: the user's word beats anything guessed,
//!    except that a smaller window learned from the upstream caps it (the upstream is the
//!    one that refuses, and a user may set a smaller window on purpose but never a larger
//!    one usefully);
//! 2. windows learned at run time from the upstream's own errors, per (upstream, model);
//! 3. the built-in table of common models.
//!
//! The learned map and the calibration map are bounded, so clients sending endless distinct
//! model names cannot grow memory without limit.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError, RwLock};

pub use crate::model_record::Count;
use crate::model_record::ModelRecord;
use crate::units::Window;

/// Entries kept per run-time map before an arbitrary old one is dropped.
const MAX_ENTRIES: usize = 4096;
/// Calibration factors are clamped to this range: beyond it the estimate, not the tokenizer, is wrong.
const FACTOR_MIN: f64 = 0.5;
const FACTOR_MAX: f64 = 3.0;
/// Weight of a new observation in the smoothed calibration factor.
const SMOOTHING: f64 = 0.3;

pub use crate::config::ModelRule;

/// Where a window came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSource {
    /// A `[[models]]` rule of the config.
    Config,
    /// An upstream error of this run reported it.
    Learned,
    /// The built-in table.
    BuiltIn,
}

/// A model's context window in tokens and where that number came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownWindow {
    /// The window, in the upstream's tokens.
    pub window: Window,
    /// Where the number came from.
    pub source: WindowSource,
}

type ModelKey = (String, String);

/// A key of the run-time maps as borrowed strings: looking a model up on every request
/// then builds no `String`s. Hashes as the owned `(String, String)` does (each `str` in
/// turn), which `Borrow` requires.
trait KeyRef {
    fn parts(&self) -> (&str, &str);
}

impl KeyRef for ModelKey {
    fn parts(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl KeyRef for (&str, &str) {
    fn parts(&self) -> (&str, &str) {
        *self
    }
}

impl<'a> Borrow<dyn KeyRef + 'a> for ModelKey {
    fn borrow(&self) -> &(dyn KeyRef + 'a) {
        self
    }
}

impl Hash for dyn KeyRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (upstream, model) = self.parts();
        upstream.hash(state);
        model.hash(state);
    }
}

impl PartialEq for dyn KeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyRef + '_ {}

/// The borrowed form of [`key`], for lookups.
fn key_ref<'a>(upstream: &'a str, model: &'a str) -> (&'a str, &'a str) {
    (upstream.trim_end_matches('/'), model)
}

/// Context windows and token-count calibration, shared by all requests.
#[derive(Debug, Default)]
pub struct ModelWindows {
    rules: Vec<ModelRule>,
    learned: RwLock<HashMap<ModelKey, u64>>,
    /// The most media parts one request may carry, as upstreams' refusals named it. Not
    /// stored: the first refusal after a restart teaches it again.
    media: RwLock<HashMap<ModelKey, u64>>,
    /// The most messages one request may carry, as upstreams' refusals named it (or as
    /// half of what was refused). Not stored either.
    messages: RwLock<HashMap<ModelKey, u64>>,
    factors: RwLock<HashMap<ModelKey, Factors>>,
    /// What was learned since the store was last written: only the fields that changed,
    /// so that replicas sharing a store do not overwrite each other's other fields.
    unsaved: Mutex<HashMap<ModelKey, ModelRecord>>,
    /// Woken when a window is learned: windows are written at once, factors in batches.
    pub window_learned: tokio::sync::Notify,
}

/// The factor learned from each kind of count. Servers whose `usage` and whose refusals
/// count differently exist (one that leaves the tools out of `usage`, say); the larger
/// factor is used, so a request is never estimated below what the window is enforced by.
#[derive(Debug, Default, Clone, Copy)]
struct Factors {
    refusal: Option<f64>,
    usage: Option<f64>,
}

impl Factors {
    fn get(self) -> f64 {
        match (self.refusal, self.usage) {
            (Some(a), Some(b)) => a.max(b),
            (Some(f), None) | (None, Some(f)) => f,
            (None, None) => 1.0,
        }
    }

    fn slot(&mut self, count: Count) -> &mut Option<f64> {
        match count {
            Count::Refusal => &mut self.refusal,
            Count::Usage => &mut self.usage,
        }
    }
}

impl ModelWindows {
    /// Builds the table from the config's rules (first matching rule wins).
    pub fn new(rules: Vec<ModelRule>) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    /// The window for `model` behind `upstream` (its base URL): config (capped by a
    /// smaller learned window), then learned, then built-in.
    pub fn window_for(&self, upstream: &str, model: &str) -> Option<KnownWindow> {
        let learned = self.learned_window(upstream, model);
        let window = |tokens, source| {
            Some(KnownWindow {
                window: Window(tokens),
                source,
            })
        };
        match (self.config_window(model), learned) {
            (Some(config), Some(learned)) if learned < config => {
                window(learned, WindowSource::Learned)
            }
            (Some(config), _) => window(config, WindowSource::Config),
            (None, Some(learned)) => window(learned, WindowSource::Learned),
            (None, None) => builtin_window(model).map(|tokens| KnownWindow {
                window: Window(tokens),
                source: WindowSource::BuiltIn,
            }),
        }
    }

    /// Lowers the learned window to `tokens` unless it is already at most that: for
    /// refusals that give no numbers, where the size that was refused is an upper bound.
    pub fn learn_at_most(&self, upstream: &str, model: &str, tokens: u64) {
        let current = self.window_for(upstream, model).map(|w| w.window.0);
        if tokens > 0 && current.is_none_or(|c| tokens < c) {
            self.learn(upstream, model, tokens);
        }
    }

    /// Remembers the window an upstream reported for `model`; the latest report wins because a
    /// local server may be restarted with another context size. Zero is ignored.
    pub fn learn(&self, upstream: &str, model: &str, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let k = key(upstream, model);
        {
            let mut map = self.learned.write().unwrap_or_else(PoisonError::into_inner);
            insert_bounded(&mut map, k.clone(), tokens);
        }
        self.unsaved(k, |r| r.window = Some(tokens));
        self.window_learned.notify_one();
    }

    /// Records one request's prompt size as counted by us (`ours`) and by the upstream
    /// (`theirs`), in a refusal or in an answer's usage. The factor of each kind moves
    /// smoothly so one odd request cannot swing it.
    pub fn calibrate(&self, upstream: &str, model: &str, count: Count, ours: u64, theirs: u64) {
        self.set_factor(
            upstream,
            model,
            count,
            ours,
            theirs,
            |old, sample| match old {
                Some(old) => Some(clamp_factor(old + SMOOTHING * (sample - old))),
                None => Some(sample),
            },
        );
    }

    /// Raises the factor a `count` of this kind shows for `model` behind `upstream` to
    /// at least `theirs` over `ours`, where `theirs` is only a lower bound on the
    /// upstream's count (a refusal that named no number, of a prompt sized to fit): never
    /// lowered by it, and not smoothed towards it, since the true count is higher still.
    pub fn raise(&self, upstream: &str, model: &str, count: Count, ours: u64, theirs: u64) {
        self.set_factor(upstream, model, count, ours, theirs, |old, bound| {
            old.is_none_or(|old| old < bound).then_some(bound)
        });
    }

    /// The factor of `count`'s kind set to what `next` makes of the one known and the
    /// sample `theirs` over `ours` shows (clamped); left as it is where `next` says
    /// nothing, and where either count is zero.
    fn set_factor(
        &self,
        upstream: &str,
        model: &str,
        count: Count,
        ours: u64,
        theirs: u64,
        next: impl FnOnce(Option<f64>, f64) -> Option<f64>,
    ) {
        if ours == 0 || theirs == 0 {
            return;
        }
        let sample = clamp_factor(theirs as f64 / ours as f64);
        let mut map = self.factors.write().unwrap_or_else(PoisonError::into_inner);
        let k = key(upstream, model);
        let mut factors = map.get(&k).copied().unwrap_or_default();
        let slot = factors.slot(count);
        let Some(factor) = next(*slot, sample) else {
            return;
        };
        *slot = Some(factor);
        insert_bounded(&mut map, k.clone(), factors);
        drop(map);
        self.unsaved(k, |r| *r.factor(count) = Some(factor));
    }

    fn unsaved(&self, k: ModelKey, change: impl FnOnce(&mut ModelRecord)) {
        let mut unsaved = self.unsaved.lock().unwrap_or_else(PoisonError::into_inner);
        if unsaved.len() >= MAX_ENTRIES && !unsaved.contains_key(&k) {
            return;
        }
        let record = unsaved
            .entry(k)
            .or_insert_with_key(|(upstream, model)| ModelRecord {
                upstream: upstream.clone(),
                model: model.clone(),
                window: None,
                refusal: None,
                usage: None,
            });
        change(record);
    }

    /// What was learned since the last call, for the store.
    pub fn take_unsaved(&self) -> Vec<ModelRecord> {
        let mut unsaved = self.unsaved.lock().unwrap_or_else(PoisonError::into_inner);
        unsaved.drain().map(|(_, record)| record).collect()
    }

    /// Takes in what the store holds, learned by an earlier run or another replica; it
    /// is not written back.
    pub fn absorb(&self, records: Vec<ModelRecord>) {
        for record in records {
            let k = key(&record.upstream, &record.model);
            if let Some(tokens) = record.window.filter(|t| *t > 0) {
                let mut map = self.learned.write().unwrap_or_else(PoisonError::into_inner);
                insert_bounded(&mut map, k.clone(), tokens);
            }
            if record.refusal.is_some() || record.usage.is_some() {
                let mut map = self.factors.write().unwrap_or_else(PoisonError::into_inner);
                let mut factors = map.get(&k).copied().unwrap_or_default();
                for (count, value) in [
                    (Count::Refusal, record.refusal),
                    (Count::Usage, record.usage),
                ] {
                    if let Some(f) = value {
                        *factors.slot(count) = Some(clamp_factor(f));
                    }
                }
                insert_bounded(&mut map, k, factors);
            }
        }
    }

    /// How many upstream tokens one of our estimated tokens is worth (1.0 until calibrated).
    pub fn factor(&self, upstream: &str, model: &str) -> f64 {
        let map = self.factors.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&key_ref(upstream, model) as &dyn KeyRef)
            .map_or(1.0, |f| f.get())
    }

    /// The most media parts one request for `model` behind `upstream` may carry: the
    /// configured cap, else the one a refusal named.
    pub fn media_cap(&self, upstream: &str, model: &str) -> Option<u64> {
        self.cap(upstream, model, |r| r.max_media, &self.media)
    }

    /// The most messages one request for `model` behind `upstream` may carry: the
    /// configured cap, else the one a refusal taught.
    pub fn message_cap(&self, upstream: &str, model: &str) -> Option<u64> {
        self.cap(upstream, model, |r| r.max_messages, &self.messages)
    }

    /// Remembers the message cap a refusal taught for `model` behind `upstream`.
    pub fn learn_message_cap(&self, upstream: &str, model: &str, cap: u64) {
        learn_cap(&self.messages, upstream, model, cap);
    }

    /// Remembers the media cap a refusal named for `model` behind `upstream`.
    pub fn learn_media_cap(&self, upstream: &str, model: &str, cap: u64) {
        learn_cap(&self.media, upstream, model, cap);
    }

    /// A per-request count cap: the first matching rule's, else the learned one.
    fn cap(
        &self,
        upstream: &str,
        model: &str,
        configured: impl Fn(&ModelRule) -> Option<u64>,
        learned: &RwLock<HashMap<ModelKey, u64>>,
    ) -> Option<u64> {
        let bare = strip_provider(model);
        let rule = self
            .rules
            .iter()
            .find(|r| glob_match(&r.pattern, model) || glob_match(&r.pattern, bare));
        rule.and_then(configured).or_else(|| {
            let learned = learned.read().unwrap_or_else(PoisonError::into_inner);
            learned
                .get(&key_ref(upstream, model) as &dyn KeyRef)
                .copied()
        })
    }

    fn config_window(&self, model: &str) -> Option<u64> {
        let bare = strip_provider(model);
        self.rules
            .iter()
            .filter(|r| r.context_window > 0)
            .find(|r| glob_match(&r.pattern, model) || glob_match(&r.pattern, bare))
            .map(|r| r.context_window)
    }

    fn learned_window(&self, upstream: &str, model: &str) -> Option<u64> {
        let map = self.learned.read().unwrap_or_else(PoisonError::into_inner);
        if map.is_empty() {
            return None;
        }
        map.get(&key_ref(upstream, model) as &dyn KeyRef).copied()
    }
}

fn key(upstream: &str, model: &str) -> ModelKey {
    (
        upstream.trim_end_matches('/').to_string(),
        model.to_string(),
    )
}

fn clamp_factor(f: f64) -> f64 {
    if f.is_finite() {
        f.clamp(FACTOR_MIN, FACTOR_MAX)
    } else {
        1.0
    }
}

fn learn_cap(map: &RwLock<HashMap<ModelKey, u64>>, upstream: &str, model: &str, cap: u64) {
    let mut map = map.write().unwrap_or_else(PoisonError::into_inner);
    insert_bounded(&mut map, key(upstream, model), cap);
}

fn insert_bounded<V>(map: &mut HashMap<ModelKey, V>, k: ModelKey, v: V) {
    if map.len() >= MAX_ENTRIES && !map.contains_key(&k) {
        if let Some(victim) = map.keys().next().cloned() {
            map.remove(&victim);
        }
    }
    map.insert(k, v);
}

/// Matches `text` against a glob where `*` is any run and `?` one character, ignoring ASCII case.
/// Runs on every chat request (several patterns each), so it compares bytes in place. A
/// literal pattern character matches its whole UTF-8 sequence byte by byte; `?` and the
/// star's backtracking step over whole characters, so positions stay on boundaries.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    // Greedy with one backtrack point: linear in practice, never exponential.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            // A last star takes whatever is left: `*` and `gpt-4o*` end here, rather
            // than stepping through the rest of the name.
            Some(b'*') if pi + 1 == p.len() => return true,
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(b'?') => {
                pi += 1;
                ti += utf8_len(t[ti]);
            }
            Some(c) if c.eq_ignore_ascii_case(&t[ti]) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    // Let the star swallow one more character of the text.
                    let st = st + utf8_len(t[st]);
                    pi = sp + 1;
                    ti = st;
                    star = Some((sp, st));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Length of the UTF-8 sequence a lead byte starts.
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xF0.. => 4,
        0xE0.. => 3,
        0xC0.. => 2,
        _ => 1,
    }
}

/// The part of a model name after any `provider/` prefix (`openai/gpt-4o` -> `gpt-4o`).
fn strip_provider(model: &str) -> &str {
    // By bytes: `/` is ASCII, so what follows it starts on a character boundary, and a
    // scan of a short name costs less than `rsplit`'s searcher (three per request).
    match model.bytes().rposition(|b| b == b'/') {
        Some(slash) => &model[slash + 1..],
        None => model,
    }
}

/// Cloud vendor prefixes of dotted model ids (`us.anthropic.claude-...`, `meta.llama3-...`).
const DOTTED_VENDORS: &[&str] = &[
    "us",
    "eu",
    "apac",
    "global",
    "anthropic",
    "meta",
    "mistral",
    "amazon",
    "deepseek",
    "qwen",
    "openai",
    "google",
];

/// Lower-cased model name without provider prefix, dotted vendor prefix or `:tag` suffix.
fn normalize(model: &str) -> String {
    let mut name = strip_provider(model.trim()).to_ascii_lowercase();
    if let Some(i) = name.find(':') {
        name.truncate(i);
    }
    while let Some((head, rest)) = name.split_once('.') {
        if !DOTTED_VENDORS.contains(&head) {
            break;
        }
        name = rest.to_string();
    }
    name
}

/// Built-in windows, most specific pattern first. Where a model caps its input below its
/// total window (GPT-5: 272k in, 400k total) the table holds the input cap, since that is
/// what the upstream enforces on the prompt.
const BUILTIN: &[(&str, u64)] = &[
    // OpenAI
    ("gpt-5*-chat*", 128_000),
    ("gpt-5*", 272_000),
    ("gpt-4.1*", 1_047_576),
    ("gpt-4.5*", 128_000),
    ("gpt-4o*", 128_000),
    ("chatgpt-4o*", 128_000),
    ("gpt-4-turbo*", 128_000),
    ("gpt-4-1106*", 128_000),
    ("gpt-4-0125*", 128_000),
    ("gpt-4-vision*", 128_000),
    ("gpt-4-32k*", 32_768),
    ("gpt-4*", 8_192),
    ("gpt-3.5-turbo-instruct*", 4_096),
    ("gpt-3.5-turbo-0301*", 4_096),
    ("gpt-3.5-turbo-0613*", 4_096),
    ("gpt-3.5*", 16_385),
    ("gpt-oss*", 131_072),
    ("o1-mini*", 128_000),
    ("o1-preview*", 128_000),
    ("o1*", 200_000),
    ("o3*", 200_000),
    ("o4-mini*", 200_000),
    ("codex-mini*", 200_000),
    // Anthropic
    ("claude-2", 100_000),
    ("claude-2.0*", 100_000),
    ("claude-instant*", 100_000),
    ("claude-*", 200_000),
    // Google
    ("gemini-1.5-pro*", 2_097_152),
    ("gemini-1.0*", 32_760),
    ("gemini-pro*", 32_760),
    ("gemini-*", 1_048_576),
    ("gemma-3*", 131_072),
    ("gemma-2*", 8_192),
    // Meta Llama (hosted names often carry a `meta-` prefix)
    ("*llama-4-scout*", 10_000_000),
    ("*llama-4*", 1_048_576),
    ("*llama-3.1*", 131_072),
    ("*llama-3.2*", 131_072),
    ("*llama-3.3*", 131_072),
    ("*llama3.1*", 131_072),
    ("*llama3.2*", 131_072),
    ("*llama3.3*", 131_072),
    ("*llama3-1*", 131_072),
    ("*llama3-2*", 131_072),
    ("*llama3-3*", 131_072),
    ("*llama-3*", 8_192),
    ("*llama3*", 8_192),
    ("*llama-2*", 4_096),
    ("*llama2*", 4_096),
    // Qwen
    ("qwen3-coder*", 262_144),
    ("qwen3-max*", 262_144),
    ("qwen3-next*", 262_144),
    ("qwen3-*2507*", 262_144),
    ("qwen3*", 40_960),
    ("qwq*", 131_072),
    ("qwen-turbo*", 1_000_000),
    ("qwen-plus*", 131_072),
    ("qwen-max*", 32_768),
    ("qwen2.5-coder*", 32_768),
    ("qwen2*", 32_768),
    ("qwen-2*", 32_768),
    // DeepSeek
    ("deepseek*", 131_072),
    // Mistral
    ("codestral*", 262_144),
    ("*mixtral-8x22b*", 65_536),
    ("*mixtral*", 32_768),
    ("*mistral-7b*", 32_768),
    ("mistral-tiny*", 32_768),
    ("magistral*", 40_960),
    ("mistral-*", 131_072),
    ("open-mistral-nemo*", 131_072),
    ("ministral*", 131_072),
    ("devstral*", 131_072),
    ("pixtral*", 131_072),
];

/// The built-in window for a model name, tolerant of provider prefixes, vendor prefixes of
/// dotted ids, `:tag` suffixes and date suffixes.
pub fn builtin_window(model: &str) -> Option<u64> {
    // Clients send the same model name request after request; matching it against the
    // whole table every time was about 4% of a pass-through request's instructions.
    thread_local! {
        static LAST: RefCell<Option<(String, Option<u64>)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((name, tokens)) if name == model => *tokens,
        _ => {
            let tokens = builtin_lookup(model);
            *last = Some((model.to_owned(), tokens));
            tokens
        }
    })
}

fn builtin_lookup(model: &str) -> Option<u64> {
    let name = normalize(model);
    BUILTIN
        .iter()
        .find(|(pattern, _)| glob_match(pattern, &name))
        .map(|&(_, tokens)| tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_borrowed_key_finds_what_an_owned_one_stored() {
        let mut map = HashMap::new();
        map.insert(key("http://up/v1/", "gpt-4o"), 7);
        map.insert(key("http://up/v1", "gpt-4o-mini"), 8);
        let get = |u, m| map.get(&key_ref(u, m) as &dyn KeyRef).copied();
        assert_eq!(get("http://up/v1", "gpt-4o"), Some(7));
        assert_eq!(get("http://up/v1/", "gpt-4o-mini"), Some(8));
        assert_eq!(get("http://up/v1", "gpt-4"), None);
        assert_eq!(get("http://other/v1", "gpt-4o"), None);
    }

    #[test]
    fn repeated_and_alternating_lookups_agree_with_the_table() {
        let models = [
            "gpt-4o-mini",
            "gpt-4o-mini",
            "",
            "claude-3-5-sonnet",
            "no-such-model",
            "gpt-4o-mini",
            "",
        ];
        for model in models {
            assert_eq!(builtin_window(model), builtin_lookup(model), "{model}");
        }
    }

    #[test]
    fn glob_basics() {
        assert!(glob_match("gpt-4o*", "gpt-4o"));
        assert!(glob_match("gpt-4o*", "GPT-4o-2024-08-06"));
        assert!(!glob_match("gpt-4o*", "gpt-4"));
        assert!(glob_match("gpt-?o", "gpt-4o"));
        assert!(!glob_match("gpt-?o", "gpt-40o"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("*llama*", "meta-llama-3.1"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "x"));
        assert!(glob_match("**a", "ba"));
        // `?` is one character, not one byte.
        assert!(glob_match("caf?", "café"));
        assert!(glob_match("*é*x", "aébéx"));
        assert!(!glob_match("caf??", "café"));
        assert!(glob_match("?b", "éb"));
        assert!(!glob_match("é", "e"));
        // A last star takes the rest, whatever it is; one before it still has to match.
        assert!(glob_match("*", "gpt-4o-mini"));
        assert!(glob_match("g*", "gé/x"));
        assert!(!glob_match("x*", "gpt"));
        assert!(!glob_match("*o*", "gpt-4"));
    }

    #[test]
    fn the_provider_prefix_is_what_ends_at_the_last_slash() {
        assert_eq!(strip_provider("openai/gpt-4o"), "gpt-4o");
        assert_eq!(strip_provider("a/b/é"), "é");
        assert_eq!(strip_provider("gpt-4o"), "gpt-4o");
        assert_eq!(strip_provider("gpt/"), "");
    }

    #[test]
    fn glob_is_not_exponential() {
        let text = "a".repeat(5_000);
        let pattern = format!("{}b", "*a".repeat(50));
        assert!(!glob_match(&pattern, &text));
    }

    #[test]
    fn builtin_families() {
        let cases = [
            ("gpt-4o", 128_000),
            ("openai/gpt-4o-mini-2024-07-18", 128_000),
            ("gpt-4.1-nano", 1_047_576),
            ("gpt-4", 8_192),
            ("gpt-4-0613", 8_192),
            ("gpt-4-turbo-2024-04-09", 128_000),
            ("gpt-4-32k", 32_768),
            ("gpt-5", 272_000),
            ("gpt-5-chat-latest", 128_000),
            ("gpt-3.5-turbo", 16_385),
            ("o3-mini", 200_000),
            ("o1-mini", 128_000),
            ("anthropic/claude-3.5-sonnet", 200_000),
            ("claude-opus-4-5-20251101", 200_000),
            ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", 200_000),
            ("google/gemini-2.5-pro", 1_048_576),
            ("gemini-1.5-pro-002", 2_097_152),
            ("meta-llama/Meta-Llama-3.1-8B-Instruct", 131_072),
            ("llama-3.3-70b-versatile", 131_072),
            ("llama3.1:8b", 131_072),
            ("meta.llama3-8b-instruct-v1:0", 8_192),
            ("Qwen/Qwen2.5-72B-Instruct", 32_768),
            ("qwen3-coder-30b-a3b-instruct", 262_144),
            ("Qwen/Qwen3-32B", 40_960),
            ("deepseek-chat", 131_072),
            ("deepseek/deepseek-r1:free", 131_072),
            ("mistral-large-latest", 131_072),
            ("mistralai/Mixtral-8x7B-Instruct-v0.1", 32_768),
            ("codestral-2501", 262_144),
            ("open-mixtral-8x22b", 65_536),
            ("meta.llama3-1-70b-instruct-v1:0", 131_072),
            ("qwen/qwen-2.5-coder-32b-instruct", 32_768),
            ("claude-2", 100_000),
            ("claude-2.1", 200_000),
            ("gpt-3.5-turbo-0613", 4_096),
            ("gpt-oss-120b", 131_072),
            ("o4-mini-2025-04-16", 200_000),
        ];
        for (model, want) in cases {
            assert_eq!(builtin_window(model), Some(want), "{model}");
        }
        assert_eq!(builtin_window("my-private-model"), None);
        assert_eq!(builtin_window(""), None);
    }

    #[test]
    fn learn_at_most_only_lowers() {
        let windows = ModelWindows::new(Vec::new());
        let up = "http://h/v1";
        windows.learn_at_most(up, "local", 9_000);
        windows.learn_at_most(up, "local", 12_000);
        assert_eq!(
            windows.window_for(up, "local").map(|w| w.window.0),
            Some(9_000)
        );
        windows.learn_at_most(up, "local", 5_000);
        assert_eq!(
            windows.window_for(up, "local").map(|w| w.window.0),
            Some(5_000)
        );
        windows.learn_at_most(up, "gpt-4o", 1_000_000);
        assert_eq!(
            windows.window_for(up, "gpt-4o").map(|w| w.source),
            Some(WindowSource::BuiltIn)
        );
    }

    #[test]
    fn order_is_config_then_learned_then_builtin() {
        let windows = ModelWindows::new(vec![ModelRule {
            pattern: "gpt-4o*".into(),
            context_window: 64_000,
            max_media: None,
            max_messages: None,
        }]);
        let up = "http://h/v1";
        let config = windows.window_for(up, "gpt-4o");
        assert_eq!(
            config.map(|w| (w.window.0, w.source)),
            Some((64_000, WindowSource::Config))
        );
        // A provider prefix does not hide the model from a bare config glob.
        assert_eq!(
            windows.window_for(up, "openai/gpt-4o").map(|w| w.window.0),
            Some(64_000)
        );
        windows.learn(up, "gpt-4o", 100_000);
        assert_eq!(
            windows.window_for(up, "gpt-4o").map(|w| w.source),
            Some(WindowSource::Config)
        );
        // The upstream refusing below the configured window caps it.
        windows.learn(up, "gpt-4o", 30_000);
        assert_eq!(
            windows
                .window_for(up, "gpt-4o")
                .map(|w| (w.window.0, w.source)),
            Some((30_000, WindowSource::Learned))
        );

        let builtin = windows.window_for(up, "claude-3-haiku");
        assert_eq!(builtin.map(|w| w.source), Some(WindowSource::BuiltIn));
        windows.learn(&format!("{up}/"), "claude-3-haiku", 100_000);
        let learned = windows.window_for(up, "claude-3-haiku");
        assert_eq!(
            learned.map(|w| (w.window.0, w.source)),
            Some((100_000, WindowSource::Learned))
        );
        // Learned windows are per upstream.
        let other = windows.window_for("http://other", "claude-3-haiku");
        assert_eq!(other.map(|w| w.source), Some(WindowSource::BuiltIn));

        windows.learn(up, "local", 0);
        assert_eq!(windows.window_for(up, "local"), None);
        windows.learn(up, "local", 8_192);
        windows.learn(up, "local", 4_096);
        assert_eq!(
            windows.window_for(up, "local").map(|w| w.window.0),
            Some(4_096)
        );
    }

    #[test]
    fn first_matching_rule_wins() {
        let windows = ModelWindows::new(vec![
            ModelRule {
                pattern: "qwen*-7b".into(),
                context_window: 8_000,
                max_media: None,
                max_messages: None,
            },
            ModelRule {
                pattern: "qwen*".into(),
                context_window: 32_000,
                max_media: None,
                max_messages: None,
            },
        ]);
        assert_eq!(
            windows.window_for("u", "qwen2-7b").map(|w| w.window.0),
            Some(8_000)
        );
        assert_eq!(
            windows.window_for("u", "qwen2-72b").map(|w| w.window.0),
            Some(32_000)
        );
        let zero = ModelWindows::new(vec![ModelRule {
            pattern: "*".into(),
            context_window: 0,
            max_media: None,
            max_messages: None,
        }]);
        let source = zero.window_for("u", "gpt-4o").map(|w| w.source);
        assert_eq!(source, Some(WindowSource::BuiltIn));
    }

    #[test]
    fn calibration_smooths_and_clamps() {
        let w = ModelWindows::new(Vec::new());
        assert_eq!(w.factor("u", "m"), 1.0);
        let usage = Count::Usage;
        w.calibrate("u", "m", usage, 1_000, 1_200);
        assert!((w.factor("u", "m") - 1.2).abs() < 1e-9);
        w.calibrate("u", "m", usage, 1_000, 1_000);
        let f = w.factor("u", "m");
        assert!(f > 1.0 && f < 1.2, "{f}");
        w.calibrate("u", "m", usage, 0, 5);
        w.calibrate("u", "m", usage, 5, 0);
        assert!((w.factor("u", "m") - f).abs() < 1e-12);

        w.calibrate("u", "huge", usage, 1, 1_000_000);
        assert_eq!(w.factor("u", "huge"), FACTOR_MAX);
        w.calibrate("u", "tiny", usage, 1_000_000, 1);
        assert_eq!(w.factor("u", "tiny"), FACTOR_MIN);
        assert_eq!(w.factor("other", "m"), 1.0);
    }

    #[test]
    fn a_lower_bound_on_the_count_raises_the_factor_and_never_lowers_it() {
        let w = ModelWindows::new(Vec::new());
        let refusal = Count::Refusal;
        w.raise("u", "m", refusal, 1_000, 1_300);
        assert!((w.factor("u", "m") - 1.3).abs() < 1e-9);
        // A lower bound below what is known says nothing new.
        w.raise("u", "m", refusal, 1_000, 1_100);
        assert!((w.factor("u", "m") - 1.3).abs() < 1e-9);
        // One above it is taken whole, not smoothed towards.
        w.raise("u", "m", refusal, 1_000, 1_500);
        assert!((w.factor("u", "m") - 1.5).abs() < 1e-9);
        w.raise("u", "m", refusal, 0, 1_500);
        assert!((w.factor("u", "m") - 1.5).abs() < 1e-9);
        // What was learned goes to the store.
        let saved = w.take_unsaved();
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[0].refusal, Some(1.5));
    }

    #[test]
    fn the_count_the_window_is_enforced_by_is_never_underestimated() {
        let w = ModelWindows::new(Vec::new());
        // A server whose usage leaves out what its refusals count.
        w.calibrate("u", "m", Count::Refusal, 1_000, 1_300);
        for _ in 0..20 {
            w.calibrate("u", "m", Count::Usage, 1_000, 1_000);
        }
        assert!((w.factor("u", "m") - 1.3).abs() < 1e-9);
        // Usage counting more than the refusal said wins as well.
        w.calibrate("u", "n", Count::Refusal, 1_000, 1_100);
        w.calibrate("u", "n", Count::Usage, 1_000, 1_400);
        assert!((w.factor("u", "n") - 1.4).abs() < 1e-9);
    }

    #[test]
    fn maps_stay_bounded() {
        let w = ModelWindows::new(Vec::new());
        for i in 0..(MAX_ENTRIES + 10) {
            w.learn("u", &format!("m{i}"), 1_000);
        }
        let len = w.learned.read().map(|m| m.len()).unwrap_or(0);
        assert_eq!(len, MAX_ENTRIES);
    }

    #[test]
    fn shared_across_threads() {
        let w = std::sync::Arc::new(ModelWindows::new(Vec::new()));
        let handles: Vec<_> = (0..4u64)
            .map(|i| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for j in 0..100u64 {
                        w.learn("u", "m", 1_000 + i * 100 + j);
                        w.calibrate("u", "m", Count::Usage, 100, 150);
                        let _ = w.window_for("u", "m");
                    }
                })
            })
            .collect();
        for h in handles {
            assert!(h.join().is_ok());
        }
        assert!(w.window_for("u", "m").is_some());
        assert!((w.factor("u", "m") - 1.5).abs() < 1e-9);
    }
}
