//! The seed's admission table (`reference` mode) and the sessions'
//! reservations it keeps ([`Table`]). A driver reaches a reference
//! decision through [`decide`] alone; the working set's rules are in
//! `working_set`.
//!
//! ```text
//! usage unavailable or < high_watermark ─────────────▶ admit "open"
//! usage ≥ high_watermark
//!   ├─ session owns a reservation ───────────────────▶ admit "reserved_session"
//!   ├─ prefix probe unavailable ─────────────────────▶ admit "prefix_probe_unavailable"
//!   ├─ hit_ratio ≥ hit_threshold ────────────────────▶ admit "resident_prefix"
//!   └─ otherwise ─────────────────────────────────────▶ wait, then start over
//! ```

use super::probe_answer::ProbeAnswer;
use super::reason::Reason;
use super::sessions::{Expiry, Reservation, SessionRecord, SessionTable};
use super::stats::ShardCounters;
use super::timers::{TimerQueue, NEVER};
use super::waiters::Waiters;

/// The two thresholds the table compares against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Thresholds {
    pub(crate) high_watermark: f64,
    pub(crate) hit_threshold: f64,
}

/// What one pass of an attempt knows so far. `None` means "not asked yet".
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Facts {
    pub(crate) usage: Option<ProbeAnswer>,
    pub(crate) reserved: bool,
    pub(crate) prefix: Option<ProbeAnswer>,
}

/// What the table says to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    AskUsage,
    AskPrefix,
    Admit(Reason),
    Wait,
}

/// The admission table. Pure: no clock, no probe, no lock.
pub(crate) fn decide(t: Thresholds, facts: Facts) -> Decision {
    let usage = match facts.usage {
        None => return Decision::AskUsage,
        Some(answer) => answer.value(),
    };
    // `>=`: usage equal to the watermark is pressure, as in the reference.
    let under_pressure = matches!(usage, Some(u) if u >= t.high_watermark);
    if !under_pressure {
        return Decision::Admit(Reason::Open);
    }
    if facts.reserved {
        return Decision::Admit(Reason::ReservedSession);
    }
    match facts.prefix {
        None => Decision::AskPrefix,
        Some(answer) => match answer.value() {
            None => Decision::Admit(Reason::PrefixProbeUnavailable),
            Some(hit) if hit >= t.hit_threshold => Decision::Admit(Reason::ResidentPrefix),
            Some(_) => Decision::Wait,
        },
    }
}

/// The seed's table as a core runs it: its thresholds, and the sessions'
/// reservations with their grace windows. A reservation lives in its
/// session's record (under its shard's lock, like every figure of the
/// session) and is transitioned here alone, by the rows of
/// [`Reservation`]'s state table; the grace timers are this table's.
#[derive(Debug)]
pub(crate) struct Table {
    thresholds: Thresholds,
    grace_ns: u64,
    timers: TimerQueue,
}

impl Table {
    pub(crate) fn new(thresholds: Thresholds, grace_ns: u64) -> Self {
        Self {
            thresholds,
            grace_ns,
            timers: TimerQueue::new(),
        }
    }

    /// The table's decision on a pass's `facts` and `record`'s reservation.
    #[inline]
    pub(crate) fn decide(&self, record: &SessionRecord, facts: Facts, now: u64) -> Decision {
        let reserved = record.reservation.held_at(now);
        decide(self.thresholds, Facts { reserved, ..facts })
    }

    /// An admission for `reason` granted to `record`: a retaining one
    /// opens (named by `mint`) or renews the window its lease holds,
    /// returned.
    #[inline]
    pub(crate) fn admit(
        &self,
        record: &mut SessionRecord,
        reason: Reason,
        c: &ShardCounters,
        waiters: &Waiters,
        now: u64,
        mint: impl FnOnce() -> u64,
    ) -> Option<u64> {
        if !reason.retains_session() {
            return None;
        }
        let admitted = record.reservation.admit(now, mint);
        if let Some(until) = admitted.expired {
            // Over before this decision but not purged yet (the pass
            // purged when it began): it ended by expiry, so count it as
            // `expire` would, before the new window replaces it.
            c.grace_expired.add_locked(1);
            record.window_ended = until;
        }
        self.set(record, admitted.next, c, waiters);
        Some(admitted.window)
    }

    /// The release at `now` of a lease holding `window`: the last one
    /// turns the reservation into an idle grace window.
    #[inline]
    pub(crate) fn release(
        &self,
        record: &mut SessionRecord,
        window: u64,
        c: &ShardCounters,
        waiters: &Waiters,
        now: u64,
    ) {
        let next = record.reservation.release(window, now, self.grace_ns);
        if next != record.reservation {
            self.set(record, next, c, waiters);
        }
    }

    /// `finish_session`: the window is over.
    #[inline]
    pub(crate) fn finish(&self, record: &mut SessionRecord, c: &ShardCounters, waiters: &Waiters) {
        let next = record.reservation.finish();
        self.set(record, next, c, waiters);
    }

    /// The earliest grace expiry armed, or `NEVER`.
    #[inline]
    pub(crate) fn earliest(&self) -> u64 {
        self.timers.earliest()
    }

