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
//!
//! Nothing a driver does can leak: an [`Attempt`] holds its core (`&Core`
//! for a driver on one stack, `Arc<Core>` for one that keeps attempts in a
//! table, as an event loop does), and dropping it before it ended abandons
//! it (counted as cancelled, its pending waiter and any wake-up it was handed
//! passed on). A step called out of order, or after the end, is refused
//! with a [`StepError`] and changes nothing.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::time::Duration;

use super::lease_token::{Admission, Grant, LeaseToken};
use super::ledger::Turn;
use super::policy::{Holds, Pass};
use super::probe_answer::ProbeAnswer;
use super::prompt::PromptSketch;
use super::reason::Reason;
use super::reference::{Decision, Facts};
use super::sessions::{SessionKey, ShardMap};
use super::stats::Probed;
use super::waiters::{
    Enqueued, Notify, Waiter, ACTIVE, CANCELLED, ENDED, PREEMPTED, RELEASED, WAKE_EVENT,
};
use super::working_set::{EngineCapacity, TierError};
use super::Core;
use crate::error::AcquireError;
use crate::sync::{Arc, Ordering};

/// What the driver of an attempt must do next.
///
/// Deliberately exhaustive: a new step (a new probe, say) must be handled by
/// every driver, so adding one is meant to fail their build.
#[derive(Debug)]
#[must_use]
pub enum Step {
    /// Call the usage probe (no gate lock is held), then [`Attempt::on_usage`].
    ProbeUsage,
    /// Call the prefix probe, then [`Attempt::on_prefix`].
    ProbePrefix,
    /// Sleep until the attempt's notifier fires or the clock reaches
    /// `until_ns` (the attempt's poll or timeout), then call
    /// [`Attempt::on_wake`]. A driver also wakes by [`Core::next_deadline`]
    /// if no other sleeper of its does (one is enough).
    Sleep {
        /// Absolute deadline on the driver's clock.
        until_ns: u64,
    },
    /// Admitted. The token must be released through [`Core::release`].
    Admitted(LeaseToken),
    /// Ended without a lease.
    Failed(AcquireError),
}

/// A step the attempt did not ask for: refused, and the attempt is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepError {
    /// `called` is not the step the attempt is waiting for (`expected`).
    OutOfOrder {
        /// The method that was called.
        called: &'static str,
        /// The method the attempt's last [`Step`] asked for.
        expected: &'static str,
    },
    /// The attempt has ended (admitted or failed): it takes no more steps.
    Ended {
        /// The method that was called.
        called: &'static str,
    },
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::OutOfOrder { called, expected } => {
                write!(f, "{called} called while the attempt waits for {expected}")
            }
            StepError::Ended { called } => write!(f, "{called} called on an ended attempt"),
        }
    }
}

impl std::error::Error for StepError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    New,
    AwaitUsage,
    AwaitPrefix,
    Asleep,
    Done,
}

impl Phase {
    /// The call this phase waits for.
    fn awaits(self) -> &'static str {
        match self {
            Phase::New => "start",
            Phase::AwaitUsage => "on_usage",
            Phase::AwaitPrefix => "on_prefix",
            Phase::Asleep => "on_wake",
            Phase::Done => "nothing",
        }
    }
}

impl Core {
    /// Begins an attempt for `session` at `now`, driven through `&self`
    /// ([`Attempt::begin`] takes an `Arc<Core>` or any other handle).
    ///
    /// Any older attempt of the same session that is still competing for
    /// admission is preempted here: its fate is sealed under the session's
    /// lock and it is woken at once. `deadline` (absolute, same clock as
    /// `now`) bounds how long the attempt may wait. `notifier` is how the
    /// core wakes whoever drives this attempt.
    pub fn begin(
        &self,
        session: &[u8],
        prompt_len: usize,
        now: u64,
        deadline: Option<u64>,
        notifier: Box<dyn Notify>,
    ) -> Result<Attempt<&Self>, AcquireError> {
        Attempt::begin(self, session, prompt_len, now, deadline, notifier)
    }
}

