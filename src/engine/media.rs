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
        let mut msgs: Vec<Message> = input
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, m)| Message::parse(i, m, &c).unwrap())
            .collect();
        let before: usize = msgs.iter().map(|m| m.tokens).sum();
        assert_eq!(strip_old_media(&mut msgs, &c), 2);
        assert_eq!(msgs[0].content().unwrap()[0]["text"], "look");
        assert!(msgs[0].text().contains("earlier image removed"));
        assert!(msgs[2].text().contains("earlier audio clip removed"));
        assert_eq!(msgs[4].content().unwrap()[0], img);
        assert!(msgs.iter().map(|m| m.tokens).sum::<usize>() < before);
    }
}
