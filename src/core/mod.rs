//! The sans-IO core: shared state and the per-attempt decision machine.
//!
//! [`Core`] holds the session table, the waiter registry, the lazy timers and
//! the counters. It reads no clock (every call takes `now` in monotonic
//! nanoseconds), calls no probe and spawns nothing. An [`Attempt`] is one
//! `acquire` in progress: a small state machine that asks its driver to probe
//! usage, probe the prefix, or sleep, and ends admitted or failed. The
//! blocking [`Gate`](crate::Gate) drives it with threads and a real clock; a
//! simulator or an event loop can drive the very same machine.
//!
//! ```
//! use kvgate::core::{Core, Step, Notify};
//! use kvgate::Config;
//!
//! struct NoWake;
//! impl Notify for NoWake { fn notify(&self) {} }
//!
//! let core = Core::new(Config::reference()).unwrap();
//! let mut attempt = core.begin(b"session-1", 1000, 0, None, Box::new(NoWake)).unwrap();
//! assert!(matches!(attempt.start(0), Ok(Step::ProbeUsage)));
//! // The engine says the cache is at 40%: admitted "open".
//! let Ok(Step::Admitted(lease)) = attempt.on_usage(Some(0.40), 1) else { panic!() };
//! assert_eq!(lease.admission().reason.as_str(), "open");
//! core.release(lease, 2);
//! ```

mod attempt;
mod host_hints;
mod lease_token;
mod ledger;
mod policy;
mod probe_answer;
pub mod prompt;
mod reason;
pub(crate) mod reference;
pub(crate) mod sessions;
mod shrink;
pub(crate) mod stats;
pub mod summary;
pub(crate) mod timers;
pub(crate) mod waiters;
pub mod working_set;

use std::fmt;

pub use attempt::{Attempt, Step, StepError};
pub use lease_token::{Admission, LeaseToken};
pub use probe_answer::ProbeAnswer;
pub use prompt::PromptSketch;
pub use reason::Reason;
pub use stats::{GateStats, ReservationState, SessionStats};
pub use waiters::Notify;

use crate::config::{AdmissionMode, Config, ConfigError};
use crate::error::{AcquireError, ReleaseError};
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use ledger::{Grants, Ledger};
use policy::{Holds, Policy};
use reference::{Table, Thresholds};
use sessions::session_stats_of;
use sessions::{bump, SessionKey, SessionRecord, SessionTable};
use stats::ShardCounters;
use timers::{TimerQueue, NEVER};
pub(crate) use waiters::Waiter;
use waiters::{Waiters, CANCELLED, PREEMPTED, RELEASED};
use working_set::{Tuning, TurnReport, WorkingSet};

/// Most timer entries one caller fires at once: bounds the latency a purge
/// adds to whoever happens to look; the rest is left to the next caller.
const PURGE_BATCH: usize = 64;

/// Most shards a table may have: ids keep the shard index in their low bits.
const MAX_SHARDS: usize = 1 << 16;

/// The session table's shard count when the caller does not choose one:
/// eight per CPU, 16 to 256 (a few KiB each), so threads rarely meet on one
/// lock; 2 under loom.
pub fn default_shard_count() -> usize {
    1 << crate::sync::default_shard_bits(8, 16, 256)
}

/// The gate's shared state, driven through [`Attempt`]s.
pub struct Core {
    /// The admission policy in force, told of every event of the lifecycle.
    policy: Policy,
    config: Config,
    poll_ns: u64,
    retention_ns: u64,
    table: SessionTable,
    waiters: Waiters,
    retire_timers: TimerQueue,
    /// Bumped by every capacity event (release, finish, expiry) before its
    /// waiter is woken: an attempt that saw it change while it was probing
    /// looks again instead of sleeping.
    epoch: AtomicU64,
    closed: AtomicBool,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("config", &self.config)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Core {
    /// A core with validated `config` and [`default_shard_count`] shards.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_shards(config, default_shard_count())
    }

    /// A core with validated `config` whose session table has `shards`
    /// lock shards: a power of two from 1 to 65,536 (more shards, fewer
    /// threads meeting on one lock, a few hundred bytes each).
    pub fn with_shards(config: Config, shards: usize) -> Result<Self, ConfigError> {
        Self::with_tuning(config, shards, Tuning::default())
    }

