//! The type-erased error that bodies and connections fail with, and how an error reads
//! with its causes. It lives below both the bodies that yield it and the proxy's own
//! error, which keeps it as a cause, so neither of those imports the other.

use std::fmt;

/// An error of any layer's type, kept as it is (downcast where its kind matters) until
/// it is rendered.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Shows an error and its causes in one line, `top: cause: cause`. Top-level errors often
/// say little ("client error (Connect)"); their causes say what happened. Errors here
/// keep their causes as `source()`, never in their own message, so nothing is said twice.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_chain_names_every_cause_once() {
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(Chain(&error).to_string(), "outer: inner");
    }
}
