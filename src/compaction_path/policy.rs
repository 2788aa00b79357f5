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
/// Turns of growth an event leaves room for before the threshold is crossed again, so
/// that one break of the upstream's prompt cache buys several turns.
const TURNS_OF_ROOM: u64 = 4;
/// Turns ahead of the threshold a preparation starts: when the next turn may cross it.
/// Earlier would leave the turns between the preparation and the event appended raw to
/// its result (measured: two turns ahead, in a session adding a sixth of the window a
/// turn, doubled the summariser calls).
const LOOKAHEAD: u64 = 1;
/// However fast a conversation grows, an event does not aim below this share of the
/// window: what it keeps (the task, the summary, the turn in progress) needs room too.
const LEAST_FILL: f64 = 0.25;

/// What a compaction aims at: prompt tokens by our count, the most it may keep when the
/// answer's room is cut to its minimum, and the model's window when known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Goal {
    pub target: Ours,
    pub ceiling: Ours,
    pub window: Option<Window>,
    /// A higher target an event may stop at when pruning alone reaches it: a summary is
    /// paid for only when it must be, and then it goes deep (`target`).
    pub relaxed: Option<Ours>,
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
            // An event prunes the newest outputs first, keeping the prefix before them.
            prune_to: Some(self.target.usize()),
            ..engine::Options::default()
        }
    }

    /// The engine's limits for the relaxed target, if there is one above the target:
    /// pruning that reaches it goes on towards the target as far as it can, so that an
    /// event paid for by pruning alone buys as many turns as one that summarises.
    pub fn relaxed_options(self) -> Option<engine::Options> {
        let relaxed = self.relaxed.filter(|&r| r > self.target)?;
        Some(engine::Options {
            target_tokens: Some(relaxed.usize()),
            ceiling_tokens: Some(self.ceiling.max(relaxed).usize()),
            ..self.engine_options()
        })
    }
}

/// The marks on the window that compaction steers by (shares of it, from
/// `[compaction]`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Marks {
    pub threshold: f64,
    pub low_water: f64,
    pub prepare_at: f64,
    pub clear_at_least: f64,
}

impl Marks {
    pub fn of(config: &CompactionConfig) -> Marks {
        Marks {
            threshold: config.threshold,
            low_water: config.low_water,
            prepare_at: config.prepare_at,
            clear_at_least: config.clear_at_least,
        }
    }

