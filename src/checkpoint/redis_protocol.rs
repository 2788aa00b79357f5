//! A small Redis client of our own: RESP2 commands and replies, a connection over TCP or
//! TLS that pipelines, and a pool of idle connections. The store needs a dozen commands
//! and no cluster, sentinel or RESP3, which does not justify the `redis` crate's
//! dependency tree.
//!
//! A connection is only ever owned by the operation using it: an operation dropped halfway
//! (the cache's time limit) drops its connection with it, so a reply left unread never
//! reaches the next operation.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// The largest value read: Redis's own default `proto-max-bulk-len`. A longer length is a
/// broken stream, not a value to buffer.
const MAX_BULK: usize = 512 * 1024 * 1024;
/// The most elements of one array reply, and the deepest nesting, read.
const MAX_ELEMENTS: usize = 1 << 24;
const MAX_DEPTH: usize = 8;
/// Idle connections kept: beyond this, a burst's extra connections are closed.
const MAX_IDLE: usize = 8;
const READ_CHUNK: usize = 64 * 1024;

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Status(String),
    /// `-ERR ...`: the command failed; the connection is still good.
    Error(String),
    Int(i64),
    /// `$-1` is `Bulk(None)`.
    Bulk(Option<Vec<u8>>),
    /// `*-1` is `Array(None)`.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as an integer, `Err` naming what came instead.
    pub fn int(&self) -> Result<i64, ProtocolError> {
        match self {
            Reply::Int(n) => Ok(*n),
            Reply::Error(message) => Err(ProtocolError::Server(message.clone())),
            other => Err(ProtocolError::Unexpected(other.kind())),
        }
    }

    /// The reply as a value, `None` for nil.
    pub fn bulk(self) -> Result<Option<Vec<u8>>, ProtocolError> {
        match self {
            Reply::Bulk(value) => Ok(value),
            Reply::Error(message) => Err(ProtocolError::Server(message)),
            other => Err(ProtocolError::Unexpected(other.kind())),
        }
    }

    /// The reply as an array (nil is empty).
    pub fn array(self) -> Result<Vec<Reply>, ProtocolError> {
        match self {
            Reply::Array(items) => Ok(items.unwrap_or_default()),
            Reply::Error(message) => Err(ProtocolError::Server(message)),
            other => Err(ProtocolError::Unexpected(other.kind())),
        }
    }

    /// `Err` for an error reply, whatever the command.
    pub fn ok(self) -> Result<Reply, ProtocolError> {
        match self {
            Reply::Error(message) => Err(ProtocolError::Server(message)),
            other => Ok(other),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Reply::Status(_) => "a status",
            Reply::Error(_) => "an error",
            Reply::Int(_) => "an integer",
            Reply::Bulk(_) => "a string",
            Reply::Array(_) => "an array",
        }
    }
}

