//! Replicas sharing one Redis: a conversation compacted on one resumes on the other with
//! the same bytes and no new summary; the same summary needed by both at once is made
//! once; a tool loop whose turns alternate between them 50 ms apart pays one summary per
//! compaction event, prepared by one of them; a Redis that dies costs no turn (its outage
//! is logged once and counted) and is used again once it is back; a window one replica
//! learned is known to the other; a Redis behind TLS, with a certificate of the
//! operator's own CA, is reached through `rediss://` and `cache.redis_ca_file`; what they
//! share through Redis is sealed, so a dump of it holds none of the conversation's text.
//!
//! Each test starts its own `redis-server` (from `COMPACTION_PROXY_REDIS_SERVER`, else
//! PATH; `scripts/setup-redis.sh` installs it) on a free loopback port, and is skipped
//! without one unless `COMPACTION_PROXY_REQUIRE_REDIS` is set.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::{
    agent_round, assert_compacted_part_kept, metrics, mock_tokens, tempdir, window_turn, Mock,
    Proxy,
};

/// The upstream's window, in the mock's tokens.
const WINDOW: u64 = 6000;

/// A redis-server of the test's own, stopped when dropped.
struct Redis {
    path: String,
    port: u16,
    /// A second port that speaks TLS only, with a certificate of the test's own CA.
    tls: Option<Tls>,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

struct Tls {
    port: u16,
    /// The PEM file a proxy trusts (the self-signed certificate itself).
    ca_file: std::path::PathBuf,
}

impl Redis {
    /// A server on a free port, or `None` (the test is skipped) when none is installed.
    fn start() -> Option<Redis> {
        Redis::start_with(false)
    }

    /// [`Redis::start`], also listening for TLS on a port of its own.
    fn start_tls() -> Option<Redis> {
        Redis::start_with(true)
    }

    fn start_with(tls: bool) -> Option<Redis> {
        let path = std::env::var("COMPACTION_PROXY_REDIS_SERVER")
            .unwrap_or_else(|_| "redis-server".into());
        let installed = Command::new(&path)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            return support::Needs::Redis.missing(
                &format!("no redis-server at {path:?}"),
                "scripts/setup-redis.sh installs it",
            );
        }
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let dir = tempdir();
        let tls = tls.then(|| {
            let rcgen::CertifiedKey { cert, key_pair } =
                rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
            std::fs::write(dir.join("redis.crt"), cert.pem()).unwrap();
            std::fs::write(dir.join("redis.key"), key_pair.serialize_pem()).unwrap();
            Tls {
                port: free_port(),
                ca_file: dir.join("redis.crt"),
            }
        });
        let mut redis = Redis {
            path,
            port: free_port(),
            tls,
            dir,
            child: None,
        };
        redis.restart();
        Some(redis)
    }

