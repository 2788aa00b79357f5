//! Reading the meaning of error messages: normalisation, vetoes and the overflow matchers.
//!
//! Everything works on text normalised by [`normalize`]: lower case, one space between words,
//! no backticks or backslashes, straight apostrophes. Plain substring and word scans are
//! enough here and keep the crate free of a regex engine.

/// Lower-cases and flattens a message so that wording, not formatting, is compared.
pub(super) fn normalize(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut space = false;
    for c in raw.chars() {
        let c = match c {
            '`' | '\\' => continue,
            '\u{2018}' | '\u{2019}' => '\'',
            c if c.is_whitespace() => ' ',
            c => c,
        };
        if c == ' ' {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// Messages that mention tokens or limits but mean a rate limit, quota, auth, an unknown
/// model or a bad parameter: compacting would not help, so these never count as overflow.
const VETOES: &[&str] = &[
    "rate limit",
    "rate_limit",
    "ratelimit",
    "too many requests",
    // A leading space keeps "super minimal" from reading as "per min".
    " per min",
    " per day",
    " per hour",
    "(tpm)",
    "(rpm)",
    "(tpd)",
    "requests per",
    "quota",
    "throttl",
    "billing",
    "insufficient balance",
    "credit",
    "please wait before",
    "service unavailable",
    "overloaded",
    "unsupported parameter",
    "unknown parameter",
    "unrecognized request argument",
    "unrecognized parameter",
    "unsupported value",
    "not supported with this model",
    "string_above_max_length",
    "string too long",
    "invalid 'user'",
    "logit_bias",
    "media exceeds size limit",
    "model not found",
    "model_not_found",
    "does not exist",
    "invalid api key",
    "incorrect api key",
    "unauthorized",
    "authentication",
    "频率",
    "速率",
    "限流",
    "额度",
    "余额",
];

/// True when the message is about something compaction cannot fix.
pub(super) fn vetoed(text: &str) -> bool {
    VETOES.iter().any(|v| text.contains(v))
        || asks_to_wait(text, "try again in ")
        || asks_to_wait(text, "retry after ")
}

/// "try again in 20s" is a rate limit; "try again in a new chat" is not.
fn asks_to_wait(text: &str, lead: &str) -> bool {
    text.match_indices(lead).any(|(at, _)| {
        text[at + lead.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// What a media-count refusal counts.
const MEDIA_WORDS: &[&str] = &["image", "media", "document", "pdf page"];
/// How it says there are too many of them (the count, not their size: "media exceeds size
/// limit" is vetoed before this is asked).
const TOO_MANY: &[&str] = &[
    "too many ",
    "too much media",
    "exceeding the maximum of",
    "at most ",
    "a maximum of ",
];
/// The words that come right before the limit, most specific first.
const LIMIT_LEADS: &[&str] = &["max is ", "maximum of ", "at most ", "(max ", "> ", "max "];

/// True when the message says the request carries more media than one request may: too
/// many images, documents or PDF pages, by count. Tokens are not what it is about.
pub(super) fn says_too_many_media(text: &str) -> bool {
    TOO_MANY.iter().any(|w| text.contains(w))
        && MEDIA_WORDS.iter().any(|w| text.contains(w))
        && !text.contains("token")
        && !text.contains("dimension")
        && !text.contains("pixels")
}

/// The media limit a media-count refusal names ("max is 10", "> 100", "maximum of 50",
/// "at most 5 image(s)"), when it names one.
pub(super) fn media_limit(text: &str) -> Option<u64> {
    LIMIT_LEADS.iter().find_map(|lead| number_after(text, lead))
}

/// How a request with more messages than the upstream takes is refused: OpenAI's
/// validation of an array's length, named for the conversation's own array (not for
/// `tools` or one message's `tool_calls`, which compaction cannot shorten), and plain
/// wording.
const TOO_MANY_MESSAGES: &[&str] = &[
    "invalid 'messages': array too long",
    "invalid 'input': array too long",
    "too many messages",
];

/// True when the message says the request has more messages than one request may.
pub(super) fn says_too_many_messages(text: &str) -> bool {
    TOO_MANY_MESSAGES.iter().any(|w| text.contains(w)) && !text.contains("token")
}

/// The message limit such a refusal names ("maximum length 2048", "max 100").
pub(super) fn message_limit(text: &str) -> Option<u64> {
    ["maximum length ", "maximum of ", "max is ", "(max ", "max "]
        .iter()
        .find_map(|lead| number_after(text, lead))
}

/// The first number that follows `lead` in `text`.
fn number_after(text: &str, lead: &str) -> Option<u64> {
    text.match_indices(lead).find_map(|(at, _)| {
        let digits: String = text[at + lead.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

/// Overflow wordings too short for the meaning matcher (no unit, or no excess word).
const OVERFLOW_PHRASES: &[&str] = &[
    "prompt is too long",
    "prompt too long",
    "prompt is too large",
    "prompt too large",
    "kv cache is full",
    "n_ctx_slot",
    "input is too long",
    "input too long",
    "context is too long",
    "conversation is too long",
    "conversation too long",
    "too many tokens",
    "token limit",
    "reduce the length of the messages",
    "reduce the length of the input",
    "reduce the length of your prompt",
    "context_length_exceeded",
    "context_window_exceeded",
    "contextwindowexceedederror",
    "exceed_context_size_error",
    "while limit is",
    "range of input length",
    "input length should be",
    "prompt exceeds max length",
    "input exceeds max length",
    "configured context size",
    "超过最大长度",
    "上下文长度",
];

/// Words naming what overflowed.
const SUBJECTS: &[&str] = &[
    "context",
    "prompt",
    "prompts",
    "input",
    "inputs",
    "request",
    "message",
    "messages",
    "conversation",
    "history",
    "sequence",
    "query",
    "n_keep",
    "prompt_tokens",
    "input_tokens",
    "input_ids",
    "requested",
    "total",
];

/// Words saying "too much".
const EXCESS: &[&str] = &[
    "exceed",
    "exceeds",
    "exceeded",
    "exceeding",
    "maximum",
    "max",
    "limit",
    "limits",
    "overflow",
    "overflows",
    "overflowed",
    "longer",
    "greater",
    "larger",
    "bigger",
    "more",
    "less",
    "too",
    "over",
    "beyond",
    "full",
    "enough",
];

/// Phrases naming the unit a window is measured in (besides the words token/tokens).
const UNITS: &[&str] = &[
    "context length",
    "context window",
    "context size",
    "context limit",
    "model length",
    "max_model_len",
    "input length",
    "prompt length",
    "n_ctx",
    "max_seq_len",
    "max context",
    "maximum context",
    "sequence length",
    "max sequence",
    "max_position_embeddings",
];

/// True when the message says the prompt or context is over the model's limit.
pub(super) fn says_overflow(text: &str) -> bool {
    OVERFLOW_PHRASES.iter().any(|p| text.contains(p))
        || (text.contains("n_keep") && text.contains("n_ctx"))
        || chinese_overflow(text)
        || clauses(text).any(means_overflow)
}

/// What one clause mentions, word by word.
#[derive(Default)]
struct Mentions {
    /// A subject other than "context" (prompt, input, messages, ...).
    subject: bool,
    /// The word "context" itself.
    context: bool,
    excess: bool,
    tokens: bool,
    /// A word for a window that is used up: "full", "overflow", "exceeded".
    spent: bool,
    /// A subject that can be "too long" without meaning a field or header.
    long_subject: bool,
}

impl Mentions {
    fn of(clause: &str) -> Self {
        let mut m = Self {
            excess: clause.contains('>') || clause.contains("<="),
            ..Self::default()
        };
        for w in words(clause) {
            m.context |= w == "context";
            m.subject |= w != "context" && SUBJECTS.contains(&w);
            m.long_subject |= LONG_SUBJECTS.contains(&w);
            m.excess |= EXCESS.contains(&w);
            m.tokens |= w == "token" || w == "tokens";
            m.spent |= SPENT.contains(&w);
        }
        m
    }
}

/// Subjects for "... is too long" ("request" is left out: "request line too long" is HTTP).
const LONG_SUBJECTS: &[&str] = &[
    "prompt",
    "input",
    "context",
    "conversation",
    "history",
    "message",
    "messages",
    "query",
];

const SPENT: &[&str] = &["full", "overflow", "overflowed", "overflows", "exceeded"];

/// Phrases counting tokens without naming what they belong to ("token count exceeds limit").
const TOKEN_COUNTS: &[&str] = &[
    "token count",
    "number of tokens",
    "tokens count",
    "token usage",
];

/// A clause means overflow when it names what overflowed, says "too much" and names a unit,
/// or says the context itself is spent or exceeded: this catches wordings in no list
/// ("the conversation is longer than the model's context window", "prompt exceeds context").
fn means_overflow(clause: &str) -> bool {
    let m = Mentions::of(clause);
    let unit = m.tokens || UNITS.iter().any(|u| clause.contains(u));
    ((m.subject || m.context) && m.excess && unit)
        || (m.context && m.excess && (m.subject || m.spent))
        || (m.long_subject && clause.contains("too long"))
        || (m.excess && TOKEN_COUNTS.iter().any(|t| clause.contains(t)))
}

fn chinese_overflow(text: &str) -> bool {
    let subject = ["上下文", "输入", "提示", "请求"]
        .iter()
        .any(|s| text.contains(s));
    let excess = ["超过", "超出", "过长"].iter().any(|s| text.contains(s));
    subject && excess
}

/// Words naming the completion budget.
const OUTPUT_WORDS: &[&str] = &[
    "max_tokens",
    "max tokens",
    "max_completion_tokens",
    "max_new_tokens",
    "max_output_tokens",
    "maxoutputtokens",
];

/// Words or phrases saying the completion budget is too big ("at least" is deliberately absent).
const OUTPUT_EXCESS: &[&str] = &[
    "too large",
    "too big",
    "too high",
    "exceed",
    "maximum",
    "at most",
    "less than or equal",
    "<=",
];

/// True when the message blames the requested completion size (`max_tokens`), not the prompt.
pub(super) fn blames_output(text: &str) -> bool {
    text.contains("range of max_tokens")
        || text.contains("maximum allowed number of output tokens")
        || text.contains("maximum tokens you requested")
        || clauses(text).any(|c| {
            let names_output = OUTPUT_WORDS.iter().any(|w| c.contains(w))
                || c.contains("output tokens")
                || c.contains("completion tokens");
            names_output && OUTPUT_EXCESS.iter().any(|e| c.contains(e))
        })
}

const BODY_PHRASES: &[&str] = &[
    "request entity too large",
    "payload too large",
    "request_too_large",
    "request exceeds the maximum size",
    "body size",
    "body too large",
    "payload size",
    "content too large",
];

/// True when the message is about the size of the HTTP body in bytes.
pub(super) fn says_body_too_large(text: &str) -> bool {
    BODY_PHRASES.iter().any(|p| text.contains(p))
}

/// Splits at sentence ends so that co-occurrence stays local to one statement.
pub(super) fn clauses(text: &str) -> impl Iterator<Item = &str> {
    text.split([';', '|', '!', '?'])
        .flat_map(|part| part.split(". "))
        .filter(|c| !c.is_empty())
}

fn words(clause: &str) -> impl Iterator<Item = &str> {
    clause
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '\''))
        .map(|w| w.trim_matches('\''))
        .filter(|w| !w.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_media_count_is_told_from_tokens_and_sizes() {
        let media = |m: &str| says_too_many_media(&normalize(m));
        assert!(media("A maximum of 100 PDF pages may be provided."));
        assert!(media("Too many images in request. Max is 10."));
        assert!(!media(
            "too many tokens: the image costs more than the window"
        ));
        assert!(!media("At least one of the image dimensions exceed max allowed size for many-image requests: 2000 pixels"));
        assert!(!media("Please reduce the length of the messages."));
        assert_eq!(
            media_limit("a maximum of 100 pdf pages may be provided."),
            Some(100)
        );
        assert_eq!(media_limit("too many images"), None);
        let messages = |m: &str| says_too_many_messages(&normalize(m));
        assert!(messages("Invalid 'messages': array too long. Expected an array with maximum length 2048, but got an array with length 2050 instead."));
        assert!(!messages("Invalid 'tools': array too long. Expected an array with maximum length 128, but got an array with length 150 instead."));
        assert_eq!(
            message_limit("expected an array with maximum length 2048, but got 2050"),
            Some(2048)
        );
    }

    #[test]
    fn normalize_flattens() {
        assert_eq!(
            normalize("  The `inputs`\n\tToo\u{2019}s  LONG\\ "),
            "the inputs too's long"
        );
        assert_eq!(normalize(""), "");
    }

    #[test]
    fn meaning_catches_unlisted_wordings() {
        let positives = [
            "the conversation is longer than the model's context window",
            "prompt length (9000 tokens) is over the model limit of 8192",
            "your messages contain more tokens than this deployment allows",
            "input exceeds the maximum context of this model (32k tokens)",
            "request size of 40000 tokens is beyond what the context window can hold",
            "上下文长度超过限制",
        ];
        for p in positives {
            assert!(says_overflow(&normalize(p)), "{p}");
        }
    }

    #[test]
    fn meaning_ignores_unrelated_errors() {
        let negatives = [
            "invalid value for 'max_tokens': must be at least 1",
            "the model `gpt-5` does not exist or you do not have access to it",
            "messages.1.content.0.image.source.base64: image exceeds 5 mb maximum",
            "prompt must be a string or an array of tokens",
            "the server had an error while processing your request",
            "additional properties are not allowed ('foo' was unexpected)",
        ];
        for n in negatives {
            let t = normalize(n);
            assert!(!says_overflow(&t), "{n}");
        }
    }

    #[test]
    fn rate_limits_are_vetoed() {
        let t = normalize(
            "Request too large for gpt-4o in organization org-x on tokens per min (TPM): \
             Limit 30000, Requested 45000.",
        );
        assert!(vetoed(&t));
        assert!(vetoed(&normalize("Rate limit reached for requests")));
        assert!(!vetoed(&normalize(
            "prompt is too long: 5 tokens > 4 maximum"
        )));
    }

    #[test]
    fn output_blame() {
        assert!(blames_output(&normalize(
            "max_tokens is too large: 100000. This model supports at most 16384 completion tokens"
        )));
        assert!(blames_output(&normalize(
            "max_tokens: 300000 > 64000, which is the maximum allowed number of output tokens"
        )));
        assert!(!blames_output(&normalize(
            "invalid value for 'max_tokens': must be at least 1"
        )));
    }
}
