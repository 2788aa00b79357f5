//! The chat-completions request that asks the summariser for a checkpoint.
//!
//! The system message is the fixed template (plus the update instructions when a previous
//! checkpoint exists), so it is byte-identical across calls and the summariser's own prompt
//! cache can hold it; everything that varies (turns, previous checkpoint, date, length,
//! focus) goes in the user message.

use serde_json::{json, Map, Value};

use crate::engine::message::keep_ends;
use crate::engine::{Counter, Message};
use crate::redact::redact;
use crate::units::Limit;

use super::serialize;

const TEMPLATE: &str = include_str!("prompt.md");
const UPDATE: &str = include_str!("update.md");
/// The same sections, asked for in a few lines: for windows where the full template would
/// take the room the turns need (a 2k-token local model, say).
const TEMPLATE_SMALL: &str = include_str!("prompt_small.md");
const UPDATE_SMALL: &str = include_str!("update_small.md");
const FOCUS: &str = include_str!("focus.md");

/// Low but not zero: the checkpoint should be faithful, and a little freedom avoids the
/// repetition loops some models fall into at zero.
const TEMPERATURE: f64 = 0.2;
/// Reasoning models spend completion tokens on thinking before the answer; up to this much
/// is added to their cap so the checkpoint itself is not cut short. Only what the window
/// leaves beside the prompt and the answer is added ([`SummaryRequest::reasoning_room`]):
/// upstreams that count the cap against the window refuse a request whose prompt and cap
/// together exceed it.
const REASONING_HEADROOM: usize = 8192;

/// Everything the summariser is told for one call; [`SummaryRequest::body`] makes the JSON.
#[derive(Clone, Debug)]
pub struct SummaryRequest<'a> {
    model: &'a str,
    turns: &'a [Message],
    budget_tokens: usize,
    counter: Counter,
    previous_summary: Option<&'a str>,
    focus: Option<&'a str>,
    date: Option<&'a str>,
    input_limit: Limit,
    prompt: Prompt,
    /// Tokens added to a reasoning model's cap for its thinking.
    reasoning_room: usize,
}

/// Which template a request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Each section explained: what a capable model needs to write a checkpoint to rely on.
    Full,
    /// The sections named only.
    Small,
}

/// The tags around the previous checkpoint where [`SummaryRequest::instructions`] gives
/// it.
pub const PREVIOUS_OPEN: &str = "<previous-checkpoint>";
pub const PREVIOUS_CLOSE: &str = "</previous-checkpoint>";

