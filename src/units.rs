//! Token counts in types, so that the two ways of counting cannot be mixed by accident:
//! [`Ours`] is what our tokenizer counts, [`Theirs`] what the upstream counts (its window,
//! its refusals, its `usage`), and a [`Factor`] learned per model turns one into the other.
//! A [`Window`] is a model's context window (prompt plus completion) in the upstream's
//! tokens; a window that is not known is `None`, never a sentinel. A [`Limit`] is a bound
//! on a count that may have none, such as a model's messages per request.

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

/// The most of something (messages, tokens) allowed. "No limit" is a value of its own, not
/// `usize::MAX`, so no sum or difference can run into a sentinel and wrap or saturate
/// into a limit nobody set. A looser limit is the greater: ordered by their declaration,
/// any number is below no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    At(usize),
    Unbounded,
}

impl Limit {
    /// Whether `n` stays within the limit.
    pub fn admits(self, n: usize) -> bool {
        match self {
            Limit::Unbounded => true,
            Limit::At(most) => n <= most,
        }
    }

    /// What is left of the limit once `used` is spent: never below zero, and no limit
    /// stays none.
    pub fn less(self, used: usize) -> Limit {
        match self {
            Limit::Unbounded => Limit::Unbounded,
            Limit::At(most) => Limit::At(most.saturating_sub(used)),
        }
    }

    /// `n`, or the limit where `n` is above it.
    pub fn clamp(self, n: usize) -> usize {
        match self {
            Limit::Unbounded => n,
            Limit::At(most) => n.min(most),
        }
    }

    /// How far `n` is above the limit: nothing is above no limit.
    pub fn excess(self, n: usize) -> usize {
        match self {
            Limit::Unbounded => 0,
            Limit::At(most) => n.saturating_sub(most),
        }
    }

    /// The limit `f` makes of this one (a share of it, room beside it); no limit stays
    /// none.
    pub fn map(self, f: impl FnOnce(usize) -> usize) -> Limit {
        match self {
            Limit::Unbounded => Limit::Unbounded,
            Limit::At(most) => Limit::At(f(most)),
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Unbounded => f.write_str("none"),
            Limit::At(most) => write!(f, "{most}"),
        }
    }
}

impl From<Option<usize>> for Limit {
    fn from(most: Option<usize>) -> Limit {
        most.map_or(Limit::Unbounded, Limit::At)
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

    #[test]
    fn a_limit_admits_up_to_itself_and_no_limit_admits_anything() {
        assert!(Limit::At(3).admits(3));
        assert!(!Limit::At(3).admits(4));
        assert!(!Limit::At(0).admits(1));
        assert!(Limit::Unbounded.admits(usize::MAX));
        assert_eq!(Limit::from(Some(5)), Limit::At(5));
        assert_eq!(Limit::from(None), Limit::Unbounded);
    }

    #[test]
    fn spending_a_limit_stops_at_zero_and_no_limit_stays_none() {
        assert_eq!(Limit::At(5).less(2), Limit::At(3));
        assert_eq!(Limit::At(2).less(5), Limit::At(0));
        // Where `usize::MAX` stood for "none", spending from it made a limit of its own.
        assert_eq!(Limit::Unbounded.less(usize::MAX), Limit::Unbounded);
        assert!(Limit::Unbounded.less(7).admits(usize::MAX));
    }

    #[test]
    fn clamping_to_a_limit_lowers_only_what_is_above_it() {
        assert_eq!(Limit::At(10).clamp(4), 4);
        assert_eq!(Limit::At(10).clamp(40), 10);
        assert_eq!(Limit::Unbounded.clamp(40), 40);
    }

    #[test]
    fn nothing_is_over_no_limit_and_no_limit_is_above_every_number() {
        assert_eq!(Limit::At(10).excess(14), 4);
        assert_eq!(Limit::At(10).excess(6), 0);
        assert_eq!(Limit::Unbounded.excess(usize::MAX), 0);
        assert!(Limit::Unbounded > Limit::At(usize::MAX));
        assert!(Limit::At(3) < Limit::At(4));
        assert_eq!(Limit::At(5).max(Limit::At(8)), Limit::At(8));
        assert_eq!(Limit::Unbounded.max(Limit::At(8)), Limit::Unbounded);
    }

    #[test]
    fn a_share_of_no_limit_is_no_limit() {
        assert_eq!(Limit::At(1000).map(|t| t / 10), Limit::At(100));
        assert_eq!(Limit::Unbounded.map(|t| t / 10), Limit::Unbounded);
        assert_eq!(Limit::Unbounded.to_string(), "none");
        assert_eq!(Limit::At(42).to_string(), "42");
    }
}
