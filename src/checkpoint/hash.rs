//! Content hashes for the checkpoint cache: whose conversation a request belongs to (the
//! partition) and a hash of every prefix of its messages, computed in one linear walk of
//! the parsed request, without serialising it again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use http::HeaderMap;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3;

use crate::auth::CREDENTIAL_HEADERS;
use crate::engine::Message;

/// Whose conversations: the first 16 bytes of a SHA-256 of the client's credential (the
/// credential itself is never kept; a store shared between processes holds these hashes).
/// An operator clears one tenant's checkpoints by its key (`compaction-proxy cache clear`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(pub u128);

impl Tenant {
    /// The tenant of a request, by the first credential header it carries.
    pub fn of(headers: &HeaderMap) -> Tenant {
        Tenant::from_credential(credential(headers))
    }

    /// The tenant of a credential: an API key, or a header's value (`Bearer KEY` is the
    /// same tenant as `KEY`, so that an operator can name it by the key alone).
    pub fn from_credential(credential: &[u8]) -> Tenant {
        let digest = ring::digest::digest(&ring::digest::SHA256, token(credential));
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest.as_ref()[..16]);
        Tenant(u128::from_be_bytes(first))
    }
}

/// The tenants of the credentials this process has seen lately. A tenant is a SHA-256 of
/// the credential, about 2,500 instructions: once a store holds any checkpoint, every
/// request asks for its partition, and this was the largest single stage of a request
/// that needs no compaction (bench/results/throughput-2026-11-26c.md). The credentials
/// are held in this process's memory only, as the client keys are; nothing is written.
#[derive(Default)]
pub struct Tenants {
    seen: Mutex<HashMap<Box<[u8]>, Tenant>>,
}

/// Credentials remembered at most; past that the memo starts again, so a client that
/// cycles through keys costs memory it bounds.
const TENANTS_SEEN: usize = 1024;

impl Tenants {
    /// [`Tenant::of`] the request, from the memo when its credential was seen before.
    pub fn of(&self, headers: &HeaderMap) -> Tenant {
        let credential = credential(headers);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tenant) = seen.get(credential) {
            return *tenant;
        }
        let tenant = Tenant::from_credential(credential);
        if seen.len() >= TENANTS_SEEN {
            seen.clear();
        }
        seen.insert(credential.into(), tenant);
        tenant
    }

    /// The partition of a request (see [`Partition::new`]).
    pub fn partition(&self, headers: &HeaderMap, upstream: &str, model: &str) -> Partition {
        Partition::of_tenant(self.of(headers), upstream, model)
    }

    /// Credentials remembered now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.seen.lock().map_or(0, |seen| seen.len())
    }
}

/// The credential a request carries: the value of the first credential header it has,
/// empty without one.
pub(super) fn credential(headers: &HeaderMap) -> &[u8] {
    CREDENTIAL_HEADERS
        .iter()
        .find_map(|name| headers.get(name))
        .map_or(&b""[..], |value| value.as_bytes())
}

/// The key in a credential: without the `Bearer` scheme and the spaces around it.
pub(super) fn token(credential: &[u8]) -> &[u8] {
    let token = match credential.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &credential[7..],
        _ => credential,
    };
    token.trim_ascii()
}

/// One tenant's conversations with one model on one upstream. Checkpoints never cross
/// partitions, so one client's compacted history is never applied to another's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    pub tenant: Tenant,
    /// The tenant, the upstream and the model, hashed.
    pub scope: u128,
}

impl Partition {
    /// The partition of a request: its tenant, the upstream and the model.
    pub fn new(headers: &HeaderMap, upstream: &str, model: &str) -> Partition {
        Partition::of_tenant(Tenant::of(headers), upstream, model)
    }

    /// The partition of `tenant`'s conversations with `model` on `upstream`.
    pub fn of_tenant(tenant: Tenant, upstream: &str, model: &str) -> Partition {
        let mut hasher = Xxh3::new();
        hasher.update(&tenant.0.to_le_bytes());
        feed_str(&mut hasher, upstream);
        feed_str(&mut hasher, model);
        Partition {
            tenant,
            scope: hasher.digest128(),
        }
    }

    #[cfg(test)]
    pub fn for_tests(n: u128) -> Partition {
        Partition {
            tenant: Tenant(n),
            scope: n,
        }
    }
}

/// A checkpoint's address: the hash of the client's message prefix it replaces, within a
/// partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub partition: Partition,
    pub prefix: u128,
}

/// `hashes[i]` identifies the first `i` messages of `partition`'s conversation
/// (`hashes[0]`, the empty prefix, is the partition alone). Every prefix is a prefix of
/// one running hash, so the whole list costs one pass over the messages.
pub fn prefix_hashes(partition: Partition, messages: &[Value]) -> Vec<u128> {
    let mut hasher = Xxh3::new();
    hasher.update(&partition.scope.to_le_bytes());
    let mut hashes = Vec::with_capacity(messages.len() + 1);
    hashes.push(hasher.digest128());
    for message in messages {
        feed(&mut hasher, message);
        hashes.push(hasher.digest128());
    }
    hashes
}

