//! Collecting the summariser's streamed answer from its server-sent events.

use serde_json::Value;

use crate::classify::{next_event, SseEvent};

/// What a finished stream produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamedAnswer {
    /// `choices[0].delta.content` of every chunk, concatenated.
    pub text: String,
    /// The last `finish_reason` seen (`length` means the answer was cut by `max_tokens`).
    pub finish_reason: Option<String>,
    /// The message of an in-band error event, if one arrived.
    pub error: Option<String>,
    /// The prompt's tokens as the upstream counted them, when its answer says.
    pub prompt_tokens: Option<u64>,
}

/// Feeds on a streamed chat completion in whatever pieces the network delivers.
#[derive(Debug, Default)]
pub struct AnswerStream {
    pending: Vec<u8>,
    answer: StreamedAnswer,
    events: usize,
    done: bool,
}

impl AnswerStream {
    pub fn new() -> AnswerStream {
        AnswerStream::default()
    }

    /// Takes the next bytes of the body and parses every event they complete.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        // An event ends at a line break; without one in the new bytes nothing completed,
        // so a large event arriving in small pieces is not rescanned each time.
        if bytes.iter().any(|&b| b == b'\n' || b == b'\r') {
            self.drain();
        }
    }

    /// Whether `data: [DONE]` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The text collected so far.
    #[cfg(test)]
    pub fn text(&self) -> &str {
        &self.answer.text
    }

    /// Ends the stream: a last event without its blank line still counts, and a plain JSON
    /// completion (a server that ignored `stream: true`) is read whole.
    pub fn finish(mut self) -> StreamedAnswer {
        self.drain();
        let rest = std::mem::take(&mut self.pending);
        let trimmed = rest.trim_ascii();
        if self.events == 0 && trimmed.first() == Some(&b'{') {
            if let Ok(v) = serde_json::from_slice::<Value>(trimmed) {
                self.take_completion(&v);
            }
        } else if !trimmed.is_empty() {
            let mut closed = rest;
            closed.extend_from_slice(b"\n\n");
            if let Some((ev, _)) = next_event(&closed) {
                self.take_event(&ev);
            }
        }
        self.answer
    }

    fn drain(&mut self) {
        let mut used = 0;
        while let Some((ev, n)) = next_event(&self.pending[used..]) {
            used += n;
            self.take_event(&ev);
        }
        self.pending.drain(..used);
    }

    fn take_event(&mut self, ev: &SseEvent) {
        self.events += 1;
        let data = ev.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        if let Some(err) = &ev.error {
            self.answer.error = Some(err.clone());
            return;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => self.take_chunk(&v),
            Err(_) if ev.event.as_deref() == Some("error") => {
                self.answer.error = Some(data.to_string());
            }
            Err(_) => {}
        }
    }

    fn take_chunk(&mut self, v: &Value) {
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let message = err.get("message").and_then(Value::as_str);
            self.answer.error = Some(message.map_or_else(|| err.to_string(), str::to_string));
            return;
        }
        if let Some(kind) = v.get("type").and_then(Value::as_str) {
            match kind.starts_with("response.") {
                true => self.take_responses_event(kind, v),
                false => self.take_messages_event(kind, v),
            }
            return;
        }
        self.take_chat(v, "delta");
    }

    /// A chat answer's first choice, where the text is in `part` (`delta` in a streamed
    /// chunk, `message` in a whole answer), why it stopped, and the prompt's count.
    fn take_chat(&mut self, v: &Value, part: &str) {
        let choice = &v["choices"][0];
        if let Some(s) = choice[part]["content"].as_str() {
            self.answer.text.push_str(s);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.answer.finish_reason = Some(reason.to_string());
        }
        self.take_usage(&v["usage"]["prompt_tokens"]);
    }

    fn take_usage(&mut self, tokens: &Value) {
        if let Some(n) = tokens.as_u64() {
            self.answer.prompt_tokens = Some(n);
        }
    }

    /// An event of a streamed Responses answer: text deltas, then a completed (or
    /// incomplete, or failed) response.
    fn take_responses_event(&mut self, kind: &str, v: &Value) {
        match kind {
            "response.output_text.delta" => {
                if let Some(s) = v["delta"].as_str() {
                    self.answer.text.push_str(s);
                }
            }
            "response.completed" => {
                self.answer.finish_reason = Some("stop".into());
                self.take_usage(&v["response"]["usage"]["input_tokens"]);
                self.done = true;
            }
            "response.incomplete" => {
                self.answer.finish_reason = Some("length".into());
                self.done = true;
            }
            "response.failed" | "error" => {
                let error = &v["response"]["error"];
                let message = error["message"].as_str().or(v["message"].as_str());
                self.answer.error = Some(message.unwrap_or("failed").to_string());
            }
            _ => {}
        }
    }

    /// An event of a streamed Messages answer: the prompt's count as the message starts,
    /// text deltas, the stop reason, the end.
    fn take_messages_event(&mut self, kind: &str, v: &Value) {
        match kind {
            "message_start" => self.take_messages_usage(&v["message"]["usage"]),
            "content_block_delta" if v["delta"]["type"] == "text_delta" => {
                if let Some(s) = v["delta"]["text"].as_str() {
                    self.answer.text.push_str(s);
                }
            }
            "message_delta" => self.take_stop_reason(&v["delta"]["stop_reason"]),
            "message_stop" => self.done = true,
            _ => {}
        }
    }

    /// Anthropic's count of the prompt leaves out what it read from or wrote to its
    /// prompt cache: the prompt is all three.
    fn take_messages_usage(&mut self, usage: &Value) {
        let fields = [
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ];
        let counts: Vec<u64> = fields.iter().filter_map(|f| usage[f].as_u64()).collect();
        if !counts.is_empty() {
            self.answer.prompt_tokens = Some(counts.iter().sum());
        }
    }

    /// `max_tokens` is a cut answer, as chat's `length`.
    fn take_stop_reason(&mut self, reason: &Value) {
        if let Some(reason) = reason.as_str() {
            let reason = if reason == "max_tokens" {
                "length"
            } else {
                reason
            };
            self.answer.finish_reason = Some(reason.to_string());
        }
    }

    fn take_completion(&mut self, v: &Value) {
        if v["type"] == "message" {
            // A Messages answer, whole.
            for block in v["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                if let (Some("text"), Some(s)) = (block["type"].as_str(), block["text"].as_str()) {
                    self.answer.text.push_str(s);
                }
            }
            self.take_stop_reason(&v["stop_reason"]);
            self.take_messages_usage(&v["usage"]);
            return;
        }
        self.take_chat(v, "message");
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            self.answer.error = Some(err.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"## Active \"},\"finish_reason\":null}]}\r\n\r\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Task\\nNon\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"e. \u{2713} caf\u{e9}\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":812,\"completion_tokens\":9}}\n\n",
        "data: [DONE]\n\n",
    );

    fn collect(chunks: &[&[u8]]) -> StreamedAnswer {
        let mut s = AnswerStream::new();
        for c in chunks {
            s.feed(c);
        }
        s.finish()
    }

    #[test]
    fn reads_a_streamed_responses_answer() {
        let a = collect(&[
            b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n",
            b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"## Go\"}\n\n",
            b"data: {\"type\":\"response.output_text.delta\",\"delta\":\"al\"}\n\n",
            b"data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n",
        ]);
        assert_eq!(a.text, "## Goal");
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
        assert_eq!(a.error, None);
        let failed = collect(&[
            b"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"message\":\"too long\"}}}\n\n",
        ]);
        assert_eq!(failed.error.as_deref(), Some("too long"));
    }

    #[test]
    fn reads_a_streamed_messages_answer_and_its_whole_prompt_count() {
        let a = collect(&[
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":800,\"cache_creation_input_tokens\":30,\"output_tokens\":1}}}\n\n",
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n",
            b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"## Go\"}}\n\n",
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"al\"}}\n\n",
            b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":9}}\n\n",
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ]);
        assert_eq!(a.text, "## Goal");
        assert_eq!(a.finish_reason.as_deref(), Some("length"));
        assert_eq!(a.prompt_tokens, Some(842));
        let overloaded = collect(&[
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        ]);
        assert_eq!(overloaded.error.as_deref(), Some("Overloaded"));
        let whole = collect(&[br###"{"type":"message","content":[{"type":"text","text":"## Goal"}],"stop_reason":"end_turn","usage":{"input_tokens":7}}"###]);
        assert_eq!(
            (whole.text.as_str(), whole.prompt_tokens),
            ("## Goal", Some(7))
        );
        assert_eq!(whole.finish_reason.as_deref(), Some("end_turn"));
    }

    #[test]
    fn concatenates_content_deltas() {
        let mut s = AnswerStream::new();
        s.feed(STREAM.as_bytes());
        assert!(s.is_done());
        assert_eq!(s.text(), "## Active Task\nNone. \u{2713} caf\u{e9}");
        let a = s.finish();
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
        assert_eq!(a.error, None);
        assert_eq!(a.prompt_tokens, Some(812));
    }

    #[test]
    fn every_split_gives_the_same_answer() {
        let bytes = STREAM.as_bytes();
        let whole = collect(&[bytes]);
        for k in 0..=bytes.len() {
            assert_eq!(collect(&[&bytes[..k], &bytes[k..]]), whole, "split at {k}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(collect(&singles), whole);
        let threes: Vec<&[u8]> = bytes.chunks(3).collect();
        assert_eq!(collect(&threes), whole);
    }

    #[test]
    fn a_last_event_without_blank_line_counts() {
        let a = collect(&[b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}"]);
        assert_eq!(a.text, "hi");
    }

    #[test]
    fn reads_a_plain_json_completion() {
        let body = br###"{"choices":[{"message":{"role":"assistant","content":"## Goal\nX"},"finish_reason":"length"}],"usage":{"prompt_tokens":321}}"###;
        let a = collect(&[&body[..10], &body[10..]]);
        assert_eq!(a.text, "## Goal\nX");
        assert_eq!(a.finish_reason.as_deref(), Some("length"));
        assert_eq!(a.prompt_tokens, Some(321));
    }

    #[test]
    fn records_in_band_errors() {
        let a = collect(&[b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n"]);
        assert_eq!(a.error.as_deref(), Some("overloaded"));
        let named = collect(&[b"event: error\ndata: upstream went away\n\n"]);
        assert_eq!(named.error.as_deref(), Some("upstream went away"));
        assert_eq!(named.text, "");
    }
}
