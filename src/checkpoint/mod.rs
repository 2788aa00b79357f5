//! The summary cache. Clients resend their whole history on every turn; once the proxy has
//! compacted a conversation, the compacted form of the prefix it replaced is stored as a
//! checkpoint, keyed by a hash of that prefix as the client sent it. A later turn that starts
//! with the same prefix gets the same compacted form before anything is sent: no overflow
//! round trip, no new summary, and the same bytes as last turn for that part, which keeps the
//! upstream's prompt cache warm. Only when the client's new turns outgrow the window again
//! does a new compaction (iterating on the stored summary) extend the checkpoint.
//!
//! Pure parts live here ([`derive`], [`Checkpoint`]); [`hash`] finds prefixes and names
//! tenants. The stores fill three seams, one per job: [`checkpoint_store`] (the
//! checkpoints), [`window_store`] (what was learned of the models) and [`lease_store`]
//! (which replica makes a shared summariser call), with what they share in [`store`]; the
//! stores are [`memory`], [`embedded`] (whose files [`file_modes`] keeps private) and
//! [`redis`] (over the `redis` crate's client). [`codec`] turns checkpoints into
//! bytes and [`seal`] encrypts those bytes per tenant; [`cache`] is what the proxy uses (the
//! stores, and memory while a shared one is out of reach, with [`outage`] saying what a
//! failure costs); [`flight`] lets concurrent requests, of one process or of several, share
//! one summariser call; [`prepared`] keeps compactions prepared ahead.

pub mod cache;
pub mod checkpoint_store;
pub mod codec;
pub mod coordination;
pub mod embedded;
pub mod file_modes;
pub mod hash;
pub mod lease_store;
pub mod memory;
mod outage;
pub mod redis;
pub mod seal;
pub mod store;
pub mod window_store;

use std::mem::size_of;

use serde_json::Value;

use crate::engine::{Role, SummarySource};
pub use cache::Checkpoints;
pub use checkpoint_store::CheckpointStore;
pub use coordination::flight::Flights;
pub use coordination::prepared::Prepared;
pub use hash::{prefix_hashes, Key, Partition, Tenant, Tenants};
pub use memory::MemoryStore;
pub use seal::Seal;
pub use store::{Backend, StoreError};

/// The compacted form of a conversation's first `prefix_len` messages.
#[derive(Debug)]
pub struct Checkpoint {
    /// How many of the client's messages it replaces.
    pub prefix_len: usize,
    /// Our token count of those messages as the client sent them.
    pub prefix_tokens: usize,
    /// What replaces them, exactly as sent the first time.
    pub messages: Vec<Value>,
    /// The token count of each of `messages`.
    pub counts: Vec<usize>,
    /// The role of the client's message that followed the prefix. A request that goes on
    /// with another role has rewritten its history there; joining the stored form to it
    /// could break the role order the form was made for.
    pub next_role: Option<String>,
    /// Consecutive compactions of this conversation that saved under a tenth: past two,
    /// another paid summary of it would not help, and escalation takes over.
    pub poor_savings: u8,
    /// Where the summary in `messages` came from: the LLM, the deterministic digest (a
    /// degraded summary, reported as such every time it is served again), or none.
    pub summary: SummarySource,
    /// The summary is the digest because the summariser failed (not because it was not
    /// worth asking): a real one should take its place once the summariser answers.
    pub summariser_failed: bool,
    /// Estimated bytes held, for the store's bound.
    pub size: usize,
}

impl Checkpoint {
    pub fn new(
        prefix_len: usize,
        prefix_tokens: usize,
        messages: Vec<Value>,
        counts: Vec<usize>,
        next_role: Option<String>,
        poor_savings: u8,
    ) -> Checkpoint {
        let size = size_of::<Checkpoint>()
            + messages.iter().map(heap_size).sum::<usize>()
            + counts.len() * size_of::<usize>()
            + next_role.as_ref().map_or(0, String::len);
        Checkpoint {
            prefix_len,
            prefix_tokens,
            messages,
            counts,
            next_role,
            poor_savings,
            summary: SummarySource::None,
            summariser_failed: false,
            size,
        }
    }

    /// The same checkpoint, carrying a summary from `source`; `failed` when that is the
    /// digest standing in for a summariser that failed.
    pub fn with_summary(mut self, source: SummarySource, failed: bool) -> Checkpoint {
        self.summary = source;
        self.summariser_failed = failed && source == SummarySource::Fallback;
        self
    }