/// One attempt to be admitted; see the module docs for the protocol.
///
/// `C` is how the attempt holds its core: `&Core` ([`Core::begin`]) or
/// `Arc<Core>` ([`Attempt::begin`] with a clone). Dropping an attempt that
/// has not ended abandons it, as [`Attempt::abandon`] does at the last time
/// it was given.
#[derive(Debug)]
#[must_use = "an attempt does nothing until its steps are driven (dropping it abandons it)"]
pub struct Attempt<C: Deref<Target = Core>> {
    core: C,
    machine: Machine,
}

impl<C: Deref<Target = Core>> Attempt<C> {
    /// Begins an attempt for `session` at `now` on `core` (see
    /// [`Core::begin`], which is this with `&Core`).
    pub fn begin(
        core: C,
        session: &[u8],
        prompt_len: usize,
        now: u64,
        deadline: Option<u64>,
        notifier: Box<dyn Notify>,
    ) -> Result<Self, AcquireError> {
        let waiter = Arc::new(Waiter::new(notifier));
        Self::begin_with_waiter(core, session, prompt_len, now, deadline, waiter)
    }

    /// [`Attempt::begin`] with a waiter nobody else holds: a new one, or one
    /// that [`Attempt::into_spare_waiter`] handed back. The blocking gate
    /// keeps one per thread, so its attempts allocate nothing.
    pub(crate) fn begin_with_waiter(
        core: C,
        session: &[u8],
        prompt_len: usize,
        now: u64,
        deadline: Option<u64>,
        waiter: Arc<Waiter>,
    ) -> Result<Self, AcquireError> {
        let (waiter, key) = core.register_attempt(session, now, waiter)?;
        Ok(Self {
            core,
            machine: Machine::new(waiter, key, prompt_len, now, deadline),
        })
    }

    /// Tells the attempt what its prompt looks like, before its first
    /// step: working-set admission then knows how much of it the session's
    /// previous prompt began with, and learns the cache's capacity only
    /// from what should have hit ([`PromptSketch`]). Without it, a turn is
    /// taken to extend the previous one when it is long enough to.
    pub fn set_prompt_sketch(&mut self, sketch: PromptSketch) {
        self.machine.sketch = Some(sketch);
    }

    /// Takes back the sketch given with [`Attempt::set_prompt_sketch`], for
    /// the driver to refill for its next attempt.
    pub(crate) fn take_prompt_sketch(&mut self) -> Option<PromptSketch> {
        self.machine.sketch.take()
    }

    /// Gate-unique id of this attempt; ids of one session grow over time.
    pub fn id(&self) -> u64 {
        self.machine.waiter.attempt_id
    }

    /// The session this attempt is for.
    pub fn session_id(&self) -> &[u8] {
        &self.machine.key.bytes
    }

    /// Whether the attempt has ended.
    pub fn is_done(&self) -> bool {
        self.machine.phase == Phase::Done
    }

    /// The core this attempt belongs to.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// First step: begins the first pass.
    pub fn start(&mut self, now: u64) -> Result<Step, StepError> {
        self.machine.expect(Phase::New, "start", now)?;
        Ok(self.machine.new_pass(&self.core, now))
    }

    /// Feeds the usage probe's raw answer, received at `now`.
    pub fn on_usage(&mut self, raw: Option<f64>, now: u64) -> Result<Step, StepError> {
        self.on_cache_state(raw, None, now)
    }

    /// Feeds the answers to `Step::ProbeUsage`: the raw usage and, when
    /// the engine tells it, its capacity (working-set admission needs it;
    /// reference mode ignores it), received at `now`.
    pub fn on_cache_state(
        &mut self,
        usage: Option<f64>,
        capacity: Option<EngineCapacity>,
        now: u64,
    ) -> Result<Step, StepError> {
        self.on_engine_answers(usage, capacity, false, now)
    }

    /// As [`Attempt::on_cache_state`], from a host that always speaks of
    /// a tier (a tier probe): a capacity answer with none after one was
    /// told is refused where it is recorded, not before.
    pub(crate) fn on_engine_answers(
        &mut self,
        usage: Option<f64>,
        capacity: Option<EngineCapacity>,
        says_tier: bool,
        now: u64,
    ) -> Result<Step, StepError> {
        self.machine.expect(Phase::AwaitUsage, "on_usage", now)?;
        self.machine.capacity = capacity;
        self.machine.says_tier = says_tier;
        Ok(self.machine.on_usage(&self.core, usage, now))
    }

