//! Every integration test in one binary: the modules of `tests/suite/`, sharing the mock
//! upstream and the proxy harness of `tests/support/`. Run a file's tests with a filter:
//! `cargo test --test all suite::wire::`.

// The 100-line bound is for the proxy's code: a test here is a table of cases or a session
// read top to bottom, and splitting it would scatter what it shows.
#![allow(clippy::too_many_lines)]

mod suite;
mod support;
