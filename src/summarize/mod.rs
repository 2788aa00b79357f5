//! The LLM summariser, all of it: what to ask, how much, in how many calls, and whether
//! the answer is usable (pure, in this module's files), and the calls themselves with
//! their fallbacks ([`call`], the only file that does I/O or reads the clock). The
//! deterministic digest used when no LLM answers belongs to the engine
//! ([`crate::engine`]); the single flight that lets concurrent requests share one call
//! belongs to the summary cache ([`crate::checkpoint`]).
//!
//! ```text
//! let budget = summary_budget(content_tokens, window.min(summariser_window));
//! let focus = focus(client_focus, plan.tail());
//! // The summariser's window in its upstream's tokens, with the factor learned for them.
//! let room = ChunkRoom::new(summariser_window, factor);
//! // The calls: their template, the tokens of turns each may carry, and their turns; the
//! // first leaves room for a previous checkpoint longer than an answer.
//! let mut chunks = Chunks::plan(room, plan.turns(), 0, previous_tokens, budget, &counter)?;
//! let mut summary = plan.previous_summary().map(str::to_string);
//! while let Some(range) = chunks.ranges.pop_front() {
//!     let request = SummaryRequest::new(model, &plan.turns()[range], budget, counter)
//!         .prompt(chunks.prompt)
//!         .previous_summary(summary.as_deref())
//!         .focus(focus.as_deref())
//!         .date(Some(today))
//!         .input_limit(chunks.limit); // then cut further until the counted body fits the room
//!     let mut stream = AnswerStream::new();
//!     /* send `request.body()`, stream.feed(bytes) for each piece; refused as too long
//!        (once): plan again from `range.start` in `chunks.room.after_refusal(..)` */
//!     let expect = Expect { instructions: &request.instructions(), min_tokens, counter };
//!     summary = Some(check_answer(&stream.finish(), &expect)?); // never chained if junk
//! }
//! ```

mod answer;
pub mod call;
mod chunk;
mod request;
mod serialize;
mod stream;

pub use answer::{check_answer, min_tokens, AnswerProblem, Expect};
pub use call::{Call, Ledger, Middle, Summarizer};
pub use chunk::ChunkRoom;
pub use request::SummaryRequest;
pub use stream::AnswerStream;

use crate::engine::message::one_line;
use crate::engine::summary::has_marker;
use crate::engine::{Message, Role};
use crate::redact::redact;

/// The summary aims at this share, in percent, of the tokens it replaces: enough for exact
/// paths, commands and errors, small enough that compaction still frees most of the space.
pub const SUMMARY_RATIO_PERCENT: usize = 20;
/// However little is summarised, a model needs this much to write a checkpoint whose
/// sections say something (Hermes Agent's compressor asks for 2,000 at least too).
pub const SUMMARY_FLOOR: usize = 2000;
/// Below this window the floor is a tenth of it instead: a 2k-token local model has no
/// room for a 2,000-token answer.
const SMALL_WINDOW: usize = 20_000;
/// Beyond this a summary stops paying for itself: it is read on every later turn.
pub const SUMMARY_CEILING: usize = 12_000;
/// Nor may it take more than a tenth of the window it has to fit in.
pub const SUMMARY_WINDOW_DIVISOR: usize = 10;
/// A focus longer than this stops being a topic and becomes a second copy of the message.
const FOCUS_MAX_CHARS: usize = 300;
/// A latest user message shorter than this ("yes", "go on", "fix it") says little on its
/// own, so the one before it is added to the focus.
const FOCUS_SHORT_CHARS: usize = 80;

/// What a client asked its conversation's summary to concentrate on, with the
/// `x-compaction-focus` request header: taken off the request at the edge (it never
/// reaches the upstream) and carried in the request's extensions to the summariser, where
/// it replaces the topic read from the latest messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFocus(pub String);

/// The focus of a summary: the client's, else the topic of `after` (see [`focus_topic`]).
/// Flattened, capped and redacted like the topic.
pub fn focus(client: Option<&ClientFocus>, after: &[Message]) -> Option<String> {
    match client {
        Some(ClientFocus(text)) => {
            let text = one_line(text, FOCUS_MAX_CHARS);
            (!text.is_empty()).then(|| redact(&text).into_owned())
        }
        None => focus_topic(after),
    }
}

