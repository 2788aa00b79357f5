//! Before the first call: resume a conversation compacted before from its checkpoint,
//! and compact when the model's window is known and the request would fill more than the
//! threshold of it, down to the low-water mark, so that the next turns are sent as resumed,
//! growing only at their end, until they cross the threshold again; a request that fits
//! but asks for more completion tokens than the window leaves gets its cap lowered (the
//! lossless fix, made before the upstream refuses). These read the request and say what
//! it needs ([`Resume`], [`Needs`]); the request's owner does it.

use std::sync::{Arc, LazyLock};

use memchr::memmem::Finder;

use super::cap;
use super::policy::{self, Decision, Goal, Marks};
use super::work::Work;
use super::Ctx;
use crate::checkpoint::{Checkpoint, Key};
use crate::compactor::{messages_of, Resumed};
use crate::engine::budget;
use crate::units::{Ours, Theirs, Window};

/// Upper bound on the tokens an image part can cost, for the cheap "surely fits" test.
const MAX_IMAGE_TOKENS: u64 = 1_600;
/// Bodies above this size are parsed and counted on a thread that may block.
const LARGE_BODY: usize = 256 * 1024;
/// Built once: building a searcher costs more than running it on a small body.
static IMAGE_URL: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("image_url"));

/// Runs `work`, which may take milliseconds for a large body, off the runtime's other
/// tasks where it can: a multi-threaded runtime first hands them to another thread. A
/// single-threaded one (`server.worker_threads = 1`) has no other thread, and
/// `block_in_place` would panic there, so the work runs in place, as a single nginx worker
/// would.
fn may_block<T>(body: &[u8], work: impl FnOnce() -> T) -> T {
    if body.len() <= LARGE_BODY {
        return work();
    }
    let flavor = tokio::runtime::Handle::try_current().map(|handle| handle.runtime_flavor());
    match flavor {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// Put a stored checkpoint in place of the client's first `len` messages.
pub(super) struct Resume {
    pub len: usize,
    pub checkpoint: Arc<Checkpoint>,
    pub key: Key,
}

/// What a request needs before it is sent. Not only that: unless it is compacted now (the
/// compaction fits the cap itself, see `rewrite.rs`), a completion cap that would overflow
/// the window beside the prompt counted for the decision is lowered to fit
/// (`overflowing_cap`: that window and prompt).
pub(super) struct Needs {
    pub decision: Decision,
    pub overflowing_cap: Option<(Window, Theirs)>,
}

/// The conversation's checkpoint, when the cache holds one for a prefix of its messages,
/// to put in place of that prefix: a conversation compacted before is sent compacted the
/// same way from the first attempt, byte for byte, without a summary. Costs nothing for
/// tenants whose conversations were never compacted: the store is asked only for tenants
/// it is known to hold checkpoints of.
pub(super) async fn resume(ctx: &Ctx<'_>, work: &mut Work) -> Option<Resume> {
    let cache = ctx.app.checkpoints.as_ref()?;
    // An empty store is the usual case; it spares every request the credential's SHA-256.
    if !cache.any() {
        return None;
    }
    let partition = ctx.partition();
    work.partition = Some(partition);
    if !cache.may_hold(partition) {
        return None;
    }
    let body = work.original().clone();
    if !may_block(&body, || work.hashes(ctx.dialect, partition).is_some()) {
        return None;
    }
    let hashes = work.hashes.as_deref()?;
    // Boxed: only tenants with checkpoints get here, and the store's future would
    // otherwise be moved with every request's.
    let (len, checkpoint) = Box::pin(cache.longest(&ctx.seal(cache), partition, hashes)).await?;
    let continues = work
        .parsed()
        .and_then(|base| messages_of(&base.view))
        .is_some_and(|messages| checkpoint.continues(messages.get(len)));
    if !continues {
        return None;
    }
    // A stored digest is a degraded summary: once the summariser may answer again, the
    // conversation is compacted anew from the client's own messages, so that a real
    // summary takes its place.
    let summarizer = ctx.app.summarizer.as_ref();
    if checkpoint.summariser_failed
        && checkpoint.worth_summarising()
        && summarizer.is_some_and(|s| s.ready(&ctx.steering.model))
    {
        tracing::info!(
            id = ctx.id,
            "the stored summary is a fallback: summarising again"
        );
        return None;
    }
    let key = Key {
        partition,
        prefix: hashes[len],
    };
    Some(Resume {
        len,
        checkpoint,
        key,
    })
}

/// [`needs`] before the first call: parsing, hashing and counting a large body takes
/// milliseconds, off the threads that move other requests' bytes.
pub(super) fn first_needs(ctx: &Ctx<'_>, work: &mut Work, resumed: Option<&Resumed>) -> Needs {
    let body = work.original().clone();
    may_block(&body, || needs(ctx, work, resumed))
}

/// What the request, resumed from its checkpoint if it has one, needs before it is sent
/// (see [`policy::decide`]). Costs a byte-length comparison for the many requests that are
/// obviously small, and one token count for the rest.
pub(super) fn needs(ctx: &Ctx<'_>, work: &mut Work, resumed: Option<&Resumed>) -> Needs {
    let send = Needs {
        decision: Decision::Send,
        overflowing_cap: None,
    };
    let Some(window) = ctx.window() else {
        return send;
    };
    let factor = ctx.factor();
    let marks = Marks::of(&ctx.app.config.compaction);
    let room = cap::answer_room(ctx, work.cap);
    // A token is at least one byte of JSON, so the body's length bounds the prompt from
    // above, except for image parts whose cost is fixed and may exceed their URL's length.
    let original = work.original();
    let images = IMAGE_URL.find_iter(original).count() as u64;
    let bound = Ours(original.len() as u64 + images * MAX_IMAGE_TOKENS).theirs(factor);
    // Growth in bytes bounds growth in tokens the same way.
    let bound_growth = Ours(ctx.growth.unwrap_or(0)).theirs(factor);
    if resumed.is_none()
        && policy::surely_fits(bound, bound_growth, room, window, marks)
        && budget::cap_fits(window.0, bound.0, work.cap)
    {
        return send;
    }
    let Some(tokens) = work.tokens(ctx.dialect) else {
        return send;
    };
    let prompt = tokens.theirs(factor);
    let growth = growth(ctx, work, resumed);
    // Checked on the cap first: most requests need no parsing for it.
    let overflowing = !budget::cap_fits(window.0, prompt.0, work.cap);
    Needs {
        decision: policy::decide(prompt, growth, room, window, factor, marks),
        overflowing_cap: overflowing.then_some((window, prompt)),
    }
}

/// How much the conversation grows a turn, in the upstream's tokens: its growth in bytes,
/// at the request's own ratio of tokens to bytes (the client's whole request, resumed or
/// not).
pub(super) fn growth(ctx: &Ctx<'_>, work: &Work, resumed: Option<&Resumed>) -> Theirs {
    let Some(bytes) = ctx.growth else {
        return Theirs(0);
    };
    let client = match resumed {
        Some(hit) => Some(hit.tokens_before),
        None => work.parsed().and_then(|base| base.tokens),
    };
    let len = work.original().len().max(1) as f64;
    let per_byte = client.map_or(1.0, |tokens| tokens.0 as f64 / len);
    Ours((bytes as f64 * per_byte) as u64).theirs(ctx.factor())
}

/// Whether the request, past the threshold, still fits the window whole: its event can
/// wait for the next turn.
pub(super) fn fits_whole(ctx: &Ctx<'_>, work: &mut Work, goal: Goal) -> bool {
    let Some(window) = goal.window else {
        return false;
    };
    let Some(tokens) = work.tokens(ctx.dialect) else {
        return false;
    };
    let room = cap::answer_room(ctx, work.cap);
    policy::fits_whole(tokens.theirs(ctx.factor()), room, window)
}

/// Whether the request as it stands is within the threshold: it would go as it is.
/// `false` when it cannot be counted.
pub(super) fn within_threshold(ctx: &Ctx<'_>, work: &mut Work, window: Window) -> bool {
    let Some(tokens) = work.tokens(ctx.dialect) else {
        return false;
    };
    let marks = Marks::of(&ctx.app.config.compaction);
    let room = cap::answer_room(ctx, work.cap);
    !marks.past_threshold(tokens.theirs(ctx.factor()) + room.budget(window), window)
}
