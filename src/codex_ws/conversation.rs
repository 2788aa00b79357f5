//! What one bridged connection has said so far, and each `response.create` frame made
//! into the whole `POST .../responses` body the upstream needs.
//!
//! On a Responses WebSocket, Codex sends a turn's first request whole, and each later one
//! as `previous_response_id` plus only the items after what that response saw and said
//! (codex-rs `get_incremental_items`: the earlier request's `input`, then the output items
//! of its response, are the new input's prefix). OpenAI keeps that prefix on its side of
//! the connection; over HTTP the upstream needs it sent again, so the bridge keeps it here
//! and puts it back in front of the frame's items.

use serde::Serialize;
use serde_json::{Map, Value};

/// The connection's last completed response and the whole input it answered.
#[derive(Default)]
pub struct Conversation {
    last: Option<Exchange>,
}

struct Exchange {
    /// The response's id, as its `response.completed` event gave it.
    id: String,
    /// The input it answered, then its output items: the prefix a frame naming `id` as
    /// its `previous_response_id` continues.
    items: Vec<Value>,
}

/// What a frame asks of the bridge.
#[derive(Debug)]
pub enum Frame {
    /// A response to make, upstream (`warmup: false`) or, for Codex's warm-up that asks
    /// for no output (`generate: false`), by the bridge itself.
    Create(Create),
    /// A frame of another type (Codex's `response.processed`): nothing is answered.
    Other(String),
}

/// A `response.create` frame, resolved against the conversation.
#[derive(Debug)]
pub struct Create {
    /// The request's other fields, as the frame had them; `stream` set.
    fields: Map<String, Value>,
    /// The whole input: the remembered prefix, when the frame continues the last
    /// response, then the frame's own items.
    pub input: Vec<Value>,
    /// `generate: false`: a warm-up, answered with an empty response.
    pub warmup: bool,
}

impl Create {
    /// The `POST .../responses` body: the frame's fields and the whole input.
    pub fn body(&self) -> Result<Vec<u8>, serde_json::Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(flatten)]
            fields: &'a Map<String, Value>,
            input: &'a [Value],
        }
        serde_json::to_vec(&Body {
            fields: &self.fields,
            input: &self.input,
        })
    }
}

/// Why a frame cannot be carried.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the frame is not a JSON object")]
    NotJson(#[source] serde_json::Error),
    #[error("the frame has no \"type\"")]
    NoType,
}

impl Conversation {
    /// Reads one text frame. A `previous_response_id` naming this connection's last
    /// response is resolved (and taken off: the upstream never saw that response); one
    /// naming any other stays, for the upstream to judge, with the frame's items as the
    /// input.
    pub fn read(&self, text: &str) -> Result<Frame, FrameError> {
        let mut fields: Map<String, Value> =
            serde_json::from_str(text).map_err(FrameError::NotJson)?;
        let kind = match fields.remove("type") {
            Some(Value::String(kind)) => kind,
            _ => return Err(FrameError::NoType),
        };
        if kind != "response.create" {
            return Ok(Frame::Other(kind));
        }
        // Not a field of the HTTP API: over HTTP every request generates.
        let warmup = fields.remove("generate") == Some(Value::Bool(false));
        let own = items(fields.remove("input"));
        let continued = match (&self.last, fields.get("previous_response_id")) {
            (Some(last), Some(Value::String(id))) if *id == last.id => Some(&last.items),
            _ => None,
        };
        let input = match continued {
            Some(prefix) => {
                fields.remove("previous_response_id");
                let mut input = Vec::with_capacity(prefix.len() + own.len());
                input.extend_from_slice(prefix);
                input.extend(own);
                input
            }
            None => own,
        };
        fields.insert("stream".into(), Value::Bool(true));
        Ok(Frame::Create(Create {
            fields,
            input,
            warmup,
        }))
    }

    /// The response `id` answered `input` with `output`: a later frame may continue it.
    pub fn answered(&mut self, id: String, mut input: Vec<Value>, output: Vec<Value>) {
        input.extend(output);
        self.last = Some(Exchange { id, items: input });
    }
}

