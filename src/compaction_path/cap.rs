//! The completion cap: how much room the answer is given, and the lossless fix of
//! lowering a cap that, with the prompt, would overflow the window. A huge `max_tokens` is
//! an output-cap problem: it must not make the proxy cut the conversation to make room.

use super::policy::AnswerRoom;
use super::Attempt;
use crate::classify::Classification;
use crate::engine::budget;
use crate::units::{Theirs, Window};

impl Attempt<'_> {
    /// The room the answer asks for: the request's cap as it stands, else the configured
    /// reserve.
    pub(super) fn answer_room(&self) -> AnswerRoom {
        AnswerRoom {
            cap: self.work.cap,
            reserve: self.ctx.app.config.compaction.output_reserve_tokens,
        }
    }

    /// Lowers the cap of the request compaction starts from when prompt plus cap would
    /// overflow the window, before the upstream refuses.
    pub(super) fn fit_output(&mut self, window: Window, prompt: Theirs) {
        // Checked on the cap first: most requests need no parsing for it.
        if budget::cap_fits(window.0, prompt.0, self.work.cap) {
            return;
        }
        let Some(base) = self.work.base(self.ctx.dialect) else {
            return;
        };
        if let Some((before, after)) = budget::fit_output(&mut base.view, window.0, prompt.0) {
            self.lowered(before, after);
        }
    }

    /// Records a lowered cap: later budgets use it, and the header reports the first
    /// cap asked for and the last one sent.
    pub(super) fn lowered(&mut self, before: u64, after: u64) {
        let first = self.done.output.map_or(before, |(first, _)| first);
        self.done.output = Some((first, after));
        self.work.cap = Some(after);
    }

    /// After an output-cap refusal: ask for fewer completion tokens, when the upstream
    /// said enough to know how many fit.
    pub(super) fn lower_output_cap(&mut self, class: &Classification) -> bool {
        let numbers = &class.numbers;
        let (Some(field), Some(asked)) = (self.work.cap_field, self.work.cap) else {
            return false;
        };
        let room = match (
            numbers.completion_limit,
            numbers.context_window,
            numbers.prompt_tokens,
        ) {
            (Some(cap), _, _) if cap < asked => cap,
            (_, Some(window), Some(prompt)) if prompt < window => {
                budget::output_room(window, prompt)
            }
            _ => return false,
        };
        if room < budget::MIN_USEFUL_OUTPUT || room >= asked {
            return false;
        }
        self.set_output_cap(field, asked, room)
    }

    /// The last resort for an overflow with no numbers that compaction could not shrink
    /// at all: only the completion cap can make room, by an amount the upstream did not
    /// say, so the cap `before` the last recovery is halved (never below what a useful
    /// answer needs, and only if that lowers what is asked now).
    pub(super) fn halve_output_cap(&mut self, before: Option<u64>) -> bool {
        let (Some(field), Some(asked), Some(before)) = (self.work.cap_field, self.work.cap, before)
        else {
            return false;
        };
        let half = before / 2;
        if half < budget::MIN_USEFUL_OUTPUT || half >= asked {
            return false;
        }
        self.set_output_cap(field, asked, half)
    }

    /// Sends the last request again with completion cap `cap` in place of `asked`.
    pub(super) fn set_output_cap(&mut self, field: &str, asked: u64, cap: u64) -> bool {
        let dialect = self.ctx.dialect;
        let Some(bytes) = dialect.with_output_cap(&self.work.body, field, cap) else {
            return false;
        };
        self.work.body = bytes.into();
        self.lowered(asked, cap);
        // Later compactions start from the client's request with the lower cap too.
        if let Some(base) = self.work.parsed_mut() {
            if let Some(request) = base.view.as_object_mut() {
                request.insert(field.into(), cap.into());
            }
        }
        true
    }
}
