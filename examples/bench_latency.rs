//! Latency client for the benchmarks under `bench/`: one request at a time over a
//! keep-alive connection per target, targets visited in interleaved rounds so the noise
//! of a shared machine lands on all of them alike. Figures are per round, then the median
//! over rounds with its spread; "added" is a target's figure minus the first target's
//! (the direct path) in the same round.
//!
//!     cargo run --release --example bench_latency -- \
//!         --target direct=127.0.0.1:PORT --target proxy=127.0.0.1:PORT ... \
//!         [--mode latency|sse] [--rounds 20] [--requests 1000] [--warmup 200] \
//!         [--body-bytes 0] [--path /v1/chat/completions] [--sse-gap-ms 20] \
//!         [--header NAME=KEY:VALUE ...]
//!
//! `--mode rate --rate R --seconds S --connections C` is open-loop load at a fixed
//! rate instead (wrk2-style, for the p99-bounded throughput figure): requests are due
//! R per second whether or not earlier ones have come back, shared by C keep-alive
//! connections, and each one's latency counts from when it was released, so time spent
//! queued behind busy connections is included (no coordinated omission). One
//! `RESULT mode=rate ...` line per target with the rate actually delivered.
//!
//! `--header` adds a request header for one target (gateways such as Portkey are told
//! the upstream in headers). In `--mode sse` the body says `"stream":true`.
//! Prints a markdown table, then one `RESULT key=value ...` line per target for scripts.
//! `--body-bytes 0` sends a small (~0.3 KB) chat body; N pads the message to N bytes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{header, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A target that keeps failing is broken, not noisy: give up instead of looping.
const MAX_ERRORS: usize = 20;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Latency,
    Sse,
    Rate,
}

struct Options {
    targets: Vec<(String, SocketAddr)>,
    /// (target name, header name, value)
    headers: Vec<(String, String, String)>,
    mode: Mode,
    rounds: usize,
    requests: usize,
    warmup: usize,
    body_bytes: usize,
    path: String,
    sse_gap: Duration,
    rate: f64,
    seconds: f64,
    connections: usize,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        targets: Vec::new(),
        headers: Vec::new(),
        mode: Mode::Latency,
        rounds: 20,
        requests: 1000,
        warmup: 200,
        body_bytes: 0,
        path: "/v1/chat/completions".into(),
        sse_gap: Duration::from_millis(20),
        rate: 1000.0,
        seconds: 2.0,
        connections: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--target" => {
                let (name, addr) = value
                    .split_once('=')
                    .ok_or_else(|| bad(&"expected NAME=HOST:PORT"))?;
                let addr: SocketAddr = addr.parse().map_err(|e| bad(&e))?;
                if !addr.ip().is_loopback() {
                    return Err(bad(&"targets must be on loopback"));
                }
                options.targets.push((name.to_owned(), addr));
            }
            "--header" => {
                let (name, header) = value
                    .split_once('=')
                    .ok_or_else(|| bad(&"expected NAME=KEY:VALUE"))?;
                let (key, val) = header
                    .split_once(':')
                    .ok_or_else(|| bad(&"expected NAME=KEY:VALUE"))?;
                options.headers.push((
                    name.to_owned(),
                    key.trim().to_owned(),
                    val.trim().to_owned(),
                ));
            }
            "--mode" => {
                options.mode = match value.as_str() {
                    "latency" => Mode::Latency,
                    "sse" => Mode::Sse,
                    "rate" => Mode::Rate,
                    _ => return Err(bad(&"expected latency or sse")),
                }
            }
            "--rounds" => options.rounds = value.parse().map_err(|e| bad(&e))?,
            "--requests" => options.requests = value.parse().map_err(|e| bad(&e))?,
            "--warmup" => options.warmup = value.parse().map_err(|e| bad(&e))?,
            "--body-bytes" => options.body_bytes = value.parse().map_err(|e| bad(&e))?,
            "--path" => options.path = value,
            "--rate" => options.rate = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => options.seconds = value.parse().map_err(|e| bad(&e))?,
            "--connections" => options.connections = value.parse().map_err(|e| bad(&e))?,
            "--sse-gap-ms" => {
                options.sse_gap = Duration::from_millis(value.parse().map_err(|e| bad(&e))?);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if options.targets.is_empty() {
        return Err("at least one --target is needed (the first is the baseline)".into());
    }
    if options.rounds == 0 || options.requests == 0 {
        return Err("--rounds and --requests must be at least 1".into());
    }
    Ok(options)
}