    /// Starts the server (again) on its port, empty, and waits until it answers.
    fn restart(&mut self) {
        let mut command = Command::new(&self.path);
        command
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", &self.port.to_string()]);
        if let Some(tls) = &self.tls {
            command
                .args(["--tls-port", &tls.port.to_string()])
                .args([
                    "--tls-cert-file",
                    "redis.crt",
                    "--tls-key-file",
                    "redis.key",
                ])
                .args(["--tls-auth-clients", "no"]);
        }
        let child = command
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        for _ in 0..200 {
            if self.command(&["PING"]).is_some_and(|r| r == "+PONG\r\n") {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    /// SIGKILL: no goodbye to its clients.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// The `[cache]` lines that reach this server: over TLS when it has a TLS port.
    fn cache_config(&self) -> String {
        match &self.tls {
            None => format!("redis_url = \"redis://127.0.0.1:{}\"\n", self.port),
            Some(tls) => format!(
                "redis_url = \"rediss://127.0.0.1:{}\"\nredis_ca_file = \"{}\"\n",
                tls.port,
                tls.ca_file.display()
            ),
        }
    }

    /// Sends one command and returns the raw reply, `None` if the server is not there.
    fn command(&self, args: &[&str]) -> Option<String> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes()).ok()?;
        let mut reply = vec![0u8; 64 * 1024];
        let n = stream.read(&mut reply).ok()?;
        Some(String::from_utf8_lossy(&reply[..n]).into_owned())
    }

    /// How many keys match `pattern`.
    fn count(&self, pattern: &str) -> usize {
        let reply = self.command(&["KEYS", pattern]).unwrap();
        let header = reply.lines().next().unwrap();
        header.trim_start_matches('*').parse().unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two replicas of one fleet, keeping their checkpoints in `redis` under a namespace of
/// the test's own, with `window` known for the model from their configuration, or learned
/// when `None`. Compactions are prepared ahead, as by default: a conversation's
/// preparation is made once, by the first replica past the prepare mark, and taken by the
/// others.
fn replicas(mock: &Mock, redis: &Redis, test: &str, window: Option<u64>) -> [Proxy; 2] {
    let model = window.map_or(String::new(), |w| {
        format!("[[models]]\nmatch = \"mock-agent-model\"\ncontext_window = {w}\n\n")
    });
    let config = format!(
        "{model}[summarizer]\ncontext_window = 128000\n\n[cache]\nbackend = \"redis\"\n{}redis_namespace = \"replicas-{test}-{}\"\n",
        redis.cache_config(),
        std::process::id()
    );
    [
        Proxy::start(&mock.url("/v1"), &config),
        Proxy::start(&mock.url("/v1"), &config),
    ]
}

fn ask(n: usize) -> Value {
    json!({"role": "user", "content": format!(
        "Turn {n}: the test of module {n} fails; please fix src/module_{n}.rs and rerun it."
    )})
}

/// The first `turns` rounds of a session, ending on the next ask.
fn session(system: &str, turns: usize) -> Vec<Value> {
    let mut history = vec![json!({"role": "system", "content": system})];
    for n in 0..turns {
        history.push(ask(n));
        history.extend(agent_round(n));
    }
    history.push(ask(turns));
    history
}

fn request(messages: &[Value]) -> Value {
    json!({"model": "mock-agent-model", "messages": messages})
}

/// Sends `request` as `credential` to `proxy`, the summariser answering after
/// `summary_delay_ms`; returns the status and the `x-compaction` header.
async fn send(
    proxy: &Proxy,
    credential: &str,
    summary_delay_ms: u64,
    request: &Value,
) -> (u16, String) {
    window_turn(proxy, credential, WINDOW, "ok", summary_delay_ms, request).await
}

/// Plays turns `from..to` of a session, turn `n` on replica `n % 2`; returns each turn's
/// `x-compaction` header. Every turn must succeed.
async fn alternate(
    replicas: &[Proxy; 2],
    mock: &Mock,
    history: &mut Vec<Value>,
    turns: std::ops::Range<usize>,
) -> Vec<String> {
    let mut headers = Vec::new();
    for n in turns {
        headers.push(turn(replicas, mock, history, n, 200).await);
    }
    headers
}

/// Plays turn `n` of a session on replica `n % 2`, the summariser answering after
/// `summary_delay_ms`; returns its `x-compaction` header. The turn must succeed.
async fn turn(
    replicas: &[Proxy; 2],
    mock: &Mock,
    history: &mut Vec<Value>,
    n: usize,
    summary_delay_ms: u64,
) -> String {
    history.push(ask(n));
    let proxy = &replicas[n % 2];
    let body = request(history);
    let (status, x) = send(proxy, "Bearer fleet-client", summary_delay_ms, &body).await;
    assert_eq!(status, 200, "turn {n}: {x}\n{}", proxy.logs());
    assert!(mock.state.violations.lock().unwrap().is_empty(), "turn {n}");
    history.extend(agent_round(n));
    x
}

/// A compaction event's header: a summary made for this turn, or put in place.
fn is_event(x: &str) -> bool {
    x.contains("summary=llm") || x.contains("summary=fallback")
}

/// A tool loop whose turns come `gap` apart (after the answer to the one before),
/// alternating between replicas, until `events` compaction events; returns each turn's
/// header.
async fn tool_loop(
    replicas: &[Proxy; 2],
    mock: &Mock,
    gap: Duration,
    summary_delay_ms: u64,
    events: usize,
) -> Vec<String> {
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut headers: Vec<String> = Vec::new();
    for n in 0..120 {
        tokio::time::sleep(gap).await;
        headers.push(turn(replicas, mock, &mut history, n, summary_delay_ms).await);
        if headers.iter().filter(|x| is_event(x)).count() == events {
            return headers;
        }
    }
    panic!("fewer than {events} events: {headers:#?}");
}

/// The sum over both replicas of `compaction_proxy_prepared_total` for `fate`.
async fn prepared(replicas: &[Proxy; 2], fate: &str) -> u64 {
    let name = format!("compaction_proxy_prepared_total{{fate=\"{fate}\"}}");
    metric(&replicas[0], &name).await + metric(&replicas[1], &name).await
}

/// The value of the metric `name` (with its labels) at `proxy`'s `/metrics`.
async fn metric(proxy: &Proxy, name: &str) -> u64 {
    let text = metrics(proxy).await;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.parse().unwrap()
}

#[tokio::test]
async fn a_conversation_compacted_on_one_replica_resumes_on_the_other() {
    let Some(redis) = Redis::start() else { return };
    let mock = Mock::start().await;
    let replicas = replicas(&mock, &redis, "resume", Some(WINDOW));
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let headers = alternate(&replicas, &mock, &mut history, 0..60).await;

    // One summariser call per compaction event, whichever replica had it.
    let llm = headers.iter().filter(|x| x.contains("summary=llm")).count();
    assert!(llm >= 1, "{headers:#?}");
    assert_eq!(
        mock.summaries().len(),
        llm,
        "{headers:#?}\nA:\n{}\nB:\n{}",
        replicas[0].logs(),
        replicas[1].logs()
    );
    // Every other turn is served by the replica that did not compact: it resumes from the
    // checkpoint the other stored, with the same bytes for the compacted part.
    let sent = mock.recorded();
    assert_eq!(sent.len(), headers.len(), "one upstream call per turn");
    let mut resumed_elsewhere = 0;
    for (turn, pair) in headers.windows(2).enumerate() {
        if pair[0].contains("summary=llm") && pair[1].contains("summary=cache") {
            assert_compacted_part_kept(&sent, turn);
            resumed_elsewhere += 1;
        }
    }
    assert!(resumed_elsewhere >= 1, "{headers:#?}");
    let cached = headers
        .iter()
        .filter(|x| x.contains("summary=cache"))
        .count();
    assert!(cached >= 15, "{cached} turns from the cache: {headers:#?}");
    // The events were prepared ahead, by one replica for both, and never fell back to
    // the digest.
    assert!(
        !headers.iter().any(|x| x.contains("fallback")),
        "{headers:#?}"
    );
    let mut used = 0;
    for proxy in &replicas {
        let metrics = support::metrics(proxy).await;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("compaction_proxy_prepared_total{fate=\"used\"}"))
            .unwrap();
        used += line.rsplit(' ').next().unwrap().parse::<u32>().unwrap();
    }
    assert!(used >= 2, "{used} prepared compactions used: {headers:#?}");
}

/// A fast tool loop: turns 50 ms apart, alternating between replicas, so that turns reach
/// one replica while the other prepares their conversation's next event (the mock's
/// summariser takes 200 ms). Each event takes the one preparation made for it, on either
/// replica: one summariser call per event, as with turns far apart, and what is prepared
/// is made once, by one replica, and used.
#[tokio::test]
async fn a_fast_tool_loop_across_replicas_pays_one_summary_per_event() {
    let Some(redis) = Redis::start() else { return };
    let mock = Mock::start().await;
    let replicas = replicas(&mock, &redis, "fast", Some(WINDOW));
    // Two events; the session stops there, before the next one is prepared.
    let headers = tool_loop(&replicas, &mock, Duration::from_millis(50), 200, 2).await;
    // Whatever still runs in the background ends, and its calls are counted.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let logs = || format!("A:\n{}\nB:\n{}", replicas[0].logs(), replicas[1].logs());
    let calls = mock.summaries().len();
    let fates = [
        prepared(&replicas, "made").await,
        prepared(&replicas, "used").await,
        prepared(&replicas, "wasted").await,
    ];
    eprintln!("2 events; summariser calls: {calls}; prepared made, used, wasted: {fates:?}");
    assert_eq!(
        calls,
        2,
        "summariser calls for 2 events: {headers:#?}\n{}",
        logs()
    );
    assert!(
        headers
            .iter()
            .filter(|x| is_event(x))
            .all(|x| x.contains("summary=llm")),
        "{headers:#?}"
    );
    assert_eq!(
        fates,
        [2, 2, 0],
        "made, used, wasted: {headers:#?}\n{}",
        logs()
    );
}

/// A summariser slower than an event may wait: the event goes with the digest, and the
/// preparation it went without is the only call made for it. The replica that did not
/// prepare it does not take the call over once its holder's lease lapses: the
/// conversation has moved on.
#[tokio::test]
async fn a_preparation_an_event_went_without_is_not_made_again_on_the_other_replica() {
    let Some(redis) = Redis::start() else { return };
    let mock = Mock::start().await;
    let replicas = replicas(&mock, &redis, "abandoned", Some(WINDOW));
    let headers = tool_loop(&replicas, &mock, Duration::from_millis(50), 3000, 1).await;
    assert!(
        headers.last().unwrap().contains("summary=fallback"),
        "{headers:#?}"
    );
    // Past the lease of the abandoned call (10 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let logs = || format!("A:\n{}\nB:\n{}", replicas[0].logs(), replicas[1].logs());
    let calls = mock.summaries().len();
    eprintln!("1 event, its preparation abandoned; summariser calls: {calls}");
    assert_eq!(calls, 1, "{headers:#?}\n{}", logs());
    assert_eq!(prepared(&replicas, "used").await, 0);
    assert!(prepared(&replicas, "wasted").await <= 1);
}

#[tokio::test]
async fn the_same_summary_needed_by_two_replicas_at_once_is_made_once() {
    let Some(redis) = Redis::start() else { return };
    let mock = Mock::start().await;
    let [a, b] = replicas(&mock, &redis, "flight", Some(WINDOW));
    let body = request(&session("You are a coding agent.", 40));
    let ((status_a, x_a), (status_b, x_b)) = tokio::join!(
        send(&a, "Bearer fleet-client", 1500, &body),
        send(&b, "Bearer fleet-client", 1500, &body)
    );
    assert_eq!((status_a, status_b), (200, 200), "{x_a} {x_b}");
    assert!(
        x_a.contains("summary=llm") && x_b.contains("summary=llm"),
        "{x_a}\n{x_b}"
    );
    assert_eq!(mock.summaries().len(), 1);
}

#[tokio::test]
async fn a_redis_that_dies_costs_no_turn_and_is_used_again_once_back() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let mock = Mock::start().await;
    let replicas = replicas(&mock, &redis, "outage", Some(WINDOW));
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    // Past the first compaction: each turn now looks its checkpoint up in Redis.
    let headers = alternate(&replicas, &mock, &mut history, 0..45).await;
    assert!(
        headers.iter().any(|x| x.contains("summary=cache")),
        "{headers:#?}"
    );

    redis.kill();
    let during = alternate(&replicas, &mock, &mut history, 45..60).await;
    assert!(
        during.iter().any(|x| x.starts_with("applied")),
        "{during:#?}"
    );
    for proxy in &replicas {
        assert!(proxy.logged("the checkpoint store is out of reach"));
        let lines = proxy.logs().matches("out of reach").count();
        assert_eq!(lines, 1, "one line per outage:\n{}", proxy.logs());
        let errors = metric(
            proxy,
            "compaction_proxy_store_errors_total{backend=\"redis\"}",
        )
        .await;
        assert!(errors >= 1, "no store error counted");
        let up = metric(proxy, "compaction_proxy_store_up{backend=\"redis\"}").await;
        assert_eq!(up, 0);
    }

    redis.restart();
    // The cache tries the store again a second after its last failure.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    alternate(&replicas, &mock, &mut history, 60..64).await;
    for proxy in &replicas {
        assert!(
            proxy.logged("the checkpoint store is back"),
            "{}",
            proxy.logs()
        );
        let up = metric(proxy, "compaction_proxy_store_up{backend=\"redis\"}").await;
        assert_eq!(up, 1);
    }
    // A new conversation compacted on one replica is stored in the new Redis, and the
    // other resumes it from there.
    let fresh = request(&session("You are another agent.", 40));
    let (status, x) = send(&replicas[0], "Bearer another", 200, &fresh).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=llm"), "{x}");
    assert!(redis.count("replicas-outage-*:cp:*") >= 1);
    let (status, x) = send(&replicas[1], "Bearer another", 200, &fresh).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=cache"), "{x}");
}

#[tokio::test]
async fn a_window_learned_by_one_replica_is_known_to_the_other() {
    let Some(redis) = Redis::start() else { return };
    let mock = Mock::start().await;
    let [a, b] = replicas(&mock, &redis, "window", None);
    let (status, x) = send(&a, "Bearer one", 200, &request(&session("Agent one.", 80))).await;
    assert_eq!(status, 200);
    assert!(
        x.contains("trigger=error"),
        "A learns the window from a refusal: {x}"
    );

    // Replicas read what others learned every two seconds.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = mock.recorded().len();
    let (status, x) = send(&b, "Bearer two", 200, &request(&session("Agent two.", 80))).await;
    assert_eq!(status, 200);
    assert!(x.contains("trigger=preflight"), "{x}");
    for seen in &mock.recorded()[before..] {
        let request: Value = serde_json::from_slice(&seen.body).unwrap();
        assert!(
            mock_tokens(&request) <= WINDOW,
            "B sent a request over the window"
        );
    }
}

#[tokio::test]
async fn a_redis_behind_tls_signed_by_a_private_ca_is_shared_through_rediss() {
    let Some(redis) = Redis::start_tls() else {
        return;
    };
    let mock = Mock::start().await;
    let [a, b] = replicas(&mock, &redis, "tls", Some(WINDOW));
    let body = request(&session("You are a coding agent.", 40));
    let (status, x) = send(&a, "Bearer tls-client", 200, &body).await;
    assert_eq!(status, 200, "{x}\n{}", a.logs());
    assert!(x.contains("summary=llm"), "{x}");
    // Stored through the TLS port, seen on the plain one.
    assert!(redis.count("replicas-tls-*:cp:*") >= 1, "{}", a.logs());
    let (status, x) = send(&b, "Bearer tls-client", 200, &body).await;
    assert_eq!(status, 200);
    assert!(x.contains("summary=cache"), "B resumes over TLS: {x}");
    for proxy in [&a, &b] {
        assert!(!proxy.logged("out of reach"), "{}", proxy.logs());
        let up = metric(proxy, "compaction_proxy_store_up{backend=\"redis\"}").await;
        assert_eq!(up, 1);
    }
    assert_eq!(mock.summaries().len(), 1);
}

#[test]
fn a_ca_file_that_cannot_be_read_stops_the_proxy_with_a_clear_message() {
    let dir = tempdir();
    let config_path = dir.join("proxy.toml");
    let missing = dir.join("no-such-ca.pem");
    std::fs::write(
        &config_path,
        format!(
            "[cache]\nbackend = \"redis\"\nredis_url = \"rediss://127.0.0.1:6380\"\nredis_ca_file = \"{}\"\n",
            missing.display()
        ),
    )
    .unwrap();
    let stderr = support::refused_config(&config_path);
    assert!(stderr.contains("cache.redis_ca_file"), "{stderr}");
    assert!(stderr.contains("no-such-ca.pem"), "{stderr}");
}

#[tokio::test]
async fn a_redis_dump_holds_none_of_the_conversations_text() {
    let Some(redis) = Redis::start() else { return };
    let mock = Mock::start().await;
    let replicas = replicas(&mock, &redis, "sealed", Some(WINDOW));
    let mut history = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let headers = alternate(&replicas, &mock, &mut history, 0..60).await;
    assert!(
        headers.iter().any(|x| x.contains("summary=cache")),
        "{headers:#?}"
    );
    assert!(redis.count("*:cp:*") >= 1, "checkpoints were stored");
    // Uncompressed, so that text in the clear would show as it is.
    redis
        .command(&["CONFIG", "SET", "rdbcompression", "no"])
        .unwrap();
    assert_eq!(redis.command(&["SAVE"]).unwrap(), "+OK\r\n");
    let dump = std::fs::read(redis.dir.join("dump.rdb")).unwrap();
    assert!(dump.len() > 1000, "the dump holds the checkpoints");
    for text in [
        "You are a coding agent",
        "please fix src/module_",
        "had an off-by-one",
        "assertion failed",
    ] {
        let found = dump.windows(text.len()).any(|w| w == text.as_bytes());
        assert!(!found, "{text:?} is in the clear in the dump");
    }
}
