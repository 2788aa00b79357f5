//! Server-sent events at the head of a streaming answer.
//!
//! Several servers answer a streamed request with 200 and report the overflow in the first
//! event. The proxy holds the head of the stream, feeds the growing buffer to
//! [`inspect_stream_head`] and commits the status line only once it says `Pass` (real output
//! started) or `Error` (an in-band error, classified).

use serde_json::Value;

use super::{decide_in_band, silent_overflow, Classification, SCAN_LIMIT};

/// One server-sent event. Unknown fields (`id`, `retry`) are dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` name, if any.
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
    /// A non-standard `error:` field, as sent by llama.cpp before b6500.
    pub error: Option<String>,
}

/// What one event says about the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventClass {
    /// Nothing decisive yet (a role-only chunk, `response.created`, an empty event).
    Preamble,
    /// Real output, or the normal end of the stream.
    Content,
    /// An in-band error.
    Error(Classification),
}

/// What the head of a streaming answer says so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamHead {
    /// No decisive event yet: read more (within the proxy's byte and time bounds).
    NeedMore,
    /// Real output started, or nothing decisive fits in the scan limit: commit and pass through.
    Pass,
    /// The stream opens with an error; the classification says which kind.
    Error(Classification),
}

/// Finds the first complete event in `buf`, skipping comments and blank lines before it.
/// Returns it with the number of bytes it spans, or `None` until its blank line has arrived.
pub fn next_event(buf: &[u8]) -> Option<(SseEvent, usize)> {
    let mut ev = SseEvent::default();
    let mut has_field = false;
    let mut has_data = false;
    let mut pos = 0;
    while let Some((line, next)) = next_line(buf, pos) {
        pos = next;
        if line.is_empty() {
            if has_field {
                return Some((ev, pos));
            }
            continue;
        }
        if line.first() == Some(&b':') {
            continue;
        }
        has_field |= add_field(&mut ev, line, &mut has_data);
    }
    None
}

/// The line starting at `pos` and where the next one starts. A final `\r` waits for the next
/// byte, which may be its `\n`, so that every chunk split yields the same lines.
fn next_line(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(pos..)?;
    let end = rest.iter().position(|&b| b == b'\n' || b == b'\r')?;
    let next = match (rest[end], rest.get(end + 1)) {
        (b'\r', Some(b'\n')) => end + 2,
        (b'\r', None) => return None,
        _ => end + 1,
    };
    Some((&rest[..end], pos + next))
}

fn add_field(ev: &mut SseEvent, line: &[u8], has_data: &mut bool) -> bool {
    let (name, value) = match line.iter().position(|&b| b == b':') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &line[line.len()..]),
    };
    let value = String::from_utf8_lossy(value.strip_prefix(b" ").unwrap_or(value));
    match name {
        b"data" => {
            if *has_data {
                ev.data.push('\n');
            }
            ev.data.push_str(&value);
            *has_data = true;
        }
        b"event" => ev.event = Some(value.into_owned()),
        b"error" => ev.error = Some(value.into_owned()),
        _ => return false,
    }
    true
}

/// Event types that open a stream without saying anything yet.
const PREAMBLE_TYPES: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.queued",
    "message_start",
    "ping",
];

/// Event names that announce an error whatever the data looks like.
const ERROR_EVENTS: &[&str] = &["error", "response.failed", "response.error"];

/// Tells an error event from a real content chunk.
pub fn classify_event(ev: &SseEvent) -> EventClass {
    if let Some(err) = &ev.error {
        return EventClass::Error(payload_error(err));
    }
    let named_error = ev
        .event
        .as_deref()
        .is_some_and(|e| ERROR_EVENTS.contains(&e));
    let data = ev.data.trim();
    if named_error {
        return EventClass::Error(payload_error(data));
    }
    if data.is_empty() {
        return EventClass::Preamble;
    }
    match serde_json::from_str::<Value>(data) {
        Ok(v) => classify_json_event(&v),
        Err(_) => EventClass::Content,
    }
}

fn payload_error(payload: &str) -> Classification {
    let signals = match serde_json::from_str::<Value>(payload.trim()) {
        Ok(v) => super::signals::Signals::from_json(&v),
        Err(_) => super::signals::Signals::from_text(payload),
    };
    decide_in_band(&signals)
}

