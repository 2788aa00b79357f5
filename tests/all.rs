//! Every integration test in one binary: the modules of `tests/suite/`, sharing the mock
//! upstream and the proxy harness of `tests/support/`. Run a file's tests with a filter:
//! `cargo test --test all suite::wire::`.

mod suite;
mod support;
