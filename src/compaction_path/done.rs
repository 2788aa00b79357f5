//! What the proxy has done to a request so far: the record the phases read and the
//! request's owner ([`super::request`]) writes. The header, the metrics and the log line
//! are read off it; a request it is all empty for reaches the client unmarked.

use crate::checkpoint::Key;
use crate::compaction_report::Trigger;
use crate::compactor::{NewCheckpoint, Resumed};
use crate::engine;
use crate::units::Theirs;

#[derive(Default)]
pub(super) struct Done {
    /// Upstream calls made.
    pub calls: u32,
    /// When the first change was made: before the first call, or after a refusal.
    pub trigger: Option<Trigger>,
    /// The checkpoint put in place of the client's prefix before the first call.
    pub resumed: Option<Resumed>,
    /// The completion cap as the client asked for it and as lowered to fit the window.
    pub output: Option<(u64, u64)>,
    pub engine: Engine,
    /// A compaction prepared ahead was put in place: its checkpoint becomes the
    /// conversation's once the upstream takes the request.
    pub promote: Option<Promote>,
    /// The LLM summariser is no longer worth asking: when a summarised compaction saved
    /// under a tenth, the middle is small beside what is kept, and another paid summary of
    /// it would not save more; further attempts escalate with the deterministic digest.
    pub digest_only: bool,
    /// The summariser was asked for this request and gave nothing usable.
    pub summariser_failed: bool,
    /// The least prompt plus completion cap (the upstream's tokens, as we estimate them)
    /// refused without numbers: no later attempt may be as large.
    pub least_refused: Option<Theirs>,
    /// The media parts the client sent and those left, when the oldest were replaced by
    /// placeholders for an upstream that takes fewer in one request.
    pub media: Option<(u64, u64)>,
}

impl Done {
    /// Whether the proxy had a go at the request: a refusal returned after that is a
    /// compaction that failed, not an untouched request.
    pub fn tried(&self) -> bool {
        self.resumed.is_some()
            || self.output.is_some()
            || self.media.is_some()
            || !matches!(self.engine, Engine::Unused)
    }

    /// Whether what went upstream was not the client's own request. The engine may have
    /// run and found nothing to remove: the client's bytes then went as they were.
    pub fn changed(&self) -> bool {
        matches!(self.engine, Engine::Rewrote { .. })
            || self.resumed.is_some()
            || self.output.is_some()
            || self.media.is_some()
    }

    pub fn triggered(&mut self, trigger: Trigger) {
        self.trigger.get_or_insert(trigger);
    }

    pub fn report(&self) -> Option<&engine::Report> {
        match &self.engine {
            Engine::Rewrote { report, .. } => Some(report),
            _ => None,
        }
    }

    /// Compactions made for this request.
    pub fn rewrites(&self) -> u32 {
        match self.engine {
            Engine::Rewrote { rewrites, .. } => rewrites,
            _ => 0,
        }
    }
}

/// What the engine did with the request.
#[derive(Default)]
pub(super) enum Engine {
    /// Not asked.
    #[default]
    Unused,
    /// Asked, and it could not shrink the request.
    Ran,
    /// It rewrote the request `rewrites` times. `pending` is the checkpoint the last
    /// rewrite makes, stored once the upstream takes it.
    Rewrote {
        rewrites: u32,
        report: engine::Report,
        pending: Option<Box<NewCheckpoint>>,
    },
}

/// A prepared checkpoint in place (it is the [`Resumed`] one), with the stored checkpoint
/// it supersedes.
pub(super) struct Promote {
    pub replaces: Option<Key>,
}
