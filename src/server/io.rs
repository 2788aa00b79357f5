//! The client's socket and what has been read from it, shared by the connection (which
//! reads heads and writes answers), the request body (which reads itself from the socket
//! while the handler polls it, in the connection's own task) and, after a switch of
//! protocols, whoever takes the connection over.
//!
//! Both live behind one lock, taken within a single poll, so the body needs no channel
//! and no task of its own. The socket is read and written through tokio's `AsyncRead`
//! and `AsyncWrite`, which clear its readiness after a short read or write: a request
//! costs no read that finds nothing. Reads go into one buffer, allocated only when bytes
//! have come: an idle connection holds none.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::http1::BodyDecoder;

/// Bytes asked of the socket per read. Requests of API clients are heads of a few
/// hundred bytes and bodies of a few KB to a few MB.
const READ_SIZE: usize = 8 * 1024;

/// Bytes read onto the stack by a connection that holds no buffer: a typical request
/// head, whole.
const FIRST_READ: usize = 2048;

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

pub struct Shared {
    inbound: Mutex<Inbound>,
}

/// The socket, what has been read and where the request in flight is in it. Locked by
/// one party at a time, within one poll, so never contended but by a body moved to
/// another task.
pub struct Inbound {
    stream: TcpStream,
    /// Bytes read and not yet consumed: the rest of a head, body bytes, pipelined
    /// requests. Empty and unallocated between requests, unless a request is pipelined.
    pub buf: BytesMut,
    /// The request body's framing state; `Done` once it has been read to its end (or
    /// there was none).
    pub body: BodyDecoder,
    /// Whether `100 Continue` is still owed, and how much of it was written.
    pub expect: Continue,
    /// The client closed its side (or the socket failed): no more bytes will come.
    pub eof: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continue {
    /// Not asked for, already sent, or moot since the final answer's head went out.
    No,
    /// Asked for; this many of its bytes written so far.
    Due(usize),
}

impl Shared {
    pub fn new(stream: TcpStream) -> Arc<Self> {
        Arc::new(Shared {
            inbound: Mutex::new(Inbound {
                stream,
                buf: BytesMut::new(),
                body: BodyDecoder::Done,
                expect: Continue::No,
                eof: false,
            }),
        })
    }

    /// The socket and the bytes read from it but not consumed.
    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        let inbound = self
            .inbound
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        (inbound.stream, inbound.buf)
    }

    pub fn lock(&self) -> MutexGuard<'_, Inbound> {
        // A panic while the lock was held leaves plain bytes and states behind.
        self.inbound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes all of `parts`, in one `writev` when the socket takes them.
    pub async fn write_all(&self, parts: &[&[u8]]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut written = 0;
        while written < total {
            let n = poll_fn(|cx| {
                let (slices, count) = remaining(parts, written);
                self.lock().poll_write(cx, &slices[..count])
            })
            .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            written += n;
        }
        Ok(())
    }

    /// Sends the end of the stream: the client reads the answer to its end, then EOF.
    pub async fn shutdown(&self) {
        let _ = poll_fn(|cx| Pin::new(&mut self.lock().stream).poll_shutdown(cx)).await;
    }
}

impl Inbound {
    /// Reads what the socket has into `buf`, allocating it only when bytes have come.
    /// `Ok(0)` at the end of the stream.
    pub fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.eof {
            return Poll::Ready(Ok(0));
        }
        let read = match self.buf.capacity() {
            // A buffer reserved before the bytes come would be held for the whole idle
            // time: the first bytes go to the stack instead.
            0 => self.read_first(cx),
            _ => {
                if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
                    self.buf.reserve(READ_SIZE);
                }
                tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
            }
        };
        let read = ready!(read);
        self.eof = !matches!(read, Ok(1..));
        Poll::Ready(read)
    }

    /// Reads onto the stack, and copies what came into `buf`, allocated for it: the
    /// whole request, most often, which then costs a small allocation rather than a
    /// read buffer's (one that malloc serves from its per-thread cache).
    fn read_first(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut first = [MaybeUninit::uninit(); FIRST_READ];
        let mut read = ReadBuf::uninit(&mut first);
        ready!(Pin::new(&mut self.stream).poll_read(cx, &mut read))?;
        let filled = read.filled();
        if !filled.is_empty() {
            // A full stack buffer says more is waiting.
            let room = match filled.len() {
                FIRST_READ => READ_SIZE,
                n => n,
            };
            self.buf.reserve(room);
            self.buf.extend_from_slice(filled);
        }
        Poll::Ready(Ok(filled.len()))
    }

    /// Writes `100 Continue` if it is owed; `Ready(Ok)` once it is out (or was not owed).
    pub fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Continue::Due(written) = self.expect {
            let n = ready!(self.poll_write(cx, &[IoSlice::new(&CONTINUE[written..])]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.expect = match written + n {
                all if all >= CONTINUE.len() => Continue::No,
                some => Continue::Due(some),
            };
        }
        Poll::Ready(Ok(()))
    }

    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
}

/// At most this many parts per write: a chunk's size line, its data, its CRLF and the
/// last chunk, or a head and a body.
const MAX_PARTS: usize = 4;

/// The parts of `parts` past the first `skip` bytes, as slices for `writev`.
fn remaining<'a>(parts: &[&'a [u8]], mut skip: usize) -> ([IoSlice<'a>; MAX_PARTS], usize) {
    let mut slices = [IoSlice::new(&[]); MAX_PARTS];
    let mut count = 0;
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        if count == MAX_PARTS {
            break;
        }
        slices[count] = IoSlice::new(&part[skip..]);
        skip = 0;
        count += 1;
    }
    (slices, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn an_idle_connection_holds_no_read_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let shared = Shared::new(listener.accept().await.unwrap().0);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let read = poll_fn(|cx| shared.lock().poll_read(cx)).await;
        assert_eq!(read.unwrap(), 18);
        // The request consumed, the connection falls idle with its readiness still set.
        shared.lock().buf = BytesMut::new();
        let idle = poll_fn(|cx| Poll::Ready(shared.lock().poll_read(cx))).await;
        assert!(idle.is_pending());
        assert_eq!(shared.lock().buf.capacity(), 0);
        client.write_all(b"GET").await.unwrap();
        let read = poll_fn(|cx| shared.lock().poll_read(cx)).await;
        assert_eq!(read.unwrap(), 3);
        assert_eq!(&shared.lock().buf[..], b"GET");
    }

    #[test]
    fn a_partial_write_resumes_where_it_stopped() {
        let parts: [&[u8]; 3] = [b"head", b"", b"body"];
        let joined = |skip| {
            let (slices, count) = remaining(&parts, skip);
            slices[..count]
                .iter()
                .flat_map(|s| s.to_vec())
                .collect::<Vec<u8>>()
        };
        assert_eq!(joined(0), b"headbody");
        assert_eq!(joined(3), b"dbody");
        assert_eq!(joined(4), b"body");
        assert_eq!(joined(7), b"y");
        assert_eq!(joined(8), b"");
    }
}
