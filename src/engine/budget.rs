//! The answer's share of the window, decided in one place for the proxy and the offline
//! command: how much room a compaction leaves for the completion, and the lossless fix
//! when only the requested output does not fit (ask for fewer completion tokens).

use serde_json::Value;

/// The request fields that cap the completion, newest first.
pub const OUTPUT_FIELDS: [&str; 2] = ["max_completion_tokens", "max_tokens"];

/// A completion cap below this is not worth sending: the answer would be cut short of
/// anything useful, and the conversation has to shrink instead.
pub const MIN_USEFUL_OUTPUT: u64 = 256;

/// The answer room the turn in progress may leave, at least, before its own messages are
/// cut instead (the engine's default `min_output_tokens`, the proxy's ceiling).
pub const MIN_OUTPUT_ROOM: u64 = 1024;

/// The completion cap the request asks for, if any.
pub fn asked(request: &Value) -> Option<u64> {
    OUTPUT_FIELDS
        .iter()
        .find_map(|k| request.get(*k).and_then(Value::as_u64))
}

/// Completion tokens to keep room for: what the request asks, else `default`, and never
/// more than a quarter of the window. An oversized cap is lowered rather than paid for
/// with conversation.
pub fn reserve(asked: Option<u64>, default: u64, window: u64) -> u64 {
    asked.unwrap_or(default).min(window / 4)
}

/// The least room the answer is left when the turn in progress cannot be kept whole
/// otherwise: its `reserve` ([`reserve`]), lowered to `least` (by default
/// [`MIN_OUTPUT_ROOM`]). A cap the request asks for is the client's word on the answer's
/// size and keeps that floor (lowered to it, the cap is rewritten to match). With none
/// asked the reserve is only our guess and the upstream gives the answer whatever the
/// prompt leaves, so a small window's may go down to an eighth of the window, half of
/// its quarter, as a large one's goes from 4,096 down to `least`: at 256 tokens, 32 of the
/// 64 reserved, the room of a decision the summary would otherwise give up.
pub fn least_answer_room(asked: Option<u64>, reserve: u64, least: u64, window: u64) -> u64 {
    let least = reserve.min(least);
    match asked {
        Some(_) => least,
        None => least.min(window / 8),
    }
}

/// Tokens left free beside prompt and completion, for the difference between our count
/// and the upstream's framing.
pub fn margin(window: u64) -> u64 {
    window / 100 + 16
}

/// Whether prompt plus the completion cap `asked` (if any) fits the window.
pub fn cap_fits(window: u64, prompt: u64, asked: Option<u64>) -> bool {
    asked.is_none_or(|asked| asked <= output_room(window, prompt))
}

/// The largest completion cap that fits beside `prompt` tokens in `window`.
pub fn output_room(window: u64, prompt: u64) -> u64 {
    window.saturating_sub(prompt).saturating_sub(margin(window))
}

/// Lowers the request's completion cap(s) when prompt plus cap would not fit the window,
/// and the room left is still worth an answer. Returns the cap before and after.
pub fn fit_output(request: &mut Value, window: u64, prompt: u64) -> Option<(u64, u64)> {
    let asked = asked(request)?;
    let room = output_room(window, prompt);
    if cap_fits(window, prompt, Some(asked)) || room < MIN_USEFUL_OUTPUT {
        return None;
    }
    let obj = request.as_object_mut()?;
    for field in OUTPUT_FIELDS {
        if obj
            .get(field)
            .and_then(Value::as_u64)
            .is_some_and(|n| n > room)
        {
            obj.insert(field.into(), Value::from(room));
        }
    }
    Some((asked, room))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_reserve_is_capped_at_a_quarter_of_the_window() {
        assert_eq!(reserve(Some(32_000), 4096, 28_000), 7_000);
        assert_eq!(reserve(Some(500), 4096, 28_000), 500);
        assert_eq!(reserve(None, 4096, 10_000), 2_500);
    }

    #[test]
    fn an_answer_with_no_cap_asked_may_give_up_half_its_room_in_a_small_window() {
        // Large windows: down to the least room, as before.
        assert_eq!(least_answer_room(None, 4096, 1024, 128_000), 1024);
        assert_eq!(least_answer_room(None, 2048, 1024, 8192), 1024);
        // A reserve set below the least stays whole.
        assert_eq!(least_answer_room(None, 1000, 1024, 128_000), 1000);
        // Small windows: an eighth of the window.
        assert_eq!(least_answer_room(None, 1024, 1024, 4096), 512);
        assert_eq!(least_answer_room(None, 64, 1024, 256), 32);
        // A cap the request asks for is what the upstream holds the prompt to.
        assert_eq!(least_answer_room(Some(64), 64, 1024, 256), 64);
        assert_eq!(least_answer_room(Some(4096), 4096, 1024, 128_000), 1024);
    }

    #[test]
    fn an_output_cap_that_does_not_fit_is_lowered_to_what_does() {
        let mut r = json!({"max_tokens": 32_000, "max_completion_tokens": 32_000, "messages": []});
        assert_eq!(fit_output(&mut r, 28_000, 21_000), Some((32_000, 6_704)));
        assert_eq!(r["max_tokens"], 6_704);
        assert_eq!(r["max_completion_tokens"], 6_704);
        // It fits, there is nothing to lower, or too little room is left to be worth it.
        assert_eq!(
            fit_output(&mut json!({"max_tokens": 100}), 28_000, 21_000),
            None
        );
        assert_eq!(fit_output(&mut json!({}), 28_000, 27_000), None);
        assert_eq!(
            fit_output(&mut json!({"max_tokens": 9000}), 28_000, 27_600),
            None
        );
    }
}
