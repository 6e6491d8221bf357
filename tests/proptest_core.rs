//! A proptest state machine: random operation sequences run against the
//! real sans-IO [`Core`] and against a sequential reference model of the
//! semantics kvgate documents (docs/admission.md, "The decision table" and
//! "Where kvgate deliberately differs from the reference"), in virtual time with scripted
//! probe answers. Every step's outcome must be the model's, and all six
//! invariants of the semantics are checked after every step (see `check`).
//!
//! The model is written from the documented semantics, not from the code:
//! the seed's table; reservations that are in flight while any retaining
//! lease is out and turn into a grace window at last release + idle_grace;
//! expiry at `until` inclusive; lazy purges at the entry points that
//! document them; immediate, airtight preemption; fresh hit ratios; `waits`
//! counting only attempts that slept; targeted wake-ups (one sleeper per
//! capacity event, FIFO, passed on by an admitted or failed holder,
//! absorbed by one that sleeps again).
//!
//! Shrinking: every operation names its target by an index taken modulo the
//! live candidates (and is a no-op when there are none), so any subsequence
//! of a failing sequence is still a valid sequence and proptest can delete
//! operations freely. Cases: 1024 by default (about 6 s in a debug build),
//! `PROPTEST_CASES=N` for more.

#![cfg(not(loom))]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvgate::core::{Attempt, Core, LeaseToken, Notify, Step};
use kvgate::{AcquireError, Config, GateStats, Reason, ReservationState, SessionStats};
use proptest::prelude::*;

#[path = "support/proptest_cases.rs"]
mod proptest_cases;

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
/// The virtual clock starts here, so that observing at time 0 (see `check`)
/// never fires a timer.
const START: u64 = SEC;
const SESSIONS: [&[u8]; 3] = [b"s0", b"s1", b"s2"];
const WATERMARK: f64 = 0.85;
const THRESHOLD: f64 = 0.80;

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

/// A raw probe answer.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Unavailable,
    /// NaN, infinite or outside [0, 1]: treated as unavailable, counted apart.
    Invalid(f64),
    Value(f64),
}

impl Answer {
    fn raw(self) -> Option<f64> {
        match self {
            Answer::Unavailable => None,
            Answer::Invalid(v) | Answer::Value(v) => Some(v),
        }
    }

