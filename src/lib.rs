//! compaction-proxy: a transparent OpenAI-compatible reverse proxy that compacts
//! conversations too long for their model. The layers, top to bottom:
//!
//! - the edge: `server` (listen) -> `router` (route, `auth`, log; `limits` bounds the
//!   client's body) -> `passthrough`, `upgrade` (WebSocket relays, or `codex_ws`, Codex's Responses
//!   WebSocket bridged onto the compaction path) or `compaction_path`;
//! - `compaction_path`: the one request loop (decide, send, recover) for every API
//!   `dialect`, and Codex's compaction requests;
//! - `compactor`: compaction as one service (the engine, the LLM `summarize`r with its
//!   single flight and fallback, the checkpoints a compaction makes), driven by the loop,
//!   background preparation, Codex's compaction requests and the `command`s;
//! - `engine`: the pure rewrite of a conversation;
//! - below them all: `upstream` (the HTTP client), `classify` (what a refusal means),
//!   `checkpoint` (the stores), `windows` (context windows), `growth` (how fast each
//!   conversation grows), `redact`, `metrics`, `telemetry` (OpenTelemetry traces),
//!   `compaction_report` (what the header and the metrics say of a compaction), `body`,
//!   `cause` (errors with their causes), `units`, `shutdown` (what a connection is asked
//!   to do when the server stops), `memory_trim` (freed heap back to the OS after a burst).

pub mod app;
pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod cause;
pub mod checkpoint;
pub mod classify;
pub mod cli;
pub(crate) mod codex_ws;
pub mod command;
pub(crate) mod compaction_path;
pub(crate) mod compaction_report;
pub(crate) mod compactor;
pub mod config;
pub mod dialect;
pub mod engine;
pub(crate) mod error;
pub(crate) mod growth;
// Public for the framing tests in `tests/`, which compare it with hyper's client.
pub mod http1;
pub(crate) mod limits;
pub mod logging;
pub(crate) mod memory_trim;
pub(crate) mod metrics;
pub(crate) mod model_record;
pub(crate) mod passthrough;
pub(crate) mod path;
pub mod proxy;
pub(crate) mod redact;
pub(crate) mod router;
pub mod server;
pub(crate) mod shutdown;
pub(crate) mod summarize;
pub(crate) mod telemetry;
pub(crate) mod units;
pub(crate) mod upgrade;
pub mod upstream;
pub(crate) mod usage_scan;
pub(crate) mod windows;
