//! The blocking gate: drives the sans-IO core with the calling thread, the
//! host's probes and a monotonic clock.

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};
use crate::config::{duration_ns, Config, ConfigError};
use crate::core::{Attempt, Core, GateStats, LeaseToken, PromptSketch, SessionStats, Step, Waiter};
use crate::error::{AcquireError, ReleaseError};
use crate::lease::Lease;
use crate::probe::{EngineProbe, Probe};
use crate::shared::Shared;
use crate::sleeper::{Sleeper, SleeperHandle};
use crate::sync::Arc;
use crate::watch::DeadlineWatch;

/// The session-level admission gate.
///
/// Cheap to clone (all clones share one gate) and safe to use from any
/// number of threads. No thread is ever spawned: a thread calling
/// [`Gate::acquire`] runs the probes itself and sleeps on its own `Sleeper`
/// while it waits; expired grace windows are purged by whoever calls next.
#[derive(Clone)]
pub struct Gate {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("core", &self.shared.core)
            .finish_non_exhaustive()
    }
}

/// What a thread needs to wait in `acquire`: a sleeper and an attempt's waiter
/// whose notifier wakes it.
///
/// Why it is kept per thread: allocating the sleeper, its notifier box and
/// the waiter would cost three allocations and three frees per `acquire`, a
/// large share of the open path's cost. A thread takes its spare for the
/// attempt and puts it back when the attempt has ended and nobody else
/// holds the waiter; a nested `acquire` (a probe calling back into a gate)
/// finds no spare and makes its own.
struct ThreadWaker {
    sleeper: Arc<Sleeper>,
    waiter: Arc<Waiter>,
}

impl ThreadWaker {
    fn take() -> Self {
        if let Some(spare) = SPARE.try_with(Cell::take).ok().flatten() {
            return spare;
        }
        let sleeper = Sleeper::new();
        let waiter = Arc::new(Waiter::new(Box::new(SleeperHandle(sleeper.clone()))));
        Self { sleeper, waiter }
    }

    /// Keeps the sleeper and the ended attempt's waiter for this thread's next
    /// attempt, if nobody else holds the waiter any more.
    fn give_back(sleeper: Arc<Sleeper>, attempt: Attempt<&Core>) {
        let Some(waiter) = attempt.into_spare_waiter() else {
            return;
        };
        if crate::sync::KEEP_PER_THREAD_SPARES {
            // Fails only while the thread is exiting: then it is simply dropped.
            let _ = SPARE.try_with(|spare| spare.set(Some(ThreadWaker { sleeper, waiter })));
        }
    }
}