fn classify_json_event(v: &Value) -> EventClass {
    if let Some(c) = super::in_band_error(v) {
        return EventClass::Error(c);
    }
    if v["type"]
        .as_str()
        .is_some_and(|t| PREAMBLE_TYPES.contains(&t))
    {
        return EventClass::Preamble;
    }
    let Some(choices) = v["choices"].as_array() else {
        return EventClass::Content;
    };
    // Azure opens with an empty `choices` carrying filter results: not output yet.
    let Some(choice) = choices.first() else {
        return EventClass::Preamble;
    };
    if let Some(c) = silent_overflow(choice, &v["usage"]) {
        return EventClass::Error(c);
    }
    if choice["finish_reason"].is_null() && !super::has_output(&choice["delta"]) {
        return EventClass::Preamble;
    }
    EventClass::Content
}

/// Reads the head of a streaming answer: skips preamble events and returns at the first
/// content or error event. `eof` says the upstream closed, so a last event without its
/// blank line counts as complete. Each call scans from the start of `buf`, at most
/// [`SCAN_LIMIT`] bytes; a caller fed many tiny chunks can instead walk [`next_event`] and
/// [`classify_event`] from its own offset.
pub fn inspect_stream_head(buf: &[u8], eof: bool) -> StreamHead {
    let buf = &buf[..buf.len().min(SCAN_LIMIT)];
    let buf = buf.strip_prefix(b"\xef\xbb\xbf").unwrap_or(buf);
    let start = buf.iter().position(|b| !b.is_ascii_whitespace());
    if let Some(i) = start.filter(|&i| matches!(buf[i], b'{' | b'[')) {
        return json_head(&buf[i..], eof);
    }
    let mut rest = buf;
    while let Some((ev, used)) = next_event(rest) {
        rest = &rest[used..];
        match classify_event(&ev) {
            EventClass::Preamble => {}
            EventClass::Content => return StreamHead::Pass,
            EventClass::Error(c) => return StreamHead::Error(c),
        }
    }
    if eof {
        return last_event(rest);
    }
    if buf.len() >= SCAN_LIMIT {
        return StreamHead::Pass;
    }
    StreamHead::NeedMore
}

fn last_event(rest: &[u8]) -> StreamHead {
    let mut closed = rest.to_vec();
    closed.extend_from_slice(b"\n\n");
    match next_event(&closed).map(|(ev, _)| classify_event(&ev)) {
        Some(EventClass::Error(c)) => StreamHead::Error(c),
        _ => StreamHead::Pass,
    }
}

