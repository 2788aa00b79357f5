//! Checkpoints and shared summaries as bytes, for the stores that keep them outside this
//! process. JSON, because the checkpoint's messages are JSON already and must come back
//! byte for byte as they were sent (serde_json keeps key order and numbers); a version
//! field lets a later release refuse what it cannot read rather than misread it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Checkpoint;
use crate::engine::{Summary, SummarySource};

/// Bumped whenever the layout below changes meaning.
const VERSION: u8 = 1;

/// The layout, written from borrowed parts and read into owned ones.
#[derive(Serialize, Deserialize)]
struct Stored<M, C, S> {
    v: u8,
    /// Seconds since the epoch of the checkpoint's last write: its age after a restart.
    at: u64,
    len: usize,
    tokens: usize,
    messages: M,
    counts: C,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next: Option<S>,
    #[serde(default)]
    poor: u8,
    summary: S,
    #[serde(default)]
    failed: bool,
}

/// Why bytes are not a checkpoint or a shared result this build can use.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("not the JSON layout of a stored value")]
    Json(#[source] serde_json::Error),
    #[error("layout version {found} (this build reads {VERSION})")]
    Version { found: u8 },
    #[error("an inconsistent checkpoint")]
    Inconsistent,
    #[error("an unknown summary source {0:?}")]
    Source(String),
    #[error("a truncated prepared checkpoint")]
    Truncated,
    #[error("a checkpoint of {found} messages indexed at {at}")]
    Misplaced { found: usize, at: usize },
    /// Sealed under another key or for another place, or altered since: the AEAD refused it.
    #[error("a sealed value that does not open with this request's key and place")]
    Unsealed,
}

/// A checkpoint as bytes, stamped with the time of writing.
pub fn encode(checkpoint: &Checkpoint) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_into(checkpoint, &mut bytes);
    bytes
}

/// [`encode`], appended to `out`: a sealed value writes it after its header, in place.
pub fn encode_into(checkpoint: &Checkpoint, out: &mut Vec<u8>) {
    let stored = Stored {
        v: VERSION,
        at: now_secs(),
        len: checkpoint.prefix_len,
        tokens: checkpoint.prefix_tokens,
        messages: checkpoint.messages.as_slice(),
        counts: checkpoint.counts.as_slice(),
        next: checkpoint.next_role.as_deref(),
        poor: checkpoint.poor_savings,
        summary: checkpoint.summary.as_str(),
        failed: checkpoint.summariser_failed,
    };
    // Writing to memory fails only for a map with non-string keys, which a checkpoint
    // parsed from JSON cannot hold.
    let _ = serde_json::to_writer(out, &stored);
}

/// The checkpoint `bytes` hold and how long ago they were written; `Err` names what is
/// wrong with them.
pub fn decode(bytes: &[u8]) -> Result<(Checkpoint, Duration), CodecError> {
    let stored: Stored<Vec<Value>, Vec<usize>, String> =
        serde_json::from_slice(bytes).map_err(CodecError::Json)?;
    if stored.v != VERSION {
        return Err(CodecError::Version { found: stored.v });
    }
    if stored.messages.len() != stored.counts.len() || stored.len == 0 {
        return Err(CodecError::Inconsistent);
    }
    let summary =
        SummarySource::parse(&stored.summary).ok_or(CodecError::Source(stored.summary))?;
    let checkpoint = Checkpoint::new(
        stored.len,
        stored.tokens,
        stored.messages,
        stored.counts,
        stored.next,
        stored.poor,
    )
    .with_summary(summary, stored.failed);
    let age = Duration::from_secs(now_secs().saturating_sub(stored.at));
    Ok((checkpoint, age))
}

#[derive(Serialize, Deserialize)]
struct SummaryLayout {
    text: String,
    source: String,
}

/// A summariser call's result, for the replicas waiting on it.
pub fn encode_summary(summary: Option<&Summary>) -> Vec<u8> {
    let shared = summary.map(|s| SummaryLayout {
        text: s.text.clone(),
        source: s.source.as_str().to_string(),
    });
    serde_json::to_vec(&shared).unwrap_or_default()
}

