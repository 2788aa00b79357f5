//! The proxy's HTTP/1.1 client (`upstream::wire`) frames an upstream's answer as hyper's
//! client does. Every byte stream here goes to both, split in two at every byte boundary
//! and also fed a byte at a time: both find the same status and body, or both refuse the
//! answer. The answers the proxy refuses on purpose where hyper accepts them are listed,
//! with the reason. Then fuzzing: generated answers decode to the body they were made from
//! (for both), whatever the split, and no bytes whatever make the parser panic.
//!
//! `PROPTEST_CASES=100000 cargo test --test all suite::wire::` fuzzes longer than the default
//! run.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::support::props;
use props::config;

use bytes::{Buf, Bytes, BytesMut};
use compaction_proxy::http1::{parse_head, BodyDecoder, Decoded, WireError};
use http::Method;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a client makes of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Answer(u16, Bytes),
    Refused,
}

fn answer(status: u16, body: &str) -> Outcome {
    Outcome::Answer(status, Bytes::copy_from_slice(body.as_bytes()))
}

/// The proxy's reading of `pieces`, arriving one after the other and then the close, as
/// `upstream::pool` drives `wire`.
fn proxy(method: &Method, pieces: &[&[u8]]) -> Outcome {
    let mut buf = BytesMut::new();
    let mut reading: Option<(u16, BodyDecoder)> = None;
    let mut body = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        if reading.is_none() {
            match parse_head(&mut buf, method) {
                Ok(Some(head)) => {
                    reading = Some((head.status.as_u16(), BodyDecoder::new(head.framing)))
                }
                Ok(None) => continue,
                Err(_) => return Outcome::Refused,
            }
        }
        let Some((status, decoder)) = reading.as_mut() else {
            continue;
        };
        loop {
            match decoder.decode(&mut buf) {
                Ok(Decoded::Data(data)) => body.extend_from_slice(&data),
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::End) => return Outcome::Answer(*status, body.into()),
                Err(_) => return Outcome::Refused,
            }
        }
    }
    match reading.map(|(status, mut decoder)| (status, decoder.close())) {
        Some((status, Ok(()))) => Outcome::Answer(status, body.into()),
        _ => Outcome::Refused,
    }
}

