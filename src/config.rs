//! Typed configuration: `proxy.toml` parsed into structs with defaults, unknown keys
//! rejected, then command-line flags applied on top and the whole validated once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the proxy listens when nothing else says so (the contract's default).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Where requests go when nothing else says so (the contract's default).
pub const DEFAULT_UPSTREAM: &str = "https://api.openai.com/v1";
/// Read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "proxy.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file named with `--config` could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// TOML syntax errors, unknown keys and wrongly typed values; toml's message names
    /// the key and its line.
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value that parses but cannot work; the message names the key.
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on, `host:port`.
    pub listen: String,
    pub upstream: UpstreamConfig,
    pub models: Vec<ModelRule>,
    pub summarizer: SummarizerConfig,
    pub cache: CacheConfig,
    pub limits: LimitsConfig,
    pub auth: AuthConfig,
    pub log: LogConfig,
    pub server: ServerConfig,
    pub compaction: CompactionConfig,
    pub telemetry: TelemetryConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.to_owned(),
            upstream: UpstreamConfig::default(),
            models: Vec::new(),
            summarizer: SummarizerConfig::default(),
            cache: CacheConfig::default(),
            limits: LimitsConfig::default(),
            auth: AuthConfig::default(),
            log: LogConfig::default(),
            server: ServerConfig::default(),
            compaction: CompactionConfig::default(),
            telemetry: TelemetryConfig::default(),
        }
    }
}

/// OpenTelemetry traces (see [`crate::telemetry`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP receiver's base URL (`http://host:4318`); spans are POSTed to
    /// `{otlp_endpoint}/v1/traces`. Empty: `OTEL_EXPORTER_OTLP_ENDPOINT`, and without it
    /// no traces.
    pub otlp_endpoint: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL every request path is appended to.
    pub base_url: String,
    /// Sidecar mode: name of an environment variable holding the upstream API key, which
    /// the proxy then sends instead of the client's credentials.
    pub api_key_env: Option<String>,
    /// Time allowed to open a TCP (and TLS) connection to the upstream.
    pub connect_timeout_ms: u64,
    /// Longest silence tolerated while waiting for the upstream's headers or between two
    /// chunks of its body. Reasoning models can think for minutes before the first token,
    /// so the default is generous; there is deliberately no total timeout.
    pub idle_timeout_ms: u64,
    /// How long a connection to the upstream is kept for reuse once idle. Shorter than
    /// the servers in front of models keep theirs (uvicorn/vLLM and Node close idle
    /// connections after 5 s), so the proxy rarely sends on a connection as the upstream
    /// closes it. 0: connections are not reused.
    pub pool_idle_timeout_ms: u64,
    /// How Codex's Responses WebSocket (`GET .../responses` upgraded, with
    /// `openai-beta: responses_websockets=...`) reaches this upstream.
    pub responses_websocket: ResponsesWebsocket,
}

/// See [`UpstreamConfig::responses_websocket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponsesWebsocket {
    /// The handshake goes upstream and a 101 is relayed; once the upstream refuses one
    /// as a server that does not speak it, the proxy bridges that connection and every
    /// later one.
    #[default]
    Auto,
    /// Always relayed, whatever the upstream answers.
    Relay,
    /// Always bridged, without asking the upstream.
    Bridge,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_UPSTREAM.to_owned(),
            api_key_env: None,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 600_000,
            pool_idle_timeout_ms: 4_000,
            responses_websocket: ResponsesWebsocket::Auto,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRule {
    /// Glob (`*`, `?`) matched against the request's `model`.
    #[serde(rename = "match")]
    pub pattern: String,
    /// The model's context window in tokens.
    pub context_window: u64,
    /// The most media parts (images, audio clips, files) the upstream takes in one
    /// request: past it, the oldest are replaced by placeholders before the request is
    /// sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_media: Option<u64>,
    /// The most messages the upstream takes in one request: past it, the oldest history
    /// is summarised before the request is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SummarizerConfig {
    /// `false`: every compaction uses the deterministic summary and no summariser call is
    /// made.
    pub enabled: bool,
    /// Empty: the upstream.
    pub base_url: String,
    /// Empty: the request's own model. When set, the request's model is the fallback.
    pub model: String,
    /// Name of an environment variable holding the summariser's API key. Unset: the
    /// upstream's injected key when the summariser is the upstream, else the client's own
    /// credentials.
    pub api_key_env: Option<String>,
    /// Longest silence tolerated while waiting for the summariser's headers or between two
    /// chunks of its streamed answer.
    pub timeout_ms: u64,
    /// The summariser model's input window in tokens; a middle longer than it fits is
    /// summarised in chunks. Unset: the request's window.
    pub context_window: Option<u64>,
    /// After a failed summariser call, how long the model is left alone and the
    /// deterministic summary used directly.
    pub cooldown_ms: u64,
}

