//! Pass 4: where the protected head ends and the kept tail starts. Everything between is
//! replaced by the summary, and it is as little as the budget allows: the tail keeps the
//! turn in progress and as much recent history as fits, newest first, each group whole
//! where it fits, pruned where only that fits, and the last one cut to the room left, so
//! the result fills its budget instead of dropping a large message and much of the room
//! with it.

use std::collections::HashSet;

use super::message::{Message, Role};
use super::prune::Pruner;
use super::regions::Regions;
use super::summary::has_marker;
use super::tokens::Counter;
use crate::units::Limit;

/// A message is cut to the room left only when that room is worth a message.
const MIN_CUT_TOKENS: usize = 200;

/// End (exclusive) of the protected head: the leading instructions, the task (the first
/// user message) and, with `first_n` of 2 or more, the assistant's reply to it with its
/// results, unless that reply carries an earlier summary. Never reaches into the turn in
/// progress.
pub fn head_end(messages: &[Message], regions: &Regions, first_n: usize) -> usize {
    let Some(task) = regions.task else {
        return regions.instructions_end.min(regions.turn_start);
    };
    let mut end = task + 1;
    let reply = messages
        .get(end)
        .is_some_and(|m| m.role == Role::Assistant && !has_marker(&m.text()));
    if first_n >= 2 && reply {
        end += 1;
        while end < messages.len() && messages[end].role.is_result() {
            end += 1;
        }
    }
    end.min(regions.turn_start)
}

/// How much history the tail may keep.
#[derive(Clone, Copy, Debug)]
pub struct TailRoom {
    /// Tokens of history to keep beside everything else: no limit without a target.
    pub fill: Limit,
    /// How far the last group kept may run past `fill` (up to the hard target).
    pub stretch: usize,
    /// Messages of history to keep at most.
    pub messages: Limit,
}

/// Start of the kept tail, walking back from the turn in progress by groups (an assistant
/// message with its results, or one message). Instructions cost nothing here: they are
/// kept wherever they stand. Replaces messages of the tail by their pruned or cut forms
/// where that is what fits.
pub fn tail_start(
    messages: &mut [Message],
    head_end: usize,
    turn_start: usize,
    room: TailRoom,
    pruner: &Pruner,
    counter: &Counter,
) -> usize {
    let mut start = turn_start;
    let mut left = room.fill;
    let mut count_left = room.messages;
    // Results that were pruned, so no earlier copy is turned into a pointer to them.
    let mut pruned: HashSet<usize> = HashSet::new();
    while start > head_end {
        let g = align_to_group_start(messages, start - 1).max(head_end);
        // Instructions are kept wherever they stand, and counted with what is kept.
        let counted = messages[g..start]
            .iter()
            .filter(|m| !m.role.is_instruction())
            .count();
        if !count_left.admits(counted) {
            break;
        }
        count_left = count_left.less(counted);
        let cost = cost(&messages[g..start]);
        if left.admits(cost) {
            left = left.less(cost);
            start = g;
            continue;
        }
        // Only a limit is ever exceeded: from here on `left` is a number.
        let Limit::At(room_left) = left else {
            break;
        };
        let end = start;
        let prunes = pruner.all(messages, g..end, |j| j >= end && !pruned.contains(&j));
        let smaller = cost.saturating_sub(prunes.saved);
        if smaller <= room_left.saturating_add(room.stretch) {
            pruned.extend(g..end);
            prunes.apply(messages);
            start = g;
            if smaller <= room_left {
                left = Limit::At(room_left - smaller);
                continue;
            }
            break;
        }
        let text = g + 1 == end && matches!(messages[g].role, Role::User | Role::Assistant);
        if text && !messages[g].makes_calls() && room_left >= MIN_CUT_TOKENS {
            super::cut::cut_to(&mut messages[g], room_left, counter);
            start = g;
        }
        break;
    }
    start
}

fn cost(group: &[Message]) -> usize {
    group
        .iter()
        .filter(|m| !m.role.is_instruction())
        .map(|m| m.tokens)
        .sum()
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
    use crate::engine::tokens::Encoding;
    use crate::engine::Options;
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

    fn walk(m: &mut [Message], fill: usize, messages: Limit) -> usize {
        let c = Counter::new(Encoding::O200k);
        let opts = Options::default();
        let regions = Regions::find(m);
        let snapshot = m.to_vec();
        let pruner = Pruner::new(&snapshot, &opts, &c);
        let head = head_end(m, &regions, 2);
        tail_start(
            m,
            head,
            regions.turn_start,
            TailRoom {
                fill: Limit::At(fill),
                stretch: 0,
                messages,
            },
            &pruner,
            &c,
        )
    }

    #[test]
    fn head_covers_instructions_the_task_and_its_reply() {
        let m = convo(&[
            ("system", 5),
            ("developer", 5),
            ("user", 5),
            ("call", 0),
            ("tool", 5),
            ("assistant", 5),
            ("user", 5),
        ]);
        let r = Regions::find(&m);
        assert_eq!(head_end(&m, &r, 0), 3, "the task is always kept");
        assert_eq!(head_end(&m, &r, 2), 5, "the reply's results join the head");
        let only_turn = convo(&[("system", 5), ("user", 5), ("call", 0), ("tool", 5)]);
        let r = Regions::find(&only_turn);
        assert_eq!(
            head_end(&only_turn, &r, 2),
            1,
            "never into the turn in progress"
        );
    }

    #[test]
    fn the_tail_keeps_whole_groups_newest_first() {
        let mut m = convo(&[
            ("user", 10),
            ("assistant", 10),
            ("user", 100),
            ("assistant", 100),
            ("user", 100),
            ("assistant", 100),
            ("user", 10),
        ]);
        let each = m[3].tokens;
        assert_eq!(walk(&mut m, 2 * each + 5, Limit::Unbounded), 4);
        assert_eq!(
            walk(&mut m, 100_000, Limit::Unbounded),
            2,
            "never into the head"
        );
    }

    #[test]
    fn the_tail_keeps_no_more_messages_than_the_cap_leaves() {
        let mut m = convo(&[
            ("user", 10),
            ("assistant", 10),
            ("user", 10),
            ("assistant", 10),
            ("user", 10),
            ("assistant", 10),
            ("user", 10),
        ]);
        assert_eq!(walk(&mut m, 100_000, Limit::At(3)), 3);
        assert_eq!(walk(&mut m, 100_000, Limit::At(0)), 6, "none kept");
    }

    #[test]
    fn the_last_group_is_pruned_or_cut_rather_than_dropped() {
        // A large tool output at the boundary: pruned to a line, kept in the tail.
        let mut m = convo(&[
            ("user", 10),
            ("assistant", 10),
            ("user", 10),
            ("call", 0),
            ("tool", 3000),
            ("assistant", 10),
            ("user", 10),
        ]);
        assert_eq!(walk(&mut m, 400, Limit::Unbounded), 2);
        assert!(m[4].text().starts_with("[output of f"));
        // A large user message at the boundary: cut to the room left.
        let mut m = convo(&[
            ("user", 10),
            ("assistant", 10),
            ("user", 3000),
            ("assistant", 10),
            ("user", 10),
        ]);
        assert_eq!(walk(&mut m, 1000, Limit::Unbounded), 2);
        assert!(m[2].tokens <= 1000 && m[2].tokens > 500, "{}", m[2].tokens);
    }
}
