//! The API dialects the proxy compacts, as adapters around the one engine: each reads a
//! request's steering fields, gives the chat-completions view the engine and the retry
//! loop work on, and writes the compacted view back into the client's own request.
//! Chat completions is the view itself; `responses` is the Responses API; `messages` is
//! Anthropic's Messages API.

pub mod chat;
pub mod codex_items;
pub mod messages;
pub mod responses;

use serde_json::Value;

/// The few top-level fields of a request that steer compaction, named as the engine's
/// chat view names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Steering {
    pub model: String,
    pub stream: bool,
    /// The completion cap the client asked for.
    pub max_output: Option<u64>,
    /// The view's field holding it, to lower the same one.
    pub max_output_field: Option<&'static str>,
}

/// What every dialect's summariser request is written from: the summariser's chat request
/// is a system prompt, one user message, a cap and maybe a temperature.
pub(crate) struct SummaryParts<'a> {
    pub system: Value,
    pub user: Value,
    pub cap: Option<u64>,
    pub temperature: Option<&'a Value>,
}

impl SummaryParts<'_> {
    pub(crate) fn of(chat: &Value) -> SummaryParts<'_> {
        let messages = chat["messages"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let text = |role: &str| {
            messages
                .iter()
                .find(|m| m["role"] == role)
                .map(|m| m["content"].clone())
                .unwrap_or_default()
        };
        SummaryParts {
            system: text("system"),
            user: text("user"),
            cap: chat
                .get("max_completion_tokens")
                .or_else(|| chat.get("max_tokens"))
                .and_then(Value::as_u64),
            temperature: chat.get("temperature"),
        }
    }
}

/// Which API a compacted request speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `POST .../chat/completions`.
    Chat,
    /// `POST .../responses`.
    Responses,
    /// `POST .../messages` (Anthropic).
    Messages,
}

impl Dialect {
    /// The dialect a `POST` to `path` speaks, if the proxy compacts it.
    pub fn of_path(path: &str) -> Option<Dialect> {
        if path.ends_with("/chat/completions") {
            Some(Dialect::Chat)
        } else if path.ends_with("/responses") {
            Some(Dialect::Responses)
        } else if path.ends_with("/messages") {
            // `/v1/messages/count_tokens` and `/v1/messages/batches` end otherwise: they
            // pass through.
            Some(Dialect::Messages)
        } else {
            None
        }
    }

    pub const ALL: [Dialect; 3] = [Dialect::Chat, Dialect::Responses, Dialect::Messages];

    /// The API's name in metrics labels and log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Responses => "responses",
            Dialect::Messages => "messages",
        }
    }

    /// The fields that steer compaction, or `None` for a body the upstream should judge
    /// as it is (not JSON, no conversation, a conversation the upstream holds).
    pub fn steering(self, body: &[u8]) -> Option<Steering> {
        match self {
            Dialect::Chat => chat::steering(body),
            Dialect::Responses => responses::steering(body),
            Dialect::Messages => messages::steering(body),
        }
    }

    /// The chat view of the client's request, and (for the dialects that are not chat)
    /// the request itself, which the view is written back into.
    pub fn view(self, body: &[u8]) -> Option<(Value, Option<Value>)> {
        let request: Value = serde_json::from_slice(body).ok()?;
        match self {
            Dialect::Chat => Some((request, None)),
            Dialect::Responses => Some((responses::to_chat(&request)?, Some(request))),
            Dialect::Messages => Some((messages::to_chat(&request)?, Some(request))),
        }
    }

    /// The bytes to send for `view`, written into `source` for the dialects that are not
    /// chat.
    pub fn encode(self, view: &Value, source: Option<&Value>) -> Option<Vec<u8>> {
        match (self, source) {
            (Dialect::Responses, Some(source)) => responses::encode(view, source),
            (Dialect::Messages, Some(source)) => messages::encode(view, source),
            _ => serde_json::to_vec(view).ok(),
        }
    }

    /// `sent` with its completion cap set to `cap`.
    pub fn with_output_cap(self, sent: &[u8], field: &str, cap: u64) -> Option<Vec<u8>> {
        let field = match self {
            Dialect::Chat => field,
            Dialect::Responses => "max_output_tokens",
            // `max_tokens`, with a thinking budget that must stay below it.
            Dialect::Messages => return messages::with_output_cap(sent, cap),
        };
        let mut request: Value = serde_json::from_slice(sent).ok()?;
        request
            .as_object_mut()?
            .insert(field.into(), Value::from(cap));
        serde_json::to_vec(&request).ok()
    }
}
