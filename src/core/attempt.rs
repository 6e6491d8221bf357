//! One `acquire` in progress, as a sans-IO state machine.
//!
//! ```text
//!            start ──▶ ProbeUsage ──on_usage──▶ (table) ──▶ Admitted
//!                          ▲                       │  └──▶ ProbePrefix ──on_prefix──▶ (table) ──▶ Admitted
//!                          │                       │                                     │
//!                          └──── event / poll ◀── Sleep{until} ◀────────── wait ─────────┘
//!   at every step: preempted / cancelled / closed / timed out ──▶ Failed
//! ```
//!
//! A pass is one trip through the table: it starts by asking usage and ends
//! admitted or asleep. The driver feeds each probe answer back with the time
//! it arrived, and after a `Sleep` calls [`Attempt::on_wake`] when its
//! notifier fires or `until` passes, whichever comes first.

use std::fmt;
use std::time::Duration;

use super::decision::{decide, Decision, Facts, Reason};
use super::sessions::{bump, SessionKey, ShardMap};
use super::stats::Probed;
use super::waiters::{Enqueued, Slot, ACTIVE, CANCELLED, ENDED, PREEMPTED, WAKE_EVENT};
use super::Core;
use crate::error::AcquireError;
use crate::probe::ProbeAnswer;
use crate::sync::{Arc, Ordering};

/// What the driver of an attempt must do next.
#[derive(Debug)]
#[must_use]
pub enum Step {
    /// Call the usage probe (no gate lock is held), then [`Attempt::on_usage`].
    ProbeUsage,
    /// Call the prefix probe, then [`Attempt::on_prefix`].
    ProbePrefix,
    /// Sleep until the attempt's notifier fires or the clock reaches
    /// `until_ns`, then call [`Attempt::on_wake`].
    Sleep {
        /// Absolute deadline on the driver's clock.
        until_ns: u64,
    },
    /// Admitted. The token must be released through [`Core::release`].
    Admitted(LeaseToken),
    /// Ended without a lease.
    Failed(AcquireError),
}

/// What an admission looked like.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Gate-unique id of the lease.
    pub lease_id: u64,
    /// Which row of the table admitted the attempt.
    pub reason: Reason,
    /// Time from the start of the attempt to its admission.
    pub wait: Duration,
    /// Whether the attempt slept at least once.
    pub waited: bool,
    /// Usage answer of the deciding pass (`None` if unavailable).
    pub usage: Option<f64>,
    /// Prefix hit ratio of the deciding pass (`None` if not asked or unavailable).
    /// Unlike the reference, never carried over from an earlier pass.
    pub hit_ratio: Option<f64>,
    /// Whether the lease holds the session's reservation.
    pub retain_session: bool,
}

/// A granted lease as plain data: hand it back to [`Core::release`] exactly
/// once. The blocking gate wraps it in [`Lease`](crate::Lease), which does
/// that on drop.
#[must_use = "a lease that is never released keeps its session's reservation and starves waiters"]
pub struct LeaseToken {
    key: SessionKey,
    admission: Admission,
    /// The ownership window this lease holds, if it retains the session.
    window: Option<u64>,
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseToken")
            .field("session", &String::from_utf8_lossy(&self.key.bytes))
            .field("admission", &self.admission)
            .finish()
    }
}

impl LeaseToken {
    /// What the admission looked like.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The session the lease belongs to.
    pub fn session_id(&self) -> &[u8] {
        &self.key.bytes
    }

    pub(crate) fn into_parts(self) -> (SessionKey, Admission, Option<u64>) {
        (self.key, self.admission, self.window)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    New,
    AwaitUsage,
    AwaitPrefix,
    Asleep,
    Done,
}

/// One attempt to be admitted; see the module docs for the protocol.
///
/// An attempt must be driven to `Admitted` or `Failed`, or handed to
/// [`Attempt::abandon`]; dropping it in between leaves the session's
/// pending slot behind until a newer attempt replaces it.
#[derive(Debug)]
#[must_use]
pub struct Attempt {
    slot: Arc<Slot>,
    key: SessionKey,
    prompt_len: usize,
    started: u64,
    deadline: Option<u64>,
    phase: Phase,
    facts: Facts,
    /// Event epoch when this pass began.
    pass_epoch: u64,
    /// When this pass's sleep ends at the latest (set at its first sleep).
    poll_deadline: Option<u64>,
    waited: bool,
    /// A capacity event was handed to this attempt and not used yet.
    holding_event: bool,
}

impl Attempt {
    pub(crate) fn new(
        slot: Arc<Slot>,
        key: SessionKey,
        prompt_len: usize,
        now: u64,
        deadline: Option<u64>,
    ) -> Self {
        Self {
            slot,
            key,
            prompt_len,
            started: now,
            deadline,
            phase: Phase::New,
            facts: Facts {
                usage: None,
                reserved: false,
                prefix: None,
            },
            pass_epoch: 0,
            poll_deadline: None,
            waited: false,
            holding_event: false,
        }
    }

