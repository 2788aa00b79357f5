//! Messages a client wraps in JSON: a user turn sent as an event (`{"type":
//! "user_message", "message": "...", "time": "..."}`, as MemGPT-style agents send every
//! turn, beside `heartbeat` and `login` events of their own), and a tool's answer as an
//! object whose strings hold the output (`{"status": "Failed", "message": "Traceback
//! ...\nKeyError: 'x'"}`). Read as sent, a person's words sit inside quotes and a
//! traceback's lines inside one escaped string; read here, they are words and lines again.

use serde_json::Value;

/// Keys under which an event carries what a person wrote.
const MESSAGE_KEYS: &[&str] = &["message", "text", "content", "prompt", "query", "input"];

/// Longest text parsed as JSON: an output past it is read as it came.
const MAX_JSON: usize = 1 << 20;

/// What a user turn sent as a JSON event holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A person's words (the event's message), and any text after the object.
    Said(String),
    /// An event the agent's runtime sent (a heartbeat, a login, an alert): its strings,
    /// read like an output, and the text after the object (a message the client sent
    /// next, joined to it), read as it is.
    Runtime { strings: String, after: String },
}

/// A user turn that is a JSON object: by its `type` (one naming the user is a person's,
/// another the runtime's), else by a key that carries a message. `None` for any other
/// text.
pub fn user_event(text: &str) -> Option<Event> {
    let (value, rest) = leading_json(text)?;
    let object = value.as_object()?;
    let kind = object.get("type").and_then(Value::as_str);
    let message = MESSAGE_KEYS
        .iter()
        .find_map(|k| object.get(*k).and_then(Value::as_str));
    let person = match kind {
        Some(kind) => kind.to_ascii_lowercase().contains("user"),
        None => message.is_some(),
    };
    match message {
        Some(words) if person => Some(Event::Said(join(words, rest))),
        _ => Some(Event::Runtime {
            strings: strings_of(&value),
            after: rest.to_owned(),
        }),
    }
}

/// The strings of an output sent as JSON, each on lines of its own with its escapes
/// undone, a short one after its key (`output_path: out/p.jsonl`), and any text after the
/// value; `None` when the output is not JSON or holds no string with a line break (its
/// lines read the same as sent).
pub fn output_strings(text: &str) -> Option<String> {
    // Most outputs hold no escaped line break: they are not parsed.
    memchr::memmem::find(text.as_bytes(), b"\\n")?;
    let (value, rest) = leading_json(text)?;
    let mut escaped_break = false;
    visit(&value, None, &mut |_, s| escaped_break |= s.contains('\n'));
    escaped_break.then(|| join(&strings_of(&value), rest))
}

/// The JSON value `text` opens with (after blanks), and what follows it.
fn leading_json(text: &str) -> Option<(Value, &str)> {
    let t = text.trim_start();
    if !t.starts_with(['{', '[']) || t.len() > MAX_JSON {
        return None;
    }
    let mut values = serde_json::Deserializer::from_str(t).into_iter::<Value>();
    let value = values.next()?.ok()?;
    let rest = &t[values.byte_offset()..];
    Some((value, rest.trim()))
}

/// Every string of `value` in order, one per line, a string under a key after it.
fn strings_of(value: &Value) -> String {
    let mut out = String::new();
    visit(value, None, &mut |key, s| {
        if !out.is_empty() {
            out.push('\n');
        }
        // A key names a short value (`status: Failed`); a long one's lines stand alone,
        // as an output prints them.
        if let Some(key) = key.filter(|_| !s.contains('\n')) {
            out.push_str(key);
            out.push_str(": ");
        }
        out.push_str(s);
    });
    out
}

fn visit<'a>(value: &'a Value, key: Option<&'a str>, f: &mut impl FnMut(Option<&'a str>, &'a str)) {
    match value {
        Value::String(s) => f(key, s),
        Value::Array(items) => items.iter().for_each(|v| visit(v, key, f)),
        Value::Object(map) => map.iter().for_each(|(k, v)| visit(v, Some(k), f)),
        _ => {}
    }
}

fn join(head: &str, rest: &str) -> String {
    if rest.is_empty() {
        head.to_owned()
    } else {
        format!("{head}\n\n{rest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_event_gives_the_persons_words_and_a_runtime_event_its_strings() {
        let said = r#"{"type": "user_message", "message": "Keep the export under 40 MB, please.", "time": "2024-05-01 10:00:00 AM"}"#;
        assert_eq!(
            user_event(said),
            Some(Event::Said("Keep the export under 40 MB, please.".into()))
        );
        let beat =
            r#"{"type": "heartbeat", "reason": "[automated] request_heartbeat=true", "time": "x"}"#;
        let joined = format!("{beat}\n\nPlease keep replies under 200 words.");
        match user_event(&joined) {
            Some(Event::Runtime { strings, after }) => {
                assert!(strings.contains("reason: [automated]"), "{strings}");
                assert_eq!(after, "Please keep replies under 200 words.");
            }
            other => panic!("{other:?}"),
        }
        // No type: a message key is a person's; text after the object stays theirs.
        let untyped = "{\"text\": \"what changed?\"}\n\nAlso, never touch vendor/.";
        assert_eq!(
            user_event(untyped),
            Some(Event::Said(
                "what changed?\n\nAlso, never touch vendor/.".into()
            ))
        );
        for text in ["plain words", "[1, 2", "{\"a\": 1", "  "] {
            assert!(!matches!(user_event(text), Some(Event::Said(_))), "{text}");
        }
    }

    #[test]
    fn an_output_sent_as_json_is_read_by_its_lines() {
        let failed = r#"{"status": "Failed", "message": "Traceback (most recent call last):\n  File \"run.py\", line 3\nKeyError: 'tenant_9'", "time": "now"}"#;
        let lines = output_strings(failed).unwrap_or_default();
        assert!(lines.contains("\nKeyError: 'tenant_9'\n"), "{lines}");
        assert!(lines.contains("status: Failed"), "{lines}");
        // One line per string already: read as sent.
        assert_eq!(output_strings(r#"{"status": "OK", "rows": 3}"#), None);
        assert_eq!(output_strings("KeyError: 'x'"), None);
    }
}
