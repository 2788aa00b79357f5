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
//! other.
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

/// The key a tenant's values are sealed with, derived from the credential of one request
/// and dropped with it.
pub struct Seal {
    /// `None` only if HKDF refused the key's length, which it never does for 32 bytes:
    /// then nothing is sealed with it (nothing is written) and nothing opens.
    key: Option<LessSafeKey>,
}

impl Seal {
    /// The seal of the credential a request carries: the one its tenant is named by.
    pub fn of(headers: &HeaderMap) -> Seal {
        Seal::from_credential(credential(headers))
    }

    /// The seal of a credential (`Bearer KEY` and `KEY` are the same, as for the tenant).
    pub fn from_credential(credential: &[u8]) -> Seal {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(token(credential));
        let key = prk
            .expand(&[LABEL], &AES_256_GCM)
            .ok()
            .map(|okm| LessSafeKey::new(UnboundKey::from(okm)));
        Seal { key }
    }
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
