//! How fast each conversation grows from one turn to the next, read off the sizes of the
//! requests the proxy forwards: what preparation starts by (the next turns may cross the
//! threshold) and what an event's room is sized by (it should last several turns).
//!
//! A conversation is named by what stays the same across its turns: the client's
//! credential and model (the partition's scope) and the opening bytes of its body, which
//! hold the system prompt and the first messages. Sizes are the client's own body lengths
//! in bytes, which cost nothing to read; the caller turns bytes into tokens with the ratio
//! it has counted. Memory is bounded: two generations of at most [`GENERATION`]
//! conversations each, the older dropped whole when the newer fills.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Bytes of a body's opening that name its conversation.
const OPENING: usize = 2048;
/// Growths remembered per conversation: the next is expected to be as large as the largest
/// of them (agents' turns are bursty: a test run, then a one-line edit).
const REMEMBERED: usize = 3;
/// Conversations tracked per generation.
const GENERATION: usize = 8192;

/// What is remembered of one conversation.
#[derive(Clone, Copy, Default)]
struct Track {
    /// The length of its latest body.
    last: u64,
    /// Its latest growths in bytes, newest first; zero where none was seen yet.
    growths: [u64; REMEMBERED],
}

#[derive(Default)]
pub struct Growth {
    generations: Mutex<[HashMap<u128, Track>; 2]>,
}

impl Growth {
    /// The name of the conversation whose request `body` is, for a client in `scope`.
    pub fn conversation(scope: u128, body: &[u8]) -> u128 {
        let opening = &body[..body.len().min(OPENING)];
        let mut bytes = Vec::with_capacity(16 + opening.len());
        bytes.extend_from_slice(&scope.to_le_bytes());
        bytes.extend_from_slice(opening);
        xxhash_rust::xxh3::xxh3_128(&bytes)
    }

    /// Records a turn of `conversation` with a body of `len` bytes, and gives the growth
    /// in bytes to expect of its next turn: the largest of its recent growths, `None`
    /// before one was seen. A body that shrank starts the conversation's record anew (the
    /// client rewrote its history); one of the same length (a retry) changes nothing.
    pub fn observe(&self, conversation: u128, len: u64) -> Option<u64> {
        let mut generations = self
            .generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let [current, older] = &mut *generations;
        let known = current
            .get(&conversation)
            .or_else(|| older.get(&conversation))
            .copied();
        let track = match known {
            Some(mut track) if len > track.last => {
                track.growths.rotate_right(1);
                track.growths[0] = len - track.last;
                track.last = len;
                track
            }
            Some(track) if len == track.last => track,
            _ => Track {
                last: len,
                ..Track::default()
            },
        };
        if current.len() >= GENERATION && !current.contains_key(&conversation) {
            *older = std::mem::take(current);
        }
        current.insert(conversation, track);
        track.growths.iter().copied().max().filter(|&g| g > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_turn_is_expected_to_grow_as_much_as_the_largest_recent_one() {
        let growth = Growth::default();
        let c = Growth::conversation(1, b"{\"messages\":[]}");
        assert_eq!(growth.observe(c, 1000), None);
        assert_eq!(growth.observe(c, 1500), Some(500));
        assert_eq!(growth.observe(c, 1600), Some(500));
        // A retry of the same turn is not a turn.
        assert_eq!(growth.observe(c, 1600), Some(500));
        assert_eq!(growth.observe(c, 1700), Some(500));
        assert_eq!(growth.observe(c, 1800), Some(100));
        // A history rewritten shorter starts anew.
        assert_eq!(growth.observe(c, 900), None);
    }

    #[test]
    fn conversations_are_told_apart_by_client_and_opening() {
        let body = b"{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"}]}";
        assert_ne!(Growth::conversation(1, body), Growth::conversation(2, body));
        assert_ne!(
            Growth::conversation(1, body),
            Growth::conversation(1, b"{\"messages\":[]}")
        );
    }

    #[test]
    fn memory_is_bounded_by_two_generations() {
        let growth = Growth::default();
        for c in 0..(3 * GENERATION as u128) {
            growth.observe(c, 10);
        }
        let generations = growth.generations.lock().unwrap();
        assert!(generations.iter().map(HashMap::len).sum::<usize>() <= 2 * GENERATION);
    }
}
