//! Pass 1: join consecutive messages of the same role. Agents that inject steering or
//! system notes as extra user turns produce runs that some upstreams reject and that cost
//! a per-message overhead each; joining them loses nothing.

use serde_json::{json, Value};

use super::message::{Message, Role};
use super::summary::has_marker;
use super::tokens::Counter;

/// Merges in place; returns how many messages were folded into their predecessor.
pub fn merge_same_role(messages: &mut Vec<Message>, counter: &Counter) -> usize {
    let latest_user = last_user(messages);
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut merged = 0;
    for (i, msg) in std::mem::take(messages).into_iter().enumerate() {
        let protected = Some(i) == latest_user;
        match out.last_mut() {
            Some(prev) if !protected && can_merge(prev, &msg) => {
                // Where the next text starts, for the digest to read apart the messages
                // the client sent (plain text joined to plain text only).
                let next_at = match (prev.content(), msg.content()) {
                    (Some(Value::String(a)), Some(Value::String(_))) => Some(a.len() + 2),
                    _ => None,
                };
                let joined = join_content(prev.content(), msg.content());
                prev.join_next(joined, next_at, counter);
                merged += 1;
            }
            _ => out.push(msg),
        }
    }
    *messages = out;
    merged
}

/// Index of the latest user message, which every pass leaves exactly as the client sent it.
pub fn last_user(messages: &[Message]) -> Option<usize> {
    messages.iter().rposition(|m| m.role == Role::User)
}

fn can_merge(prev: &Message, next: &Message) -> bool {
    let role_ok = match (prev.role, next.role) {
        (Role::User, Role::User) => true,
        (Role::Assistant, Role::Assistant) => !prev.makes_calls() && !next.makes_calls(),
        _ => false,
    };
    // A differing name or any other field means a different speaker or payload: keep apart.
    let same_fields = prev.body.len() == next.body.len()
        && prev
            .body
            .iter()
            .all(|(k, v)| k == "content" || next.body.get(k) == Some(v));
    // Summaries stay separate messages so later compactions can find them.
    role_ok && same_fields && !has_marker(&prev.text()) && !has_marker(&next.text())
}

pub(super) fn join_content(a: Option<&Value>, b: Option<&Value>) -> Value {
    match (a, b) {
        (None | Some(Value::Null), other) | (other, None | Some(Value::Null)) => {
            other.cloned().unwrap_or(Value::Null)
        }
        (Some(Value::String(x)), Some(Value::String(y))) => Value::String(format!("{x}\n\n{y}")),
        (Some(x), Some(y)) => {
            let mut parts = as_parts(x);
            let more = as_parts(y);
            let mut rest = more.into_iter();
            if let Some(first) = rest.next() {
                match (
                    parts.last_mut().and_then(plain_text_mut),
                    plain_text(&first),
                ) {
                    (Some(t), Some(u)) => {
                        t.push_str("\n\n");
                        t.push_str(u);
                    }
                    _ => parts.push(first),
                }
            }
            parts.extend(rest);
            Value::Array(parts)
        }
    }
}

fn as_parts(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(parts) => parts.clone(),
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        other => vec![json!({"type": "text", "text": other.to_string()})],
    }
}

/// A text part with no other fields (such as cache hints) can absorb a neighbour's text.
fn plain_text(part: &Value) -> Option<&str> {
    let o = part.as_object()?;
    (o.len() == 2 && o.get("type")?.as_str()? == "text")
        .then(|| o.get("text")?.as_str())
        .flatten()
}

fn plain_text_mut(part: &mut Value) -> Option<&mut String> {
    plain_text(part)?;
    match part.get_mut("text") {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::tokens::Encoding;

    fn msgs(v: Value) -> Vec<Message> {
        parse_test_messages(&v)
    }

    fn run(v: Value) -> (Vec<Value>, usize) {
        let mut m = msgs(v);
        let n = merge_same_role(&mut m, &Counter::new(Encoding::O200k));
        (m.into_iter().map(|m| Value::Object(m.body)).collect(), n)
    }

    #[test]
    fn a_joined_message_knows_where_each_message_sent_starts_until_it_is_edited() {
        let counter = Counter::new(Encoding::O200k);
        let mut m = msgs(json!([
            {"role": "user", "content": "obs one"},
            {"role": "user", "content": "obs two"},
            {"role": "user", "content": "please stop"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "latest"},
        ]));
        merge_same_role(&mut m, &counter);
        let text = m[0].text().into_owned();
        let starts: Vec<&str> = m[0].joins_in(&text).iter().map(|&at| &text[at..]).collect();
        assert_eq!(starts, ["obs two\n\nplease stop", "please stop"]);
        // A text that no longer splits there (a pass cut it) has none.
        assert!(m[0].joins_in("obs one").is_empty());
        m[0].set_content(json!("cut"), &counter);
        assert!(m[0].joins_in("cut").is_empty() && m[0].joins().is_empty());
        // Parts joined to parts record nothing: the digest reads them whole.
        let mut parts = msgs(json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}]},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "ok"},
        ]));
        merge_same_role(&mut parts, &counter);
        assert!(parts[0].joins().is_empty());
    }

    #[test]
    fn joins_user_runs_but_not_the_latest_user_message() {
        let (out, n) = run(json!([
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
            {"role": "user", "content": "e"},
        ]));
        assert_eq!(n, 1);
        assert_eq!(out[0]["content"], "a\n\nb");
        assert_eq!(out.len(), 4);
        assert_eq!(out[3]["content"], "e");
    }

    #[test]
    fn multi_part_content_stays_multi_part() {
        let (out, _) = run(json!([
            {"role": "user", "content": [{"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "u"}}]},
            {"role": "user", "content": "b"},
            {"role": "user", "content": [{"type": "text", "text": "c"}]},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "z"},
        ]));
        assert_eq!(
            out[0]["content"],
            json!([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}},
                   {"type": "text", "text": "b\n\nc"}])
        );
    }

    #[test]
    fn keeps_tool_calls_names_and_null_content_apart_correctly() {
        let (out, n) = run(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "name": "x"},
            {"role": "assistant", "content": "b", "name": "y"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "r"},
            {"role": "assistant", "content": null, "refusal": "no"},
            {"role": "assistant", "content": "later", "refusal": "no"},
            {"role": "user", "content": "q2"},
        ]));
        assert_eq!(n, 1);
        assert_eq!(out[5]["content"], "later");
        assert_eq!(out.len(), 7);
    }
}