/// What went wrong talking to Redis. No variant holds the password.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("the connection failed")]
    Io(#[from] std::io::Error),
    #[error("redis answered: {0}")]
    Server(String),
    #[error("redis broke the protocol: {0}")]
    Protocol(&'static str),
    #[error("redis answered with {0} where another kind of reply was expected")]
    Unexpected(&'static str),
    #[error("{0}")]
    Url(String),
    #[error("not a PEM file of certificates")]
    Pem(#[source] tokio_rustls::rustls::pki_types::pem::Error),
    #[error("no certificate in it")]
    NoCertificate,
}

/// A command: its name and arguments, each sent as a bulk string.
#[derive(Debug)]
pub struct RedisCommand(Vec<Vec<u8>>);

impl RedisCommand {
    pub fn new(name: &str) -> RedisCommand {
        RedisCommand(vec![name.as_bytes().to_vec()])
    }

    pub fn arg(mut self, arg: impl AsRef<[u8]>) -> RedisCommand {
        self.0.push(arg.as_ref().to_vec());
        self
    }

    /// An argument moved in rather than copied: a checkpoint's bytes, say.
    pub fn arg_owned(mut self, arg: Vec<u8>) -> RedisCommand {
        self.0.push(arg);
        self
    }

    /// Appends the command to `out` as a RESP array of bulk strings.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("*{}\r\n", self.0.len()).as_bytes());
        for arg in &self.0 {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// The first reply in `buf` and the bytes it took, `None` while it is incomplete: the
/// caller reads more and asks again, so a reply split anywhere is read whole.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtocolError> {
    parse_at(buf, 0, 0)
}

fn parse_at(
    buf: &[u8],
    start: usize,
    depth: usize,
) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let Some((kind, line, after)) = line(buf, start)? else {
        return Ok(None);
    };
    let text = || {
        std::str::from_utf8(line)
            .map(str::to_owned)
            .map_err(|_| ProtocolError::Protocol("a status line that is not UTF-8"))
    };
    match kind {
        b'+' => Ok(Some((Reply::Status(text()?), after))),
        b'-' => Ok(Some((Reply::Error(text()?), after))),
        b':' => Ok(Some((Reply::Int(number(line)?), after))),
        b'$' => {
            let Some(len) = length(line, MAX_BULK)? else {
                return Ok(Some((Reply::Bulk(None), after)));
            };
            let end = after + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ProtocolError::Protocol("a string not ended by CRLF"));
            }
            Ok(Some((Reply::Bulk(Some(buf[after..end].to_vec())), end + 2)))
        }
        b'*' => {
            let Some(len) = length(line, MAX_ELEMENTS)? else {
                return Ok(Some((Reply::Array(None), after)));
            };
            if depth >= MAX_DEPTH {
                return Err(ProtocolError::Protocol("arrays nested too deep"));
            }
            // Each element takes at least 3 bytes: no preallocation past what has arrived.
            let mut items = Vec::with_capacity(len.min((buf.len() - after) / 3));
            let mut at = after;
            for _ in 0..len {
                let Some((item, next)) = parse_at(buf, at, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at = next;
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        _ => Err(ProtocolError::Protocol("an unknown reply type")),
    }
}

/// A reply's first line: its type byte, the rest of the line, and where the next begins.
type ReplyLine<'a> = (u8, &'a [u8], usize);

/// The line starting at `start`, `None` while it is incomplete.
fn line(buf: &[u8], start: usize) -> Result<Option<ReplyLine<'_>>, ProtocolError> {
    let Some(rest) = buf.get(start..).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let Some(lf) = memchr::memchr(b'\n', rest) else {
        // A line longer than any number or status Redis sends is a broken stream.
        if rest.len() > 64 * 1024 {
            return Err(ProtocolError::Protocol("a line without its end"));
        }
        return Ok(None);
    };
    if lf == 0 || rest[lf - 1] != b'\r' {
        return Err(ProtocolError::Protocol("a line not ended by CRLF"));
    }
    Ok(Some((rest[0], &rest[1..lf - 1], start + lf + 1)))
}

fn number(line: &[u8]) -> Result<i64, ProtocolError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtocolError::Protocol("a malformed number"))
}

/// A length, `None` for -1 (nil).
fn length(line: &[u8], max: usize) -> Result<Option<usize>, ProtocolError> {
    match number(line)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|n| *n <= max)
            .map(Some)
            .ok_or(ProtocolError::Protocol("a length out of bounds")),
    }
}

/// Where Redis is and how to log in, from `redis://[user[:password]@]host[:port][/db]` or
/// `rediss://` (TLS).
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: u32,
}

/// Without the password, which must never reach a log.
impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("tls", &self.tls)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

impl Target {
    /// Parses `url`; an error names the part that is wrong, never the credentials.
    pub fn parse(url: &str) -> Result<Target, ProtocolError> {
        let bad = |what: &str| ProtocolError::Url(format!("not a redis URL: {what}"));
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss://") {
            (true, rest)
        } else {
            return Err(bad("it must start with redis:// or rediss://"));
        };
        if rest.contains(['?', '#']) {
            return Err(bad("query parameters and fragments are not supported"));
        }
        // The credentials end at the last '@': a password may hold one, percent-encoded
        // or not.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash + 1..]),
            None => (rest, ""),
        };
        let db = match path {
            "" => 0,
            db => db
                .parse()
                .map_err(|_| bad("the database must be a number"))?,
        };
        let (host, port) = host_port(authority).ok_or_else(|| bad("no valid host[:port]"))?;
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (info, None),
                };
                let user = decode(user).ok_or_else(|| bad("the user is not valid UTF-8"))?;
                let password = password
                    .map(|p| decode(p).ok_or_else(|| bad("the password is not valid UTF-8")))
                    .transpose()?;
                // `redis://:password@host`: a password alone, for Redis before 6 (no
                // users) or the default user.
                ((!user.is_empty()).then_some(user), password)
            }
        };
        Ok(Target {
            tls,
            host,
            port,
            user,
            password: password.filter(|p| !p.is_empty()),
            db,
        })
    }

    /// `host:port`, for messages: no credentials.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The commands a new connection sends before any other: log in, pick the database.
    fn handshake(&self) -> Vec<RedisCommand> {
        let mut commands = Vec::new();
        if let Some(password) = &self.password {
            let mut auth = RedisCommand::new("AUTH");
            if let Some(user) = &self.user {
                auth = auth.arg(user);
            }
            commands.push(auth.arg(password));
        }
        if self.db != 0 {
            commands.push(RedisCommand::new("SELECT").arg(self.db.to_string()));
        }
        commands
    }
}

