//! What an error body says, gathered from wherever providers put it.
//!
//! Messages come from `error.message`, a string `error`, `message`, `msg`, `detail`, `title`,
//! `status_msg`, JSON arrays wrapping errors, and strings that are themselves JSON (OpenRouter's
//! `error.metadata.raw`, gateways that embed the upstream body). Codes come from `code`, `type`,
//! `error_type`, `status`, `status_code`, `param` and `reason`.

use serde_json::Value;

use super::text::normalize;

/// Nesting followed into objects, arrays and JSON-in-strings.
const MAX_DEPTH: usize = 8;
/// Messages kept; later ones repeat earlier ones in every body seen so far.
const MAX_TEXTS: usize = 32;

/// The facts an error body states.
#[derive(Debug, Default)]
pub(super) struct Signals {
    /// Normalised code, type, status and param values.
    pub codes: Vec<String>,
    /// Normalised messages.
    pub texts: Vec<String>,
    /// llama.cpp's structured window.
    pub n_ctx: Option<u64>,
    /// llama.cpp's structured prompt size.
    pub n_prompt_tokens: Option<u64>,
    /// An HTTP-like status written inside the body (`"code": 429`, `"http_code": "400"`).
    pub embedded_status: Option<u16>,
}

impl Signals {
    /// Gathers signals from a parsed error body.
    pub fn from_json(value: &Value) -> Self {
        let mut s = Self::default();
        s.collect(value, 0);
        s
    }

    /// Signals of a body that is not JSON (HTML pages, plain text).
    pub fn from_text(raw: &str) -> Self {
        Self {
            texts: vec![normalize(raw)],
            ..Self::default()
        }
    }

    /// All messages joined, for phrase and number search.
    pub fn text(&self) -> String {
        self.texts.join(" | ")
    }

    pub fn has_code(&self, wanted: &[&str]) -> bool {
        self.codes.iter().any(|c| wanted.contains(&c.as_str()))
    }

    fn collect(&mut self, value: &Value, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match value {
            Value::String(s) => self.add_text(s, depth),
            Value::Array(items) => items.iter().for_each(|v| self.collect(v, depth + 1)),
            Value::Object(map) => {
                for (key, v) in map {
                    self.field(&key.to_ascii_lowercase(), v, depth);
                }
            }
            _ => {}
        }
    }

    fn field(&mut self, key: &str, v: &Value, depth: usize) {
        match key {
            "message" | "msg" | "detail" | "title" | "status_msg" | "error_message"
            | "errormessage" | "raw" | "error" | "errors" | "response" | "metadata"
            | "base_resp" => self.collect(v, depth + 1),
            "code" | "type" | "error_type" | "status" | "status_code" | "param" | "reason"
            | "http_code" | "error_code" | "errorcode" | "statuscode" => self.add_code(v),
            "n_ctx" => self.n_ctx = v.as_u64(),
            "n_prompt_tokens" => self.n_prompt_tokens = v.as_u64(),
            _ => {}
        }
    }

    fn add_text(&mut self, s: &str, depth: usize) {
        let trimmed = s.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            if let Ok(inner) = serde_json::from_str::<Value>(trimmed) {
                self.collect(&inner, depth + 1);
                return;
            }
        }
        if self.texts.len() < MAX_TEXTS && !s.trim().is_empty() {
            self.texts.push(normalize(s));
        }
    }

    fn add_code(&mut self, v: &Value) {
        let code = match v {
            Value::String(s) => normalize(s),
            Value::Number(n) => n.to_string(),
            _ => return,
        };
        if let Ok(n) = code.parse::<u16>() {
            if (100..600).contains(&n) && self.embedded_status.is_none() {
                self.embedded_status = Some(n);
            }
        }
        if !code.is_empty() && self.codes.len() < MAX_TEXTS {
            self.codes.push(code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openrouter_raw_is_unwrapped() {
        let body = serde_json::json!({
            "error": {
                "message": "Provider returned error",
                "code": 400,
                "metadata": {
                    "raw": "{\"error\":{\"message\":\"Prompt is too long\",\"code\":\"context_length_exceeded\"}}",
                    "provider_name": "Anthropic"
                }
            }
        });
        let s = Signals::from_json(&body);
        assert!(s.texts.contains(&"prompt is too long".to_string()));
        assert!(s.has_code(&["context_length_exceeded"]));
        assert_eq!(s.embedded_status, Some(400));
    }

    #[test]
    fn depth_is_bounded() {
        let mut v = serde_json::json!("deep");
        for _ in 0..100 {
            v = serde_json::json!({ "error": v });
        }
        assert!(Signals::from_json(&v).texts.is_empty());
    }
}