/// An upstream on the other end of hyper's connection: once the request is written, each
/// read gets the next of `pieces`, then the connection closes. Nothing is readable before
/// the request, or hyper would take the answer for stray bytes on an idle connection.
struct Scripted {
    pieces: VecDeque<Bytes>,
    asked: bool,
    reader: Option<Waker>,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.asked {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if let Some(piece) = self.pieces.front_mut() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            piece.advance(n);
            if piece.is_empty() {
                self.pieces.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.asked = true;
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Hyper's client reading of `pieces`, on a connection of its own.
fn hyper(runtime: &tokio::runtime::Runtime, method: &Method, pieces: &[&[u8]]) -> Outcome {
    let upstream = Scripted {
        pieces: pieces.iter().map(|p| Bytes::copy_from_slice(p)).collect(),
        asked: false,
        reader: None,
    };
    runtime.block_on(async {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(upstream))
                .await
                .unwrap();
        // The connection's own error, if any, is the response's or the body's too.
        tokio::spawn(connection);
        let request = http::Request::builder()
            .method(method.clone())
            .uri("/")
            .body(Empty::new())
            .unwrap();
        let Ok(response) = sender.send_request(request).await else {
            return Outcome::Refused;
        };
        let status = response.status().as_u16();
        match response.into_body().collect().await {
            Ok(body) => Outcome::Answer(status, body.to_bytes()),
            Err(_) => Outcome::Refused,
        }
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// `raw` whole, in two at every byte boundary, and a byte at a time.
fn splits(raw: &[u8]) -> Vec<Vec<&[u8]>> {
    let mut all = vec![vec![raw]];
    all.extend((1..raw.len()).map(|at| vec![&raw[..at], &raw[at..]]));
    all.push(raw.chunks(1).collect());
    all
}

/// Both clients read `raw` as `expected` (from the proxy) and `hyper_expected` (from
/// hyper), however it is split.
fn check(
    runtime: &tokio::runtime::Runtime,
    name: &str,
    method: &Method,
    raw: &[u8],
    expected: &Outcome,
    hyper_expected: &Outcome,
) {
    for pieces in splits(raw) {
        let split: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        let context = || format!("{name}, split as {split:?}: {}", raw.escape_ascii());
        assert_eq!(&proxy(method, &pieces), expected, "proxy, {}", context());
        assert_eq!(
            &hyper(runtime, method, &pieces),
            hyper_expected,
            "hyper, {}",
            context()
        );
    }
}

const OK_HEAD: &str = "HTTP/1.1 200 OK\r\n";
const CHUNKED: &str = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";

/// (what, method, the upstream's bytes, what both make of them)
fn agreed() -> Vec<(&'static str, Method, String, Outcome)> {
    let get = Method::GET;
    let refused = Outcome::Refused;
    let many_headers: String = (0..101).map(|i| format!("x-{i}: v\r\n")).collect();
    vec![
        (
            "content-length",
            get.clone(),
            format!("{OK_HEAD}content-length: 11\r\n\r\nhello world"),
            answer(200, "hello world"),
        ),
        (
            "content-length, the next answer behind it",
            get.clone(),
            format!("{OK_HEAD}content-length: 2\r\n\r\nokHTTP/1.1 204 No Content\r\n\r\n"),
            answer(200, "ok"),
        ),
        (
            "equal content-lengths, listed and repeated",
            get.clone(),
            format!("{OK_HEAD}content-length: 2, 2\r\ncontent-length: 2\r\n\r\nok"),
            answer(200, "ok"),
        ),
        (
            "content-length 0",
            get.clone(),
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".into(),
            answer(400, ""),
        ),
        (
            "chunked, with extensions and trailers",
            get.clone(),
            format!(
                "{CHUNKED}5;name=value\r\nhello\r\n7 ; a=\"b c\";d\r\n, world\r\n0;end\r\nx-checksum: abc\r\nx-other: 1\r\n\r\n"
            ),
            answer(200, "hello, world"),
        ),
        (
            "chunked, hex in either case, leading zeros, whitespace after the size",
            get.clone(),
            format!("{CHUNKED}00A \t\r\n0123456789\r\nb\r\n0123456789a\r\n000\r\n\r\n"),
            answer(200, "01234567890123456789a"),
        ),
        (
            "chunked beside a content-length, which it overrides",
            get.clone(),
            format!(
                "{OK_HEAD}content-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            ),
            answer(200, "hello"),
        ),
        (
            "chunked, named in any case",
            get.clone(),
            format!("{OK_HEAD}transfer-encoding: ChUnKeD\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
            answer(200, "ok"),
        ),
        (
            "close-delimited",
            get.clone(),
            format!("{OK_HEAD}content-type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2\n\n"),
            answer(200, "data: 1\n\ndata: 2\n\n"),
        ),
        (
            "close-delimited, HTTP/1.0",
            get.clone(),
            "HTTP/1.0 200 OK\r\n\r\nuntil the close".into(),
            answer(200, "until the close"),
        ),
        (
            "HTTP/1.0 with a content-length",
            get.clone(),
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok".into(),
            answer(200, "ok"),
        ),
        (
            "204 has no body, whatever its headers say",
            get.clone(),
            "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n".into(),
            answer(204, ""),
        ),
        (
            "304 has no body, whatever its headers say",
            get.clone(),
            "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n".into(),
            answer(304, ""),
        ),
        (
            "an answer to HEAD has no body",
            Method::HEAD,
            format!("{OK_HEAD}content-length: 5\r\n\r\n"),
            answer(200, ""),
        ),
        (
            "an answer to HEAD has no body, even chunked",
            Method::HEAD,
            CHUNKED.into(),
            answer(200, ""),
        ),
        (
            "interim answers are skipped",
            Method::POST,
            format!(
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n{OK_HEAD}content-length: 2\r\n\r\nok"
            ),
            answer(200, "ok"),
        ),
        (
            "a header value with bytes beyond ASCII",
            get.clone(),
            format!("{OK_HEAD}x-name: caf\u{e9}\r\ncontent-length: 2\r\n\r\nok"),
            answer(200, "ok"),
        ),
        ("no bytes at all", get.clone(), String::new(), refused.clone()),
        (
            "only an interim answer",
            get.clone(),
            "HTTP/1.1 100 Continue\r\n\r\n".into(),
            refused.clone(),
        ),
        (
            "a head cut short",
            get.clone(),
            format!("{OK_HEAD}content-le"),
            refused.clone(),
        ),
        (
            "content-length cut short by the close",
            get.clone(),
            format!("{OK_HEAD}content-length: 11\r\n\r\nhello"),
            refused.clone(),
        ),
        (
            "differing content-lengths",
            get.clone(),
            format!("{OK_HEAD}content-length: 2\r\ncontent-length: 3\r\n\r\nok!"),
            refused.clone(),
        ),
        (
            "differing content-lengths in one header",
            get.clone(),
            format!("{OK_HEAD}content-length: 2, 3\r\n\r\nok!"),
            refused.clone(),
        ),
        (
            "a signed content-length",
            get.clone(),
            format!("{OK_HEAD}content-length: +2\r\n\r\nok"),
            refused.clone(),
        ),
        (
            "chunked, cut short before the last chunk",
            get.clone(),
            format!("{CHUNKED}5\r\nhello\r\n"),
            refused.clone(),
        ),
        (
            "chunked, cut short in the trailers",
            get.clone(),
            format!("{CHUNKED}5\r\nhello\r\n0\r\nx-a: b\r\n"),
            refused.clone(),
        ),
        (
            "a chunk size that is not hex",
            get.clone(),
            format!("{CHUNKED}5g\r\nhello\r\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "a chunk size over 64 bits",
            get.clone(),
            format!("{CHUNKED}10000000000000000\r\nhello\r\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "whitespace before a chunk size",
            get.clone(),
            format!("{CHUNKED} 5\r\nhello\r\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "chunk data longer than its size",
            get.clone(),
            format!("{CHUNKED}5\r\nhello!\r\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "a bare LF after a chunk size",
            get.clone(),
            format!("{CHUNKED}5\nhello\r\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "a bare LF after chunk data",
            get.clone(),
            format!("{CHUNKED}5\r\nhello\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "a bare LF in a chunk extension",
            get.clone(),
            format!("{CHUNKED}5;a\nb\r\nhello\r\n0\r\n\r\n"),
            refused.clone(),
        ),
        (
            "a trailer that is not a header field",
            get.clone(),
            format!("{CHUNKED}5\r\nhello\r\n0\r\nnot a field\r\n\r\n"),
            refused.clone(),
        ),
        (
            "chunked in HTTP/1.0",
            get.clone(),
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".into(),
            refused.clone(),
        ),
        (
            "not HTTP",
            get.clone(),
            "hello world\r\n\r\n".into(),
            refused.clone(),
        ),
        (
            "HTTP/2",
            get.clone(),
            "HTTP/2 200 OK\r\n\r\n".into(),
            refused.clone(),
        ),
        (
            "a status of four digits",
            get.clone(),
            "HTTP/1.1 2000 OK\r\ncontent-length: 0\r\n\r\n".into(),
            refused.clone(),
        ),
        (
            "a status below 100",
            get.clone(),
            "HTTP/1.1 099 Odd\r\ncontent-length: 0\r\n\r\n".into(),
            refused.clone(),
        ),
        (
            "whitespace before a header's colon",
            get.clone(),
            format!("{OK_HEAD}content-length : 2\r\n\r\nok"),
            refused.clone(),
        ),
        (
            "a header folded over two lines",
            get.clone(),
            format!("{OK_HEAD}x-a: b\r\n c\r\ncontent-length: 2\r\n\r\nok"),
            refused.clone(),
        ),
        (
            "a NUL in a header value",
            get.clone(),
            format!("{OK_HEAD}x-a: b\0c\r\ncontent-length: 2\r\n\r\nok"),
            refused.clone(),
        ),
        (
            "over 100 header fields",
            get.clone(),
            format!("{OK_HEAD}{many_headers}content-length: 2\r\n\r\nok"),
            refused.clone(),
        ),
    ]
}

#[test]
fn the_proxy_frames_answers_as_hyper_does_however_they_are_split() {
    let runtime = runtime();
    for (name, method, raw, expected) in agreed() {
        check(
            &runtime,
            name,
            &method,
            raw.as_bytes(),
            &expected,
            &expected,
        );
    }
}

/// Answers hyper reads and the proxy refuses with a 502, on purpose.
#[test]
fn answers_the_proxy_refuses_where_hyper_does_not() {
    let runtime = runtime();
    let cases = [
        // A transfer coding other than chunked belongs to this hop, and the header naming
        // it does not cross the proxy: relaying the bytes would hand the client a body
        // still coded, with nothing saying so. hyper reads such a body to the close, or
        // removes the chunked coding alone, and leaves the rest to its caller. nginx and
        // Envoy refuse these answers too.
        (
            "gzip",
            format!("{OK_HEAD}transfer-encoding: gzip\r\n\r\ncoded"),
            answer(200, "coded"),
        ),
        (
            "gzip, then chunked",
            format!("{OK_HEAD}transfer-encoding: gzip, chunked\r\n\r\n5\r\ncoded\r\n0\r\n\r\n"),
            answer(200, "coded"),
        ),
        // Chunked twice would need decoding twice; hyper decodes once.
        (
            "chunked twice",
            format!("{OK_HEAD}transfer-encoding: chunked, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
            answer(200, "ok"),
        ),
        // hyper hands the connection to its caller for the new protocol; the proxy relays
        // no upgrades, and none of its requests asks for one.
        (
            "an upgrade",
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n".into(),
            answer(101, ""),
        ),
    ];
    for (name, raw, hyper_reads) in cases {
        check(
            &runtime,
            name,
            &Method::GET,
            raw.as_bytes(),
            &Outcome::Refused,
            &hyper_reads,
        );
    }
}

#[derive(Debug, Clone)]
enum Framing {
    Length,
    Chunked {
        /// Where the body is cut into chunks.
        cuts: Vec<usize>,
        upper_hex: bool,
        leading_zeros: usize,
        extensions: bool,
        trailers: Vec<(&'static str, Vec<u8>)>,
    },
    Close,
}

/// An answer as a well-behaved upstream would write it.
#[derive(Debug, Clone)]
struct Generated {
    http_10: bool,
    interim: bool,
    status: u16,
    headers: Vec<(&'static str, Vec<u8>)>,
    framing: Framing,
    body: Vec<u8>,
}

impl Generated {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.interim {
            out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let version = if self.http_10 { "1.0" } else { "1.1" };
        out.extend_from_slice(format!("HTTP/{version} {} Reason\r\n", self.status).as_bytes());
        for (name, value) in &self.headers {
            field(&mut out, name, value);
        }
        match &self.framing {
            Framing::Length => {
                out.extend_from_slice(
                    format!("content-length: {}\r\n\r\n", self.body.len()).as_bytes(),
                );
                out.extend_from_slice(&self.body);
            }
            Framing::Close => {
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&self.body);
            }
            Framing::Chunked {
                cuts,
                upper_hex,
                leading_zeros,
                extensions,
                trailers,
            } => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(self.body.len())).collect();
                cuts.extend([0, self.body.len()]);
                cuts.sort_unstable();
                cuts.dedup();
                let size_line = |out: &mut Vec<u8>, size: usize| {
                    let hex = format!("{size:0width$x}", width = leading_zeros + 1);
                    let hex = if *upper_hex { hex.to_uppercase() } else { hex };
                    out.extend_from_slice(hex.as_bytes());
                    if *extensions {
                        out.extend_from_slice(b" ;name=\"a value\";flag");
                    }
                    out.extend_from_slice(b"\r\n");
                };
                for chunk in cuts.windows(2) {
                    size_line(&mut out, chunk[1] - chunk[0]);
                    out.extend_from_slice(&self.body[chunk[0]..chunk[1]]);
                    out.extend_from_slice(b"\r\n");
                }
                size_line(&mut out, 0);
                for (name, value) in trailers {
                    field(&mut out, name, value);
                }
                out.extend_from_slice(b"\r\n");
            }
        }
        out
    }
}

fn field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A header field: a name the framing does not depend on, and a value of visible ASCII
/// and spaces (not at its ends, where they are not part of the value).
fn header() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let name = prop::sample::select(vec!["content-type", "x-request-id", "openai-model", "date"]);
    let value = prop::collection::vec(0x21u8..0x7f, 1..24);
    (name, value)
}

fn framing() -> impl Strategy<Value = Framing> {
    let chunked = (
        prop::collection::vec(0usize..600, 0..8),
        any::<bool>(),
        0usize..4,
        any::<bool>(),
        prop::collection::vec(header(), 0..3),
    )
        .prop_map(
            |(cuts, upper_hex, leading_zeros, extensions, trailers)| Framing::Chunked {
                cuts,
                upper_hex,
                leading_zeros,
                extensions,
                trailers,
            },
        );
    prop_oneof![Just(Framing::Length), Just(Framing::Close), chunked]
}

fn generated() -> impl Strategy<Value = Generated> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![200u16, 201, 400, 404, 413, 429, 500, 502, 503]),
        prop::collection::vec(header(), 0..4),
        framing(),
        prop::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(
            |(http_10, interim, status, headers, framing, body)| Generated {
                // HTTP/1.0 has no chunked coding.
                http_10: http_10 && !matches!(framing, Framing::Chunked { .. }),
                interim,
                status,
                headers,
                framing,
                body,
            },
        )
}

/// `raw` cut at `at` (indices into it, in any order).
fn cut<'a>(raw: &'a [u8], at: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = at.iter().map(|i| i.index(raw.len() + 1)).collect();
    points.extend([0, raw.len()]);
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| &raw[w[0]..w[1]]).collect()
}

/// Whether the proxy refuses `raw` for one of the reasons in
/// `answers_the_proxy_refuses_where_hyper_does_not`.
fn refused_on_purpose(raw: &[u8]) -> bool {
    matches!(
        parse_head(&mut BytesMut::from(raw), &Method::GET),
        Err(WireError::TransferCoding(_) | WireError::Upgrade)
    )
}

/// A generated answer with a few bytes replaced, inserted or removed.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let edit = (any::<prop::sample::Index>(), 0u8..3, any::<u8>());
    (generated(), prop::collection::vec(edit, 1..4)).prop_map(|(answer, edits)| {
        let mut raw = answer.encode();
        for (at, kind, byte) in edits {
            let at = at.index(raw.len() + 1);
            match kind {
                0 if at < raw.len() => raw[at] = byte,
                1 => raw.insert(at, byte),
                _ if at < raw.len() => {
                    raw.remove(at);
                }
                _ => raw.push(byte),
            }
        }
        raw
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn generated_answers_decode_to_their_body_for_both_whatever_the_split(
        answer in generated(),
        at in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let raw = answer.encode();
        let pieces = cut(&raw, &at);
        let expected = Outcome::Answer(answer.status, answer.body.clone().into());
        prop_assert_eq!(proxy(&Method::GET, &pieces), expected.clone());
        prop_assert_eq!(hyper(&runtime(), &Method::GET, &pieces), expected);
    }

    #[test]
    fn damaged_answers_are_read_alike_by_both(
        raw in mutated(),
        at in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let pieces = cut(&raw, &at);
        let read = proxy(&Method::GET, &pieces);
        if refused_on_purpose(&raw) {
            prop_assert_eq!(read, Outcome::Refused);
        } else {
            prop_assert_eq!(read, hyper(&runtime(), &Method::GET, &pieces));
        }
    }

    /// Whatever arrives, the parser answers or refuses without panicking, and how the
    /// bytes are split never changes which.
    #[test]
    fn any_bytes_are_read_the_same_whatever_the_split(
        raw in prop_oneof![prop::collection::vec(any::<u8>(), 0..1024), mutated()],
        head in any::<bool>(),
        at in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let method = if head { Method::HEAD } else { Method::GET };
        let whole = proxy(&method, &[&raw]);
        prop_assert_eq!(proxy(&method, &cut(&raw, &at)), whole.clone());
        let bytewise: Vec<&[u8]> = raw.chunks(1).collect();
        prop_assert_eq!(proxy(&method, &bytewise), whole);
    }
}
