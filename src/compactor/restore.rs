//! The client's own text of what a summary replaces, in place of what an earlier event
//! shortened. A conversation resumed from a checkpoint carries the outputs that event
//! pruned as one-line stubs (`[output of read_file ... pruned by compaction: 60 lines]`)
//! and its calls with their arguments cut; the client still sends them whole, and a
//! summariser shown the stubs never sees the facts they held (issue 40: it was shown 83%
//! of the numbers and 86% of the paths of the messages dropped). The restored turns are
//! only what the summariser reads: the plan, and the request it rewrites, keep their own.
//! Secrets are masked where every turn is, when the summariser's request is written.

use std::collections::HashMap;

use serde_json::Value;

use crate::dialect::Dialect;
use crate::engine::message::call_id;
use crate::engine::{Counter, Message};

/// `turns` with each tool result and each call the client sends otherwise (by the call id
/// it answers or makes) in the client's form; `None` when none is, or the client's request
/// cannot be read.
pub fn client_text(
    turns: &[Message],
    original: &[u8],
    dialect: Dialect,
    counter: &Counter,
) -> Option<Vec<Message>> {
    let (view, _) = dialect.view(original)?;
    let index = ClientIndex::of(view.get("messages")?.as_array()?);
    let mut restored = turns.to_vec();
    let mut changed = false;
    for m in &mut restored {
        changed |= index.restore(m, counter);
    }
    changed.then_some(restored)
}

/// The client's tool results by the call they answer, and its calls by their ids.
struct ClientIndex<'a> {
    results: HashMap<&'a str, &'a Value>,
    calls: HashMap<&'a str, &'a Value>,
}

impl<'a> ClientIndex<'a> {
    fn of(messages: &'a [Value]) -> ClientIndex<'a> {
        let mut index = ClientIndex {
            results: HashMap::new(),
            calls: HashMap::new(),
        };
        for m in messages {
            if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
                if let Some(content) = m.get("content") {
                    index.results.insert(id, content);
                }
            }
            let calls = m.get("tool_calls").and_then(Value::as_array);
            for call in calls.into_iter().flatten() {
                if let Some(id) = call_id(call) {
                    index.calls.insert(id, call);
                }
            }
        }
        index
    }

    /// Puts the client's form of `m` in place; whether it did.
    fn restore(&self, m: &mut Message, counter: &Counter) -> bool {
        if m.role.is_result() {
            let client = m.tool_call_id().and_then(|id| self.results.get(id));
            let Some(&content) = client else {
                return false;
            };
            // A checkpoint's form only ever shortens a result: one that differs is one an
            // event pruned or cut.
            if m.body.get("content") == Some(content) {
                return false;
            }
            m.set_content(content.clone(), counter);
            return true;
        }
        if !m.makes_calls() {
            return false;
        }
        let calls: Vec<Value> = m
            .tool_calls()
            .iter()
            .map(|call| {
                let client = call_id(call).and_then(|id| self.calls.get(id));
                match client {
                    Some(&whole) if arguments(whole) != arguments(call) => whole.clone(),
                    _ => call.clone(),
                }
            })
            .collect();
        if calls.as_slice() == m.tool_calls() {
            return false;
        }
        m.body.insert("tool_calls".to_owned(), Value::Array(calls));
        m.recount(counter);
        true
    }
}

fn arguments(call: &Value) -> Option<&Value> {
    call.get("function")?.get("arguments")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use serde_json::json;

    const OUTPUT: &str = "fn main() {}\n// the pager keeps 4096 rows per page\n";

    /// A call with long arguments and its output, as the client sends them, and as an
    /// earlier event left them in the checkpoint.
    fn exchange(pruned: bool) -> Value {
        let content = "x".repeat(500);
        let args = if pruned {
            json!({"path": "src/pager.rs", "content": "xx...[480 chars cut by compaction]"})
        } else {
            json!({"path": "src/pager.rs", "content": content})
        };
        let output = if pruned {
            "[output of read_file path=src/main.rs pruned by compaction: 2 lines]"
        } else {
            OUTPUT
        };
        json!([
            {"role": "user", "content": "page the rows"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "w1", "type": "function", "function": {"name": "write_file", "arguments": args.to_string()}},
                {"id": "r1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}"}}]},
            {"role": "tool", "tool_call_id": "w1", "content": "ok"},
            {"role": "tool", "tool_call_id": "r1", "content": output},
        ])
    }

    #[test]
    fn the_summariser_reads_the_clients_text_of_what_an_earlier_event_pruned() {
        let counter = Counter::for_model("gpt-4o");
        let turns = parse_test_messages(&exchange(true));
        let client = json!({"model": "gpt-4o", "messages": exchange(false)}).to_string();
        let restored = client_text(&turns, client.as_bytes(), Dialect::Chat, &counter)
            .expect("nothing restored");
        assert_eq!(restored[3].text(), OUTPUT);
        assert_ne!(restored[3].tokens, turns[3].tokens);
        let args = restored[1].tool_calls()[0]["function"]["arguments"]
            .as_str()
            .unwrap_or_default();
        assert!(args.contains(&"x".repeat(500)), "{args}");
        // What was not shortened is as it was.
        assert_eq!(restored[0].body, turns[0].body);
        assert_eq!(restored[2].body, turns[2].body);
        // A client that sends the same text leaves nothing to restore.
        let same = json!({"model": "gpt-4o", "messages": exchange(true)}).to_string();
        assert!(client_text(&turns, same.as_bytes(), Dialect::Chat, &counter).is_none());
    }
}