impl Default for SummarizerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            base_url: String::new(),
            model: String::new(),
            api_key_env: None,
            timeout_ms: 60_000,
            context_window: None,
            cooldown_ms: 60_000,
        }
    }
}

impl SummarizerConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn cooldown(&self) -> Duration {
        Duration::from_millis(self.cooldown_ms)
    }
}

/// The summary cache: compacted conversation prefixes reused on later turns, and what was
/// learned of the models' windows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// `false`: every turn of a long conversation is compacted anew.
    pub enabled: bool,
    /// Where checkpoints are kept: `embedded` (a file on this host, kept across restarts),
    /// `redis` (shared by replicas) or `memory` (this process only).
    pub backend: CacheBackend,
    /// The embedded store's file; empty: `$XDG_STATE_HOME/compaction-proxy/cache.sqlite3`
    /// (`~/.local/state/...` without it). Created on first use. When it is empty and that
    /// default cannot be used (no state folder, or one the proxy cannot write), the
    /// checkpoints are kept in memory, with a warning and a line on `/healthz`.
    pub path: String,
    /// For `backend = "redis"`: `redis://[user:password@]host[:port][/db]`, or `rediss://`
    /// for TLS.
    pub redis_url: String,
    /// Prefix of every Redis key, so that fleets can share one Redis.
    pub redis_namespace: String,
    /// For `rediss://`: a PEM file of certificate authorities to trust besides the
    /// Mozilla roots, for a Redis whose certificate a private CA signed.
    pub redis_ca_file: String,
    /// Bytes of checkpoints kept (in memory for `memory`, on disk for `embedded`, and in
    /// memory while Redis is out of reach for `redis`, whose own `maxmemory` bounds what it
    /// keeps); the least recently used go first.
    pub max_bytes: u64,
    /// A checkpoint unused for this long is forgotten.
    pub ttl_ms: u64,
    /// A store operation taking longer fails, and the request goes on from memory.
    pub timeout_ms: u64,
    /// Checkpoints (and the results replicas share) are encrypted, in the file and in
    /// Redis, with a key derived from the tenant's credential; `false` writes them in the
    /// clear, for operators who need to read their store. Either way, both are read.
    pub seal: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheBackend {
    Embedded,
    Redis,
    Memory,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            backend: CacheBackend::Embedded,
            path: String::new(),
            redis_url: String::new(),
            redis_namespace: "compaction-proxy".into(),
            redis_ca_file: String::new(),
            max_bytes: 256 * 1024 * 1024,
            ttl_ms: 6 * 60 * 60 * 1000,
            timeout_ms: 250,
            seal: true,
        }
    }
}