/// Identifies the middle a summary is asked for, with the summary it carries forward, so
/// that concurrent requests needing the same one can share the summariser's answer.
pub fn middle_key(partition: Partition, previous: Option<&str>, turns: &[Message]) -> u128 {
    let mut hasher = Xxh3::new();
    hasher.update(&partition.scope.to_le_bytes());
    match previous {
        Some(text) => {
            hasher.update(b"p");
            feed_str(&mut hasher, text);
        }
        None => hasher.update(b"-"),
    }
    for turn in turns {
        feed_map(&mut hasher, &turn.body);
    }
    hasher.digest128()
}

/// Feeds a JSON value with a tag and a length before every part, so that no two
/// different sequences of values feed the same bytes.
fn feed(hasher: &mut Xxh3, value: &Value) {
    match value {
        Value::Null => hasher.update(b"z"),
        Value::Bool(b) => hasher.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                hasher.update(b"u");
                hasher.update(&u.to_le_bytes());
            } else if let Some(i) = n.as_i64() {
                hasher.update(b"i");
                hasher.update(&i.to_le_bytes());
            } else {
                hasher.update(b"d");
                hasher.update(&n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes());
            }
        }
        Value::String(s) => {
            hasher.update(b"s");
            feed_str(hasher, s);
        }
        Value::Array(items) => {
            hasher.update(b"[");
            hasher.update(&(items.len() as u64).to_le_bytes());
            for item in items {
                feed(hasher, item);
            }
        }
        Value::Object(map) => feed_map(hasher, map),
    }
}

fn feed_map(hasher: &mut Xxh3, map: &Map<String, Value>) {
    hasher.update(b"{");
    hasher.update(&(map.len() as u64).to_le_bytes());
    for (key, item) in map {
        feed_str(hasher, key);
        feed(hasher, item);
    }
}

fn feed_str(hasher: &mut Xxh3, s: &str) {
    hasher.update(&(s.len() as u64).to_le_bytes());
    hasher.update(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn partitions_differ_by_credential_model_and_upstream() {
        let base = Partition::new(&headers("Bearer a"), "http://u", "m");
        assert_eq!(base, Partition::new(&headers("Bearer a"), "http://u", "m"));
        assert_ne!(base, Partition::new(&headers("Bearer b"), "http://u", "m"));
        assert_ne!(base, Partition::new(&headers("Bearer a"), "http://u", "n"));
        assert_ne!(base, Partition::new(&headers("Bearer a"), "http://v", "m"));
        assert_ne!(base, Partition::new(&HeaderMap::new(), "http://u", "m"));
    }

    #[test]
    fn the_memo_gives_each_credential_its_own_tenant_within_its_bound() {
        let tenants = Tenants::default();
        // "Bearer bearer x" is the key "bearer x": the memo is keyed by the whole value.
        let values = ["Bearer a", "Bearer b", "bearer a", "Bearer bearer a", "a"];
        for _ in 0..2 {
            for value in values {
                let h = headers(value);
                assert_eq!(tenants.of(&h), Tenant::of(&h), "{value}");
                assert_eq!(
                    tenants.partition(&h, "http://u", "m"),
                    Partition::new(&h, "http://u", "m")
                );
            }
        }
        assert_eq!(tenants.of(&HeaderMap::new()), Tenant::of(&HeaderMap::new()));
        // "Bearer a", "bearer a" and "a" are one tenant but three values.
        assert_eq!(tenants.held(), values.len() + 1);
        for n in 0..TENANTS_SEEN {
            tenants.of(&headers(&format!("Bearer k{n}")));
        }
        assert!(tenants.held() <= TENANTS_SEEN);
    }

    #[test]
    fn a_tenant_is_its_key_with_or_without_the_bearer_scheme() {
        let header = Tenant::of(&headers("Bearer sk-1"));
        assert_eq!(header, Tenant::from_credential(b"sk-1"));
        assert_eq!(header, Tenant::from_credential(b"bearer sk-1"));
        assert_ne!(header, Tenant::from_credential(b"sk-2"));
        let p = Partition::new(&headers("Bearer sk-1"), "http://u", "m");
        assert_eq!(p.tenant, header);
    }

    #[test]
    fn a_prefix_hash_depends_on_exactly_that_prefix() {
        let p = Partition::for_tests(7);
        let a = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "yo"}),
        ];
        let b = [a[0].clone(), json!({"role": "assistant", "content": "no"})];
        let (ha, hb) = (prefix_hashes(p, &a), prefix_hashes(p, &b));
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(prefix_hashes(Partition::for_tests(8), &a)[1], ha[1]);
    }

    #[test]
    fn message_boundaries_are_part_of_the_hash() {
        let p = Partition::for_tests(1);
        let split = [json!("ab"), json!("c")];
        let joined = [json!("a"), json!("bc")];
        assert_ne!(prefix_hashes(p, &split)[2], prefix_hashes(p, &joined)[2]);
        assert_ne!(
            prefix_hashes(p, &[json!(1)]),
            prefix_hashes(p, &[json!(1.0)])
        );
        assert_ne!(
            prefix_hashes(p, &[json!([])]),
            prefix_hashes(p, &[json!({})])
        );
    }
}
