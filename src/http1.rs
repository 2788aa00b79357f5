//! HTTP/1.1 as bytes, for both sides (RFC 9112): the rules that belong to the message
//! (what frames a body, whether the connection is kept, chunk lines, the body's decoder)
//! serve the server (`server`) and the client (`upstream`); the client's own part is the
//! request head written out and the response head parsed. No I/O here: each side's
//! connection feeds these functions what it reads and writes what they make.
//!
//! Answers are framed as hyper's client frames them (`tests/suite/wire.rs` holds
//! the two side by side), except that a transfer coding other than `chunked` is refused
//! rather than relayed. A switch of protocols (101) is the answer only to a request that
//! asked for one; to any other it is an error, as in hyper.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

/// Response heads longer than this are refused, as hyper's client does by default.
const MAX_HEAD: usize = 64 * 1024;
/// Header fields in one response head, at most (hyper's client default).
const MAX_HEADERS: usize = 100;
/// A chunk-size line (with any extensions) or trailer line longer than this is refused.
const MAX_LINE: usize = 4 * 1024;
/// Trailer section bytes tolerated (and dropped) at the end of a chunked body.
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("malformed response head from the upstream: {0}")]
    Head(httparse::Error),
    #[error("the upstream's response head is over {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("the upstream sent an invalid header: {0}")]
    Header(String),
    #[error("the upstream sent an invalid Content-Length")]
    ContentLength,
    #[error("the upstream switched protocols on a request that asked for no upgrade")]
    Upgrade,
    #[error("the upstream used a transfer coding the proxy does not relay: {0}")]
    TransferCoding(String),
    #[error("the upstream sent Transfer-Encoding in an HTTP/1.0 answer")]
    TransferEncodingInHttp10,
    #[error("malformed chunked body from the upstream")]
    Chunked,
    #[error("the upstream closed the connection mid-body")]
    Truncated,
}

/// How the request body is delimited on the wire, beyond the headers already written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// `Content-Length` is among the headers already, or there is no body.
    AsIs,
    /// `Content-Length: 0` added: a body-carrying method with an empty body.
    EmptyLength,
    /// Length unknown: `Transfer-Encoding: chunked`.
    Chunked,
}

/// How a body of `length` (if known) goes out, when `has_length` says whether a
/// `Content-Length` header was written.
pub fn request_framing(method: &Method, length: Option<u64>, has_length: bool) -> RequestFraming {
    match length {
        _ if has_length => RequestFraming::AsIs,
        Some(0) if matches!(*method, Method::POST | Method::PUT | Method::PATCH) => {
            RequestFraming::EmptyLength
        }
        Some(_) => RequestFraming::AsIs,
        None => RequestFraming::Chunked,
    }
}

/// Writes the request line; the origin-form target is the concatenation of `target`.
pub fn request_line(out: &mut Vec<u8>, method: &Method, target: &[&str]) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    for part in target {
        out.extend_from_slice(part.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

pub fn header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

pub fn content_length(out: &mut Vec<u8>, length: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(decimal(&mut [0; 20], length));
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written into the end of `buf`: every request's length line, where
/// `write!`'s formatting machinery cost three times as much.
pub fn decimal(buf: &mut [u8; 20], mut n: u64) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[start..];
        }
    }
}

/// Ends the head: the framing header if one is needed, then the blank line.
pub fn end_head(out: &mut Vec<u8>, framing: RequestFraming) {
    match framing {
        RequestFraming::AsIs => {}
        RequestFraming::EmptyLength => out.extend_from_slice(b"content-length: 0\r\n"),
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// A response head and how its body is delimited.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request after this exchange.
    pub keep_alive: bool,
}

/// How a body follows its head, on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body at all (an answer to HEAD, a 1xx, 204 or 304).
    Empty,
    Length(u64),
    Chunked,
    /// Everything until the sender closes the connection.
    UntilClose,
}

/// Parses a response head from the front of `buf` and removes it. `Ok(None)` when more
/// bytes are needed. Interim 1xx responses are skipped.
pub fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<ResponseHead>, WireError> {
    parse(buf, method, false)
}