/// A request's `input` as a list of items: the API also takes a plain string, one user
/// message.
fn items(input: Option<Value>) -> Vec<Value> {
    match input {
        Some(Value::Array(items)) => items,
        Some(Value::String(text)) => vec![serde_json::json!({
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        })],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(conversation: &Conversation, frame: Value) -> Create {
        match conversation.read(&frame.to_string()).unwrap() {
            Frame::Create(create) => create,
            other => panic!("{other:?}"),
        }
    }

    fn body(create: &Create) -> Value {
        serde_json::from_slice(&create.body().unwrap()).unwrap()
    }

    #[test]
    fn a_continued_frame_gets_the_last_input_and_output_in_front_of_its_own() {
        let mut conversation = Conversation::default();
        let first = create(
            &conversation,
            json!({"type": "response.create", "model": "m", "input": [{"n": 1}], "generate": false}),
        );
        assert!(first.warmup);
        let sent = body(&first);
        assert_eq!(
            sent,
            json!({"model": "m", "stream": true, "input": [{"n": 1}]})
        );
        conversation.answered("r1".into(), first.input, vec![json!({"n": 2})]);

        let next = create(
            &conversation,
            json!({"type": "response.create", "model": "m", "previous_response_id": "r1", "input": [{"n": 3}]}),
        );
        assert!(!next.warmup);
        assert_eq!(
            body(&next),
            json!({"model": "m", "stream": true, "input": [{"n": 1}, {"n": 2}, {"n": 3}]})
        );
    }

    #[test]
    fn an_unknown_previous_response_goes_upstream_as_sent() {
        let mut conversation = Conversation::default();
        conversation.answered("r1".into(), vec![json!({"n": 1})], Vec::new());
        let other = create(
            &conversation,
            json!({"type": "response.create", "previous_response_id": "r0", "input": "hi"}),
        );
        assert_eq!(
            body(&other),
            json!({"previous_response_id": "r0", "stream": true, "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
        );
    }

    #[test]
    fn other_frames_and_bad_ones_are_told_apart() {
        let conversation = Conversation::default();
        let processed = conversation
            .read(r#"{"type":"response.processed","response_id":"r1"}"#)
            .unwrap();
        assert!(matches!(processed, Frame::Other(kind) if kind == "response.processed"));
        assert!(matches!(
            conversation.read("[1]"),
            Err(FrameError::NotJson(_))
        ));
        assert!(matches!(
            conversation.read(r#"{"input":[]}"#),
            Err(FrameError::NoType)
        ));
    }

    proptest::proptest! {
        /// However Codex cuts a conversation into frames (each continuing the response
        /// before it, with the items after that response's output), every request goes
        /// upstream with the whole conversation so far, and without the response id.
        #[test]
        fn any_cut_of_a_conversation_goes_upstream_whole(
            cuts in proptest::collection::vec((0usize..4, 0usize..3), 1..12),
        ) {
            let mut conversation = Conversation::default();
            let mut whole: Vec<Value> = Vec::new();
            let mut previous: Option<String> = None;
            for (turn, (new, outputs)) in cuts.into_iter().enumerate() {
                let own: Vec<Value> = (0..new).map(|i| json!({"turn": turn, "in": i})).collect();
                let mut frame = json!({"type": "response.create", "model": "m", "input": own});
                if let Some(id) = &previous {
                    frame["previous_response_id"] = id.clone().into();
                }
                let create = create(&conversation, frame);
                whole.extend(own);
                let sent = body(&create);
                proptest::prop_assert_eq!(&sent["input"], &Value::from(whole.clone()));
                proptest::prop_assert!(sent.get("previous_response_id").is_none());
                let output: Vec<Value> = (0..outputs).map(|i| json!({"turn": turn, "out": i})).collect();
                whole.extend(output.iter().cloned());
                let id = format!("r{turn}");
                conversation.answered(id.clone(), create.input, output);
                previous = Some(id);
            }
        }
    }
}
