//! Token numbers in error messages, read with small templates instead of regexes.
//!
//! A template is normalised text with slots: `{w}` window, `{p}` prompt (several `{p}` in one
//! template add up: messages + functions), `{pl}` prompt as a lower bound, `{c}` requested
//! completion, `{t}` requested total, `{o}` overshoot, `{l}` completion limit, `{*}` a short
//! gap. A space in a template matches zero or more spaces. Templates run most specific first
//! and the first one to fill a slot wins.

use super::Numbers;

/// How far a `{*}` gap may reach, in bytes.
const GAP: usize = 300;
/// Occurrences of a template's first word tried before giving up (bounds adversarial bodies).
const MAX_TRIES: usize = 32;

const TEMPLATES: &[&str] = &[
    // OpenAI, Azure, DeepSeek, vLLM and OpenRouter breakdowns.
    "you requested {t} tokens ({p} in the messages, {p} in the functions, and {c} in the completion)",
    "you requested {t} tokens ({p} in the messages, {c} in the completion)",
    "you requested {t} tokens ({p} in your prompt; {c} for the completion)",
    "you requested about {t} tokens ({p} of text input, {p} of tool input, {c} in the output)",
    "you requested about {t} tokens ({p} of text input, {c} in the output)",
    "you requested {c} output tokens and your prompt contains at least {pl} input tokens, for a total of at least {t} tokens",
    "you requested {t} tokens",
    "you requested about {t} tokens",
    "your messages resulted in {p} tokens",
    "your request has {p} input tokens",
    "you passed {p} input tokens and requested {c} output tokens",
    "maximum context length is {w} tokens",
    "context length is only {w} tokens",
    "configured limit of {w} tokens",
    // Anthropic.
    "prompt is too long: {p} tokens > {w} maximum",
    "exceed context limit: {p} + {c} > {w}",
    // Gemini.
    "input token count ({p}) exceeds the maximum number of tokens allowed ({w})",
    "maximum number of tokens allowed ({w})",
    "input token count is {p}",
    "model only supports up to {w}",
    // GitHub Copilot.
    "prompt token count of {p} exceeds the limit of {w}",
    // SGLang, Together.
    "input ({p} tokens) is longer than the model's context length ({w} tokens)",
    // TGI.
    "inputs tokens + max_new_tokens must be <= {w}. given: {p} inputs tokens and {c} max_new_tokens",
    "inputs must have less than {w} tokens. given: {p}",
    // llama.cpp, LM Studio.
    "request ({p} tokens) exceeds the available context size ({w} tokens)",
    "n_keep: {p} >= n_ctx: {w}",
    "n_keep ({p}) >= n_ctx ({w})",
    "keep the first {p} tokens{*}context length of only {w} tokens",
    // Ollama.
    "context length by {o} tokens",
    // xAI, Fireworks, Cerebras, Mistral, vLLM engine.
    "maximum prompt length is {w} but the request contains {p} tokens",
    "prompt is too long: {p}, model maximum context length: {w}",
    "current length is {p} while limit is {w}",
    "prompt contains {p} tokens{*}too large for model with {w} maximum context length",
    "too large for model with {w} maximum context length",
    "prompt (length {p}) is longer than the maximum model length of {w}",
    // Cohere.
    "cannot exceed {w} - received {p}",
    "size limit exceeded by {o} tokens",
    "limit for this model is {w} tokens",
    // Moonshot, DashScope, Volcengine.
    "token limit: {w} (requested: {p})",
    "exceeded model token limit: {w}",
    "range of input length should be [1, {w}]",
    "input length {p} exceeds the maximum length {w}",
    // LiteLLM pre-call check, Bedrock Mantle, ds4.
    "max input tokens={w}, got={p}",
    "prompt tokens ({p}) exceed model maximum ({w})",
    "prompt has {p} tokens, but the configured context size is {w} tokens",
    // SiliconFlow.
    "length of prompt_tokens ({p}) must be less than max_seq_len ({w})",
    // Completion caps.
    "max_completion_tokens' is too large: {c}",
    "max_tokens is too large: {c}",
    "supports at most {l} completion tokens",
    "max_tokens: {c} > {l}",
    "max_tokens must be less than or equal to {l}",
    "max tokens must be less than or equal to {l}",
    "range of max_tokens should be [1, {l}]",
    "maximum tokens you requested exceeds the model limit of {l}",
    "max_tokens ({c}) exceeds",
    "maximum output length of {l}",
    // Generic window statements.
    "context window of {w} tokens",
    "context window ({w} tokens)",
    "context length ({w} tokens)",
    "context length of {w} tokens",
    "context size of {w} tokens",
    "context window is {w} tokens",
    "context size is {w} tokens",
    "maximum of {w} tokens",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Window,
    Prompt,
    PromptAtLeast,
    Completion,
    Total,
    Over,
    CompletionLimit,
}

