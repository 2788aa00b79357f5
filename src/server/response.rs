//! An answer's head on the wire, and how its body is delimited (RFC 9112 section 6):
//! its own `Content-Length`, else the body's exact size, else chunked, or the close of the
//! connection for an HTTP/1.0 client, which has no chunked coding. No body follows the
//! head of an answer to HEAD, a 1xx, 204 or 304. A `date` is added where the answer has
//! none, as hyper adds one.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap};
use http::{response, Method, StatusCode, Version};
use http_body::SizeHint;

pub use crate::http1::Framing;
use crate::http1::{self as wire, Present};

/// What the answer's head depends on in the request.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    pub head: bool,
    pub version: Version,
    /// The client allows another request on the connection.
    pub keep_alive: bool,
}

impl Asked {
    pub fn new(method: &Method, version: Version, keep_alive: bool) -> Self {
        Asked {
            head: method == Method::HEAD,
            version,
            keep_alive,
        }
    }
}

/// How the head was written: the body's framing, and whether the connection stays open
/// after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub framing: Framing,
    pub keep_alive: bool,
}

/// Writes the head of `parts` into `out`. `body` is the body's size hint; `close` says
/// the connection closes after this answer whatever the client asked (the server drains).
pub fn encode_head(
    out: &mut Vec<u8>,
    parts: &mut response::Parts,
    body: &SizeHint,
    asked: Asked,
    close: bool,
) -> Written {
    let status = parts.status;
    let headers = &mut parts.headers;
    // One pass over the fields; each lookup below is made only for a field that is there.
    // The answer's own `Content-Length` (most answers carry it) is read in this pass
    // rather than looked up again.
    let (mut present, mut dated, mut own_length) = (Present::default(), false, OwnLength::None);
    for (name, value) in headers.iter() {
        present.note(name);
        dated |= name == header::DATE;
        if name == header::CONTENT_LENGTH {
            own_length = own_length.with_field(value.as_bytes());
        }
    }
    // The framing is this hop's to choose.
    if present.transfer_encoding {
        headers.remove(header::TRANSFER_ENCODING);
    }
    let declared = match own_length {
        OwnLength::None => None,
        OwnLength::One(n) => Some(n),
        // Framed as if it had none.
        OwnLength::Bad => {
            headers.remove(header::CONTENT_LENGTH);
            None
        }
    };
    let has_body = !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED);
    // Lines the head needs beyond the answer's own headers, written straight to `out`
    // rather than inserted into the map.
    let mut length_line = None;
    let framing = match (declared, body.exact()) {
        _ if !has_body => Framing::Empty,
        // Told of a HEAD's body only by the answer's own header: an empty body here says
        // nothing of the GET's.
        _ if asked.head => Framing::Empty,
        (Some(n), _) => Framing::Length(n),
        (None, Some(n)) => {
            length_line = Some(n);
            Framing::Length(n)
        }
        (None, None) if asked.version == Version::HTTP_10 => Framing::UntilClose,
        (None, None) => Framing::Chunked,
    };
    let switched = status == StatusCode::SWITCHING_PROTOCOLS;
    let keep_alive = asked.keep_alive
        && !close
        && !switched
        && framing != Framing::UntilClose
        && !(present.connection && says_close(headers));
    status_line(out, asked.version, status);
    for (name, value) in headers.iter() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = length_line {
        wire::content_length(out, n);
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !switched && !present.connection {
        match (asked.version, keep_alive) {
            (Version::HTTP_10, true) => out.extend_from_slice(b"connection: keep-alive\r\n"),
            (Version::HTTP_10, false) | (_, true) => {}
            (_, false) => out.extend_from_slice(b"connection: close\r\n"),
        }
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        with_date(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let framing = match framing {
        Framing::Length(0) => Framing::Empty,
        other => other,
    };
    Written {
        framing,
        keep_alive,
    }
}

/// The answer's own `Content-Length` fields, as they are met: kept only if there is one
/// and it is one number. A list of equal values, which the parser of a head accepts as one
/// length (RFC 9110 section 8.6), is not relayed as it is: it is removed, as anything else
/// that is not one number, and the body framed without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnLength {
    None,
    One(u64),
    Bad,
}

impl OwnLength {
    /// The state once one more field, `value`, is met.
    fn with_field(self, value: &[u8]) -> OwnLength {
        match (self, wire::parse_decimal(value)) {
            (OwnLength::None, Some(n)) => OwnLength::One(n),
            _ => OwnLength::Bad,
        }
    }
}

fn says_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .any(|option| option.trim_ascii().eq_ignore_ascii_case(b"close"))
}

