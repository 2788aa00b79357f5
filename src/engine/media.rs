//! Pass 2: replace images, audio and files older than the most recent user turn that
//! carries media with short text placeholders. A screenshot the model already reacted to
//! rarely matters again, while its payload can dwarf the rest of the request.

use serde_json::{json, Value};

use super::message::{is_media_part, part_type, Message, Role};
use super::tokens::Counter;

/// Strips media before `keep_from` (the latest media-bearing user message); returns how
/// many parts were replaced.
pub fn strip_old_media(messages: &mut [Message], counter: &Counter) -> usize {
    let Some(keep_from) = messages
        .iter()
        .rposition(|m| m.role == Role::User && m.has_media())
    else {
        return 0;
    };
    let mut stripped = 0;
    for msg in messages[..keep_from].iter_mut() {
        if msg.role.is_instruction() || !msg.has_media() {
            continue;
        }
        let Some(Value::Array(parts)) = msg.content() else {
            continue;
        };
        let replaced: Vec<Value> = parts
            .iter()
            .map(|p| {
                if is_media_part(p) {
                    stripped += 1;
                    placeholder(p)
                } else {
                    p.clone()
                }
            })
            .collect();
        msg.set_content(Value::Array(replaced), counter);
    }
    stripped
}

/// The media parts of a request's messages, counted where [`cap_media`] finds them: in
/// each message's content, and in the content of its parts (a tool result's images).
pub fn count_media(request: &Value) -> usize {
    let mut count = 0;
    visit_media(request, &mut |_| count += 1);
    count
}

/// Replaces the oldest media parts of a request's messages with placeholders until at
/// most `keep` remain, for an upstream that takes no more in one request; returns how
/// many were replaced. The latest are kept: they are what the turn in progress is about.
pub fn cap_media(request: &mut Value, keep: usize) -> usize {
    let mut drop = count_media(request).saturating_sub(keep);
    let dropped = drop;
    if drop > 0 {
        visit_media_mut(request, &mut |part| {
            if drop > 0 {
                *part = placeholder(part);
                drop -= 1;
            }
        });
    }
    dropped
}

/// Calls `f` on every media part of the request's messages, oldest first.
fn visit_media(request: &Value, f: &mut impl FnMut(&Value)) {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return;
    };
    for parts in messages.iter().filter_map(|m| m.get("content")?.as_array()) {
        for part in parts {
            if is_media_part(part) {
                f(part);
            } else if let Some(inner) = part.get("content").and_then(Value::as_array) {
                inner.iter().filter(|p| is_media_part(p)).for_each(&mut *f);
            }
        }
    }
}

fn visit_media_mut(request: &mut Value, f: &mut impl FnMut(&mut Value)) {
    let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    for message in messages {
        let Some(parts) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        for part in parts {
            if is_media_part(part) {
                f(part);
            } else if let Some(inner) = part.get_mut("content").and_then(Value::as_array_mut) {
                inner
                    .iter_mut()
                    .filter(|p| is_media_part(p))
                    .for_each(&mut *f);
            }
        }
    }
}

/// How every media placeholder starts and ends.
pub(super) const PLACEHOLDER_START: &str = "[earlier ";
pub(super) const PLACEHOLDER_END: &str = " removed by context compaction]";

fn placeholder(part: &Value) -> Value {
    let what = match part_type(part) {
        "input_audio" | "audio" => "audio clip",
        "file" | "input_file" => "file",
        _ => "image",
    };
    json!({"type": "text", "text": format!("{PLACEHOLDER_START}{what}{PLACEHOLDER_END}")})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::tokens::Encoding;

    #[test]
    fn keeps_only_the_latest_media_turn() {
        let c = Counter::new(Encoding::O200k);
        let img = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let input = json!([
            {"role": "user", "content": [{"type": "text", "text": "look"}, img.clone()]},
            {"role": "assistant", "content": "a cat"},
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]},
            {"role": "assistant", "content": "noise"},
            {"role": "user", "content": [img.clone()]},
            {"role": "assistant", "content": "a dog"},
            {"role": "user", "content": "and now?"},
        ]);
        let mut msgs = parse_test_messages(&input);
        let before: usize = msgs.iter().map(|m| m.tokens).sum();
        assert_eq!(strip_old_media(&mut msgs, &c), 2);
        assert_eq!(msgs[0].content().unwrap()[0]["text"], "look");
        assert!(msgs[0].text().contains("earlier image removed"));
        assert!(msgs[2].text().contains("earlier audio clip removed"));
        assert_eq!(msgs[4].content().unwrap()[0], img);
        assert!(msgs.iter().map(|m| m.tokens).sum::<usize>() < before);
    }

    #[test]
    fn the_oldest_media_go_first_down_to_the_cap() {
        let img = |n: usize| json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{n}")}});
        let mut request = json!({"messages": [
            {"role": "system", "content": "look"},
            {"role": "user", "content": [img(0), {"type": "text", "text": "first"}]},
            {"role": "user", "content": [{"type": "tool_result", "content": [img(1), img(2)]}]},
            {"role": "user", "content": [img(3)]},
        ]});
        assert_eq!(count_media(&request), 4);
        assert_eq!(cap_media(&mut request, 5), 0);
        assert_eq!(cap_media(&mut request, 2), 2);
        assert_eq!(count_media(&request), 2);
        let messages = &request["messages"];
        assert!(messages[1]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("earlier image removed")));
        assert_eq!(messages[1]["content"][1]["text"], "first");
        assert!(messages[2]["content"][0]["content"][0]["text"].is_string());
        assert_eq!(messages[2]["content"][0]["content"][1], img(2));
        assert_eq!(messages[3]["content"][0], img(3));
    }
}