enum Piece<'a> {
    Lit(&'a str),
    Num(Slot),
    Gap,
}

/// Reads every number the templates recognise in normalised text.
pub(super) fn extract(text: &str) -> Numbers {
    let mut numbers = Numbers::default();
    for template in TEMPLATES {
        let pieces = parse(template);
        if let Some(caps) = find(text, &pieces) {
            apply(&mut numbers, &caps);
        }
    }
    numbers
}

fn parse(template: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map_or(rest.len(), |i| open + i);
        if open > 0 {
            pieces.push(Piece::Lit(&rest[..open]));
        }
        pieces.push(match rest.get(open + 1..close).unwrap_or("") {
            "w" => Piece::Num(Slot::Window),
            "p" => Piece::Num(Slot::Prompt),
            "pl" => Piece::Num(Slot::PromptAtLeast),
            "c" => Piece::Num(Slot::Completion),
            "t" => Piece::Num(Slot::Total),
            "o" => Piece::Num(Slot::Over),
            "l" => Piece::Num(Slot::CompletionLimit),
            _ => Piece::Gap,
        });
        rest = rest.get(close + 1..).unwrap_or("");
    }
    if !rest.is_empty() {
        pieces.push(Piece::Lit(rest));
    }
    pieces
}

fn find(text: &str, pieces: &[Piece<'_>]) -> Option<Vec<(Slot, u64)>> {
    let Some(Piece::Lit(first)) = pieces.first() else {
        return None;
    };
    text.match_indices(first)
        .take(MAX_TRIES)
        .find_map(|(at, _)| match_from(text, at, pieces))
}

fn match_from(text: &str, mut pos: usize, pieces: &[Piece<'_>]) -> Option<Vec<(Slot, u64)>> {
    let bytes = text.as_bytes();
    let mut caps = Vec::new();
    let mut gap = false;
    for piece in pieces {
        match piece {
            Piece::Lit(lit) if gap => {
                let head = lit.trim_start();
                let found = text.get(pos..)?.find(head).filter(|&i| i <= GAP)?;
                pos = match_lit(bytes, pos + found, head.as_bytes())?;
                gap = false;
            }
            Piece::Lit(lit) => pos = match_lit(bytes, pos, lit.as_bytes())?,
            Piece::Num(slot) => {
                let (value, end) = number(bytes, skip_spaces(bytes, pos))?;
                caps.push((*slot, value));
                pos = end;
            }
            Piece::Gap => gap = true,
        }
    }
    Some(caps)
}

/// Matches a literal at `pos`, a space in the literal standing for any run of spaces.
fn match_lit(text: &[u8], mut pos: usize, lit: &[u8]) -> Option<usize> {
    for &b in lit {
        if b == b' ' {
            pos = skip_spaces(text, pos);
        } else if text.get(pos) == Some(&b) {
            pos += 1;
        } else {
            return None;
        }
    }
    Some(pos)
}

fn skip_spaces(text: &[u8], mut pos: usize) -> usize {
    while text.get(pos) == Some(&b' ') {
        pos += 1;
    }
    pos
}

/// Parses digits at `pos`, accepting thousands separators (`1,048,576`) but not a list
/// separator (`40177, model`).
fn number(text: &[u8], mut pos: usize) -> Option<(u64, usize)> {
    let start = pos;
    let mut value: u64 = 0;
    while let Some(&b) = text.get(pos) {
        if b.is_ascii_digit() {
            value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            pos += 1;
        } else if (b == b',' || b == b'_') && pos > start && is_group(text, pos + 1) {
            pos += 1;
        } else {
            break;
        }
    }
    (pos > start).then_some((value, pos))
}

fn is_group(text: &[u8], at: usize) -> bool {
    let digit = |i: usize| text.get(i).is_some_and(u8::is_ascii_digit);
    (at..at + 3).all(digit) && !digit(at + 3)
}

fn apply(numbers: &mut Numbers, caps: &[(Slot, u64)]) {
    let sum = |want: Slot| -> Option<u64> {
        caps.iter()
            .filter(|(slot, _)| *slot == want)
            .map(|&(_, v)| v)
            .reduce(u64::saturating_add)
    };
    fill(&mut numbers.context_window, sum(Slot::Window));
    fill(&mut numbers.completion_tokens, sum(Slot::Completion));
    fill(&mut numbers.requested_total, sum(Slot::Total));
    fill(&mut numbers.overflow_by, sum(Slot::Over));
    fill(&mut numbers.completion_limit, sum(Slot::CompletionLimit));
    if numbers.prompt_tokens.is_none() {
        if let Some(p) = sum(Slot::Prompt) {
            numbers.prompt_tokens = Some(p);
        } else if let Some(p) = sum(Slot::PromptAtLeast) {
            numbers.prompt_tokens = Some(p);
            numbers.prompt_is_lower_bound = true;
        }
    }
}

fn fill(slot: &mut Option<u64>, value: Option<u64>) {
    if slot.is_none() {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::super::text::normalize;
    use super::*;

    fn read(msg: &str) -> Numbers {
        extract(&normalize(msg))
    }

    #[test]
    fn openai_breakdown_with_functions() {
        let n = read(
            "This model's maximum context length is 8192 tokens. However, you requested 8213 \
             tokens (6683 in the messages, 730 in the functions, and 800 in the completion).",
        );
        assert_eq!(n.context_window, Some(8192));
        assert_eq!(n.requested_total, Some(8213));
        assert_eq!(n.prompt_tokens, Some(7413));
        assert_eq!(n.completion_tokens, Some(800));
    }

    #[test]
    fn thousands_separators_and_lists() {
        let n = read("The prompt is too long: 40177, model maximum context length: 32767");
        assert_eq!(
            (n.prompt_tokens, n.context_window),
            (Some(40177), Some(32767))
        );
        let n = read("maximum context length is 1,048,576 tokens");
        assert_eq!(n.context_window, Some(1_048_576));
    }

    #[test]
    fn lower_bound_and_gaps() {
        let n = read(
            "you requested 1 output tokens and your prompt contains at least 4096 input tokens, \
             for a total of at least 4097 tokens",
        );
        assert_eq!(n.prompt_tokens, Some(4096));
        assert!(n.prompt_is_lower_bound);
        let n = read(
            "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 \
             maximum context length",
        );
        assert_eq!(
            (n.prompt_tokens, n.context_window),
            (Some(40000), Some(32768))
        );
    }

    #[test]
    fn hostile_input_is_bounded() {
        let huge = "you requested ".repeat(10_000) + &"9".repeat(50);
        let n = read(&huge);
        assert_eq!(n.requested_total, None);
        assert_eq!(read("").context_window, None);
        assert_eq!(
            read("maximum context length is tokens").context_window,
            None
        );
    }
}
