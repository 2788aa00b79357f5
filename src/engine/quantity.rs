//! Which numbers in free text are worth keeping: a quantity says what it counts (a unit,
//! a rate) or bounds the work (a limit word before it). "Keep the retry budget under 30
//! per minute", "the dump is 12 GiB", "no more than 8 workers" each hold one; "Python 3",
//! "line 12" and "step 2" do not. A run of four digits or more (a count, an id) is kept
//! whatever follows it, as before. Hand scanning, linear in the text, no regular
//! expressions.

use std::collections::HashSet;
use std::sync::LazyLock;

use super::phrases::Phrases;

/// How much a number says, least first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Amount {
    /// Four digits or more with nothing to say what they count.
    Count,
    /// A number with its unit or rate: `12 GiB`, `250ms`, `30 requests per minute`.
    Measure,
    /// A number a limit word bounds: `at most 3`, `under 30 per minute`, `limit of 200`.
    Limit,
}

/// Units read as a word of their own after a number (`12 GiB`, `30 rows`), or glued to
/// it (`12GiB`), lowercase. Countable nouns count too: a number of rows or workers is
/// a size someone may hold the work to.
const UNITS: &str = concat!(
    // time
    "ns us µs ms s msec millisecond milliseconds sec secs second seconds min mins ",
    "minute minutes hr hrs hour hours day days week weeks month months year years ",
    // data and rates
    "b kb mb gb tb pb kib mib gib tib byte bytes bit bits kbps mbps gbps rps qps ",
    "tps rpm hz khz mhz ghz fps ops % percent pct ",
    // money and sizes on a screen or a scale
    "usd eur gbp dollars euros cents px pt em rem dpi kg g km cm mm °c °f ",
    // what work is counted in
    "token tokens char chars character characters line lines row rows record ",
    "records item items file files request requests req reqs call calls query ",
    "queries connection connections conns thread threads worker workers process ",
    "processes retry retries attempt attempts user users tenant tenants order ",
    "orders event events message messages job jobs task tasks iteration iterations ",
    "page pages entry entries batch batches core cores cpu cpus vcpu vcpus node ",
    "nodes replica replicas instance instances pod pods shard shards partition ",
    "partitions column columns test tests step steps epoch epochs sample samples ",
    "document documents docs word words commit commits times concurrent parallel ",
    "digits package packages warning warnings error errors ",
    // a run's outcome counts (`58 passed`, `3 failed`)
    "passed failed skipped ",
);

/// Units only read glued to their number (`30s`, `5m`, `2h`, `10k`, `3x`): alone, these
/// letters are words or variables.
const GLUED_UNITS: &str = "s m h d k x w";

/// Words after a number that make it a rate with the time word after them (`30 per
/// minute`, `5 a second`, `100 every hour`).
const RATE_WORDS: &str = "per a an each every";

/// Time words of a rate.
const RATE_TIMES: &str =
    "second sec minute min hour day week month request call run user tenant batch";

/// Words that, up to [`LIMIT_REACH`] words before a number, bound the work by it:
/// "at most", "no more than", "a limit of", "capped at", "under", "≤".
const LIMIT_WORDS: &str = concat!(
    "most least than under below above beyond max maximum min minimum limit limits ",
    "limited limiting cap caps capped capping exceed exceeds exceeding within ",
    "budget threshold ceiling quota upto < <= ≤ > >= ≥ only over ",
);

/// Nouns of a setting whose value a number gives: "a batch size of 512", "the TTL is
/// 300", "set concurrency to 8", "pool_size = 20" (a name ending in one of them).
const SETTINGS: &str = concat!(
    "size sizes timeout timeouts ttl concurrency parallelism depth capacity interval ",
    "retention length width height backlog lifetime expiry ratio factor threshold ",
    "precision scale port workers replicas retries level",
);

/// Words between a setting and its value.
const SETTING_LINKS: &str = "of is are = to :";

/// How many words before a number a limit word may stand ("limit the pool to 8").
const LIMIT_REACH: usize = 5;

/// Number words that stand for a number with a unit or a limit ("thirty per minute",
/// "at most two retries"). Not "one": "one of the tests" is no quantity.
const NUMBER_WORDS: &str = concat!(
    "two three four five six seven eight nine ten eleven twelve fifteen twenty ",
    "thirty forty fifty sixty hundred thousand million billion dozen half quarter ",
);

/// A list above as a set, built once: asked of every number of every line of an output
/// that is cut.
type WordSet = LazyLock<HashSet<&'static str>>;

