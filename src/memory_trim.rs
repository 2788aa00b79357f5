//! Giving the heap a burst freed back to the OS. glibc's `free` returns only the top of
//! the heap, so what a burst of large bodies or thousands of connections freed stays
//! resident (42.7 MB after 2,000 idle connections closed, 33.4 MB after a burst that
//! peaked there; `bench/results/throughput-2026-11-25b.md`). `malloc_trim(0)` also
//! releases the free pages inside the heap, but it walks every arena's free chunks with
//! the arena locked, so it runs from a low-frequency timer, off the runtime's threads,
//! and only when the load has fallen and the resident memory grown since the last trim:
//! never per request.

use std::time::Duration;

/// What the timer reads on each tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    /// Client connections open now.
    pub(crate) connections: usize,
    /// Requests received since the start (`compaction_proxy_requests_total`).
    pub(crate) requests: u64,
}

/// Resident growth since the last trim below which a trim is not worth its walk (1 ms
/// on a 40 MB heap with nothing to return): a client that opens one connection per
/// request, or a scrape of `/metrics`, makes the load fall every tick without freeing
/// anything worth returning.
const WORTH_KB: u64 = 4 * 1024;

/// Decides, tick by tick, whether a trim is worth it now: the load has fallen to at most
/// half of its peak since the last trim, in open connections or in requests per tick, and
/// the resident memory has grown by [`WORTH_KB`] over its low since the last trim. A
/// steady load never trims (it reuses what it freed), an idle one neither; a burst trims
/// once, on its way down. At most one trim per tick, however the load swings.
#[derive(Debug, Default)]
pub(crate) struct TrimPolicy {
    requests_seen: u64,
    peak_connections: usize,
    peak_requests_per_tick: u64,
    /// The lowest resident memory seen since the last trim (KB).
    resident_low_kb: Option<u64>,
}

impl TrimPolicy {
    /// Starts from the load at the timer's start, so requests before it do not count.
    pub(crate) fn new(load: Load, resident_kb: Option<u64>) -> Self {
        Self {
            requests_seen: load.requests,
            resident_low_kb: resident_kb,
            ..Self::default()
        }
    }

    /// The load and resident memory (`None`: unknown, then growth is assumed) at this
    /// tick; true means trim now, and the peaks start again from this load. A fall
    /// without growth keeps the peaks: the memory a burst takes can show only after its
    /// connections started to go (a burst in waves), and the fall still counts then.
    pub(crate) fn tick(&mut self, load: Load, resident_kb: Option<u64>) -> bool {
        let requests = load.requests.saturating_sub(self.requests_seen);
        self.requests_seen = load.requests;
        self.peak_connections = self.peak_connections.max(load.connections);
        self.peak_requests_per_tick = self.peak_requests_per_tick.max(requests);
        let fell = |now: u64, peak: u64| peak > 0 && now.saturating_mul(2) <= peak;
        let fallen = fell(load.connections as u64, self.peak_connections as u64)
            || fell(requests, self.peak_requests_per_tick);
        let grown = match (resident_kb, self.resident_low_kb) {
            (Some(now), Some(low)) => now >= low.saturating_add(WORTH_KB),
            _ => true,
        };
        self.resident_low_kb = match (resident_kb, self.resident_low_kb) {
            (Some(now), Some(low)) => Some(now.min(low)),
            (now, low) => now.or(low),
        };
        if fallen && grown {
            self.peak_connections = load.connections;
            self.peak_requests_per_tick = requests;
            return true;
        }
        false
    }

    /// A trim has run: growth is measured from what it left resident.
    pub(crate) fn trimmed(&mut self, resident_kb: Option<u64>) {
        self.resident_low_kb = resident_kb;
    }
}

/// This process's resident memory (KB), from `/proc/self/status`: a read of a small
/// in-memory file, once a tick.
fn resident_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Ticks every `every` for the server's life, reading the `load` and trimming when
/// [`TrimPolicy`] says so; `trimmed` hears of each trim.
pub(crate) async fn run(
    every: Duration,
    load: impl Fn() -> Load + Send,
    trimmed: impl Fn() + Send,
) {
    let mut policy = TrimPolicy::new(load(), resident_kb());
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !policy.tick(load(), resident_kb()) {
            continue;
        }
        // On the blocking pool: on a 40 MB heap the walk took 1 ms with nothing left to
        // return and 10-12 ms returning 20 MB (madvise per free chunk), which a
        // single-threaded runtime's connections should not wait for.
        let started = std::time::Instant::now();
        if tokio::task::spawn_blocking(trim).await.is_ok() {
            policy.trimmed(resident_kb());
            trimmed();
            tracing::debug!(took = ?started.elapsed(), "malloc_trim after a fall in load");
        }
    }
}

