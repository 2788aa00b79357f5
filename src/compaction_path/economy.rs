//! Economy mode on the path: before the loop sees a request, its old tool outputs are
//! shortened ([`crate::engine::economy`]), and the shortened request is the one the loop
//! works from, as if the client had sent it; after the loop, the answer says what economy
//! saved, apart from any compaction. Off (the default), the request is not even parsed.
//!
//! The rule economy follows depends only on the conversation, so the shortened request is
//! the same on every replica and an extension of the previous turn's between its batches:
//! the checkpoints compaction keys by the messages it was sent keep matching.

use std::fmt::Write;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response};

use crate::app::App;
use crate::body::ProxyBody;
use crate::dialect::Dialect;
use crate::engine::economy::{economize_request, EconomyOptions, EconomyStats};
use crate::error::ProxyError;

/// A client's `x-compaction-economy: on|off`, taken off its request at the edge.
#[derive(Clone, Copy, Debug)]
pub struct ClientEconomy(pub bool);

/// What economy did to a request: its stats and the number of messages it has.
pub(super) struct Economized {
    stats: EconomyStats,
    messages: usize,
}

impl Economized {
    pub fn stats(&self) -> EconomyStats {
        self.stats
    }
}

/// The request to work from: `original` with its old outputs shortened when economy is on
/// for it and finds anything worth shortening, else `original` itself, untouched.
pub(super) fn apply(
    app: &App,
    parts: &Parts,
    dialect: Dialect,
    original: Bytes,
) -> (Bytes, Option<Economized>) {
    let config = &app.config.compaction;
    let on = parts
        .extensions
        .get::<ClientEconomy>()
        .map_or(config.economy, |c| c.0);
    // A batch needs at least `batch_tokens` tokens of outputs, and a token is at least a
    // byte: a smaller body has nothing to settle, and is not parsed.
    if !on || original.len() < config.economy_batch_tokens {
        return (original, None);
    }
    let opts = EconomyOptions {
        age: config.economy_age,
        batch_tokens: config.economy_batch_tokens,
    };
    let Some((mut view, source)) = dialect.view(&original) else {
        return (original, None);
    };
    let Some(stats) = economize_request(&mut view, &opts) else {
        return (original, None);
    };
    let messages = view["messages"].as_array().map_or(0, Vec::len);
    match dialect.encode(&view, source.as_ref()) {
        Some(bytes) => (Bytes::from(bytes), Some(Economized { stats, messages })),
        None => (original, None),
    }
}

/// The answer, marked with what economy saved: `; economy=BEFORE->AFTER` (the tokens of
/// the outputs it shortened) on a compaction's `x-compaction`, or a header of its own
/// when nothing else was done to the request.
pub(super) fn mark(
    app: &App,
    answer: Result<Response<ProxyBody>, ProxyError>,
    Economized { stats, messages }: Economized,
) -> Result<Response<ProxyBody>, ProxyError> {
    app.metrics.economy(stats.saved() as u64);
    tracing::info!(
        tokens_before = stats.tokens_before,
        tokens_after = stats.tokens_after,
        repeats = stats.repeats,
        diffs = stats.diffs,
        shaped = stats.shaped,
        "economy"
    );
    let mut response = answer?;
    let headers = response.headers_mut();
    let mut text = match headers.get("x-compaction").and_then(|v| v.to_str().ok()) {
        Some(x) => x.to_owned(),
        // Without a compaction's header the loop made one call and changed nothing more:
        // a refusal it had a go at, or a retry, is always marked.
        None => format!(
            "applied; trigger=economy; attempts=1; messages={messages}->{messages}; summary=none"
        ),
    };
    // Writing to a String cannot fail.
    let _ = write!(
        text,
        "; economy={}->{}",
        stats.tokens_before, stats.tokens_after
    );
    if let Ok(value) = HeaderValue::try_from(text) {
        headers.insert("x-compaction", value);
    }
    Ok(response)
}
