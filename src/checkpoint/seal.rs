//! Sealed checkpoints: what a store keeps outside this process (the embedded file, Redis,
//! and the prepared compactions and summaries replicas share through it) is encrypted with
//! an AEAD under a key derived from the tenant's own credential, so that only requests
//! carrying that credential can open it, and a copied file or a Redis dump reveals nothing
//! of the conversations. The key is derived for each request from its headers and dropped
//! with it: no process keeps it, and the store holds only the tenant's hash.
//!
//! AES-256-GCM (ring uses the CPU's AES instructions), a random 96-bit nonce per value,
//! and associated data naming the value's place (its partition and prefix, or its flight),
//! so that a sealed checkpoint moved to another conversation or tenant does not open. The
//! key comes from HKDF-SHA256 over the credential with a salt and a label of our own: the
//! tenant's id is a plain SHA-256 of the same credential, so neither tells anything of the
//! other. In sidecar mode, where the proxy injects its own upstream key, that key is part
//! of the salt: a client that sends no credential of its own still gets a seal that no
//! copy of the store opens without the proxy's key (which a new key therefore turns every
//! checkpoint of into a miss).
//!
//! A value without the seal's header is read as it is: a store written before sealing (or
//! with `cache.seal = false`) stays readable until it expires.

use http::HeaderMap;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

use super::codec::{self, CodecError};
use super::hash::{credential, token, Key};
use super::Checkpoint;

/// HKDF's salt and label: ours, and versioned, so that no other use of the credential
/// derives this key.
const SALT: &[u8] = b"compaction-proxy checkpoint seal salt v1";
const LABEL: &[u8] = b"compaction-proxy checkpoint seal key v1";
/// The first bytes of a sealed value. No clear value starts with a NUL: the checkpoint and
/// summary layouts are JSON, and a prepared checkpoint's clear bytes are never written
/// while sealing is on.
const MAGIC: &[u8; 4] = b"\0cs1";
const HEADER: usize = MAGIC.len() + NONCE_LEN;

/// What every seal of this process is derived with: our salt, with the injected upstream
/// key in sidecar mode.
pub struct Sealer {
    salt: hkdf::Salt,
}

impl Sealer {
    pub fn new(injected_key: Option<&[u8]>) -> Sealer {
        let salt = [SALT, injected_key.unwrap_or_default()].concat();
        Sealer {
            salt: hkdf::Salt::new(hkdf::HKDF_SHA256, &salt),
        }
    }

    /// The seal of the credential a request carries: the one its tenant is named by.
    pub fn seal(&self, headers: &HeaderMap) -> Seal {
        self.seal_credential(credential(headers))
    }

    /// The seal of a credential (`Bearer KEY` and `KEY` are the same, as for the tenant).
    pub fn seal_credential(&self, credential: &[u8]) -> Seal {
        let key = self
            .salt
            .extract(token(credential))
            .expand(&[LABEL], &AES_256_GCM)
            .ok()
            .map(|okm| LessSafeKey::new(UnboundKey::from(okm)));
        Seal { key }
    }
}

/// The key a tenant's values are sealed with, derived from the credential of one request
/// and dropped with it.
pub struct Seal {
    /// `None` only if HKDF refused the key's length, which it never does for 32 bytes:
    /// then nothing is sealed with it (nothing is written) and nothing opens.
    key: Option<LessSafeKey>,
}

/// What a value is bound to: the place it was sealed for.
pub enum Place {
    /// A checkpoint, at its partition and prefix.
    Checkpoint(Key),
    /// The result of a summariser call shared by replicas: its kind and flight.
    Flight(&'static str, u128),
}

impl Place {
    fn associated(&self) -> Vec<u8> {
        let mut data = Vec::with_capacity(64);
        match self {
            Place::Checkpoint(key) => {
                data.extend_from_slice(b"checkpoint");
                data.extend_from_slice(&key.partition.tenant.0.to_be_bytes());
                data.extend_from_slice(&key.partition.scope.to_be_bytes());
                data.extend_from_slice(&key.prefix.to_be_bytes());
            }
            Place::Flight(kind, flight) => {
                data.extend_from_slice(b"flight ");
                data.extend_from_slice(kind.as_bytes());
                data.extend_from_slice(&flight.to_be_bytes());
            }
        }
        data
    }
}

/// How one request's values go to a store and come back: sealed with its seal when
/// `cache.seal` is on, in the clear when it is off; opened when sealed, read as they are
/// when not, whatever the switch.
#[derive(Clone, Copy)]
pub struct AtRest<'a> {
    seal: &'a Seal,
    sealing: bool,
}

impl<'a> AtRest<'a> {
    pub fn new(seal: &'a Seal, sealing: bool) -> AtRest<'a> {
        AtRest { seal, sealing }
    }

    /// A checkpoint as the bytes a store keeps at `key`.
    pub fn checkpoint(&self, key: Key, checkpoint: &Checkpoint) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(checkpoint.size / 2 + 64);
        if !self.sealing {
            codec::encode_into(checkpoint, &mut bytes);
            return bytes;
        }
        bytes.extend_from_slice(&[0; HEADER]);
        codec::encode_into(checkpoint, &mut bytes);
        self.seal_in_place(&Place::Checkpoint(key), bytes)
    }

