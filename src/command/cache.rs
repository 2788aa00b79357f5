//! `compaction-proxy cache`: an operator's view of the checkpoint store the config names,
//! opened by this process alongside the proxies using it (the embedded file allows it, and
//! Redis is shared anyway).

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::checkpoint::{Checkpoints, Tenant};
use crate::config::{CacheBackend, Config, Overrides};

#[derive(Debug, Clone, Args)]
#[command(about = "Inspect or clear the checkpoint store the config names")]
pub struct CacheArgs {
    /// Config file [default: ./proxy.toml if it exists, else built-in defaults]
    #[arg(long, value_name = "PATH", global = true)]
    pub config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum CacheAction {
    /// Print what the store holds: checkpoints, their bytes, tenants, learned models.
    Stats,
    /// Drop checkpoints: every one (--all, with the learned models), or one tenant's.
    Clear(ClearArgs),
}

#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct ClearArgs {
    /// Drop every checkpoint and every learned model.
    #[arg(long)]
    pub all: bool,
    /// Drop the checkpoints of the tenant whose API key (or `Authorization` value) is in
    /// this environment variable; the key is read from the environment so that it never
    /// shows in the process list or the shell's history.
    #[arg(long, value_name = "VAR")]
    pub tenant_key_env: Option<String>,
}

/// Exit status for a bad config or argument.
const BAD_INPUT: u8 = 2;

pub fn run(args: &CacheArgs) -> ExitCode {
    let config = match Config::load(args.config.as_deref(), &Overrides::default()) {
        Ok(config) => config,
        Err(e) => return fail(BAD_INPUT, &e),
    };
    let tenant = match &args.action {
        CacheAction::Clear(ClearArgs {
            tenant_key_env: Some(var),
            ..
        }) => match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => Some(Tenant::from_credential(key.as_bytes())),
            _ => {
                return fail(
                    BAD_INPUT,
                    &format!("the environment variable {var} holds no key"),
                )
            }
        },
        _ => None,
    };
    // Counting and clearing open no checkpoint: no seal is needed.
    let checkpoints = match Checkpoints::open(&config.cache, 0, None) {
        Ok(Some(checkpoints)) => checkpoints,
        Ok(None) => return fail(BAD_INPUT, &"the cache is disabled (cache.enabled = false)"),
        Err(e) => return fail(1, &e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(1, &e),
    };
    let place = match config.cache.backend {
        CacheBackend::Embedded => match config.cache.embedded_path() {
            Some(path) => path.display().to_string(),
            None => "no state folder: neither cache.path, XDG_STATE_HOME nor HOME".into(),
        },
        CacheBackend::Redis => format!("namespace {}", config.cache.redis_namespace),
        CacheBackend::Memory => "this process only".into(),
    };
    let backend = checkpoints.backend().as_str();
    match &args.action {
        CacheAction::Stats => match runtime.block_on(checkpoints.stats()) {
            Ok(stats) => {
                println!("backend: {backend} ({place})");
                println!("checkpoints: {}", stats.checkpoints);
                println!("bytes: {}", stats.bytes);
                println!("tenants: {}", stats.tenants);
                println!("models: {}", stats.models);
                ExitCode::SUCCESS
            }
            Err(e) => fail(1, &e),
        },
        CacheAction::Clear(_) => match runtime.block_on(checkpoints.clear(tenant)) {
            Ok(n) => {
                let whose = if tenant.is_some() {
                    "the tenant's"
                } else {
                    "all"
                };
                println!("cleared {n} checkpoints ({whose}) from {backend} ({place})");
                ExitCode::SUCCESS
            }
            Err(e) => fail(1, &e),
        },
    }
}

fn fail(code: u8, error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("compaction-proxy cache: {error}");
    ExitCode::from(code)
}
