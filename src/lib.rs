//! compaction-proxy: a transparent OpenAI-compatible reverse proxy that compacts chat
//! conversations too long for their model. The modules follow a request's path:
//! `server` (listen) -> `router` (route, auth, log) -> `chat` (the compaction path) or
//! `passthrough` -> `upstream` (send) -> `body` (stream back).

pub mod app;
pub mod auth;
pub mod body;
pub mod chat;
pub mod cli;
pub mod config;
pub mod error;
pub mod logging;
pub mod metrics;
pub mod passthrough;
pub mod router;
pub mod server;
pub mod upstream;
