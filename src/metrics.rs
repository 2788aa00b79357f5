//! Counters exposed at `GET /metrics` in the Prometheus text format. Plain atomics: the
//! request path pays one relaxed increment per event and nothing else.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    upstream_attempts: AtomicU64,
}

impl Metrics {
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upstream_attempt(&self) {
        self.upstream_attempts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::with_capacity(512);
        counter(
            &mut out,
            "compaction_proxy_requests_total",
            "Requests received from clients, all routes.",
            self.requests.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "compaction_proxy_upstream_attempts_total",
            "Requests sent to the upstream, retries included.",
            self.upstream_attempts.load(Ordering::Relaxed),
        );
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_counters() {
        let metrics = Metrics::default();
        metrics.request();
        metrics.request();
        metrics.upstream_attempt();
        let text = metrics.render();
        assert!(text.contains(
            "# TYPE compaction_proxy_requests_total counter\ncompaction_proxy_requests_total 2\n"
        ));
        assert!(text.contains("compaction_proxy_upstream_attempts_total 1\n"));
    }
}
