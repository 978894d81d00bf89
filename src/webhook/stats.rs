//! Webhook delivery figures: counters by outcome and a latency histogram, written by every
//! delivery thread and by every worker that submits (so they are `metrics`' [`Counter`]s and
//! [`Histogram`], atomic adds), rendered in the Prometheus text format under the
//! `walletrelay_webhook_` prefix.
//!
//! This module only counts; it decides nothing about delivery.
//!
//! Every call accepted by `WebhookPool::submit`  (`queued`) ends
//! in exactly one of `succeeded`, `failed{reason}` or `dropped{reason="retry_queue_full" |
//! "ssrf" | "shutdown"}`; calls refused at submit are `dropped{reason="queue_full"}` (or
//! `"shutdown"` once the pool is stopping) and never queued.

use crate::metrics::{family, labelled, single, Bounds, Counter, Histogram, Kind};

/// Why a call was given up after it was sent at least once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailReason {
    /// The try did not finish within the per-try timeout.
    Timeout,
    /// TCP connect failed (refused, unreachable, reset while connecting).
    Connect,
    /// The host name did not resolve.
    Dns,
    /// The connection broke while sending or receiving.
    Io,
    /// The receiver answered 5xx on the last try.
    Status5xx,
    /// The receiver answered 4xx (final, never retried).
    Status4xx,
    /// The receiver answered 3xx (redirects are not followed).
    Redirect,
    /// The receiver answered another status (1xx that ended the exchange, or >= 600).
    StatusOther,
    /// TLS handshake or certificate failure (final).
    Tls,
    /// The receiver's answer was not valid HTTP/1.1 (final).
    Protocol,
    /// The webhook address cannot be requested (final; validation should prevent it).
    BadUrl,
    /// Anything else the client reported (final).
    Other,
}

impl FailReason {
    pub(crate) const ALL: [FailReason; 12] = [
        FailReason::Timeout,
        FailReason::Connect,
        FailReason::Dns,
        FailReason::Io,
        FailReason::Status5xx,
        FailReason::Status4xx,
        FailReason::Redirect,
        FailReason::StatusOther,
        FailReason::Tls,
        FailReason::Protocol,
        FailReason::BadUrl,
        FailReason::Other,
    ];

    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            FailReason::Timeout => "timeout",
            FailReason::Connect => "connect",
            FailReason::Dns => "dns",
            FailReason::Io => "io",
            FailReason::Status5xx => "status_5xx",
            FailReason::Status4xx => "status_4xx",
            FailReason::Redirect => "redirect",
            FailReason::StatusOther => "status_other",
            FailReason::Tls => "tls",
            FailReason::Protocol => "protocol",
            FailReason::BadUrl => "bad_url",
            FailReason::Other => "other",
        }
    }

    /// Whether another try may help: connection trouble, timeouts and 5xx.
    pub(crate) fn retryable(self) -> bool {
        matches!(
            self,
            FailReason::Timeout
                | FailReason::Connect
                | FailReason::Dns
                | FailReason::Io
                | FailReason::Status5xx
        )
    }
}

/// Why a call was not (or no longer) attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// The delivery queue was full at submit: the call was never queued.
    QueueFull,
    /// A retry could not be queued (delay queue or delivery queue full).
    RetryQueueFull,
    /// Every address of the webhook's host is loopback, private, link-local, multicast...
    Ssrf,
    /// The pool was shutting down.
    Shutdown,
}

impl DropReason {
    pub(crate) const ALL: [DropReason; 4] = [
        DropReason::QueueFull,
        DropReason::RetryQueueFull,
        DropReason::Ssrf,
        DropReason::Shutdown,
    ];

    /// The `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::RetryQueueFull => "retry_queue_full",
            DropReason::Ssrf => "ssrf",
            DropReason::Shutdown => "shutdown",
        }
    }
}

/// Upper bounds of the latency histogram's buckets (5 ms to 10 s); `+Inf` is implied.
#[derive(Debug)]
pub(crate) struct LatencyBuckets;

impl Bounds for LatencyBuckets {
    const US: &'static [u64] = &[
        5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
        10_000_000,
    ];
}

/// All webhook figures of one pool.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Calls accepted into the delivery queue by `submit`.
    pub(crate) queued: Counter,
    /// HTTP tries made (first tries and retries).
    pub(crate) sent: Counter,
    /// Calls answered 2xx.
    pub(crate) succeeded: Counter,
    /// Calls given up after their last try, by the reason of that try.
    pub(crate) failed: [Counter; FailReason::ALL.len()],
    /// Retries scheduled.
    pub(crate) retried: Counter,
    /// Calls not attempted (or no longer), by reason.
    pub(crate) dropped: [Counter; DropReason::ALL.len()],
    /// Registrations reported gone (failing every try for the give-up period).
    pub(crate) gone: Counter,
    /// Latency of each try (resolve, connect, request, response head and body).
    pub(crate) latency: Histogram<LatencyBuckets>,
}