/// As [`parse_head`], for a request that asked to switch protocols (`Upgrade`): a 101 is
/// then its answer, with no body, after which the connection carries the new protocol
/// (what follows the head in `buf` is its first bytes).
pub fn parse_upgrade_head(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<ResponseHead>, WireError> {
    parse(buf, method, true)
}

fn parse(
    buf: &mut BytesMut,
    method: &Method,
    upgrade_asked: bool,
) -> Result<Option<ResponseHead>, WireError> {
    loop {
        // Left uninitialised: zeroing room for every header the parser might meet costs
        // more than parsing a typical head.
        let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut response,
            buf,
            &mut slots,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(WireError::HeadTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::HeadTooLarge),
            Err(e) => return Err(WireError::Head(e)),
        };
        let code = response.code.unwrap_or_default();
        let status =
            StatusCode::from_u16(code).map_err(|_| WireError::Head(httparse::Error::Status))?;
        let switched = status == StatusCode::SWITCHING_PROTOCOLS;
        if switched && !upgrade_asked {
            return Err(WireError::Upgrade);
        }
        if status.is_informational() && !switched {
            buf.advance(len);
            continue;
        }
        let version = match response.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // Values are kept as slices of the head's bytes, not copied: the head is split off
        // the buffer once the parser's borrow of it is over.
        let base = buf.as_ptr() as usize;
        let mut fields = Vec::with_capacity(response.headers.len());
        let mut present = Present::default();
        for field in response.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| WireError::Header(field.name.to_owned()))?;
            present.note_field(&name, field.value);
            let start = field.value.as_ptr() as usize - base;
            fields.push((name, start, start + field.value.len()));
        }
        let head = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(fields.len());
        for (name, start, end) in fields {
            let value = HeaderValue::from_maybe_shared(head.slice(start..end))
                .map_err(|_| WireError::Header(name.to_string()))?;
            headers.append(name, value);
        }
        let framing = match switched {
            true => Framing::Empty,
            false => framing(method, status, version, &headers, present)?,
        };
        // RFC 9112 section 6.3: beside Transfer-Encoding, Content-Length is wrong and an
        // intermediary must remove it. hyper frames the client's response by the
        // Content-Length it is given, so relaying it would cut the decoded body short.
        if present.transfer_encoding && present.content_length {
            headers.remove(header::CONTENT_LENGTH);
        }
        let keep_alive =
            !switched && framing != Framing::UntilClose && present.keeps_alive(version, &headers);
        return Ok(Some(ResponseHead {
            status,
            version,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// RFC 9112 section 6.3, for responses.
fn framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    present: Present,
) -> Result<Framing, WireError> {
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if present.transfer_encoding {
        // RFC 9112 section 6.1: HTTP/1.0 has no transfer codings, so such an answer has
        // passed through something that did not decode them; its framing is faulty.
        if version == Version::HTTP_10 {
            return Err(WireError::TransferEncodingInHttp10);
        }
        return only_chunked(headers).map(|()| Framing::Chunked);
    }
    let length = present.declared_length();
    let length = length.map_err(|BadLength| WireError::ContentLength)?;
    Ok(match length {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// Accepts `Transfer-Encoding: chunked` alone. Any other coding (`gzip`, `gzip,
/// chunked`) describes this hop only: relaying the bytes without decoding it would hand
/// the client coded bytes as the body, so such an answer is refused, as nginx and Envoy
/// refuse it.
fn only_chunked(headers: &HeaderMap) -> Result<(), WireError> {
    if chunked_alone(headers) {
        return Ok(());
    }
    let all = headers.get_all(header::TRANSFER_ENCODING).iter();
    let listed: Vec<_> = all.map(|v| String::from_utf8_lossy(v.as_bytes())).collect();
    Err(WireError::TransferCoding(listed.join(", ")))
}

// The rules below are the message's, not one side's: the server side
// (`server::head`) reads a request's head by them too.

/// Which of the fields that frame a message or steer its connection a head carries,
/// noted as the head is parsed: each is then looked up in the header map only when it is
/// there. Most heads carry one or two of them, and every lookup hashes its name (these
/// lookups were a tenth of the cost of parsing a head).
#[derive(Debug, Default, Clone, Copy)]
pub struct Present {
    pub transfer_encoding: bool,
    pub content_length: bool,
    pub connection: bool,
    pub expect: bool,
    pub upgrade: bool,
    /// The length the `Content-Length` fields given to [`Present::note_field`] declare,
    /// read as they are met rather than looked up again once the map is built (a lookup
    /// and a parse, 380 instructions a head).
    length: Option<u64>,
    bad_length: bool,
}

impl Present {
    pub fn note(&mut self, name: &HeaderName) {
        let seen = match *name {
            header::TRANSFER_ENCODING => &mut self.transfer_encoding,
            header::CONTENT_LENGTH => &mut self.content_length,
            header::CONNECTION => &mut self.connection,
            header::EXPECT => &mut self.expect,
            header::UPGRADE => &mut self.upgrade,
            _ => return,
        };
        *seen = true;
    }

    /// [`Present::note`], and a `Content-Length`'s value read, for
    /// [`Present::declared_length`].
    pub fn note_field(&mut self, name: &HeaderName, value: &[u8]) {
        self.note(name);
        if *name == header::CONTENT_LENGTH && add_length(&mut self.length, value).is_err() {
            self.bad_length = true;
        }
    }

    /// The length the `Content-Length` fields given to [`Present::note_field`] declare,
    /// if any. RFC 9110 section 8.6: a list of equal values (`5, 5`) is one length;
    /// anything else that is not a decimal number is an error.
    pub fn declared_length(self) -> Result<Option<u64>, BadLength> {
        match self.bad_length {
            true => Err(BadLength),
            false => Ok(self.length),
        }
    }

    /// [`keeps_alive`], without a lookup when there is no `Connection`.
    pub fn keeps_alive(self, version: Version, headers: &HeaderMap) -> bool {
        match self.connection {
            true => keeps_alive(version, headers),
            false => keeps_alive_by_default(version),
        }
    }
}

/// A `Content-Length` that is not a number, or lists two different ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadLength;

/// `digits` as a decimal number: one or more ASCII digits that fit a `u64`, nothing else
/// (no sign, no space).
pub fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let digit = d.is_ascii_digit().then(|| u64::from(d - b'0'))?;
        n.checked_mul(10)?.checked_add(digit)
    })
}

/// One `Content-Length` field's value, added to the `length` of those before it.
fn add_length(length: &mut Option<u64>, value: &[u8]) -> Result<(), BadLength> {
    for part in value.split(|&b| b == b',') {
        let n = parse_decimal(part.trim_ascii()).ok_or(BadLength)?;
        if length.is_some_and(|l| l != n) {
            return Err(BadLength);
        }
        *length = Some(n);
    }
    Ok(())
}

/// Whether `Transfer-Encoding` names `chunked` and nothing else.
pub fn chunked_alone(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    match (codings.next(), codings.next()) {
        (Some(coding), None) => coding.eq_ignore_ascii_case(b"chunked"),
        _ => false,
    }
}

/// The options listed in `Connection`.
pub fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
}

/// HTTP/1.1 keeps the connection unless `close` is said; HTTP/1.0 only with `keep-alive`.
pub fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let (mut close, mut keep_alive) = (false, false);
    for token in connection_options(headers) {
        close |= token.eq_ignore_ascii_case(b"close");
        keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
    }
    match version {
        Version::HTTP_10 => keep_alive && !close,
        _ => !close,
    }
}

