//! How much one summariser call may carry, and splitting a middle too long for that into
//! chunks summarised one after the other, each call updating the checkpoint the previous
//! one wrote.
//!
//! The room is measured in the summariser upstream's own tokens: our estimate times the
//! factor learned from that upstream's counts (its `usage` and its refusals), with a
//! margin for what calibration has not caught up with. A 2k-token local model counted 31%
//! more tokens than our estimate; a fixed share of slack would not have covered that.

use std::collections::VecDeque;
use std::ops::Range;

use crate::engine::{Counter, Message};

use super::request::{max_tokens, system_tokens, Prompt};
use super::serialize;

/// Share of the window, in percent, kept free for the difference between the calibrated
/// estimate and the upstream's count.
const MARGIN_PERCENT: usize = 5;
/// Tokens a chat template adds around the two messages and the answer, which no count of
/// the JSON sees.
const TEMPLATE_TOKENS: usize = 32;
/// Tokens of what the user message holds besides the turns: the tags around them, the
/// date and length lines, and the focus (up to 300 characters).
const PARAMS_TOKENS: usize = 128;
/// Fewest tokens of turns worth a call: below this, most of what the model reads would
/// be the prompt.
pub(super) const MIN_INPUT: usize = 128;
/// The full template is used while it takes at most this fraction (1/N) of the prompt's
/// room; beyond that its explanations would crowd out the turns.
const FULL_PROMPT_SHARE: usize = 4;
/// A refusal as too long that names neither the window nor its count of the prompt: the
/// next call aims this share, in percent, of what was refused (prompt and answer cap).
const BLIND_RETRY_PERCENT: usize = 80;

/// The window one summariser call must fit.
#[derive(Clone, Copy, Debug)]
pub struct ChunkRoom {
    /// In the upstream's tokens.
    window: usize,
    /// Upstream tokens per token of our estimate, learned for this upstream and model.
    factor: f64,
}

impl ChunkRoom {
    pub fn new(window: usize, factor: f64) -> ChunkRoom {
        ChunkRoom {
            window,
            factor: if factor.is_finite() && factor > 0.0 {
                factor
            } else {
                1.0
            },
        }
    }

    /// The window a call must fit, in the upstream's tokens.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The most prompt tokens, by our estimate, a call may send when its answer may take
    /// `answer` tokens.
    pub fn prompt_limit(&self, answer: usize) -> usize {
        (self.usable().saturating_sub(answer) as f64 / self.factor) as usize
    }

    /// The largest answer cap, in the upstream's tokens, beside a prompt of
    /// `prompt_tokens` by our estimate: [`Self::prompt_limit`] the other way round.
    pub fn answer_limit(&self, prompt_tokens: usize) -> usize {
        let prompt = (prompt_tokens as f64 * self.factor).ceil() as usize;
        self.usable().saturating_sub(prompt)
    }

    /// The room after the upstream refused as too long a call of `sent` prompt tokens by
    /// our count and an answer cap of `cap`: in the window the refusal named, when smaller,
    /// and with the factor its count of that prompt shows, when larger (the factor learned
    /// for the model moves only part of the way; this call's own count is what the same
    /// turns will count again). A count the upstream stopped at its limit still bounds the
    /// factor from below. A refusal that names neither leaves the window below what it
    /// refused, as we counted it.
    pub fn after_refusal(&self, refusal: TooLong, sent: usize, cap: usize) -> ChunkRoom {
        let shown = refusal
            .prompt
            .filter(|_| sent > 0)
            .map(|theirs| theirs as f64 / sent as f64);
        let factor = shown.map_or(self.factor, |f| f.max(self.factor));
        let window = match refusal.window {
            Some(named) => self.window.min(named),
            None if factor > self.factor => self.window,
            None => {
                let refused = (sent as f64 * self.factor).ceil() as usize + cap;
                self.window.min(refused / 100 * BLIND_RETRY_PERCENT)
            }
        };
        ChunkRoom::new(window, factor)
    }

    /// The window less the margin and what the chat template adds.
    fn usable(&self) -> usize {
        self.window
            .saturating_sub(self.window / 100 * MARGIN_PERCENT + TEMPLATE_TOKENS)
    }

