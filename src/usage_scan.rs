//! The counts an answer reports of itself (`"prompt_tokens": N`, `"input_tokens": N`,
//! ...), read off its bytes as they stream by, frame by frame, a key and its number
//! possibly split between two frames. The usage calibration and the traces both read
//! answers this way, each with its own keys.

use memchr::memmem::Finder;

/// Bytes of a frame's end kept for the next one, so a key and its number split across
/// two frames are still found: the longest key, the colon, spaces and a number.
const CARRY: usize = 64;

/// The last value of each of `N` counts seen so far; `keys` maps a JSON key (quoted) to
/// the count it gives.
pub struct UsageScan<const N: usize> {
    keys: &'static [(Finder<'static>, usize)],
    seen: [Option<u64>; N],
    /// The end of the previous data frame.
    carry: Vec<u8>,
}

impl<const N: usize> UsageScan<N> {
    pub fn new(keys: &'static [(Finder<'static>, usize)]) -> Self {
        UsageScan {
            keys,
            seen: [None; N],
            carry: Vec::new(),
        }
    }

    /// Reads one data frame.
    pub fn scan(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if !self.carry.is_empty() {
            // Only the seam needs the joined bytes: the carry and the frame's start.
            let mut seam = std::mem::take(&mut self.carry);
            seam.extend_from_slice(&data[..data.len().min(CARRY)]);
            self.last_counts(&seam);
        }
        self.last_counts(data);
        self.carry = data[data.len().saturating_sub(CARRY)..].to_vec();
    }

    /// The last value of each count seen so far.
    pub fn seen(&self) -> [Option<u64>; N] {
        self.seen
    }

    /// Updates each count with the number after the last of its keys in `bytes` that has
    /// a complete number after it.
    fn last_counts(&mut self, bytes: &[u8]) {
        for (part, slot) in self.seen.iter_mut().enumerate() {
            let last = self
                .keys
                .iter()
                .filter(|(_, p)| *p == part)
                .flat_map(|(key, _)| {
                    key.find_iter(bytes).filter_map(move |at| {
                        number_after(&bytes[at + key.needle().len()..]).map(|n| (at, n))
                    })
                })
                .max_by_key(|(at, _)| *at)
                .map(|(_, n)| n);
            *slot = last.or(*slot);
        }
    }
}

/// `: 123` followed by a byte that ends the number.
fn number_after(rest: &[u8]) -> Option<u64> {
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // A number at the very end may go on in the next frame.
    if digits == 0 || digits == rest.len() {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}
