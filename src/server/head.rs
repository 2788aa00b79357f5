//! A client's request head: parsed from the front of the connection's buffer, within
//! limits, into the request the router gets and what the connection must know of it
//! (RFC 9112): how its body is delimited, whether the connection may carry another
//! request, whether the client waits for `100 Continue`, whether it asks to switch
//! protocols.
//!
//! The head's bytes are split off the buffer once and the URI and header values are
//! slices of them, not copies.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};

use crate::http1::{self as wire, Present};

/// Request heads longer than this are refused with 431. Far above what API clients send
/// (nginx's default allows 32 KiB of header lines), and a bound on what a client can make
/// a connection hold before it is answered.
pub const MAX_HEAD: usize = 64 * 1024;
/// Header fields in one request head, at most (hyper's default).
const MAX_HEADERS: usize = 100;

/// Why a head is refused; the connection answers with [`HeadError::status`] and closes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeadError {
    #[error("malformed request head: {0}")]
    Malformed(httparse::Error),
    #[error("the request head is over {MAX_HEAD} bytes or {MAX_HEADERS} fields")]
    TooLarge,
    #[error("invalid request target")]
    Target,
    #[error("invalid header field")]
    Header,
    #[error("invalid or conflicting Content-Length")]
    ContentLength,
    #[error("a transfer coding other than chunked alone")]
    TransferCoding,
    #[error("Transfer-Encoding beside Content-Length, or in HTTP/1.0")]
    Framing,
}

impl HeadError {
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    Length(u64),
    Chunked,
}

/// A parsed head: the request without its body, and what the connection must know.
#[derive(Debug)]
pub struct Head {
    pub request: Request<()>,
    /// `None`: no body at all.
    pub body: Option<BodyFraming>,
    /// The client allows another request on this connection after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue` on HTTP/1.1: the client waits to be told to send the body.
    pub expect_continue: bool,
    /// The request asks to switch protocols (see [`asks_upgrade`]).
    pub upgrade: bool,
}

/// Parses a request head from the front of `buf` and removes it; `Ok(None)` when more
/// bytes are needed. Empty lines before the request line are skipped (RFC 9112 section
/// 2.2), as hyper does.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Head>, HeadError> {
    let blank = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    buf.advance(blank);
    // Left uninitialised: zeroing room for every header the parser might meet costs more
    // than parsing a typical head.
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match parsed.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Malformed(e)),
    };
    if len > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let method = Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Malformed(httparse::Error::Token))?;
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // Offsets into the head, so the values can be slices of it once it is split off.
    let base = buf.as_ptr() as usize;
    let offset = |s: &str| s.as_ptr() as usize - base;
    let target = parsed.path.unwrap_or_default();
    let target = (offset(target), offset(target) + target.len());
    let mut fields = Vec::with_capacity(parsed.headers.len());
    let mut present = Present::default();
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| HeadError::Header)?;
        present.note_field(&name, field.value);
        let start = field.value.as_ptr() as usize - base;
        fields.push((name, start, start + field.value.len()));
    }
    let head = buf.split_to(len).freeze();
    let uri =
        Uri::from_maybe_shared(head.slice(target.0..target.1)).map_err(|_| HeadError::Target)?;
    let headers = header_map(&head, fields)?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    let body = body_framing(version, &headers, present)?;
    let keep_alive = present.keeps_alive(version, &headers);
    let expect_continue = version == Version::HTTP_11
        && present.expect
        && headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let upgrade = present.upgrade && asks_upgrade(version, &headers);
    *request.headers_mut() = headers;
    Ok(Some(Head {
        request,
        body,
        keep_alive,
        expect_continue,
        upgrade,
    }))
}