    /// The checkpoint the bytes kept at `key` hold, and how long ago they were written.
    pub fn open_checkpoint(
        &self,
        key: Key,
        bytes: Vec<u8>,
    ) -> Result<(Checkpoint, std::time::Duration), CodecError> {
        let clear = self.open(&Place::Checkpoint(key), bytes)?;
        codec::decode(&clear)
    }

    /// A shared result's bytes as a store keeps them for `place`.
    pub fn seal(&self, place: &Place, clear: &[u8]) -> Vec<u8> {
        if !self.sealing {
            return clear.to_vec();
        }
        let mut bytes = Vec::with_capacity(HEADER + clear.len() + AES_256_GCM.tag_len());
        bytes.extend_from_slice(&[0; HEADER]);
        bytes.extend_from_slice(clear);
        self.seal_in_place(place, bytes)
    }

    /// The clear bytes of a value kept for `place`: opened when sealed, as they are when not.
    pub fn open(&self, place: &Place, mut bytes: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        if !bytes.starts_with(MAGIC) {
            return Ok(bytes);
        }
        let nonce = bytes
            .get(MAGIC.len()..HEADER)
            .and_then(|n| Nonce::try_assume_unique_for_key(n).ok())
            .ok_or(CodecError::Unsealed)?;
        let key = self.seal.key.as_ref().ok_or(CodecError::Unsealed)?;
        let associated = place.associated();
        let clear_len = key
            .open_within(nonce, Aad::from(&associated), &mut bytes, HEADER..)
            .map_err(|_| CodecError::Unsealed)?
            .len();
        bytes.truncate(clear_len);
        Ok(bytes)
    }

    /// Seals `bytes[HEADER..]` where it lies, writing the header before it and the tag
    /// after: the value is never copied.
    fn seal_in_place(&self, place: &Place, mut bytes: Vec<u8>) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        // No randomness, no safe nonce (or no key): the value is written empty rather
        // than risk a nonce used twice, and an empty value is read as a miss.
        let Some(key) = &self.seal.key else {
            return Vec::new();
        };
        if SystemRandom::new().fill(&mut nonce).is_err() {
            return Vec::new();
        }
        let associated = place.associated();
        let sealed = key.seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&associated),
            &mut bytes[HEADER..],
        );
        let Ok(tag) = sealed else {
            return Vec::new();
        };
        bytes[..MAGIC.len()].copy_from_slice(MAGIC);
        bytes[MAGIC.len()..HEADER].copy_from_slice(&nonce);
        bytes.extend_from_slice(tag.as_ref());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixtures::{checkpoint, key};

    fn opens(writer: &Seal, reader: &Seal, at: Key, read_at: Key) -> bool {
        let bytes = AtRest::new(writer, true).checkpoint(at, &checkpoint(2, "secret text"));
        AtRest::new(reader, true)
            .open_checkpoint(read_at, bytes)
            .is_ok()
    }

    #[test]
    fn a_sealed_checkpoint_opens_only_with_its_tenant_s_key_at_its_place() {
        let sealer = Sealer::new(None);
        let (a, b) = (
            sealer.seal_credential(b"Bearer sk-a"),
            sealer.seal_credential(b"sk-b"),
        );
        let bytes = AtRest::new(&a, true).checkpoint(key(1, 20), &checkpoint(2, "secret text"));
        assert!(bytes.starts_with(MAGIC));
        assert!(!bytes.windows(6).any(|w| w == b"secret"));
        // `Bearer KEY` and `KEY` are the same credential.
        assert!(opens(
            &a,
            &sealer.seal_credential(b"sk-a"),
            key(1, 20),
            key(1, 20)
        ));
        assert!(!opens(&a, &b, key(1, 20), key(1, 20)));
        // Moved to another prefix or partition, it does not open.
        assert!(!opens(&a, &a, key(1, 20), key(1, 21)));
        assert!(!opens(&a, &a, key(1, 20), key(2, 20)));
        // The proxy's injected key is part of every seal.
        let sidecar = Sealer::new(Some(b"sk-upstream")).seal_credential(b"sk-a");
        assert!(!opens(&a, &sidecar, key(1, 20), key(1, 20)));
    }

    #[test]
    fn an_altered_value_does_not_open_and_a_clear_one_is_read_as_it_is() {
        let seal = Sealer::new(None).seal_credential(b"sk-a");
        let sealed = AtRest::new(&seal, true);
        let mut bytes = sealed.checkpoint(key(1, 20), &checkpoint(2, "text"));
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        assert!(matches!(
            sealed.open_checkpoint(key(1, 20), bytes),
            Err(CodecError::Unsealed)
        ));
        // Written with `cache.seal = false`, or before sealing: read whatever the switch.
        let clear = AtRest::new(&seal, false).checkpoint(key(1, 20), &checkpoint(2, "text"));
        assert!(clear.starts_with(b"{"));
        let (back, _) = sealed.open_checkpoint(key(1, 20), clear).unwrap();
        assert_eq!(back.messages, checkpoint(2, "text").messages);
        // A shared result, bound to its kind and flight.
        let place = Place::Flight("summary", 7);
        let bytes = sealed.seal(&place, b"summary text");
        assert_eq!(sealed.open(&place, bytes.clone()).unwrap(), b"summary text");
        assert!(sealed.open(&Place::Flight("prepared", 7), bytes).is_err());
    }
}