static UNIT_SET: WordSet = LazyLock::new(|| UNITS.split(' ').collect());
static GLUED_SET: WordSet = LazyLock::new(|| GLUED_UNITS.split(' ').collect());
static RATE_SET: WordSet = LazyLock::new(|| RATE_WORDS.split(' ').collect());
static RATE_TIME_SET: WordSet = LazyLock::new(|| RATE_TIMES.split(' ').collect());
static LIMIT_SET: WordSet = LazyLock::new(|| LIMIT_WORDS.split(' ').collect());
static NUMBER_SET: WordSet = LazyLock::new(|| NUMBER_WORDS.split(' ').collect());
static SETTING_SET: WordSet = LazyLock::new(|| SETTINGS.split(' ').collect());
static SETTING_LINK_SET: WordSet = LazyLock::new(|| SETTING_LINKS.split(' ').collect());

/// Whether `word` is in `words`, ASCII case ignored.
fn listed(words: &WordSet, word: &str) -> bool {
    // No listed word is longer: a longer one is not hashed.
    const LONGEST: usize = 12;
    if word.is_empty() || word.len() > LONGEST {
        false
    } else if word.bytes().any(|b| b.is_ascii_uppercase()) {
        words.contains(word.to_ascii_lowercase().as_str())
    } else {
        words.contains(word)
    }
}

/// The most telling amount in `text`, if any number in it says something.
pub fn amount(text: &str) -> Option<Amount> {
    // Most lines of an output hold no number: a pass over their bytes (and, without a
    // digit, one search for number words) spares splitting them into words.
    static SPELLED: LazyLock<Phrases> = LazyLock::new(|| {
        let words: Vec<&str> = NUMBER_WORDS.split(' ').collect();
        Phrases::new(&[&words])
    });
    let spelled = SPELLED.find(text, true).is_some();
    if !spelled && !text.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut best = None;
    for i in 0..words.len() {
        let found = amount_at(&words, i, spelled);
        if found == Some(Amount::Limit) {
            return found;
        }
        best = best.max(found);
    }
    best.or_else(|| has_count(text).then_some(Amount::Count))
}

/// The amount the word at `i` starts, if it is a number that says something; `spelled`
/// when the text holds a number word at all.
fn amount_at(words: &[&str], i: usize, spelled: bool) -> Option<Amount> {
    // `≤30`, `<200ms`: the bound glued to its number.
    let glued_bound = words[i].starts_with(['<', '>', '≤', '≥']);
    let money = words[i]
        .trim_start_matches(['(', '~', '≈'])
        .starts_with(['$', '€', '£', '¥']);
    let word = words[i].trim_start_matches([
        '(', '~', '$', '€', '£', '¥', '≈', '[', '"', '\'', '<', '>', '=', '≤', '≥',
    ]);
    let word = word.trim_end_matches([',', '.', ';', ':', ')', ']', '"', '\'', '!', '?']);
    let (digits, suffix) = split_number(word, spelled)?;
    let measure = if suffix.is_empty() {
        (money && digits > 0) || unit_follows(words, i) || (digits > 0 && setting_before(words, i))
    } else {
        is_unit(suffix, true) || unit_follows(words, i)
    };
    // A number word says something only with its unit: "at most two" alone is prose.
    let bounded = glued_bound || limit_before(words, i) || limit_after(words, i);
    if bounded && (digits > 0 || measure) {
        Some(Amount::Limit)
    } else {
        measure.then_some(Amount::Measure)
    }
}

/// Whether `text` holds four digits or more in a row: a count, an id (`tenant_4821`), a
/// date. Not inside a content digest (`d41d8cd98f00b204e9800998ecf8427e`): its digits
/// count nothing, and a listing of checksums would otherwise read as a message full of
/// numbers the user stated.
fn has_count(text: &str) -> bool {
    text.split_whitespace().filter(|w| !is_digest(w)).any(|w| {
        let mut run = 0;
        w.bytes().any(|b| {
            run = if b.is_ascii_digit() { run + 1 } else { 0 };
            run >= 4
        })
    })
}

/// Whether `word` is a checksum or a content hash: 16 hex characters or more, letters
/// and digits both (md5, sha1, sha256, a git object name written whole).
fn is_digest(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    w.len() >= 16
        && w.bytes().all(|b| b.is_ascii_hexdigit())
        && w.bytes().any(|b| b.is_ascii_digit())
        && w.bytes().any(|b| b.is_ascii_alphabetic())
}

/// A number's digits (0 for a number word, looked for only when `spelled`) and what is
/// glued after it (`ms`, `%`, `/min`); `None` when the word is no number with a unit. Versions, dates and times
/// (`3.11.2`, `2024-05-01`, `12:30`) have none.
fn split_number(word: &str, spelled: bool) -> Option<(usize, &str)> {
    let b = word.as_bytes();
    if b.first().is_some_and(u8::is_ascii_alphabetic) {
        return (spelled && listed(&NUMBER_SET, word)).then_some((0, ""));
    }
    if !b.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let mut digits = 0;
    let mut dots = 0;
    let mut end = 0;
    while end < b.len() {
        match b[end] {
            c if c.is_ascii_digit() => digits += 1,
            // A separator between digits: `1,000`, `2.5`, `1_000`.
            b'.' | b',' | b'_' if b.get(end + 1).is_some_and(u8::is_ascii_digit) => {
                dots += usize::from(b[end] == b'.');
            }
            _ => break,
        }
        end += 1;
    }
    let suffix = &word[end..];
    let dated = suffix.starts_with(['-', ':']) || dots > 1;
    (!dated).then_some((digits, suffix))
}