    /// Gate-unique id of this attempt; ids of one session grow over time.
    pub fn id(&self) -> u64 {
        self.slot.attempt_id
    }

    /// The session this attempt is for.
    pub fn session_id(&self) -> &[u8] {
        &self.key.bytes
    }

    /// Whether the attempt has ended.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// First step: begins the first pass.
    pub fn start(&mut self, core: &Core, now: u64) -> Step {
        assert_eq!(self.phase, Phase::New, "start is the first call");
        self.new_pass(core, now)
    }

    /// Feeds the usage probe's raw answer, received at `now`.
    pub fn on_usage(&mut self, core: &Core, raw: Option<f64>, now: u64) -> Step {
        assert_eq!(self.phase, Phase::AwaitUsage, "on_usage answers ProbeUsage");
        let answer = ProbeAnswer::from_raw(raw);
        self.facts.usage = Some(answer);
        self.decide(core, now, Probed::Usage(answer))
    }

    /// Feeds the prefix probe's raw answer, received at `now`.
    pub fn on_prefix(&mut self, core: &Core, raw: Option<f64>, now: u64) -> Step {
        assert_eq!(
            self.phase,
            Phase::AwaitPrefix,
            "on_prefix answers ProbePrefix"
        );
        let answer = ProbeAnswer::from_raw(raw);
        self.facts.prefix = Some(answer);
        self.decide(core, now, Probed::Prefix(answer))
    }

    /// After a `Sleep`: the notifier fired or `until` passed (or the driver
    /// woke spuriously; that is harmless).
    pub fn on_wake(&mut self, core: &Core, now: u64) -> Step {
        assert_eq!(self.phase, Phase::Asleep, "on_wake follows Sleep");
        if self.slot.wake.swap(0, Ordering::SeqCst) & WAKE_EVENT != 0 {
            self.holding_event = true;
        }
        if let Some(err) = self.fate(core) {
            return self.fail(core, err, now);
        }
        let poll_due = self.poll_deadline.is_some_and(|p| now >= p);
        if self.holding_event || poll_due {
            core.waiters.dequeue(&self.slot, &core.grace_timers);
            return self.new_pass(core, now);
        }
        if self.deadline.is_some_and(|d| now >= d) {
            return self.fail(core, AcquireError::TimedOut, now);
        }
        // Woken for the watch deadline, a rewatch or a tick: fire what is due
        // (which may hand an event to this very attempt), else sleep on.
        core.purge(now);
        match core.waiters.stay_asleep(&self.slot, &core.grace_timers) {
            Some(watch_until) => Step::Sleep {
                until_ns: self.sleep_until(watch_until),
            },
            None => {
                // Taken out of the queue meanwhile: by an event or a fate.
                if self.slot.wake.swap(0, Ordering::SeqCst) & WAKE_EVENT != 0 {
                    self.holding_event = true;
                }
                if let Some(err) = self.fate(core) {
                    return self.fail(core, err, now);
                }
                self.new_pass(core, now)
            }
        }
    }

    /// The slot of this ended attempt, if nothing else holds it any more, so
    /// its driver can begin its next attempt with it
    /// ([`Core::begin_with_slot`]) instead of allocating one.
    pub(crate) fn into_spare_slot(self) -> Option<Arc<Slot>> {
        debug_assert!(self.is_done(), "only an ended attempt gives its slot back");
        // No `Weak` to a slot is ever made, so a strong count of one means
        // nobody else can reach it (and `begin_with_slot` asserts it again).
        (Arc::strong_count(&self.slot) == 1).then_some(self.slot)
    }

