//! Gate-wide and per-session figures, and their Prometheus rendering.
//!
//! Counters live per shard (each shard on its own cache line) and are
//! bumped under the shard lock the operation already holds, so counting
//! adds no lock. A snapshot sums the shards without taking any lock: each
//! figure is exact, the set of figures is not one atomic instant.

use std::fmt::Write as _;
use std::time::Duration;

use super::probe_answer::ProbeAnswer;
use crate::core::reason::Reason;
use crate::core::working_set::WorkingSetStats;
use crate::sync::{AtomicU64, Ordering};

/// One relaxed counter or gauge, read without any lock.
///
/// Nearly every counter is only ever written under its shard's lock: those
/// use [`Counter::add_locked`] / [`Counter::sub_locked`], a plain load and
/// store. The lock already orders the writers, so a locked read-modify-write
/// (`lock xadd` on x86, a full barrier) would buy nothing; the open path
/// bumps eight of them per acquire + release. A counter also written
/// without the lock (only `closed`) must use [`Counter::add`] everywhere.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// For a counter also written outside its shard's lock.
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The caller holds this counter's shard lock (as every writer does).
    pub(crate) fn add_locked(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// The caller holds this counter's shard lock (as every writer does).
    pub(crate) fn sub_locked(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_sub(n),
            Ordering::Relaxed,
        );
    }

    /// Raises a gauge to `n` if it is lower; the caller holds this
    /// counter's shard lock (as every writer does).
    pub(crate) fn raise_locked(&self, n: u64) {
        if n > self.0.load(Ordering::Relaxed) {
            self.0.store(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A probe answer to count.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Probed {
    Usage(ProbeAnswer),
    Prefix(ProbeAnswer),
}

/// What one shard counts. Every field is written only under the shard's
/// lock, except `closed` (see [`Counter`]). Gauges (marked) go up and down.
#[derive(Debug, Default)]
pub(crate) struct ShardCounters {
    pub(crate) attempts: Counter,
    pub(crate) admissions: [Counter; Reason::ALL.len()],
    pub(crate) waits: Counter,
    pub(crate) wait_ns: Counter,
    /// Gauge: the longest `wait_ns` of one attempt (only ever raised).
    pub(crate) longest_wait_ns: Counter,
    pub(crate) preempted: Counter,
    pub(crate) timed_out: Counter,
    pub(crate) cancelled: Counter,
    pub(crate) closed: Counter,
    pub(crate) usage_probes: Counter,
    pub(crate) usage_unavailable: Counter,
    pub(crate) usage_invalid: Counter,
    pub(crate) prefix_probes: Counter,
    pub(crate) prefix_unavailable: Counter,
    pub(crate) prefix_invalid: Counter,
    pub(crate) grace_expired: Counter,
    pub(crate) sessions_finished: Counter,
    pub(crate) sessions_retired: Counter,
    pub(crate) releases: Counter,
    /// Gauge.
    pub(crate) active_leases: Counter,
    /// Gauge.
    pub(crate) pending_attempts: Counter,
    /// Gauge.
    pub(crate) reserved_in_flight: Counter,
    /// Gauge.
    pub(crate) reserved_in_grace: Counter,
    /// Gauge.
    pub(crate) tracked_sessions: Counter,
}

impl ShardCounters {
    /// Counts one probe call and its answer; the caller holds the shard lock.
    pub(crate) fn count_probe(&self, probed: Probed) {
        let (calls, unavailable, invalid, answer) = match probed {
            Probed::Usage(a) => (
                &self.usage_probes,
                &self.usage_unavailable,
                &self.usage_invalid,
                a,
            ),
            Probed::Prefix(a) => (
                &self.prefix_probes,
                &self.prefix_unavailable,
                &self.prefix_invalid,
                a,
            ),
        };
        calls.add_locked(1);
        match answer {
            ProbeAnswer::Value(_) => {}
            ProbeAnswer::Unavailable => unavailable.add_locked(1),
            ProbeAnswer::Invalid => {
                unavailable.add_locked(1);
                invalid.add_locked(1);
            }
        }
    }

    pub(crate) fn add_into(&self, s: &mut GateStats) {
        for (total, c) in s.admissions_by_reason.iter_mut().zip(&self.admissions) {
            *total += c.get();
        }
        s.attempts += self.attempts.get();
        s.waits += self.waits.get();
        s.wait_time += Duration::from_nanos(self.wait_ns.get());
        s.longest_wait = s
            .longest_wait
            .max(Duration::from_nanos(self.longest_wait_ns.get()));
        s.preempted += self.preempted.get();
        s.timed_out += self.timed_out.get();
        s.cancelled += self.cancelled.get();
        s.closed += self.closed.get();
        s.usage_probe_calls += self.usage_probes.get();
        s.usage_probe_unavailable += self.usage_unavailable.get();
        s.usage_probe_invalid += self.usage_invalid.get();
        s.prefix_probe_calls += self.prefix_probes.get();
        s.prefix_probe_unavailable += self.prefix_unavailable.get();
        s.prefix_probe_invalid += self.prefix_invalid.get();
        s.grace_expired += self.grace_expired.get();
        s.sessions_finished += self.sessions_finished.get();
        s.sessions_retired += self.sessions_retired.get();
        s.releases += self.releases.get();
        s.active_leases += self.active_leases.get();
        s.pending_attempts += self.pending_attempts.get();
        s.reserved_in_flight += self.reserved_in_flight.get();
        s.reserved_in_grace += self.reserved_in_grace.get();
        s.tracked_sessions += self.tracked_sessions.get();
    }
}

/// A snapshot of the gate's figures. Counters only grow; gauges are marked.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct GateStats {
    /// Admissions per [`Reason`], indexed by `Reason as usize`.
    pub admissions_by_reason: [u64; Reason::ALL.len()],
    /// Attempts begun (every `acquire` that was not refused as closed).
    pub attempts: u64,
    /// Attempts that slept at least once before they ended.
    pub waits: u64,
    /// Total time, from start to end, of the attempts counted in `waits`.
    pub wait_time: Duration,
    /// Gauge: the longest time, start to end, of one attempt counted in
    /// `waits` (granted or not), since the gate was created. An attempt
    /// still waiting counts once it ends.
    pub longest_wait: Duration,
    /// Attempts preempted by a newer attempt of their session.
    pub preempted: u64,
    /// Attempts whose timeout passed.
    pub timed_out: u64,
    /// Attempts cancelled by the host.
    pub cancelled: u64,
    /// Attempts ended or refused because the gate was closed.
    pub closed: u64,
    /// Usage probe calls.
    pub usage_probe_calls: u64,
    /// Usage probe answers that were unavailable (including invalid ones).
    pub usage_probe_unavailable: u64,
    /// Usage probe answers that were NaN, infinite or outside `[0, 1]`.
    pub usage_probe_invalid: u64,
    /// Prefix probe calls.
    pub prefix_probe_calls: u64,
    /// Prefix probe answers that were unavailable (including invalid ones).
    pub prefix_probe_unavailable: u64,
    /// Prefix probe answers that were NaN, infinite or outside `[0, 1]`.
    pub prefix_probe_invalid: u64,
    /// Grace windows that ended by expiry.
    pub grace_expired: u64,
    /// `finish_session` calls that found the session.
    pub sessions_finished: u64,
    /// Records dropped after the retention period.
    pub sessions_retired: u64,
    /// Leases released.
    pub releases: u64,
    /// Gauge: leases held.
    pub active_leases: u64,
    /// Gauge: attempts begun and not yet ended (probing or waiting).
    pub pending_attempts: u64,
    /// Gauge: attempts asleep waiting for admission.
    pub waiting_attempts: u64,
    /// Gauge: sessions whose reservation is held by an in-flight request.
    pub reserved_in_flight: u64,
    /// Gauge: sessions in their idle grace window.
    pub reserved_in_grace: u64,
    /// Gauge: session records kept.
    pub tracked_sessions: u64,
    /// Working-set admission's gauges (all zero in reference mode).
    pub working_set: WorkingSetStats,
}

impl GateStats {
    /// Admissions for one reason.
    pub fn admissions(&self, reason: Reason) -> u64 {
        self.admissions_by_reason[reason.index()]
    }

    /// All admissions (equals the number of leases ever issued).
    pub fn total_admissions(&self) -> u64 {
        self.admissions_by_reason.iter().sum()
    }

    /// Prometheus text exposition (format 0.0.4) of every figure.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
            let _ = writeln!(out, "# HELP kvgate_{name} {help}");
            let _ = writeln!(out, "# TYPE kvgate_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "kvgate_{name}{labels} {value}");
            }
        };
        let by_reason: Vec<(String, f64)> = Reason::ALL
            .iter()
            .map(|r| {
                (
                    format!("{{reason=\"{}\"}}", r.as_str()),
                    self.admissions(*r) as f64,
                )
            })
            .collect();
        let by_reason: Vec<(&str, f64)> = by_reason.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        family(
            "admissions_total",
            "counter",
            "Admissions by the reason the gate admitted them.",
            &by_reason,
        );
        let endings = [
            ("{outcome=\"preempted\"}", self.preempted as f64),
            ("{outcome=\"timed_out\"}", self.timed_out as f64),
            ("{outcome=\"cancelled\"}", self.cancelled as f64),
            ("{outcome=\"closed\"}", self.closed as f64),
        ];
        family(
            "attempts_failed_total",
            "counter",
            "Attempts that ended without a lease, by outcome.",
            &endings,
        );
        let probes = [
            ("{probe=\"usage\"}", self.usage_probe_calls as f64),
            ("{probe=\"prefix\"}", self.prefix_probe_calls as f64),
        ];
        family("probe_calls_total", "counter", "Probe calls.", &probes);
        let unavailable = [
            ("{probe=\"usage\"}", self.usage_probe_unavailable as f64),
            ("{probe=\"prefix\"}", self.prefix_probe_unavailable as f64),
        ];
        family(
            "probe_unavailable_total",
            "counter",
            "Probe answers that were unavailable, invalid ones included.",
            &unavailable,
        );
        let invalid = [
            ("{probe=\"usage\"}", self.usage_probe_invalid as f64),
            ("{probe=\"prefix\"}", self.prefix_probe_invalid as f64),
        ];
        family(
            "probe_invalid_total",
            "counter",
            "Probe answers that were NaN, infinite or outside [0, 1].",
            &invalid,
        );
        let scalars: [(&str, &str, &str, f64); 15] = [
            (
                "attempts_total",
                "counter",
                "Attempts begun.",
                self.attempts as f64,
            ),
            (
                "waits_total",
                "counter",
                "Attempts that waited at least once.",
                self.waits as f64,
            ),
            (
                "wait_seconds_total",
                "counter",
                "Time spent in acquire by attempts that waited.",
                self.wait_time.as_secs_f64(),
            ),
            (
                "longest_wait_seconds",
                "gauge",
                "Longest time one attempt that waited spent in acquire (since the gate was created).",
                self.longest_wait.as_secs_f64(),
            ),
            (
                "releases_total",
                "counter",
                "Leases released.",
                self.releases as f64,
            ),
            (
                "grace_expired_total",
                "counter",
                "Grace windows that expired.",
                self.grace_expired as f64,
            ),
            (
                "sessions_finished_total",
                "counter",
                "finish_session calls that found the session.",
                self.sessions_finished as f64,
            ),
            (
                "sessions_retired_total",
                "counter",
                "Idle session records dropped after the retention period.",
                self.sessions_retired as f64,
            ),
            (
                "active_leases",
                "gauge",
                "Leases held.",
                self.active_leases as f64,
            ),
            (
                "pending_attempts",
                "gauge",
                "Attempts begun and not yet ended.",
                self.pending_attempts as f64,
            ),
            (
                "waiting_attempts",
                "gauge",
                "Attempts asleep waiting for admission.",
                self.waiting_attempts as f64,
            ),
            (
                "reserved_in_flight",
                "gauge",
                "Sessions whose reservation is held by an in-flight request (reference mode).",
                self.reserved_in_flight as f64,
            ),
            (
                "reserved_in_grace",
                "gauge",
                "Sessions in their idle grace window (reference mode).",
                self.reserved_in_grace as f64,
            ),
            (
                "tracked_sessions",
                "gauge",
                "Session records kept.",
                self.tracked_sessions as f64,
            ),
            (
                "admissions_all_total",
                "counter",
                "Admissions of any reason (leases issued).",
                self.total_admissions() as f64,
            ),
        ];
        for (name, kind, help, value) in scalars {
            family(name, kind, help, &[("", value)]);
        }
        let w = &self.working_set;
        let working_set: [(&str, &str, &str, f64); 14] = [
            (
                "working_set_sessions",
                "gauge",
                "Sessions in the working set (in flight or within their window).",
                w.members as f64,
            ),
            (
                "working_set_waiting_sessions",
                "gauge",
                "Sessions queued to join the working set.",
                w.waiting as f64,
            ),
            (
                "working_set_tokens",
                "gauge",
                "KV tokens the working set is counted to hold (shared prefix once, ghosts included).",
                w.load_tokens as f64,
            ),
            (
                "working_set_capacity_tokens",
                "gauge",
                "KV capacity in force, tokens (0 while unknown).",
                w.capacity_tokens as f64,
            ),
            (
                "working_set_shared_prefix_tokens",
                "gauge",
                "Prefix shared by sessions, counted once, tokens.",
                w.shared_prefix_tokens as f64,
            ),
            (
                "working_set_window_seconds",
                "gauge",
                "How long a member keeps its place between turns (the engine's cache refill time).",
                w.window_ns as f64 / 1e9,
            ),
            (
                "working_set_rebuild_seconds_per_token",
                "gauge",
                "What re-prefilling costs the engine per token, seconds: the inverse of the prefill rate the engine measures, else the host's told term (0 while neither is known).",
                w.rebuild_secs_per_token,
            ),
            (
                "working_set_rebuild_seconds_per_pair",
                "gauge",
                "What re-prefilling costs the engine per attended query-key pair, seconds: told by the host, else learned from the turns (0: priced linearly).",
                w.rebuild_secs_per_pair,
            ),
            (
                "working_set_parked_total",
                "counter",
                "Members parked because the working set outgrew the cache, or for a waiter past the wait bound.",
                w.parked as f64,
            ),
            (
                "working_set_holding",
                "gauge",
                "1 while holding sessions out pays (cold turns would not serve clearly more), else 0: nobody waits for room.",
                f64::from(u8::from(w.holding)),
            ),
            (
                "working_set_horizon_turns",
                "gauge",
                "How many turns ahead a joining session must still fit beside the members (the turns a session runs in a refill window).",
                f64::from(w.horizon_turns),
            ),
            (
                "working_set_tier_tokens",
                "gauge",
                "The engine's host tier of KV (offloaded to host memory), tokens (0: none told).",
                w.tier_tokens as f64,
            ),
            (
                "refused_answers_total",
                "counter",
                "Engine answers and turn reports whose tier figures were refused (each kept what was known).",
                w.refused_answers as f64,
            ),
            (
                "tier_cached_tokens_total",
                "counter",
                "Cached tokens that turn reports said the host tier served.",
                w.tier_cached_tokens as f64,
            ),
        ];
        for (name, kind, help, value) in working_set {
            family(name, kind, help, &[("", value)]);
        }
        out
    }
}

