//! Client keys for sidecar mode: when the proxy holds the upstream key, it must not lend
//! it to whoever can reach the port.

use http::header::{self, HeaderMap, HeaderName};

use crate::config::{AuthConfig, ConfigError};
use crate::error::ProxyError;

/// Headers that carry a client's credentials: its key for this proxy or for the
/// upstream (`Authorization`, Azure's `api-key`, Anthropic's and others' `x-api-key`), in
/// the order the summary cache looks for a tenant's credential (changing it would move
/// every stored partition). A `static`, not a `const`: a const array is built and dropped
/// at each use, once per header of every request.
pub(crate) static CREDENTIAL_HEADERS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-api-key"),
];

/// Whether `name` is a header that carries a client's credentials.
pub fn is_credential(name: &HeaderName) -> bool {
    CREDENTIAL_HEADERS.contains(name)
}

/// The keys a client may present; empty means every request is let through.
pub struct Auth {
    keys: Vec<Vec<u8>>,
}

impl Auth {
    pub fn from_config(config: &AuthConfig) -> Result<Self, ConfigError> {
        let mut keys: Vec<Vec<u8>> = config.keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        if let Some(name) = &config.keys_env {
            let value = std::env::var(name).map_err(|_| {
                ConfigError::Invalid(format!(
                    "auth.keys_env names {name}, which is not set in the environment"
                ))
            })?;
            keys.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(|k| k.as_bytes().to_vec()),
            );
        }
        if keys.is_empty() && (config.keys_env.is_some() || !config.keys.is_empty()) {
            return Err(ConfigError::Invalid(
                "auth: client keys are configured but all of them are empty".into(),
            ));
        }
        Ok(Self { keys })
    }

    /// Accepts the request when no keys are configured or it carries one of them, as
    /// `Authorization: Bearer KEY` or `x-api-key: KEY`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ProxyError> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let presented = presented_key(headers).ok_or(ProxyError::Unauthorized)?;
        // Compare against every key without an early exit so timing says nothing about
        // which key, or how much of one, matched.
        let mut matched = false;
        for key in &self.keys {
            matched |= constant_time_eq(key, presented);
        }
        if matched {
            Ok(())
        } else {
            Err(ProxyError::Unauthorized)
        }
    }
}

fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let bytes = value.as_bytes();
        let prefix = b"bearer ";
        if bytes.len() > prefix.len() && bytes[..prefix.len()].eq_ignore_ascii_case(prefix) {
            return Some(&bytes[prefix.len()..]);
        }
    }
    headers.get("x-api-key").map(|v| v.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn auth(keys: &[&str]) -> Auth {
        Auth::from_config(&AuthConfig {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            ..AuthConfig::default()
        })
        .unwrap()
    }

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn open_when_no_keys() {
        assert!(auth(&[]).check(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn accepts_bearer_or_x_api_key() {
        let auth = auth(&["k1", "k2"]);
        assert!(auth.check(&headers("authorization", "Bearer k2")).is_ok());
        assert!(auth.check(&headers("authorization", "bearer k1")).is_ok());
        assert!(auth.check(&headers("x-api-key", "k1")).is_ok());
    }

    #[test]
    fn rejects_missing_or_wrong_keys() {
        let auth = auth(&["k1"]);
        assert!(auth.check(&HeaderMap::new()).is_err());
        assert!(auth.check(&headers("authorization", "Bearer k")).is_err());
        assert!(auth.check(&headers("authorization", "Bearer k11")).is_err());
        assert!(auth.check(&headers("authorization", "k1")).is_err());
    }
}