    /// As [`Attempt::on_cache_state`], from a host that must hear of a
    /// refused answer before its attempt moves on (the C ABI's event loop):
    /// the capacity as the host's figures made it (`Err`: refused in
    /// itself), speaking of a tier, so none after one was told is refused.
    /// The answer is checked where it is recorded ([`Core::take_engine_answer`]):
    /// a refused one is counted there, changes nothing and is refused here
    /// (the outer `Err`) whatever the attempt's step, which it stays at.
    pub(crate) fn on_told_answers(
        &mut self,
        usage: Option<f64>,
        capacity: Result<Option<EngineCapacity>, TierError>,
        now: u64,
    ) -> Result<Result<Step, StepError>, TierError> {
        // Recorded by the step that takes it while the attempt may still
        // decide on it (what `Machine::decide` checks before it asks the
        // policy, which would record it); any other call only checks it.
        let takes_it =
            self.machine.phase == Phase::AwaitUsage && self.machine.fate(&self.core).is_none();
        self.core.take_engine_answer(capacity, takes_it)?;
        Ok(self.on_cache_state(usage, None, now))
    }

    /// Feeds the prefix probe's raw answer, received at `now`.
    pub fn on_prefix(&mut self, raw: Option<f64>, now: u64) -> Result<Step, StepError> {
        self.machine.expect(Phase::AwaitPrefix, "on_prefix", now)?;
        Ok(self.machine.on_prefix(&self.core, raw, now))
    }

    /// After a `Sleep`: the notifier fired or `until` passed (or the driver
    /// woke spuriously; that is harmless).
    pub fn on_wake(&mut self, now: u64) -> Result<Step, StepError> {
        self.machine.expect(Phase::Asleep, "on_wake", now)?;
        Ok(self.machine.on_wake(&self.core, now))
    }

    /// Ends the attempt early (its driver gave up, e.g. a probe panicked).
    /// Counted as cancelled. A no-op once the attempt is done.
    pub fn abandon(&mut self, now: u64) {
        if self.machine.phase != Phase::Done {
            let _ = self.machine.fail(&self.core, AcquireError::Cancelled, now);
        }
    }

    /// Ends the attempt from outside with `why`, whatever step it is at (its
    /// driver waits on a probe answer, or sleeps): [`AcquireError::Preempted`]
    /// (its host preempted it: counted as preempted, in the session's
    /// `num_preempted` too) or [`AcquireError::TimedOut`] (a probe hung past
    /// its timeout: counted as timed out). Frees and hands over exactly as
    /// [`Attempt::abandon`] does; if a newer attempt or a cancel sealed its
    /// fate first, that outcome is the one counted and returned. Any other
    /// `why` is [`AcquireError::Cancelled`]'s abandon. Refused with
    /// [`StepError::Ended`] once the attempt has ended.
    pub fn end(&mut self, why: AcquireError, now: u64) -> Result<Step, StepError> {
        if self.machine.phase == Phase::Done {
            return Err(StepError::Ended { called: "end" });
        }
        self.machine.last_seen = self.machine.last_seen.max(now);
        Ok(match why {
            // Sealed here as a newer attempt would seal it, so that nothing
            // can admit it any more; counted by `end_attempt`, not by
            // `register_attempt`, which did not seal it.
            AcquireError::Preempted if self.machine.waiter.set_fate(PREEMPTED) => {
                self.machine
                    .end(&self.core, AcquireError::Preempted, true, now)
            }
            // Sealed first by someone else: `fail` reports that fate.
            AcquireError::Preempted => self.machine.fail(&self.core, AcquireError::Cancelled, now),
            other => self.machine.fail(&self.core, other, now),
        })
    }