/// Bytes of the number `word` starts with (`1,234.5`, `250` of `250ms`); `None` when it
/// starts with none, or with a version, a date or a time, which count nothing.
pub fn number_end(word: &str) -> Option<usize> {
    if !word.as_bytes().first()?.is_ascii_digit() {
        return None;
    }
    split_number(word, false).map(|(_, suffix)| word.len() - suffix.len())
}

/// Whether `suffix` is a unit, or a rate of one (`ms`, `requests/minute`, `/s`); `glued`
/// when it follows the digits with no space, where single letters count too (`30s`).
pub fn is_unit(suffix: &str, glued: bool) -> bool {
    // `30/min`, `req/s`, `100/sec`: a rate.
    if let Some(per) = suffix.strip_prefix('/') {
        return !per.is_empty() && per.bytes().all(|c| c.is_ascii_alphabetic());
    }
    let unit = suffix.split('/').next().unwrap_or("");
    // `°C`, `39°F`: a temperature, the degree sign glued to its scale's letter.
    let unit = unit.strip_prefix('°').map_or(unit, |scale| match scale {
        "C" | "c" => "°c",
        "F" | "f" => "°f",
        _ => unit,
    });
    listed(&UNIT_SET, unit) || (glued && listed(&GLUED_SET, unit))
}

/// Whether the words after a number give its unit or make it a rate.
fn unit_follows(words: &[&str], i: usize) -> bool {
    let word = |j: usize| {
        words.get(j).map_or("", |w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && !"%/°".contains(c))
        })
    };
    let next = word(i + 1);
    if is_unit(next, false) {
        return true;
    }
    // "half a second", "a quarter of an hour"; "half of the tests" counts nothing.
    let article = |w: &str| ["a", "an"].contains(&w);
    if article(next) && is_unit(word(i + 2), false)
        || next == "of" && article(word(i + 2)) && is_unit(word(i + 3), false)
    {
        return true;
    }
    let after = word(i + 2).trim_end_matches('s');
    listed(&RATE_SET, next) && listed(&RATE_TIME_SET, after)
}

/// Whether the number at `i` gives a setting its value: the word before it, or the one
/// before a linking word ("of", "is", "to", "="), names one ("batch size of 512",
/// "max_connections = 200"; "timeout: 90").
fn setting_before(words: &[&str], i: usize) -> bool {
    // A name that ends its clause ("the timeout, 3 of the jobs") sets nothing after it.
    let names_setting =
        |w: &str| listed(&SETTING_SET, setting_name(w)) && !w.ends_with([',', '.', ';']);
    let Some(prev) = i.checked_sub(1).map(|j| words[j]) else {
        return false;
    };
    if names_setting(prev) {
        return true;
    }
    listed(&SETTING_LINK_SET, prev) && i.checked_sub(2).is_some_and(|j| names_setting(words[j]))
}

/// The part of a word that names a setting: `timeout` of `timeout:`, `size` of
/// `pool_size` and of `max-size` (a name's last part says what it sets).
fn setting_name(word: &str) -> &str {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_');
    w.rsplit(['_', '-']).next().unwrap_or(w)
}

/// Whether a limit word stands up to [`LIMIT_REACH`] words before the number at `i`, in
/// the same clause.
fn limit_before(words: &[&str], i: usize) -> bool {
    let from = i.saturating_sub(LIMIT_REACH);
    for w in words[from..i].iter().rev() {
        let bare = w.trim_matches(|c: char| c.is_ascii_punctuation() && !"<>=".contains(c));
        if listed(&LIMIT_SET, bare) || bare.starts_with('≤') || bare.starts_with('≥') {
            return true;
        }
        // A clause ends before the word: "in 2020, under the old plan" bounds nothing.
        if w.ends_with([',', ';', '.', ':']) {
            return false;
        }
    }
    false
}

/// Words that bound a number from after it: "200 rows max", "30 a minute at most",
/// "five retries tops", "2 GiB or less".
const LIMIT_AFTER: &str = "max maximum most tops less fewer";

/// How many words after a number such a word may stand ("30 requests per minute at
/// most").
const LIMIT_AFTER_REACH: usize = 5;

static LIMIT_AFTER_SET: WordSet = LazyLock::new(|| LIMIT_AFTER.split(' ').collect());