fn header_map(
    head: &Bytes,
    fields: Vec<(HeaderName, usize, usize)>,
) -> Result<HeaderMap, HeadError> {
    let mut headers = HeaderMap::with_capacity(fields.len());
    for (name, start, end) in fields {
        let value = HeaderValue::from_maybe_shared(head.slice(start..end))
            .map_err(|_| HeadError::Header)?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// RFC 9112 section 6.3, for requests: chunked alone, else `Content-Length`, else no
/// body. Both at once is how a request is smuggled past one of two parsers, so it is
/// refused (section 6.1 allows it), as is any other coding, which the proxy would have to
/// decode to frame.
fn body_framing(
    version: Version,
    headers: &HeaderMap,
    present: Present,
) -> Result<Option<BodyFraming>, HeadError> {
    if present.transfer_encoding {
        if !wire::chunked_alone(headers) {
            return Err(HeadError::TransferCoding);
        }
        // HTTP/1.0 has no transfer codings.
        if version == Version::HTTP_10 || present.content_length {
            return Err(HeadError::Framing);
        }
        return Ok(Some(BodyFraming::Chunked));
    }
    let length = present.declared_length();
    let length = length.map_err(|wire::BadLength| HeadError::ContentLength)?;
    Ok(length.filter(|&n| n > 0).map(BodyFraming::Length))
}

/// Whether a request asks to switch protocols: HTTP/1.1 (the only version with
/// upgrades), an `Upgrade` header, and `upgrade` among the `Connection` options.
pub fn asks_upgrade(version: Version, headers: &HeaderMap) -> bool {
    // A pass over the few names present rather than a lookup, which hashes the name:
    // the router asks this of every request, and nearly none has the field.
    version == Version::HTTP_11
        && headers.keys().any(|name| name == header::UPGRADE)
        && wire::connection_options(headers).any(|option| option.eq_ignore_ascii_case(b"upgrade"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(raw: &str) -> Result<Option<Head>, HeadError> {
        parse(&mut BytesMut::from(raw.as_bytes()))
    }

    fn head(raw: &str) -> Head {
        parse_str(raw).unwrap().unwrap()
    }

    #[test]
    fn a_head_is_parsed_and_removed_leaving_the_body_and_what_follows() {
        let mut buf = BytesMut::from(
            &b"\r\nPOST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\n{}GET"[..],
        );
        let head = parse(&mut buf).unwrap().unwrap();
        assert_eq!(head.request.method(), Method::POST);
        assert_eq!(head.request.uri(), "/v1/chat/completions?x=1");
        assert_eq!(head.request.version(), Version::HTTP_11);
        assert_eq!(head.request.headers()["host"], "h");
        let all: Vec<_> = head.request.headers().get_all("x-a").iter().collect();
        assert_eq!(all, ["1", "2"]);
        assert_eq!(head.body, Some(BodyFraming::Length(2)));
        assert!(head.keep_alive && !head.expect_continue && !head.upgrade);
        assert_eq!(&buf[..], b"{}GET");
    }

    #[test]
    fn partial_heads_wait_and_oversized_ones_are_431() {
        assert!(parse_str("GET / HTTP/1.1\r\nHost: h\r\n")
            .unwrap()
            .is_none());
        let huge = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD));
        let error = parse_str(&huge).unwrap_err();
        assert_eq!(error.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let error = parse_str(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err();
        assert_eq!(error, HeadError::TooLarge);
    }

    #[test]
    fn malformed_heads_are_400() {
        for bad in [
            "GET / HTTP/1.1\r\nbad header\r\n\r\n",
            "GET / HTTP/9.9\r\n\r\n",
            "G@T / HTTP/1.1\r\n\r\n",
            "GET /\x01 HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 1, 2\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 0x10\r\n\r\n",
        ] {
            let error = parse_str(bad).unwrap_err();
            assert_eq!(error.status(), StatusCode::BAD_REQUEST, "{bad:?}: {error}");
        }
    }

    #[test]
    fn the_body_is_chunked_alone_or_of_its_length_or_absent() {
        let framing = |raw: &str| head(raw).body;
        assert_eq!(
            framing("POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n"),
            Some(BodyFraming::Chunked)
        );
        assert_eq!(
            framing("POST / HTTP/1.1\r\ncontent-length: 7, 7\r\n\r\n"),
            Some(BodyFraming::Length(7))
        );
        assert_eq!(
            framing("POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n"),
            None
        );
        assert_eq!(framing("GET / HTTP/1.1\r\n\r\n"), None);
        let gzip = "POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n";
        let error = parse_str(gzip).unwrap_err();
        assert_eq!(error.status(), StatusCode::NOT_IMPLEMENTED);
        for refused in [
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(
                parse_str(refused).unwrap_err(),
                HeadError::Framing,
                "{refused:?}"
            );
        }
    }

    #[test]
    fn keep_alive_continue_and_upgrade_follow_the_version_and_headers() {
        assert!(head("GET / HTTP/1.1\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.1\r\nconnection: keep-alive, Close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").keep_alive);
        let expect = "POST / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n";
        assert!(head(expect).expect_continue);
        assert!(!head(&expect.replace("1.1", "1.0")).expect_continue);
        let upgrade =
            "GET /ws HTTP/1.1\r\nconnection: keep-alive, Upgrade\r\nupgrade: websocket\r\n\r\n";
        assert!(head(upgrade).upgrade);
        assert!(!head(&upgrade.replace("Upgrade\r", "x\r")).upgrade);
        assert!(!head(&upgrade.replace("1.1", "1.0")).upgrade);
    }
}
