//! A strict check of a chat-completions message list, shared by the engine (on its own
//! output), the proxy and the tests. [`validate`] rejects what OpenAI-compatible upstreams
//! reject: unknown roles, malformed content, tool results that do not answer the assistant
//! message right before them, and tool calls left without a result. [`validate_strict`]
//! adds what strict chat templates reject: a conversation that does not open with the
//! user after its instructions, or two user (or two assistant) messages in a row.

use std::collections::HashSet;

use serde_json::Value;

use super::message::{part_type, Role};
use super::roles::{Break, Last};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("messages is empty")]
    Empty,
    #[error("messages[{0}] is not an object")]
    NotObject(usize),
    #[error("messages[{0}] has no string role")]
    MissingRole(usize),
    #[error("messages[{index}] has unknown role {role:?}")]
    UnknownRole { index: usize, role: String },
    #[error("messages[{index}] ({role}) has invalid content: {why}")]
    BadContent {
        index: usize,
        role: &'static str,
        why: &'static str,
    },
    #[error("messages[{index}] has a malformed tool call: {why}")]
    BadToolCall { index: usize, why: &'static str },
    #[error("messages[{index}] repeats tool call id {id:?}")]
    DuplicateCallId { index: usize, id: String },
    #[error("messages[{index}] is a tool result without a tool_call_id")]
    MissingCallId { index: usize },
    #[error("messages[{index}] answers tool call {id:?}, which the assistant message before it did not make (or which was already answered)")]
    OrphanResult { index: usize, id: String },
    #[error("messages[{index}] is a function result not preceded by an assistant function_call")]
    OrphanFunctionResult { index: usize },
    #[error("tool call {id:?} made in messages[{index}] has no result")]
    MissingResult { index: usize, id: String },
    #[error("messages[{index}] is an assistant message before any user message")]
    AssistantFirst { index: usize },
    #[error("messages[{index}] is a second {role} message in a row")]
    RoleRepeated { index: usize, role: &'static str },
}

/// Checks a request's `messages` as [`validate`] does, then the role order strict chat
/// templates require. The proxy holds every request it rewrites to this.
pub fn validate_strict(messages: &[Value]) -> Result<(), ValidationError> {
    validate(messages)?;
    let mut last = Last::Start;
    for (index, value) in messages.iter().enumerate() {
        let role = role_of(index, value)?;
        last = last.after(role).map_err(|b| match b {
            Break::AssistantFirst => ValidationError::AssistantFirst { index },
            Break::Repeated => ValidationError::RoleRepeated {
                index,
                role: role.as_str(),
            },
        })?;
    }
    Ok(())
}

/// Checks a request's `messages`.
pub fn validate(messages: &[Value]) -> Result<(), ValidationError> {
    if messages.is_empty() {
        return Err(ValidationError::Empty);
    }
    // Ids the latest assistant message called and that are still unanswered.
    let mut open: Vec<String> = Vec::new();
    let mut open_at = 0;
    // Whether a legacy function result may follow.
    let mut function_open = false;
    for (index, value) in messages.iter().enumerate() {
        let role = role_of(index, value)?;
        if role != Role::Tool {
            if let Some(id) = open.first() {
                return Err(ValidationError::MissingResult {
                    index: open_at,
                    id: id.clone(),
                });
            }
        }
        check_content(index, role, value)?;
        match role {
            Role::Assistant => {
                open = call_ids(index, value)?;
                open_at = index;
                function_open = value.get("function_call").is_some_and(Value::is_object);
            }
            Role::Tool => {
                let id = value
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or(ValidationError::MissingCallId { index })?;
                let pos = open.iter().position(|o| o == id).ok_or_else(|| {
                    ValidationError::OrphanResult {
                        index,
                        id: id.to_string(),
                    }
                })?;
                open.remove(pos);
                function_open = false;
            }
            Role::Function => {
                if !function_open {
                    return Err(ValidationError::OrphanFunctionResult { index });
                }
                function_open = false;
            }
            _ => function_open = false,
        }
    }
    match open.first() {
        Some(id) => Err(ValidationError::MissingResult {
            index: open_at,
            id: id.clone(),
        }),
        None => Ok(()),
    }
}

fn role_of(index: usize, value: &Value) -> Result<Role, ValidationError> {
    let obj = value.as_object().ok_or(ValidationError::NotObject(index))?;
    let role = obj
        .get("role")
        .and_then(Value::as_str)
        .ok_or(ValidationError::MissingRole(index))?;
    Role::parse(role).ok_or_else(|| ValidationError::UnknownRole {
        index,
        role: role.to_string(),
    })
}

fn check_content(index: usize, role: Role, value: &Value) -> Result<(), ValidationError> {
    let bad = |why| ValidationError::BadContent {
        index,
        role: role.as_str(),
        why,
    };
    let content = value.get("content");
    let calls = value.get("tool_calls").is_some() || value.get("function_call").is_some();
    match content {
        None | Some(Value::Null) => match role {
            Role::Assistant if calls || value.get("refusal").is_some() => Ok(()),
            // Instructions are the client's, never edited: whatever the upstream makes of
            // an empty one, it is not a reason to refuse compacting the rest.
            Role::Function | Role::System | Role::Developer => Ok(()),
            _ => Err(bad("content is missing or null")),
        },
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(parts)) => {
            if parts.is_empty() && role != Role::Assistant {
                return Err(bad("content array is empty"));
            }
            parts
                .iter()
                .try_for_each(|p| check_part(role, p).map_err(bad))
        }
        Some(_) => Err(bad("content must be a string, an array of parts or null")),
    }
}