/// Whether a word of [`LIMIT_AFTER`] follows the number at `i` in the same clause.
fn limit_after(words: &[&str], i: usize) -> bool {
    if words[i].ends_with([',', ';', '.', ':']) {
        return false;
    }
    for w in words.iter().skip(i + 1).take(LIMIT_AFTER_REACH) {
        let bare = w.trim_matches(|c: char| c.is_ascii_punctuation());
        if listed(&LIMIT_AFTER_SET, bare) {
            return true;
        }
        if w.ends_with([',', ';', '.', ':']) {
            return false;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_with_its_unit_is_a_measure() {
        for s in [
            "The export file is 12 GiB uncompressed.",
            "p99 latency sits around 250ms on staging",
            "the warehouse table has 840k rows",
            "each worker gets 2 cores",
            "we were billed 40 USD for the run",
            "it processes 75 requests per second at peak",
            "about thirty calls a minute",
            "egress costs us €0.08 per gigabyte",
            "the license is $1200 a seat",
            "the target API level is 24",
        ] {
            assert_eq!(amount(s), Some(Amount::Measure), "{s}");
        }
    }

    #[test]
    fn a_number_a_setting_takes_is_a_measure() {
        for s in [
            "Use a batch size of 512 for the backfill.",
            "The session TTL is 300 on staging.",
            "set concurrency to 8 for the crawler",
            "pool_size = 20 in the worker config",
            "timeout: 90",
            "the ring buffer has a capacity of 64",
        ] {
            assert_eq!(amount(s), Some(Amount::Measure), "{s}");
        }
        // A setting in an earlier clause, or a position, gives nothing its value.
        for s in [
            "Raise the timeout, 3 of the jobs hit it.",
            "See the size column on line 12.",
            "The retention job ran at step 2.",
        ] {
            assert_eq!(amount(s), None, "{s}");
        }
    }

    #[test]
    fn a_number_a_limit_word_bounds_is_a_limit() {
        for s in [
            "Also, keep the retry budget under 30 per minute.",
            "Use at most 3 parallel jobs on the runner.",
            "There's a hard limit of 200 messages per conversation.",
            "no more than 8 workers please",
            "responses must stay ≤ 512 tokens",
            "Cap the pool at 16 connections.",
            "limit the batch to 50 rows",
            "stay within 2% of the baseline",
            "p95 must be ≤250ms",
            "200 rows max per insert",
            "the scraper may send 30 requests per minute at most",
            "give it five retries tops",
        ] {
            assert_eq!(amount(s), Some(Amount::Limit), "{s}");
        }
    }

    /// A checksum's digits count nothing; an id or a count beside it still does.
    #[test]
    fn a_content_hash_is_no_count() {
        for s in [
            "/srv/a.txt d41d8cd98f00b204e9800998ecf8427e",
            "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "HEAD is now at 3add5e1546cfbbb91c765a1a67021a10e2f1c3d4 fix the build",
            "etag \"5bf6b7349149944d65ea0b1f423b5009\"",
        ] {
            assert_eq!(amount(s), None, "{s}");
        }
        for s in [
            "tenant_4821 is the one that fails",
            "d41d8cd98f00b204e9800998ecf8427e and 12000 more files",
        ] {
            assert_eq!(amount(s), Some(Amount::Count), "{s}");
        }
    }

    #[test]
    fn versions_dates_positions_and_bare_small_numbers_say_nothing() {
        for s in [
            "Upgrade to Python 3.11.4 first.",
            "See line 12 of the parser.",
            "Do step 2 before step 3.",
            "Retry it.",
            "one of the tests is flaky",
        ] {
            assert_eq!(amount(s), None, "{s}");
        }
        // Four digits or more in a row: a count, an id or a date, as before.
        for s in [
            "ticket 48213 again",
            "tenant_4821 fails",
            "due 2024-05-01 at 12:30",
        ] {
            assert_eq!(amount(s), Some(Amount::Count), "{s}");
        }
        // A limit word in an earlier clause bounds nothing.
        assert_eq!(
            amount("Back in 2021, under the old plan."),
            Some(Amount::Count)
        );
    }

    #[test]
    fn temperatures_and_fractions_in_words_are_measures() {
        for s in [
            "Keep the cold room at 4 °C or colder.",
            "The probe reads 39°F at night.",
            "The oven idles at 180 °C between batches.",
            "Latency improved by half a second after the fix.",
            "Syncing takes a quarter of an hour on the old NAS.",
        ] {
            assert_eq!(amount(s), Some(Amount::Measure), "{s}");
        }
        // A limit word five words before the number still bounds it.
        assert_eq!(
            amount("The minimum supported Node version is 18."),
            Some(Amount::Limit)
        );
        for s in [
            "Half of the tests are flaky.",
            "A quarter of the team is out.",
        ] {
            assert_eq!(amount(s), None, "{s}");
        }
    }
}