pub fn decode_summary(bytes: &[u8]) -> Result<Option<Summary>, CodecError> {
    let shared: Option<SummaryLayout> = serde_json::from_slice(bytes).map_err(CodecError::Json)?;
    shared
        .map(|s| {
            let source = SummarySource::parse(&s.source).ok_or(CodecError::Source(s.source))?;
            Ok(Summary {
                text: s.text,
                source,
            })
        })
        .transpose()
}

/// A prepared compaction for the replicas of a conversation: the hash of the client's
/// prefix its checkpoint replaces (16 bytes), then the checkpoint; nothing for none.
pub fn encode_prepared(prepared: &Option<(u128, Checkpoint)>) -> Vec<u8> {
    match prepared {
        None => Vec::new(),
        Some((prefix, checkpoint)) => {
            let mut bytes = prefix.to_be_bytes().to_vec();
            bytes.extend(encode(checkpoint));
            bytes
        }
    }
}

pub fn decode_prepared(bytes: &[u8]) -> Result<Option<(u128, Checkpoint)>, CodecError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let (prefix, rest) = bytes.split_at_checked(16).ok_or(CodecError::Truncated)?;
    let mut id = [0u8; 16];
    id.copy_from_slice(prefix);
    let (checkpoint, _) = decode(rest)?;
    Ok(Some((u128::from_be_bytes(id), checkpoint)))
}

/// Seconds since the epoch: the clock a stored checkpoint's age is read by, in every store.
pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_checkpoint_comes_back_byte_for_byte() {
        let messages = vec![
            json!({"role": "system", "content": "s", "zeta": 1, "alpha": [1.5, -2, null]}),
            json!({"role": "user", "content": "SUMMARY \u{1F600}"}),
        ];
        let checkpoint = Checkpoint::new(
            7,
            900,
            messages.clone(),
            vec![3, 40],
            Some("assistant".into()),
            1,
        )
        .with_summary(SummarySource::Fallback, true);
        let (back, age) = decode(&encode(&checkpoint)).unwrap();
        assert!(age < Duration::from_secs(2));
        assert_eq!(
            serde_json::to_string(&back.messages).unwrap(),
            serde_json::to_string(&messages).unwrap()
        );
        assert_eq!(
            (back.prefix_len, back.prefix_tokens, back.counts),
            (7, 900, vec![3, 40])
        );
        assert_eq!(back.next_role.as_deref(), Some("assistant"));
        assert_eq!(
            (back.poor_savings, back.summary, back.summariser_failed),
            (1, SummarySource::Fallback, true)
        );
        assert_eq!(back.size, checkpoint.size);
    }

    #[test]
    fn unreadable_bytes_are_refused_not_misread() {
        assert!(decode(b"not json").is_err());
        let other =
            br#"{"v":99,"at":0,"len":1,"tokens":1,"messages":[],"counts":[],"summary":"llm"}"#;
        assert!(decode(other)
            .unwrap_err()
            .to_string()
            .contains("version 99"));
    }

    #[test]
    fn a_prepared_checkpoint_round_trips_with_the_prefix_it_replaces() {
        let checkpoint = Checkpoint::new(
            3,
            40,
            vec![json!({"role": "user", "content": "S"})],
            vec![2],
            None,
            0,
        );
        let bytes = encode_prepared(&Some((77, checkpoint)));
        let (prefix, back) = decode_prepared(&bytes).unwrap().unwrap();
        assert_eq!((prefix, back.prefix_len), (77, 3));
        assert_eq!(
            decode_prepared(&encode_prepared(&None))
                .unwrap()
                .map(|(p, _)| p),
            None
        );
        assert!(decode_prepared(&bytes[..10]).is_err());
    }

    #[test]
    fn a_shared_summary_round_trips_and_so_does_its_absence() {
        let summary = Summary {
            text: "## Task\nx".into(),
            source: SummarySource::Llm,
        };
        assert_eq!(
            decode_summary(&encode_summary(Some(&summary))).unwrap(),
            Some(summary)
        );
        assert_eq!(decode_summary(&encode_summary(None)).unwrap(), None);
    }
}