impl<'a> SummaryRequest<'a> {
    /// A request to summarise `turns` with `model` in about `budget_tokens` (see
    /// [`super::summary_budget`]); `counter` measures the serialised turns.
    pub fn new(
        model: &'a str,
        turns: &'a [Message],
        budget_tokens: usize,
        counter: Counter,
    ) -> SummaryRequest<'a> {
        SummaryRequest {
            model,
            turns,
            budget_tokens,
            counter,
            previous_summary: None,
            focus: None,
            date: None,
            input_limit: Limit::Unbounded,
            prompt: Prompt::Full,
            reasoning_room: REASONING_HEADROOM,
        }
    }

    /// The most a reasoning model's cap may add for its thinking (at most
    /// [`REASONING_HEADROOM`]): what the window leaves beside the prompt and the answer.
    pub fn reasoning_room(mut self, tokens: usize) -> Self {
        self.reasoning_room = tokens.min(REASONING_HEADROOM);
        self
    }

    /// The template to use (see [`super::chunk::ChunkRoom::prompt`]).
    pub fn prompt(mut self, prompt: Prompt) -> Self {
        self.prompt = prompt;
        self
    }

    /// The checkpoint to update (from the cache, or [`crate::engine::Plan::previous_summary`]).
    pub fn previous_summary(mut self, summary: Option<&'a str>) -> Self {
        self.previous_summary = summary.filter(|s| !s.trim().is_empty());
        self
    }

    /// The subject to spend most of the budget on (see [`super::focus_topic`]).
    pub fn focus(mut self, focus: Option<&'a str>) -> Self {
        self.focus = focus.filter(|s| !s.trim().is_empty());
        self
    }

    /// Today's date (`2026-11-22`), used to date completed actions.
    pub fn date(mut self, date: Option<&'a str>) -> Self {
        self.date = date;
        self
    }

    /// Tokens the serialised turns may take (see [`super::ChunkRoom::plan`]); larger
    /// messages are cut to their head and tail to fit.
    pub fn input_limit(mut self, tokens: usize) -> Self {
        self.input_limit = Limit::At(tokens);
        self
    }

    /// The tokens the serialised turns may take: no limit until [`Self::input_limit`].
    pub fn limit(&self) -> Limit {
        self.input_limit
    }

    /// The cap on the answer's length: the budget plus a fifth, so a summary that runs a
    /// little long ends cleanly instead of mid-sentence.
    pub fn max_tokens(&self) -> usize {
        max_tokens(self.budget_tokens)
    }

    /// The cap the body asks for: [`Self::max_tokens`], and for a reasoning model the room
    /// for its thinking as well.
    pub fn answer_cap(&self) -> usize {
        if is_reasoning_model(self.model) {
            self.max_tokens() + self.reasoning_room
        } else {
            self.max_tokens()
        }
    }

    /// The system message: the template, and the update instructions when there is a
    /// previous checkpoint.
    pub fn system(&self) -> String {
        let (template, update) = match self.prompt {
            Prompt::Full => (TEMPLATE, UPDATE),
            Prompt::Small => (TEMPLATE_SMALL, UPDATE_SMALL),
        };
        let mut s = template.trim_end().to_string();
        if self.previous_summary.is_some() {
            s.push_str("\n\n");
            s.push_str(update.trim_end());
        }
        s
    }

    /// What the request tells the model besides the turns: the system message and the
    /// parameters after the turns (an answer that only repeats these is no checkpoint),
    /// then the previous checkpoint as the model was shown it, between the tags
    /// [`super::answer`] looks for: an update must keep its facts.
    pub fn instructions(&self) -> String {
        let mut s = format!("{}\n{}", self.system(), self.params());
        if let Some(prev) = self.previous_shown() {
            s.push_str(&format!("\n{PREVIOUS_OPEN}\n{prev}\n{PREVIOUS_CLOSE}\n"));
        }
        s
    }

    /// The previous checkpoint as the user message gives it: redacted, and cut to its
    /// two ends when longer than an answer plus half the turns' room.
    fn previous_shown(&self) -> Option<String> {
        let prev = redact(self.previous_summary?.trim());
        let most = match self.input_limit {
            Limit::At(turns) => self.max_tokens().saturating_add(turns / 2),
            Limit::Unbounded => return Some(prev.into_owned()),
        };
        let tokens = self.counter.text(&prev);
        Some(if tokens > most {
            let keep = (prev.len() as f64 * most as f64 / tokens as f64) as usize;
            keep_ends(&prev, keep * 2 / 3, keep / 3)
        } else {
            prev.into_owned()
        })
    }

    /// What the user message says after the turns: the date, the target length, the focus.
    fn params(&self) -> String {
        let mut s = match self.date {
            Some(date) => format!("Today's date: {date}.\n"),
            None => "Today's date: not given; date actions only where the turns show when they happened.\n".to_owned(),
        };
        s.push_str(&format!(
            "Target length: about {} tokens.\n",
            self.budget_tokens
        ));
        if let Some(focus) = self.focus {
            s.push('\n');
            s.push_str(FOCUS.trim_end().replace("{focus}", &redact(focus)).as_str());
            s.push('\n');
        }
        s
    }

    /// The user message: the previous checkpoint and the turns, redacted, then the
    /// parameters of this call.
    pub fn user(&self) -> String {
        let mut s = String::new();
        let mut limit = self.input_limit;
        // The input limit leaves an answer's worth of room for the previous checkpoint; a
        // longer one (an older, larger budget, or a digest) is paid for by the turns, up
        // to half of their room: beyond that it is cut to its two ends.
        if let Some(prev) = self.previous_shown() {
            let excess = self.counter.text(&prev).saturating_sub(self.max_tokens());
            limit = limit.less(excess);
            s.push_str("<previous-checkpoint>\n");
            s.push_str(&prev);
            s.push_str("\n</previous-checkpoint>\n\n<new-turns>\n");
            s.push_str(&serialize::joined(self.turns, limit, &self.counter));
            s.push_str("\n</new-turns>\n\n");
        } else {
            s.push_str("<turns>\n");
            s.push_str(&serialize::joined(self.turns, limit, &self.counter));
            s.push_str("\n</turns>\n\n");
        }
        s.push_str(&self.params());
        s
    }

    /// The request body. Streamed, because a long checkpoint can take longer to write than
    /// an idle timeout allows; the caller collects it with [`super::AnswerStream`].
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), Value::String(self.model.to_string()));
        body.insert(
            "messages".into(),
            json!([
                {"role": "system", "content": self.system()},
                {"role": "user", "content": self.user()},
            ]),
        );
        self.put_cap(&mut body);
        body.insert("stream".into(), Value::Bool(true));
        // The upstream's count of the prompt, in the last event: what calibrates the
        // room of the next call when the summariser has an upstream of its own.
        body.insert("stream_options".into(), json!({"include_usage": true}));
        Value::Object(body)
    }

    /// `body`, made by [`Self::body`], with this request's answer cap: the cap is not
    /// counted with the prompt, so a body counted to fit takes the thinking room the fit
    /// left ([`Self::reasoning_room`]) without being serialised again.
    pub fn with_its_cap(&self, mut body: Value) -> Value {
        if let Value::Object(fields) = &mut body {
            self.put_cap(fields);
        }
        body
    }

    /// The answer's cap and sampling, in the fields the model's family takes.
    fn put_cap(&self, body: &mut Map<String, Value>) {
        if is_reasoning_model(self.model) {
            // These models reject `max_tokens` and any temperature but the default.
            body.insert("max_completion_tokens".into(), json!(self.answer_cap()));
        } else {
            body.insert("max_tokens".into(), json!(self.max_tokens()));
            body.insert("temperature".into(), json!(TEMPERATURE));
        }
    }
}

