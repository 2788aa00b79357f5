//! compaction-proxy: a transparent OpenAI-compatible reverse proxy that compacts
//! conversations too long for their model.
//!
//! The layers, top to bottom. A module imports modules of its own layer or of the layers
//! below it, never of a layer above, and no two modules import each other, directly or
//! through others (`tests/architecture.rs` holds the code to this list, file by file and
//! folder by folder; the README's list is this one).
//!
//! 1. `proxy`, `cli`: the entry points: the server handing every request to the router,
//!    from start to shutdown; the command line.
//! 2. `router`: one request's route, the client's key, the log line.
//! 3. `passthrough`, `upgrade`, `codex_ws`, `compaction_path`, `command`: the paths a
//!    request takes: forwarded as it is; a WebSocket relayed, or Codex's bridged; the one
//!    request loop that compacts, for every API; the CLI's compact and cache commands.
//! 4. `app`: the state the paths share, built from the configuration.
//! 5. `compactor`, `summarize`: compaction as one service (the engine, the LLM summariser,
//!    the checkpoints a compaction makes), and the summariser's calls.
//! 6. `server`, `upstream`, `telemetry`, `metrics`, `checkpoint`, `auth`, `windows`: the
//!    services: the HTTP/1.1 server and client, traces, counters, the stores, client keys,
//!    context windows.
//! 7. `engine`, `dialect`, `classify`, `compaction_report`: the pure parts: a
//!    conversation's rewrite, each API's view of it, what a refusal means, what a
//!    compaction reports.
//! 8. `error`, `http1`, `body`, `cause`, `limits`, `path`, `config`, `units`, `redact`,
//!    `growth`, `shutdown`, `memory_trim`, `model_record`, `usage_scan`, `logging`: the
//!    leaves: the proxy's own errors, HTTP/1.1 as bytes, bodies, causes, bounds, paths,
//!    settings, units, secrets masked, growth rates, shutdown, heap trimming, what is
//!    learned of a model, usage in a stream, log set-up.

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
