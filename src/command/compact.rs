//! `compaction-proxy compact`: the [`Compactor`] on a request body from a file or stdin, in
//! any of the three dialects (read and written through their adapters), with the
//! deterministic summary and no network, unless `--summarize-via` names an
//! OpenAI-compatible API to write the summary with.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;

use crate::checkpoint::Partition;
use crate::compactor::{Base, Caller, Compaction, Compactor, Declined, Limits, Order};
use crate::config::Config;
use crate::dialect::Dialect;
use crate::engine::economy::{economize_request, EconomyOptions};
use crate::engine::{budget, Options};
use crate::metrics::Metrics;
use crate::summarize::Summarizer;
use crate::units::{Window, DEFAULT_WINDOW};
use crate::windows::{self, ModelWindows};

/// Exit status when the result fits the target.
const FITS: u8 = 0;
/// Exit status for unreadable or malformed input (nothing is written to stdout).
const BAD_INPUT: u8 = 2;
/// Exit status when no compaction could reach the target (the best effort is written).
const DOES_NOT_FIT: u8 = 3;

#[derive(clap::Args, Debug, Clone)]
#[command(
    about = "Compact a chat-completions, Responses API or Anthropic Messages request body offline",
    long_about = "Reads a request body of chat completions, the Responses API (an input array of \
items) or Anthropic's Messages API (told apart by their fields, or named with --api), from FILE, \
or stdin when FILE is absent or -, and writes the compacted body, in the same API, to stdout and a one-line report to stderr. The summary is the \
deterministic digest and nothing goes over the network, unless --summarize-via names an \
OpenAI-compatible API (base URL) to write it: then the middle is summarised by --model (default: \
the request's model) with the key in --api-key-env, falling back to the digest on any failure. \
A body that already fits is written back byte for byte.\n\nThe token target is the context window minus the completion budget (the request's \
max_completion_tokens or max_tokens, else 4096, capped at a quarter of the window, as the proxy \
does) minus a 2% margin. To keep the turn in progress whole the answer may get less room, down to \
1024 tokens; a completion cap that would then overflow the window is lowered in the output.\n\nExit status: 0 the result fits, 3 it cannot be made to fit (the best effort \
is still written), 2 bad input (nothing on stdout)."
)]
pub struct CompactArgs {
    /// Model whose tokenizer and default context window apply [default: the request's "model"]
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Context window in tokens [default: the proxy's built-in table by model name, else 128000]
    #[arg(long, value_name = "N", long_help = context_window_help())]
    pub context_window: Option<usize>,
    /// Base URL of an OpenAI-compatible API to write the summary with, e.g. https://api.openai.com/v1
    #[arg(long, value_name = "URL")]
    pub summarize_via: Option<String>,
    /// Environment variable holding the key for --summarize-via (used only when set)
    #[arg(long, value_name = "NAME", default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// The body's API [default: told from its fields: `input` items are the Responses API;
    /// a top-level `system` or Anthropic content blocks are Messages; else chat]
    #[arg(long, value_enum, value_name = "API")]
    pub api: Option<Api>,
    /// Shorten old tool outputs first, as economy mode does (`compaction.economy`), with its
    /// default age and batch
    #[arg(long)]
    pub economy: bool,
    /// Request body to read; stdin when absent or "-"
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// The APIs whose bodies the command reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Responses,
    Messages,
}

impl Api {
    fn dialect(self) -> Dialect {
        match self {
            Api::Chat => Dialect::Chat,
            Api::Responses => Dialect::Responses,
            Api::Messages => Dialect::Messages,
        }
    }
}

/// Content blocks only Anthropic's Messages API has.
const MESSAGES_BLOCKS: [&str; 4] = ["tool_use", "tool_result", "thinking", "redacted_thinking"];

/// The dialect a body speaks, told from its fields: an `input` array without `messages` is
/// the Responses API; `messages` beside a top-level `system`, or holding Anthropic's own
/// content blocks, is Messages; anything else is read as chat (whose errors then name
/// what is missing).
fn detect(body: &Value) -> Dialect {
    if body.get("messages").is_none() && body.get("input").is_some_and(Value::is_array) {
        return Dialect::Responses;
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Dialect::Chat;
    };
    let anthropic_block = |part: &Value| {
        part.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| MESSAGES_BLOCKS.contains(&t))
    };
    let blocks = messages.iter().any(|m| {
        m.get("content")
            .and_then(Value::as_array)
            .is_some_and(|parts| parts.iter().any(anthropic_block))
    });
    if body.get("system").is_some() || blocks {
        Dialect::Messages
    } else {
        Dialect::Chat
    }
}

fn context_window_help() -> String {
    format!(
        "Context window in tokens (prompt plus completion). Default: the window the proxy's \
         built-in table gives the model (OpenAI, Anthropic, Gemini, Llama, Qwen, DeepSeek and \
         Mistral families, e.g. gpt-4o = {}), else {}.",
        windows::builtin_window("gpt-4o").unwrap_or(0),
        DEFAULT_WINDOW.0
    )
}

/// The same table the proxy's preflight uses, so offline and online agree.
fn default_window(model: &str) -> Window {
    windows::builtin_window(model).map_or(DEFAULT_WINDOW, Window)
}

