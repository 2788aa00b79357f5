//! Chat completions, the first dialect: its requests are the engine's view as they are,
//! so all this adapter does is read the steering fields without building the whole JSON
//! tree (the messages are skipped, not parsed).

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::Steering;

#[derive(Deserialize)]
struct RawChat<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    // Required, so that a body without a message list is not treated as chat.
    #[allow(dead_code)]
    messages: Vec<IgnoredAny>,
}

/// `None` when the body is not a JSON object with a `messages` array: such a body is the
/// upstream's to judge, and goes there unchanged. The completion cap is
/// `max_completion_tokens`, else the older `max_tokens`.
pub fn steering(body: &[u8]) -> Option<Steering> {
    let raw: RawChat = serde_json::from_slice(body).ok()?;
    let (max_output, max_output_field) = match (raw.max_completion_tokens, raw.max_tokens) {
        (Some(n), _) => (Some(n), Some("max_completion_tokens")),
        (None, Some(n)) => (Some(n), Some("max_tokens")),
        (None, None) => (None, None),
    };
    Some(Steering {
        model: raw.model.map(|m| m.into_owned()).unwrap_or_default(),
        stream: raw.stream.unwrap_or(false),
        max_output,
        max_output_field,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_steering_fields() {
        let head = steering(
            br#"{"model":"gpt-4o","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"x"}],"extra":{"a":[1]}}"#,
        )
        .unwrap();
        assert_eq!(head.model, "gpt-4o");
        assert!(head.stream);
        assert_eq!(head.max_output, Some(100));
        assert_eq!(head.max_output_field, Some("max_tokens"));
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let head =
            steering(br#"{"messages":[],"max_tokens":5,"max_completion_tokens":7}"#).unwrap();
        assert_eq!(head.max_output, Some(7));
        assert_eq!(head.max_output_field, Some("max_completion_tokens"));
        assert_eq!(head.model, "");
    }

    #[test]
    fn model_with_escapes_is_decoded() {
        let head = steering(br#"{"model":"a\/b","messages":[]}"#).unwrap();
        assert_eq!(head.model, "a/b");
    }

    #[test]
    fn not_a_chat_request() {
        for body in [
            &b"{not json"[..],
            b"[1]",
            b"{}",
            br#"{"messages":"x"}"#,
            b"",
        ] {
            assert_eq!(steering(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
