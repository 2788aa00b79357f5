//! compaction-proxy: a transparent OpenAI-compatible reverse proxy that compacts chat
//! conversations too long for their model. The modules follow a request's path:
//! `server` (listen) -> `router` (route, auth, log; `limits` bounds the client's body)
//! -> `attempt` (the compaction path and its one retry loop, for each dialect `wire`
//! reads and writes) or `passthrough` -> `upstream` (send) -> `body` (stream back).
//! `classify` decides what an upstream's refusal means; `models` knows context windows;
//! `compact` is the pure engine that rewrites a conversation; `summarize` is the LLM
//! summariser and `redact` masks the secrets it must not repeat; `checkpoint` is the
//! summary cache; `offline` is the `compact` command.

pub mod app;
pub(crate) mod attempt;
pub(crate) mod auth;
pub(crate) mod body;
pub mod checkpoint;
pub mod classify;
pub mod cli;
pub mod compact;
pub mod config;
pub(crate) mod error;
pub(crate) mod limits;
pub mod logging;
pub(crate) mod metrics;
pub(crate) mod models;
pub mod offline;
pub mod operator;
pub(crate) mod passthrough;
pub(crate) mod redact;
pub(crate) mod router;
pub mod server;
pub(crate) mod summarize;
pub mod upstream;
pub mod wire;