    /// What an event brings prompt plus completion budget down to from `now`: the
    /// low-water mark, lower for a conversation that grows by `growth` a turn, so that
    /// the event leaves room for [`TURNS_OF_ROOM`] turns, and at least `clear_at_least`
    /// of the window below `now`; never below [`LEAST_FILL`].
    pub fn fill(self, now: Theirs, growth: Theirs, window: Window) -> Theirs {
        let room = Theirs(growth.0.saturating_mul(TURNS_OF_ROOM));
        let fill = window
            .share(self.low_water)
            .min(self.limit(window).saturating_sub(room))
            .min(now.saturating_sub(window.share(self.clear_at_least)));
        fill.max(window.share(LEAST_FILL.min(self.low_water)))
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

/// Whether a request whose prompt is at most `bound`, growing by at most `growth` a turn,
/// surely needs nothing before it is sent: below the threshold and the prepare mark both,
/// and not about to cross the threshold. Costs no token count.
pub(super) fn surely_fits(
    bound: Theirs,
    growth: Theirs,
    room: AnswerRoom,
    window: Window,
    marks: Marks,
) -> bool {
    let now = bound + room.budget(window);
    let ahead = now + Theirs(growth.0.saturating_mul(LOOKAHEAD));
    now <= marks.limit(window).min(window.share(marks.prepare_at)) && ahead <= marks.limit(window)
}

/// What a request with `prompt` (the upstream's tokens), growing by about `growth` a
/// turn, needs before it is sent: past the threshold, a compaction down to the event's
/// fill ([`Marks::fill`]), so that the next turns are sent as resumed, growing only at
/// their end, until they cross the threshold again; past the prepare mark, or when the
/// next [`LOOKAHEAD`] turns may cross the threshold, that compaction made ahead.
pub(super) fn decide(
    prompt: Theirs,
    growth: Theirs,
    room: AnswerRoom,
    window: Window,
    factor: Factor,
    marks: Marks,
) -> Decision {
    let budget = room.budget(window);
    let now = prompt + budget;
    let limit = marks.limit(window);
    let usable = window.0 as f64 - budget::margin(window.0) as f64;
    let fill = marks.fill(now, growth, window);
    let low_water = window.share(marks.low_water);
    let goal = Goal {
        target: fill.saturating_sub(budget).ours(factor),
        ceiling: Ours((room.ceiling(usable, window) / factor.0) as u64),
        window: Some(window),
        relaxed: Some(low_water.saturating_sub(budget).ours(factor)),
    };
    if now > limit {
        return Decision::Compact(goal);
    }
    let ahead = now + Theirs(growth.0.saturating_mul(LOOKAHEAD));
    let preparing = marks.prepare_at < marks.threshold;
    if !preparing || (now <= window.share(marks.prepare_at) && ahead <= limit) {
        return Decision::Send;
    }
    // Prepared now, put in place at the threshold: the turns in between will be added
    // to it, so a summary aims that much lower, for the event to end at its fill (never
    // below half of it). Pruning alone must reach the low-water mark with a turn of
    // growth to spare: then the event at the threshold, whose own turn is that much
    // larger, needs no summary and is made there, at once, from the turn it comes with;
    // otherwise the summary it will need is made now.
    let until = limit.saturating_sub(now);
    let aim = |fill: Theirs, ahead: Theirs| Theirs(fill.saturating_sub(ahead).0.max(fill.0 / 2));
    Decision::Prepare(Goal {
        target: aim(fill, until).saturating_sub(budget).ours(factor),
        relaxed: Some(aim(low_water, growth).saturating_sub(budget).ours(factor)),
        ..goal
    })
}

/// The completion cap of the next attempt after a refusal that named no numbers, when
/// the answer's room was the larger part of what was refused: a quarter of it (never
/// below the room an answer needs), within what the windows learned so far still allow.
/// The cap goes down before the conversation does: cutting the turn in progress loses
/// what the model needs, lowering a cap the window cannot hold anyway loses nothing.
pub(super) fn blind_cap(asked: u64, prompt: Theirs, window: Option<Window>) -> u64 {
    let step = (asked / 4).max(budget::MIN_OUTPUT_ROOM);
    let allowed = window.map_or(step, |w| budget::output_room(w.0, prompt.0));
    step.min(allowed).max(budget::MIN_OUTPUT_ROOM)
}

/// What the last attempt was, for a retry's goal.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refused {
    pub kind: Kind,
    /// The window: the one the refusal named, else the one known.
    pub window: Option<Window>,
    /// Our count of what was sent, when it was counted.
    pub sent: Option<Ours>,
    /// How much the conversation grows a turn (the upstream's tokens).
    pub growth: Theirs,
    /// Compactions already made for this request.
    pub rewrites: u32,
}

/// The goal of the compaction after a refusal: tighter than the last attempt's by
/// [`ESCALATION`] for each rewrite made, down to the event's fill as before the first call
/// (the next turns then go as resumed instead of overflowing one by one). A body too
/// large is about bytes, not the window: it shrinks from what was sent, whatever the
/// window. `None` when there is nothing to aim at.
pub(super) fn retry_goal(
    refused: Refused,
    room: AnswerRoom,
    factor: Factor,
    marks: Marks,
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
            relaxed: None,
        });
    };
    let budget = room.budget(window);
    let sent = refused
        .sent
        .map_or(window.tokens(), |sent| sent.theirs(factor));
    let fill = marks.fill(sent + budget, refused.growth, window).0 as f64;
    let budget = budget.0 as f64;
    let usable = window.0 as f64 * (1.0 - RETRY_MARGIN);
    let fill = usable.min(fill);
    let target = Ours(((fill - budget).max(0.0) / factor.0 * tightening) as u64);
    let ceiling = Ours((room.ceiling(usable, window) / factor.0 * tightening) as u64);
    // As before the first call, pruning alone may stop at the low-water mark: the turn
    // that teaches the window then does not wait for a summariser.
    let low_water = usable.min(window.share(marks.low_water).0 as f64);
    let relaxed = Ours(((low_water - budget).max(0.0) / factor.0 * tightening) as u64);
    let goal = Goal {
        target,
        ceiling,
        window: Some(window),
        relaxed: refused.sent.filter(|&sent| relaxed < sent).map(|_| relaxed),
    };
    Some(match (refused.kind, blind) {
        (Kind::BodyTooLarge, Some(blind)) => Goal {
            target: target.min(blind),
            ceiling: ceiling.min(blind),
            relaxed: None,
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
        clear_at_least: 0.2,
    };
    const STILL: Theirs = Theirs(0);
    const ROOM: AnswerRoom = AnswerRoom {
        cap: Some(1000),
        reserve: 4096,
    };
    const WINDOW: Window = Window(100_000);

    #[test]
    fn a_request_past_the_threshold_is_compacted_to_the_low_water_mark() {
        let decision = decide(Theirs(95_000), STILL, ROOM, WINDOW, Factor(1.0), MARKS);
        let Decision::Compact(goal) = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(goal.target, Ours(59_000));
        assert_eq!(goal.window, Some(WINDOW));
    }

    #[test]
    fn between_the_prepare_mark_and_the_threshold_the_event_is_prepared_lower() {
        let decision = decide(Theirs(80_000), STILL, ROOM, WINDOW, Factor(1.0), MARKS);
        let Decision::Prepare(goal) = decision else {
            panic!("{decision:?}")
        };
        // 9,000 tokens of growth to the threshold come on top of it.
        assert_eq!(goal.target, Ours(60_000 - 9_000 - 1_000));
        assert_eq!(
            decide(Theirs(50_000), STILL, ROOM, WINDOW, Factor(1.0), MARKS),
            Decision::Send
        );
    }

    #[test]
    fn a_retry_without_a_window_aims_below_what_was_sent_and_tightens() {
        let refused = Refused {
            kind: Kind::ContextOverflow,
            window: None,
            sent: Some(Ours(10_000)),
            growth: STILL,
            rewrites: 1,
        };
        let goal = retry_goal(refused, ROOM, Factor(1.0), MARKS).unwrap();
        assert_eq!(goal.target, Ours(4_800));
        assert_eq!(goal.window, None);
        let uncounted = Refused {
            sent: None,
            ..refused
        };
        assert_eq!(retry_goal(uncounted, ROOM, Factor(1.0), MARKS), None);
    }

    #[test]
    fn a_body_too_large_shrinks_from_what_was_sent_whatever_the_window() {
        let refused = Refused {
            kind: Kind::BodyTooLarge,
            window: Some(WINDOW),
            sent: Some(Ours(20_000)),
            growth: STILL,
            rewrites: 0,
        };
        let goal = retry_goal(refused, ROOM, Factor(1.0), MARKS).unwrap();
        assert_eq!(goal.target, Ours(12_000));
        assert_eq!(goal.ceiling, Ours(12_000));
    }
}

#[cfg(test)]
mod blind {
    use super::*;

    /// Pi on the Responses API, window unknown: a prompt of 3,798 with a cap of 16,384
    /// against a window of 7,583, refused without numbers. The cap goes down a quarter,
    /// then to the floor, inside the attempt budget, and every step is below what the
    /// refusals before it ruled out (each teaching the window is below 95% of what it
    /// refused).
    #[test]
    fn a_cap_refused_blind_reaches_a_fitting_answer_room_in_two_steps() {
        let prompt = Theirs(3_798);
        let window = 7_583;
        let bound = |cap: u64| Window(((prompt.0 + cap) as f64 * 0.95) as u64);
        let first = blind_cap(16_384, prompt, Some(bound(16_384)));
        assert_eq!(first, 4_096);
        assert!(prompt.0 + first > window);
        let second = blind_cap(first, prompt, Some(bound(first)));
        assert_eq!(second, budget::MIN_OUTPUT_ROOM);
        assert!(prompt.0 + second <= window);
    }

    #[test]
    fn the_cap_never_goes_below_the_room_an_answer_needs() {
        assert_eq!(blind_cap(1_500, Theirs(100), None), budget::MIN_OUTPUT_ROOM);
        assert_eq!(blind_cap(40_000, Theirs(100), None), 10_000);
        assert_eq!(blind_cap(40_000, Theirs(100), Some(Window(5_000))), 4_834);
    }
}

#[cfg(test)]
mod growth {
    use super::*;

    const MARKS: Marks = Marks {
        threshold: 0.9,
        low_water: 0.6,
        prepare_at: 0.75,
        clear_at_least: 0.2,
    };
    const ROOM: AnswerRoom = AnswerRoom {
        cap: Some(1000),
        reserve: 4096,
    };
    const WINDOW: Window = Window(30_000);

    #[test]
    fn a_fast_growing_conversation_is_prepared_the_turn_before_the_threshold() {
        // 15,000 of 30,000, growing 12,000 a turn: below the prepare mark, but the next
        // turn is past the threshold.
        let decision = decide(
            Theirs(15_000),
            Theirs(12_000),
            ROOM,
            WINDOW,
            Factor(1.0),
            MARKS,
        );
        assert!(matches!(decision, Decision::Prepare(_)), "{decision:?}");
        let slow = decide(
            Theirs(15_000),
            Theirs(500),
            ROOM,
            WINDOW,
            Factor(1.0),
            MARKS,
        );
        assert_eq!(slow, Decision::Send);
    }

    #[test]
    fn an_event_leaves_room_for_several_turns_of_growth() {
        let Decision::Compact(goal) = decide(
            Theirs(27_000),
            Theirs(3_000),
            ROOM,
            WINDOW,
            Factor(1.0),
            MARKS,
        ) else {
            panic!("not compacted")
        };
        // 27,000 at the threshold less four turns of 3,000, less the answer's 1,000.
        assert_eq!(goal.target, Ours(27_000 - 12_000 - 1_000));
        // However fast it grows, the event keeps a quarter of the window.
        let Decision::Compact(goal) = decide(
            Theirs(27_000),
            Theirs(9_000),
            ROOM,
            WINDOW,
            Factor(1.0),
            MARKS,
        ) else {
            panic!("not compacted")
        };
        assert_eq!(goal.target, Ours(7_500 - 1_000));
    }

    #[test]
    fn nothing_is_prepared_when_preparation_is_configured_off() {
        let marks = Marks {
            prepare_at: 0.9,
            ..MARKS
        };
        let decision = decide(
            Theirs(20_000),
            Theirs(9_000),
            ROOM,
            WINDOW,
            Factor(1.0),
            marks,
        );
        assert_eq!(decision, Decision::Send);
    }
}
