//! The loop's decisions, as pure functions of typed state: what a request needs before its
//! first call ([`decide`]) and what a retry after a refusal aims at ([`retry_goal`]). No
//! I/O and no request state: the loop reads the numbers, these say what they mean.

use crate::classify::Kind;
use crate::config::CompactionConfig;
use crate::engine::{self, budget};
use crate::units::{Factor, Ours, Theirs, Window};

/// Share of the window left free on a retry, for the difference between our token
/// count and the upstream's that calibration has not yet learned.
const RETRY_MARGIN: f64 = 0.05;
/// Without any window to aim at, each retry aims at this share of the last prompt.
const BLIND_SHRINK: f64 = 0.6;
/// Each further retry tightens the target by this factor.
const ESCALATION: f64 = 0.8;

/// What a compaction aims at: prompt tokens by our count, the most it may keep when the
/// answer's room is cut to its minimum, and the model's window when known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Goal {
    pub target: Ours,
    pub ceiling: Ours,
    pub window: Option<Window>,
}

impl Goal {
    /// The engine's limits for this goal.
    pub fn engine_options(self) -> engine::Options {
        engine::Options {
            // With its target and ceiling given, the engine reads its window only as a
            // bound: an unknown window bounds nothing.
            context_window: self.window.map_or(usize::MAX, Window::usize),
            target_tokens: Some(self.target.usize()),
            ceiling_tokens: Some(self.ceiling.max(self.target).usize()),
            ..engine::Options::default()
        }
    }
}

/// The marks on the window that compaction steers by (shares of it, from
/// `[compaction]`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Marks {
    pub threshold: f64,
    pub low_water: f64,
    pub prepare_at: f64,
}

impl Marks {
    pub fn of(config: &CompactionConfig) -> Marks {
        Marks {
            threshold: config.threshold,
            low_water: config.low_water,
            prepare_at: config.prepare_at,
        }
    }

    /// The most prompt plus completion budget a request may carry before it is
    /// compacted.
    pub fn limit(self, window: Window) -> Theirs {
        window.share(self.threshold)
    }
}

/// The room an answer asks for: the request's completion cap, else the configured
/// reserve, and never more than a quarter of the window.
#[derive(Clone, Copy, Debug)]
pub(super) struct AnswerRoom {
    pub cap: Option<u64>,
    pub reserve: u64,
}

impl AnswerRoom {
    pub fn budget(self, window: Window) -> Theirs {
        Theirs(budget::reserve(self.cap, self.reserve, window.0))
    }

    /// The most prompt (the upstream's tokens) a request may carry when the answer's room
    /// is cut to its minimum to keep the turn in progress whole.
    pub fn ceiling(self, usable: f64, window: Window) -> f64 {
        let least = self.budget(window).0.min(budget::MIN_OUTPUT_ROOM);
        (usable - least as f64).max(0.0)
    }
}

/// What a request needs before it is sent.
#[derive(Debug, PartialEq)]
pub(super) enum Decision {
    /// Nothing: it goes as it is (resumed, or with a lowered cap).
    Send,
    /// Nothing yet, but it is past the prepare mark: the compaction the threshold will
    /// call for is made in the background.
    Prepare(Goal),
    /// Compaction, now.
    Compact(Goal),
}

/// Whether a request whose prompt is at most `bound` surely needs nothing before it is
/// sent: below the threshold and the prepare mark both. Costs no token count.
pub(super) fn surely_fits(bound: Theirs, room: AnswerRoom, window: Window, marks: Marks) -> bool {
    bound + room.budget(window) <= marks.limit(window).min(window.share(marks.prepare_at))
}

/// What a request with `prompt` (the upstream's tokens) needs before it is sent: past the
/// threshold, a compaction down to the low-water mark, so that the next turns are sent as
/// resumed, growing only at their end, until they cross the threshold again; past the
/// prepare mark, that compaction made ahead.
pub(super) fn decide(
    prompt: Theirs,
    room: AnswerRoom,
    window: Window,
    factor: Factor,
    marks: Marks,
) -> Decision {
    let budget = room.budget(window);
    let limit = marks.limit(window);
    let usable = window.0 as f64 - budget::margin(window.0) as f64;
    let low_water = window.share(marks.low_water);
    let goal = Goal {
        target: low_water.saturating_sub(budget).ours(factor),
        ceiling: Ours((room.ceiling(usable, window) / factor.0) as u64),
        window: Some(window),
    };
    if prompt + budget > limit {
        return Decision::Compact(goal);
    }
    if prompt + budget <= window.share(marks.prepare_at) {
        return Decision::Send;
    }
    // Prepared now, put in place at the threshold: the turns in between will be added
    // to it, so it aims that much lower, for the event to end at the low-water mark
    // (never below half of it).
    let growth = limit.saturating_sub(prompt + budget);
    let aim = Theirs(low_water.saturating_sub(growth).0.max(low_water.0 / 2));
    Decision::Prepare(Goal {
        target: aim.saturating_sub(budget).ours(factor),
        ..goal
    })
}

