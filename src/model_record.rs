//! What is learned of a model from its upstream, as it is kept: the windows table
//! ([`crate::windows`]) fills these records, and the stores ([`crate::checkpoint`]) write
//! and read them. Below both, so that neither needs the other.

use serde::{Deserialize, Serialize};

/// Where a count of the upstream's came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A refusal's numbers: the count the upstream enforces its window with.
    Refusal,
    /// The `usage` of an accepted answer.
    Usage,
}

/// A model's window and calibration as learned from one upstream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub upstream: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<f64>,
}

impl ModelRecord {
    /// The field a factor of `count` is kept in.
    pub fn factor(&mut self, count: Count) -> &mut Option<f64> {
        match count {
            Count::Refusal => &mut self.refusal,
            Count::Usage => &mut self.usage,
        }
    }
}
