//! Token accounting with OpenAI's own encodings.
//!
//! Counts follow OpenAI's published recipe for chat messages (a fixed overhead per message,
//! the encoded role, content and name, a few tokens to prime the reply). Images are charged
//! a fixed cost by `detail` because their real cost depends on pixel dimensions the request
//! does not carry, and never by the length of their base64 payload.
//!
//! Counting is tiktoken's algorithm over compact rank tables (`bpe`), after tiktoken's
//! split patterns (`pretoken`); the tests check the counts against `tiktoken-rs`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde_json::{Map, Value};

use super::bpe::{self, Ranks};
use super::pretoken::{split, Pattern};

/// Every message costs this much beyond its fields.
const PER_MESSAGE: usize = 3;
/// A `name` field costs one token beyond its text.
const PER_NAME: usize = 1;
/// The reply is primed with `<|start|>assistant<|message|>`.
const REPLY_PRIMING: usize = 3;
/// Framing of one tool call inside an assistant message.
const PER_TOOL_CALL: usize = 4;

/// `detail: "low"` images are a single 512px tile.
pub const IMAGE_LOW: usize = 85;
/// `detail: "auto"` or absent: a 1024x1024 image at high detail (base + 4 tiles).
pub const IMAGE_AUTO: usize = 765;
/// `detail: "high"`: a 2048x768 image (base + 6 tiles), a conservative large case.
pub const IMAGE_HIGH: usize = 1105;
/// Audio and file parts: their real cost is unknowable here; charge a conservative flat rate.
pub const AUDIO_PART: usize = 1000;
pub const FILE_PART: usize = 1500;

/// A text counted on its own gets a piece cache from this length on.
const CACHE_FROM_BYTES: usize = 512;

/// A small, fast, non-cryptographic hash for short byte strings (the Fx multiply-rotate
/// scheme); the keys are never attacker-chosen in a way that matters, since a collision
/// only costs time within one text.
#[derive(Default)]
struct PieceHasher(u64);

impl Hasher for PieceHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Which byte-pair encoding a model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    O200k,
    Cl100k,
}

impl Encoding {
    /// cl100k for GPT-4 (before 4o), GPT-3.5 and the v3 embedding models; o200k for
    /// everything newer and for unknown models, since those are most likely recent.
    pub fn for_model(model: &str) -> Encoding {
        let m = model.rsplit('/').next().unwrap_or(model);
        let old = m.starts_with("gpt-3.5")
            || m.starts_with("gpt-35")
            || m.starts_with("text-embedding")
            || (m.starts_with("gpt-4")
                && !m.starts_with("gpt-4o")
                && !m.starts_with("gpt-4.")
                && !m.starts_with("gpt-4-o"));
        if old {
            Encoding::Cl100k
        } else {
            Encoding::O200k
        }
    }
}

/// A token counter bound to one encoding. Cheap to copy; an encoding's table is built once
/// per process, the first time a counter for it counts (so a process serving only new
/// models never builds cl100k's).
#[derive(Clone, Copy)]
pub struct Counter {
    encoding: Encoding,
    pattern: Pattern,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counter")
    }
}

impl Counter {
    pub fn new(encoding: Encoding) -> Counter {
        let pattern = match encoding {
            Encoding::O200k => Pattern::O200k,
            Encoding::Cl100k => Pattern::Cl100k,
        };
        Counter { encoding, pattern }
    }

