//! The completion cap: how much room the answer is given, and the lossless fix of
//! lowering a cap that, with the prompt, would overflow the window. A huge `max_tokens` is
//! an output-cap problem: it must not make the proxy cut the conversation to make room.
//! These read the cap and say what it should become ([`LowerCap`]); the request's owner
//! lowers it.

use super::policy::AnswerRoom;
use super::Ctx;
use crate::classify::Numbers;
use crate::engine::budget;

/// The completion cap of the request compaction starts from, and the field that holds it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cap {
    pub field: Option<&'static str>,
    pub asked: Option<u64>,
}

/// A lower completion cap for the next attempt: `cap` in `field`, in place of `asked`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct LowerCap {
    pub field: &'static str,
    pub asked: u64,
    pub cap: u64,
}

impl Cap {
    /// `cap` in place of the cap asked, when the request has one in a field.
    pub fn lower_to(self, cap: u64) -> Option<LowerCap> {
        Some(LowerCap {
            field: self.field?,
            asked: self.asked?,
            cap,
        })
    }
}

/// The room the answer asks for: the request's cap as it stands, else the configured
/// reserve.
pub(super) fn answer_room(ctx: &Ctx<'_>, cap: Option<u64>) -> AnswerRoom {
    AnswerRoom {
        cap,
        reserve: ctx.app.config.compaction.output_reserve_tokens,
    }
}

/// After an output-cap refusal: fewer completion tokens, when the upstream said enough
/// to know how many fit.
pub(super) fn after_refusal(cap: Cap, numbers: &Numbers) -> Option<LowerCap> {
    let asked = cap.asked?;
    cap.field?;
    let room = match (
        numbers.completion_limit,
        numbers.context_window,
        numbers.prompt_tokens,
    ) {
        (Some(cap), _, _) if cap < asked => cap,
        (_, Some(window), Some(prompt)) if prompt < window => budget::output_room(window, prompt),
        _ => return None,
    };
    if room < budget::MIN_USEFUL_OUTPUT || room >= asked {
        return None;
    }
    cap.lower_to(room)
}

/// The last resort for an overflow with no numbers that compaction could not shrink at
/// all: only the completion cap can make room, by an amount the upstream did not say, so
/// the cap `before` the last recovery is halved (never below what a useful answer needs,
/// and only if that lowers what is asked now).
pub(super) fn halved(cap: Cap, before: Option<u64>) -> Option<LowerCap> {
    let (asked, before) = (cap.asked?, before?);
    cap.field?;
    let half = before / 2;
    if half < budget::MIN_USEFUL_OUTPUT || half >= asked {
        return None;
    }
    cap.lower_to(half)
}
