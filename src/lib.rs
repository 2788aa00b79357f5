//! compaction-proxy: a transparent OpenAI-compatible reverse proxy that compacts chat
//! conversations too long for their model. The modules follow a request's path:
//! `server` (listen) -> `router` (route, auth, log; `limits` bounds the client's body)
//! -> `chat` (the compaction path, for each dialect `wire` reads and writes) or
//! `passthrough` -> `upstream` (send) -> `body` (stream back). `classify` decides what
//! an upstream's refusal means; `models` knows context windows; `compact` is the pure
//! engine that rewrites a conversation; `offline` is the `compact` command; `summarize`
//! and `redact` are the pure parts of the LLM summariser (prompt, chunking, answer
//! checks, secret masking), not yet called by the proxy.

pub mod app;
pub mod auth;
pub mod body;
pub mod chat;
pub mod checkpoint;
pub mod classify;
pub mod cli;
pub mod compact;
pub mod config;
pub mod error;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod models;
pub mod offline;
pub mod passthrough;
pub mod redact;
pub mod router;
pub mod server;
pub mod summarize;
pub mod upstream;
pub mod wire;
