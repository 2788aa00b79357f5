//! Token counts in types, so that the two ways of counting cannot be mixed by accident:
//! [`Ours`] is what our tokenizer counts, [`Theirs`] what the upstream counts (its window,
//! its refusals, its `usage`), and a [`Factor`] learned per model turns one into the other.
//! A [`Window`] is a model's context window (prompt plus completion) in the upstream's
//! tokens; a window that is not known is `None`, never a sentinel.

/// Tokens as our tokenizer counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ours(pub u64);

/// Tokens as the upstream counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Theirs(pub u64);

/// A model's context window, prompt plus completion, in the upstream's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Window(pub u64);

/// Upstream tokens per token of ours, as learned for a model (1.0 until learned).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Factor(pub f64);

/// The window assumed where one is needed and none is known (the offline command, the
/// summary's share of a window): the most common window of today's hosted models.
pub const DEFAULT_WINDOW: Window = Window(128_000);

impl Ours {
    /// The upstream's count of these tokens.
    pub fn theirs(self, factor: Factor) -> Theirs {
        Theirs((self.0 as f64 * factor.0) as u64)
    }

    pub fn usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl Theirs {
    /// Our count of these tokens.
    pub fn ours(self, factor: Factor) -> Ours {
        Ours((self.0 as f64 / factor.0) as u64)
    }

    pub fn saturating_sub(self, other: Theirs) -> Theirs {
        Theirs(self.0.saturating_sub(other.0))
    }
}

impl std::ops::Add for Theirs {
    type Output = Theirs;
    fn add(self, other: Theirs) -> Theirs {
        Theirs(self.0.saturating_add(other.0))
    }
}

impl Window {
    /// `share` of the window, in the upstream's tokens.
    pub fn share(self, share: f64) -> Theirs {
        Theirs((self.0 as f64 * share) as u64)
    }

    /// All of it, in the upstream's tokens.
    pub fn tokens(self) -> Theirs {
        Theirs(self.0)
    }

    pub fn usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl Default for Factor {
    fn default() -> Factor {
        Factor(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_factor_turns_our_count_into_theirs_and_back() {
        let factor = Factor(1.25);
        assert_eq!(Ours(1000).theirs(factor), Theirs(1250));
        assert_eq!(Theirs(1250).ours(factor), Ours(1000));
        assert_eq!(Window(10_000).share(0.6), Theirs(6000));
    }
}
