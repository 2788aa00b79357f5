//! Giving the heap a burst freed back to the OS. glibc's `free` returns only the top of
//! the heap, so what a burst of large bodies or thousands of connections freed stays
//! resident (42.7 MB after 2,000 idle connections closed, 33.4 MB after a burst that
//! peaked there; `bench/results/throughput-2026-11-25b.md`). `malloc_trim(0)` also
//! releases the free pages inside the heap, but it walks every arena's free chunks with
//! the arena locked, so it runs from a low-frequency timer, off the runtime's threads,
//! and only when the load has fallen since the last trim: never per request.

use std::time::Duration;

/// What the timer reads on each tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    /// Client connections open now.
    pub(crate) connections: usize,
    /// Requests received since the start (`compaction_proxy_requests_total`).
    pub(crate) requests: u64,
}

/// Decides, tick by tick, whether a trim is worth it now: the load has fallen to at most
/// half of its peak since the last trim, in open connections or in requests per tick. A
/// steady load never trims (it reuses what it freed), an idle one neither; a burst trims
/// once, on its way down. At most one trim per tick, however the load swings.
#[derive(Debug, Default)]
pub(crate) struct TrimPolicy {
    requests_seen: u64,
    peak_connections: usize,
    peak_requests_per_tick: u64,
}

impl TrimPolicy {
    /// Starts from the load at the timer's start, so requests before it do not count.
    pub(crate) fn new(load: Load) -> Self {
        Self {
            requests_seen: load.requests,
            ..Self::default()
        }
    }

    /// The load at this tick; true means trim now (the peaks then start again).
    pub(crate) fn tick(&mut self, load: Load) -> bool {
        let requests = load.requests.saturating_sub(self.requests_seen);
        self.requests_seen = load.requests;
        self.peak_connections = self.peak_connections.max(load.connections);
        self.peak_requests_per_tick = self.peak_requests_per_tick.max(requests);
        let fell = |now: u64, peak: u64| peak > 0 && now.saturating_mul(2) <= peak;
        let trim = fell(load.connections as u64, self.peak_connections as u64)
            || fell(requests, self.peak_requests_per_tick);
        if trim {
            self.peak_connections = load.connections;
            self.peak_requests_per_tick = requests;
            return true;
        }
        false
    }
}

/// Ticks every `every` for the server's life, reading the `load` and trimming when
/// [`TrimPolicy`] says so; `trimmed` hears of each trim.
pub(crate) async fn run(
    every: Duration,
    load: impl Fn() -> Load + Send,
    trimmed: impl Fn() + Send,
) {
    let mut policy = TrimPolicy::new(load());
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !policy.tick(load()) {
            continue;
        }
        // On the blocking pool: on a 40 MB heap the walk took 1 ms with nothing left to
        // return and 10-12 ms returning 20 MB (madvise per free chunk), which a
        // single-threaded runtime's connections should not wait for.
        let started = std::time::Instant::now();
        if tokio::task::spawn_blocking(trim).await.is_ok() {
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

    fn load(connections: usize, requests: u64) -> Load {
        Load {
            connections,
            requests,
        }
    }

    #[test]
    fn an_idle_process_never_trims() {
        let mut policy = TrimPolicy::new(load(0, 0));
        assert!((0..10).all(|_| !policy.tick(load(0, 0))));
    }

    #[test]
    fn requests_before_the_timer_started_do_not_count() {
        let mut policy = TrimPolicy::new(load(0, 5_000));
        assert!(!policy.tick(load(0, 5_000)));
    }

    #[test]
    fn a_burst_trims_once_on_its_way_down() {
        let mut policy = TrimPolicy::new(load(0, 0));
        assert!(!policy.tick(load(2_000, 2_000)), "at the peak");
        assert!(!policy.tick(load(1_500, 3_500)), "not yet half");
        assert!(policy.tick(load(0, 3_500)), "fallen");
        assert!(!policy.tick(load(0, 3_500)), "nothing since the trim");
        assert!(!policy.tick(load(0, 3_500)));
    }

    #[test]
    fn a_connection_left_open_after_its_request_trims_once() {
        let mut policy = TrimPolicy::new(load(0, 0));
        assert!(!policy.tick(load(1, 1)));
        assert!(policy.tick(load(1, 1)));
        assert!((0..10).all(|_| !policy.tick(load(1, 1))));
    }

    #[test]
    fn a_steady_load_does_not_trim() {
        let mut policy = TrimPolicy::new(load(0, 0));
        assert!(!policy.tick(load(32, 1_000)));
        assert!((2..20).all(|tick| !policy.tick(load(32, tick * 1_000))));
    }

    #[test]
    fn fewer_requests_per_tick_on_the_same_connections_trim() {
        let mut policy = TrimPolicy::new(load(0, 0));
        assert!(!policy.tick(load(4, 10_000)));
        assert!(policy.tick(load(4, 10_100)), "100 a tick, down from 10,000");
    }

    #[test]
    fn after_a_trim_the_next_burst_is_measured_from_where_the_load_was() {
        let mut policy = TrimPolicy::new(load(0, 0));
        assert!(!policy.tick(load(100, 100)));
        assert!(policy.tick(load(10, 110)));
        assert!(
            !policy.tick(load(10, 120)),
            "the same low load: no second trim"
        );
        assert!(!policy.tick(load(400, 520)));
        assert!(policy.tick(load(0, 520)));
    }
}