pub fn run(args: &CompactArgs) -> ExitCode {
    let input = match read_input(args) {
        Ok(bytes) => bytes,
        Err(msg) => return fail(&msg),
    };
    let body: Value = match serde_json::from_slice(&input) {
        Ok(v) => v,
        Err(e) => return fail(&format!("request body is not valid JSON: {e}")),
    };
    let dialect = args.api.map_or_else(|| detect(&body), Api::dialect);
    // The engine's chat view of the body, and the body itself to write the view back
    // into (for the dialects that are not chat).
    let (view, source) = match dialect {
        Dialect::Chat => (body, None),
        _ => match dialect.view(&input) {
            Some(read) => read,
            None => {
                return fail(&format!(
                    "not a {} request the proxy can read",
                    dialect.as_str()
                ))
            }
        },
    };
    let mut view = view;
    let economized =
        args.economy && economize_request(&mut view, &EconomyOptions::default()).is_some();
    let model = args
        .model
        .clone()
        .or_else(|| view.get("model").and_then(Value::as_str).map(str::to_owned));
    let window = args.context_window.map_or_else(
        || default_window(model.as_deref().unwrap_or("")),
        |w| Window(w as u64),
    );
    let options = Options {
        model,
        ..Options::with_window(window.usize())
    };
    let compaction = match compact(args, view.clone(), options, window) {
        Ok(compaction) => compaction,
        Err(e) => return fail(&e),
    };
    let report = &compaction.report;
    // The proxy's rule for the answer's room: a completion cap that would overflow the
    // window beside the prompt is lowered to what fits.
    let mut rewritten = compaction
        .view
        .clone()
        .or_else(|| economized.then(|| view.clone()));
    let mut capped = rewritten.clone().unwrap_or(view);
    let lowered = budget::fit_output(&mut capped, window.0, report.tokens_after as u64);
    if lowered.is_some() {
        rewritten = Some(capped);
    }
    let written = match rewritten.and_then(|view| dialect.encode(&view, source.as_ref())) {
        None => write_stdout(&input),
        Some(mut bytes) => {
            bytes.push(b'\n');
            write_stdout(&bytes)
        }
    };
    if let Err(e) = written {
        eprintln!("compaction-proxy compact: cannot write to stdout: {e}");
        return ExitCode::FAILURE;
    }
    match lowered {
        Some((before, after)) => eprintln!(
            "compaction-proxy compact: {report}; completion cap lowered {before} -> {after}"
        ),
        None => eprintln!("compaction-proxy compact: {report}"),
    }
    ExitCode::from(if report.fits { FITS } else { DOES_NOT_FIT })
}

/// The compactor on `view`, with the summariser `--summarize-via` names (the digest when
/// it fails, or when there is none).
fn compact(
    args: &CompactArgs,
    view: Value,
    options: Options,
    window: Window,
) -> Result<Compaction, String> {
    let summarizer = match &args.summarize_via {
        Some(url) => summariser(url, args)?,
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let (metrics, windows) = (Metrics::default(), ModelWindows::default());
    let compactor = Compactor {
        summarizer: summarizer.as_ref(),
        checkpoints: None,
        metrics: &metrics,
        windows: &windows,
    };
    // The summariser is asked as an OpenAI-compatible chat API, with no credentials but
    // its own key.
    let (parts, ()) = http::Request::post("/v1/chat/completions")
        .body(())
        .map_err(|e| e.to_string())?
        .into_parts();
    let model = view
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let partition = Partition::new(&parts.headers, "", &model);
    let caller = Caller::new(&parts, &model, Dialect::Chat, 0, partition);
    let base = Base {
        view,
        source: None,
        counts: None,
        tokens: None,
    };
    let order = Order {
        limits: Limits::deep(options),
        window: Some(window),
        summariser: Some(&caller),
        original: None,
        waited_for: true,
        keys: None,
    };
    let (_, result) = runtime.block_on(compactor.compact(base, order));
    result.map_err(|e| match e {
        // The engine's own words name what the body lacks.
        Declined::Engine(e) => e.to_string(),
        e => e.to_string(),
    })
}

/// The summariser at `url`, with the key in `--api-key-env` when it is set.
fn summariser(url: &str, args: &CompactArgs) -> Result<Option<Summarizer>, String> {
    let mut config = Config::default();
    config.summarizer.base_url = url.to_owned();
    config.summarizer.model = args.model.clone().unwrap_or_default();
    if std::env::var_os(&args.api_key_env).is_some() {
        config.summarizer.api_key_env = Some(args.api_key_env.clone());
    }
    config
        .validate()
        .map_err(|e| format!("--summarize-via: {e}"))?;
    Summarizer::new(&config).map_err(|e| e.to_string())
}

fn read_input(args: &CompactArgs) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    match &args.file {
        Some(path) if path.as_os_str() != "-" => {
            bytes =
                std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        }
        _ => {
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| format!("cannot read stdin: {e}"))?;
        }
    }
    Ok(bytes)
}

fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("compaction-proxy compact: bad input: {msg}");
    ExitCode::from(BAD_INPUT)
}
