//! The role order strict chat templates demand (Bedrock-hosted Anthropic, Mistral, Gemma
//! and other Hugging Face templates): after the leading instructions the first message is
//! the user's, and user and assistant alternate, tool results aside. The rule lives here
//! once; the validator checks it and [`conform`] makes every rewritten request obey it.

use serde_json::{Map, Value};

use super::merge::join_content;
use super::message::{Message, Role};
use super::tokens::Counter;

/// Where a conversation stands in that order, after the messages seen so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Last {
    /// Nothing but instructions yet.
    Start,
    User,
    Assistant,
    /// Tool results: the assistant may go on, or the user may speak.
    Results,
}

/// Why a message breaks the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Break {
    /// An assistant message before any user message.
    AssistantFirst,
    /// Two user, or two assistant, messages with nothing between them.
    Repeated,
}

impl Last {
    /// The state after a message of `role`, or why a strict template refuses it here.
    /// Instructions are transparent: they neither open nor close a turn.
    pub fn after(self, role: Role) -> Result<Last, Break> {
        match (self, role) {
            (_, r) if r.is_instruction() => Ok(self),
            (_, Role::Tool | Role::Function) => Ok(Last::Results),
            (Last::User, Role::User) | (Last::Assistant, Role::Assistant) => Err(Break::Repeated),
            (Last::Start, Role::Assistant) => Err(Break::AssistantFirst),
            (_, Role::User) => Ok(Last::User),
            (_, _) => Ok(Last::Assistant),
        }
    }

    /// The state after `messages`, ignoring breaks.
    pub fn after_all(messages: &[Message]) -> Last {
        messages.iter().fold(Last::Start, |last, m| {
            last.after(m.role).unwrap_or(last_of(m.role))
        })
    }
}

fn last_of(role: Role) -> Last {
    match role {
        Role::User => Last::User,
        Role::Assistant => Last::Assistant,
        _ => Last::Results,
    }
}

/// Text of the user message put before a conversation that would otherwise open with the
/// assistant: only possible when the client's own conversation did.
pub const OPENING: &str = "(conversation continues)";

/// Rewrites `messages` into the strict order: a user or assistant message that repeats the
/// role before it is merged into the later one, whose fields it keeps and whose text ends
/// the merged content unchanged (so the latest user message's text stays byte-identical);
/// an assistant message first gets a short user message before it. Returns how many
/// messages were merged or added.
pub fn conform(messages: Vec<Message>, counter: &Counter) -> (Vec<Message>, usize) {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut last = Last::Start;
    // Index in `out` of the latest user or assistant message.
    let mut speaker: Option<usize> = None;
    let mut changes = 0;
    for mut msg in messages {
        match last.after(msg.role) {
            Ok(next) => last = next,
            Err(Break::Repeated) => {
                if let Some(at) = speaker {
                    let earlier = out.remove(at);
                    let joined = join_content(earlier.content(), msg.content());
                    msg.set_content(joined, counter);
                    changes += 1;
                }
            }
            Err(Break::AssistantFirst) => {
                let mut fields = Map::new();
                fields.insert("content".into(), Value::String(OPENING.into()));
                out.push(Message::new(Role::User, fields, counter));
                last = Last::Assistant;
                changes += 1;
            }
        }
        if matches!(msg.role, Role::User | Role::Assistant) {
            speaker = Some(out.len());
        }
        out.push(msg);
    }
    (out, changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::tokens::Encoding;
    use crate::engine::validate::validate_strict;
    use serde_json::json;

    fn run(v: Value) -> Vec<Value> {
        let c = Counter::new(Encoding::O200k);
        let (out, _) = conform(parse_test_messages(&v), &c);
        let values: Vec<Value> = out.into_iter().map(|m| Value::Object(m.body)).collect();
        validate_strict(&values).unwrap();
        values
    }

    #[test]
    fn a_trailing_pair_of_user_messages_becomes_one_ending_with_the_latest() {
        let out = run(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "prompt"},
            {"role": "user", "content": "<<<context>>>", "name": "x"},
        ]));
        assert_eq!(out.len(), 2);
        assert_eq!(out[1]["content"], "prompt\n\n<<<context>>>");
        assert_eq!(out[1]["name"], "x", "the later message's fields are kept");
        let out = run(json!([
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
            {"role": "user", "content": [{"type": "text", "text": "latest", "cache_control": {}}]},
        ]));
        assert_eq!(
            out[0]["content"][1],
            json!({"type": "text", "text": "latest", "cache_control": {}}),
            "the latest text stays its own final part"
        );
    }

    #[test]
    fn assistant_runs_merge_into_the_one_that_calls_tools() {
        let out = run(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "let me look"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
            {"role": "assistant", "content": "found it"},
        ]));
        assert_eq!(out.len(), 4);
        assert_eq!(out[1]["content"], "let me look");
        assert_eq!(out[1]["tool_calls"][0]["id"], "a");
    }

    #[test]
    fn an_assistant_opening_gets_a_user_message_before_it() {
        let out = run(json!([
            {"role": "developer", "content": "d"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "hi"},
        ]));
        assert_eq!(out[1]["role"], "user");
        assert_eq!(out[2]["content"], "hello");
    }
}
