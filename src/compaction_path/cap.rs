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

#[cfg(test)]
mod tests {
    use super::*;

    const ASKED: Cap = Cap {
        field: Some("max_tokens"),
        asked: Some(8_000),
    };

    #[test]
    fn an_output_cap_refusal_lowers_the_cap_to_what_it_says_fits() {
        let limit = Numbers {
            completion_limit: Some(4_096),
            ..Numbers::default()
        };
        let lower = LowerCap {
            field: "max_tokens",
            asked: 8_000,
            cap: 4_096,
        };
        assert_eq!(after_refusal(ASKED, &limit), Some(lower));
        // The window and the prompt it names leave the rest, less the margin.
        let window = Numbers {
            context_window: Some(10_000),
            prompt_tokens: Some(6_000),
            ..Numbers::default()
        };
        let room = budget::output_room(10_000, 6_000);
        assert_eq!(after_refusal(ASKED, &window).map(|l| l.cap), Some(room));
        // Nothing named, or no field to write a cap into: nothing to lower.
        assert_eq!(after_refusal(ASKED, &Numbers::default()), None);
        let no_field = Cap {
            field: None,
            ..ASKED
        };
        assert_eq!(after_refusal(no_field, &limit), None);
    }

    #[test]
    fn a_halved_cap_never_goes_below_a_useful_answer_nor_above_what_is_asked() {
        assert_eq!(halved(ASKED, Some(8_000)).map(|l| l.cap), Some(4_000));
        let useless = 2 * budget::MIN_USEFUL_OUTPUT - 2;
        assert_eq!(halved(ASKED, Some(useless)), None);
        let lower_already = Cap {
            asked: Some(3_000),
            ..ASKED
        };
        assert_eq!(halved(lower_already, Some(8_000)), None);
    }
}
