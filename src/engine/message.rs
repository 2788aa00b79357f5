//! The engine's view of a chat message: the original JSON object, kept whole so that
//! unknown fields and key order survive, plus the parsed role and a cached token count.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::tokens::Counter;
use super::EngineError;

/// The roles the chat-completions API accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// Legacy result of an assistant `function_call`.
    Function,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
        }
    }

    /// System and developer messages carry the operator's instructions; the engine never
    /// edits or drops them.
    pub fn is_instruction(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }

    /// Messages that answer a call made by the previous assistant message.
    pub fn is_result(self) -> bool {
        matches!(self, Role::Tool | Role::Function)
    }
}

/// One message of the conversation being compacted.
#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    /// The whole JSON object as received (or as rewritten by a pass), `role` included.
    pub body: Map<String, Value>,
    /// Exact token cost of this message, kept current by every edit.
    pub tokens: usize,
    /// Where each message that [`super::merge`] joined to this one starts in its text,
    /// after the blank line that joins them: the client sent them apart (an agent's
    /// observation, then a person's words). Empty for a message as sent, and after any
    /// other edit.
    joined_at: Vec<usize>,
}

impl Message {
    /// Wraps a request's message whose role and token count are already known.
    pub fn from_parts(role: Role, value: &Value, tokens: usize) -> Message {
        Message {
            role,
            body: value.as_object().cloned().unwrap_or_default(),
            tokens,
            joined_at: Vec::new(),
        }
    }

    /// Parses and counts `messages[index]`.
    pub fn parse(index: usize, value: &Value, counter: &Counter) -> Result<Message, EngineError> {
        let role = role_of(index, value)?;
        let tokens = value.as_object().map_or(0, |m| counter.message(m));
        Ok(Message::from_parts(role, value, tokens))
    }

    /// A message the engine creates (summary, stub result).
    pub fn new(role: Role, mut fields: Map<String, Value>, counter: &Counter) -> Message {
        let mut body = Map::new();
        body.insert("role".into(), Value::String(role.as_str().into()));
        body.append(&mut fields);
        let tokens = counter.message(&body);
        Message {
            role,
            body,
            tokens,
            joined_at: Vec::new(),
        }
    }

    pub fn content(&self) -> Option<&Value> {
        self.body.get("content")
    }

    /// Replaces `content` in place (the key keeps its position) and recounts this message.
    pub fn set_content(&mut self, content: Value, counter: &Counter) {
        self.body.insert("content".into(), content);
        self.joined_at.clear();
        self.recount(counter);
    }

    /// Replaces `content` with this message's text joined to the next message the client
    /// sent, which starts at `next_at` after a blank line (`None`: not plain text joined
    /// to plain text, which keeps no places). The text before the new one is this
    /// message's, so the places of earlier joins hold.
    pub fn join_next(&mut self, content: Value, next_at: Option<usize>, counter: &Counter) {
        let mut joins = std::mem::take(&mut self.joined_at);
        self.set_content(content, counter);
        if let Some(at) = next_at {
            joins.push(at);
            self.joined_at = joins;
        }
    }

    /// Where the messages joined to this one start ([`Message::join_next`]).
    #[cfg(test)]
    pub fn joins(&self) -> &[usize] {
        &self.joined_at
    }

    /// Where the messages joined to this one start in `text` (this message's text, or
    /// what a pass left of it), after the blank line that joins them; none when `text` no
    /// longer splits there.
    pub fn joins_in(&self, text: &str) -> &[usize] {
        let joins = |&at: &usize| {
            at >= 2 && text.is_char_boundary(at) && text.get(at - 2..at) == Some("\n\n")
        };
        if self.joined_at.iter().all(joins) {
            &self.joined_at
        } else {
            &[]
        }
    }

    pub fn recount(&mut self, counter: &Counter) {
        self.tokens = counter.message(&self.body);
    }

