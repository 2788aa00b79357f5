//! What every store shares, whatever its job: which kind of store it is, how its
//! operations fail, and the future they return. The jobs themselves are three seams, each
//! filled by the stores that do that job: checkpoints ([`super::checkpoint_store`]), the
//! windows learned from the upstream ([`super::window_store`]), and the leases that settle
//! which process makes a summariser call several need at once ([`super::lease_store`]).
//!
//! Every method that may leave the process returns a future and an error that keeps its
//! cause; [`super::Checkpoints`] decides what an error costs (nothing: it falls back to
//! memory, and says so once per outage).

use std::error::Error;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::codec::CodecError;

/// Which kind of store: the label of its metrics and of `/healthz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Memory,
    Embedded,
    Redis,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Embedded => "embedded",
            Backend::Redis => "redis",
        }
    }
}

/// What a store operation failed on, with its cause, kept until it is logged ([`render`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The embedded store's file could not be read or written.
    #[error("the embedded store's file failed")]
    File(#[source] rusqlite::Error),
    /// The embedded store's folder could not be created, or its modes not set.
    #[error("the embedded store's folder or file {path}")]
    Folder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The blocking task doing the file's work did not finish (the runtime is stopping).
    #[error("the embedded store's worker stopped")]
    Worker(#[source] tokio::task::JoinError),
    /// Redis could not be reached or answered with an error. The address, never the
    /// credentials.
    #[error("redis at {address} failed")]
    Redis {
        address: String,
        #[source]
        source: ::redis::RedisError,
    },
    /// It did not answer in time.
    #[error("{backend} store did not answer within {after:?}")]
    Timeout {
        backend: &'static str,
        after: Duration,
    },
    /// It answered with something this version cannot read (written by another version,
    /// damaged, or sealed under another key): treated as a miss by the caller, never served.
    #[error("{backend} store holds an unreadable value")]
    Corrupt {
        backend: &'static str,
        #[source]
        source: CodecError,
    },
}

pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// An error and each of its causes, `error: cause: its cause`: every error of this module
/// says only what it is, and its causes are rendered once, here, where it is logged or shown.
pub fn render(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let _ = write!(text, ": {next}");
        cause = next.source();
    }
    text
}
