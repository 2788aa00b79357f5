//! Splitting a middle too long for the summariser's window into chunks summarised one after
//! the other, each call updating the checkpoint the previous one wrote.

use std::ops::Range;

use crate::compact::{Counter, Message};

use super::request::{max_tokens, system_tokens};
use super::serialize;

/// Smallest input share a chunk gets, however small the window: below this a chunk holds too
/// little to be worth a call.
const MIN_INPUT: usize = 512;
/// Share of the window, in percent, left free for framing and tokenizer differences.
const MARGIN_PERCENT: usize = 5;

/// Tokens the serialised turns of one chunk may take in a summariser call with
/// `summariser_window` tokens and a summary budget of `budget_tokens`: the window minus the
/// system message, room for the previous checkpoint carried in and the answer written out
/// (each up to the answer cap), and a margin.
pub fn chunk_input_limit(
    summariser_window: usize,
    budget_tokens: usize,
    counter: &Counter,
) -> usize {
    let reserved = system_tokens(counter)
        + 2 * max_tokens(budget_tokens)
        + summariser_window / 100 * MARGIN_PERCENT;
    summariser_window.saturating_sub(reserved).max(MIN_INPUT)
}

/// Splits `turns` into consecutive ranges whose serialised form fits
/// [`chunk_input_limit`]. An assistant message that makes tool calls stays in one chunk with
/// its results. A group too large on its own gets a chunk to itself, and the request's
/// [`super::SummaryRequest::input_limit`] then cuts its messages to their head and tail.
/// No turns, no chunks.
pub fn chunk_turns(
    turns: &[Message],
    summariser_window: usize,
    budget_tokens: usize,
    counter: &Counter,
) -> Vec<Range<usize>> {
    let limit = chunk_input_limit(summariser_window, budget_tokens, counter);
    let sizes: Vec<usize> = serialize::blocks(turns)
        .iter()
        .map(|b| serialize::block_tokens(b, counter))
        .collect();
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for group in groups(turns) {
        let size: usize = sizes[group.clone()].iter().sum();
        if used > 0 && used + size > limit {
            chunks.push(start..group.start);
            start = group.start;
            used = 0;
        }
        used += size;
    }
    if start < turns.len() {
        chunks.push(start..turns.len());
    }
    chunks
}

/// Ranges that must not be split: an assistant message with calls and the results after it,
/// or a single message.
fn groups(turns: &[Message]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < turns.len() {
        let mut end = i + 1;
        if turns[i].makes_calls() {
            while end < turns.len() && turns[end].role.is_result() {
                end += 1;
            }
        }
        out.push(i..end);
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarize::tests::msg;
    use crate::summarize::SummaryRequest;
    use serde_json::json;

    fn session(rounds: usize, result_words: usize) -> Vec<Message> {
        let mut turns = Vec::new();
        for r in 0..rounds {
            turns.push(msg(
                json!({"role": "user", "content": format!("step {r}, please")}),
            ));
            turns.push(msg(
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("a{r}"), "function": {"name": "sh", "arguments": "{}"}},
                    {"id": format!("b{r}"), "function": {"name": "sh", "arguments": "{}"}},
                ]}),
            ));
            for id in ["a", "b"] {
                turns.push(msg(
                    json!({"role": "tool", "tool_call_id": format!("{id}{r}"),
                    "content": format!("line {r}\n").repeat(result_words)}),
                ));
            }
            turns.push(msg(
                json!({"role": "assistant", "content": format!("done {r}")}),
            ));
        }
        turns
    }

    fn assert_partition(chunks: &[Range<usize>], len: usize) {
        assert_eq!(chunks.first().map(|c| c.start), Some(0));
        assert_eq!(chunks.last().map(|c| c.end), Some(len));
        for w in chunks.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(chunks.iter().all(|c| !c.is_empty()));
    }

    #[test]
    fn a_middle_that_fits_is_one_chunk() {
        let turns = session(3, 10);
        let c = Counter::for_model("gpt-4o");
        assert_eq!(chunk_turns(&turns, 128_000, 2000, &c), vec![0..turns.len()]);
        assert!(chunk_turns(&[], 128_000, 2000, &c).is_empty());
    }

    #[test]
    fn long_middles_split_between_groups_and_each_chunk_fits() {
        let turns = session(40, 60);
        let c = Counter::for_model("gpt-4o");
        let (window, budget) = (8000, 1000);
        let chunks = chunk_turns(&turns, window, budget, &c);
        assert!(chunks.len() > 3, "{chunks:?}");
        assert_partition(&chunks, turns.len());
        for ch in &chunks {
            assert!(
                !turns[ch.start].role.is_result(),
                "a chunk opens with a result: {ch:?}"
            );
            let req = SummaryRequest::new("gpt-4o", &turns[ch.clone()], budget, c)
                .input_limit(chunk_input_limit(window, budget, &c));
            let body = req.body();
            let prompt = c.request(&body);
            assert!(
                prompt + 2 * req.max_tokens() <= window,
                "{prompt} in {ch:?}"
            );
        }
    }

    #[test]
    fn an_oversized_group_gets_its_own_chunk_and_is_cut_to_fit() {
        let mut turns = session(1, 10);
        turns.push(msg(
            json!({"role": "user", "content": "x ".repeat(100_000)}),
        ));
        turns.extend(session(1, 10));
        let c = Counter::for_model("gpt-4o");
        let chunks = chunk_turns(&turns, 6000, 500, &c);
        assert_partition(&chunks, turns.len());
        assert!(chunks.contains(&(5..6)), "{chunks:?}");
        let limit = chunk_input_limit(6000, 500, &c);
        let user = SummaryRequest::new("m", &turns[5..6], 500, c)
            .input_limit(limit)
            .user();
        assert!(c.text(&user) <= limit + 100, "{}", c.text(&user));
    }

    #[test]
    fn a_long_previous_checkpoint_is_paid_for_by_the_turns() {
        let turns = session(10, 60);
        let c = Counter::for_model("gpt-4o");
        let (window, budget) = (8000, 500);
        let prev = "- a fact about the earlier work\n".repeat(300);
        let limit = chunk_input_limit(window, budget, &c);
        for ch in chunk_turns(&turns, window, budget, &c) {
            let req = SummaryRequest::new("gpt-4o", &turns[ch.clone()], budget, c)
                .previous_summary(Some(&prev))
                .input_limit(limit);
            let prompt = c.request(&req.body());
            assert!(prompt + req.max_tokens() <= window, "{prompt} in {ch:?}");
        }
    }

    #[test]
    fn the_input_limit_has_a_floor() {
        let c = Counter::for_model("gpt-4o");
        assert_eq!(chunk_input_limit(1000, 1000, &c), MIN_INPUT);
        assert!(chunk_input_limit(128_000, 12_000, &c) > 90_000);
    }
}