    /// Ends the attempt early (its driver gave up, e.g. a probe panicked).
    /// Counted as cancelled. A no-op once the attempt is done.
    pub fn abandon(&mut self, core: &Core, now: u64) {
        if self.phase != Phase::Done {
            let _ = self.fail(core, AcquireError::Cancelled, now);
        }
    }

    fn new_pass(&mut self, core: &Core, now: u64) -> Step {
        if let Some(err) = self.fate(core) {
            return self.fail(core, err, now);
        }
        core.purge(now);
        self.facts = Facts {
            usage: None,
            reserved: false,
            prefix: None,
        };
        self.poll_deadline = None;
        self.pass_epoch = core.epoch();
        self.phase = Phase::AwaitUsage;
        Step::ProbeUsage
    }

    /// Runs the table under the session's lock, admitting atomically if it says so.
    fn decide(&mut self, core: &Core, now: u64, probed: Probed) -> Step {
        let (index, shard) = core.shard_of(&self.key);
        let decision = 'locked: {
            let mut guard = shard.lock();
            // Counted under the lock, like every other counter of the shard.
            shard.counters.count_probe(probed);
            // Checked under the lock that admission takes: a newer attempt or a
            // cancel sealed our fate before, or sees us admitted after.
            if let Some(err) = self.fate(core) {
                drop(guard);
                return self.fail(core, err, now);
            }
            let ShardMap { sessions, ids } = &mut *guard;
            let record = sessions
                .find_mut(self.key.hash, |r| r.key == self.key)
                .expect("a record with a pending attempt is never dropped");
            debug_assert!(
                record
                    .pending
                    .as_ref()
                    .is_some_and(|p| Arc::ptr_eq(p, &self.slot)),
                "an attempt whose fate is open is its session's pending one"
            );
            self.facts.reserved = record.reservation.held_at(now);
            let decision = decide(core.thresholds, self.facts);
            let Decision::Admit(reason) = decision else {
                break 'locked decision;
            };
            let bits = core.table.shard_bits();
            let window = reason.retains_session().then(|| {
                let admitted = record.reservation.admit(now, || ids.mint(index, bits));
                if let Some(until) = admitted.expired {
                    // Over before this decision but not purged yet (the pass
                    // purged when it began): it ended by expiry, so count it
                    // as `purge` would, before the new window replaces it.
                    shard.counters.grace_expired.add_locked(1);
                    record.window_ended = until;
                }
                core.set_reservation(record, admitted.next, &shard.counters);
                admitted.window
            });
            let lease_id = ids.mint(index, bits);
            record.pending = None;
            record.active_leases += 1;
            record.last_admitted_prompt_len = u32::try_from(self.prompt_len).unwrap_or(u32::MAX);
            record.last_activity = now;
            bump(&mut record.counters.admissions);
            let wait_ns = now.saturating_sub(self.started);
            if self.waited {
                bump(&mut record.counters.waits);
                record.counters.wait_ns += wait_ns;
                shard.counters.waits.add_locked(1);
                shard.counters.wait_ns.add_locked(wait_ns);
            }
            shard.counters.admissions[reason.index()].add_locked(1);
            shard.counters.active_leases.add_locked(1);
            shard.counters.pending_attempts.sub_locked(1);
            drop(guard);
            self.phase = Phase::Done;
            let token = LeaseToken {
                key: self.key.clone(),
                admission: Admission {
                    lease_id,
                    reason,
                    wait: Duration::from_nanos(wait_ns),
                    waited: self.waited,
                    usage: self.facts.usage.and_then(ProbeAnswer::value),
                    hit_ratio: self.facts.prefix.and_then(ProbeAnswer::value),
                    retain_session: window.is_some(),
                },
                window,
            };
            if self.holding_event {
                // Admitted on an event: capacity may remain, let the next one look.
                core.pass_on_event();
            }
            return Step::Admitted(token);
        };
        match decision {
            Decision::AskPrefix => {
                self.phase = Phase::AwaitPrefix;
                Step::ProbePrefix
            }
            Decision::Wait => self.sleep(core, now),
            Decision::AskUsage | Decision::Admit(_) => {
                unreachable!("usage is known and admissions returned above")
            }
        }
    }