/// Token budget for a summary of `content_tokens`, for a model with a `window`-token context:
/// 20% of the content, at most min(12,000, window / 10), at least [`summary_floor`].
pub fn summary_budget(content_tokens: usize, window: usize) -> usize {
    let ceiling = SUMMARY_CEILING.min(window / SUMMARY_WINDOW_DIVISOR);
    (content_tokens / 100 * SUMMARY_RATIO_PERCENT)
        .min(ceiling)
        .max(summary_floor(window))
}

/// The least a summary is asked for in a `window`-token context: [`SUMMARY_FLOOR`], or a
/// tenth of a window smaller than [`SMALL_WINDOW`].
pub fn summary_floor(window: usize) -> usize {
    if window < SMALL_WINDOW {
        window / SUMMARY_WINDOW_DIVISOR
    } else {
        SUMMARY_FLOOR
    }
}

/// What the user is working on now, from the latest user messages of `messages` (usually the
/// plan's tail): the last one, with the one before it when the last is short. Flattened to
/// one line, capped, redacted. `None` when there is no user text.
pub fn focus_topic(messages: &[Message]) -> Option<String> {
    let mut texts = messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::User)
        .map(|m| one_line(&m.text(), FOCUS_MAX_CHARS))
        .filter(|t| !t.is_empty() && !has_marker(t));
    let last = texts.next()?;
    let focus = match texts.next() {
        Some(before) if last.len() < FOCUS_SHORT_CHARS => {
            one_line(&format!("{before} / {last}"), FOCUS_MAX_CHARS)
        }
        _ => last,
    };
    Some(redact(&focus).into_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::Counter;
    use serde_json::{json, Value};

    /// A message as the engine holds it.
    pub(crate) fn msg(v: Value) -> Message {
        let counter = Counter::for_model("gpt-4o");
        let role = crate::engine::message::role_of(0, &v).unwrap_or(Role::User);
        let tokens = v.as_object().map_or(0, |m| counter.message(m));
        Message::from_parts(role, &v, tokens)
    }

    #[test]
    fn budget_is_proportional_between_floor_and_ceiling() {
        assert_eq!(summary_budget(30_000, 128_000), 6000);
        assert_eq!(summary_budget(500, 128_000), SUMMARY_FLOOR);
        assert_eq!(summary_budget(1_000_000, 1_000_000), SUMMARY_CEILING);
        assert_eq!(summary_budget(100_000, 32_000), 3200);
        assert_eq!(summary_budget(100_000, 8000), 800);
        assert_eq!(summary_budget(0, 0), 0);
        // Issue 40's 30k session: a few thousand tokens replaced still get the floor.
        assert_eq!(summary_budget(4_000, 30_000), 2000);
        assert_eq!(summary_budget(4_000, 19_999), 1999);
        assert_eq!(summary_budget(4_000, 2048), 204);
    }

    #[test]
    fn focus_comes_from_the_latest_user_messages() {
        let long = "Please refactor the session store so that eviction uses the byte size of each entry rather than the count";
        let turns = vec![
            msg(json!({"role": "user", "content": "old topic"})),
            msg(json!({"role": "user", "content": long})),
            msg(json!({"role": "assistant", "content": "Sure."})),
            msg(json!({"role": "user", "content": [{"type": "text", "text": "  yes,\n do it "}]})),
            msg(json!({"role": "tool", "tool_call_id": "x", "content": "ignored"})),
        ];
        assert_eq!(focus_topic(&turns), Some(format!("{long} / yes, do it")));
        assert_eq!(focus_topic(&turns[..3]), Some(long.to_string()));
        assert_eq!(focus_topic(&turns[2..3]), None);
    }

    #[test]
    fn focus_skips_summaries_and_masks_secrets() {
        let summary = crate::engine::summary::wrap("## Goal\nX");
        let turns = vec![
            msg(
                json!({"role": "user", "content": "use password=hunter22 for the db migration please"}),
            ),
            msg(json!({"role": "user", "content": summary})),
        ];
        let focus = focus_topic(&turns).unwrap_or_default();
        assert_eq!(
            focus,
            "use password=[REDACTED:password] for the db migration please"
        );
        let long = "word ".repeat(200);
        let capped = focus_topic(&[msg(json!({"role": "user", "content": long}))]);
        assert!(capped.is_some_and(|f| f.len() <= FOCUS_MAX_CHARS + 3));
    }
}