    fn value(self) -> Option<f64> {
        match self {
            Answer::Value(v) => Some(v),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Begin an attempt of session `s`, with a timeout in seconds if any.
    Begin {
        s: usize,
        timeout_s: Option<u64>,
    },
    /// Give the `a`-th live attempt what it asked for: the usage answer if it
    /// asked usage, the prefix answer if it asked the prefix, or a call to
    /// `on_wake` if it sleeps (notified, due or not: spurious wake-ups are
    /// allowed).
    Feed {
        a: usize,
        usage: Answer,
        prefix: Answer,
    },
    /// What a driver does after time moved: wake every sleeper that was
    /// notified or whose deadline passed.
    WakeDue,
    Advance {
        by: u64,
    },
    Release {
        k: usize,
    },
    Finish {
        s: usize,
    },
    Cancel {
        s: usize,
    },
    /// Ends a live attempt early: `abandon` for an even `a`, a plain drop
    /// (which abandons at the attempt's last step) for an odd one.
    Abandon {
        a: usize,
    },
    Purge,
    Close,
}

fn answer(values: &'static [f64]) -> impl Strategy<Value = Answer> {
    prop_oneof![
        1 => Just(Answer::Unavailable),
        1 => prop::sample::select(&[f64::NAN, f64::INFINITY, -0.5, 1.5][..]).prop_map(Answer::Invalid),
        8 => prop::sample::select(values).prop_map(Answer::Value),
    ]
}

fn usage() -> impl Strategy<Value = Answer> {
    // Either side of the watermark, equality included (equality is
    // pressure), mostly pressure so that attempts wait and queue up.
    answer(&[0.5, 0.849, WATERMARK, 0.9, 0.95, 1.0, 1.0])
}

fn prefix() -> impl Strategy<Value = Answer> {
    answer(&[0.0, 0.3, 0.799, THRESHOLD, 0.95])
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..SESSIONS.len();
    let a = 0..4usize;
    // `Close` ends everything after it, so it is not drawn here: a case
    // closes at most once, at a chosen point (see the property).
    prop_oneof![
        4 => (s.clone(), prop::option::weighted(0.3, 0..20u64))
            .prop_map(|(s, timeout_s)| Op::Begin { s, timeout_s }),
        14 => (a.clone(), usage(), prefix())
            .prop_map(|(a, usage, prefix)| Op::Feed { a, usage, prefix }),
        4 => Just(Op::WakeDue),
        // Coarse steps (half seconds; grace, poll and timeouts are whole
        // seconds), so that a decision lands exactly on a window's end, a
        // poll or a deadline often: those equalities are part of the contract.
        4 => prop_oneof![
            4 => (0..6u64).prop_map(|n| n * 500 * MS),
            1 => (1..15u64).prop_map(|s| s * SEC),
            1 => (15..60u64).prop_map(|s| s * SEC),
        ].prop_map(|by| Op::Advance { by }),
        4 => (0..4usize).prop_map(|k| Op::Release { k }),
        1 => s.clone().prop_map(|s| Op::Finish { s }),
        1 => s.prop_map(|s| Op::Cancel { s }),
        1 => a.prop_map(|a| Op::Abandon { a }),
        1 => Just(Op::Purge),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    // A grace of 0 (no window) and one that is often reached by `Advance`.
    (
        prop::sample::select(&[0u64, 5][..]),
        prop::sample::select(&[3u64, 10][..]),
    )
        .prop_map(|(grace, poll)| Config {
            admission: kvgate::AdmissionMode::Reference,
            high_watermark: WATERMARK,
            hit_threshold: THRESHOLD,
            wait_poll: Duration::from_secs(poll),
            idle_grace: Duration::from_secs(grace),
            session_retention: Duration::from_secs(30),
        })
}

// ---------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Res {
    None,
    InFlight { holders: u32, id: u64 },
    Grace { until: u64, id: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Active,
    Preempted,
    Cancelled,
    Ended,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    AwaitUsage,
    AwaitPrefix,
    Asleep,
    Done,
}

#[derive(Debug, Clone)]
struct MAttempt {
    session: usize,
    /// The serial of the session record it began on (see `MSession::serial`).
    record: u64,
    prompt_len: usize,
    phase: Phase,
    fate: Fate,
    started: u64,
    deadline: Option<u64>,
    pass_epoch: u64,
    poll_deadline: Option<u64>,
    usage: Option<Answer>,
    prefix: Option<Answer>,
    waited: bool,
    /// A capacity event was handed to this attempt and is still in its
    /// wake flags (it has not called `on_wake` since).
    event_in_flags: bool,
    /// It took that event on `on_wake` and has not used it yet.
    holding_event: bool,
    /// The core must have notified it since its last call.
    must_be_notified: bool,
}

#[derive(Debug, Clone, Default)]
struct MCounters {
    attempts: u64,
    admissions: u64,
    preempted: u64,
    waits: u64,
    wait_ns: u64,
    timed_out: u64,
    cancelled: u64,
}

#[derive(Debug, Clone)]
struct MSession {
    /// Which record of its session this is: a session forgotten and tracked
    /// again gets a new one, and an attempt's figures belong to its own.
    serial: u64,
    res: Res,
    finished: bool,
    pending: Option<usize>,
    active_leases: u32,
    last_activity: u64,
    window_ended: u64,
    last_prompt_len: usize,
    c: MCounters,
}

#[derive(Debug, Clone)]
struct MLease {
    session: usize,
    window: Option<u64>,
}

/// What the model says a step returns.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    ProbeUsage,
    ProbePrefix,
    Sleep,
    Admitted {
        reason: Reason,
        usage: Option<f64>,
        hit: Option<f64>,
        waited: bool,
        wait_ns: u64,
    },
    Failed(AcquireError),
}

#[derive(Debug, Default)]
struct Model {
    /// Session records made so far (the source of `MSession::serial`).
    records_made: u64,
    poll: u64,
    grace: u64,
    retention: u64,
    now: u64,
    closed: bool,
    epoch: u64,
    next_window: u64,
    sessions: BTreeMap<usize, MSession>,
    attempts: Vec<MAttempt>,
    /// Sleepers by arrival: the front has slept longest.
    queue: VecDeque<usize>,
    stats: GateStats,
    /// The lease the last admission issued, for the harness to pair with
    /// the real token.
    leases_issued: Vec<MLease>,
    /// Events passed on by an admitted holder, and by a failed one.
    passed_on: [u64; 2],
}

impl Model {
    fn new(config: &Config) -> Self {
        Self {
            poll: config.wait_poll.as_nanos() as u64,
            grace: config.idle_grace.as_nanos() as u64,
            retention: config.session_retention.as_nanos() as u64,
            now: START,
            ..Self::default()
        }
    }

    fn is_idle(s: &MSession) -> bool {
        s.pending.is_none() && s.active_leases == 0 && s.res == Res::None
    }

    /// A record with nothing to protect is dropped once finished, or once
    /// idle for the retention period (from its last activity or the end of
    /// its last window, whichever is later).
    fn settle(&mut self, s: usize) {
        let Some(rec) = self.sessions.get(&s) else {
            return;
        };
        if !Self::is_idle(rec) {
            return;
        }
        let retire_at = rec.last_activity.max(rec.window_ended) + self.retention;
        if rec.finished || retire_at <= self.now {
            if !rec.finished {
                self.stats.sessions_retired += 1;
            }
            self.sessions.remove(&s);
        }
    }

    /// Lazy purge at an entry point: windows over at `now` (inclusive) end,
    /// retention-expired idle records go; an expiry is a capacity event.
    fn purge(&mut self) {
        let now = self.now;
        let mut due: Vec<(u64, usize)> = self
            .sessions
            .iter()
            .filter_map(|(&s, r)| match r.res {
                Res::Grace { until, .. } if until <= now => Some((until, s)),
                _ => None,
            })
            .collect();
        due.sort();
        let expired = !due.is_empty();
        for (until, s) in due {
            let rec = self.sessions.get_mut(&s).unwrap();
            rec.res = Res::None;
            rec.window_ended = until;
            self.stats.grace_expired += 1;
            self.settle(s);
        }
        let idle: Vec<usize> = self.sessions.keys().copied().collect();
        for s in idle {
            self.settle(s);
        }
        if expired {
            self.capacity_event();
        }
    }

    fn capacity_event(&mut self) {
        self.epoch += 1;
        self.pass_on();
    }

    /// Hands an event to the longest sleeper, if any.
    fn pass_on(&mut self) {
        if let Some(a) = self.queue.pop_front() {
            let att = &mut self.attempts[a];
            att.event_in_flags = true;
            att.must_be_notified = true;
        }
    }

    fn dequeue(&mut self, a: usize) {
        self.queue.retain(|&x| x != a);
    }

    /// Takes `a` out of the queue wherever it is and notifies it (its fate was sealed).
    fn wake_waiter(&mut self, a: usize) {
        self.dequeue(a);
        self.attempts[a].must_be_notified = true;
    }

    fn fate_err(&self, a: usize) -> Option<AcquireError> {
        if self.closed {
            return Some(AcquireError::Closed);
        }
        match self.attempts[a].fate {
            Fate::Preempted => Some(AcquireError::Preempted),
            Fate::Cancelled => Some(AcquireError::Cancelled),
            Fate::Active | Fate::Ended => None,
        }
    }

    fn begin(&mut self, s: usize, timeout_s: Option<u64>, prompt_len: usize) -> Option<usize> {
        if self.closed {
            self.stats.closed += 1;
            return None;
        }
        self.purge();
        let now = self.now;
        let a = self.attempts.len();
        self.attempts.push(MAttempt {
            session: s,
            record: 0,
            prompt_len,
            phase: Phase::AwaitUsage,
            fate: Fate::Active,
            started: now,
            deadline: timeout_s.map(|t| now + t * SEC),
            pass_epoch: 0,
            poll_deadline: None,
            usage: None,
            prefix: None,
            waited: false,
            event_in_flags: false,
            holding_event: false,
            must_be_notified: false,
        });
        self.records_made += 1;
        let serial = self.records_made;
        let rec = self.sessions.entry(s).or_insert_with(|| MSession {
            serial,
            res: Res::None,
            finished: false,
            pending: None,
            active_leases: 0,
            last_activity: now,
            window_ended: 0,
            last_prompt_len: 0,
            c: MCounters::default(),
        });
        self.attempts[a].record = rec.serial;
        let superseded = rec.pending.replace(a);
        rec.finished = false;
        rec.last_activity = now;
        rec.c.attempts += 1;
        self.stats.attempts += 1;
        match superseded {
            Some(old) => {
                if self.attempts[old].fate == Fate::Active {
                    self.attempts[old].fate = Fate::Preempted;
                    self.sessions.get_mut(&s).unwrap().c.preempted += 1;
                    self.stats.preempted += 1;
                }
                self.wake_waiter(old);
            }
            None => self.stats.pending_attempts += 1,
        }
        Some(a)
    }

    /// Starts a pass: probe usage from scratch.
    fn new_pass(&mut self, a: usize) -> Expect {
        if let Some(err) = self.fate_err(a) {
            return self.fail(a, err);
        }
        self.purge();
        let epoch = self.epoch;
        let att = &mut self.attempts[a];
        att.usage = None;
        att.prefix = None;
        att.poll_deadline = None;
        att.pass_epoch = epoch;
        att.phase = Phase::AwaitUsage;
        Expect::ProbeUsage
    }

    fn on_usage(&mut self, a: usize, answer: Answer) -> Expect {
        self.stats.usage_probe_calls += 1;
        match answer {
            Answer::Value(_) => {}
            Answer::Unavailable => self.stats.usage_probe_unavailable += 1,
            Answer::Invalid(_) => {
                self.stats.usage_probe_unavailable += 1;
                self.stats.usage_probe_invalid += 1;
            }
        }
        self.attempts[a].usage = Some(answer);
        self.decide(a)
    }

    fn on_prefix(&mut self, a: usize, answer: Answer) -> Expect {
        self.stats.prefix_probe_calls += 1;
        match answer {
            Answer::Value(_) => {}
            Answer::Unavailable => self.stats.prefix_probe_unavailable += 1,
            Answer::Invalid(_) => {
                self.stats.prefix_probe_unavailable += 1;
                self.stats.prefix_probe_invalid += 1;
            }
        }
        self.attempts[a].prefix = Some(answer);
        self.decide(a)
    }

    /// The seed's table, with the session's standing read at the decision.
    fn decide(&mut self, a: usize) -> Expect {
        if let Some(err) = self.fate_err(a) {
            return self.fail(a, err);
        }
        let now = self.now;
        let att = &self.attempts[a];
        let rec = &self.sessions[&att.session];
        let reserved = match rec.res {
            Res::None => false,
            Res::InFlight { .. } => true,
            Res::Grace { until, .. } => now < until,
        };
        let usage = att.usage.expect("decide follows a usage answer").value();
        let reason = if !matches!(usage, Some(u) if u >= WATERMARK) {
            Reason::Open
        } else if reserved {
            Reason::ReservedSession
        } else {
            match att.prefix {
                None => {
                    self.attempts[a].phase = Phase::AwaitPrefix;
                    return Expect::ProbePrefix;
                }
                Some(p) => match p.value() {
                    None => Reason::PrefixProbeUnavailable,
                    Some(hit) if hit >= THRESHOLD => Reason::ResidentPrefix,
                    Some(_) => return self.sleep(a),
                },
            }
        };
        self.admit(a, reason)
    }

    fn admit(&mut self, a: usize, reason: Reason) -> Expect {
        let now = self.now;
        let att = self.attempts[a].clone();
        let retains = matches!(reason, Reason::ReservedSession | Reason::ResidentPrefix);
        let rec = self.sessions.get_mut(&att.session).unwrap();
        let window = if retains {
            let (next, id) = match rec.res {
                Res::InFlight { holders, id } => (
                    Res::InFlight {
                        holders: holders + 1,
                        id,
                    },
                    id,
                ),
                Res::Grace { until, id } if now < until => (Res::InFlight { holders: 1, id }, id),
                other => {
                    if let Res::Grace { until, .. } = other {
                        // Over before this decision, not purged yet: it ended by expiry.
                        self.stats.grace_expired += 1;
                        rec.window_ended = until;
                    }
                    self.next_window += 1;
                    let id = self.next_window;
                    (Res::InFlight { holders: 1, id }, id)
                }
            };
            rec.res = next;
            Some(id)
        } else {
            None
        };
        rec.pending = None;
        rec.active_leases += 1;
        rec.last_prompt_len = att.prompt_len;
        rec.last_activity = now;
        rec.c.admissions += 1;
        let wait_ns = now - att.started;
        if att.waited {
            rec.c.waits += 1;
            rec.c.wait_ns += wait_ns;
            self.stats.waits += 1;
            self.stats.wait_time += Duration::from_nanos(wait_ns);
            self.stats.longest_wait = self.stats.longest_wait.max(Duration::from_nanos(wait_ns));
        }
        self.stats.admissions_by_reason[reason as usize] += 1;
        self.stats.active_leases += 1;
        self.stats.pending_attempts -= 1;
        self.attempts[a].phase = Phase::Done;
        self.leases_issued.push(MLease {
            session: att.session,
            window,
        });
        if att.holding_event {
            self.attempts[a].holding_event = false;
            self.passed_on[0] += 1;
            self.pass_on();
        }
        Expect::Admitted {
            reason,
            usage: att.usage.and_then(Answer::value),
            hit: att.prefix.and_then(Answer::value),
            waited: att.waited,
            wait_ns,
        }
    }

    fn sleep(&mut self, a: usize) -> Expect {
        let now = self.now;
        self.attempts[a].holding_event = false; // pressure persists: absorbed
        if self.attempts[a].deadline.is_some_and(|d| now >= d) {
            return self.fail(a, AcquireError::TimedOut);
        }
        if self.epoch != self.attempts[a].pass_epoch {
            // A capacity event happened while this pass probed: look again.
            return self.new_pass(a);
        }
        self.queue.push_back(a);
        let att = &mut self.attempts[a];
        att.waited = true;
        att.phase = Phase::Asleep;
        att.poll_deadline = Some(now + self.poll);
        Expect::Sleep
    }

    fn on_wake(&mut self, a: usize) -> Expect {
        let now = self.now;
        if std::mem::take(&mut self.attempts[a].event_in_flags) {
            self.attempts[a].holding_event = true;
        }
        if let Some(err) = self.fate_err(a) {
            return self.fail(a, err);
        }
        let att = &self.attempts[a];
        let poll_due = att.poll_deadline.is_some_and(|p| now >= p);
        if att.holding_event || poll_due {
            self.dequeue(a);
            return self.new_pass(a);
        }
        if att.deadline.is_some_and(|d| now >= d) {
            return self.fail(a, AcquireError::TimedOut);
        }
        self.purge();
        if self.queue.contains(&a) {
            return Expect::Sleep;
        }
        // Its own purge's expiry reached it.
        if std::mem::take(&mut self.attempts[a].event_in_flags) {
            self.attempts[a].holding_event = true;
        }
        self.new_pass(a)
    }

    /// Ends `a` without a lease. A fate sealed by a newer attempt or a
    /// cancel wins over the attempt's own reason; an event it was handed and
    /// did not use goes to the next sleeper.
    fn fail(&mut self, a: usize, mut err: AcquireError) -> Expect {
        let now = self.now;
        self.dequeue(a);
        let att = &mut self.attempts[a];
        att.phase = Phase::Done;
        if std::mem::take(&mut att.event_in_flags) {
            att.holding_event = true;
        }
        if err != AcquireError::Preempted {
            match att.fate {
                Fate::Active => att.fate = Fate::Ended,
                Fate::Preempted => err = AcquireError::Preempted,
                Fate::Cancelled => err = AcquireError::Cancelled,
                Fate::Ended => unreachable!("an attempt ends once"),
            }
        }
        let att = self.attempts[a].clone();
        // Gate-wide: always, as callers were told. Per session: only on the
        // attempt's own record, if it is still tracked.
        match err {
            // Not a refusal: counted nowhere (the model never releases).
            AcquireError::Preempted | AcquireError::Released => {}
            AcquireError::TimedOut => self.stats.timed_out += 1,
            AcquireError::Cancelled => self.stats.cancelled += 1,
            AcquireError::Closed => self.stats.closed += 1,
        }
        let wait_ns = att.waited.then(|| now - att.started);
        if let Some(wait_ns) = wait_ns {
            self.stats.waits += 1;
            self.stats.wait_time += Duration::from_nanos(wait_ns);
            self.stats.longest_wait = self.stats.longest_wait.max(Duration::from_nanos(wait_ns));
        }
        let own = self
            .sessions
            .get_mut(&att.session)
            .filter(|rec| rec.serial == att.record);
        if let Some(rec) = own {
            if rec.pending == Some(a) {
                rec.pending = None;
                self.stats.pending_attempts -= 1;
            }
            match err {
                AcquireError::TimedOut => rec.c.timed_out += 1,
                AcquireError::Cancelled => rec.c.cancelled += 1,
                AcquireError::Preempted | AcquireError::Closed | AcquireError::Released => {}
            }
            if let Some(wait_ns) = wait_ns {
                rec.c.waits += 1;
                rec.c.wait_ns += wait_ns;
            }
            rec.last_activity = now;
            self.settle(att.session);
        }
        if att.holding_event {
            self.attempts[a].holding_event = false;
            self.passed_on[1] += 1;
            self.pass_on();
        }
        Expect::Failed(err)
    }

    fn abandon(&mut self, a: usize) {
        if self.attempts[a].phase != Phase::Done {
            self.fail(a, AcquireError::Cancelled);
        }
    }

    fn release(&mut self, lease: MLease) {
        let now = self.now;
        let rec = self
            .sessions
            .get_mut(&lease.session)
            .expect("a leased session is tracked");
        rec.active_leases -= 1;
        rec.last_activity = now;
        self.stats.active_leases -= 1;
        self.stats.releases += 1;
        if let (Some(w), Res::InFlight { holders, id }) = (lease.window, rec.res) {
            if w == id {
                rec.res = if holders > 1 {
                    Res::InFlight {
                        holders: holders - 1,
                        id,
                    }
                } else if self.grace == 0 {
                    Res::None
                } else {
                    Res::Grace {
                        until: now + self.grace,
                        id,
                    }
                };
            }
        }
        self.settle(lease.session);
        self.capacity_event();
    }

    fn finish(&mut self, s: usize) -> Option<SessionStats> {
        self.purge();
        let out = self.sessions.get_mut(&s).map(|rec| {
            rec.res = Res::None;
            rec.finished = true;
            Self::session_stats_of(rec, self.now)
        });
        if out.is_some() {
            self.stats.sessions_finished += 1;
            self.settle(s);
            // Finishing an unknown session frees nothing and wakes nobody.
            self.capacity_event();
        }
        out
    }

    fn cancel(&mut self, s: usize) -> bool {
        let target = self
            .sessions
            .get(&s)
            .and_then(|r| r.pending)
            .filter(|&p| self.attempts[p].fate == Fate::Active);
        match target {
            Some(p) => {
                self.attempts[p].fate = Fate::Cancelled;
                self.wake_waiter(p);
                true
            }
            None => false,
        }
    }

    fn close(&mut self) {
        self.closed = true;
        for &a in &self.queue {
            self.attempts[a].must_be_notified = true;
        }
    }

    /// A session's figures as the core reports them when observed at time
    /// `at` (the checks observe at time 0, see `check`).
    fn session_stats_of(r: &MSession, at: u64) -> SessionStats {
        // Built from Default: the struct is `#[non_exhaustive]`.
        let mut s = SessionStats::default();
        s.num_preempted = r.c.preempted;
        s.attempts = r.c.attempts;
        s.admissions = r.c.admissions;
        s.waits = r.c.waits;
        s.wait_time = Duration::from_nanos(r.c.wait_ns);
        s.timed_out = r.c.timed_out;
        s.cancelled = r.c.cancelled;
        s.active_leases = r.active_leases;
        s.attempt_pending = r.pending.is_some();
        s.reservation = match r.res {
            Res::None => ReservationState::None,
            Res::InFlight { holders, .. } => ReservationState::InFlight { leases: holders },
            Res::Grace { until, .. } if until <= at => ReservationState::None,
            Res::Grace { until, .. } => ReservationState::Grace {
                remaining: Duration::from_nanos(until - at),
            },
        };
        s.last_admitted_prompt_len = r.last_prompt_len;
        s.idle_for = Duration::from_nanos(at.saturating_sub(r.last_activity));
        s
    }

    fn expected_gate_stats(&self) -> GateStats {
        let mut s = self.stats.clone();
        s.waiting_attempts = self.queue.len() as u64;
        s.reserved_in_flight = 0;
        s.reserved_in_grace = 0;
        for r in self.sessions.values() {
            match r.res {
                Res::None => {}
                Res::InFlight { .. } => s.reserved_in_flight += 1,
                Res::Grace { .. } => s.reserved_in_grace += 1,
            }
        }
        s.tracked_sessions = self.sessions.len() as u64;
        s
    }
}

// ---------------------------------------------------------------------------
// The system under test, driven in lockstep with the model
// ---------------------------------------------------------------------------

struct Counting(Arc<AtomicUsize>);

impl Notify for Counting {
    fn notify(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Live {
    /// Index of the attempt in the model.
    m: usize,
    attempt: Attempt<Arc<Core>>,
    wakes: Arc<AtomicUsize>,
    /// Notifications counted when the attempt last returned from a call.
    wakes_seen: usize,
    /// `until_ns` of its last `Sleep`.
    until: u64,
    /// When it was last given a step: the time a drop abandons it at.
    last_step: u64,
}

struct Harness {
    core: Arc<Core>,
    model: Model,
    live: Vec<Live>,
    leases: Vec<(LeaseToken, MLease)>,
    lease_ids: BTreeSet<u64>,
}

impl Harness {
    fn new(config: Config) -> Self {
        Self {
            model: Model::new(&config),
            core: Arc::new(Core::new(config).expect("valid config")),
            live: Vec::new(),
            leases: Vec::new(),
            lease_ids: BTreeSet::new(),
        }
    }

    fn now(&self) -> u64 {
        self.model.now
    }

    /// Compares a step with the model's expectation and books the result.
    fn settle_step(&mut self, i: usize, step: Step, expect: Expect) -> Result<(), TestCaseError> {
        let m = self.live[i].m;
        self.model.attempts[m].must_be_notified = false;
        self.live[i].wakes_seen = self.live[i].wakes.load(Ordering::SeqCst);
        match (step, expect) {
            (Step::ProbeUsage, Expect::ProbeUsage) | (Step::ProbePrefix, Expect::ProbePrefix) => {}
            (Step::Sleep { until_ns }, Expect::Sleep) => {
                let att = &self.model.attempts[m];
                let poll = att.poll_deadline.expect("asleep");
                prop_assert!(
                    until_ns <= poll,
                    "sleeps past its poll: {until_ns} > {poll}"
                );
                if let Some(d) = att.deadline {
                    prop_assert!(until_ns <= d, "sleeps past its deadline: {until_ns} > {d}");
                }
                // The driver folds the core's next deadline into the sleep.
                let next = self.core.next_deadline();
                self.live[i].until = next.map_or(until_ns, |d| d.min(until_ns));
            }
            (
                Step::Admitted(token),
                Expect::Admitted {
                    reason,
                    usage,
                    hit,
                    waited,
                    wait_ns,
                },
            ) => {
                let got = token.admission().clone();
                prop_assert_eq!(got.reason, reason, "decision table");
                prop_assert_eq!(got.retain_session, reason.retains_session());
                prop_assert_eq!(got.usage, usage);
                prop_assert_eq!(got.hit_ratio, hit, "the hit ratio is this pass's");
                prop_assert_eq!(got.waited, waited);
                prop_assert_eq!(got.wait, Duration::from_nanos(wait_ns));
                prop_assert!(self.lease_ids.insert(got.lease_id), "lease id reused");
                let lease = self.model.leases_issued.pop().expect("the model issued it");
                self.leases.push((token, lease));
                self.live.remove(i);
            }
            (Step::Failed(err), Expect::Failed(expected)) => {
                prop_assert_eq!(err, expected);
                self.live.remove(i);
            }
            (step, expect) => {
                return Err(TestCaseError::fail(format!(
                    "step {step:?}, model expected {expect:?}"
                )))
            }
        }
        Ok(())
    }

    fn wake(&mut self, i: usize) -> Result<(), TestCaseError> {
        let now = self.now();
        self.live[i].last_step = now;
        let step = self.live[i].attempt.on_wake(now).unwrap();
        let expect = self.model.on_wake(self.live[i].m);
        self.settle_step(i, step, expect)
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now();
        match *op {
            Op::Begin { s, timeout_s } => {
                let prompt_len = 10 + self.model.attempts.len();
                let wakes = Arc::new(AtomicUsize::new(0));
                let deadline = timeout_s.map(|t| now + t * SEC);
                let begun = Attempt::begin(
                    self.core.clone(),
                    SESSIONS[s],
                    prompt_len,
                    now,
                    deadline,
                    Box::new(Counting(wakes.clone())),
                );
                match (begun, self.model.begin(s, timeout_s, prompt_len)) {
                    (Ok(mut attempt), Some(m)) => {
                        let step = attempt.start(now).unwrap();
                        self.live.push(Live {
                            m,
                            attempt,
                            wakes,
                            wakes_seen: 0,
                            until: u64::MAX,
                            last_step: now,
                        });
                        let expect = self.model.new_pass(m);
                        self.settle_step(self.live.len() - 1, step, expect)?;
                    }
                    (Err(AcquireError::Closed), None) => {}
                    (got, model) => {
                        return Err(TestCaseError::fail(format!(
                            "begin: {:?}, model {model:?}",
                            got.map(|a| a.id())
                        )))
                    }
                }
            }
            Op::Feed { a, usage, prefix } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let i = a % self.live.len();
                let m = self.live[i].m;
                self.live[i].last_step = now;
                match self.model.attempts[m].phase {
                    Phase::AwaitUsage => {
                        let step = self.live[i].attempt.on_usage(usage.raw(), now).unwrap();
                        let expect = self.model.on_usage(m, usage);
                        self.settle_step(i, step, expect)?;
                    }
                    Phase::AwaitPrefix => {
                        let step = self.live[i].attempt.on_prefix(prefix.raw(), now).unwrap();
                        let expect = self.model.on_prefix(m, prefix);
                        self.settle_step(i, step, expect)?;
                    }
                    Phase::Asleep => self.wake(i)?,
                    Phase::Done => unreachable!("live attempts are not done"),
                }
            }
            Op::WakeDue => {
                // One pass over the sleepers of this instant, oldest first.
                let mut ms: Vec<usize> = self.live.iter().map(|l| l.m).collect();
                ms.sort();
                for m in ms {
                    let Some(i) = self.live.iter().position(|l| l.m == m) else {
                        continue;
                    };
                    let l = &self.live[i];
                    let notified = l.wakes.load(Ordering::SeqCst) > l.wakes_seen;
                    if self.model.attempts[m].phase == Phase::Asleep && (notified || l.until <= now)
                    {
                        self.wake(i)?;
                    }
                }
            }
            Op::Advance { by } => self.model.now += by,
            Op::Release { k } => {
                if !self.leases.is_empty() {
                    let (token, lease) = self.leases.remove(k % self.leases.len());
                    self.core.release(token, now);
                    self.model.release(lease);
                }
            }
            Op::Finish { s } => {
                let got = self.core.finish_session(SESSIONS[s], now);
                let expected = self.model.finish(s);
                prop_assert_eq!(got, expected, "finish_session's final figures");
            }
            Op::Cancel { s } => {
                let got = self.core.cancel_session(SESSIONS[s]);
                prop_assert_eq!(got, self.model.cancel(s), "cancel_session");
            }
            Op::Abandon { a } => {
                if !self.live.is_empty() {
                    let i = a % self.live.len();
                    let live = self.live.remove(i);
                    if a % 2 == 0 {
                        let mut attempt = live.attempt;
                        attempt.abandon(now);
                        self.model.abandon(live.m);
                    } else {
                        // Dropped mid-step: abandoned at the last time it was given.
                        drop(live.attempt);
                        let now = std::mem::replace(&mut self.model.now, live.last_step);
                        self.model.abandon(live.m);
                        self.model.now = now;
                    }
                }
            }
            Op::Purge => {
                self.core.purge(now);
                self.model.purge();
            }
            Op::Close => {
                self.core.close();
                self.model.close();
            }
        }
        Ok(())
    }

    /// The six invariants, checked against the model after every step. The
    /// core is observed at time 0: observation purges nothing that is due
    /// (every timer is later than the start time), so checking does not
    /// change what the next step sees.
    fn check(&self) -> Result<(), TestCaseError> {
        let model = &self.model;
        // 1, 3, 6: every gate-wide figure (lease, pending, waiting and
        // reservation gauges, admissions by reason, preemptions, waits...).
        let got = self.core.stats(0);
        let expected = model.expected_gate_stats();
        prop_assert_eq!(&got, &expected, "gate stats");
        // 1: admissions by reason add up to the leases issued; leases held
        // are the ones not yet released.
        prop_assert_eq!(got.total_admissions(), self.lease_ids.len() as u64);
        prop_assert_eq!(got.active_leases, self.leases.len() as u64);
        prop_assert_eq!(got.releases, got.total_admissions() - got.active_leases);
        // 2, 3, 6: each session's record, reservation (with its exact end)
        // and counters; at most one attempt pending per session.
        for (s, id) in SESSIONS.iter().enumerate() {
            let got = self.core.session_stats(id, 0);
            let expected = model
                .sessions
                .get(&s)
                .map(|r| Model::session_stats_of(r, 0));
            prop_assert_eq!(&got, &expected, "session {}", s);
            let pending = self
                .live
                .iter()
                .filter(|l| {
                    let a = &model.attempts[l.m];
                    a.session == s && a.fate == Fate::Active
                })
                .count();
            prop_assert!(pending <= 1, "two attempts of session {s} compete");
        }
        // 2: a reservation exists only with a retaining lease out (in
        // flight) or as the grace window after one.
        for (token, lease) in &self.leases {
            prop_assert_eq!(token.admission().retain_session, lease.window.is_some());
        }
        // 4: whoever must have been woken was.
        for l in &self.live {
            if model.attempts[l.m].must_be_notified {
                prop_assert!(
                    l.wakes.load(Ordering::SeqCst) > l.wakes_seen,
                    "attempt {} was not woken (lost wake-up)",
                    l.m
                );
            }
        }
        // 4: no missed expiry: the core's next deadline is no later than
        // the earliest window's end, and while anyone sleeps and a window is
        // pending, some sleeper wakes no later than it (its driver folded
        // the deadline in) or has a notification to act on (a nudge).
        let earliest = model
            .sessions
            .values()
            .filter_map(|r| match r.res {
                Res::Grace { until, .. } => Some(until),
                _ => None,
            })
            .min();
        if let Some(end) = earliest {
            let next = self.core.next_deadline();
            prop_assert!(
                next.is_some_and(|d| d <= end),
                "next_deadline {next:?} is later than the expiry at {end}"
            );
        }
        if let (Some(end), false) = (earliest, model.queue.is_empty()) {
            let watched = self.live.iter().any(|l| {
                model.attempts[l.m].phase == Phase::Asleep
                    && (l.until <= end || l.wakes.load(Ordering::SeqCst) > l.wakes_seen)
            });
            prop_assert!(watched, "nobody wakes for the expiry at {end}");
        }
        Ok(())
    }
}

fn run(config: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(config);
    h.check()?;
    // KVGATE_TRACE=1 prints each step of a (shrunk) failing case.
    let trace = std::env::var_os("KVGATE_TRACE").is_some();
    for op in ops {
        h.apply(op)?;
        if trace {
            let live: Vec<_> = h
                .live
                .iter()
                .map(|l| (l.m, h.model.attempts[l.m].phase))
                .collect();
            eprintln!("{op:?}\n    queue {:?} live {live:?}", h.model.queue);
        }
        h.check()?;
    }
    // Everything can be wound down: release every lease, end every attempt.
    while let Some((token, lease)) = h.leases.pop() {
        h.core.release(token, h.now());
        h.model.release(lease);
        h.check()?;
    }
    while let Some(mut l) = h.live.pop() {
        l.attempt.abandon(h.now());
        h.model.abandon(l.m);
        h.check()?;
    }
    let s = h.core.stats(0);
    COVERAGE.with(|c| c.borrow_mut().add(&s, &h.model.passed_on));
    prop_assert_eq!(
        (s.active_leases, s.pending_attempts, s.waiting_attempts),
        (0, 0, 0)
    );
    prop_assert_eq!(s.reserved_in_flight, 0);
    Ok(())
}

/// What the generated cases reached, summed over a run: a guard against a
/// generator that silently stops exercising part of the machine.
#[derive(Debug, Default)]
struct Coverage {
    cases: u64,
    admissions_by_reason: [u64; 4],
    waits: u64,
    grace_expired: u64,
    preempted: u64,
    timed_out: u64,
    cancelled: u64,
    closed: u64,
    sessions_finished: u64,
    sessions_retired: u64,
    passed_on: [u64; 2],
}

impl Coverage {
    fn add(&mut self, s: &GateStats, passed_on: &[u64; 2]) {
        self.cases += 1;
        for (total, n) in self
            .admissions_by_reason
            .iter_mut()
            .zip(s.admissions_by_reason)
        {
            *total += n;
        }
        self.waits += s.waits;
        self.grace_expired += s.grace_expired;
        self.preempted += s.preempted;
        self.timed_out += s.timed_out;
        self.cancelled += s.cancelled;
        self.closed += s.closed;
        self.sessions_finished += s.sessions_finished;
        self.sessions_retired += s.sessions_retired;
        self.passed_on[0] += passed_on[0];
        self.passed_on[1] += passed_on[1];
    }
}

thread_local! {
    static COVERAGE: std::cell::RefCell<Coverage> = std::cell::RefCell::default();
}

#[test]
fn the_core_behaves_as_the_reference_model() {
    let config = ProptestConfig {
        cases: proptest_cases::cases(1024),
        max_shrink_iters: 20_000,
        // tests/proptest_core.proptest-regressions, committed: failures
        // found once are replayed first on every run.
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    };
    let cases = config.cases;
    let strategy = (
        self::config(),
        prop::collection::vec(op(), 1..150),
        prop::option::weighted(0.15, any::<prop::sample::Index>()),
    );
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&strategy, |(config, mut ops, close_at)| {
        if let Some(at) = close_at {
            let at = at.index(ops.len() + 1);
            ops.insert(at, Op::Close);
        }
        run(config, &ops)
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
    let c = COVERAGE.with(|c| std::mem::take(&mut *c.borrow_mut()));
    eprintln!("proptest_core: {cases} cases; reached {c:?}");
    if cases >= 256 {
        // Every row of the table, every way to end, and both hand-offs of
        // an unused event, many times over at the default case count.
        let reached = [
            c.admissions_by_reason[0],
            c.admissions_by_reason[1],
            c.admissions_by_reason[2],
            c.admissions_by_reason[3],
            c.waits,
            c.grace_expired,
            c.preempted,
            c.timed_out,
            c.cancelled,
            c.closed,
            c.sessions_finished,
            c.sessions_retired,
            c.passed_on[0],
            c.passed_on[1],
        ];
        assert!(
            reached.iter().all(|&n| n >= 10),
            "the generator misses part of the machine: {c:?}"
        );
    }
}