    /// [`Core::with_shards`] with the working set's constants given (tests
    /// that check the fit rules exactly turn off the cold rule with
    /// `cold_margin: f64::INFINITY`).
    #[doc(hidden)]
    pub fn with_tuning(config: Config, shards: usize, tuning: Tuning) -> Result<Self, ConfigError> {
        config.validate()?;
        if !shards.is_power_of_two() || shards > MAX_SHARDS {
            return Err(ConfigError {
                field: "shards",
                value: shards.to_string(),
                expected: "a power of two from 1 to 65536",
            });
        }
        let policy = match config.admission {
            AdmissionMode::WorkingSet => Policy::WorkingSet(Ledger::new(WorkingSet::new(tuning))),
            AdmissionMode::Reference => Policy::Reference(Table::new(
                Thresholds {
                    high_watermark: config.high_watermark,
                    hit_threshold: config.hit_threshold,
                },
                config.idle_grace_ns(),
            )),
        };
        Ok(Self {
            policy,
            poll_ns: config.wait_poll_ns(),
            retention_ns: config.session_retention_ns(),
            config,
            table: SessionTable::new(shards.trailing_zeros()),
            waiters: Waiters::new(),
            retire_timers: TimerQueue::new(),
            epoch: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether admission learns from the prompts' sketches
    /// ([`Attempt::set_prompt_sketch`]): working-set admission does, the
    /// reference table does not (a driver need not build them).
    pub fn wants_prompt_sketch(&self) -> bool {
        self.policy.reads_capacity()
    }

    /// Whether admission uses the engine's capacity (the capacity probe's
    /// answer with each usage answer): working-set admission does, the
    /// reference table does not (a driver must not ask the engine for it).
    pub fn wants_capacity(&self) -> bool {
        self.policy.reads_capacity()
    }

    /// Makes `waiter` (which nobody else holds) the pending attempt of
    /// `session`, preempting an older one; returns the waiter, named, and the
    /// session's key.
    pub(crate) fn register_attempt(
        &self,
        session: &[u8],
        now: u64,
        mut waiter: Arc<Waiter>,
    ) -> Result<(Arc<Waiter>, SessionKey), AcquireError> {
        let hash = self.table.hash(session);
        let index = self.table.shard_index(hash);
        let shard = self.table.shard(index);
        if self.is_closed() {
            shard.counters.closed.add(1);
            return Err(AcquireError::Closed);
        }
        self.purge(now);
        let (key, superseded) = {
            let mut map = shard.lock();
            let id = map.ids.mint(index, self.table.shard_bits());
            Arc::get_mut(&mut waiter)
                .expect("an attempt begins with a waiter nobody else holds")
                .ready(id);
            let record = map.get_or_insert(session, hash, now, &shard.counters);
            let superseded = record.pending.replace(waiter.clone());
            if let Some(old) = &superseded {
                // Sealed under the lock: the old attempt can no longer be admitted.
                if old.set_fate(PREEMPTED) {
                    bump(&mut record.counters.preempted);
                    shard.counters.preempted.add_locked(1);
                }
            } else {
                shard.counters.pending_attempts.add_locked(1);
            }
            record.finished = false;
            record.last_activity = now;
            bump(&mut record.counters.attempts);
            shard.counters.attempts.add_locked(1);
            (record.key.clone(), superseded)
        };
        if let Some(old) = superseded {
            self.waiters.wake_waiter(&old);
        }
        Ok((waiter, key))
    }

    /// Grants the lease of an admission decided for `record`'s pending
    /// attempt, under its shard's lock: the policy's hold, the record's
    /// and the shard's accounting. Returns the lease id and what it holds.
    fn grant(
        &self,
        record: &mut SessionRecord,
        ids: &mut sessions::IdMint,
        index: usize,
        c: &ShardCounters,
        grant: lease_token::Grant,
        now: u64,
    ) -> (u64, Holds) {
        let bits = self.table.shard_bits();
        let mint = || ids.mint(index, bits);
        let (reason, holds) = (grant.reason, grant.holds);
        let holds = (self.policy).admit(record, reason, holds, c, &self.waiters, now, mint);
        record.pending = None;
        record.active_leases += 1;
        record.last_admitted_prompt_len = u32::try_from(grant.prompt_len).unwrap_or(u32::MAX);
        record.last_activity = now;
        bump(&mut record.counters.admissions);
        if let Some(wait_ns) = grant.waited {
            count_wait(Some(record), c, wait_ns);
        }
        c.admissions[grant.reason.index()].add_locked(1);
        c.active_leases.add_locked(1);
        c.pending_attempts.sub_locked(1);
        (ids.mint(index, bits), holds)
    }

    /// Accounts for an attempt that ended with `err` (its fate sealed by
    /// the caller) at `now`: takes it off its record and counts the outcome.
    fn end_attempt(
        &self,
        key: &SessionKey,
        waiter: &Arc<Waiter>,
        err: AcquireError,
        preempted_by_host: bool,
        waited: Option<u64>,
        now: u64,
    ) {
        let (_, shard) = self.shard_of(key);
        let mut map = shard.lock();
        let c = &shard.counters;
        // The gate-wide outcome is counted whatever became of the record:
        // it must equal what callers were told. The record may be gone (the
        // session was finished or retired while this attempt was on its
        // way out); then the attempt's per-session figures went with it.
        match err {
            // Sealed by its host (`Attempt::end`): nobody counted it yet.
            AcquireError::Preempted if preempted_by_host => c.preempted.add_locked(1),
            // Counted when sealed, by `register_attempt`.
            AcquireError::Preempted => {}
            AcquireError::TimedOut => c.timed_out.add_locked(1),
            AcquireError::Cancelled => c.cancelled.add_locked(1),
            AcquireError::Closed => c.closed.add(1),
            // Not a refusal: the host moves the turn (`release_elsewhere`).
            AcquireError::Released => {}
        }
        let record = map.get_mut(key);
        if let Some(wait_ns) = waited {
            count_wait(None, c, wait_ns);
        }
        // The session's place in the working-set queue goes with its last
        // attempt; a preempted one leaves it to its successor (one its host
        // preempted has none, unless one began since: then it is not `mine`).
        let mut withdraw = preempted_by_host || !matches!(err, AcquireError::Preempted);
        let mut forget = false;
        if let Some(record) = record {
            let mine = record
                .pending
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(p, waiter));
            if mine {
                // A preempted attempt's waiter was already replaced (and the
                // gauge handed over) by its successor.
                record.pending = None;
                c.pending_attempts.sub_locked(1);
            } else {
                withdraw = false;
            }
            match err {
                AcquireError::TimedOut => bump(&mut record.counters.timed_out),
                AcquireError::Cancelled => bump(&mut record.counters.cancelled),
                AcquireError::Preempted if preempted_by_host => {
                    bump(&mut record.counters.preempted)
                }
                AcquireError::Preempted | AcquireError::Closed | AcquireError::Released => {}
            }
            if let Some(wait_ns) = waited {
                bump(&mut record.counters.waits);
                record.counters.wait_ns += wait_ns;
            }
            record.last_activity = now;
            if self.settle(record, now, c) {
                map.remove(key);
                forget = true;
            }
        }
        drop(map);
        let mut grants = if withdraw {
            self.policy.withdraw(key, now)
        } else {
            Grants::default()
        };
        if forget {
            grants.extend(self.policy.forget(key, now));
        }
        self.hand_over(grants);
    }

    /// Releases a lease at `now` and hands the freed capacity to one waiter.
    ///
    /// Releasing the session's last retaining lease turns its reservation
    /// into an idle grace window ending at `now + idle_grace`.
    pub fn release(&self, lease: LeaseToken, now: u64) {
        self.release_with(lease, TurnReport::default(), now);
    }

    /// [`Core::release`] with what the engine reported of the turn (its
    /// cached prompt tokens, its output): working-set admission learns the
    /// shared prefix, the turns' output and the prefill rate from it.
    pub fn release_with(&self, lease: LeaseToken, report: TurnReport, now: u64) {
        let (key, admission, holds, turn) = lease.into_parts();
        let (index, shard) = self.shard_of(&key);
        let mut forget = false;
        {
            let mut map = shard.lock();
            if let Some(record) = map.get_mut(&key) {
                record.active_leases -= 1;
                record.last_activity = now;
                shard.counters.active_leases.sub_locked(1);
                shard.counters.releases.add_locked(1);
                let c = &shard.counters;
                (self.policy).release_record(record, holds, c, &self.waiters, now);
                debug_assert_eq!(admission.lease_id & self.shard_mask(), index as u64);
                if self.settle(record, now, &shard.counters) {
                    map.remove(&key);
                    forget = true;
                }
            } else {
                debug_assert!(false, "a record with a live lease is never dropped");
            }
        }
        let mut grants = self.policy.release(&key, holds, turn, report, now);
        if forget {
            grants.extend(self.policy.forget(&key, now));
        }
        self.hand_over(grants);
    }

    /// Ends `session`'s ownership window (and forgets the session once it
    /// holds no lease and no attempt). Waiting attempts of the session are
    /// left alone, as in the reference; see [`Core::cancel_session`].
    /// Returns the session's final figures (taken atomically with the
    /// finish, so nothing is lost when the record is dropped), or `None` if
    /// the session was not tracked.
    pub fn finish_session(&self, session: &[u8], now: u64) -> Option<SessionStats> {
        self.purge(now);
        let hash = self.table.hash(session);
        let shard = self.shard_of_hash(hash);
        let last = {
            let mut map = shard.lock();
            let found = map.find_mut(hash, session).map(|record| {
                (self.policy).finish_record(record, &shard.counters, &self.waiters);
                record.finished = true;
                shard.counters.sessions_finished.add_locked(1);
                let forget = self.settle(record, now, &shard.counters);
                (
                    session_stats_of(record, now),
                    forget.then(|| record.key.clone()),
                )
            });
            found.map(|(last, forget)| {
                if let Some(key) = forget {
                    map.remove(&key);
                }
                last
            })
        };
        // Unlike the reference (which notifies on every finish), finishing a
        // session the gate does not track frees nothing, so it wakes nobody:
        // a waiter woken for it would only re-probe the engine for nothing.
        self.hand_over(self.policy.finish(hash, session, last.is_some(), now));
        last
    }

    /// Cancels `session`'s attempt that is competing for admission, if any:
    /// it returns [`AcquireError::Cancelled`] promptly. Returns whether one
    /// was cancelled.
    pub fn cancel_session(&self, session: &[u8]) -> bool {
        let hash = self.table.hash(session);
        let shard = self.shard_of_hash(hash);
        let target = {
            let mut map = shard.lock();
            map.find_mut(hash, session)
                .and_then(|r| r.pending.clone())
                .filter(|waiter| waiter.set_fate(CANCELLED))
        };
        match target {
            Some(waiter) => {
                self.waiters.wake_waiter(&waiter);
                true
            }
            None => false,
        }
    }

    /// Releases `session`'s waiting turn to another replica, where the
    /// gate counts its cache gone ([`Core::waiting_cache_gone`]): its
    /// attempt ends with [`AcquireError::Released`] (woken at once) and it
    /// leaves the queue, those behind it moving up. A turn of a session
    /// whose cache the gate holds hot is refused
    /// ([`ReleaseError::CacheHot`]) and keeps its place; so is a session
    /// with no turn waiting, or a gate without a working set.
    pub fn release_elsewhere(&self, session: &[u8], now: u64) -> Result<(), ReleaseError> {
        let hash = self.table.hash(session);
        let key = SessionKey {
            hash,
            bytes: session.into(),
        };
        self.policy.may_release_elsewhere(&key)?;
        let shard = self.shard_of_hash(hash);
        let target = {
            let mut map = shard.lock();
            map.find_mut(hash, session)
                .and_then(|r| r.pending.clone())
                .filter(|waiter| waiter.set_fate(RELEASED))
        };
        let waiter = target.ok_or(ReleaseError::NotWaiting)?;
        // Out of the queue now, not when the host steps the attempt: a
        // grant made since the check is undone with it (it never ran).
        self.hand_over(self.policy.withdraw(&key, now));
        self.waiters.wake_waiter(&waiter);
        Ok(())
    }

    /// Closes the core: every attempt in progress ends with
    /// [`AcquireError::Closed`] and new ones are refused. Leases already
    /// granted stay valid until released. Idempotent.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.waiters.wake_all();
    }

    /// Whether [`Core::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Tells sleeping attempts that time moved. Only needed with a clock that
    /// does not advance on its own: the driver calls it after moving time.
    pub fn clock_advanced(&self) {
        self.waiters.wake_all();
    }

    /// The earliest time at which something may change an admission by
    /// itself (a grace window's end), or `None`: the core's
    /// `poll_timeout`. Nothing happens by itself at that time, since the
    /// core spawns nothing: a driver folds it into its sleep (one sleeper is
    /// enough; the blocking gate picks one) and touches the core then, by
    /// [`Attempt::on_wake`] or [`Core::purge`]. It only moves later, except
    /// when a window opens with none earlier; then the newest sleeper is
    /// nudged to ask again. Retirements (memory only) are not included: any
    /// later call fires them.
    pub fn next_deadline(&self) -> Option<u64> {
        let earliest = self.policy.deadline();
        (earliest != NEVER).then_some(earliest)
    }

    /// Fires every due grace expiry and retirement. Called by every entry
    /// point; hosts need not call it, but may (e.g. before scraping stats,
    /// or a driver with no sleeping attempt at [`Core::next_deadline`]).
    pub fn purge(&self, now: u64) {
        if let Some(grants) = self.policy.purge(now) {
            self.hand_over(grants);
        }
        if now < self.policy.windows_earliest() && now < self.retire_timers.earliest() {
            return; // the fast path: nothing due
        }
        let settle = |record: &mut SessionRecord, c: &ShardCounters| self.settle(record, now, c);
        let expired =
            (self.policy).expire_windows(now, PURGE_BATCH, &self.table, &self.waiters, settle);
        let mut due = Vec::new();
        self.retire_timers.pop_due(now, PURGE_BATCH, &mut due);
        for (deadline, hash) in due.drain(..) {
            let shard = self.shard_of_hash(hash);
            let mut map = shard.lock();
            let Some(record) = map.find_by_hash(hash, |r| r.retire_timer == deadline) else {
                continue;
            };
            record.retire_timer = NEVER;
            if self.settle(record, now, &shard.counters) {
                let key = record.key.clone();
                map.remove(&key);
                drop(map);
                self.hand_over(self.policy.forget(&key, now));
            }
        }
        if expired {
            self.capacity_event();
        }
    }

    /// A snapshot of the gate-wide figures at `now` (every due expiry and
    /// retirement fired first, however many).
    pub fn stats(&self, now: u64) -> GateStats {
        while self.policy.windows_earliest() <= now || self.retire_timers.earliest() <= now {
            self.purge(now);
        }
        let mut s = GateStats::default();
        for shard in self.table.shards() {
            shard.counters.add_into(&mut s);
        }
        s.waiting_attempts = self.waiters.sleeping() as u64;
        if let Some(grants) = self.policy.purge(now) {
            self.hand_over(grants);
        }
        if let Some(working_set) = self.policy.stats() {
            s.working_set = working_set;
        }
        s
    }

    /// A snapshot of one session's figures, or `None` if it is not tracked.
    pub fn session_stats(&self, session: &[u8], now: u64) -> Option<SessionStats> {
        self.purge(now);
        let hash = self.table.hash(session);
        let mut map = self.shard_of_hash(hash).lock();
        map.find_mut(hash, session)
            .map(|r| session_stats_of(r, now))
    }

    /// Whether `session`'s waiting turn would run cold here anyway: in
    /// working-set admission, the gate counts its prefix as evicted (new,
    /// parked, or out since its window ended) and it waits in the queue.
    /// `Some(false)`: the gate holds its cache hot (a member, or parked in
    /// the host tier). `None`: not working-set admission, or the session
    /// neither waits nor is a member. A host may place such a turn on
    /// another replica with room: it costs a full prefill wherever it runs.
    pub fn waiting_cache_gone(&self, session: &[u8]) -> Option<bool> {
        let key = SessionKey {
            hash: self.table.hash(session),
            bytes: session.into(),
        };
        self.policy.waiting_cache_gone(&key)
    }

    /// Number of timer entries held (live and stale), for memory accounting.
    pub fn timer_entries(&self) -> usize {
        self.policy.timer_entries() + self.retire_timers.len()
    }

    // ---- internals shared with `Attempt` ----

    fn shard_mask(&self) -> u64 {
        (1u64 << self.table.shard_bits()) - 1
    }

    fn shard_of(&self, key: &SessionKey) -> (usize, &sessions::Shard) {
        let index = self.table.shard_index(key.hash);
        (index, self.table.shard(index))
    }

    fn shard_of_hash(&self, hash: u64) -> &sessions::Shard {
        self.table.shard(self.table.shard_index(hash))
    }

    /// Does what a policy's change asks: announces room, nudges a sleeper,
    /// wakes the attempts of the sessions the working set let in, each
    /// with an event, so that their next pass collects the grant (a
    /// session with no attempt waiting keeps its grant for the next one).
    // Inlined so that the nothing most calls hand over costs nothing.
    #[inline]
    fn hand_over(&self, grants: Grants) {
        if grants.capacity_event {
            self.capacity_event();
        }
        if grants.deadline_earlier {
            // The handshake of `reference::Table::arm`: the deadline is
            // published (by the ledger's store), now read "asleep".
            crate::sync::dekker_fence();
            self.nudge_a_sleeper();
        }
        // Nearly always nobody, on a call working-set admission makes twice
        // per turn: the loop and its iterator are kept out of line.
        if !grants.sessions.is_empty() {
            self.wake_granted(grants.sessions);
        }
    }

    fn wake_granted(&self, sessions: Vec<(SessionKey, working_set::Verdict)>) {
        for (key, _) in sessions {
            let shard = self.shard_of_hash(key.hash);
            let pending = {
                let mut map = shard.lock();
                map.find_mut(key.hash, &key.bytes)
                    .and_then(|record| record.pending.clone())
            };
            if let Some(waiter) = pending {
                self.waiters.hand_event(&waiter);
            }
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Wakes one sleeper (the newest) with nothing to take, so that its
    /// driver asks [`Core::next_deadline`] again (the blocking gate, when
    /// the thread that watched the deadline stopped sleeping).
    pub(crate) fn nudge_a_sleeper(&self) {
        if self.waiters.sleeping() > 0 {
            self.waiters.nudge_newest();
        }
    }

    /// Capacity may have been freed: bump the epoch, then wake one sleeper.
    fn capacity_event(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        // The waker's half of the handshake with `Waiters::enqueue`: write
        // the epoch, then read "asleep". See `sync::dekker_fence`.
        crate::sync::dekker_fence();
        self.pass_on_event();
    }

    /// Hands an event to the longest sleeper, if any: a new one (from
    /// `capacity_event`) or one an attempt received and did not use.
    fn pass_on_event(&self) {
        if self.waiters.sleeping() > 0 {
            self.waiters.wake_one();
        }
    }

    /// After any change to `record`: arms its retirement if it just became
    /// idle, or returns true if it is to be forgotten now (idle, and
    /// finished or past retention; counted here), which the caller does with
    /// `ShardMap::remove`. It takes the record the caller already holds:
    /// looking it up again cost a table probe on every release.
    #[must_use]
    fn settle(&self, record: &mut SessionRecord, now: u64, c: &ShardCounters) -> bool {
        if !record.is_idle() {
            return false;
        }
        let retire_at = record
            .last_activity
            .max(record.window_ended)
            .saturating_add(self.retention_ns);
        if record.finished || retire_at <= now {
            if !record.finished {
                c.sessions_retired.add_locked(1);
            }
            c.tracked_sessions.sub_locked(1);
            return true;
        }
        if record.retire_timer == NEVER || record.retire_timer > retire_at {
            record.retire_timer = retire_at;
            self.retire_timers.arm(retire_at, record.key.hash);
        }
        false
    }
}

/// Counts an attempt that slept and ended after `wait_ns`, on its record
/// (if it has one) and its shard; the caller holds the shard lock.
fn count_wait(record: Option<&mut SessionRecord>, c: &ShardCounters, wait_ns: u64) {
    if let Some(record) = record {
        bump(&mut record.counters.waits);
        record.counters.wait_ns += wait_ns;
    }
    c.waits.add_locked(1);
    c.wait_ns.add_locked(wait_ns);
    c.longest_wait_ns.raise_locked(wait_ns);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_count_is_a_refused_or_honoured_argument() {
        let core = Core::with_shards(Config::default(), 4).unwrap();
        assert_eq!(core.table.shard_bits(), 2);
        assert_eq!(
            Core::new(Config::default()).unwrap().table.shard_bits(),
            default_shard_count().trailing_zeros()
        );
        assert_eq!(
            Core::with_shards(Config::default(), 1)
                .unwrap()
                .table
                .shard_bits(),
            0
        );
        for bad in [0, 3, MAX_SHARDS * 2] {
            let err = Core::with_shards(Config::default(), bad).unwrap_err();
            assert_eq!(err.field, "shards", "{bad}");
        }
    }
}