fn check_part(role: Role, part: &Value) -> Result<(), &'static str> {
    let kind = part_type(part);
    let text_ok = |field: &str| match part.get(field) {
        Some(Value::String(_)) => Ok(()),
        _ => Err("a text part has no string text"),
    };
    // A tool's result may carry media: a Responses `function_call_output` or a Messages
    // `tool_result` may hold images and files (a screenshot, a file read), and chat
    // servers that take them exist; the engine counts and prunes them as media.
    match (role, kind) {
        (_, "text") => text_ok("text"),
        (Role::Assistant, "refusal") => text_ok("refusal"),
        (Role::User | Role::Tool, "image_url") => match part.get("image_url") {
            Some(Value::Object(o)) if o.get("url").is_some_and(Value::is_string) => Ok(()),
            _ => Err("an image_url part has no url"),
        },
        (Role::User | Role::Tool, "input_audio") => match part.get("input_audio") {
            Some(Value::Object(_)) => Ok(()),
            _ => Err("an input_audio part has no input_audio object"),
        },
        (Role::User | Role::Tool, "file") => match part.get("file") {
            Some(Value::Object(_)) => Ok(()),
            _ => Err("a file part has no file object"),
        },
        (_, "") => Err("a content part has no type"),
        _ => Err("a content part has a type this role does not accept"),
    }
}

