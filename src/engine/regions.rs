//! Where the parts of a conversation lie that compaction treats differently: the leading
//! instructions, the task (the first user message), the history, and the turn in
//! progress, whose latest tool results are the last thing compaction gives up.

use super::message::{Message, Role};
use super::summary::has_marker;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regions {
    /// End (exclusive) of the system/developer messages the conversation starts with.
    pub instructions_end: usize,
    /// The first user message, when it comes before the turn in progress: the task the
    /// user set, kept like the instructions.
    pub task: Option<usize>,
    /// Start of the turn in progress: the latest user message (with the user messages
    /// right before it), or, when that message follows tool results no assistant text
    /// answered yet (a client that appends context after the results), the user message
    /// that started those calls.
    pub turn_start: usize,
    /// The latest assistant message that called tools, when it is in the turn in
    /// progress: its results are what the model asked for last.
    pub latest_calls: Option<usize>,
}

impl Regions {
    pub fn find(messages: &[Message]) -> Regions {
        let instructions_end = messages
            .iter()
            .position(|m| !m.role.is_instruction())
            .unwrap_or(messages.len());
        let turn_start = turn_start(messages, instructions_end);
        // A task after an earlier summary is not the conversation's first request: that
        // one is in the summary.
        let task = messages
            .iter()
            .position(|m| m.role == Role::User)
            .filter(|&t| {
                t < turn_start
                    && !messages[instructions_end..=t]
                        .iter()
                        .any(|m| has_marker(&m.text()))
            });
        let latest_calls = messages
            .iter()
            .rposition(Message::makes_calls)
            .filter(|&c| c >= turn_start);
        Regions {
            instructions_end,
            task,
            turn_start,
            latest_calls,
        }
    }
}

fn turn_start(messages: &[Message], instructions_end: usize) -> usize {
    let Some(latest) = messages.iter().rposition(|m| m.role == Role::User) else {
        // No user message at all: the latest assistant message and what answers it.
        return messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
            .unwrap_or(instructions_end)
            .max(instructions_end);
    };
    let start = run_start(messages, latest, instructions_end);
    // User text right after tool results that no assistant text answered yet belongs to
    // the turn those calls are part of.
    // (Not back to an earlier summary: that is history, whatever role carries it.)
    if start > instructions_end && messages[start - 1].role.is_result() {
        if let Some(earlier) = messages[..start].iter().rposition(|m| m.role == Role::User) {
            if !has_marker(&messages[earlier].text()) {
                return run_start(messages, earlier, instructions_end);
            }
        }
    }
    start
}

/// First user message of the run of user messages (instructions between them allowed)
/// that ends at `at`.
fn run_start(messages: &[Message], at: usize, floor: usize) -> usize {
    let mut start = at;
    let mut i = at;
    while i > floor {
        i -= 1;
        match messages[i].role {
            Role::User => start = i,
            r if r.is_instruction() => continue,
            _ => break,
        }
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use serde_json::{json, Value};

    fn call(id: &str) -> Value {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "bash", "arguments": "{}"}}]})
    }

    fn result(id: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": "out"})
    }

    fn regions(v: Value) -> Regions {
        Regions::find(&parse_test_messages(&v))
    }

    #[test]
    fn an_agent_turn_in_progress_starts_at_its_prompt() {
        let r = regions(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "next"},
            call("a"), result("a"), call("b"), result("b"),
        ]));
        assert_eq!(r.instructions_end, 1);
        assert_eq!(r.task, Some(1));
        assert_eq!(r.turn_start, 3);
        assert_eq!(r.latest_calls, Some(6));
    }

    #[test]
    fn context_appended_after_tool_results_stays_in_the_turn() {
        // OpenClaw adds a user message after the results on every request.
        let r = regions(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "prompt"},
            call("a"), result("a"),
            {"role": "user", "content": "<<<injected context>>>"},
        ]));
        assert_eq!(r.turn_start, 3);
        assert_eq!(r.latest_calls, Some(4));
    }

    #[test]
    fn the_task_inside_the_turn_is_not_counted_twice() {
        let r = regions(json!([
            {"role": "user", "content": "task"},
            {"role": "user", "content": "more"},
            call("a"), result("a"),
        ]));
        assert_eq!(r.turn_start, 0);
        assert_eq!(r.task, None);
        // A chat: the latest question alone is the turn in progress.
        let r = regions(json!([
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
        ]));
        assert_eq!((r.task, r.turn_start, r.latest_calls), (Some(0), 2, None));
    }
}