    fn ranks(&self) -> &'static Ranks {
        match self.encoding {
            Encoding::O200k => bpe::o200k_base(),
            Encoding::Cl100k => bpe::cl100k_base(),
        }
    }

    pub fn for_model(model: &str) -> Counter {
        Counter::new(Encoding::for_model(model))
    }

    /// The counter for a request body, chosen by its `model`.
    pub fn for_request(request: &Value) -> Counter {
        Counter::for_model(request.get("model").and_then(Value::as_str).unwrap_or(""))
    }

    pub fn text(&self, text: &str) -> usize {
        if text.len() < CACHE_FROM_BYTES {
            let ranks = self.ranks();
            let mut n = 0;
            split(text, self.pattern, |piece| n += ranks.count(piece));
            return n;
        }
        self.text_in(text, &mut PieceCache::default())
    }

    /// Counts `text`, looking short pieces up in (and adding them to) `cache`: texts of one
    /// request repeat the same pieces (keywords, indentation, punctuation) over and over,
    /// and a lookup is much cheaper than encoding them again.
    fn text_in<'a>(&self, text: &'a str, cache: &mut PieceCache<'a>) -> usize {
        let ranks = self.ranks();
        let mut n = 0;
        split(text, self.pattern, |piece| {
            n += if piece.len() > 24 {
                ranks.count(piece)
            } else {
                *cache.entry(piece).or_insert_with(|| ranks.count(piece))
            }
        });
        n
    }

    /// Tokens of one chat message (a JSON object).
    pub fn message(&self, message: &Map<String, Value>) -> usize {
        self.message_with(message, &mut |t| self.text(t))
    }

    /// Per-message counts of `messages`, sharing one piece cache across them.
    pub fn messages(&self, messages: &[Value]) -> Vec<usize> {
        let mut cache = PieceCache::default();
        let mut count = |t| self.text_in(t, &mut cache);
        messages
            .iter()
            .map(|m| {
                m.as_object()
                    .map_or(0, |m| self.message_with(m, &mut count))
            })
            .collect()
    }

    fn message_with<'a>(
        &self,
        message: &'a Map<String, Value>,
        t: &mut TextCount<'_, 'a>,
    ) -> usize {
        let mut total = PER_MESSAGE;
        for (key, value) in message {
            total += match key.as_str() {
                "content" => self.content(value, t),
                "tool_calls" => self.tool_calls(value, t),
                "function_call" => self.call(value, t),
                "name" => PER_NAME + self.json_text(value, t),
                // Routing data the model never reads.
                "tool_call_id" => 0,
                // Role and any other field (reasoning text, refusal, unknown extensions):
                // counted as text so that nothing the upstream might bill is left out.
                _ => self.json_text(value, t),
            };
        }
        total
    }

    /// Tokens of a whole request: its messages plus tool definitions plus reply priming.
    pub fn request(&self, request: &Value) -> usize {
        let messages: usize = match request.get("messages") {
            Some(Value::Array(messages)) => self.messages(messages).iter().sum(),
            _ => 0,
        };
        messages + self.request_overhead(request)
    }

    /// The part of a request's cost that compaction cannot change.
    pub fn request_overhead(&self, request: &Value) -> usize {
        let defs: usize = ["tools", "functions"]
            .iter()
            .filter_map(|k| request.get(*k))
            .map(|v| self.json_text(v, &mut |t| self.text(t)))
            .sum();
        REPLY_PRIMING + defs
    }

    fn content<'a>(&self, content: &'a Value, t: &mut TextCount<'_, 'a>) -> usize {
        match content {
            Value::Array(parts) => parts.iter().map(|p| self.part(p, t)).sum(),
            other => self.json_text(other, t),
        }
    }

    fn part<'a>(&self, part: &'a Value, t: &mut TextCount<'_, 'a>) -> usize {
        match part.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" | "input_text" | "output_text" => {
                part.get("text").map_or(0, |v| self.json_text(v, t))
            }
            "refusal" => part.get("refusal").map_or(0, |v| self.json_text(v, t)),
            "image_url" | "input_image" | "image" => image_cost(part),
            "input_audio" | "audio" => AUDIO_PART,
            "file" | "input_file" => FILE_PART,
            _ => self.json_text(part, t),
        }
    }

    fn tool_calls<'a>(&self, calls: &'a Value, t: &mut TextCount<'_, 'a>) -> usize {
        match calls {
            Value::Array(calls) => calls.iter().map(|c| self.call(c, t)).sum(),
            other => self.json_text(other, t),
        }
    }

    /// A tool call (or legacy function call): its name and argument text.
    fn call<'a>(&self, call: &'a Value, t: &mut TextCount<'_, 'a>) -> usize {
        let f = call
            .get("function")
            .or_else(|| call.get("custom"))
            .unwrap_or(call);
        let name = f.get("name").map_or(0, |v| self.json_text(v, t));
        let args = f
            .get("arguments")
            .or_else(|| f.get("input"))
            .map_or(0, |v| self.json_text(v, t));
        PER_TOOL_CALL + name + args
    }

    /// Strings are counted as their text; anything else as its JSON rendering.
    fn json_text<'a>(&self, value: &'a Value, t: &mut TextCount<'_, 'a>) -> usize {
        match value {
            Value::String(s) => t(s),
            Value::Null => 0,
            other => self.text(&other.to_string()),
        }
    }
}