fn main() -> std::process::ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("bench_latency: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // One thread: the client must not compete with itself for its core, and a single
    // request in flight needs no more.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(async {
            match options.mode {
                Mode::Latency => latency(&options).await,
                Mode::Sse => sse(&options).await,
                Mode::Rate => rate(&options).await,
            }
        }),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_latency: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A keep-alive HTTP/1.1 connection to one target that reconnects after a failure.
struct Client {
    name: String,
    addr: SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
    errors: usize,
    headers: Vec<(String, String)>,
}

impl Client {
    fn new(name: &str, addr: SocketAddr, options: &Options) -> Self {
        let headers = options
            .headers
            .iter()
            .filter(|(target, _, _)| target == name)
            .map(|(_, key, value)| (key.clone(), value.clone()))
            .collect();
        Self {
            name: name.to_owned(),
            addr,
            sender: None,
            errors: 0,
            headers,
        }
    }

    async fn sender(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, Error> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = TcpStream::connect(self.addr).await?;
            stream.set_nodelay(true)?;
            let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        self.sender.as_mut().ok_or_else(|| "no connection".into())
    }

    fn request(&self, path: &str, body: &Bytes, sse: bool) -> Result<Request<Full<Bytes>>, Error> {
        let mut builder = Request::post(path)
            .header(header::HOST, self.addr.to_string())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, "Bearer sk-bench");
        for (key, value) in &self.headers {
            builder = builder.header(key.as_str(), value.as_str());
        }
        if sse {
            builder = builder
                .header("x-bench-sse", "1")
                .header(header::ACCEPT, "text/event-stream");
        }
        Ok(builder.body(Full::new(body.clone()))?)
    }

    /// One full request/response; the time covers sending until the last body byte.
    async fn timed(&mut self, path: &str, body: &Bytes) -> Result<Duration, Error> {
        let request = self.request(path, body, false)?;
        let started = Instant::now();
        let outcome = async {
            let response = self.sender().await?.send_request(request).await?;
            let status = response.status();
            response.into_body().collect().await?;
            match status {
                StatusCode::OK => Ok(started.elapsed()),
                _ => Err(Error::from(format!("status {status}"))),
            }
        }
        .await;
        self.note(outcome)
    }

    /// One SSE request: arrival time of every body frame from the send, and how many
    /// `data:` events each frame held.
    async fn stream(&mut self, path: &str, body: &Bytes) -> Result<Vec<(Duration, usize)>, Error> {
        let request = self.request(path, body, true)?;
        let started = Instant::now();
        let outcome = async {
            let response = self.sender().await?.send_request(request).await?;
            if response.status() != StatusCode::OK {
                return Err(Error::from(format!("status {}", response.status())));
            }
            let mut body = response.into_body();
            let mut frames = Vec::with_capacity(128);
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    let events = data.windows(5).filter(|w| w == b"data:").count();
                    frames.push((started.elapsed(), events));
                }
            }
            Ok(frames)
        }
        .await;
        self.note(outcome)
    }

    fn note<T>(&mut self, outcome: Result<T, Error>) -> Result<T, Error> {
        if outcome.is_err() {
            self.sender = None;
            self.errors += 1;
            if self.errors > MAX_ERRORS {
                return Err(format!(
                    "{}: too many errors, last: {}",
                    self.name,
                    outcome.err().map(|e| e.to_string()).unwrap_or_default()
                )
                .into());
            }
        }
        outcome
    }
}

fn chat_body(bytes: usize, stream: bool) -> Bytes {
    let head = r#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":""#;
    let tail = if stream {
        r#""}],"temperature":0.2,"max_tokens":256,"stream":true}"#
    } else {
        r#""}],"temperature":0.2,"max_tokens":256}"#
    };
    let text = "Summarise the benchmark results in two sentences, please. ";
    let len = bytes
        .saturating_sub(head.len() + tail.len())
        .max(text.len());
    let content: String = text.chars().cycle().take(len).collect();
    Bytes::from(format!("{head}{content}{tail}"))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// "median [min..max]" of per-round figures, with `digits` decimals.
/// Figure `k` of every round.
fn column<const N: usize>(rounds: &[[f64; N]], k: usize) -> Vec<f64> {
    rounds.iter().map(|r| r[k]).collect()
}

/// Figure `k` of every round, minus the baseline's in the same round.
fn added<const N: usize>(rounds: &[[f64; N]], baseline: &[[f64; N]], k: usize) -> Vec<f64> {
    rounds
        .iter()
        .zip(baseline)
        .map(|(r, b)| r[k] - b[k])
        .collect()
}

fn spread(values: &[f64], digits: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.digits$} [{min:.digits$}..{max:.digits$}]",
        median(values)
    )
}