impl CacheConfig {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The embedded store's file: `path`, or the default place for a user's state; `None`
    /// when `path` is empty and the environment names no state folder (neither
    /// `XDG_STATE_HOME` nor `HOME`, as in a scratch container). The working directory is
    /// no default: a folder named after the proxy there collides with its own binary.
    pub fn embedded_path(&self) -> Option<PathBuf> {
        if !self.path.is_empty() {
            return Some(PathBuf::from(&self.path));
        }
        let nonempty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let state = nonempty("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| nonempty("HOME").map(|home| PathBuf::from(home).join(".local/state")))?;
        Some(state.join("compaction-proxy").join("cache.sqlite3"))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest chat request body the proxy reads into memory; larger ones get 413.
    /// Other routes stream and have no limit of the proxy's own.
    pub max_body_bytes: u64,
    /// Memory all the chat bodies being read or held may take together; a request whose
    /// body would go past it gets 503, so clients trickling bodies cannot grow the proxy
    /// without bound. At least `max_body_bytes`.
    pub max_buffered_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        // Chat bodies carrying a few base64 images reach tens of megabytes.
        Self {
            max_body_bytes: 64 * 1024 * 1024,
            max_buffered_bytes: 256 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Keys clients must present (`Authorization: Bearer KEY` or `x-api-key: KEY`).
    /// Prefer `keys_env` so keys stay out of the file.
    #[serde(skip_serializing)]
    pub keys: Vec<String>,
    /// Name of an environment variable holding comma-separated client keys.
    pub keys_env: Option<String>,
    /// With `upstream.api_key_env` set and no client keys, start anyway and let anyone
    /// use the injected key. Only for a proxy reachable by trusted processes alone.
    pub allow_unauthenticated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `compaction_proxy=debug`; `RUST_LOG` wins.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// On SIGINT/SIGTERM, how long in-flight requests may take to finish before the
    /// process exits anyway.
    pub shutdown_grace_ms: u64,
    /// Longest silence while reading a request body (nginx's `client_body_timeout`);
    /// past it the client gets 408 and the connection is closed.
    pub body_read_timeout_ms: u64,
    /// How long a client connection may go without a complete request head: the
    /// keep-alive idle time after an answer, and on a new connection the time to send the
    /// first head. Past it the connection is closed.
    pub keep_alive_timeout_ms: u64,
    /// Client connections served at once. At the cap the proxy stops accepting (new
    /// connections wait in the listen backlog) until one closes, as nginx does.
    pub max_connections: usize,
    /// Threads that serve connections; 0 means one per CPU the process may run on.
    /// With one, the proxy runs on a single-threaded runtime: no hand-offs between
    /// threads (nginx's one worker), and a large body's parsing and counting then holds
    /// up the other connections for its milliseconds.
    pub worker_threads: usize,
    /// How often the load is checked to decide whether to return freed heap to the OS
    /// (`malloc_trim`, glibc builds), which happens only after the load fell; 0 turns
    /// trimming off.
    pub memory_trim_interval_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            shutdown_grace_ms: 30_000,
            body_read_timeout_ms: 60_000,
            keep_alive_timeout_ms: 30_000,
            max_connections: 16_384,
            worker_threads: 0,
            memory_trim_interval_ms: 1_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    /// Compact before the first upstream call when the estimated prompt plus the
    /// completion budget exceeds this share of a known context window.
    pub threshold: f64,
    /// A compaction brings prompt plus completion budget down to this share of the
    /// window, so that several turns fit before the next one; between two compactions a
    /// conversation's request only grows at its end, and the upstream's prompt cache hits.
    pub low_water: f64,
    /// Past this share of the window, the compaction the threshold will call for is
    /// prepared in the background, so that the turn that crosses the threshold does not
    /// wait for the summariser. At or above `threshold`, nothing is prepared.
    pub prepare_at: f64,
    /// An event that must rewrite the request (and so break the upstream's prompt cache
    /// for what follows the change) takes it at least this share of the window below
    /// where it was, so that each break is worth many turns.
    pub clear_at_least: f64,
    /// Preparations running at once; 0 turns preparation off.
    pub prepare_concurrency: usize,
    /// Upstream calls allowed for one chat request, the first included.
    pub max_attempts: u32,
    /// Completion budget assumed when a request sets neither `max_completion_tokens`
    /// nor `max_tokens` (at most a quarter of the window is reserved).
    pub output_reserve_tokens: u64,
    /// How long a streamed answer's status line may be held back while waiting for its
    /// first event, which is where some servers report an overflow. Past it, the
    /// stream is passed on as it is.
    pub first_event_timeout_ms: u64,
    /// Who answers Codex's remote compaction requests (`POST .../responses/compact`, and
    /// a Responses request ending in a `compaction_trigger` item).
    pub remote_compaction: RemoteCompaction,
    /// Economy mode: old tool outputs are shortened on every request, not only near the
    /// window (see [`crate::engine::economy`]). A request's `x-compaction-economy: on|off`
    /// header overrides it.
    pub economy: bool,
    /// Turns a tool output stays whole at least, in economy mode.
    pub economy_age: usize,
    /// Tokens of old outputs economy shortens together: each batch changes the request
    /// once, costing one prompt-cache miss from where it starts.
    pub economy_batch_tokens: usize,
}

/// See [`CompactionConfig::remote_compaction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteCompaction {
    /// The upstream, unless it answers that it does not know them: then the proxy, for
    /// that request and every later one.
    #[default]
    Auto,
    /// Always the proxy, without asking the upstream.
    Proxy,
    /// Always the upstream, whatever it answers.
    Upstream,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            threshold: 0.9,
            low_water: 0.6,
            prepare_at: 0.75,
            clear_at_least: 0.2,
            prepare_concurrency: 2,
            max_attempts: 3,
            output_reserve_tokens: 4096,
            first_event_timeout_ms: 30_000,
            remote_compaction: RemoteCompaction::Auto,
            economy: false,
            economy_age: 4,
            economy_batch_tokens: 16_000,
        }
    }
}

