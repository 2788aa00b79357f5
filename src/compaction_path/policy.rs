//! The loop's decisions, as pure functions of typed state: what a request needs before its
//! first call ([`decide`]) and what a retry after a refusal aims at ([`retry_goal`]). No
//! I/O and no request state: the loop reads the numbers, these say what they mean.

use crate::classify::Kind;
use crate::compactor::Limits;
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
/// Share of an event's room (from its fill to the threshold) that an event pruning alone
/// may settle for, to keep what an earlier event pruned as it was. Reaching past that for
/// the rest rewrites every message since the earlier event: in bench/events.py's roomy
/// session (90k), events that did shared 61-79% of their bytes with the previous request,
/// those that settled 84-87%, the turns between events 91-95%. Each settling leaves the
/// next event less room: at 0.75 the fill crept up enough over three events to bring a
/// fifth event into that session's 40 turns; at 0.85 it had four, as before. With the
/// smaller stubs of pruned outputs (`engine::prune::describe_output`, arguments cut to 100
/// characters) the request creeps up more slowly, and 0.80 lets more events settle: over
/// seeds 27-34 of that session, window configured and learned, 2 runs of 16 still had an
/// event rewrite older history (none with the whole band below, see [`RESERVE`]),
/// against 7 at 0.85, and 9 at 0.85 with the larger stubs.
const SETTLE: f64 = 0.80;
/// Share of the band a settling event may stop above its fill (`1 - SETTLE` of the room)
/// that an event which cannot settle goes below it ([`Goal::deep`]). Going deep costs
/// every turn after it a share of its bytes (a smaller request repeats less of itself
/// when a turn is added), settling costs only the event. With the whole band (0.20 of
/// the room) the roomy session's requests were smaller for the rest of the session and
/// its bytes repeated a little less (seeds 27-34: 88.65% configured, against 88.73% at
/// 0.6, the same learned); 0.6 of it is 0.12 of the room, against 0.15 before.
const RESERVE: f64 = 0.6;

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
    /// Where an event that prunes alone may settle rather than rewrite what an earlier
    /// event pruned (see [`engine::Options::prune_settle`]).
    pub settle: Option<Ours>,
}

impl Goal {
    /// The engine's limits for this goal.
    pub fn engine_options(self) -> engine::Options {
        engine::Options {
            // With its target and ceiling given, the engine reads its window only as a
            // bound on the summary's share: an unknown window bounds nothing.
            context_window: self.window,
            target_tokens: Some(self.target.usize()),
            ceiling_tokens: Some(self.ceiling.max(self.target).usize()),
            // An event prunes the newest outputs first, keeping the prefix before them.
            prune_to: Some(self.deep().usize()),
            prune_settle: self.settle.map(Ours::usize),
            ..engine::Options::default()
        }
    }

    /// How deep an event pruning alone goes when it cannot settle after what an earlier
    /// event pruned (the conversation's first event, or one whose outputs since give too
    /// little): below the target by [`RESERVE`] of what a settling event may stop above
    /// it. Such
    /// an event rewrites the history it reaches into and everything after it; the events
    /// after it settle, rewriting only what came since, each leaving the request up to
    /// that much above the target and the pruned lines of its outputs behind, so that
    /// without this reserve they soon cannot settle and reach into old history again,
    /// rewriting all of it (measured in bench/events.py's roomy session: such an event
    /// shares 61-65% of its bytes with the previous request, one that settles 85-87%).
    fn deep(self) -> Ours {
        let band = self
            .settle
            .map_or(0, |settle| settle.0.saturating_sub(self.target.0));
        Ours(self.target.0.saturating_sub((band as f64 * RESERVE) as u64))
    }

    /// The compactor's limits for this goal: the engine's, and those of the relaxed
    /// target.
    pub fn limits(self) -> Limits {
        Limits {
            deep: self.engine_options(),
            relaxed: self.relaxed_options(),
        }
    }

