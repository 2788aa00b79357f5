//! The head of a request the proxy writes in a client's name: the summariser's call and
//! each frame of a bridged WebSocket go upstream with the client's end-to-end headers
//! (its credentials pay for them) but a body of the proxy's own, whose streamed answer
//! the proxy reads itself.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Client headers that must not travel with a body the proxy wrote: the body is new (its
/// own length, type and framing), its answer is read by the proxy (no compression asked
/// for), and an idempotency key would make the upstream replay the client's own answer.
const DROPPED: [HeaderName; 6] = [
    header::CONTENT_LENGTH,
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::TRANSFER_ENCODING,
    header::ACCEPT_ENCODING,
    HeaderName::from_static("idempotency-key"),
];

/// Makes the client's `headers` those of a JSON body the proxy sends, asking for an event
/// stream.
pub fn own_body_headers(headers: &mut HeaderMap) {
    for name in DROPPED {
        headers.remove(name);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static("text/event-stream"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_stay_and_what_described_the_client_s_body_goes() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        headers.insert("idempotency-key", HeaderValue::from_static("x"));
        own_body_headers(&mut headers);
        assert_eq!(headers[header::AUTHORIZATION], "Bearer k");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        assert_eq!(headers[header::ACCEPT], "text/event-stream");
        assert!(!headers.contains_key(header::CONTENT_LENGTH));
        assert!(!headers.contains_key(header::ACCEPT_ENCODING));
        assert!(!headers.contains_key("idempotency-key"));
    }
}