/// A session's reservation, as reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReservationState {
    /// The session owns no reservation.
    #[default]
    None,
    /// Held by in-flight requests: `leases` retaining leases are out.
    InFlight {
        /// Retaining leases currently held.
        leases: u32,
    },
    /// Idle grace window, ending `remaining` from the snapshot's time.
    Grace {
        /// Time left in the window.
        remaining: Duration,
    },
}

/// A snapshot of one session's figures. Grows (new figures are new
/// fields): build one from `Default` if you must.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionStats {
    /// Attempts of this session preempted by a newer attempt (admission
    /// preemptions only; the engine's own preemptions are not mixed in).
    pub num_preempted: u64,
    /// Attempts begun.
    pub attempts: u64,
    /// Attempts admitted.
    pub admissions: u64,
    /// Attempts that slept at least once.
    pub waits: u64,
    /// Total time in acquire of the attempts counted in `waits`.
    pub wait_time: Duration,
    /// Attempts whose timeout passed.
    pub timed_out: u64,
    /// Attempts cancelled by the host.
    pub cancelled: u64,
    /// Leases of this session currently held.
    pub active_leases: u32,
    /// Whether an attempt of this session is competing for admission now.
    pub attempt_pending: bool,
    /// The session's reservation (reference mode; always
    /// [`ReservationState::None`] in working-set mode, where a lease holds
    /// the session's working-set place instead).
    pub reservation: ReservationState,
    /// Prompt length of the newest admitted attempt.
    pub last_admitted_prompt_len: usize,
    /// Time since the session was last active (began, was admitted, released).
    pub idle_for: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_every_reason_and_gauge() {
        let mut s = GateStats::default();
        s.admissions_by_reason[Reason::ResidentPrefix as usize] = 7;
        s.waiting_attempts = 3;
        let text = s.to_prometheus();
        assert!(text.contains("kvgate_admissions_total{reason=\"resident_prefix\"} 7\n"));
        assert!(text.contains("kvgate_admissions_total{reason=\"open\"} 0\n"));
        assert!(text.contains("# TYPE kvgate_waiting_attempts gauge\nkvgate_waiting_attempts 3\n"));
        // Every sample line is `name{labels} value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
            assert!(line.starts_with("kvgate_"), "{line}");
        }
    }
}