impl Stats {
    /// Counts a call given up.
    pub(crate) fn fail(&self, why: FailReason) {
        self.failed[why as usize].inc();
    }

    /// Counts a call dropped.
    pub(crate) fn drop(&self, why: DropReason) {
        self.dropped[why as usize].inc();
    }

    /// Renders the figures; `queue_depth` and `retry_pending` are gauges read by the caller.
    pub(crate) fn render(&self, queue_depth: usize, retry_pending: usize, out: &mut String) {
        let counters: [(&str, &str, &Counter); 5] = [
            (
                "queued_total",
                "Webhook calls accepted into the delivery queue.",
                &self.queued,
            ),
            (
                "sent_total",
                "Webhook HTTP tries made (first tries and retries).",
                &self.sent,
            ),
            (
                "succeeded_total",
                "Webhook calls answered 2xx.",
                &self.succeeded,
            ),
            ("retried_total", "Webhook retries scheduled.", &self.retried),
            (
                "gone_total",
                "Webhook registrations given up after failing every try for the give-up period.",
                &self.gone,
            ),
        ];
        for (name, help, c) in counters {
            let name = format_args!("walletrelay_webhook_{name}");
            single(out, name, Kind::Counter, help, c.get());
        }
        let failed = FailReason::ALL.map(|r| (r.label(), self.failed[r as usize].get()));
        let head = (
            "walletrelay_webhook_failed_total",
            Kind::Counter,
            "Webhook calls given up after their last try, by reason.",
        );
        labelled(out, head, "reason", failed);
        let dropped = DropReason::ALL.map(|r| (r.label(), self.dropped[r as usize].get()));
        let head = (
            "walletrelay_webhook_dropped_total",
            Kind::Counter,
            "Webhook calls not attempted, by reason.",
        );
        labelled(out, head, "reason", dropped);
        let gauges: [(&str, &str, usize); 2] = [
            (
                "queue_depth",
                "Webhook calls waiting in the delivery queue.",
                queue_depth,
            ),
            (
                "retry_pending",
                "Webhook retries waiting for their backoff.",
                retry_pending,
            ),
        ];
        for (name, help, v) in gauges {
            let name = format_args!("walletrelay_webhook_{name}");
            single(out, name, Kind::Gauge, help, v);
        }
        let name = "walletrelay_webhook_latency_seconds";
        family(
            out,
            name,
            Kind::Histogram,
            "Duration of each webhook HTTP try.",
        );
        self.latency.render(out, name, "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_count_matches() {
        let s = Stats::default();
        s.latency.observe(Duration::from_millis(1));
        s.latency.observe(Duration::from_millis(30));
        s.latency.observe(Duration::from_millis(30));
        s.latency.observe(Duration::from_secs(60));
        let mut out = String::new();
        s.render(0, 0, &mut out);
        let b = |le: &str| {
            value(
                &out,
                &format!("walletrelay_webhook_latency_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(b("0.005"), Some(1.0));
        assert_eq!(b("0.025"), Some(1.0));
        assert_eq!(b("0.05"), Some(3.0));
        assert_eq!(b("10"), Some(3.0));
        assert_eq!(b("+Inf"), Some(4.0));
        assert_eq!(
            value(&out, "walletrelay_webhook_latency_seconds_count"),
            Some(4.0)
        );
        let sum = value(&out, "walletrelay_webhook_latency_seconds_sum").unwrap_or(0.0);
        assert!((sum - 60.061).abs() < 1e-6, "{sum}");
    }

    #[test]
    fn every_reason_is_rendered() {
        let s = Stats::default();
        s.drop(DropReason::QueueFull);
        s.drop(DropReason::QueueFull);
        s.fail(FailReason::Status4xx);
        let mut out = String::new();
        s.render(3, 1, &mut out);
        assert_eq!(
            value(
                &out,
                "walletrelay_webhook_dropped_total{reason=\"queue_full\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            value(&out, "walletrelay_webhook_dropped_total{reason=\"ssrf\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(
                &out,
                "walletrelay_webhook_failed_total{reason=\"status_4xx\"}"
            ),
            Some(1.0)
        );
        assert_eq!(value(&out, "walletrelay_webhook_queue_depth"), Some(3.0));
        for r in FailReason::ALL {
            assert!(out.contains(&format!("failed_total{{reason=\"{}\"}}", r.label())));
        }
        // Every sample line belongs to a declared family.
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("walletrelay_webhook_"), "{line}");
        }
    }
}
