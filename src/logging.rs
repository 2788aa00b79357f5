//! Structured logs on stderr, text or JSON. `RUST_LOG` wins over the configured level.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    // A second init (tests calling in twice) is harmless; the first one stays.
    let _ = match config.format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
