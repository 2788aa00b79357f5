//! The shared state every request sees: settings, the upstream client, the summariser and
//! its cache, client keys and metrics. Built once at start; what it learns later (windows,
//! checkpoints, counters) sits behind its own locks and atomics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::auth::Auth;
use crate::checkpoint::{Checkpoints, Prepared, Tenants};
use crate::compactor::Compactor;
use crate::config::OtlpEndpoint;
use crate::config::{Config, ConfigError};
use crate::growth::Growth;
use crate::limits::Buffers;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::summarize::Summarizer;
use crate::telemetry::Telemetry;
use crate::upstream::{Upstream, UpstreamInitError};
use crate::windows::ModelWindows;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Upstream(#[from] UpstreamInitError),
    #[error(transparent)]
    Cache(#[from] crate::checkpoint::cache::OpenError),
}

pub struct App {
    pub config: Config,
    pub upstream: Upstream,
    pub auth: Auth,
    pub metrics: Metrics,
    /// Context windows: configured, learned from upstream errors, built in.
    pub models: ModelWindows,
    /// The LLM summariser; `None` when `summarizer.enabled` is off.
    pub summarizer: Option<Summarizer>,
    /// The summary cache; `None` when `cache.enabled` is off.
    pub checkpoints: Option<Checkpoints>,
    /// The upstream answered a remote compaction request as one it does not know: the
    /// proxy answers them (see [`crate::compaction_path::codex_compaction`]).
    pub remote_compaction_missing: AtomicBool,
    /// The upstream refused a Responses WebSocket as a server that does not speak it: the
    /// proxy bridges them (see [`crate::codex_ws`]) without asking again.
    pub responses_websocket_missing: AtomicBool,
    /// How fast each conversation grows, turn by turn.
    pub growth: Growth,
    /// Whose conversation each request is, by its credential, hashed once per credential.
    pub tenants: Tenants,
    /// The memory chat bodies read whole may take, all together.
    pub buffers: Arc<Buffers>,
    /// The trace exporter; `None` unless traces are on.
    pub telemetry: Option<Arc<Telemetry>>,
    /// The graceful shutdown every connection watches.
    pub shutdown: Shutdown,
    next_id: AtomicU64,
}

impl App {
    /// Compaction, with this process's summariser, summary cache, metrics and windows.
    pub fn compactor(&self) -> Compactor<'_> {
        Compactor {
            summarizer: self.summarizer.as_ref(),
            checkpoints: self.checkpoints.as_ref(),
            metrics: &self.metrics,
            windows: &self.models,
        }
    }

    pub fn new(config: Config) -> Result<Self, AppError> {
        let upstream = Upstream::new(&config)?;
        let auth = Auth::from_config(&config.auth)?;
        let models = ModelWindows::new(config.models.clone());
        let summarizer = Summarizer::new(&config)?;
        let checkpoints = Checkpoints::open(
            &config.cache,
            config.compaction.prepare_concurrency,
            config.upstream.api_key_env.as_deref(),
        )?;
        let telemetry = OtlpEndpoint::from_settings(&config.telemetry.otlp_endpoint)
            .map_err(ConfigError::Invalid)?
            .map(|endpoint| {
                let collector = Upstream::collector(&config, &endpoint.origin())?;
                Ok::<_, UpstreamInitError>(Arc::new(Telemetry::new(
                    endpoint,
                    collector,
                    upstream.base_url(),
                )))
            })
            .transpose()?;
        Ok(Self {
            telemetry,
            buffers: Buffers::new(config.limits.max_buffered_bytes),
            checkpoints,
            models,
            summarizer,
            config,
            upstream,
            auth,
            metrics: Metrics::default(),
            remote_compaction_missing: AtomicBool::new(false),
            responses_websocket_missing: AtomicBool::new(false),
            growth: Growth::default(),
            tenants: Tenants::default(),
            shutdown: Shutdown::default(),
            next_id: AtomicU64::new(1),
        })
    }

    /// Where compactions prepared ahead of their event are kept; `None` when this process
    /// prepares none (no store, `prepare_concurrency = 0`, or `prepare_at` not below the
    /// threshold).
    pub fn prepared(&self) -> Option<&Prepared> {
        let compaction = &self.config.compaction;
        let preparing = compaction.prepare_at < compaction.threshold;
        self.checkpoints
            .as_ref()?
            .prepared
            .as_ref()
            .filter(|_| preparing)
    }

    /// A process-unique id for log lines of one request.
    pub fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}
