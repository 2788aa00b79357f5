//! Pass 4: where the protected head ends and the verbatim tail starts. Everything between
//! is replaced by the summary.

use super::merge::last_user;
use super::message::Message;

/// End (exclusive) of the protected head: leading system/developer messages, then the first
/// `first_n` other messages, extended past any results that answer a call inside the head.
/// The head stops before the latest user message: the summary must come before it, or a
/// model would take the summary for the newest request.
pub fn head_end(messages: &[Message], first_n: usize) -> usize {
    let mut end = messages
        .iter()
        .position(|m| !m.role.is_instruction())
        .unwrap_or(messages.len());
    end = (end + first_n).min(messages.len());
    while end < messages.len() && messages[end].role.is_result() {
        end += 1;
    }
    match last_user(messages) {
        Some(u) => end.min(u),
        None => end,
    }
}

/// Start of the protected tail. Walks back from the end adding whole messages while they
/// fit `budget`, letting one message run over up to 1.5x so a large recent message is not
/// the reason the tail stops short; keeps at least `min_messages`; never starts on a result
/// (the call and its results stay together); always includes the latest user message.
pub fn tail_start(
    messages: &[Message],
    head_end: usize,
    budget: usize,
    min_messages: usize,
) -> usize {
    let n = messages.len();
    if head_end >= n {
        return n;
    }
    let soft_ceiling = budget.saturating_add(budget / 2);
    let mut used = 0usize;
    let mut start = n;
    for i in (head_end..n).rev() {
        let kept = n - i - 1;
        let cost = messages[i].tokens;
        if kept >= min_messages && used.saturating_add(cost) > soft_ceiling {
            break;
        }
        if kept >= min_messages && used > budget {
            break;
        }
        used = used.saturating_add(cost);
        start = i;
    }
    start = align_to_group_start(messages, start).max(head_end);
    if let Some(u) = last_user(messages) {
        if u >= head_end {
            start = start.min(u);
        }
    }
    start
}

/// Moves a boundary that falls on a tool/function result back to the assistant message
/// that made the call.
pub fn align_to_group_start(messages: &[Message], mut idx: usize) -> usize {
    while idx > 0 && idx < messages.len() && messages[idx].role.is_result() {
        idx -= 1;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::message::Role;
    use crate::compact::tokens::{Counter, Encoding};
    use serde_json::{json, Value};

    fn convo(roles: &[(&str, usize)]) -> Vec<Message> {
        let c = Counter::new(Encoding::O200k);
        let mut call = 0;
        roles
            .iter()
            .enumerate()
            .map(|(i, (role, size))| {
                let text = "word ".repeat(*size);
                let v: Value = match *role {
                    "call" => {
                        call += 1;
                        json!({"role": "assistant", "content": null, "tool_calls": [
                            {"id": format!("c{call}"), "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]})
                    }
                    "tool" => {
                        json!({"role": "tool", "tool_call_id": format!("c{call}"), "content": text})
                    }
                    r => json!({"role": r, "content": text}),
                };
                Message::parse(i, &v, &c).unwrap()
            })
            .collect()
    }

    #[test]
    fn head_covers_instructions_and_first_turns_and_whole_groups() {
        let m = convo(&[
            ("system", 5),
            ("developer", 5),
            ("user", 5),
            ("call", 0),
            ("tool", 5),
            ("user", 5),
        ]);
        assert_eq!(head_end(&m, 0), 2);
        assert_eq!(head_end(&m, 1), 3);
        assert_eq!(head_end(&m, 2), 5, "the call's result joins the head");
        assert_eq!(
            head_end(&m, 9),
            5,
            "the latest user message is never in the head"
        );
    }

    #[test]
    fn tail_respects_budget_groups_and_latest_user() {
        let m = convo(&[
            ("system", 5),
            ("user", 100),
            ("assistant", 100),
            ("user", 100),
            ("call", 0),
            ("tool", 100),
            ("call", 0),
            ("tool", 100),
            ("assistant", 100),
        ]);
        // A small budget keeps the minimum, pulled back so the user message is included.
        let start = tail_start(&m, 1, 10, 1);
        assert_eq!(start, 3);
        assert_eq!(m[start].role, Role::User);
        // A boundary on a tool result moves to its call.
        assert_eq!(align_to_group_start(&m, 7), 6);
        // A generous budget keeps everything after the head.
        assert_eq!(tail_start(&m, 1, 100_000, 3), 1);
    }

    #[test]
    fn one_large_recent_message_may_exceed_the_budget() {
        let m = convo(&[
            ("user", 10),
            ("assistant", 10),
            ("user", 10),
            ("assistant", 10),
            ("user", 140),
        ]);
        let budget = m[4].tokens - 20;
        assert_eq!(tail_start(&m, 0, budget, 0), 4);
    }
}
