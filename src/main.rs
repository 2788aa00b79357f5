use std::process::ExitCode;

use clap::Parser;

use compaction_proxy::app::App;
use compaction_proxy::cli::{CheckArgs, Cli, Command, ServeArgs};
use compaction_proxy::config::{Config, Overrides};
use compaction_proxy::{command, logging, proxy};

/// Exit status for a configuration the proxy cannot run with.
const EXIT_BAD_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Check(args)) => check(&args),
        Some(Command::Compact(args)) => command::compact::run(&args),
        Some(Command::Cache(args)) => command::cache::run(&args),
        None => serve(&cli.serve),
    }
}

fn serve(args: &ServeArgs) -> ExitCode {
    let config = match Config::load(args.config.as_deref(), &args.overrides()) {
        Ok(config) => config,
        Err(e) => return fail(EXIT_BAD_CONFIG, &e),
    };
    logging::init(&config.log);
    let app = match App::new(config) {
        Ok(app) => app,
        Err(e) => return fail(EXIT_BAD_CONFIG, &e),
    };
    let runtime = match runtime(app.config.worker_threads()).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(1, &e),
    };
    match runtime.block_on(proxy::run(app)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(1, &e),
    }
}

/// One thread serves everything on a single-threaded runtime: a multi-threaded one
/// with one worker would still accept on the main thread and hand every connection, and
/// every wake-up of its task, across threads.
fn runtime(threads: usize) -> tokio::runtime::Builder {
    if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    }
}

fn check(args: &CheckArgs) -> ExitCode {
    match Config::load(args.config.as_deref(), &Overrides::default()) {
        Ok(config) => {
            print!("{}", config.to_toml());
            ExitCode::SUCCESS
        }
        Err(e) => fail(EXIT_BAD_CONFIG, &e),
    }
}

fn fail(code: u8, error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("compaction-proxy: {error}");
    ExitCode::from(code)
}