fn status_line(out: &mut Vec<u8>, version: Version, status: StatusCode) {
    out.extend_from_slice(match version {
        Version::HTTP_10 => b"HTTP/1.0 ",
        _ => b"HTTP/1.1 ",
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The head of an answer the connection gives itself to a request it could not read,
/// before closing.
pub fn refusal(out: &mut Vec<u8>, status: StatusCode) {
    status_line(out, Version::HTTP_11, status);
    out.extend_from_slice(b"content-length: 0\r\nconnection: close\r\ndate: ");
    with_date(|date| out.extend_from_slice(date));
    out.extend_from_slice(b"\r\n\r\n");
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` is 29 bytes.
const DATE_LEN: usize = 29;

thread_local! {
    /// The date, formatted once a second per thread rather than once an answer.
    static DATE: RefCell<(u64, [u8; DATE_LEN])> = const { RefCell::new((u64::MAX, [0; DATE_LEN])) };
}

fn with_date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == DATE_LEN {
                text.copy_from_slice(formatted.as_bytes());
                *at = secs;
            }
        }
        f(&text[..]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;

    /// A GET over HTTP/1.1 on a connection the client keeps: what most of these tests ask.
    const GET: Asked = Asked {
        head: false,
        version: Version::HTTP_11,
        keep_alive: true,
    };
    /// A GET over HTTP/1.0 without `connection: keep-alive`.
    const GET_10: Asked = Asked {
        version: Version::HTTP_10,
        keep_alive: false,
        ..GET
    };

    /// The head written for `response`, without its date.
    fn encode(response: Response<()>, body: SizeHint, asked: Asked) -> (String, Written) {
        let (mut parts, ()) = response.into_parts();
        let mut out = Vec::new();
        let written = encode_head(&mut out, &mut parts, &body, asked, false);
        let text = String::from_utf8(out).unwrap();
        // The date changes; the rest is compared.
        let (before, after) = text.split_once("date: ").unwrap();
        let after = &after[DATE_LEN + 2..];
        (format!("{before}{after}"), written)
    }

    fn ok() -> Response<()> {
        Response::builder()
            .header("content-type", "text/plain")
            .body(())
            .unwrap()
    }

    #[test]
    fn a_body_of_known_size_gets_its_length_and_one_of_unknown_size_is_chunked() {
        let (head, written) = encode(ok(), SizeHint::with_exact(5), GET);
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n"
        );
        assert_eq!(
            written,
            Written {
                framing: Framing::Length(5),
                keep_alive: true
            }
        );
        let (head, written) = encode(ok(), SizeHint::default(), GET);
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        assert_eq!(written.framing, Framing::Chunked);
        // The answer's own length wins, a transfer coding of its own does not.
        let own = Response::builder()
            .header("content-length", "3")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let (head, written) = encode(own, SizeHint::default(), GET);
        assert_eq!(head, "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(written.framing, Framing::Length(3));
    }

    #[test]
    fn a_length_that_is_not_one_number_is_dropped_and_the_body_framed_without_it() {
        let too_big = "18446744073709551616";
        for lengths in [
            &["x"][..],
            &["3", "3"],
            &["3, 3"],
            &["3", "x"],
            &["+3"],
            &[""],
            &[too_big],
        ] {
            let mut own = Response::builder();
            for length in lengths {
                own = own.header("content-length", *length);
            }
            let (head, written) = encode(own.body(()).unwrap(), SizeHint::default(), GET);
            assert!(!head.contains("content-length"), "{lengths:?}: {head}");
            assert!(
                head.contains("\r\ntransfer-encoding: chunked\r\n"),
                "{head}"
            );
            assert_eq!(written.framing, Framing::Chunked);
        }
    }

    #[test]
    fn http_1_0_gets_no_chunks_and_keep_alive_only_when_asked() {
        let kept = Asked {
            keep_alive: true,
            ..GET_10
        };
        let (head, written) = encode(ok(), SizeHint::default(), GET_10);
        assert_eq!(head, "HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n");
        assert_eq!(
            written,
            Written {
                framing: Framing::UntilClose,
                keep_alive: false
            }
        );
        let (head, written) = encode(ok(), SizeHint::with_exact(2), kept);
        assert_eq!(
            head,
            "HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n"
        );
        assert!(written.keep_alive);
        // Unknown size: the close ends the body, so the connection cannot be kept.
        let (_, written) = encode(ok(), SizeHint::default(), kept);
        assert!(!written.keep_alive);
    }

    #[test]
    fn no_body_follows_head_1xx_204_or_304() {
        let head_request = Asked { head: true, ..GET };
        let (head, written) = encode(ok(), SizeHint::with_exact(0), head_request);
        assert_eq!(head, "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n");
        assert_eq!(written.framing, Framing::Empty);
        let declared = Response::builder()
            .header("content-length", "9")
            .body(())
            .unwrap();
        let (head, written) = encode(declared, SizeHint::with_exact(0), head_request);
        assert_eq!(head, "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(written.framing, Framing::Empty);
        for status in [204, 304] {
            let response = Response::builder().status(status).body(()).unwrap();
            let (head, written) = encode(response, SizeHint::default(), GET);
            assert!(
                !head.contains("transfer-encoding") && !head.contains("content-length"),
                "{head}"
            );
            assert_eq!(
                written,
                Written {
                    framing: Framing::Empty,
                    keep_alive: true
                }
            );
        }
    }

    #[test]
    fn the_connection_closes_when_either_side_says_so() {
        let close_asked = Asked {
            keep_alive: false,
            ..GET
        };
        let (head, written) = encode(ok(), SizeHint::with_exact(0), close_asked);
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(!written.keep_alive);
        let closing = Response::builder()
            .header("connection", "close")
            .body(())
            .unwrap();
        let (head, written) = encode(closing, SizeHint::with_exact(0), GET);
        assert_eq!(head.matches("connection").count(), 1, "{head}");
        assert!(!written.keep_alive);
        let switched = Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(())
            .unwrap();
        let (head, written) = encode(switched, SizeHint::default(), GET);
        assert_eq!(
            head,
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
        );
        assert_eq!(written.framing, Framing::Empty);
    }

    #[test]
    fn the_date_is_an_http_date() {
        let mut out = Vec::new();
        refusal(&mut out, StatusCode::BAD_REQUEST);
        let text = String::from_utf8(out).unwrap();
        let date = text.split("date: ").nth(1).unwrap().trim_end();
        assert!(httpdate::parse_http_date(date).is_ok(), "{text}");
        assert!(text
            .starts_with("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n"));
    }
}
