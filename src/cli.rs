//! The command line, as the contract fixes it: `serve` (the default), `check`, `compact`;
//! and `cache`, for operators.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{LogFormat, Overrides};

#[derive(Debug, Parser)]
#[command(
    name = "compaction-proxy",
    version,
    about = "A transparent OpenAI-compatible proxy that compacts chat conversations too long for their model, then retries.",
    long_about = None,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `serve`'s options, so that `compaction-proxy --listen ...` works without `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (the default when no command is given).
    Serve(ServeArgs),
    /// Validate the configuration and print the effective settings.
    Check(CheckArgs),
    /// Compact a chat-completions request body offline (FILE or stdin to stdout).
    Compact(crate::command::compact::CompactArgs),
    /// Inspect or clear the checkpoint store (stats, clear).
    Cache(crate::command::cache::CacheArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Config file [default: ./proxy.toml if it exists, else built-in defaults]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Address to listen on, overriding the config [default: 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Upstream base URL, overriding the config [default: https://api.openai.com/v1]
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Log format, overriding the config
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<LogFormatArg>,
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Config file [default: ./proxy.toml if it exists, else built-in defaults]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl ServeArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            log_format: self.log_format.map(|f| match f {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            }),
        }
    }
}