    /// Whether a request whose message after the prefix is `next` may take this form: not a
    /// tool result (whose call the form no longer holds as such), and the role that came
    /// there before.
    pub fn continues(&self, next: Option<&Value>) -> bool {
        let Some(next) = next else { return true };
        let role = next.get("role").and_then(Value::as_str);
        if role.is_some_and(is_result) {
            return false;
        }
        match &self.next_role {
            Some(expected) => role == Some(expected.as_str()),
            None => true,
        }
    }

    /// Whether the summariser may still be asked about this conversation.
    pub fn worth_summarising(&self) -> bool {
        self.poor_savings < 2
    }
}

/// The number of poor compactions in a row after one from `before` to `after` tokens, with
/// `previous` before it: one saving under a tenth counts, a better one starts again.
pub fn poor_savings_after(previous: u8, before: usize, after: usize) -> u8 {
    if before.saturating_sub(after) < before / 10 {
        previous.saturating_add(1)
    } else {
        0
    }
}

/// Whether a message of this role answers a call made before it.
fn is_result(role: &str) -> bool {
    Role::parse(role).is_some_and(Role::is_result)
}

/// Bytes a JSON value holds, roughly as serde_json lays it out.
fn heap_size(value: &Value) -> usize {
    size_of::<Value>()
        + match value {
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(heap_size).sum(),
            // A map entry: its key, its value and the index's bookkeeping.
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| size_of::<String>() + k.len() + heap_size(v) + 16)
                .sum(),
            _ => 0,
        }
}

/// Where a checkpoint applied to a request sits in it.
#[derive(Clone, Copy, Debug)]
pub struct Applied {
    /// The stored form occupies the first `form_len` messages of the request compacted...
    pub form_len: usize,
    /// ...in place of the client's first `prefix_len`.
    pub prefix_len: usize,
}

