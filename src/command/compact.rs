//! `compaction-proxy compact`: the engine on a request body from a file or stdin, with the
//! deterministic summary and no network, unless `--summarize-via` names an
//! OpenAI-compatible API to write the summary with.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::Config;
use crate::dialect::{responses, Dialect};
use crate::engine::{self, budget, Options, Outcome, DEFAULT_CONTEXT_WINDOW};
use crate::metrics::Metrics;
use crate::summarize::{Call, Middle, Shared, Summarizer};
use crate::windows::{self, ModelWindows};

/// Exit status when the result fits the target.
const FITS: u8 = 0;
/// Exit status for unreadable or malformed input (nothing is written to stdout).
const BAD_INPUT: u8 = 2;
/// Exit status when no compaction could reach the target (the best effort is written).
const DOES_NOT_FIT: u8 = 3;

#[derive(clap::Args, Debug, Clone)]
#[command(
    about = "Compact a chat-completions or Responses API request body offline",
    long_about = "Reads a chat-completions request body, or a Responses API one (an input array of \
items; written back as items), from FILE, or stdin when FILE is absent or -, and \
writes the compacted body to stdout and a one-line report to stderr. The summary is the \
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
    /// Request body to read; stdin when absent or "-"
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
}

fn context_window_help() -> String {
    format!(
        "Context window in tokens (prompt plus completion). Default: the window the proxy's \
         built-in table gives the model (OpenAI, Anthropic, Gemini, Llama, Qwen, DeepSeek and \
         Mistral families, e.g. gpt-4o = {}), else {}.",
        windows::builtin_window("gpt-4o").unwrap_or(0),
        DEFAULT_CONTEXT_WINDOW
    )
}

/// The same table the proxy's preflight uses, so offline and online agree.
fn default_window(model: &str) -> usize {
    windows::builtin_window(model)
        .and_then(|w| usize::try_from(w).ok())
        .unwrap_or(DEFAULT_CONTEXT_WINDOW)
}

pub fn run(args: &CompactArgs) -> ExitCode {
    let input = match read_input(args) {
        Ok(bytes) => bytes,
        Err(msg) => return fail(&msg),
    };
    let body: serde_json::Value = match serde_json::from_slice(&input) {
        Ok(v) => v,
        Err(e) => return fail(&format!("request body is not valid JSON: {e}")),
    };
    // A Responses API body (an `input` array, no `messages`) is compacted through its
    // chat view and written back as Responses items.
    let responses =
        body.get("messages").is_none() && body.get("input").is_some_and(|i| i.is_array());
    let request = if responses {
        match responses::to_chat(&body) {
            Some(view) => view,
            None => return fail("\"input\" is not an array of items"),
        }
    } else {
        body.clone()
    };
    let model = args.model.clone().or_else(|| {
        request
            .get("model")
            .and_then(|m| m.as_str())
            .map(str::to_string)
    });
    let window = args
        .context_window
        .unwrap_or_else(|| default_window(model.as_deref().unwrap_or("")));
    let opts = Options {
        model,
        ..Options::with_window(window)
    };
    let compacted = match &args.summarize_via {
        Some(url) => compact_via(url, args, &request, &opts),
        None => engine::compact(&request, &opts).map_err(|e| e.to_string()),
    };
    let outcome = match compacted {
        Ok(o) => o,
        Err(e) => return fail(&e),
    };
    // The proxy's rule for the answer's room: a completion cap that would overflow the
    // window beside the prompt is lowered to what fits.
    let mut rewritten = outcome.rewritten.clone();
    let mut capped = rewritten.clone().unwrap_or_else(|| request.clone());
    let lowered = budget::fit_output(
        &mut capped,
        window as u64,
        outcome.report.tokens_after as u64,
    );
    if lowered.is_some() {
        rewritten = Some(capped);
    }
    if responses {
        rewritten = rewritten.map(|view| responses::from_chat(&view, &body));
    }
    let written = match &rewritten {
        None => write_stdout(&input),
        Some(body) => serde_json::to_vec(body)
            .map_err(std::io::Error::other)
            .and_then(|mut bytes| {
                bytes.push(b'\n');
                write_stdout(&bytes)
            }),
    };
    if let Err(e) = written {
        eprintln!("compaction-proxy compact: cannot write to stdout: {e}");
        return ExitCode::FAILURE;
    }
    match lowered {
        Some((before, after)) => eprintln!(
            "compaction-proxy compact: {}; completion cap lowered {before} -> {after}",
            outcome.report
        ),
        None => eprintln!("compaction-proxy compact: {}", outcome.report),
    }
    ExitCode::from(if outcome.report.fits {
        FITS
    } else {
        DOES_NOT_FIT
    })
}

/// The engine with an LLM summary from `url` (the deterministic one when it fails).
fn compact_via(
    url: &str,
    args: &CompactArgs,
    request: &serde_json::Value,
    opts: &Options,
) -> Result<Outcome, String> {
    let mut config = Config::default();
    config.summarizer.base_url = url.to_owned();
    config.summarizer.model = args.model.clone().unwrap_or_default();
    if std::env::var_os(&args.api_key_env).is_some() {
        config.summarizer.api_key_env = Some(args.api_key_env.clone());
    }
    config
        .validate()
        .map_err(|e| format!("--summarize-via: {e}"))?;
    let plan = engine::plan(request, opts).map_err(|e| e.to_string())?;
    if !plan.needs_summary() {
        return Ok(engine::finish(plan, None, opts));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the summariser's runtime: {e}"))?;
    let summary = runtime.block_on(async {
        let summarizer = Summarizer::new(&config).map_err(|e| e.to_string())?;
        let Some(summarizer) = summarizer else {
            return Ok(None);
        };
        let (parts, ()) = http::Request::post("/v1/chat/completions")
            .body(())
            .map_err(|e| e.to_string())?
            .into_parts();
        let model = request["model"].as_str().unwrap_or_default();
        let (metrics, models) = (Metrics::default(), ModelWindows::default());
        let shared = Shared {
            metrics: &metrics,
            models: &models,
        };
        let call = Call {
            parts: &parts,
            model,
            window: opts.context_window as u64,
            id: 0,
            dialect: Dialect::Chat,
        };
        Ok::<_, String>(
            summarizer
                .summarize(shared, &call, &Middle::of_plan(&plan, opts))
                .await,
        )
    })?;
    Ok(engine::finish(plan, summary, opts))
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
