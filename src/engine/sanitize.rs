//! Pass 7: make the tool protocol whole again after messages were removed. A result whose
//! call is gone is dropped; a call whose result is gone gets a stub result, so the
//! assistant message that made it can stay.

use serde_json::{Map, Value};

use super::message::{call_id, Message, Role};
use super::tokens::Counter;

/// The result put in for a call whose own result is gone.
pub(super) const STUB: &str = include_str!("stub_result.md");

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SanitizeStats {
    pub dropped_results: usize,
    pub stubbed_calls: usize,
}

pub fn sanitize(messages: Vec<Message>, counter: &Counter) -> (Vec<Message>, SanitizeStats) {
    let mut stats = SanitizeStats::default();
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    // Calls of the latest assistant message still waiting for a result.
    let mut open: Vec<String> = Vec::new();
    let mut function_open = false;
    for msg in messages {
        match msg.role {
            Role::Tool => {
                let answered = msg
                    .tool_call_id()
                    .and_then(|id| open.iter().position(|o| o == id));
                match answered {
                    Some(pos) => {
                        open.remove(pos);
                        out.push(msg);
                    }
                    None => stats.dropped_results += 1,
                }
                function_open = false;
                continue;
            }
            Role::Function => {
                if function_open {
                    out.push(msg);
                } else {
                    stats.dropped_results += 1;
                }
                function_open = false;
                continue;
            }
            _ => {}
        }
        close(&mut out, &mut open, &mut stats, counter);
        function_open = msg.role == Role::Assistant && msg.function_call().is_some();
        if msg.role == Role::Assistant {
            open = msg
                .tool_calls()
                .iter()
                .filter_map(call_id)
                .map(str::to_string)
                .collect();
        }
        out.push(msg);
    }
    close(&mut out, &mut open, &mut stats, counter);
    (out, stats)
}

/// Appends a stub result for every call still open.
fn close(
    out: &mut Vec<Message>,
    open: &mut Vec<String>,
    stats: &mut SanitizeStats,
    counter: &Counter,
) {
    for id in open.drain(..) {
        let mut fields = Map::new();
        fields.insert("tool_call_id".into(), Value::String(id));
        fields.insert("content".into(), Value::String(STUB.trim().to_string()));
        out.push(Message::new(Role::Tool, fields, counter));
        stats.stubbed_calls += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::tokens::Encoding;
    use crate::engine::validate::validate;
    use serde_json::json;

    #[test]
    fn drops_orphans_and_stubs_missing_results() {
        let c = Counter::new(Encoding::O200k);
        let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}});
        let input = json!([
            {"role": "tool", "tool_call_id": "gone", "content": "orphan"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")]},
            {"role": "tool", "tool_call_id": "b", "content": "B"},
            {"role": "function", "name": "g", "content": "stray"},
            {"role": "user", "content": "next"},
            {"role": "assistant", "content": null, "tool_calls": [call("c")]},
        ]);
        let msgs = parse_test_messages(&input);
        let (out, stats) = sanitize(msgs, &c);
        assert_eq!(
            stats,
            SanitizeStats {
                dropped_results: 2,
                stubbed_calls: 2
            }
        );
        let values: Vec<Value> = out.into_iter().map(|m| Value::Object(m.body)).collect();
        validate(&values).unwrap();
        assert_eq!(values[3]["tool_call_id"], "a");
        assert_eq!(values[3]["role"], "tool");
    }
}