    /// The template and the tokens of turns one call may carry for a summary of
    /// `budget_tokens`: the prompt's room less the system message, the parameters, and
    /// an answer's worth for the previous checkpoint carried in. `None` when that leaves
    /// less than [`MIN_INPUT`]: the window cannot hold what the prompt itself needs.
    pub fn plan(&self, budget_tokens: usize, counter: &Counter) -> Option<(Prompt, usize)> {
        let answer = max_tokens(budget_tokens);
        let room = self.prompt_limit(answer);
        let prompt = if system_tokens(counter, Prompt::Full) * FULL_PROMPT_SHARE <= room {
            Prompt::Full
        } else {
            Prompt::Small
        };
        let reserved = system_tokens(counter, prompt) + PARAMS_TOKENS + answer;
        room.checked_sub(reserved)
            .filter(|&input| input >= MIN_INPUT)
            .map(|input| (prompt, input))
    }
}

/// What an upstream's refusal of a call as too long said, when it said it: its window and
/// its count of the prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TooLong {
    pub window: Option<usize>,
    pub prompt: Option<usize>,
}

/// The calls a middle's turns are summarised in, from some turn on: the room each must fit,
/// the template it carries, the tokens of turns it may carry, and its turns, in order.
#[derive(Debug)]
pub struct Chunks {
    pub room: ChunkRoom,
    pub prompt: Prompt,
    pub limit: usize,
    pub ranges: VecDeque<Range<usize>>,
}

impl Chunks {
    /// `turns[from..]` in chunks that fit `room` for a summary of `budget_tokens`, the first
    /// beside a carried summary of `carried` tokens (see [`first_chunk_limit`]); ranges
    /// index `turns`. `None` when no call fits the room (see [`ChunkRoom::plan`]).
    pub fn plan(
        room: ChunkRoom,
        turns: &[Message],
        from: usize,
        carried: usize,
        budget_tokens: usize,
        counter: &Counter,
    ) -> Option<Chunks> {
        let (prompt, limit) = room.plan(budget_tokens, counter)?;
        let first = first_chunk_limit(limit, carried, budget_tokens);
        let rest = turns.get(from..).unwrap_or_default();
        let ranges = chunk_turns(rest, first, limit, counter)
            .into_iter()
            .map(|r| r.start + from..r.end + from)
            .collect();
        Some(Chunks {
            room,
            prompt,
            limit,
            ranges,
        })
    }
}

/// The tokens of turns the first call may carry beside a previous checkpoint of
/// `previous` tokens: `limit` less what that checkpoint takes beyond the answer's worth
/// [`ChunkRoom::plan`] keeps for it. Later calls carry the checkpoint an earlier one wrote,
/// which its cap keeps to that worth; the first may carry a digest that stood in for a
/// summary, a fifth of what it replaced, and a chunk sized without it would have its
/// messages cut to their two ends to fit beside it, the very turns it is there to show.
pub fn first_chunk_limit(limit: usize, previous: usize, budget_tokens: usize) -> usize {
    limit.saturating_sub(previous.saturating_sub(max_tokens(budget_tokens)))
}