/// [`keeps_alive`] of a head without `Connection`.
fn keeps_alive_by_default(version: Version) -> bool {
    version != Version::HTTP_10
}

/// Where a response body is in its framing: what comes next from the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyDecoder {
    /// This many bytes left.
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => BodyDecoder::Done,
            Framing::Length(n) => BodyDecoder::Length(n),
            Framing::Chunked => BodyDecoder::Chunked(Chunked::Size),
            Framing::UntilClose => BodyDecoder::UntilClose,
        }
    }

    /// Takes the next piece of the body from the front of `buf`. After the piece that
    /// completes a body of known length the state is already `Done`, so the connection
    /// can be released without another read.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        match self {
            BodyDecoder::Done => Ok(Decoded::End),
            BodyDecoder::Length(_) | BodyDecoder::UntilClose if buf.is_empty() => {
                Ok(Decoded::NeedMore)
            }
            BodyDecoder::Length(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= n as u64;
                if *left == 0 {
                    *self = BodyDecoder::Done;
                }
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            BodyDecoder::Chunked(chunked) => {
                let decoded = chunked.decode(buf)?;
                if matches!(decoded, Decoded::End) {
                    *self = BodyDecoder::Done;
                }
                Ok(decoded)
            }
            BodyDecoder::UntilClose => Ok(Decoded::Data(buf.split().freeze())),
        }
    }

    /// The upstream has closed the connection: the end of a body delimited by the close,
    /// a truncated one otherwise.
    pub fn close(&mut self) -> Result<(), WireError> {
        match self {
            BodyDecoder::UntilClose | BodyDecoder::Done => {
                *self = BodyDecoder::Done;
                Ok(())
            }
            BodyDecoder::Length(_) | BodyDecoder::Chunked(_) => Err(WireError::Truncated),
        }
    }
}

