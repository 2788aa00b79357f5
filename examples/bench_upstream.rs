//! A fast mock OpenAI-compatible upstream for the benchmarks under `bench/`.
//!
//! Answers every request (any method, any path) with a ~0.5 KB chat completion once the
//! request body has been read; `--delay-ms N` holds each answer N ms first. A request
//! with the header `x-bench-sse` (or a path ending in `/sse`) gets an SSE stream instead:
//! `--sse-chunks` chunks `--sse-gap-ms` apart, then `data: [DONE]`.
//!
//! Gateways that rebuild the request (LiteLLM, Portkey, crabllm) drop unknown headers
//! and rewrite paths, but they all forward the body's content. So a small body (under
//! 16 KB) also selects these by itself: `"stream":true` asks for the SSE stream, and the
//! text `bench-delay-ms=N` anywhere in it holds that answer N ms. One mock then serves
//! the instant, delayed and streaming variants to every peer with one configuration.
//!
//!     cargo run --release --example bench_upstream -- [--listen 127.0.0.1:0]
//!         [--delay-ms N] [--threads N] [--sse-chunks 64] [--sse-gap-ms 20]
//!
//! Prints `listening on http://ADDR` on stdout once bound, so scripts can read the port.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// About 0.5 KB, shaped like a real non-streaming chat completion.
const COMPLETION: &str = r#"{"id":"chatcmpl-bench0000000000000000000000","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"This is a canned answer from the benchmark upstream. It is long enough to look like a short real reply, and short enough to cost nothing to send.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":42,"completion_tokens":31,"total_tokens":73,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},"system_fingerprint":"fp_bench00000"}"#;

const CHUNK: &str = r#"data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}"#;

type Body = UnsyncBoxBody<Bytes, Infallible>;

struct Options {
    listen: SocketAddr,
    delay: Duration,
    threads: usize,
    sse_chunks: usize,
    sse_gap: Duration,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        delay: Duration::ZERO,
        threads: 1,
        sse_chunks: 64,
        sse_gap: Duration::from_millis(20),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--listen" => options.listen = value.parse().map_err(|e| bad(&e))?,
            "--delay-ms" => {
                options.delay = Duration::from_millis(value.parse().map_err(|e| bad(&e))?);
            }
            "--threads" => options.threads = value.parse().map_err(|e| bad(&e))?,
            "--sse-chunks" => options.sse_chunks = value.parse().map_err(|e| bad(&e))?,
            "--sse-gap-ms" => {
                options.sse_gap = Duration::from_millis(value.parse().map_err(|e| bad(&e))?);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if !options.listen.ip().is_loopback() {
        return Err("the benchmark upstream listens on loopback only".into());
    }
    Ok(options)
}

fn main() -> std::process::ExitCode {
    let options = match parse_args() {
        Ok(options) => Arc::new(options),
        Err(e) => {
            eprintln!("bench_upstream: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads.max(1))
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(serve(options)),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_upstream: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(options: Arc<Options>) -> std::io::Result<()> {
    let listener = TcpListener::bind(options.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // stdout is a pipe under the scripts; without a flush they would wait for exit.
    std::io::stdout().flush()?;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors under a heavy run: back off rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Small answers and SSE chunks must leave at once, or the mock adds Nagle delays
        // that would be blamed on whatever sits in front of it.
        let _ = stream.set_nodelay(true);
        let options = Arc::clone(&options);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(Arc::clone(&options), request));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    options: Arc<Options>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let sse =
        request.headers().contains_key("x-bench-sse") || request.uri().path().ends_with("/sse");
    // Read the whole upload, as a real upstream does before answering; a client error
    // mid-body only means there is nobody left to answer.
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let (sse, delay) = if body.len() < 16 * 1024 {
        let marked = marked_delay(&body);
        (sse || asks_stream(&body), marked.unwrap_or(options.delay))
    } else {
        (sse, options.delay)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let response = if sse {
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(sse_body(options.sse_chunks, options.sse_gap))
    } else {
        Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(COMPLETION.as_bytes())).boxed_unsync())
    };
    // The builder only fails on invalid header values, and these are constants.
    Ok(response.unwrap_or_else(|_| Response::new(Body::default())))
}

/// `"stream":true` (with or without a space), as every client and gateway writes it.
fn asks_stream(body: &[u8]) -> bool {
    memchr::memmem::find(body, br#""stream":true"#).is_some()
        || memchr::memmem::find(body, br#""stream": true"#).is_some()
}

/// N from the text `bench-delay-ms=N` in the body.
fn marked_delay(body: &[u8]) -> Option<Duration> {
    const MARK: &[u8] = b"bench-delay-ms=";
    let at = memchr::memmem::find(body, MARK)? + MARK.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let ms: u64 = std::str::from_utf8(&body[at..at + digits])
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// The first chunk goes at once; each next one `gap` after the previous, then `[DONE]`.
fn sse_body(chunks: usize, gap: Duration) -> Body {
    let frames = futures_util::stream::unfold(0usize, move |sent| async move {
        if sent > chunks {
            return None;
        }
        if sent > 0 {
            tokio::time::sleep(gap).await;
        }
        let data = if sent == chunks {
            Bytes::from_static(b"data: [DONE]\n\n")
        } else {
            Bytes::from(format!("{CHUNK}\n\n"))
        };
        Some((Ok::<_, Infallible>(Frame::data(data)), sent + 1))
    });
    StreamBody::new(frames).boxed_unsync()
}