    /// The message's text: a string content (borrowed), or its text parts joined by
    /// newlines.
    pub fn text(&self) -> Cow<'_, str> {
        match self.content() {
            Some(Value::String(s)) => Cow::Borrowed(s),
            other => Cow::Owned(content_text(other)),
        }
    }

    pub fn tool_calls(&self) -> &[Value] {
        match self.body.get("tool_calls") {
            Some(Value::Array(calls)) => calls,
            _ => &[],
        }
    }

    /// An assistant message whose answer must be the following tool or function messages.
    pub fn makes_calls(&self) -> bool {
        self.role == Role::Assistant
            && (!self.tool_calls().is_empty() || self.function_call().is_some())
    }

    pub fn function_call(&self) -> Option<&Map<String, Value>> {
        self.body.get("function_call").and_then(Value::as_object)
    }

    pub fn tool_call_id(&self) -> Option<&str> {
        self.body.get("tool_call_id").and_then(Value::as_str)
    }

    pub fn name(&self) -> Option<&str> {
        self.body.get("name").and_then(Value::as_str)
    }

    /// Shortens the message's text to about `tokens`, keeping the beginning and the end
    /// of each text and saying how much was cut. Returns whether it got smaller.
    pub fn cut_to(&mut self, tokens: usize, counter: &Counter) -> bool {
        let before = self.tokens;
        if before <= tokens {
            return false;
        }
        let Some(original) = self.content().cloned() else {
            return false;
        };
        let chars: usize = text_lens(&original).iter().sum();
        if chars == 0 {
            return false;
        }
        // Text and tokens shrink in about the same proportion; a second or third try
        // corrects for the framing and the note the cut adds.
        let mut keep = chars.saturating_mul(tokens) / before;
        for _ in 0..4 {
            self.set_content(cut_texts(&original, keep, chars), counter);
            if self.tokens <= tokens {
                break;
            }
            keep = keep.saturating_mul(tokens) / self.tokens.max(1);
        }
        self.tokens < before
    }

    /// Whether the content holds any text that `cut_to` could shorten.
    pub fn has_text(&self) -> bool {
        self.content()
            .is_some_and(|c| text_lens(c).iter().any(|&n| n > 0))
    }

    /// Whether any content part is an image, audio clip or file.
    pub fn has_media(&self) -> bool {
        match self.content() {
            Some(Value::Array(parts)) => parts.iter().any(is_media_part),
            _ => false,
        }
    }
}

/// The role of `messages[index]`, or why it has none the engine knows.
pub fn role_of(index: usize, value: &Value) -> Result<Role, EngineError> {
    let body = value
        .as_object()
        .ok_or(EngineError::MessageNotObject { index })?;
    match body.get("role") {
        Some(Value::String(r)) => Role::parse(r).ok_or_else(|| EngineError::UnknownRole {
            index,
            role: r.clone(),
        }),
        Some(_) | None => Err(EngineError::MissingRole { index }),
    }
}

/// The `id` of one entry of `tool_calls`.
pub fn call_id(call: &Value) -> Option<&str> {
    call.get("id").and_then(Value::as_str)
}

/// The function name and raw argument string of one tool call (or custom tool input).
pub fn call_name_args(call: &Value) -> (&str, &str) {
    let f = call.get("function").or_else(|| call.get("custom"));
    let name = f
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("tool");
    let args = f
        .and_then(|f| f.get("arguments").or_else(|| f.get("input")))
        .and_then(Value::as_str)
        .unwrap_or("");
    (name, args)
}

pub fn part_type(part: &Value) -> &str {
    part.get("type").and_then(Value::as_str).unwrap_or("")
}

pub fn is_media_part(part: &Value) -> bool {
    matches!(
        part_type(part),
        "image_url" | "input_image" | "image" | "input_audio" | "audio" | "file" | "input_file"
    )
}

/// Lengths of the texts of a content value that `cut_texts` may shorten.
fn text_lens(content: &Value) -> Vec<usize> {
    match content {
        Value::String(s) => vec![s.len()],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(str::len)
            .collect(),
        _ => Vec::new(),
    }
}