/// Decodes a chunked body as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunked {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk, this many bytes left.
    Data(u64),
    /// After a chunk's data, expecting its CRLF.
    DataEnd,
    /// After the last chunk, this many trailer bytes seen so far.
    Trailers(usize),
    Done,
}

pub enum Decoded {
    Data(Bytes),
    /// `buf` holds no complete piece: read more.
    NeedMore,
    End,
}

impl Chunked {
    /// Takes the next piece of the body from the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match *self {
                Chunked::Done => return Ok(Decoded::End),
                Chunked::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    *self = match chunk_size(&line)? {
                        0 => Chunked::Trailers(0),
                        n => Chunked::Data(n),
                    };
                }
                Chunked::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    *self = match left - n as u64 {
                        0 => Chunked::DataEnd,
                        rest => Chunked::Data(rest),
                    };
                    return Ok(Decoded::Data(data));
                }
                Chunked::DataEnd => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    if !line.is_empty() {
                        return Err(WireError::Chunked);
                    }
                    *self = Chunked::Size;
                }
                Chunked::Trailers(seen) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let seen = seen + line.len() + 2;
                    if seen > MAX_TRAILERS {
                        return Err(WireError::Chunked);
                    }
                    if line.is_empty() {
                        *self = Chunked::Done;
                        continue;
                    }
                    // Trailers are dropped, but a malformed one is malformed framing.
                    trailer_field(&line)?;
                    *self = Chunked::Trailers(seen);
                }
            }
        }
    }
}

/// The size on a chunk-size line: hex digits from its first byte, then optional spaces
/// and tabs, then nothing or extensions (ignored) after a `;`. Stricter than RFC 9112's
/// leniency allows, as hyper is: no leading whitespace, no bare LF (see `take_line`).
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let spaces = line[digits..]
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let rest = &line[digits + spaces..];
    if digits == 0 || !(rest.is_empty() || rest[0] == b';') {
        return Err(WireError::Chunked);
    }
    let digits = std::str::from_utf8(&line[..digits]).map_err(|_| WireError::Chunked)?;
    u64::from_str_radix(digits, 16).map_err(|_| WireError::Chunked)
}

/// Checks one trailer line is a header field, as hyper checks the trailers it decodes.
fn trailer_field(line: &[u8]) -> Result<(), WireError> {
    let section = [line, b"\r\n\r\n"].concat();
    let mut field = [httparse::EMPTY_HEADER; 1];
    match httparse::parse_headers(&section, &mut field) {
        Ok(httparse::Status::Complete(_)) => Ok(()),
        _ => Err(WireError::Chunked),
    }
}

/// Removes one CRLF-terminated line from the front of `buf` and returns it without its
/// terminator; `None` when no whole line is there yet. A bare LF or CR is an error: a chunked
/// body's lines end in CRLF (RFC 9112 section 7.1), and reading LF alone as an end of
/// line is how two parsers come to disagree about where a body ends.
fn take_line(buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
    let Some(end) = memchr::memchr(b'\n', buf) else {
        return match buf.len() > MAX_LINE {
            true => Err(WireError::Chunked),
            false => Ok(None),
        };
    };
    // A CR ends a line, as in hyper: one anywhere else is an error too.
    if end == 0 || memchr::memchr(b'\r', &buf[..end]) != Some(end - 1) {
        return Err(WireError::Chunked);
    }
    let mut line = buf.split_to(end + 1).freeze();
    line.truncate(end - 1);
    Ok(Some(line))
}