    /// The waiter of this ended attempt, if nothing else holds it any more, so
    /// its driver can begin its next attempt with it
    /// ([`Attempt::begin_with_waiter`]) instead of allocating one.
    pub(crate) fn into_spare_waiter(self) -> Option<Arc<Waiter>> {
        debug_assert!(
            self.is_done(),
            "only an ended attempt gives its waiter back"
        );
        // `Drop` would only abandon, which an ended attempt does not need;
        // taking the fields out by value needs it not to run at all.
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, and each field is
        // read out of it exactly once, so each is dropped exactly once.
        let (core, machine) =
            unsafe { (std::ptr::read(&this.core), std::ptr::read(&this.machine)) };
        drop(core);
        // No `Weak` to a waiter is ever made, so a strong count of one means
        // nobody else can reach it (and `register_attempt` asserts it again).
        (Arc::strong_count(&machine.waiter) == 1).then_some(machine.waiter)
    }
}

impl<C: Deref<Target = Core>> Drop for Attempt<C> {
    fn drop(&mut self) {
        let now = self.machine.last_seen;
        self.abandon(now);
    }
}

/// The attempt's own state and steps; [`Attempt`] pairs it with its core.
#[derive(Debug)]
struct Machine {
    waiter: Arc<Waiter>,
    key: SessionKey,
    prompt_len: usize,
    /// What the prompt looks like, if the driver said ([`Attempt::set_prompt_sketch`]).
    sketch: Option<PromptSketch>,
    started: u64,
    /// The latest time a step was given: what an abandon by drop uses.
    last_seen: u64,
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
    /// The engine's capacity, as answered in this pass.
    capacity: Option<EngineCapacity>,
    /// The answer speaks of a tier even when it tells none.
    says_tier: bool,
}

const NO_FACTS: Facts = Facts {
    usage: None,
    reserved: false,
    prefix: None,
};

impl Machine {
    fn new(
        waiter: Arc<Waiter>,
        key: SessionKey,
        prompt_len: usize,
        now: u64,
        deadline: Option<u64>,
    ) -> Self {
        Self {
            waiter,
            key,
            prompt_len,
            sketch: None,
            started: now,
            last_seen: now,
            deadline,
            phase: Phase::New,
            facts: NO_FACTS,
            pass_epoch: 0,
            poll_deadline: None,
            waited: false,
            holding_event: false,
            capacity: None,
            says_tier: false,
        }
    }

    /// Refuses a call the attempt is not waiting for, changing nothing.
    fn expect(&mut self, phase: Phase, called: &'static str, now: u64) -> Result<(), StepError> {
        if self.phase == phase {
            self.last_seen = self.last_seen.max(now);
            return Ok(());
        }
        Err(match self.phase {
            Phase::Done => StepError::Ended { called },
            other => StepError::OutOfOrder {
                called,
                expected: other.awaits(),
            },
        })
    }

    fn on_usage(&mut self, core: &Core, raw: Option<f64>, now: u64) -> Step {
        let answer = ProbeAnswer::from_raw(raw);
        self.facts.usage = Some(answer);
        self.decide(core, now, Some(Probed::Usage(answer)))
    }

    fn on_prefix(&mut self, core: &Core, raw: Option<f64>, now: u64) -> Step {
        let answer = ProbeAnswer::from_raw(raw);
        self.facts.prefix = Some(answer);
        self.decide(core, now, Some(Probed::Prefix(answer)))
    }

    /// Takes a capacity event handed to this attempt, if any.
    fn take_event(&mut self) {
        if self.waiter.wake.swap(0, Ordering::SeqCst) & WAKE_EVENT != 0 {
            self.holding_event = true;
        }
    }

    fn on_wake(&mut self, core: &Core, now: u64) -> Step {
        self.take_event();
        if let Some(err) = self.fate(core) {
            return self.fail(core, err, now);
        }
        let poll_due = self.poll_deadline.is_some_and(|p| now >= p);
        if self.holding_event || poll_due {
            core.waiters.dequeue(&self.waiter);
            return self.new_pass(core, now);
        }
        if self.deadline.is_some_and(|d| now >= d) {
            return self.fail(core, AcquireError::TimedOut, now);
        }
        // Woken for a deadline the driver folded in (`Core::next_deadline`),
        // a tick or a nudge: fire what is due (which may hand an event to
        // this very attempt), else sleep on in place.
        core.purge(now);
        if core.waiters.still_queued(&self.waiter) {
            return Step::Sleep {
                until_ns: self.sleep_until(),
            };
        }
        // Taken out of the queue meanwhile: by an event or a fate.
        self.take_event();
        if let Some(err) = self.fate(core) {
            return self.fail(core, err, now);
        }
        self.new_pass(core, now)
    }