/// Values given on the command line; each one present replaces the file's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub log_format: Option<LogFormat>,
}

impl Config {
    /// Reads the config (the named file, else `./proxy.toml` if present, else defaults),
    /// applies the overrides and validates the result.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => Self::from_file(path)?,
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                Self::from_file(Path::new(DEFAULT_CONFIG_FILE))?
            }
            None => Self::default(),
        };
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML text; the error message names the offending key.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())
    }

    fn apply(&mut self, overrides: &Overrides) {
        if let Some(listen) = &overrides.listen {
            self.listen.clone_from(listen);
        }
        if let Some(upstream) = &overrides.upstream {
            self.upstream.base_url.clone_from(upstream);
        }
        if let Some(format) = overrides.log_format {
            self.log.format = format;
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        if !self.telemetry.otlp_endpoint.is_empty()
            && OtlpEndpoint::parse(&self.telemetry.otlp_endpoint).is_none()
        {
            return Err(ConfigError::Invalid(format!(
                "telemetry.otlp_endpoint: {:?} is not an http:// OTLP endpoint like http://127.0.0.1:4318",
                self.telemetry.otlp_endpoint
            )));
        }
        validate_base_url("upstream.base_url", &self.upstream.base_url)?;
        if !self.summarizer.base_url.is_empty() {
            validate_base_url("summarizer.base_url", &self.summarizer.base_url)?;
        }
        if self.upstream.connect_timeout_ms == 0 || self.upstream.idle_timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "upstream.connect_timeout_ms and upstream.idle_timeout_ms must be above 0".into(),
            ));
        }
        if self.summarizer.timeout_ms == 0 || self.summarizer.context_window == Some(0) {
            return Err(ConfigError::Invalid(
                "summarizer.timeout_ms and summarizer.context_window must be above 0".into(),
            ));
        }
        if self.cache.max_bytes == 0 || self.cache.ttl_ms == 0 || self.cache.timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "cache.max_bytes, cache.ttl_ms and cache.timeout_ms must be above 0 (set cache.enabled = false to turn the cache off)".into(),
            ));
        }
        if self.cache.enabled
            && self.cache.backend == CacheBackend::Redis
            && self.cache.redis_url.is_empty()
        {
            return Err(ConfigError::Invalid(
                "cache.redis_url must be set when cache.backend = \"redis\"".into(),
            ));
        }
        if !self.cache.redis_ca_file.is_empty() && !self.cache.redis_url.starts_with("rediss://") {
            return Err(ConfigError::Invalid(
                "cache.redis_ca_file is only used with a rediss:// cache.redis_url".into(),
            ));
        }
        if self.limits.max_body_bytes == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_body_bytes must be above 0".into(),
            ));
        }
        if self.limits.max_buffered_bytes < self.limits.max_body_bytes {
            return Err(ConfigError::Invalid(format!(
                "limits.max_buffered_bytes ({}) must be at least limits.max_body_bytes ({}), or no body that large could be read",
                self.limits.max_buffered_bytes, self.limits.max_body_bytes
            )));
        }
        let server = &self.server;
        if server.body_read_timeout_ms == 0
            || server.keep_alive_timeout_ms == 0
            || server.max_connections == 0
        {
            return Err(ConfigError::Invalid(
                "server.body_read_timeout_ms, server.keep_alive_timeout_ms and server.max_connections must be above 0".into(),
            ));
        }
        self.validate_compaction()?;
        for rule in &self.models {
            if rule.pattern.is_empty() || rule.context_window == 0 {
                return Err(ConfigError::Invalid(format!(
                    "models: each entry needs a non-empty `match` and a `context_window` above 0 (got match = {:?}, context_window = {})",
                    rule.pattern, rule.context_window
                )));
            }
        }
        self.validate_auth()
    }

    /// The `[compaction]` table: its fractions in order, its counts above 0.
    fn validate_compaction(&self) -> Result<(), ConfigError> {
        let compaction = &self.compaction;
        if !(compaction.threshold > 0.0 && compaction.threshold <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "compaction.threshold must be above 0 and at most 1 (got {})",
                compaction.threshold
            )));
        }
        if !(compaction.low_water > 0.0 && compaction.low_water <= compaction.threshold) {
            return Err(ConfigError::Invalid(format!(
                "compaction.low_water must be above 0 and at most compaction.threshold (got {})",
                compaction.low_water
            )));
        }
        if !(0.0..compaction.threshold).contains(&compaction.clear_at_least) {
            return Err(ConfigError::Invalid(format!(
                "compaction.clear_at_least must be at least 0 and below compaction.threshold (got {})",
                compaction.clear_at_least
            )));
        }
        if !(compaction.prepare_at > 0.0 && compaction.prepare_at <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "compaction.prepare_at must be above 0 and at most 1 (got {})",
                compaction.prepare_at
            )));
        }
        if compaction.economy_age == 0 {
            return Err(ConfigError::Invalid(
                "compaction.economy_age must be at least 1: the latest turn is never shortened"
                    .into(),
            ));
        }
        if compaction.max_attempts == 0 {
            return Err(ConfigError::Invalid(
                "compaction.max_attempts must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn validate_auth(&self) -> Result<(), ConfigError> {
        let injects_key = self.upstream.api_key_env.is_some();
        let has_client_keys = !self.auth.keys.is_empty() || self.auth.keys_env.is_some();
        if injects_key && !has_client_keys && !self.auth.allow_unauthenticated {
            return Err(ConfigError::Invalid(
                "upstream.api_key_env is set but no client keys are configured (auth.keys or auth.keys_env): \
                 anyone reaching the proxy could spend the upstream key. Configure client keys, or set \
                 auth.allow_unauthenticated = true if only trusted processes can reach it"
                    .into(),
            ));
        }
        // The clients' credentials are then the proxy's own keys: sending them to another
        // server would leak them and authenticate nothing.
        if injects_key
            && !self.summarizer.base_url.is_empty()
            && self.summarizer.api_key_env.is_none()
        {
            return Err(ConfigError::Invalid(
                "summarizer.base_url is set with upstream.api_key_env: set summarizer.api_key_env too, \
                 as the clients' credentials are this proxy's keys"
                    .into(),
            ));
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "listen: {:?} is not an address like 127.0.0.1:8080",
                self.listen
            ))
        })
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.connect_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.idle_timeout_ms)
    }

    pub fn pool_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.pool_idle_timeout_ms)
    }

    pub fn first_event_timeout(&self) -> Duration {
        Duration::from_millis(self.compaction.first_event_timeout_ms)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.server.shutdown_grace_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.server.body_read_timeout_ms)
    }

    pub fn keep_alive_timeout(&self) -> Duration {
        Duration::from_millis(self.server.keep_alive_timeout_ms)
    }

    /// `server.worker_threads` resolved: 0 becomes the CPUs this process may run on
    /// (its affinity mask, so a proxy pinned with `taskset -c 0` counts one).
    pub fn worker_threads(&self) -> usize {
        match self.server.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }

    /// The memory trimmer's tick; `None` when it is off.
    pub fn memory_trim_interval(&self) -> Option<Duration> {
        let ms = self.server.memory_trim_interval_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// The effective settings as TOML, for `check`. Client keys are never printed.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render settings: {e}\n"))
    }
}

