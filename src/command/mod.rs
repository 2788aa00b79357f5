//! The commands beside `serve`: `compact` (the engine on a request body, offline) and
//! `cache` (what the configured store holds, and clearing it).

pub mod cache;
pub mod compact;