fn call_ids(index: usize, value: &Value) -> Result<Vec<String>, ValidationError> {
    let bad = |why| ValidationError::BadToolCall { index, why };
    let calls = match value.get("tool_calls") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(calls)) if calls.is_empty() => return Err(bad("tool_calls is empty")),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(bad("tool_calls is not an array")),
    };
    let mut seen = HashSet::new();
    let mut ids = Vec::with_capacity(calls.len());
    for call in calls {
        let id = call.get("id").and_then(Value::as_str).ok_or(bad("no id"))?;
        match call.get("type").and_then(Value::as_str) {
            Some("function") => {
                let f = call.get("function").ok_or(bad("no function object"))?;
                if !f.get("name").is_some_and(Value::is_string) {
                    return Err(bad("function has no name"));
                }
                if !f.get("arguments").is_some_and(Value::is_string) {
                    return Err(bad("function arguments are not a string"));
                }
            }
            Some("custom") => {
                if !call.get("custom").is_some_and(Value::is_object) {
                    return Err(bad("no custom object"));
                }
            }
            _ => return Err(bad("type is neither function nor custom")),
        }
        if !seen.insert(id) {
            return Err(ValidationError::DuplicateCallId {
                index,
                id: id.to_string(),
            });
        }
        ids.push(id.to_string());
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<(), ValidationError> {
        validate(v.as_array().unwrap())
    }

    fn call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}})
    }

    #[test]
    fn accepts_real_client_shapes() {
        check(json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}}]},
            {"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")],
             "reasoning_content": "thinking"},
            {"role": "tool", "tool_call_id": "b", "name": "f", "content": [{"type": "text", "text": "2"}]},
            {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "shot"},
                {"type": "image_url", "image_url": {"url": "data:,"}}]},
            {"role": "assistant", "content": null, "function_call": {"name": "g", "arguments": "{}"}},
            {"role": "function", "name": "g", "content": "3"},
            {"role": "user", "content": "ok", "x-unknown": 1},
        ]))
        .unwrap();
    }

    #[test]
    fn rejects_unknown_roles_and_bad_content() {
        assert!(matches!(
            check(json!([{"role": "bot", "content": "x"}])),
            Err(ValidationError::UnknownRole { index: 0, .. })
        ));
        assert!(check(json!([{"role": "user", "content": null}])).is_err());
        check(json!([{"role": "system", "content": null}, {"role": "user", "content": "q"}]))
            .unwrap();
        assert!(check(json!([{"role": "user", "content": 5}])).is_err());
        assert!(check(json!([{"role": "system", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]))
        .is_err());
        assert_eq!(check(json!([])), Err(ValidationError::Empty));
    }

    #[test]
    fn rejects_broken_tool_pairing() {
        let orphan = json!([{"role": "user", "content": "q"},
            {"role": "tool", "tool_call_id": "a", "content": "1"}]);
        assert!(matches!(
            check(orphan),
            Err(ValidationError::OrphanResult { index: 1, .. })
        ));
        let missing = json!([{"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "user", "content": "q"}]);
        assert!(matches!(
            check(missing),
            Err(ValidationError::MissingResult { index: 0, .. })
        ));
        let twice = json!([{"role": "assistant", "content": null, "tool_calls": [call("a")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "a", "content": "1"}]);
        assert!(matches!(
            check(twice),
            Err(ValidationError::OrphanResult { index: 2, .. })
        ));
        let dup =
            json!([{"role": "assistant", "content": null, "tool_calls": [call("a"), call("a")]}]);
        assert!(matches!(
            check(dup),
            Err(ValidationError::DuplicateCallId { .. })
        ));
        let unanswered = json!([{"role": "assistant", "content": null, "tool_calls": [call("a")]}]);
        assert!(matches!(
            check(unanswered),
            Err(ValidationError::MissingResult { .. })
        ));
        let stray_fn = json!([{"role": "user", "content": "q"}, {"role": "function", "name": "g", "content": "1"}]);
        assert!(matches!(
            check(stray_fn),
            Err(ValidationError::OrphanFunctionResult { index: 1 })
        ));
    }

    #[test]
    fn strict_mode_wants_the_user_first_and_turns_alternating() {
        let strict = |v: Value| validate_strict(v.as_array().unwrap());
        strict(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [call("a")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "assistant", "content": "done"},
            {"role": "developer", "content": "note"},
            {"role": "user", "content": "next"},
        ]))
        .unwrap();
        assert_eq!(
            strict(
                json!([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q"}])
            ),
            Err(ValidationError::AssistantFirst { index: 1 })
        );
        assert_eq!(
            strict(
                json!([{"role": "user", "content": "a"}, {"role": "system", "content": "s"},
                {"role": "user", "content": "b"}])
            ),
            Err(ValidationError::RoleRepeated {
                index: 2,
                role: "user"
            })
        );
        assert_eq!(
            strict(
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"}])
            ),
            Err(ValidationError::RoleRepeated {
                index: 2,
                role: "assistant"
            })
        );
    }
}