/// Rotates the visiting order each round so no target always follows the same one.
fn order(targets: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..targets).map(move |i| (i + round) % targets)
}

async fn latency(options: &Options) -> Result<(), Error> {
    let body = chat_body(options.body_bytes, false);
    let mut clients: Vec<Client> = options
        .targets
        .iter()
        .map(|(name, addr)| Client::new(name, *addr, options))
        .collect();
    for client in &mut clients {
        for _ in 0..options.warmup {
            client.timed(&options.path, &body).await.ok();
        }
    }
    // [target][round] -> (p50, p99, mean) in microseconds
    let mut stats = vec![Vec::with_capacity(options.rounds); clients.len()];
    let mut samples = Vec::with_capacity(options.requests);
    for round in 0..options.rounds {
        for t in order(clients.len(), round) {
            samples.clear();
            for _ in 0..options.requests {
                match clients[t].timed(&options.path, &body).await {
                    Ok(elapsed) => samples.push(elapsed.as_secs_f64() * 1e6),
                    Err(e) if clients[t].errors > MAX_ERRORS => return Err(e),
                    // Counted in the table; the next request reconnects.
                    Err(_) => {}
                }
            }
            samples.sort_by(f64::total_cmp);
            let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
            stats[t].push([percentile(&samples, 0.5), percentile(&samples, 0.99), mean]);
        }
    }
    println!(
        "Body {} bytes; {} rounds x {} requests per target, one at a time; median over rounds [min..max], µs.\n",
        body.len(),
        options.rounds,
        options.requests
    );
    println!("| target | p50 | p99 | mean | added p50 | added p99 | added mean | errors |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for (t, client) in clients.iter().enumerate() {
        let column = |k: usize| column(&stats[t], k);
        let added = |k: usize| added(&stats[t], &stats[0], k);
        let (p50, p99, mean) = (column(0), column(1), column(2));
        let cells = if t == 0 {
            ["—".to_owned(), "—".to_owned(), "—".to_owned()]
        } else {
            [
                spread(&added(0), 1),
                spread(&added(1), 1),
                spread(&added(2), 1),
            ]
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            client.name,
            spread(&p50, 1),
            spread(&p99, 1),
            spread(&mean, 1),
            cells[0],
            cells[1],
            cells[2],
            client.errors
        );
        results.push(format!(
            "RESULT mode=latency body_bytes={} target={} p50_us={:.1} p99_us={:.1} mean_us={:.1} added_p50_us={:.1} added_p99_us={:.1} added_mean_us={:.1} errors={}",
            body.len(),
            client.name,
            median(&p50),
            median(&p99),
            median(&mean),
            median(&added(0)),
            median(&added(1)),
            median(&added(2)),
            client.errors
        ));
    }
    println!();
    for line in results {
        println!("{line}");
    }
    Ok(())
}

