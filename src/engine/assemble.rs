//! Pass 6: head + summary + tail. The summary takes the role that keeps the strict order
//! (user first, then alternating; see [`super::roles`]) with both neighbours: the user's
//! where it can, else the assistant's. When neither fits, it is folded into a neighbour's
//! text: the next message, or the previous one when the next is the latest user message,
//! which is then left exactly as the client sent it.

use serde_json::{json, Map, Value};

use super::message::{Message, Role};
use super::roles::Last;
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
pub fn assemble(
    mut head: Vec<Message>,
    summary_body: &str,
    mut tail: Vec<Message>,
    counter: &Counter,
) -> (Vec<Message>, Placement) {
    let text = wrap(summary_body);
    let prev = Last::after_all(&head);
    let next_at = tail.iter().position(|m| !m.role.is_instruction());
    let next = next_at.map(|i| tail[i].role);
    let user_fits = prev.after(Role::User).is_ok() && next != Some(Role::User);
    let assistant_fits = prev.after(Role::Assistant).is_ok() && next != Some(Role::Assistant);
    let latest_user = tail.iter().rposition(|m| m.role == Role::User);
    let placement = if user_fits || assistant_fits {
        let role = if user_fits {
            Role::User
        } else {
            Role::Assistant
        };
        let mut fields = Map::new();
        fields.insert("content".into(), Value::String(text));
        head.push(Message::new(role, fields, counter));
        Placement::Own(role)
    } else {
        // Both neighbours speak and differ from each other's role: the previous one is a
        // user or assistant message whenever `prev` is not `Start`.
        let previous = head.iter().rposition(|m| !m.role.is_instruction());
        match (next_at, previous) {
            (Some(_), Some(p)) if next_at == latest_user && prev != Last::Start => {
                add_text(&mut head[p], &text, false, counter);
                Placement::MergedIntoPrevious
            }
            (Some(n), _) => {
                add_text(&mut tail[n], &text, true, counter);
                Placement::MergedIntoNext
            }
            // Unreachable: with no next message the summary always has a role of its own.
            (None, _) => {
                let mut fields = Map::new();
                fields.insert("content".into(), Value::String(text));
                head.push(Message::new(Role::User, fields, counter));
                Placement::Own(Role::User)
            }
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
    use crate::engine::summary::MARKER;
    use crate::engine::tokens::Encoding;

    fn m(role: &str, content: &str) -> Message {
        let c = Counter::new(Encoding::O200k);
        Message::parse(0, &json!({"role": role, "content": content}), &c).unwrap()
    }

    fn roles(v: &[Message]) -> Vec<&str> {
        v.iter().map(|m| m.role.as_str()).collect()
    }

    fn place(head: Vec<Message>, tail: Vec<Message>) -> (Vec<Message>, Placement) {
        assemble(head, "body", tail, &Counter::new(Encoding::O200k))
    }

    #[test]
    fn the_summary_speaks_as_the_user_where_the_order_allows() {
        let (out, p) = place(
            vec![m("system", "s")],
            vec![m("assistant", "a"), m("user", "u")],
        );
        assert_eq!(p, Placement::Own(Role::User));
        assert_eq!(roles(&out), ["system", "user", "assistant", "user"]);
        // After the task and before another user message: the assistant's turn.
        let (out, p) = place(
            vec![m("system", "s"), m("user", "task")],
            vec![m("user", "u"), m("assistant", "a"), m("user", "v")],
        );
        assert_eq!(p, Placement::Own(Role::Assistant));
        assert_eq!(
            roles(&out),
            ["system", "user", "assistant", "user", "assistant", "user"]
        );
    }

    #[test]
    fn with_no_room_between_speakers_it_joins_a_neighbour() {
        // Nothing but instructions before the latest user message: it goes first in it,
        // and the client's text ends the message unchanged.
        let (out, p) = place(vec![m("system", "s")], vec![m("user", "latest")]);
        assert_eq!(p, Placement::MergedIntoNext);
        assert_eq!(roles(&out), ["system", "user"]);
        assert!(out[1].text().starts_with(MARKER) && out[1].text().ends_with("\n\nlatest"));
        // Task then an assistant reply: the reply carries it.
        let (out, p) = place(
            vec![m("user", "task")],
            vec![m("assistant", "a"), m("user", "u")],
        );
        assert_eq!(p, Placement::MergedIntoNext);
        assert!(out[1].text().starts_with(MARKER) && out[1].text().ends_with("\n\na"));
        // The latest user message is left alone when the previous message can take it.
        let (out, p) = place(
            vec![m("user", "task"), m("assistant", "prev")],
            vec![m("user", "u")],
        );
        assert_eq!(p, Placement::MergedIntoPrevious);
        assert_eq!(out[2].text(), "u");
        assert!(out[1].text().starts_with("prev\n\n"));
    }
}
