//! Pass 6: head + summary + tail. The summary gets a role that touches neither neighbour's
//! role, because several upstreams reject two user (or two assistant) messages in a row;
//! when both roles would collide it is folded into a neighbour's text instead.

use serde_json::{json, Map, Value};

use super::message::{Message, Role};
use super::summary::wrap;
use super::tokens::Counter;

/// How the summary was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Own(Role),
    MergedIntoNext,
    MergedIntoPrevious,
}

/// `head` and `tail` are consecutive parts of the conversation; the summary goes between.
/// `latest_user_in_tail` is the tail index of the latest user message, which stays verbatim.
pub fn assemble(
    mut head: Vec<Message>,
    summary_body: &str,
    mut tail: Vec<Message>,
    latest_user_in_tail: Option<usize>,
    counter: &Counter,
) -> (Vec<Message>, Placement) {
    let text = wrap(summary_body);
    let prev = head.last().map(|m| m.role);
    let next = tail.first().map(|m| m.role);
    let order = if prev == Some(Role::User) {
        [Role::Assistant, Role::User]
    } else {
        [Role::User, Role::Assistant]
    };
    let placement = match order
        .into_iter()
        .find(|r| Some(*r) != prev && Some(*r) != next)
    {
        Some(role) => {
            let mut fields = Map::new();
            fields.insert("content".into(), Value::String(text));
            head.push(Message::new(role, fields, counter));
            Placement::Own(role)
        }
        // Both neighbours are user/assistant and differ: fold into one of them, never into
        // the latest user message.
        None if latest_user_in_tail != Some(0) => {
            if let Some(first) = tail.first_mut() {
                add_text(first, &text, true, counter);
            }
            Placement::MergedIntoNext
        }
        None => {
            if let Some(last) = head.last_mut() {
                add_text(last, &text, false, counter);
            }
            Placement::MergedIntoPrevious
        }
    };
    head.append(&mut tail);
    (head, placement)
}

fn add_text(msg: &mut Message, text: &str, before: bool, counter: &Counter) {
    let content = match msg.content() {
        Some(Value::String(s)) if s.is_empty() => Value::String(text.to_string()),
        Some(Value::String(s)) if before => Value::String(format!("{text}\n\n{s}")),
        Some(Value::String(s)) => Value::String(format!("{s}\n\n{text}")),
        Some(Value::Array(parts)) => {
            let mut parts = parts.clone();
            let part = json!({"type": "text", "text": text});
            if before {
                parts.insert(0, part);
            } else {
                parts.push(part);
            }
            Value::Array(parts)
        }
        _ => Value::String(text.to_string()),
    };
    msg.set_content(content, counter);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::summary::MARKER;
    use crate::compact::tokens::Encoding;

    fn m(role: &str, content: &str) -> Message {
        let c = Counter::new(Encoding::O200k);
        Message::parse(0, &json!({"role": role, "content": content}), &c).unwrap()
    }

    fn roles(v: &[Message]) -> Vec<&str> {
        v.iter().map(|m| m.role.as_str()).collect()
    }

    #[test]
    fn picks_a_role_that_touches_neither_neighbour() {
        let c = Counter::new(Encoding::O200k);
        let (out, p) = assemble(
            vec![m("system", "s")],
            "body",
            vec![m("assistant", "a"), m("user", "u")],
            Some(1),
            &c,
        );
        assert_eq!(p, Placement::Own(Role::User));
        assert_eq!(roles(&out), ["system", "user", "assistant", "user"]);
        let (out, p) = assemble(
            vec![m("system", "s")],
            "body",
            vec![m("user", "u")],
            Some(0),
            &c,
        );
        assert_eq!(p, Placement::Own(Role::Assistant));
        assert_eq!(roles(&out), ["system", "assistant", "user"]);
    }

    #[test]
    fn folds_into_a_neighbour_when_both_roles_collide() {
        let c = Counter::new(Encoding::O200k);
        let (out, p) = assemble(
            vec![m("user", "first")],
            "body",
            vec![m("assistant", "a"), m("user", "u")],
            Some(1),
            &c,
        );
        assert_eq!(p, Placement::MergedIntoNext);
        assert_eq!(roles(&out), ["user", "assistant", "user"]);
        assert!(out[1].text().starts_with(MARKER) && out[1].text().ends_with("\n\na"));
        // The latest user message is never the one that absorbs the summary.
        let (out, p) = assemble(
            vec![m("assistant", "prev")],
            "body",
            vec![m("user", "u")],
            Some(0),
            &c,
        );
        assert_eq!(p, Placement::MergedIntoPrevious);
        assert_eq!(out[1].text(), "u");
        assert!(out[0].text().starts_with("prev\n\n"));
    }
}