/// Token counts of short pieces already encoded.
type PieceCache<'a> = HashMap<&'a [u8], usize, BuildHasherDefault<PieceHasher>>;

/// How the message walk counts a string borrowed from the message.
type TextCount<'f, 'a> = dyn FnMut(&'a str) -> usize + 'f;

fn image_cost(part: &Value) -> usize {
    let detail = part
        .get("image_url")
        .and_then(|i| i.get("detail"))
        .or_else(|| part.get("detail"))
        .and_then(Value::as_str);
    match detail {
        Some("low") => IMAGE_LOW,
        Some("high") => IMAGE_HIGH,
        _ => IMAGE_AUTO,
    }
}

/// Tokens of a request body, with the encoder chosen by its `model`. Cheap enough to run on
/// every chat request.
pub fn count_request(request: &Value) -> usize {
    Counter::for_request(request).request(request)
}

/// Per-message token counts of a request body, in order (zero for a non-object entry).
pub fn count_messages(request: &Value) -> Vec<usize> {
    match request.get("messages") {
        Some(Value::Array(messages)) => Counter::for_request(request).messages(messages),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;
    use serde_json::json;

    #[test]
    fn encoding_follows_the_model_family() {
        for m in [
            "gpt-4o",
            "gpt-4o-mini",
            "gpt-4.1",
            "gpt-5",
            "o3-mini",
            "o1",
            "llama-3",
            "",
        ] {
            assert_eq!(Encoding::for_model(m), Encoding::O200k, "{m}");
        }
        for m in [
            "gpt-4",
            "gpt-4-turbo",
            "gpt-4-0613",
            "gpt-3.5-turbo",
            "openai/gpt-4",
        ] {
            assert_eq!(Encoding::for_model(m), Encoding::Cl100k, "{m}");
        }
    }

    #[test]
    fn counts_match_tiktoken() {
        let samples = [
            "hello world",
            "  leading spaces\n\n\ttabs",
            "日本語のテキスト and emoji 🎉",
            "{\"path\": \"src/main.rs\", \"x\": [1,2,3]}",
            "It's don't I'LL 123456789 ++--== <|endoftext|>",
            "fn main() {\n    println!(\"{}\", 1);\n}\n",
        ];
        let long = samples.concat().repeat(40) + &"x".repeat(100) + "'s DON'T 1234567";
        let cut = &long[..long.len() - 300];
        for s in samples.into_iter().chain([long.as_str(), cut]) {
            assert_counts_match_tiktoken(s);
        }
    }

    fn assert_counts_match_tiktoken(s: &str) {
        let o = tiktoken_rs::o200k_base_singleton();
        let c = tiktoken_rs::cl100k_base_singleton();
        assert_eq!(
            Counter::new(Encoding::O200k).text(s),
            o.encode_ordinary(s).len()
        );
        assert_eq!(
            Counter::new(Encoding::Cl100k).text(s),
            c.encode_ordinary(s).len()
        );
    }

    #[test]
    fn counts_of_real_source_text_match_tiktoken() {
        let sources = [
            include_str!("mod.rs"),
            include_str!("summary.rs"),
            include_str!("validate.rs"),
            include_str!("../../fixtures/conversations/generate.py"),
        ];
        for s in sources {
            assert_counts_match_tiktoken(s);
        }
    }

    /// Every string in the real client bodies (prompts, code, tool output, in several
    /// languages), and each whole body as text: the texts the proxy counts in service.
    #[test]
    fn counts_of_real_transcripts_match_tiktoken() {
        fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            match v {
                Value::String(s) => out.push(s),
                Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
                Value::Object(o) => o.values().for_each(|v| strings(v, out)),
                _ => {}
            }
        }
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/transcripts/real/bodies"
        );
        let mut files = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let body = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let value: Value = serde_json::from_str(&body).unwrap();
            let mut texts = Vec::new();
            strings(&value, &mut texts);
            let counter = Counter::new(Encoding::O200k);
            let mut cache = PieceCache::default();
            for t in texts {
                assert_counts_match_tiktoken(t);
                let o = tiktoken_rs::o200k_base_singleton();
                assert_eq!(counter.text_in(t, &mut cache), o.encode_ordinary(t).len());
            }
            assert_counts_match_tiktoken(&body);
            files += 1;
        }
        assert!(files > 100, "{files} bodies");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256, ..proptest::prelude::ProptestConfig::default()
        })]
        #[test]
        fn counts_of_any_unicode_match_tiktoken(text in "[\\PC\\s]{0,300}") {
            assert_counts_match_tiktoken(&text);
        }

        #[test]
        fn counts_of_any_ascii_match_tiktoken(text in "[ -~\t\n\r]{0,300}") {
            assert_counts_match_tiktoken(&text);
        }

        /// Long runs and mixtures that make long pieces (the heap merge) and many repeats.
        #[test]
        fn counts_of_long_pieces_match_tiktoken(
            text in proptest::collection::vec(proptest::prop_oneof![
                proptest::strategy::Just("a"), proptest::strategy::Just("Zz"),
                proptest::strategy::Just("é"), proptest::strategy::Just("日本"),
                proptest::strategy::Just("+/="), proptest::strategy::Just(" "),
                proptest::strategy::Just("\n"), proptest::strategy::Just("0"),
                proptest::strategy::Just("QUJD"),
            ], 0..400).prop_map(|parts| parts.concat())
        ) {
            assert_counts_match_tiktoken(&text);
        }
    }

    #[test]
    fn message_overhead_matches_openai_recipe() {
        // OpenAI's cookbook: "hello" as a user message costs 3 + 1 (role) + 1 (content).
        let c = Counter::new(Encoding::O200k);
        let m = json!({"role": "user", "content": "hello"});
        assert_eq!(c.message(m.as_object().unwrap()), 5);
        let named = json!({"role": "user", "name": "bob", "content": "hello"});
        assert_eq!(c.message(named.as_object().unwrap()), 7);
    }

    #[test]
    fn images_cost_by_detail_not_payload() {
        let c = Counter::new(Encoding::O200k);
        let big = format!("data:image/png;base64,{}", "A".repeat(200_000));
        let low = json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": big, "detail": "low"}}]});
        let auto = json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]});
        assert_eq!(c.message(low.as_object().unwrap()), 3 + 1 + IMAGE_LOW);
        assert_eq!(c.message(auto.as_object().unwrap()), 3 + 1 + IMAGE_AUTO);
    }

    #[test]
    fn tool_calls_and_definitions_are_counted() {
        let req = json!({
            "model": "gpt-4o",
            "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
            "messages": [
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\": \"a.rs\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "fn main() {}"}
            ]
        });
        let c = Counter::for_request(&req);
        let bare = json!({"model": "gpt-4o", "messages": req["messages"].clone()});
        assert!(count_request(&req) > count_request(&bare));
        let per = count_messages(&req);
        assert_eq!(per.len(), 2);
        assert!(per[0] > 3 + 1 + PER_TOOL_CALL + c.text("read_file"));
        assert_eq!(
            count_request(&bare),
            per.iter().sum::<usize>() + REPLY_PRIMING
        );
    }
}