/// Splits `turns` into consecutive ranges whose serialised form fits `limit` tokens (see
/// [`ChunkRoom::plan`]), the first `first` (see [`first_chunk_limit`]). An assistant
/// message that makes tool calls stays in one chunk with its results. A group too large
/// on its own gets a chunk to itself, and the request's
/// [`super::SummaryRequest::input_limit`] then cuts its messages to their head and tail.
/// No turns, no chunks.
pub fn chunk_turns(
    turns: &[Message],
    first: usize,
    limit: usize,
    counter: &Counter,
) -> Vec<Range<usize>> {
    let sizes: Vec<usize> = serialize::blocks(turns)
        .iter()
        .map(|b| serialize::block_tokens(b, counter))
        .collect();
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for group in groups(turns) {
        let size: usize = sizes[group.clone()].iter().sum();
        let limit = if chunks.is_empty() { first } else { limit };
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

    /// Every chunk's request, with `previous` carried in, fits the room by our count.
    fn assert_chunks_fit(
        turns: &[Message],
        room: ChunkRoom,
        budget: usize,
        previous: Option<&str>,
    ) {
        let c = Counter::for_model("gpt-4o");
        let (prompt, limit) = room.plan(budget, &c).unwrap();
        let first = first_chunk_limit(limit, previous.map_or(0, |p| c.text(p)), budget);
        let chunks = chunk_turns(turns, first, limit, &c);
        assert_partition(&chunks, turns.len());
        let focus = "the topic ".repeat(30);
        for ch in chunks {
            assert!(
                !turns[ch.start].role.is_result(),
                "a chunk opens with a result: {ch:?}"
            );
            let req = SummaryRequest::new("gpt-4o", &turns[ch.clone()], budget, c)
                .prompt(prompt)
                .previous_summary(previous)
                .focus(Some(&focus))
                .input_limit(limit);
            let tokens = c.request(&req.body());
            assert!(
                tokens <= room.prompt_limit(req.max_tokens()),
                "{tokens} in {ch:?} of {room:?}"
            );
        }
    }

    #[test]
    fn a_middle_that_fits_is_one_chunk() {
        let turns = session(3, 10);
        let c = Counter::for_model("gpt-4o");
        let (_, limit) = ChunkRoom::new(128_000, 1.0).plan(2000, &c).unwrap();
        assert_eq!(chunk_turns(&turns, limit, limit, &c), vec![0..turns.len()]);
        assert!(chunk_turns(&[], limit, limit, &c).is_empty());
    }

    #[test]
    fn long_middles_split_between_groups_and_each_chunk_fits() {
        let turns = session(40, 60);
        let c = Counter::for_model("gpt-4o");
        let (_, limit) = ChunkRoom::new(8000, 1.0).plan(1000, &c).unwrap();
        assert!(chunk_turns(&turns, limit, limit, &c).len() > 3);
        assert_chunks_fit(&turns, ChunkRoom::new(8000, 1.0), 1000, None);
    }

    #[test]
    fn an_oversized_group_gets_its_own_chunk_and_is_cut_to_fit() {
        let mut turns = session(1, 10);
        turns.push(msg(
            json!({"role": "user", "content": "x ".repeat(100_000)}),
        ));
        turns.extend(session(1, 10));
        let c = Counter::for_model("gpt-4o");
        let (_, limit) = ChunkRoom::new(6000, 1.0).plan(500, &c).unwrap();
        let chunks = chunk_turns(&turns, limit, limit, &c);
        assert!(chunks.contains(&(5..6)), "{chunks:?}");
        assert_chunks_fit(&turns, ChunkRoom::new(6000, 1.0), 500, None);
    }

    #[test]
    fn a_long_previous_checkpoint_is_paid_for_by_the_turns_and_then_cut() {
        let turns = session(10, 60);
        let prev = "- a fact about the earlier work\n".repeat(300);
        assert_chunks_fit(&turns, ChunkRoom::new(8000, 1.0), 500, Some(&prev));
        let huge = "- a fact about the earlier work\n".repeat(3000);
        assert_chunks_fit(&turns, ChunkRoom::new(8000, 1.0), 500, Some(&huge));
    }

    /// A previous checkpoint longer than an answer's worth (a digest that stood in for a
    /// summary) takes its room from the first chunk's share of the turns, not from their
    /// text: the first request fits whole beside it, its messages uncut.
    #[test]
    fn a_long_previous_checkpoint_leaves_the_first_chunk_fewer_turns_not_cut_ones() {
        let turns = session(10, 60);
        let c = Counter::for_model("gpt-4o");
        let (room, budget) = (ChunkRoom::new(8000, 1.0), 500);
        let (prompt, limit) = room.plan(budget, &c).unwrap();
        let previous = "- a fact about the earlier work\n".repeat(300);
        let first = first_chunk_limit(limit, c.text(&previous), budget);
        assert!(first < limit);
        let over = |chunk: &Range<usize>| {
            let request = SummaryRequest::new("gpt-4o", &turns[chunk.clone()], budget, c)
                .prompt(prompt)
                .previous_summary(Some(&previous));
            c.request(&request.body()) > room.prompt_limit(request.max_tokens())
        };
        assert!(!over(&chunk_turns(&turns, first, limit, &c)[0]));
        // Sized as the later chunks are, it would have to be cut to fit.
        assert!(over(&chunk_turns(&turns, limit, limit, &c)[0]));
        // An answer's worth is kept for it already.
        assert_eq!(first_chunk_limit(limit, max_tokens(budget), budget), limit);
    }

    #[test]
    fn a_small_calibrated_window_gets_the_small_prompt_and_still_fits() {
        let c = Counter::for_model("gpt-4o");
        // A 2,048-token llama.cpp server counting 31% more tokens than we do.
        let room = ChunkRoom::new(2048, 1.31);
        let budget = crate::summarize::summary_budget(5000, 2048);
        let (prompt, limit) = room.plan(budget, &c).unwrap();
        assert_eq!(prompt, Prompt::Small);
        assert!((MIN_INPUT..1000).contains(&limit), "{limit}");
        assert_chunks_fit(&session(10, 20), room, budget, Some("## Goal\nship it"));
        // The calibrated room is smaller than the raw one.
        let raw = ChunkRoom::new(2048, 1.0).plan(budget, &c).unwrap().1;
        assert!(raw > limit, "{raw} vs {limit}");
        assert_eq!(
            ChunkRoom::new(128_000, 1.0).plan(6000, &c).map(|p| p.0),
            Some(Prompt::Full)
        );
    }

    /// A refusal as too long corrects the room by what it says: the window it names, and
    /// the factor its count of the refused prompt shows (never lowered by it); one that
    /// says neither puts the window below what was refused.
    #[test]
    fn a_refusal_as_too_long_shrinks_the_room_by_what_it_says() {
        let room = ChunkRoom::new(8000, 1.1);
        let named = TooLong {
            window: Some(6000),
            prompt: Some(6000),
        };
        let after = room.after_refusal(named, 4000, 1200);
        assert_eq!((after.window, after.factor), (6000, 1.5));
        // A count that shows no more than the factor already held leaves it.
        let low = TooLong {
            window: Some(9000),
            prompt: Some(4000),
        };
        let after = room.after_refusal(low, 4000, 1200);
        assert_eq!((after.window, after.factor), (8000, 1.1));
        // Neither number: 80% of the 4,400 + 1,200 tokens refused.
        let after = room.after_refusal(TooLong::default(), 4000, 1200);
        assert_eq!((after.window, after.factor), (4480, 1.1));
        let room_after = |refusal| room.after_refusal(refusal, 4000, 1200).prompt_limit(1200);
        assert!(room_after(named) < room.prompt_limit(1200));
    }

    #[test]
    fn chunks_planned_from_a_turn_on_cover_the_rest_and_index_the_whole() {
        let turns = session(20, 60);
        let c = Counter::for_model("gpt-4o");
        let room = ChunkRoom::new(8000, 1.0);
        let all = Chunks::plan(room, &turns, 0, 0, 1000, &c).unwrap();
        assert_partition(&Vec::from(all.ranges.clone()), turns.len());
        let from = all.ranges[1].start;
        let smaller = room.after_refusal(TooLong::default(), 6000, 1200);
        let rest = Chunks::plan(smaller, &turns, from, 0, 1000, &c).unwrap();
        assert_eq!(rest.ranges.front().map(|r| r.start), Some(from));
        assert_eq!(rest.ranges.back().map(|r| r.end), Some(turns.len()));
        assert!(rest.limit < all.limit && rest.ranges.len() > all.ranges.len() - 1);
        assert!(Chunks::plan(ChunkRoom::new(512, 1.0), &turns, 0, 0, 51, &c).is_none());
    }

    #[test]
    fn a_window_that_cannot_hold_the_prompt_gets_no_call() {
        let c = Counter::for_model("gpt-4o");
        assert_eq!(ChunkRoom::new(512, 1.0).plan(51, &c), None);
        assert_eq!(ChunkRoom::new(2048, 3.0).plan(204, &c), None);
    }
}