/// Some servers put a plain JSON error body into a stream instead of an event.
fn json_head(buf: &[u8], eof: bool) -> StreamHead {
    let mut values = serde_json::Deserializer::from_slice(buf).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => match super::classify_ok_json(&v) {
            Some(c) => StreamHead::Error(c),
            None => StreamHead::Pass,
        },
        Some(Err(e)) if e.is_eof() && !eof && buf.len() < SCAN_LIMIT => StreamHead::NeedMore,
        _ => StreamHead::Pass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Kind;

    /// Parses a stream the way the proxy sees it: bytes arrive in pieces, complete events are
    /// taken off the front of the buffer.
    fn feed(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some((ev, used)) = next_event(&buf) {
                out.push(ev);
                buf.drain(..used);
            }
        }
        out
    }

    const STREAM: &[u8] = b": keep-alive\r\n\r\nevent: response.created\r\ndata: {\"type\":\"response.created\"}\r\n\r\ndata: line one\ndata:line two\nid: 7\nretry: 10\n\n: only a comment\n\nerror: {\"code\":400}\n\ndata: a\r\rdata: b\r\r\nevent: ping\n\ndata: \xe2\x9c\x93\n\n";

    #[test]
    fn framing_variants() {
        let events = feed(&[STREAM]);
        let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(
            data,
            [
                "{\"type\":\"response.created\"}",
                "line one\nline two",
                "",
                "a",
                "b",
                "",
                "\u{2713}"
            ]
        );
        assert_eq!(events[0].event.as_deref(), Some("response.created"));
        assert_eq!(events[2].error.as_deref(), Some("{\"code\":400}"));
        assert_eq!(events[5].event.as_deref(), Some("ping"));
    }

    #[test]
    fn every_split_yields_the_same_events() {
        let whole = feed(&[STREAM]);
        for k in 0..=STREAM.len() {
            assert_eq!(feed(&[&STREAM[..k], &STREAM[k..]]), whole, "split at {k}");
        }
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(feed(&bytes), whole);
    }

    #[test]
    fn incomplete_events_wait() {
        assert_eq!(next_event(b""), None);
        assert_eq!(next_event(b": comment\n\n"), None);
        assert_eq!(next_event(b"data: {\"a\":1}\n"), None);
        assert_eq!(next_event(b"data: x\r\n\r"), None);
        assert!(next_event(b"data: x\r\n\r\n").is_some());
    }

    fn ev(data: &str) -> SseEvent {
        SseEvent {
            data: data.to_string(),
            ..SseEvent::default()
        }
    }

    #[test]
    fn content_and_preamble_chunks() {
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(classify_event(&ev(role)), EventClass::Preamble);
        let tool = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}"#;
        assert_eq!(classify_event(&ev(tool)), EventClass::Content);
        let think =
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"Hm"},"finish_reason":null}]}"#;
        assert_eq!(classify_event(&ev(think)), EventClass::Content);
        let stop = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        assert_eq!(classify_event(&ev(stop)), EventClass::Content);
        assert_eq!(classify_event(&ev("[DONE]")), EventClass::Content);
        assert_eq!(classify_event(&ev("not json")), EventClass::Content);
        let azure = r#"{"choices":[],"prompt_filter_results":[]}"#;
        assert_eq!(classify_event(&ev(azure)), EventClass::Preamble);
        let gemini = r#"{"candidates":[{"content":{}}]}"#;
        assert_eq!(classify_event(&ev(gemini)), EventClass::Content);
        assert_eq!(classify_event(&ev("")), EventClass::Preamble);
    }

    #[test]
    fn error_events() {
        let named = SseEvent {
            event: Some("error".into()),
            data: "Context size has been exceeded.".into(),
            error: None,
        };
        match classify_event(&named) {
            EventClass::Error(c) => assert_eq!(c.kind, Kind::ContextOverflow),
            other => panic!("{other:?}"),
        }
        let limited = ev(r#"{"error":{"code":429,"message":"prompt is too long"}}"#);
        match classify_event(&limited) {
            EventClass::Error(c) => assert_eq!(c.kind, Kind::Other),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn head_waits_then_decides() {
        let role = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
        assert_eq!(inspect_stream_head(role, false), StreamHead::NeedMore);
        assert_eq!(inspect_stream_head(role, true), StreamHead::Pass);
        assert_eq!(inspect_stream_head(b"", false), StreamHead::NeedMore);
        assert_eq!(inspect_stream_head(b"", true), StreamHead::Pass);
        assert_eq!(
            inspect_stream_head(b"{\"error\":", false),
            StreamHead::NeedMore
        );
        let tail = b"data: {\"error\":{\"message\":\"the context window is full\"}}";
        assert_eq!(inspect_stream_head(tail, false), StreamHead::NeedMore);
        assert!(matches!(
            inspect_stream_head(tail, true),
            StreamHead::Error(_)
        ));
    }

    #[test]
    fn head_skips_bom_and_empty_errors() {
        let bom = b"\xef\xbb\xbfdata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        assert_eq!(inspect_stream_head(bom, false), StreamHead::Pass);
        let empty = b"data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        assert_eq!(inspect_stream_head(empty, false), StreamHead::Pass);
    }

    #[test]
    fn head_is_bounded() {
        let mut big = b"data: ".to_vec();
        big.extend(std::iter::repeat_n(b'x', SCAN_LIMIT * 2));
        assert_eq!(inspect_stream_head(&big, false), StreamHead::Pass);
        let comments = b": pad\n\n".repeat(SCAN_LIMIT / 4);
        assert_eq!(inspect_stream_head(&comments, false), StreamHead::Pass);
    }
}
