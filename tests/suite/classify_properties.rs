//! Fuzzing the classifier: no answer makes it panic, its verdict keeps its promises
//! (`Other` carries no numbers), a stream's verdict does not depend on how its bytes
//! arrive, and known overflows stay overflows however they are dressed (extra fields,
//! whitespace, keep-alive comments, split anywhere).
//!
//! `PROPTEST_CASES=100000 cargo test --test all suite::classify_properties::` fuzzes longer.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use compaction_proxy::classify::{classify, inspect_stream_head, next_event, Kind, StreamHead};
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::support::props;
use props::config;

/// Words error bodies are made of, so generated bodies reach the classifier's rules
/// rather than stopping at "not JSON".
const WORDS: &[&str] = &[
    "error",
    "message",
    "code",
    "type",
    "param",
    "detail",
    "context_length_exceeded",
    "maximum context length is",
    "tokens",
    "prompt is too long",
    "max_tokens",
    "n_ctx",
    "exceeds",
    "rate limit",
    "quota",
    "invalid_request_error",
    "finish_reason",
    "length",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "choices",
    "data: ",
    "event: error",
    "\n\n",
    "request_too_large",
    "128000",
    "-1",
    "1e309",
    "日本語",
];

/// A JSON value built from `WORDS`, nested a few levels.
fn json_ish() -> impl Strategy<Value = Value> {
    let word = prop::sample::select(WORDS);
    let leaf = prop_oneof![
        word.clone().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(WORDS), inner), 0..6).prop_map(|fields| {
                Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// Bodies of every sort: bytes, words strung together, JSON, server-sent events of JSON.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        prop::collection::vec(prop::sample::select(WORDS), 0..40)
            .prop_map(|w| w.concat().into_bytes()),
        json_ish().prop_map(|v| v.to_string().into_bytes()),
        prop::collection::vec(json_ish(), 1..4).prop_map(|events| {
            events
                .iter()
                .map(|v| format!("data: {v}\n\n"))
                .collect::<String>()
                .into_bytes()
        }),
    ]
}

fn content_type() -> impl Strategy<Value = Option<&'static str>> {
    prop::sample::select(vec![
        None,
        Some("application/json"),
        Some("text/event-stream; charset=utf-8"),
        Some("text/plain"),
        Some("text/html"),
        Some("application/json; charset=\u{0}"),
    ])
}

/// The places `bytes` arrive cut at, as the growing prefixes a reader sees.
fn prefixes<'a>(bytes: &'a [u8], at: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut ends: Vec<usize> = at.iter().map(|i| i.index(bytes.len() + 1)).collect();
    ends.push(bytes.len());
    ends.sort_unstable();
    ends.dedup();
    ends.into_iter().map(|end| &bytes[..end]).collect()
}

/// The verdict on a stream fed as `prefixes` of it, as the proxy feeds it: the first
/// decisive answer, or what the whole says at its end.
fn streamed(prefixes: &[&[u8]]) -> StreamHead {
    for prefix in prefixes {
        match inspect_stream_head(prefix, false) {
            StreamHead::NeedMore => {}
            decided => return decided,
        }
    }
    inspect_stream_head(prefixes.last().copied().unwrap_or_default(), true)
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn any_answer_gets_a_verdict_and_only_overflows_carry_numbers(
        status in prop_oneof![Just(200u16), Just(400), Just(413), Just(429), Just(500), 0u16..1000],
        content_type in content_type(),
        body in body(),
    ) {
        let verdict = classify(status, content_type, &body);
        prop_assert!(!verdict.reason.is_empty());
        if matches!(verdict.kind, Kind::Other | Kind::BodyTooLarge) {
            prop_assert_eq!(verdict.numbers, Default::default(), "{}", verdict.reason);
        }
    }

    #[test]
    fn a_stream_gets_the_same_verdict_however_it_arrives(
        body in body(),
        at in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let whole = streamed(&[&body]);
        prop_assert_eq!(streamed(&prefixes(&body, &at)), whole);
        if let Some((_, used)) = next_event(&body) {
            prop_assert!(0 < used && used <= body.len());
        }
    }

    /// OpenAI's overflow error keeps its verdict with fields added around it, in any
    /// layout; as a stream's first event after keep-alive comments, split anywhere, it
    /// is an overflow too.
    #[test]
    fn a_known_overflow_stays_one_however_it_is_dressed(
        extra in prop::collection::vec((prop::sample::select(&["param", "id", "request_id", "x"][..]), json_ish()), 0..4),
        pretty in any::<bool>(),
        comments in 0usize..4,
        at in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut error = json!({
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 10383 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        });
        for (key, value) in extra {
            error[key] = value;
        }
        let answer = json!({ "error": error });
        let body = match pretty {
            true => serde_json::to_string_pretty(&answer).unwrap(),
            false => answer.to_string(),
        };
        let verdict = classify(400, Some("application/json"), body.as_bytes());
        prop_assert_eq!(verdict.kind, Kind::ContextOverflow, "{}", verdict.reason);
        prop_assert_eq!(verdict.numbers.context_window, Some(8192));

        let stream = format!("{}data: {}\n\n", ": keep-alive\n\n".repeat(comments), answer);
        match streamed(&prefixes(stream.as_bytes(), &at)) {
            StreamHead::Error(c) => prop_assert_eq!(c.kind, Kind::ContextOverflow, "{}", c.reason),
            other => prop_assert!(false, "{other:?}"),
        }
    }
}
