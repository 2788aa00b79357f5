//! The lines that take the place of pruned tool outputs. Prune writes them; the error
//! finder and the digest read them back when a later request carries them, so they live
//! below all three.

/// How a pruned tool output starts, and how it introduces the error it carries. The
/// wording stays as it is: clients send these lines back in later requests.
pub const PRUNED_PREFIX: &str = "[output of ";
pub const PRUNED_ERROR: &str = "; first error: ";
/// How an output replaced by a pointer to its later copy starts.
pub const DUPLICATE_PREFIX: &str = "[duplicate output of ";
/// How economy mode's shortened outputs start (see [`super::economy`]): an old output cut
/// by its content, and an earlier near copy cut to the lines a later one lacks. Not
/// [`PRUNED_PREFIX`]: what they keep is the output's own text, which the error finder and
/// the digest read as such.
pub const SHORTENED_PREFIX: &str = "[shortened output of ";
pub const EARLIER_PREFIX: &str = "[earlier output of ";