/// The answer cap for a budget: a fifth above it.
pub fn max_tokens(budget_tokens: usize) -> usize {
    budget_tokens.saturating_add(budget_tokens / 5)
}

/// Tokens of the system message in its larger (update) form, with the focus paragraph.
pub fn system_tokens(counter: &Counter, prompt: Prompt) -> usize {
    let (template, update) = match prompt {
        Prompt::Full => (TEMPLATE, UPDATE),
        Prompt::Small => (TEMPLATE_SMALL, UPDATE_SMALL),
    };
    counter.text(template) + counter.text(update) + counter.text(FOCUS)
}

/// OpenAI's reasoning families, which take `max_completion_tokens` and no temperature.
fn is_reasoning_model(model: &str) -> bool {
    let m = model.rsplit('/').next().unwrap_or(model);
    ["o1", "o3", "o4", "gpt-5"].iter().any(|p| {
        m.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.']))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarize::tests::msg;
    use serde_json::json;

    fn turns() -> Vec<Message> {
        vec![
            msg(json!({"role": "user", "content": "deploy with token=abcd1234efgh5678"})),
            msg(json!({"role": "assistant", "content": "Deployed."})),
        ]
    }

    #[test]
    fn first_checkpoint_body() {
        let turns = turns();
        let req = SummaryRequest::new("gpt-4o-mini", &turns, 1000, Counter::for_model("gpt-4o"))
            .date(Some("2026-11-22"))
            .focus(Some("the deploy"));
        let body = req.body();
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["max_tokens"], 1200);
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        let system = body["messages"][0]["content"].as_str().unwrap_or("");
        assert!(system.starts_with("You are writing a checkpoint"));
        assert!(system.contains("## Active Task") && system.contains("## Critical Values"));
        assert!(!system.contains("already has a checkpoint"));
        let user = body["messages"][1]["content"].as_str().unwrap_or("");
        assert!(user.starts_with("<turns>\n[user]\ndeploy with token=[REDACTED:token]"));
        assert!(user.contains("[assistant]\nDeployed.\n</turns>"));
        assert!(user.contains("Today's date: 2026-11-22."));
        assert!(user.contains("about 1000 tokens"));
        assert!(user.contains("Focus of this checkpoint: \"the deploy\""));
        assert!(!user.contains("abcd1234"));
    }

    #[test]
    fn update_carries_the_previous_checkpoint_apart_from_the_turns() {
        let turns = turns();
        let prev = "## Active Task\nNone.\n## Critical Values\npassword=hunter22";
        let req = SummaryRequest::new("m", &turns, 1000, Counter::for_model("m"))
            .previous_summary(Some(prev));
        let system = req.system();
        assert!(system.contains("already has a checkpoint"));
        let user = req.user();
        assert!(user.starts_with("<previous-checkpoint>\n## Active Task\nNone."));
        assert!(user.contains("password=[REDACTED:password]\n</previous-checkpoint>"));
        assert!(user.contains("<new-turns>\n[user]\n"));
        assert!(!user.contains("hunter22"));
        assert!(!user.contains("<turns>"));
    }

    #[test]
    fn system_message_is_stable_across_calls() {
        let a = turns();
        let b = vec![msg(json!({"role": "user", "content": "other"}))];
        let c = Counter::for_model("m");
        let one = SummaryRequest::new("m", &a, 1000, c)
            .focus(Some("x"))
            .system();
        let two = SummaryRequest::new("m", &b, 3000, c)
            .date(Some("d"))
            .system();
        assert_eq!(one, two);
    }

    #[test]
    fn reasoning_models_get_completion_tokens_and_no_temperature() {
        let turns = turns();
        let c = Counter::for_model("m");
        for model in ["o3-mini", "gpt-5", "openai/gpt-5.1", "o1"] {
            let body = SummaryRequest::new(model, &turns, 1000, c).body();
            assert_eq!(
                body["max_completion_tokens"],
                1200 + REASONING_HEADROOM,
                "{model}"
            );
            assert!(body.get("temperature").is_none() && body.get("max_tokens").is_none());
        }
        for model in ["gpt-4o", "o1x", "llama-3"] {
            let body = SummaryRequest::new(model, &turns, 1000, c).body();
            assert_eq!(body["max_tokens"], 1200, "{model}");
        }
    }

    #[test]
    fn input_limit_cuts_the_turns() {
        let big = vec![msg(
            json!({"role": "tool", "tool_call_id": "c", "content": "lorem ipsum ".repeat(2000)}),
        )];
        let c = Counter::for_model("gpt-4o");
        let full = SummaryRequest::new("m", &big, 1000, c).user();
        let cut = SummaryRequest::new("m", &big, 1000, c)
            .input_limit(300)
            .user();
        assert!(cut.len() < full.len());
        assert!(c.text(&cut) < 400, "{}", c.text(&cut));
    }
}