/// This thread's last prompt sketch, refilled for its next attempt
/// (working-set admission sketches every prompt; kept apart from the
/// sleeper and waiter so that reference mode never touches it).
fn spare_sketch() -> PromptSketch {
    SPARE_SKETCH
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn keep_sketch(attempt: &mut Attempt<&Core>) {
    if let Some(sketch) = attempt.take_prompt_sketch() {
        if crate::sync::KEEP_PER_THREAD_SPARES {
            let _ = SPARE_SKETCH.try_with(|spare| spare.set(Some(sketch)));
        }
    }
}

crate::sync::thread_local_cell! {
    static SPARE: Cell<Option<ThreadWaker>> = Cell::new(None);
}

crate::sync::thread_local_cell! {
    static SPARE_SKETCH: Cell<Option<PromptSketch>> = Cell::new(None);
}

impl Gate {
    /// A gate with `config`, asking `probe`, on the real monotonic clock.
    pub fn new(config: Config, probe: impl Probe + 'static) -> Result<Self, ConfigError> {
        Self::with_clock(config, probe, MonotonicClock::new())
    }

    /// A gate on an injected clock (tests, simulations, models). With a
    /// clock that does not advance on its own, call [`Gate::clock_advanced`]
    /// after moving it.
    pub fn with_clock(
        config: Config,
        probe: impl Probe + 'static,
        clock: impl Clock + 'static,
    ) -> Result<Self, ConfigError> {
        Self::with_parts(config, Box::new(probe), Box::new(clock))
    }

    /// A gate from its parts: the C ABI passes its probes here, which may
    /// speak of a host tier (`kvgate_config_set_tier_probe`); a Rust host
    /// tells its tier with the capacity answer.
    pub(crate) fn with_parts(
        config: Config,
        probe: Box<dyn EngineProbe>,
        clock: Box<dyn Clock>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            shared: Arc::new(Shared {
                core: Core::new(config)?,
                watch: DeadlineWatch::new(),
                probe,
                clock,
            }),
        })
    }

    /// Blocks until the turn of `session` carrying `prompt` is admitted.
    ///
    /// Returns the lease, or why it was not admitted: [`AcquireError::Preempted`]
    /// when a newer attempt of the same session began meanwhile,
    /// [`AcquireError::Cancelled`] after [`Gate::cancel_session`],
    /// [`AcquireError::Closed`] after [`Gate::close`].
    pub fn acquire(&self, session: &[u8], prompt: &[u32]) -> Result<Lease, AcquireError> {
        self.lease(self.acquire_token(session, prompt, None))
    }

    /// Like [`Gate::acquire`], giving up with [`AcquireError::TimedOut`] once
    /// `timeout` has passed without admission. A zero timeout makes one pass
    /// through the table and fails instead of waiting. A probe answer that
    /// admits is honoured even if it arrived after the deadline (a probe
    /// cannot be interrupted).
    pub fn acquire_timeout(
        &self,
        session: &[u8],
        prompt: &[u32],
        timeout: Duration,
    ) -> Result<Lease, AcquireError> {
        self.lease(self.acquire_token(session, prompt, Some(timeout)))
    }

    fn lease(&self, token: Result<LeaseToken, AcquireError>) -> Result<Lease, AcquireError> {
        token.map(|token| Lease::new(self.shared.clone(), token))
    }

    /// [`Gate::acquire`] (`timeout` `None`) or [`Gate::acquire_timeout`],
    /// handing back the bare token: for a holder that keeps the gate alive
    /// itself (the C ABI's lease registry lives in the gate's handle), so
    /// the lease needs no reference of its own to the gate (one `Arc`
    /// increment and decrement per turn, on a line every thread shares).
    /// Hand it back with [`Gate::release_token`].
    pub(crate) fn acquire_token(
        &self,
        session: &[u8],
        prompt: &[u32],
        timeout: Option<Duration>,
    ) -> Result<LeaseToken, AcquireError> {
        let deadline = timeout.map(|t| self.shared.clock.now_ns().saturating_add(duration_ns(t)));
        self.acquire_until(session, prompt, deadline)
    }

    fn acquire_until(
        &self,
        session: &[u8],
        prompt: &[u32],
        deadline: Option<u64>,
    ) -> Result<LeaseToken, AcquireError> {
        let shared = &*self.shared;
        let clock = &*shared.clock;
        let ThreadWaker { sleeper, waiter } = ThreadWaker::take();
        let started = clock.now_ns();
        // Dropped on any way out, a probe's unwind included, the attempt
        // abandons itself: no pending waiter is left behind.
        let mut attempt = Attempt::begin_with_waiter(
            &shared.core,
            session,
            prompt.len(),
            started,
            deadline,
            waiter,
        )?;
        if shared.core.wants_prompt_sketch() {
            let mut sketch = spare_sketch();
            sketch.refill(prompt);
            attempt.set_prompt_sketch(sketch);
        }
        let mut step = attempt.start(started);
        let outcome = loop {
            // Our own driver answers each step once, in order.
            let next = match step.expect("the blocking driver answers what was asked") {
                Step::ProbeUsage => {
                    let usage = shared.probe.kv_cache_usage(session);
                    let (capacity, says_tier) = shared.probe_capacity(session);
                    attempt.on_engine_answers(usage, capacity, says_tier, clock.now_ns())
                }
                Step::ProbePrefix => {
                    let raw = shared.probe.prefix_hit_ratio(session, prompt);
                    attempt.on_prefix(raw, clock.now_ns())
                }
                Step::Sleep { until_ns } => {
                    let until = shared.watch.sleep_until(&sleeper, &shared.core, until_ns);
                    sleeper.wait_until(clock, until);
                    let next = attempt.on_wake(clock.now_ns());
                    if !matches!(next, Ok(Step::Sleep { .. })) {
                        shared.watch.leave(&sleeper, &shared.core);
                    }
                    next
                }
                Step::Admitted(token) => break Ok(token),
                Step::Failed(err) => break Err(err),
            };
            step = next;
        };
        keep_sketch(&mut attempt);
        ThreadWaker::give_back(sleeper, attempt);
        outcome
    }

    /// Releases `session`'s waiting turn to another replica where this
    /// gate counts its cache gone (a new, parked or ghost session): its
    /// `acquire` returns [`AcquireError::Released`] and it leaves the
    /// queue. A session whose cache the gate holds hot is refused with
    /// [`ReleaseError::CacheHot`] and keeps its place.
    pub fn release_elsewhere(&self, session: &[u8]) -> Result<(), ReleaseError> {
        self.shared
            .core
            .release_elsewhere(session, self.shared.clock.now_ns())
    }

    /// Ends `session`'s ownership window and forgets the session once it
    /// holds no lease and no attempt; wakes a waiter if the session was
    /// tracked (an unknown session frees nothing). An attempt of the
    /// session still waiting is not cancelled (see [`Gate::cancel_session`]).
    /// Returns the session's final figures (e.g. its `num_preempted`, which
    /// would otherwise be gone with the record), or `None` if it was unknown.
    pub fn finish_session(&self, session: &[u8]) -> Option<SessionStats> {
        self.shared
            .core
            .finish_session(session, self.shared.clock.now_ns())
    }

    /// Tells the gate what the engine's prefill costs, for an engine whose
    /// capacity answer does not carry it ([`EngineCapacity::with_rebuild_cost`](crate::EngineCapacity::with_rebuild_cost)
    /// does the same from the probe): a host that fits the engine's step
    /// costs tells them again each time it refits. Ignored in reference
    /// mode.
    pub fn set_rebuild_cost(&self, cost: crate::RebuildCost) {
        self.shared
            .core
            .set_rebuild_cost(cost, self.shared.clock.now_ns());
    }

    /// Tells the engine's longest sequence, tokens (vLLM's
    /// `max_model_len`), for a host that does not tell it with the
    /// capacity answer ([`EngineCapacity::with_max_model_len`](crate::EngineCapacity::with_max_model_len)).
    /// Refuses 0 ([`HintError::MaxModelLen`](crate::HintError::MaxModelLen)),
    /// keeping what was told before. Stored nowhere in reference mode.
    pub fn set_max_model_len(&self, tokens: u64) -> Result<(), crate::HintError> {
        self.shared
            .core
            .set_max_model_len(tokens, self.shared.clock.now_ns())
    }

    /// Tells how far `session` may run (an RL rollout's most turns and/or
    /// tokens), before or at its first acquire: a session not seen yet gets
    /// a record, forgotten with it ([`Gate::finish_session`] forgets one
    /// that never acquired). A later budget replaces it. Refuses a figure
    /// of 0 and tokens past the engine's `max_model_len` when that is
    /// known ([`HintError`](crate::HintError)), keeping the budget it had.
    /// Stored nowhere in reference mode (checked all the same).
    pub fn set_session_budget(
        &self,
        session: &[u8],
        budget: crate::Budget,
    ) -> Result<(), crate::HintError> {
        self.shared
            .core
            .set_session_budget(session, budget, self.shared.clock.now_ns())
    }

    /// A summary of what the gate learned (its means, the finished
    /// sessions' turn counts, the prefill figures it measured) and of its
    /// engine, as bytes to give [`Gate::load_summary`] after a restart
    /// (format: `docs/decisions/learned-summary.md`).
    pub fn save_summary(&self) -> Vec<u8> {
        self.shared.core.save_summary()
    }

    /// Adopts a summary [`Gate::save_summary`] wrote, replacing what this
    /// gate learned, whole or not at all: a truncated or corrupted one,
    /// one of another version, or one of another engine than the one that
    /// answered is refused ([`SummaryError`](crate::SummaryError)) and
    /// changes nothing. Before the engine's first capacity answer it is
    /// kept, and adopted at that answer only if the engine matches
    /// (otherwise dropped and counted in `summaries_dropped`).
    pub fn load_summary(&self, bytes: &[u8]) -> Result<(), crate::SummaryError> {
        self.shared
            .core
            .load_summary(bytes, self.shared.clock.now_ns())
    }

    /// Cancels the attempt of `session` that is waiting for admission (at
    /// most one exists): it returns [`AcquireError::Cancelled`] promptly.
    /// Returns whether there was one.
    pub fn cancel_session(&self, session: &[u8]) -> bool {
        self.shared.core.cancel_session(session)
    }

    /// Closes the gate: attempts in progress return [`AcquireError::Closed`]
    /// and ask no probe again (one inside a probe, which may be the one
    /// that closed the gate, returns once that probe returns), new ones are
    /// refused. Leases already granted stay valid. Idempotent.
    pub fn close(&self) {
        self.shared.core.close();
    }

    /// Whether [`Gate::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.shared.core.is_closed()
    }

    /// Gate-wide figures (due expiries are fired first).
    pub fn stats(&self) -> GateStats {
        self.shared.core.stats(self.shared.clock.now_ns())
    }

    /// One session's figures, or `None` if the session is not tracked.
    pub fn session_stats(&self, session: &[u8]) -> Option<SessionStats> {
        self.shared
            .core
            .session_stats(session, self.shared.clock.now_ns())
    }

    /// Gate-wide figures in Prometheus text exposition format.
    pub fn metrics_text(&self) -> String {
        self.stats().to_prometheus()
    }

    /// Wakes sleeping attempts to look at the clock again. Only needed with
    /// a clock that does not advance on its own, after moving it.
    pub fn clock_advanced(&self) {
        self.shared.core.clock_advanced();
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        self.shared.core.config()
    }
}
