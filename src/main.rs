use std::process::ExitCode;

use clap::{Parser, Subcommand};
use compaction_proxy::offline;

#[derive(Parser)]
#[command(name = "compaction-proxy", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Compact(offline::CompactArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Compact(args) => offline::run(&args),
    }
}