    /// The engine's limits for the relaxed target, if there is one above the target:
    /// pruning that reaches it goes on towards the target as far as it can, so that an
    /// event paid for by pruning alone buys as many turns as one that summarises.
    fn relaxed_options(self) -> Option<engine::Options> {
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

    /// Whether a request of `now` (prompt plus completion budget) is past the threshold:
    /// it is compacted before it is sent.
    pub fn past_threshold(self, now: Theirs, window: Window) -> bool {
        now > self.limit(window)
    }

    /// Whether a request of `now`, growing by `growth` a turn, is below the prepare mark
    /// and stays below the threshold for the next [`LOOKAHEAD`] turns: nothing needs
    /// preparing for it yet.
    fn quiet(self, now: Theirs, growth: Theirs, window: Window) -> bool {
        let ahead = now + Theirs(growth.0.saturating_mul(LOOKAHEAD));
        now <= window.share(self.prepare_at) && !self.past_threshold(ahead, window)
    }

    /// Where an event that aims at `fill` may settle when it prunes alone: [`SETTLE`] of
    /// the way from the threshold down to its fill.
    pub fn settle(self, fill: Theirs, window: Window) -> Theirs {
        let limit = self.limit(window);
        let room = limit.saturating_sub(fill).0 as f64;
        limit.saturating_sub(Theirs((room * SETTLE) as u64))
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
        let least = budget::least_answer_room(
            self.cap,
            self.budget(window).0,
            budget::MIN_OUTPUT_ROOM,
            window.0,
        );
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

/// The window less the margin kept beside prompt and completion for the difference
/// between our count and the upstream's ([`budget::margin`]).
fn usable(window: Window) -> f64 {
    window.0 as f64 - budget::margin(window.0) as f64
}

/// Whether a request with `prompt` (the upstream's tokens), past the threshold, still fits
/// the window whole: its event can wait for the next turn.
pub(super) fn fits_whole(prompt: Theirs, room: AnswerRoom, window: Window) -> bool {
    (prompt + room.budget(window)).0 as f64 <= usable(window)
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
    !marks.past_threshold(now, window) && marks.quiet(now, growth, window)
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
    let usable = usable(window);
    let fill = marks.fill(now, growth, window);
    let low_water = window.share(marks.low_water);
    let settle = marks.settle(fill, window);
    let goal = Goal {
        target: fill.saturating_sub(budget).ours(factor),
        ceiling: Ours((room.ceiling(usable, window) / factor.0) as u64),
        window: Some(window),
        relaxed: Some(low_water.saturating_sub(budget).ours(factor)),
        settle: Some(settle.saturating_sub(budget).ours(factor)),
    };
    if marks.past_threshold(now, window) {
        return Decision::Compact(goal);
    }
    let preparing = marks.prepare_at < marks.threshold;
    if !preparing || marks.quiet(now, growth, window) {
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

/// Share of what was refused taken off the window's bound when the refusal names no
/// numbers, for the difference between our count and the upstream's.
const BOUND_MARGIN: f64 = 0.05;

/// The window as bounded by a refusal that named no numbers: below `refused`, the least
/// prompt plus completion cap refused so far (by our count times the factor; many upstreams
/// count both, and counting the prompt alone could set the window far too small when the
/// cap was the excess), and never above the window already `known`.
pub(super) fn blind_bound(refused: Theirs, known: Option<Window>) -> Window {
    let bound = Window((refused.0 as f64 * (1.0 - BOUND_MARGIN)) as u64);
    known.map_or(bound, |known| known.min(bound))
}

/// A refusal that named no numbers, with what the refusals before it taught.
#[derive(Clone, Copy, Debug)]
pub(super) struct Blind {
    /// Our count of the prompt that was refused.
    pub prompt: Ours,
    /// The completion cap it asked for, when the request has one.
    pub cap: Option<u64>,
    /// The window as bounded so far ([`blind_bound`]).
    pub bound: Window,
    /// Upstream calls the budget allows after the next one.
    pub left: u32,
    /// How much the conversation grows a turn (the upstream's tokens).
    pub growth: Theirs,
    /// Compactions already made for this request.
    pub rewrites: u32,
}

/// The next attempt after a [`Blind`] refusal: the completion cap to send, and the
/// compaction to make, if any.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct BlindStep {
    pub cap: Option<u64>,
    pub goal: Option<Goal>,
}

/// The floor the completion cap goes down to before the turn in progress is cut: the
/// room an answer needs, or the cap asked for when it is lower.
pub(super) fn cap_floor(cap: Option<u64>) -> u64 {
    cap.map_or(0, |cap| cap.min(budget::MIN_OUTPUT_ROOM))
}

/// Where the next attempt goes after a refusal that named no numbers. The cap goes down
/// first, a quarter at a time while the budget leaves calls to learn from, else to its
/// floor: lowering a cap the window cannot hold loses nothing, cutting the turn in
/// progress loses what the model needs. When the prompt alone leaves no room for the
/// floor under the bound, the conversation is compacted below it too, keeping the turn
/// whole within the bound. The last call the budget allows sends the least the request
/// can be (the cap at its floor, the conversation compacted as far as it goes): with no
/// numbers, only that is sure to fit wherever anything fits.
pub(super) fn blind_step(refused: Blind, reserve: u64, factor: Factor, marks: Marks) -> BlindStep {
    let floor = cap_floor(refused.cap);
    let cap = refused.cap.map(|_| floor);
    if refused.left == 0 {
        let least = Goal {
            target: Ours(0),
            ceiling: Ours(0),
            window: Some(refused.bound),
            relaxed: None,
            settle: None,
        };
        return BlindStep {
            cap,
            goal: Some(least),
        };
    }
    let room = budget::output_room(refused.bound.0, refused.prompt.theirs(factor).0);
    if let Some(asked) = refused.cap.filter(|_| room >= floor.max(1)) {
        let step = if refused.left >= 2 { asked / 4 } else { floor };
        return BlindStep {
            cap: Some(step.min(room).max(floor)),
            goal: None,
        };
    }
    let refused_as = Refused {
        kind: Kind::ContextOverflow,
        window: Some(refused.bound),
        sent: Some(refused.prompt),
        growth: refused.growth,
        rewrites: refused.rewrites,
    };
    let room = AnswerRoom {
        cap: cap.or(Some(0)),
        reserve,
    };
    BlindStep {
        cap,
        goal: retry_goal(refused_as, room, factor, marks),
    }
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
            settle: None,
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
    // The turn whose refusal taught the window is the conversation's first event: it
    // prunes as deep as one before the first call would ([`Goal::deep`]).
    let settle = marks.settle(Theirs(fill as u64), window).0 as f64;
    let settle = Ours(((settle - budget).max(0.0) / factor.0 * tightening) as u64);
    let goal = Goal {
        target,
        ceiling,
        window: Some(window),
        relaxed: refused.sent.filter(|&sent| relaxed < sent).map(|_| relaxed),
        settle: Some(settle),
    };
    Some(match (refused.kind, blind) {
        (Kind::BodyTooLarge, Some(blind)) => Goal {
            target: target.min(blind),
            ceiling: ceiling.min(blind),
            relaxed: None,
            settle: None,
            ..goal
        },
        _ => goal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const MARKS: Marks = Marks {
        threshold: 0.9,
        low_water: 0.6,
        prepare_at: 0.75,
        clear_at_least: 0.2,
    };
    const STILL: Theirs = Theirs(0);
    pub(super) const ROOM: AnswerRoom = AnswerRoom {
        cap: Some(1000),
        reserve: 4096,
    };
    const WINDOW: Window = Window(100_000);

    /// [`decide`] with the marks and answer room these tests share, and our tokens
    /// counted as the upstream's: what varies is the window, the prompt and its growth
    /// per turn.
    pub(super) fn decide_in(window: Window, prompt: u64, growth: u64) -> Decision {
        decide(
            Theirs(prompt),
            Theirs(growth),
            ROOM,
            window,
            Factor(1.0),
            MARKS,
        )
    }

    /// [`retry_goal`] with the same marks, room and factor.
    pub(super) fn retry(refused: Refused) -> Option<Goal> {
        retry_goal(refused, ROOM, Factor(1.0), MARKS)
    }

    #[test]
    fn a_request_past_the_threshold_is_compacted_to_the_low_water_mark() {
        let decision = decide_in(WINDOW, 95_000, 0);
        let Decision::Compact(goal) = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(goal.target, Ours(59_000));
        assert_eq!(goal.window, Some(WINDOW));
    }

    #[test]
    fn between_the_prepare_mark_and_the_threshold_the_event_is_prepared_lower() {
        let decision = decide_in(WINDOW, 80_000, 0);
        let Decision::Prepare(goal) = decision else {
            panic!("{decision:?}")
        };
        // 9,000 tokens of growth to the threshold come on top of it.
        assert_eq!(goal.target, Ours(60_000 - 9_000 - 1_000));
        assert_eq!(decide_in(WINDOW, 50_000, 0), Decision::Send);
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
        let goal = retry(refused).unwrap();
        assert_eq!(goal.target, Ours(4_800));
        assert_eq!(goal.window, None);
        let uncounted = Refused {
            sent: None,
            ..refused
        };
        assert_eq!(retry(uncounted), None);
    }

    #[test]
    fn in_a_small_window_an_answer_with_no_cap_asked_may_give_up_half_its_room() {
        let small = Window(4_096);
        let unasked = AnswerRoom {
            cap: None,
            reserve: 4_096,
        };
        assert_eq!(unasked.budget(small), Theirs(1_024));
        assert_eq!(unasked.ceiling(4_000.0, small), 4_000.0 - 512.0);
        // The upstream holds the prompt to a cap the request asks for.
        let asked = AnswerRoom {
            cap: Some(1_024),
            ..unasked
        };
        assert_eq!(asked.ceiling(4_000.0, small), 4_000.0 - 1_024.0);
        // A large window's answer goes down to the least room whether asked or not.
        let large = Window(128_000);
        assert_eq!(unasked.ceiling(120_000.0, large), 120_000.0 - 1_024.0);
        assert_eq!(asked.ceiling(120_000.0, large), 120_000.0 - 1_024.0);
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
        let goal = retry(refused).unwrap();
        assert_eq!(goal.target, Ours(12_000));
        assert_eq!(goal.ceiling, Ours(12_000));
    }
}

#[cfg(test)]
mod blind {
    use super::tests::MARKS;
    use super::*;
    use proptest::prelude::*;

    const RESERVE: u64 = 4096;
    const SUMMARY: u64 = 64;
    /// What the engine keeps of a turn in progress cut to the bone: the latest user
    /// message and the beginnings and ends of what follows it.
    const TURN_LEAST: u64 = 300;

    /// A conversation and an upstream that refuses, naming no numbers, whenever prompt
    /// plus completion cap (by its own count) is over its window.
    #[derive(Clone, Copy, Debug)]
    struct Case {
        window: u64,
        instructions: u64,
        history: u64,
        turn: u64,
        cap: Option<u64>,
        /// Upstream tokens per token of ours, which a blind refusal does not teach.
        factor: f64,
        max_attempts: u32,
    }

    impl Case {
        fn whole(&self) -> u64 {
            self.instructions + self.history + self.turn
        }

        fn summary(&self) -> u64 {
            self.history.min(SUMMARY)
        }

        /// The least a compaction can send: the instructions, a summary, the turn cut to
        /// the bone.
        fn least(&self) -> u64 {
            self.instructions + self.summary() + self.turn.min(TURN_LEAST)
        }

        fn fits(&self, prompt: u64, cap: Option<u64>) -> bool {
            (prompt as f64 * self.factor).ceil() as u64 + cap.unwrap_or(0) <= self.window
        }

        /// A request that fits exists: the least prompt with the cap at its floor.
        fn fittable(&self) -> bool {
            self.fits(self.least(), self.cap.map(|_| cap_floor(self.cap)))
        }

        /// The engine, as the policy relies on it: history first, then the turn in
        /// progress only when it does not fit whole within the ceiling. Every compaction
        /// starts from the client's request.
        fn compact(&self, goal: Goal) -> u64 {
            let (target, ceiling) = (goal.target.0, goal.ceiling.0.max(goal.target.0));
            if target >= self.whole() {
                return self.whole();
            }
            let turn_whole = self.instructions + self.turn + self.summary();
            if turn_whole <= ceiling {
                return target.max(turn_whole).min(self.whole());
            }
            target.max(self.least()).min(self.whole())
        }
    }

    /// What happened to one case: whether an attempt was answered, and the attempts.
    struct Run {
        answered: bool,
        /// (prompt, cap) of every attempt sent, by our count.
        sent: Vec<(u64, Option<u64>)>,
    }

    /// The loop of `recover.rs` over the case, blind: the factor stays 1.0.
    fn run(case: Case) -> Result<Run, TestCaseError> {
        let factor = Factor(1.0);
        let size = |prompt: u64, cap: Option<u64>| prompt + cap.unwrap_or(0);
        let (mut prompt, mut cap) = (case.whole(), case.cap);
        let mut least_refused: Option<u64> = None;
        let mut rewrites = 0;
        let mut sent = Vec::new();
        for call in 1..=case.max_attempts {
            // No attempt is sent that a refusal before it rules out.
            if let Some(least) = least_refused {
                prop_assert!(
                    size(prompt, cap) < least,
                    "attempt {call} ({prompt}, {cap:?}) is not below the least refused, {least}"
                );
            }
            // The turn in progress is cut only once the cap is at its floor.
            if prompt < case.instructions + case.turn + case.summary() {
                prop_assert!(
                    cap.unwrap_or(0) <= cap_floor(case.cap),
                    "attempt {call} cuts the turn with the cap at {cap:?}"
                );
            }
            sent.push((prompt, cap));
            if case.fits(prompt, cap) {
                return Ok(Run {
                    answered: true,
                    sent,
                });
            }
            if call == case.max_attempts {
                break;
            }
            let least = least_refused.map_or(size(prompt, cap), |l| l.min(size(prompt, cap)));
            least_refused = Some(least);
            let bound = blind_bound(Theirs(least), None);
            let step = blind_step(
                Blind {
                    prompt: Ours(prompt),
                    cap,
                    bound,
                    left: case.max_attempts - call - 1,
                    growth: Theirs(0),
                    rewrites,
                },
                RESERVE,
                factor,
                MARKS,
            );
            if let (Some(lower), Some(asked)) = (step.cap, cap) {
                cap = Some(lower.min(asked));
            }
            if let Some(goal) = step.goal {
                let compacted = case.compact(goal);
                if compacted < prompt {
                    rewrites += 1;
                }
                prompt = compacted;
                // `rewrite.rs`: the cap is fitted beside the new prompt within the bound.
                if let Some(asked) = cap {
                    let room = budget::output_room(bound.0, prompt);
                    if asked > room && room >= budget::MIN_USEFUL_OUTPUT {
                        cap = Some(room);
                    }
                }
            }
            // `recover.rs` gives up rather than send what is ruled out.
            if size(prompt, cap) >= least {
                break;
            }
        }
        Ok(Run {
            answered: false,
            sent,
        })
    }

    fn cases() -> impl Strategy<Value = Case> {
        (
            2_000u64..200_000,
            0.0..0.5f64,
            0.0..3.0f64,
            0.0..1.0f64,
            prop::option::weighted(0.8, 256u64..65_536),
            0.7..1.6f64,
            3u32..6,
        )
            .prop_map(
                |(window, instructions, history, turn, cap, factor, max_attempts)| Case {
                    window,
                    instructions: (window as f64 * instructions) as u64,
                    history: (window as f64 * history) as u64,
                    turn: (window as f64 * turn) as u64,
                    cap,
                    factor,
                    max_attempts,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Every case for which a fitting request exists finds it within the attempt
        /// budget, with no attempt the refusals before it rule out and the cap at its
        /// floor before the turn in progress is cut (checked inside `run`).
        #[test]
        fn a_fitting_request_is_found_within_the_budget(case in cases()) {
            let run = run(case)?;
            if case.fittable() {
                prop_assert!(run.answered, "{case:?}: {:?}", run.sent);
            }
        }
    }

    /// Pi on the Responses API, window unknown: a prompt of 3,798 with a cap of 16,384
    /// against a window of 7,583, refused without numbers. With three calls, the cap goes
    /// to its floor at once and the conversation is sent whole.
    #[test]
    fn pi_on_responses_is_answered_with_its_conversation_whole() {
        let case = Case {
            window: 7_583,
            instructions: 1_200,
            history: 0,
            turn: 2_598,
            cap: Some(16_384),
            factor: 1.0,
            max_attempts: 3,
        };
        let run = run(case).unwrap();
        assert!(run.answered);
        assert_eq!(
            run.sent,
            vec![
                (3_798, Some(16_384)),
                (3_798, Some(budget::MIN_OUTPUT_ROOM))
            ]
        );
    }

    /// With calls to spare, the cap goes down a quarter at a time: a second refusal
    /// teaches a bound close to the window, which the next requests are fitted to.
    #[test]
    fn with_calls_to_spare_the_cap_goes_down_a_quarter_at_a_time() {
        let step = blind_step(
            Blind {
                prompt: Ours(3_798),
                cap: Some(16_384),
                bound: blind_bound(Theirs(3_798 + 16_384), None),
                left: 2,
                growth: Theirs(0),
                rewrites: 0,
            },
            RESERVE,
            Factor(1.0),
            MARKS,
        );
        assert_eq!(
            step,
            BlindStep {
                cap: Some(4_096),
                goal: None
            }
        );
    }

    #[test]
    fn the_bound_is_below_what_was_refused_and_what_was_known() {
        assert_eq!(blind_bound(Theirs(10_000), None), Window(9_500));
        assert_eq!(
            blind_bound(Theirs(10_000), Some(Window(8_000))),
            Window(8_000)
        );
    }
}

#[cfg(test)]
mod growth {
    use super::tests::{decide_in, retry, MARKS, ROOM};
    use super::*;

    const WINDOW: Window = Window(30_000);

    #[test]
    fn a_fast_growing_conversation_is_prepared_the_turn_before_the_threshold() {
        // 15,000 of 30,000, growing 12,000 a turn: below the prepare mark, but the next
        // turn is past the threshold.
        let decision = decide_in(WINDOW, 15_000, 12_000);
        assert!(matches!(decision, Decision::Prepare(_)), "{decision:?}");
        let slow = decide_in(WINDOW, 15_000, 500);
        assert_eq!(slow, Decision::Send);
    }

    #[test]
    fn an_event_leaves_room_for_several_turns_of_growth() {
        let Decision::Compact(goal) = decide_in(WINDOW, 27_000, 3_000) else {
            panic!("not compacted")
        };
        // 27,000 at the threshold less four turns of 3,000, less the answer's 1,000.
        assert_eq!(goal.target, Ours(27_000 - 12_000 - 1_000));
        // Pruning alone may settle for 80% of that room; one that cannot settle after an
        // earlier event's outputs prunes below the target by 0.6 of what that settles
        // above (2,400).
        assert_eq!(goal.settle, Some(Ours(27_000 - 9_600 - 1_000)));
        let deep = goal.engine_options().prune_to;
        assert_eq!(deep, Some(27_000 - 12_000 - 1_000 - 1_440));
        // However fast it grows, the event keeps a quarter of the window.
        let Decision::Compact(goal) = decide_in(WINDOW, 27_000, 9_000) else {
            panic!("not compacted")
        };
        assert_eq!(goal.target, Ours(7_500 - 1_000));
    }

    #[test]
    fn the_refused_turn_that_teaches_the_window_prunes_as_deep_as_a_first_event() {
        let refused = Refused {
            kind: Kind::ContextOverflow,
            window: Some(WINDOW),
            sent: Some(Ours(28_000)),
            growth: Theirs(3_000),
            rewrites: 0,
        };
        let goal = retry(refused).unwrap();
        let Decision::Compact(before) = decide_in(WINDOW, 28_000, 3_000) else {
            panic!("not compacted")
        };
        assert_eq!(goal.target, before.target);
        assert_eq!(goal.settle, before.settle);
        assert_eq!(
            goal.engine_options().prune_to,
            before.engine_options().prune_to
        );
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