/// The chunk-size line that precedes `len` bytes of data.
pub fn chunk_header(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(chunk_size_line(&mut [0; 18], len));
}

/// `len` in lowercase hex and CRLF, in `buf`: the chunk-size line, without allocating.
pub fn chunk_size_line(buf: &mut [u8; 18], len: usize) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, slot) in buf[..digits].iter_mut().enumerate() {
        let shift = 4 * (digits - 1 - i);
        *slot = HEX[(len >> shift) & 0xf];
    }
    buf[digits..digits + 2].copy_from_slice(b"\r\n");
    &buf[..digits + 2]
}

pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        let mut buf = [0; 18];
        for (len, line) in [
            (1, "1\r\n"),
            (15, "f\r\n"),
            (16, "10\r\n"),
            (255, "ff\r\n"),
            (0x1234abc, "1234abc\r\n"),
        ] {
            assert_eq!(chunk_size_line(&mut buf, len), line.as_bytes());
        }
        assert_eq!(chunk_size_line(&mut buf, usize::MAX).len(), 18);
    }

    fn head(raw: &str, method: &Method) -> Result<Option<ResponseHead>, WireError> {
        parse_head(&mut BytesMut::from(raw.as_bytes()), method)
    }

    #[test]
    fn request_heads_are_written_as_given_with_their_framing() {
        let mut out = Vec::new();
        request_line(&mut out, &Method::POST, &["/v1", "/x", "?q=1"]);
        header(&mut out, "host", b"up:8080");
        header(&mut out, "x-b", b"2");
        end_head(&mut out, RequestFraming::Chunked);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/x?q=1 HTTP/1.1\r\nhost: up:8080\r\nx-b: 2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn request_framing_follows_the_body() {
        let framing = request_framing;
        assert_eq!(framing(&Method::GET, Some(0), false), RequestFraming::AsIs);
        assert_eq!(
            framing(&Method::POST, Some(0), false),
            RequestFraming::EmptyLength
        );
        assert_eq!(framing(&Method::POST, Some(3), true), RequestFraming::AsIs);
        assert_eq!(framing(&Method::POST, None, false), RequestFraming::Chunked);
    }

    #[test]
    fn response_head_is_parsed_and_removed() {
        let mut buf =
            BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Y: z\r\n\r\nokNEXT"[..]);
        let head = parse_head(&mut buf, &Method::GET).unwrap().unwrap();
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.framing, Framing::Length(2));
        assert!(head.keep_alive);
        assert_eq!(head.headers["x-y"], "z");
        assert_eq!(&buf[..], b"okNEXT");
    }

    #[test]
    fn partial_heads_wait_for_more() {
        assert!(head("HTTP/1.1 200 OK\r\nContent-Le", &Method::GET)
            .unwrap()
            .is_none());
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(matches!(
            head(&huge, &Method::GET),
            Err(WireError::HeadTooLarge)
        ));
    }

    #[test]
    fn interim_responses_are_skipped() {
        let raw = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
        let head = head(raw, &Method::POST).unwrap().unwrap();
        assert_eq!(head.status, StatusCode::CREATED);
        assert_eq!(head.framing, Framing::Empty);
    }

    #[test]
    fn body_framing_follows_rfc_9112() {
        let framing = |raw: &str, method: &Method| head(raw, method).map(|h| h.unwrap().framing);
        let get = &Method::GET;
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                &Method::HEAD
            )
            .unwrap(),
            Framing::Empty
        );
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\n\r\n", get).unwrap(),
            Framing::Empty
        );
        assert_eq!(
            framing(
                "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
                get
            )
            .unwrap(),
            Framing::Empty
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\ncontent-length: 3\r\n\r\n",
                get
            )
            .unwrap(),
            Framing::Chunked
        );
        for codings in [
            "gzip",
            "gzip, chunked",
            "chunked, chunked",
            "chunked\r\ntransfer-encoding: gzip",
            "",
        ] {
            let raw = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {codings}\r\n\r\n");
            assert!(
                matches!(framing(&raw, get), Err(WireError::TransferCoding(_))),
                "{codings}"
            );
        }
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\n\r\n", get).unwrap(),
            Framing::Length(7)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\n\r\n", get).unwrap(),
            Framing::UntilClose
        );
        // Repeated fields are one list, as RFC 9110 section 5.3 has it.
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ncontent-length: 7\r\nContent-Length: 7\r\n\r\n",
                get
            )
            .unwrap(),
            Framing::Length(7)
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n",
                get
            )
            .unwrap(),
            Framing::Length(u64::MAX)
        );
        for bad in [
            "7, 8",
            "-1",
            "",
            "0x10",
            "7,",
            "+7",
            "18446744073709551616",
            "7\r\ncontent-length: 8",
        ] {
            let raw = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert!(
                matches!(framing(&raw, get), Err(WireError::ContentLength)),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_content_length_beside_transfer_encoding_is_removed() {
        let raw = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n";
        let head = head(raw, &Method::GET).unwrap().unwrap();
        assert!(head.headers.get(header::CONTENT_LENGTH).is_none());
        assert_eq!(head.headers[header::TRANSFER_ENCODING], "chunked");
    }

    #[test]
    fn lengths_are_written_in_decimal() {
        for n in [0, 7, 10, 216, 1_000_000, u64::MAX] {
            let mut out = Vec::new();
            content_length(&mut out, n);
            assert_eq!(out, format!("content-length: {n}\r\n").into_bytes());
        }
    }

    #[test]
    fn the_fields_that_frame_a_message_are_noted_whatever_their_case() {
        // Every field of `Present`, so that one added later must be listed here too.
        let noted = |names: &[&str]| {
            let mut present = Present::default();
            for name in names {
                present.note(&HeaderName::from_bytes(name.as_bytes()).unwrap());
            }
            let Present {
                transfer_encoding,
                content_length,
                connection,
                expect,
                upgrade,
                // Read from the values, which `body_framing_follows_rfc_9112` tests.
                length: _,
                bad_length: _,
            } = present;
            (
                present,
                [
                    transfer_encoding,
                    content_length,
                    connection,
                    expect,
                    upgrade,
                ],
            )
        };
        let (_, all) = noted(&[
            "Transfer-Encoding",
            "CONTENT-LENGTH",
            "Connection",
            "expect",
            "Upgrade",
        ]);
        assert_eq!(all, [true; 5]);
        let (present, none) = noted(&["x-transfer-encoding", "content-type", "keep-alive"]);
        assert_eq!(none, [false; 5]);
        for version in [Version::HTTP_10, Version::HTTP_11] {
            let none = HeaderMap::new();
            assert_eq!(
                present.keeps_alive(version, &none),
                keeps_alive(version, &none)
            );
        }
    }

    #[test]
    fn keep_alive_follows_version_and_connection() {
        let alive = |raw: &str| head(raw, &Method::GET).unwrap().unwrap().keep_alive;
        assert!(alive("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(!alive(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!alive("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(alive(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!alive("HTTP/1.1 200 OK\r\n\r\n"));
    }

    #[test]
    fn a_switch_is_the_answer_only_to_a_request_that_asked_for_one() {
        let raw: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\
                           upgrade: websocket\r\nconnection: Upgrade\r\n\r\n\x81\x02hi";
        let mut buf = BytesMut::from(raw);
        let head = parse_upgrade_head(&mut buf, &Method::GET).unwrap().unwrap();
        assert_eq!(head.status, StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(head.headers["upgrade"], "websocket");
        assert!(!head.keep_alive);
        assert_eq!(
            &buf[..],
            b"\x81\x02hi",
            "the new protocol's bytes stay unread"
        );
        // Refused: the ordinary answer, framed as any other.
        let raw: &[u8] = b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 2\r\n\r\nno";
        let mut buf = BytesMut::from(raw);
        let head = parse_upgrade_head(&mut buf, &Method::GET).unwrap().unwrap();
        assert_eq!(head.framing, Framing::Length(2));
    }

    #[test]
    fn upgrades_and_garbage_are_errors() {
        assert!(matches!(
            head("HTTP/1.1 101 Switching Protocols\r\n\r\n", &Method::GET),
            Err(WireError::Upgrade)
        ));
        assert!(matches!(
            head("HTTP/9 200 OK\r\n\r\n", &Method::GET),
            Err(WireError::Head(_))
        ));
    }

    fn decode_all(pieces: &[&[u8]]) -> Result<Vec<u8>, WireError> {
        let mut state = Chunked::Size;
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            loop {
                match state.decode(&mut buf)? {
                    Decoded::Data(data) => body.extend_from_slice(&data),
                    Decoded::NeedMore => break,
                    Decoded::End => {
                        assert!(buf.is_empty(), "bytes after the body");
                        return Ok(body);
                    }
                }
            }
        }
        Err(WireError::Chunked)
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_split() {
        let raw = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: t\r\n\r\n";
        assert_eq!(decode_all(&[raw]).unwrap(), b"hello, world");
        for at in 1..raw.len() {
            let (a, b) = raw.split_at(at);
            assert_eq!(
                decode_all(&[a, b]).unwrap(),
                b"hello, world",
                "split at {at}"
            );
        }
        let bytewise: Vec<&[u8]> = raw.chunks(1).collect();
        assert_eq!(decode_all(&bytewise).unwrap(), b"hello, world");
    }

    #[test]
    fn malformed_chunks_are_errors() {
        assert!(decode_all(&[b"zz\r\nhello\r\n0\r\n\r\n"]).is_err());
        assert!(decode_all(&[b"5\r\nhelloXX0\r\n\r\n"]).is_err());
        assert!(decode_all(&[&[b'1'; MAX_LINE + 1][..]]).is_err());
        // Lines end in CRLF, the size starts the line, a trailer is a header field.
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b";5\r\nhello\r\n0\r\n\r\n",
            b"5\x0c\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nnot a field\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\n",
        ] {
            assert!(decode_all(&[bad]).is_err(), "{}", bad.escape_ascii());
        }
        assert_eq!(
            decode_all(&[b"5 \t;a=b\r\nhello\r\n0\r\n\r\n"]).unwrap(),
            b"hello"
        );
    }

    #[test]
    fn transfer_encoding_in_http_1_0_is_faulty_framing() {
        let raw = "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(matches!(
            head(raw, &Method::GET),
            Err(WireError::TransferEncodingInHttp10)
        ));
    }

    #[test]
    fn bodies_end_where_their_framing_says() {
        let mut buf = BytesMut::from(&b"helloNEXT"[..]);
        let mut body = BodyDecoder::new(Framing::Length(5));
        assert!(matches!(body.decode(&mut buf), Ok(Decoded::Data(d)) if d == "hello"));
        assert_eq!(
            body,
            BodyDecoder::Done,
            "done with its last byte, without another read"
        );
        assert_eq!(&buf[..], b"NEXT");

        let mut body = BodyDecoder::new(Framing::Length(9));
        assert!(matches!(body.decode(&mut buf), Ok(Decoded::Data(d)) if d == "NEXT"));
        assert!(matches!(body.decode(&mut buf), Ok(Decoded::NeedMore)));
        assert!(matches!(body.close(), Err(WireError::Truncated)));

        let mut body = BodyDecoder::new(Framing::UntilClose);
        buf.extend_from_slice(b"all of it");
        assert!(matches!(body.decode(&mut buf), Ok(Decoded::Data(d)) if d == "all of it"));
        assert!(body.close().is_ok());
        assert!(matches!(body.decode(&mut buf), Ok(Decoded::End)));

        let mut body = BodyDecoder::new(Framing::Chunked);
        buf.extend_from_slice(b"2\r\nok\r\n");
        assert!(matches!(body.decode(&mut buf), Ok(Decoded::Data(d)) if d == "ok"));
        assert!(matches!(body.close(), Err(WireError::Truncated)));
        assert_eq!(BodyDecoder::new(Framing::Empty), BodyDecoder::Done);
    }

    #[test]
    fn chunk_headers_are_hex() {
        let mut out = Vec::new();
        chunk_header(&mut out, 255);
        assert_eq!(out, b"ff\r\n");
    }
}