/// The checkpoint a compaction makes: `input` is what it started from (the client's
/// messages, or an applied checkpoint's form followed by the client's later messages),
/// `output` what it produced. Returns the number of the client's messages replaced and
/// the form replacing them; `None` when nothing of the client's was replaced. A verbatim
/// run that starts with tool results leaves them to the form, with their call.
///
/// Whatever the passes did, `output` ends with an unchanged run of `input`'s last messages;
/// everything before that run is the form. So the checkpoint holds for any engine, and a
/// later request that repeats the prefix gets exactly `output` for it.
pub fn derive(
    input: &[Value],
    output: &[Value],
    applied: Option<Applied>,
) -> Option<(usize, Vec<Value>)> {
    let kept = input
        .iter()
        .rev()
        .zip(output.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let mut start = input.len() - kept;
    let mut form_end = output.len() - kept;
    // A form that ends with a call (the summary folded into the assistant message that
    // made it) takes the call's results with it: a checkpoint never ends between the two.
    let role = |m: &Value| m.get("role").and_then(Value::as_str).is_some_and(is_result);
    while start > 0 && start < input.len() && role(&input[start]) {
        start += 1;
        form_end += 1;
    }
    let mut form = output[..form_end].to_vec();
    let replaced = match applied {
        None => start,
        Some(a) if start >= a.form_len => a.prefix_len + (start - a.form_len),
        // The verbatim run reaches into the earlier form: what is left of it belongs to
        // the new form, which still stands for the same client messages.
        Some(a) => {
            form.extend_from_slice(&input[start..a.form_len]);
            a.prefix_len
        }
    };
    (replaced > 0).then_some((replaced, form))
}

/// What the stores' tests keep and look up.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::sync::{Arc, LazyLock};

    use serde_json::json;

    use super::seal::{AtRest, Seal, Sealer};
    use super::{Checkpoint, Key, Partition};

    static SEAL: LazyLock<Seal> = LazyLock::new(|| Sealer::new(None).seal_credential(b"sk-tests"));

    /// How the stores' tests keep checkpoints: sealed, as by default.
    pub fn rest() -> AtRest<'static> {
        AtRest::new(&SEAL, true)
    }

    /// A checkpoint of one summary message replacing `prefix_len` messages.
    pub fn checkpoint(prefix_len: usize, text: &str) -> Arc<Checkpoint> {
        Arc::new(Checkpoint::new(
            prefix_len,
            10,
            vec![json!({"role": "user", "content": text})],
            vec![5],
            None,
            0,
        ))
    }

    pub fn key(partition: u128, prefix: u128) -> Key {
        Key {
            partition: Partition::for_tests(partition),
            prefix,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn msg(role: &str, text: &str) -> Value {
        json!({"role": role, "content": text})
    }

    #[test]
    fn a_first_compaction_replaces_everything_before_the_verbatim_tail() {
        let input = [
            msg("system", "s"),
            msg("user", "u1"),
            msg("assistant", "a1"),
            msg("user", "u2"),
            msg("assistant", "a2"),
            msg("user", "u3"),
        ];
        let output = [
            msg("system", "s"),
            msg("user", "SUMMARY"),
            input[4].clone(),
            input[5].clone(),
        ];
        let (replaced, form) = derive(&input, &output, None).unwrap();
        assert_eq!(replaced, 4);
        assert_eq!(form, output[..2]);
    }

    #[test]
    fn a_later_compaction_counts_in_client_messages() {
        // Client: 10 messages; a checkpoint of 3 messages stood for the first 6.
        let input = [
            msg("system", "s"),
            msg("user", "SUMMARY 1"),
            msg("assistant", "ok"),
            msg("user", "u7"),
            msg("assistant", "a7"),
            msg("user", "u8"),
            msg("assistant", "a8"),
        ];
        let output = [
            msg("system", "s"),
            msg("user", "SUMMARY 2"),
            input[5].clone(),
            input[6].clone(),
        ];
        let applied = Applied {
            form_len: 3,
            prefix_len: 6,
        };
        let (replaced, form) = derive(&input, &output, Some(applied)).unwrap();
        assert_eq!(replaced, 6 + 2);
        assert_eq!(form, output[..2]);
    }

    #[test]
    fn a_verbatim_run_reaching_into_the_old_form_keeps_its_rest() {
        let input = [
            msg("system", "s"),
            msg("user", "SUMMARY 1"),
            msg("assistant", "ok"),
            msg("user", "u7"),
        ];
        let output = [
            msg("system", "s"),
            msg("user", "SHORTER"),
            input[2].clone(),
            input[3].clone(),
        ];
        let applied = Applied {
            form_len: 3,
            prefix_len: 6,
        };
        let (replaced, form) = derive(&input, &output, Some(applied)).unwrap();
        assert_eq!(replaced, 6);
        assert_eq!(
            form,
            [output[0].clone(), output[1].clone(), input[2].clone()]
        );
    }

    #[test]
    fn no_checkpoint_when_nothing_was_replaced_and_never_one_before_a_result() {
        let input = [msg("user", "u"), msg("assistant", "a")];
        assert!(derive(&input, &input, None).is_none());
        // The summary went into the message that made the call: its result goes with it.
        let input = [
            msg("user", "u"),
            msg("assistant", "calls"),
            msg("tool", "r"),
        ];
        let output = [msg("assistant", "SUMMARY; calls"), input[2].clone()];
        let (replaced, form) = derive(&input, &output, None).unwrap();
        assert_eq!((replaced, form), (3, output.to_vec()));
    }

    #[test]
    fn two_poor_compactions_in_a_row_stop_the_summariser() {
        let first = poor_savings_after(0, 1000, 950);
        let cp = |poor| Checkpoint::new(1, 1, vec![], vec![], None, poor);
        assert!(cp(first).worth_summarising());
        let second = poor_savings_after(first, 1000, 920);
        assert!(!cp(second).worth_summarising());
        // A compaction that saves a tenth or more starts the count again.
        assert_eq!(poor_savings_after(second, 1000, 900), 0);
        assert_eq!(poor_savings_after(u8::MAX, 10, 10), u8::MAX);
    }

    #[test]
    fn a_checkpoint_continues_only_the_role_that_followed_it() {
        let cp = Checkpoint::new(
            2,
            9,
            vec![msg("user", "S")],
            vec![3],
            Some("assistant".into()),
            0,
        );
        assert!(cp.continues(None));
        assert!(cp.continues(Some(&msg("assistant", "a"))));
        assert!(!cp.continues(Some(&msg("user", "edited"))));
        assert!(!cp.continues(Some(&msg("tool", "r"))));
        assert!(cp.size > 0);
    }
}