    fn sleep(&mut self, core: &Core, now: u64) -> Step {
        // Waiting again absorbs any event we held: pressure persists.
        self.holding_event = false;
        if self.deadline.is_some_and(|d| now >= d) {
            return self.fail(core, AcquireError::TimedOut, now);
        }
        let epoch = self.pass_epoch;
        let enqueued = core.waiters.enqueue(&self.slot, &core.grace_timers, || {
            core.epoch() != epoch || core.is_closed() || self.slot.fate() != ACTIVE
        });
        match enqueued {
            Enqueued::LookAgain => self.new_pass(core, now),
            Enqueued::Asleep { watch_until } => {
                self.waited = true;
                self.phase = Phase::Asleep;
                self.poll_deadline = Some(now.saturating_add(core.poll_ns));
                Step::Sleep {
                    until_ns: self.sleep_until(watch_until),
                }
            }
        }
    }

    fn sleep_until(&self, watch_until: Option<u64>) -> u64 {
        let mut until = self.poll_deadline.expect("set when the pass first slept");
        if let Some(d) = self.deadline {
            until = until.min(d);
        }
        if let Some(w) = watch_until {
            until = until.min(w);
        }
        until
    }

    /// Closed, preempted or cancelled, checked in that order.
    fn fate(&self, core: &Core) -> Option<AcquireError> {
        if core.is_closed() {
            return Some(AcquireError::Closed);
        }
        match self.slot.fate() {
            PREEMPTED => Some(AcquireError::Preempted),
            CANCELLED => Some(AcquireError::Cancelled),
            _ => None,
        }
    }

    fn fail(&mut self, core: &Core, mut err: AcquireError, now: u64) -> Step {
        debug_assert_ne!(self.phase, Phase::Done);
        self.phase = Phase::Done;
        core.waiters.dequeue(&self.slot, &core.grace_timers);
        // An event handed to this attempt that it never took with `on_wake`
        // (its driver abandoned it while it slept) is passed on below like a
        // held one, or the next sleeper would sleep until its poll.
        if self.slot.wake.swap(0, Ordering::SeqCst) & WAKE_EVENT != 0 {
            self.holding_event = true;
        }
        let (_, shard) = core.shard_of(&self.key);
        {
            let mut map = shard.lock();
            // Each attempt ends exactly one way: an attempt ending by itself
            // seals its fate, and if a newer attempt or a cancel sealed it
            // first, that is the outcome reported (and counted) instead.
            if !matches!(err, AcquireError::Preempted) && !self.slot.set_fate(ENDED) {
                err = match self.slot.fate() {
                    PREEMPTED => AcquireError::Preempted,
                    CANCELLED => AcquireError::Cancelled,
                    other => unreachable!("fate {other} is sealed once, by begin or cancel"),
                };
            }
            if let Some(record) = map.get_mut(&self.key) {
                let mine = record
                    .pending
                    .as_ref()
                    .is_some_and(|p| Arc::ptr_eq(p, &self.slot));
                if mine {
                    // A preempted attempt's slot was already replaced (and the
                    // gauge handed over) by its successor.
                    record.pending = None;
                    shard.counters.pending_attempts.sub_locked(1);
                }
                match err {
                    // Counted when sealed, by `begin`.
                    AcquireError::Preempted => {}
                    AcquireError::TimedOut => {
                        bump(&mut record.counters.timed_out);
                        shard.counters.timed_out.add_locked(1);
                    }
                    AcquireError::Cancelled => {
                        bump(&mut record.counters.cancelled);
                        shard.counters.cancelled.add_locked(1);
                    }
                    AcquireError::Closed => shard.counters.closed.add(1),
                }
                if self.waited {
                    let wait_ns = now.saturating_sub(self.started);
                    bump(&mut record.counters.waits);
                    record.counters.wait_ns += wait_ns;
                    shard.counters.waits.add_locked(1);
                    shard.counters.wait_ns.add_locked(wait_ns);
                }
                record.last_activity = now;
                if core.settle(record, now, &shard.counters) {
                    map.remove(&self.key);
                }
            }
        }
        if std::mem::take(&mut self.holding_event) {
            core.pass_on_event();
        }
        Step::Failed(err)
    }
}
