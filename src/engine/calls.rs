//! What a tool call was about: used to describe pruned outputs and in the summary.

use std::collections::HashMap;

use serde_json::Value;

use super::message::{call_id, call_name_args, one_line, Message, Role};

/// Argument names that identify what a call acted on, most telling first.
const KEY_ARGS: &[&str] = &[
    "path",
    "file_path",
    "filepath",
    "filename",
    "file",
    "target_file",
    "command",
    "cmd",
    "query",
    "q",
    "pattern",
    "url",
    "uri",
    "paths",
];

/// Argument names that name a file.
const FILE_ARGS: &[&str] = &[
    "path",
    "file_path",
    "filepath",
    "filename",
    "file",
    "target_file",
    "paths",
];

/// Tools an agent speaks to the person through: MemGPT-style agents answer only with
/// `send_message`, code agents end with `final_answer`. What they say there is the agent's
/// own words, read like its text for what it decided.
const SPEAKING: &[&str] = &[
    "send_message",
    "send_user_message",
    "message_user",
    "send_reply",
    "reply",
    "respond",
    "respond_to_user",
    "say",
    "final_answer",
    "answer",
    "notify_user",
];

/// The arguments of a [`SPEAKING`] tool that hold what it says.
const SPOKEN_ARGS: &[&str] = &["message", "text", "content", "answer", "response", "reply"];

/// What the agent says to the person in `call`, if it is a tool it speaks through.
pub fn spoken(call: &Value) -> Option<String> {
    let (name, args) = call_name_args(call);
    if !SPEAKING.iter().any(|s| name.eq_ignore_ascii_case(s)) {
        return None;
    }
    let obj: serde_json::Map<String, Value> = serde_json::from_str(args).ok()?;
    let said: Vec<&str> = SPOKEN_ARGS
        .iter()
        .filter_map(|k| obj.get(*k).and_then(Value::as_str))
        .filter(|s| !s.trim().is_empty())
        .collect();
    (!said.is_empty()).then(|| said.join("\n"))
}

/// A tool call: its function name and the key argument, if one is recognisable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallInfo {
    pub name: String,
    pub target: Option<(String, String)>,
    pub files: Vec<String>,
}

impl CallInfo {
    pub fn from_call(call: &Value) -> CallInfo {
        let (name, args) = call_name_args(call);
        describe(name, args)
    }

    /// `read_file path=src/main.rs`
    pub fn label(&self) -> String {
        match &self.target {
            Some((k, v)) => format!("{} {k}={v}", self.name),
            None => self.name.clone(),
        }
    }
}

pub fn describe(name: &str, args: &str) -> CallInfo {
    let parsed: Option<serde_json::Map<String, Value>> = serde_json::from_str(args).ok();
    let (target, files) = match &parsed {
        Some(obj) => (key_arg(obj), file_args(obj)),
        None => (None, Vec::new()),
    };
    CallInfo {
        name: name.to_string(),
        target,
        files,
    }
}

fn key_arg(obj: &serde_json::Map<String, Value>) -> Option<(String, String)> {
    KEY_ARGS.iter().find_map(|k| {
        let v = match obj.get(*k)? {
            Value::String(s) => s.clone(),
            Value::Array(items) => items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","),
            _ => return None,
        };
        (!v.is_empty()).then(|| (k.to_string(), one_line(&v, 120)))
    })
}

fn file_args(obj: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut files = Vec::new();
    for k in FILE_ARGS {
        match obj.get(*k) {
            Some(Value::String(s)) if !s.is_empty() && s.len() < 300 => files.push(s.clone()),
            Some(Value::Array(items)) => files.extend(
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|s| !s.is_empty() && s.len() < 300)
                    .map(str::to_string),
            ),
            _ => {}
        }
    }
    files
}

/// Maps each tool call id (and legacy function result position) to what was called.
pub fn index_calls(messages: &[Message]) -> HashMap<String, CallInfo> {
    let mut index = HashMap::new();
    for m in messages.iter().filter(|m| m.role == Role::Assistant) {
        for call in m.tool_calls() {
            if let Some(id) = call_id(call) {
                index.insert(id.to_string(), CallInfo::from_call(call));
            }
        }
    }
    index
}

/// What produced the result message at `i`.
pub fn result_info(
    messages: &[Message],
    i: usize,
    index: &HashMap<String, CallInfo>,
) -> Option<CallInfo> {
    let m = &messages[i];
    match m.role {
        Role::Tool => m.tool_call_id().and_then(|id| index.get(id)).cloned(),
        Role::Function => {
            let call = messages[..i]
                .iter()
                .rev()
                .find(|p| p.role == Role::Assistant)
                .and_then(|p| p.function_call())?;
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("function");
            let args = call.get("arguments").and_then(Value::as_str).unwrap_or("");
            Some(describe(name, args))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_key_argument_and_files() {
        let info = describe("read_file", r#"{"offset": 3, "path": "src/lib.rs"}"#);
        assert_eq!(info.label(), "read_file path=src/lib.rs");
        assert_eq!(info.files, vec!["src/lib.rs"]);
        let cmd = CallInfo::from_call(&json!({"id": "1", "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\": \"cargo test\\n  --lib\"}"}}));
        assert_eq!(cmd.label(), "bash command=cargo test --lib");
        assert_eq!(describe("x", "not json").label(), "x");
    }
}