/// What the last attempt was, for a retry's goal.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refused {
    pub kind: Kind,
    /// The window: the one the refusal named, else the one known.
    pub window: Option<Window>,
    /// Our count of what was sent, when it was counted.
    pub sent: Option<Ours>,
    /// Compactions already made for this request.
    pub rewrites: u32,
}

/// The goal of the compaction after a refusal: tighter than the last attempt's by
/// [`ESCALATION`] for each rewrite made, down to the low-water mark as before the first
/// call (the next turns then go as resumed instead of overflowing one by one). A body too
/// large is about bytes, not the window: it shrinks from what was sent, whatever the
/// window. `None` when there is nothing to aim at.
pub(super) fn retry_goal(
    refused: Refused,
    room: AnswerRoom,
    factor: Factor,
    low_water: f64,
) -> Option<Goal> {
    let tightening = ESCALATION.powi(refused.rewrites as i32);
    let blind = refused
        .sent
        .map(|sent| Ours((sent.0 as f64 * BLIND_SHRINK * tightening) as u64));
    let Some(window) = refused.window else {
        let blind = blind?;
        return Some(Goal {
            target: blind,
            ceiling: blind,
            window: None,
        });
    };
    let budget = room.budget(window).0 as f64;
    let usable = window.0 as f64 * (1.0 - RETRY_MARGIN);
    let fill = usable.min(window.0 as f64 * low_water);
    let target = Ours(((fill - budget).max(0.0) / factor.0 * tightening) as u64);
    let ceiling = Ours((room.ceiling(usable, window) / factor.0 * tightening) as u64);
    let goal = Goal {
        target,
        ceiling,
        window: Some(window),
    };
    Some(match (refused.kind, blind) {
        (Kind::BodyTooLarge, Some(blind)) => Goal {
            target: target.min(blind),
            ceiling: ceiling.min(blind),
            ..goal
        },
        _ => goal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKS: Marks = Marks {
        threshold: 0.9,
        low_water: 0.6,
        prepare_at: 0.75,
    };
    const ROOM: AnswerRoom = AnswerRoom {
        cap: Some(1000),
        reserve: 4096,
    };
    const WINDOW: Window = Window(100_000);

    #[test]
    fn a_request_past_the_threshold_is_compacted_to_the_low_water_mark() {
        let decision = decide(Theirs(95_000), ROOM, WINDOW, Factor(1.0), MARKS);
        let Decision::Compact(goal) = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(goal.target, Ours(59_000));
        assert_eq!(goal.window, Some(WINDOW));
    }

    #[test]
    fn between_the_prepare_mark_and_the_threshold_the_event_is_prepared_lower() {
        let decision = decide(Theirs(80_000), ROOM, WINDOW, Factor(1.0), MARKS);
        let Decision::Prepare(goal) = decision else {
            panic!("{decision:?}")
        };
        // 9,000 tokens of growth to the threshold come on top of it.
        assert_eq!(goal.target, Ours(60_000 - 9_000 - 1_000));
        assert_eq!(
            decide(Theirs(50_000), ROOM, WINDOW, Factor(1.0), MARKS),
            Decision::Send
        );
    }

    #[test]
    fn a_retry_without_a_window_aims_below_what_was_sent_and_tightens() {
        let refused = Refused {
            kind: Kind::ContextOverflow,
            window: None,
            sent: Some(Ours(10_000)),
            rewrites: 1,
        };
        let goal = retry_goal(refused, ROOM, Factor(1.0), 0.6).unwrap();
        assert_eq!(goal.target, Ours(4_800));
        assert_eq!(goal.window, None);
        let uncounted = Refused {
            sent: None,
            ..refused
        };
        assert_eq!(retry_goal(uncounted, ROOM, Factor(1.0), 0.6), None);
    }

    #[test]
    fn a_body_too_large_shrinks_from_what_was_sent_whatever_the_window() {
        let refused = Refused {
            kind: Kind::BodyTooLarge,
            window: Some(WINDOW),
            sent: Some(Ours(20_000)),
            rewrites: 0,
        };
        let goal = retry_goal(refused, ROOM, Factor(1.0), 0.6).unwrap();
        assert_eq!(goal.target, Ours(12_000));
        assert_eq!(goal.ceiling, Ours(12_000));
    }
}