fn validate_base_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let ok = match url.parse::<http::Uri>() {
        Ok(uri) => {
            matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some()
                && uri.query().is_none()
        }
        Err(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{key}: {url:?} is not an http(s) base URL like https://api.openai.com/v1"
        )))
    }
}

/// Where spans go: an OTLP/HTTP receiver's address and the traces path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// `host:port`.
    pub authority: String,
    /// `{path}/v1/traces`.
    pub path: String,
}

impl OtlpEndpoint {
    /// `http://host[:port][/base]`, the OTLP base endpoint; `None` when it is not one.
    pub fn parse(url: &str) -> Option<Self> {
        let uri = url.parse::<http::Uri>().ok()?;
        if uri.scheme_str() != Some("http") || uri.query().is_some() {
            return None;
        }
        let authority = uri.authority()?;
        let port = authority.port_u16().unwrap_or(80);
        let base = uri.path().trim_end_matches('/');
        Some(Self {
            authority: format!("{}:{port}", authority.host()),
            path: format!("{base}/v1/traces"),
        })
    }

    /// `http://host:port`, where the exports go.
    pub fn origin(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// The configured endpoint, else `OTEL_EXPORTER_OTLP_ENDPOINT`; `Ok(None)` when
    /// neither is set (traces off).
    pub fn from_settings(configured: &str) -> Result<Option<Self>, String> {
        let (key, url) = if configured.is_empty() {
            match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Ok(v) if !v.trim().is_empty() => ("OTEL_EXPORTER_OTLP_ENDPOINT", v),
                _ => return Ok(None),
            }
        } else {
            ("telemetry.otlp_endpoint", configured.to_owned())
        };
        Self::parse(url.trim()).map(Some).ok_or_else(|| {
            format!("{key}: {url:?} is not an http:// OTLP endpoint like http://127.0.0.1:4318")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_may_cap_its_media_per_request() {
        let config = Config::from_toml(
            "[[models]]\nmatch = \"v*\"\ncontext_window = 8000\nmax_media = 10\n",
        )
        .unwrap();
        assert_eq!(config.models[0].max_media, Some(10));
        let windows = crate::windows::ModelWindows::new(config.models);
        let up = "http://h/v1";
        assert_eq!(windows.media_cap(up, "vision"), Some(10));
        assert_eq!(windows.media_cap(up, "other"), None);
        // A refusal's number serves where nothing is configured.
        windows.learn_media_cap(up, "other", 5);
        windows.learn_media_cap(up, "vision", 5);
        assert_eq!(windows.media_cap(up, "other"), Some(5));
        assert_eq!(windows.media_cap(up, "vision"), Some(10));
        assert_eq!(windows.message_cap(up, "vision"), None);
        windows.learn_message_cap(up, "vision", 50);
        assert_eq!(windows.message_cap(up, "vision"), Some(50));
    }

    #[test]
    fn endpoints() {
        let e = OtlpEndpoint::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(e.authority, "127.0.0.1:4318");
        assert_eq!(e.path, "/v1/traces");
        let e = OtlpEndpoint::parse("http://collector/otlp/").unwrap();
        assert_eq!(e.authority, "collector:80");
        assert_eq!(e.path, "/otlp/v1/traces");
        assert!(OtlpEndpoint::parse("https://collector:4318").is_none());
        assert!(OtlpEndpoint::parse("collector:4318").is_none());
    }

    #[test]
    fn empty_file_gives_contract_defaults() {
        let config = Config::from_toml("").unwrap();
        assert_eq!(config.listen, "127.0.0.1:8080");
        assert_eq!(config.upstream.base_url, "https://api.openai.com/v1");
        assert!(config.validate().is_ok());
    }

    #[test]
    fn the_responses_websocket_mode_is_read_by_name() {
        let read = |mode: &str| {
            Config::from_toml(&format!("[upstream]\nresponses_websocket = \"{mode}\"\n"))
                .map(|c| c.upstream.responses_websocket)
        };
        assert_eq!(
            Config::from_toml("").unwrap().upstream.responses_websocket,
            ResponsesWebsocket::Auto
        );
        assert_eq!(read("relay").unwrap(), ResponsesWebsocket::Relay);
        assert_eq!(read("bridge").unwrap(), ResponsesWebsocket::Bridge);
        let err = read("tunnel").unwrap_err();
        assert!(
            err.contains("responses_websocket") || err.contains("tunnel"),
            "{err}"
        );
    }

    #[test]
    fn unknown_top_level_key_is_named() {
        let err = Config::from_toml("listne = \"127.0.0.1:1\"\n").unwrap_err();
        assert!(err.contains("listne"), "{err}");
    }

    #[test]
    fn unknown_nested_key_is_named() {
        let err = Config::from_toml("[upstream]\nbase_ulr = \"http://x\"\n").unwrap_err();
        assert!(err.contains("base_ulr"), "{err}");
        let err = Config::from_toml("[[models]]\nmatch = \"a*\"\ncontext_window = 1\nwindow = 2\n")
            .unwrap_err();
        assert!(err.contains("window"), "{err}");
    }

    #[test]
    fn flags_override_the_file() {
        let mut config = Config::from_toml("listen = \"127.0.0.1:1\"\n").unwrap();
        config.apply(&Overrides {
            listen: Some("127.0.0.1:2".into()),
            upstream: Some("http://u:9/v1".into()),
            log_format: Some(LogFormat::Json),
        });
        assert_eq!(config.listen, "127.0.0.1:2");
        assert_eq!(config.upstream.base_url, "http://u:9/v1");
        assert_eq!(config.log.format, LogFormat::Json);
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut config = Config::default();
        config.upstream.base_url = "ftp://x".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("upstream.base_url"), "{err}");

        let config = Config {
            listen: "localhost".into(),
            ..Config::default()
        };
        assert!(config
            .validate()
            .unwrap_err()
            .to_string()
            .contains("listen"));
    }

    #[test]
    fn summarizer_defaults_and_bad_values() {
        let config = Config::from_toml("[summarizer]\nmodel = \"m\"\n").unwrap();
        assert!(config.summarizer.enabled);
        assert_eq!(config.summarizer.timeout_ms, 60_000);
        assert_eq!(config.summarizer.context_window, None);
        let err = Config::from_toml("[summarizer]\ntimeout = 1\n").unwrap_err();
        assert!(err.contains("timeout"), "{err}");
        let config = Config::from_toml("[summarizer]\ncontext_window = 0\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("summarizer.context_window"), "{err}");
    }

    #[test]
    fn client_bounds_default_like_nginx_and_must_be_usable() {
        let config = Config::default();
        assert_eq!(config.server.body_read_timeout_ms, 60_000);
        assert!(config.limits.max_buffered_bytes >= config.limits.max_body_bytes);
        let config =
            Config::from_toml("[limits]\nmax_body_bytes = 2000\nmax_buffered_bytes = 1000\n")
                .unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("limits.max_buffered_bytes"), "{err}");
        let config = Config::from_toml("[server]\nmax_connections = 0\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("server.max_connections"), "{err}");
    }

    #[test]
    fn worker_threads_default_to_the_cpus_the_process_may_use() {
        let config = Config::default();
        assert_eq!(config.server.worker_threads, 0);
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(config.worker_threads(), cpus);
        let config = Config::from_toml("[server]\nworker_threads = 3\n").unwrap();
        assert_eq!(config.worker_threads(), 3);
    }

    #[test]
    fn injected_key_requires_client_keys() {
        let mut config = Config::default();
        config.upstream.api_key_env = Some("UPSTREAM_KEY".into());
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("auth"), "{err}");
        config.auth.keys_env = Some("CLIENT_KEYS".into());
        assert!(config.validate().is_ok());
        config.summarizer.base_url = "http://summariser:8000/v1".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("summarizer.api_key_env"), "{err}");
        config.summarizer.api_key_env = Some("SUMMARIZER_KEY".into());
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_redis_cache_names_what_it_lacks() {
        let mut config = Config::default();
        config.cache.backend = CacheBackend::Redis;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("cache.redis_url must be set"), "{err}");
        config.cache.redis_url = "redis://redis:6379".into();
        config.cache.redis_ca_file = "/etc/redis/ca.pem".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("cache.redis_ca_file"), "{err}");
        config.cache.redis_url = "rediss://redis:6380".into();
        assert!(config.validate().is_ok());
    }

    #[test]
    fn client_keys_are_not_printed() {
        let mut config = Config::default();
        config.auth.keys = vec!["sk-very-secret".into()];
        assert!(!config.to_toml().contains("sk-very-secret"));
    }

    #[test]
    fn example_config_is_valid() {
        let text = include_str!("../proxy.toml");
        let config = Config::from_toml(text).unwrap();
        assert!(config.validate().is_ok());
    }
}