/// The host (without IPv6 brackets) and port of `host[:port]` or `[v6][:port]`.
fn host_port(authority: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => 6379,
        Some(port) => port.parse().ok()?,
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

/// Percent-decodes `text`; `None` if the result is not UTF-8. A '%' not followed by two
/// hex digits is kept as it is, as browsers do.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

trait Transport: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Transport for T {}

/// One connection, logged in.
pub struct Connection {
    io: Box<dyn Transport>,
    buf: Vec<u8>,
}

impl Connection {
    /// Connects to `target` and sends its handshake; `tls` is the configuration for
    /// `rediss://`.
    pub async fn open(
        target: &Target,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Connection, ProtocolError> {
        let tcp = TcpStream::connect((target.host.as_str(), target.port)).await?;
        // Pipelines are written whole and read whole: nothing gains from Nagle's delay.
        tcp.set_nodelay(true)?;
        let io: Box<dyn Transport> = match (target.tls, tls) {
            (true, Some(config)) => {
                let name =
                    rustls::pki_types::ServerName::try_from(target.host.clone()).map_err(|_| {
                        ProtocolError::Url("the host is not a valid TLS server name".into())
                    })?;
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
                Box::new(connector.connect(name, tcp).await?)
            }
            (true, None) => {
                return Err(ProtocolError::Url(
                    "rediss:// without a TLS configuration".into(),
                ))
            }
            (false, _) => Box::new(tcp),
        };
        let mut connection = Connection {
            io,
            buf: Vec::new(),
        };
        let handshake = target.handshake();
        for reply in connection.pipeline(&handshake).await? {
            reply.ok()?;
        }
        Ok(connection)
    }

    /// Sends `commands` in one write and reads their replies, in order. An error reply is
    /// among the replies, not an `Err`: only the connection's failures are.
    pub async fn pipeline(
        &mut self,
        commands: &[RedisCommand],
    ) -> Result<Vec<Reply>, ProtocolError> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        self.send(commands).await?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.read().await?);
        }
        Ok(replies)
    }

    pub async fn send(&mut self, commands: &[RedisCommand]) -> Result<(), ProtocolError> {
        let mut out = Vec::new();
        for command in commands {
            command.encode(&mut out);
        }
        self.io.write_all(&out).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// The next reply: one a command asked for, or a message of a subscription.
    pub async fn read(&mut self) -> Result<Reply, ProtocolError> {
        loop {
            if let Some((reply, used)) = parse(&self.buf)? {
                self.buf.drain(..used);
                return Ok(reply);
            }
            let filled = self.buf.len();
            self.buf.resize(filled + READ_CHUNK, 0);
            let read = self.io.read(&mut self.buf[filled..]).await;
            self.buf.truncate(filled + *read.as_ref().unwrap_or(&0));
            if read? == 0 {
                return Err(ProtocolError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }
}

/// Connections to one Redis: idle ones are reused, new ones opened on demand.
pub struct Client {
    target: Target,
    tls: Option<Arc<rustls::ClientConfig>>,
    idle: Mutex<Vec<Connection>>,
    connect_timeout: Duration,
}

impl Client {
    /// A client of `url`. Nothing is connected yet: a Redis down at start costs nothing
    /// until it is used.
    pub fn new(
        url: &str,
        connect_timeout: Duration,
        roots: Vec<CertificateDer<'static>>,
    ) -> Result<Client, ProtocolError> {
        let target = Target::parse(url)?;
        let tls = target.tls.then(|| tls_config(roots)).transpose()?;
        Ok(Client {
            target,
            tls,
            idle: Mutex::new(Vec::new()),
            connect_timeout,
        })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// A new connection of its own, for a subscription.
    pub async fn connect(&self) -> Result<Connection, ProtocolError> {
        let open = Connection::open(&self.target, self.tls.as_ref());
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(connection) => connection,
            Err(_) => Err(ProtocolError::Io(std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// Runs `commands` as one pipeline on an idle connection, or a new one.
    ///
    /// An idle connection may have died while it waited (Redis restarted): then every
    /// idle one likely did, so they are all dropped and the pipeline is sent once more on
    /// a new connection. Sending twice is safe for what the store sends: each command
    /// sets a value, or reads one, or announces a partition again.
    pub async fn pipeline(&self, commands: &[RedisCommand]) -> Result<Vec<Reply>, ProtocolError> {
        if let Some(mut connection) = self.take_idle() {
            match connection.pipeline(commands).await {
                Ok(replies) => {
                    self.give_back(connection);
                    return Ok(replies);
                }
                Err(ProtocolError::Io(_)) => self.lock().clear(),
                Err(other) => return Err(other),
            }
        }
        let mut connection = self.connect().await?;
        let replies = connection.pipeline(commands).await?;
        self.give_back(connection);
        Ok(replies)
    }

    /// One command's reply, an error reply as `Err`.
    pub async fn call(&self, command: RedisCommand) -> Result<Reply, ProtocolError> {
        let replies = self.pipeline(std::slice::from_ref(&command)).await?;
        replies
            .into_iter()
            .next()
            .ok_or(ProtocolError::Protocol("no reply"))?
            .ok()
    }

    fn take_idle(&self) -> Option<Connection> {
        self.lock().pop()
    }

    fn give_back(&self, connection: Connection) {
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE {
            idle.push(connection);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The certificates of the PEM file at `path`: the certificate authorities an operator
/// trusts for `rediss://` besides the Mozilla roots.
pub fn read_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, ProtocolError> {
    let pem = std::fs::read(path)?;
    let roots = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(ProtocolError::Pem)?;
    if roots.is_empty() {
        return Err(ProtocolError::NoCertificate);
    }
    Ok(roots)
}

/// TLS as the upstream client has it: ring, and the Mozilla roots, with `extra` roots.
fn tls_config(
    extra: Vec<CertificateDer<'static>>,
) -> Result<Arc<rustls::ClientConfig>, ProtocolError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let (_, refused) = roots.add_parsable_certificates(extra);
    if refused > 0 {
        return Err(ProtocolError::Url(format!(
            "TLS: {refused} of the given CA certificates are not valid trust anchors"
        )));
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ProtocolError::Url(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_s_ca_file_is_read_and_a_file_without_certificates_is_named() {
        let dir = std::env::temp_dir().join(format!("resp-roots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["redis.internal".to_owned()]).unwrap();
        let bundle = dir.join("ca.pem");
        std::fs::write(&bundle, format!("# our CA\n{}", ca.cert.pem())).unwrap();
        let roots = read_roots(&bundle).unwrap();
        assert_eq!(roots, vec![ca.cert.der().clone()]);
        assert!(tls_config(roots).is_ok());

        let key_only = dir.join("key.pem");
        std::fs::write(&key_only, ca.key_pair.serialize_pem()).unwrap();
        assert!(matches!(
            read_roots(&key_only).unwrap_err(),
            ProtocolError::NoCertificate
        ));
        assert!(read_roots(&dir.join("missing.pem")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Some(s.as_bytes().to_vec()))
    }

    /// Every reply type, nested, with nils and a value holding CRLF.
    const STREAM: &[u8] = b"+OK\r\n-ERR wrong type\r\n:-42\r\n$5\r\na\r\nbc\r\n$-1\r\n$0\r\n\r\n*-1\r\n*0\r\n*3\r\n:1\r\n*2\r\n$3\r\nfoo\r\n$-1\r\n+QUEUED\r\n";

    fn expected() -> Vec<Reply> {
        vec![
            Reply::Status("OK".into()),
            Reply::Error("ERR wrong type".into()),
            Reply::Int(-42),
            bulk("a\r\nbc"),
            Reply::Bulk(None),
            bulk(""),
            Reply::Array(None),
            Reply::Array(Some(vec![])),
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Array(Some(vec![bulk("foo"), Reply::Bulk(None)])),
                Reply::Status("QUEUED".into()),
            ])),
        ]
    }

    /// Reads every reply of `chunks` arriving one after the other, as
    /// [`Connection::read`] does.
    fn read_all(chunks: &[&[u8]]) -> Vec<Reply> {
        let mut buf = Vec::new();
        let mut replies = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some((reply, used)) = parse(&buf).unwrap() {
                buf.drain(..used);
                replies.push(reply);
            }
        }
        assert!(buf.is_empty());
        replies
    }

    #[test]
    fn replies_split_at_any_byte_are_read_whole() {
        assert_eq!(read_all(&[STREAM]), expected());
        for split in 0..=STREAM.len() {
            let (a, b) = STREAM.split_at(split);
            assert_eq!(read_all(&[a, b]), expected(), "split at {split}");
        }
        for first in 0..STREAM.len() {
            for second in first..=STREAM.len() {
                let chunks = [&STREAM[..first], &STREAM[first..second], &STREAM[second..]];
                assert_eq!(read_all(&chunks), expected(), "split at {first}, {second}");
            }
        }
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(read_all(&bytes), expected());
    }

    #[test]
    fn broken_streams_are_errors_not_waits() {
        for broken in [
            &b"?what\r\n"[..],
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"+OK\n",
            b"$-2\r\n",
            b"$999999999999\r\n",
        ] {
            assert!(parse(broken).is_err(), "{broken:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        RedisCommand::new("SET")
            .arg("k")
            .arg_owned(b"a\r\nb".to_vec())
            .encode(&mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n");
        assert_eq!(parse(&out).unwrap().unwrap().1, out.len());
    }

    #[test]
    fn urls_in_every_form() {
        let t = Target::parse("redis://localhost").unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port, t.db),
            (false, "localhost", 6379, 0)
        );
        assert_eq!((t.user, t.password), (None, None));

        let t = Target::parse("rediss://alice:p%40ss%3Aw0rd@cache.example.com:6380/3").unwrap();
        assert!(t.tls);
        assert_eq!(
            (t.host.as_str(), t.port, t.db),
            ("cache.example.com", 6380, 3)
        );
        assert_eq!(t.user.as_deref(), Some("alice"));
        assert_eq!(t.password.as_deref(), Some("p@ss:w0rd"));

        let t = Target::parse("redis://:secret@10.0.0.1:7000").unwrap();
        assert_eq!(
            (t.user.as_deref(), t.password.as_deref()),
            (None, Some("secret"))
        );
        assert_eq!(t.address(), "10.0.0.1:7000");

        // A user without a password logs in as nobody: AUTH needs a password.
        let t = Target::parse("redis://alice@host/").unwrap();
        assert_eq!(
            (t.user.as_deref(), t.password.as_deref()),
            (Some("alice"), None)
        );
        assert!(t.handshake().is_empty());

        let t = Target::parse("redis://[::1]:6390/2").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.db), ("::1", 6390, 2));
        assert_eq!(t.address(), "[::1]:6390");

        // An unencoded '@' in the password: the last one ends the credentials.
        let t = Target::parse("redis://u:a@b@host").unwrap();
        assert_eq!(t.password.as_deref(), Some("a@b"));

        for bad in [
            "http://host",
            "redis://",
            "redis://host:port",
            "redis://host/db",
            "redis://host:99999",
            "redis://host?timeout=1",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_handshake_logs_in_and_selects_the_database() {
        let encoded = |url: &str| {
            let mut out = Vec::new();
            for command in Target::parse(url).unwrap().handshake() {
                command.encode(&mut out);
            }
            String::from_utf8(out).unwrap()
        };
        assert_eq!(encoded("redis://h"), "");
        assert_eq!(
            encoded("redis://:pw@h/2"),
            "*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n"
        );
        assert_eq!(
            encoded("redis://u:pw@h"),
            "*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$2\r\npw\r\n"
        );
    }

    #[test]
    fn no_error_or_debug_output_holds_the_password() {
        const SECRET: &str = "hunter2-s3cret";
        for url in [
            format!("redis://user:{SECRET}@host:notaport"),
            format!("redis://user:{SECRET}@host/notadb"),
            format!("redis://user:{SECRET}@host?x=1"),
            format!("redis://user:{SECRET}%FF@host"),
            format!("ftp://user:{SECRET}@host"),
            format!("redis://user:{SECRET}@"),
        ] {
            let error = Target::parse(&url).unwrap_err().to_string();
            assert!(!error.contains(SECRET), "{error}");
        }
        let target = Target::parse(&format!("redis://user:{SECRET}@host")).unwrap();
        assert!(!format!("{target:?}").contains(SECRET));
        assert!(!target.address().contains(SECRET));
    }

    #[tokio::test]
    async fn a_connection_refused_is_an_error_without_the_password() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = Client::new(
            &format!("redis://u:hunter2@127.0.0.1:{port}"),
            Duration::from_secs(1),
            Vec::new(),
        )
        .unwrap();
        let error = client.call(RedisCommand::new("PING")).await.unwrap_err();
        assert!(matches!(error, ProtocolError::Io(_)), "{error}");
        assert!(!error.to_string().contains("hunter2"));
    }
}