    pub(crate) fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Fires up to `batch` grace expiries due at `now`; `settle` says
    /// whether a record whose window ended is to be forgotten. Returns
    /// whether any window ended.
    pub(crate) fn expire(
        &self,
        now: u64,
        batch: usize,
        table: &SessionTable,
        waiters: &Waiters,
        settle: impl Fn(&mut SessionRecord, &ShardCounters) -> bool,
    ) -> bool {
        let mut due = Vec::new();
        let mut expired = false;
        self.timers.pop_due(now, batch, &mut due);
        for (deadline, hash) in due {
            let shard = table.shard(table.shard_index(hash));
            let mut map = shard.lock();
            // Stale (superseded by a re-arm, or the record is gone) unless a
            // record of this hash still has its entry due at this deadline.
            let Some(record) = map.find_by_hash(hash, |r| r.grace_timer == deadline) else {
                continue;
            };
            record.grace_timer = NEVER;
            match record.reservation.expire(now) {
                Expiry::Expired { until } => {
                    self.set(record, Reservation::None, &shard.counters, waiters);
                    record.window_ended = until;
                    shard.counters.grace_expired.add_locked(1);
                    expired = true;
                    if settle(record, &shard.counters) {
                        let key = record.key.clone();
                        map.remove(&key);
                    }
                }
                Expiry::NotYet { until } => {
                    // The window was renewed after this entry was armed.
                    record.grace_timer = until;
                    self.arm(until, hash, waiters);
                }
                Expiry::NoWindow => {}
            }
        }
        expired
    }

    /// Moves `record` to reservation `next`, keeping gauges and timers right.
    #[inline]
    fn set(
        &self,
        record: &mut SessionRecord,
        next: Reservation,
        c: &ShardCounters,
        waiters: &Waiters,
    ) {
        match record.reservation {
            Reservation::None => {}
            Reservation::InFlight { .. } => c.reserved_in_flight.sub_locked(1),
            Reservation::Grace { .. } => c.reserved_in_grace.sub_locked(1),
        }
        match next {
            Reservation::None => {}
            Reservation::InFlight { .. } => c.reserved_in_flight.add_locked(1),
            Reservation::Grace { until, .. } => {
                c.reserved_in_grace.add_locked(1);
                // One live entry per record: an earlier entry re-arms itself when it fires.
                if record.grace_timer == NEVER || record.grace_timer > until {
                    record.grace_timer = until;
                    self.arm(until, record.key.hash, waiters);
                }
            }
        }
        record.reservation = next;
    }

    /// Arms a grace expiry; if it became the earliest deadline, sleepers
    /// folded a later one (or none) into their sleep: one is nudged to ask
    /// `Core::next_deadline` again.
    fn arm(&self, until: u64, hash: u64, waiters: &Waiters) {
        if self.timers.arm(until, hash) {
            // The waker's half of the handshake with `Waiters::enqueue`: the
            // deadline is written (armed), now read "asleep". A sleeper
            // either reads this deadline after registering or is seen here.
            crate::sync::dekker_fence();
            if waiters.sleeping() > 0 {
                waiters.nudge_newest();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProbeAnswer::{Invalid, Unavailable, Value};

    const T: Thresholds = Thresholds {
        high_watermark: 0.85,
        hit_threshold: 0.80,
    };

    fn facts(usage: Option<ProbeAnswer>, reserved: bool, prefix: Option<ProbeAnswer>) -> Facts {
        Facts {
            usage,
            reserved,
            prefix,
        }
    }

    #[test]
    fn every_row_of_the_table() {
        // Nothing known yet: ask usage first.
        assert_eq!(decide(T, facts(None, true, None)), Decision::AskUsage);
        // Usage unavailable or invalid: open, whatever else is known.
        assert_eq!(
            decide(T, facts(Some(Unavailable), true, None)),
            Decision::Admit(Reason::Open)
        );
        assert_eq!(
            decide(T, facts(Some(Invalid), false, None)),
            Decision::Admit(Reason::Open)
        );
        // Below the watermark: open, even for a reserved session.
        assert_eq!(
            decide(T, facts(Some(Value(0.5)), true, None)),
            Decision::Admit(Reason::Open)
        );
        // Pressure (equality included) with a reservation: reserved, no prefix probe.
        assert_eq!(
            decide(T, facts(Some(Value(0.85)), true, None)),
            Decision::Admit(Reason::ReservedSession)
        );
        // Pressure without a reservation: ask the prefix.
        assert_eq!(
            decide(T, facts(Some(Value(0.85)), false, None)),
            Decision::AskPrefix
        );
        assert_eq!(
            decide(T, facts(Some(Value(1.0)), false, Some(Unavailable))),
            Decision::Admit(Reason::PrefixProbeUnavailable)
        );
        assert_eq!(
            decide(T, facts(Some(Value(1.0)), false, Some(Invalid))),
            Decision::Admit(Reason::PrefixProbeUnavailable)
        );
        // Hit ratio equal to the threshold is resident.
        assert_eq!(
            decide(T, facts(Some(Value(0.9)), false, Some(Value(0.80)))),
            Decision::Admit(Reason::ResidentPrefix)
        );
        assert_eq!(
            decide(T, facts(Some(Value(0.9)), false, Some(Value(0.79)))),
            Decision::Wait
        );
    }

    #[test]
    fn only_pressure_admissions_of_standing_retain() {
        let retaining: Vec<_> = Reason::ALL
            .into_iter()
            .filter(|r| r.retains_session())
            .collect();
        assert_eq!(
            retaining,
            vec![Reason::ReservedSession, Reason::ResidentPrefix]
        );
    }
}