/// `content` with its texts (`total` characters in all) cut in proportion so that about
/// `keep` characters remain.
fn cut_texts(content: &Value, keep: usize, total: usize) -> Value {
    let cut = |s: &str| {
        let share = s.len().saturating_mul(keep) / total.max(1);
        keep_ends(s, share * 2 / 3, share / 3)
    };
    match content {
        Value::String(s) => Value::String(cut(s)),
        Value::Array(parts) => Value::Array(
            parts
                .iter()
                .map(|p| {
                    let mut p = p.clone();
                    if let Some(Value::String(t)) = p.get_mut("text") {
                        *t = cut(t);
                    }
                    p
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Text of a `content` value; media and unknown parts contribute nothing.
pub fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts.iter().filter_map(part_text).collect();
            texts.join("\n")
        }
        _ => String::new(),
    }
}

/// The text of a `text` (or `refusal`) content part.
pub fn part_text(part: &Value) -> Option<&str> {
    match part_type(part) {
        "text" | "input_text" | "output_text" => part.get("text").and_then(Value::as_str),
        "refusal" => part.get("refusal").and_then(Value::as_str),
        _ => None,
    }
}

/// Cuts `s` to at most `max` bytes on a char boundary.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The last at most `max` bytes of `s`, starting on a char boundary.
pub fn clip_end(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Keeps the beginning and the end of a long text with a note of how much was cut.
/// Secrets are masked before the cut: a cut through a key would keep part of it and drop
/// the prefix the redactor knows it by.
pub fn keep_ends(s: &str, head: usize, tail: usize) -> String {
    if s.len() <= head + tail + 64 {
        return s.to_string();
    }
    let masked = crate::redact::redact(s);
    let s = masked.as_ref();
    if s.len() <= head + tail + 64 {
        return s.to_string();
    }
    let a = clip(s, head);
    let b = clip_end(s, tail);
    let cut = s.len() - a.len() - b.len();
    format!("{a}\n[... {cut} characters omitted by compaction ...]\n{b}")
}

/// A short single-line preview of a text.
/// Secrets are masked before the text is clipped.
pub fn one_line(s: &str, max: usize) -> String {
    let masked = crate::redact::redact(s);
    // Line breaks and tabs join the lines with one space; the spaces inside a line stay
    // as written, so an error line is quoted exactly (`FATAL:  database "x" does not
    // exist`, which a search for the message finds only with both spaces).
    let mut flat = String::new();
    for piece in clip(masked.trim(), max * 4).split(char::is_control) {
        let piece = piece.trim();
        if !piece.is_empty() {
            if !flat.is_empty() {
                flat.push(' ');
            }
            flat.push_str(piece);
        }
    }
    if flat.len() > max {
        format!("{}...", clip(&flat, max))
    } else {
        flat
    }
}

/// Parses a JSON array of messages for the passes' unit tests, counting with o200k.
#[cfg(test)]
pub(crate) fn parse_test_messages(v: &Value) -> Vec<Message> {
    let counter = Counter::new(super::tokens::Encoding::O200k);
    v.as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, m)| Message::parse(i, m, &counter).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_respects_char_boundaries() {
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip_end("héllo", 4), "llo");
        assert_eq!(clip("abc", 10), "abc");
    }

    #[test]
    fn keep_ends_notes_the_cut() {
        let s = "a".repeat(500) + &"b".repeat(500);
        let kept = keep_ends(&s, 100, 100);
        assert!(kept.starts_with(&"a".repeat(100)));
        assert!(kept.ends_with(&"b".repeat(100)));
        assert!(kept.contains("800 characters omitted"));
    }

    #[test]
    fn cut_to_keeps_both_ends_within_the_budget() {
        let counter = Counter::new(super::super::tokens::Encoding::O200k);
        let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let v = serde_json::json!({"role": "tool", "tool_call_id": "a", "content": text});
        let mut m = Message::parse(0, &v, &counter).unwrap();
        let before = m.tokens;
        assert!(m.cut_to(before / 4, &counter));
        assert!(m.tokens <= before / 4, "{} > {}", m.tokens, before / 4);
        assert!(
            m.tokens > before / 8,
            "cut far more than asked: {}",
            m.tokens
        );
        let t = m.text();
        assert!(t.starts_with("line 0\n") && t.ends_with("line 1999\n"));
        assert!(t.contains("characters omitted by compaction"));
    }

    #[test]
    fn one_line_joins_lines_and_keeps_a_line_as_written() {
        assert_eq!(one_line("  a\n\tb c ", 80), "a b c");
        assert_eq!(
            one_line("FATAL:  database \"x\" does not exist\n", 80),
            "FATAL:  database \"x\" does not exist"
        );
        assert_eq!(one_line("abcdef", 3), "abc...");
    }
}