/// Whether this build can trim: glibc only (musl's and other allocators have no
/// `malloc_trim`, and return memory differently).
pub(crate) const AVAILABLE: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Returns the free heap pages to the OS. (Its result says little: glibc answers 1
/// whenever a free chunk spans a page, already returned or not.)
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    // SAFETY: malloc_trim takes glibc's own arena locks and touches no memory of ours; 0
    // means keep no padding at the top of the heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Never called: [`AVAILABLE`] keeps the timer from starting.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident memory 40 MB over the start's 10 MB: a trim would be worth it.
    const GROWN: Option<u64> = Some(50_000);

    fn load(connections: usize, requests: u64) -> Load {
        Load {
            connections,
            requests,
        }
    }

    #[test]
    fn an_idle_process_never_trims() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!((0..10).all(|_| !policy.tick(load(0, 0), GROWN)));
    }

    #[test]
    fn requests_before_the_timer_started_do_not_count() {
        let mut policy = TrimPolicy::new(load(0, 5_000), Some(10_000));
        assert!(!policy.tick(load(0, 5_000), GROWN));
    }

    #[test]
    fn a_burst_trims_once_on_its_way_down() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(2_000, 2_000), GROWN), "at the peak");
        assert!(!policy.tick(load(1_500, 3_500), GROWN), "not yet half");
        assert!(policy.tick(load(0, 3_500), GROWN), "fallen");
        assert!(
            !policy.tick(load(0, 3_500), GROWN),
            "nothing since the trim"
        );
        assert!(!policy.tick(load(0, 3_500), GROWN));
    }

    #[test]
    fn a_connection_left_open_after_its_request_trims_once() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(1, 1), GROWN));
        assert!(policy.tick(load(1, 1), GROWN));
        assert!((0..10).all(|_| !policy.tick(load(1, 1), GROWN)));
    }

    #[test]
    fn a_steady_load_does_not_trim() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(32, 1_000), GROWN));
        assert!((2..20).all(|tick| !policy.tick(load(32, tick * 1_000), GROWN)));
    }

    #[test]
    fn fewer_requests_per_tick_on_the_same_connections_trim() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(4, 10_000), GROWN));
        assert!(
            policy.tick(load(4, 10_100), GROWN),
            "100 a tick, down from 10,000"
        );
    }

    #[test]
    fn after_a_trim_the_next_burst_is_measured_from_where_the_load_was() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(100, 100), GROWN));
        assert!(policy.tick(load(10, 110), GROWN));
        assert!(
            !policy.tick(load(10, 120), GROWN),
            "the same low load: no second trim"
        );
        assert!(!policy.tick(load(400, 520), GROWN));
        assert!(policy.tick(load(0, 520), GROWN));
    }

    #[test]
    fn a_fall_in_load_without_growth_does_not_trim() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(1, 1), Some(10_100)));
        assert!(
            !policy.tick(load(0, 1), Some(11_000)),
            "1 MB grown: not worth it"
        );
        assert!(!policy.tick(load(1, 2), Some(16_000)));
        assert!(
            policy.tick(load(0, 2), Some(16_000)),
            "6 MB grown, load fell"
        );
    }

    #[test]
    fn a_fall_seen_before_the_growth_still_counts_once_memory_grew() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(16, 16), Some(12_000)));
        assert!(
            !policy.tick(load(4, 32), Some(13_000)),
            "fallen, not grown yet"
        );
        assert!(
            !policy.tick(load(12, 48), Some(18_000)),
            "grown, load above half the peak"
        );
        assert!(policy.tick(load(0, 48), Some(18_000)));
    }

    #[test]
    fn growth_is_measured_from_what_the_last_trim_left() {
        let mut policy = TrimPolicy::new(load(0, 0), Some(10_000));
        assert!(!policy.tick(load(100, 100), Some(60_000)));
        assert!(policy.tick(load(0, 100), Some(60_000)));
        policy.trimmed(Some(20_000));
        assert!(!policy.tick(load(50, 150), Some(22_000)));
        assert!(
            !policy.tick(load(0, 150), Some(22_000)),
            "2 MB over the trim's 20"
        );
        assert!(!policy.tick(load(50, 200), Some(26_000)));
        assert!(policy.tick(load(0, 200), Some(26_000)));
    }

    #[test]
    fn unknown_resident_memory_trims_on_the_fall_alone() {
        let mut policy = TrimPolicy::new(load(0, 0), None);
        assert!(!policy.tick(load(10, 10), None));
        assert!(policy.tick(load(0, 10), None));
    }

    #[test]
    fn resident_memory_is_read() {
        assert!(resident_kb().is_some_and(|kb| kb > 0));
    }
}
