//! The request as it is being rewritten: the client's bytes, what the next attempt sends,
//! and the parsed request compaction starts from, with what was learned of it (token
//! counts, cache keys) kept so no attempt computes it twice.

use bytes::Bytes;
use serde_json::Value;

use super::cap::Cap;
use crate::checkpoint::{self, Partition};
use crate::compactor::{messages_of, Base};
use crate::dialect::{Dialect, Steering};
use crate::units::Ours;

pub(super) struct Work {
    /// The client's bytes, sent as they are until a rewrite is needed.
    original: Bytes,
    /// What the next attempt sends.
    pub body: Bytes,
    /// The completion cap the request compaction starts from asks for, and the view's
    /// field that holds it.
    pub cap: Option<u64>,
    pub cap_field: Option<&'static str>,
    /// The request compaction starts from, parsed only once a rewrite is considered.
    base: Option<Base>,
    /// The conversation's partition in the summary cache, and the hash of every prefix of
    /// the client's messages, once computed.
    pub partition: Option<Partition>,
    pub hashes: Option<Vec<u128>>,
}

impl Work {
    pub fn new(original: Bytes, steering: &Steering) -> Work {
        Work {
            body: original.clone(),
            original,
            cap: steering.max_output,
            cap_field: steering.max_output_field,
            base: None,
            partition: None,
            hashes: None,
        }
    }

    /// The completion cap of the request compaction starts from.
    pub fn cap(&self) -> Cap {
        Cap {
            field: self.cap_field,
            asked: self.cap,
        }
    }

    pub fn original(&self) -> &Bytes {
        &self.original
    }

    /// The request compaction starts from, parsed on first use; `None` when the body does
    /// not parse as its dialect.
    pub fn base(&mut self, dialect: Dialect) -> Option<&mut Base> {
        if self.base.is_none() {
            let (view, source) = dialect.view(&self.original)?;
            self.base = Some(Base::new(view, source));
        }
        self.base.as_mut()
    }

    /// The base when it was parsed already.
    pub fn parsed(&self) -> Option<&Base> {
        self.base.as_ref()
    }

    pub fn parsed_mut(&mut self) -> Option<&mut Base> {
        self.base.as_mut()
    }

    /// Takes the base out, for work on a thread that may block; [`Work::restore`] puts it
    /// back. Moved rather than cloned: for a conversation of a million tokens a clone
    /// costs as much as the compaction.
    pub fn take(&mut self) -> Option<Base> {
        self.base.take()
    }

    pub fn restore(&mut self, base: Base) {
        self.base = Some(base);
    }

    /// Forgets the parsed base: the next use parses the client's request again. Its cache
    /// keys, which are the client's, stay.
    pub fn forget_base(&mut self) {
        self.base = None;
    }

    /// Forgets the parsed request: the next attempt is the client's own bytes.
    pub fn reset(&mut self, steering: &Steering) {
        *self = Work::new(self.original.clone(), steering);
    }

    /// Our token count of the base, counted on first use.
    pub fn tokens(&mut self, dialect: Dialect) -> Option<Ours> {
        self.base(dialect).map(Base::count)
    }

    /// The hash of every prefix of the base's messages in `partition`, computed once.
    pub fn hashes(&mut self, dialect: Dialect, partition: Partition) -> Option<&[u128]> {
        if self.hashes.is_none() {
            let messages = self.base(dialect).and_then(|b| messages_of(&b.view))?;
            self.hashes = Some(checkpoint::prefix_hashes(partition, messages));
        }
        self.hashes.as_deref()
    }

    /// The bytes to send for `view`, in the client's dialect.
    pub fn encode(&self, dialect: Dialect, view: &Value) -> Option<Bytes> {
        let source = self.base.as_ref().and_then(|b| b.source.as_ref());
        dialect.encode(view, source).map(Bytes::from)
    }
}