async fn sse(options: &Options) -> Result<(), Error> {
    let body = chat_body(options.body_bytes, true);
    let gap_ms = options.sse_gap.as_secs_f64() * 1e3;
    // A gap this much longer than the upstream's is a stall (a delayed-ACK/Nagle stall
    // is ~40 ms, twice the nominal 20 ms).
    let stall_ms = gap_ms * 1.5;
    let mut clients: Vec<Client> = options
        .targets
        .iter()
        .map(|(name, addr)| Client::new(name, *addr, options))
        .collect();
    // Warm-up with a plain request: one stream would take a second and a half.
    let plain = chat_body(options.body_bytes, false);
    for client in &mut clients {
        client.timed(&options.path, &plain).await.ok();
    }
    // [target][round] -> (ttfb ms, mean gap ms, max gap ms, events, frames, stalls)
    let mut stats = vec![Vec::with_capacity(options.rounds); clients.len()];
    for round in 0..options.rounds {
        for t in order(clients.len(), round) {
            let frames = match clients[t].stream(&options.path, &body).await {
                Ok(frames) if !frames.is_empty() => frames,
                Ok(_) => return Err(format!("{}: empty SSE stream", clients[t].name).into()),
                Err(e) => return Err(format!("{}: {e}", clients[t].name).into()),
            };
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let gaps: Vec<f64> = frames.windows(2).map(|w| ms(w[1].0) - ms(w[0].0)).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
            let max = gaps.iter().copied().fold(0.0, f64::max);
            let events: usize = frames.iter().map(|f| f.1).sum();
            let stalls = gaps.iter().filter(|g| **g > stall_ms).count();
            stats[t].push([
                ms(frames[0].0),
                mean,
                max,
                events as f64,
                frames.len() as f64,
                stalls as f64,
            ]);
        }
    }
    println!(
        "SSE: {} rounds, one stream per target per round; upstream gap {gap_ms:.0} ms; stall = gap over {stall_ms:.0} ms. Median over rounds [min..max], ms.\n",
        options.rounds
    );
    println!("| target | TTFB | mean gap | max gap | added TTFB | added mean gap | added max gap | events/frames | stalls |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for (t, client) in clients.iter().enumerate() {
        let column = |k: usize| column(&stats[t], k);
        let added = |k: usize| added(&stats[t], &stats[0], k);
        let cells = if t == 0 {
            ["—".to_owned(), "—".to_owned(), "—".to_owned()]
        } else {
            [
                spread(&added(0), 3),
                spread(&added(1), 3),
                spread(&added(2), 3),
            ]
        };
        let stalls: f64 = column(5).iter().sum();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0}/{:.0} | {stalls:.0} |",
            client.name,
            spread(&column(0), 3),
            spread(&column(1), 3),
            spread(&column(2), 3),
            cells[0],
            cells[1],
            cells[2],
            median(&column(3)),
            median(&column(4)),
        );
        results.push(format!(
            "RESULT mode=sse target={} ttfb_ms={:.3} mean_gap_ms={:.3} max_gap_ms={:.3} added_ttfb_ms={:.3} added_mean_gap_ms={:.3} added_max_gap_ms={:.3} events={:.0} frames={:.0} stalls={stalls:.0}",
            client.name,
            median(&column(0)),
            median(&column(1)),
            median(&column(2)),
            median(&added(0)),
            median(&added(1)),
            median(&added(2)),
            median(&column(3)),
            median(&column(4)),
        ));
    }
    println!();
    for line in results {
        println!("{line}");
    }
    Ok(())
}

/// Open-loop load at `--rate` requests/s on each target in turn (see the module doc).
async fn rate(options: &Options) -> Result<(), Error> {
    for (name, addr) in &options.targets {
        let (achieved, p50, p99, errors, sent) = fixed_rate(options, name, *addr).await;
        println!(
            "RESULT mode=rate target={name} rate={:.0} achieved_rps={achieved:.0} p50_us={p50:.0} p99_us={p99:.0} errors={errors} requests={sent}",
            options.rate
        );
    }
    Ok(())
}

/// (achieved requests/s, p50 µs, p99 µs, errors, requests due)
async fn fixed_rate(
    options: &Options,
    name: &str,
    addr: SocketAddr,
) -> (f64, f64, f64, usize, usize) {
    use std::sync::Arc;
    use tokio::sync::{mpsc, Mutex};

    let body = chat_body(options.body_bytes, false);
    let total = (options.rate * options.seconds).round().max(1.0) as usize;
    let (tx, rx) = mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..options.connections.max(1) {
        let rx = Arc::clone(&rx);
        let mut client = Client::new(name, addr, options);
        let (path, body) = (options.path.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            // Open the connection before the clock starts.
            client.timed(&path, &body).await.ok();
            client.errors = 0;
            let mut samples = Vec::new();
            let mut errors = 0;
            loop {
                let released = match rx.lock().await.recv().await {
                    Some(released) => released,
                    None => break,
                };
                match client.timed(&path, &body).await {
                    Ok(_) => samples.push(released.elapsed().as_secs_f64() * 1e6),
                    Err(_) => errors += 1,
                }
            }
            (samples, errors)
        }));
    }
    tokio::task::yield_now().await;
    // tokio's timer ticks in milliseconds, which would release requests in bursts of
    // rate/1000; a plain thread sleeping between due times spreads them to within
    // ~0.1 ms (closer ones go together rather than waking the thread for each).
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / options.rate.max(1e-3));
    let dispatcher = std::thread::spawn(move || {
        for i in 0..total {
            let due = started + interval.mul_f64(i as f64);
            let now = Instant::now();
            if due > now + Duration::from_micros(100) {
                std::thread::sleep(due - now);
            }
            if tx.send(Instant::now()).is_err() {
                break;
            }
        }
    });
    let mut samples = Vec::with_capacity(total);
    let mut errors = 0;
    for worker in workers {
        if let Ok((s, e)) = worker.await {
            samples.extend(s);
            errors += e;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = dispatcher.join();
    samples.sort_by(f64::total_cmp);
    (
        samples.len() as f64 / elapsed,
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        errors,
        total,
    )
}