    fn new_pass(&mut self, core: &Core, now: u64) -> Step {
        if let Some(err) = self.fate(core) {
            return self.fail(core, err, now);
        }
        core.purge(now);
        self.facts = NO_FACTS;
        self.poll_deadline = None;
        self.pass_epoch = core.epoch();
        self.phase = Phase::AwaitUsage;
        if self.waited && core.policy().waiter_asks_again_unprobed() {
            // A working-set waiter asks the ledger again without asking the
            // engine: its place and any grant handed over while it slept are
            // the ledger's, and the members' own passes keep the engine's
            // figures fresh. Each probe is an RPC the engine answers between
            // steps, so a waiter handed room is admitted a step sooner, and
            // a waited admission costs one probe, not one per wake-up.
            self.capacity = None;
            return self.decide(core, now, None);
        }
        Step::ProbeUsage
    }

    /// Runs the table under the session's lock; an admission is granted
    /// under the same lock, so a sealed fate and an admission never meet.
    fn decide(&mut self, core: &Core, now: u64, probed: Option<Probed>) -> Step {
        let (index, shard) = core.shard_of(&self.key);
        let mut guard = shard.lock();
        // Counted under the lock, like every other counter of the shard.
        if let Some(probed) = probed {
            shard.counters.count_probe(probed);
        }
        // Checked under the lock that admission takes: a newer attempt or a
        // cancel sealed our fate before, or sees us admitted after.
        if let Some(err) = self.fate(core) {
            drop(guard);
            return self.fail(core, err, now);
        }
        let ShardMap { sessions, ids } = &mut *guard;
        let record = ShardMap::own_record(sessions, &self.key)
            .expect("a record with a pending attempt is never dropped");
        debug_assert!(
            record
                .pending
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(p, &self.waiter)),
            "an attempt whose fate is open is its session's pending one"
        );
        if !core.policy().passes_capacity_events() {
            // The event is the grant itself, which the ledger keeps: one
            // handed over earlier is collected by this request, one
            // handed over after it sets the bit again, so the sleep below
            // looks again. Taken here so that a bit left from a grant
            // withdrawn meanwhile (its session was finished) does not make
            // each later wait look again at the same instant, asking the
            // usage probe in a loop.
            self.take_event();
        }
        let pass = Pass {
            key: &self.key,
            prompt_len: self.prompt_len,
            sketch: self.sketch.as_ref(),
            facts: self.facts,
            capacity: self.capacity,
            says_tier: self.says_tier,
        };
        let (decision, holds, grants) = core.policy().decide(record, pass, now);
        let step = match decision {
            Decision::Admit(reason) => {
                let grant = Grant {
                    reason,
                    prompt_len: self.prompt_len,
                    waited: self.waited.then(|| now.saturating_sub(self.started)),
                    holds,
                };
                let (lease_id, holds) = core.grant(record, ids, index, &shard.counters, grant, now);
                drop(guard);
                self.admitted(core, reason, lease_id, holds, now)
            }
            Decision::AskPrefix => {
                drop(guard);
                self.phase = Phase::AwaitPrefix;
                Step::ProbePrefix
            }
            Decision::Wait => {
                drop(guard);
                self.sleep(core, now)
            }
            Decision::AskUsage => unreachable!("every pass is decided after its usage answer"),
        };
        core.hand_over(grants);
        step
    }

    /// The step of an admission granted as `lease_id`, holding `holds`;
    /// called with no lock held.
    fn admitted(
        &mut self,
        core: &Core,
        reason: Reason,
        lease_id: u64,
        holds: Holds,
        now: u64,
    ) -> Step {
        self.phase = Phase::Done;
        if self.holding_event && core.policy().passes_capacity_events() {
            // Admitted on an event: capacity may remain, let the next
            // one look. (The working set hands its grants over itself.)
            core.pass_on_event();
        }
        let admission = Admission {
            lease_id,
            reason,
            wait: Duration::from_nanos(now.saturating_sub(self.started)),
            waited: self.waited,
            usage: self.facts.usage.and_then(ProbeAnswer::value),
            hit_ratio: self.facts.prefix.and_then(ProbeAnswer::value),
            // A window of the seed's table, or a stay in the working set
            // (which every admission there holds).
            retain_session: holds != Holds::Nothing,
        };
        let turn = Turn {
            prompt_len: self.prompt_len,
            admitted_at: now,
        };
        Step::Admitted(LeaseToken::new(self.key.clone(), admission, holds, turn))
    }

    fn sleep(&mut self, core: &Core, now: u64) -> Step {
        // Waiting again absorbs any event we held: pressure persists.
        self.holding_event = false;
        if self.deadline.is_some_and(|d| now >= d) {
            return self.fail(core, AcquireError::TimedOut, now);
        }
        let epoch = self.pass_epoch;
        let enqueued = core.waiters.enqueue(&self.waiter, || {
            core.epoch() != epoch
                || core.is_closed()
                || self.waiter.fate() != ACTIVE
                || self.waiter.wake.load(Ordering::SeqCst) & WAKE_EVENT != 0
        });
        match enqueued {
            Enqueued::LookAgain => self.new_pass(core, now),
            Enqueued::Asleep => {
                self.waited = true;
                self.phase = Phase::Asleep;
                self.poll_deadline = Some(now.saturating_add(core.poll_ns));
                Step::Sleep {
                    until_ns: self.sleep_until(),
                }
            }
        }
    }

    /// The attempt's own deadlines: its poll and its timeout. The core's
    /// (`Core::next_deadline`) are the driver's to fold in.
    fn sleep_until(&self) -> u64 {
        let until = self.poll_deadline.expect("set when the pass first slept");
        self.deadline.map_or(until, |d| until.min(d))
    }

    /// Closed, preempted or cancelled, checked in that order.
    fn fate(&self, core: &Core) -> Option<AcquireError> {
        if core.is_closed() {
            return Some(AcquireError::Closed);
        }
        match self.waiter.fate() {
            PREEMPTED => Some(AcquireError::Preempted),
            CANCELLED => Some(AcquireError::Cancelled),
            RELEASED => Some(AcquireError::Released),
            _ => None,
        }
    }

    fn fail(&mut self, core: &Core, err: AcquireError, now: u64) -> Step {
        self.end(core, err, false, now)
    }

    /// `fail`, told whether its host sealed it preempted (`Attempt::end`):
    /// then nobody counted it yet and no successor holds its place.
    fn end(&mut self, core: &Core, mut err: AcquireError, by_host: bool, now: u64) -> Step {
        debug_assert_ne!(self.phase, Phase::Done);
        self.phase = Phase::Done;
        core.waiters.dequeue(&self.waiter);
        // An event handed to this attempt that it never took with `on_wake`
        // (its driver abandoned it while it slept) is passed on below like a
        // held one, or the next sleeper would sleep until its poll.
        self.take_event();
        // Each attempt ends exactly one way: an attempt ending by itself
        // seals its fate, and if a newer attempt or a cancel sealed it
        // first, that is the outcome reported (and counted) instead.
        if !matches!(err, AcquireError::Preempted) && !self.waiter.set_fate(ENDED) {
            err = match self.waiter.fate() {
                PREEMPTED => AcquireError::Preempted,
                CANCELLED => AcquireError::Cancelled,
                RELEASED => AcquireError::Released,
                other => unreachable!("fate {other} is sealed once, by begin or cancel"),
            };
        }
        let waited = self.waited.then(|| now.saturating_sub(self.started));
        core.end_attempt(&self.key, &self.waiter, err, by_host, waited, now);
        if std::mem::take(&mut self.holding_event) && core.policy().passes_capacity_events() {
            core.pass_on_event();
        }
        Step::Failed(err)
    }
}
