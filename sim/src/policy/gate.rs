//! Drives the real kvgate sans-IO core (`kvgate::core`) in simulated time.
//!
//! Nothing of the gate's logic lives here: this is a driver, like the
//! library's blocking `Gate`, with the event loop in place of threads.
//! - `Step::ProbeUsage` / `Step::ProbePrefix` become probe events sent to the
//!   session's replica; their answers come back after the probe latency and
//!   are fed to `on_usage` / `on_prefix` at the time they arrive.
//! - `Step::Sleep { until_ns }` becomes a timer event (at the core's
//!   `next_deadline` if that is earlier); the core's
//!   [`Notify`] (called with gate locks held) only records the attempt on a
//!   "woken" list, which the event loop drains at the current simulated
//!   time, calling `on_wake`. A timer that finds the attempt already awake
//!   is stale and ignored.
//! - Working-set admission counts one engine's cache, so it runs one core
//!   per replica (what a host does: one gate per engine); the reference
//!   table keeps one core for all, as before.

use std::sync::{Arc, Mutex};

use kvgate::core::{Attempt, Core, LeaseToken, Notify, PromptSketch, Step};
use kvgate::{AcquireError, AdmissionMode, EngineCapacity, GateStats, TurnReport};
use rustc_hash::FxHashMap;

/// Which probe an attempt asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// `kv_cache_usage`.
    Usage,
    /// `prefix_hit_ratio`.
    Prefix,
}

/// What the event loop must do for an attempt.
#[derive(Debug)]
pub enum Action {
    /// Send a probe for `session` to its replica; answer with [`GateDriver::on_probe`].
    Probe {
        /// Attempt id.
        id: u64,
        /// Its session.
        session: usize,
        /// Which probe.
        kind: ProbeKind,
    },
    /// Call [`GateDriver::on_timer`] at `at` unless woken before: the
    /// gate makes the turn wait (what a host in refusal mode, an acquire
    /// with timeout 0, answers HTTP 429).
    Timer {
        /// Attempt id.
        id: u64,
        /// Its session.
        session: usize,
        /// Sleep generation, to recognise stale timers.
        generation: u64,
        /// Absolute time, ns.
        at: u64,
    },
    /// Admitted: send the turn to the engine, release the lease when it ends.
    Admitted {
        /// The session.
        session: usize,
        /// Hand back through [`GateDriver::release`].
        token: LeaseToken,
    },
    /// Preempted by a newer attempt of the same session (which carries the turn on).
    Preempted,
}

/// Records which attempts the core woke; must not call into the gate.
struct WakeRecorder {
    id: u64,
    woken: Arc<Mutex<Vec<u64>>>,
}

impl Notify for WakeRecorder {
    fn notify(&self) {
        self.woken.lock().expect("not poisoned").push(self.id);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    Probe(ProbeKind),
    Wake { generation: u64 },
}

#[derive(Debug)]
struct Driven {
    attempt: Attempt<Arc<Core>>,
    session: usize,
    awaiting: Awaiting,
}

/// The kvgate core and the attempts in progress.
pub struct GateDriver {
    /// One per replica in working-set admission, one for all otherwise.
    cores: Vec<Arc<Core>>,
    /// The core each session's attempts went to.
    core_of: Vec<usize>,
    keys: Vec<Vec<u8>>,
    woken: Arc<Mutex<Vec<u64>>>,
    attempts: FxHashMap<u64, Driven>,
    next_id: u64,
    next_generation: u64,
}

impl std::fmt::Debug for GateDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateDriver")
            .field("cores", &self.cores.len())
            .field("attempts", &self.attempts.len())
            .finish_non_exhaustive()
    }
}

impl GateDriver {
    /// A gate with `config` for `sessions` sessions on `replicas` replicas.
    pub fn new(
        config: kvgate::Config,
        sessions: usize,
        replicas: usize,
    ) -> Result<Self, kvgate::ConfigError> {
        let cores = match config.admission {
            AdmissionMode::WorkingSet => replicas.max(1),
            _ => 1,
        };
        Ok(Self {
            cores: (0..cores)
                .map(|_| Core::new(config.clone()).map(Arc::new))
                .collect::<Result<_, _>>()?,
            core_of: vec![0; sessions],
            keys: (0..sessions)
                .map(|s| format!("session-{s}").into_bytes())
                .collect(),
            woken: Arc::new(Mutex::new(Vec::new())),
            attempts: FxHashMap::default(),
            next_id: 0,
            next_generation: 0,
        })
    }

    /// Begins an attempt for `session`'s turn of `prompt_len` tokens. An
    /// older attempt of the session still competing is preempted by the core.
    pub fn begin(
        &mut self,
        session: usize,
        replica: usize,
        prompt_len: usize,
        sketch: Option<&PromptSketch>,
        now: u64,
    ) -> Action {
        let core = if self.cores.len() > 1 { replica } else { 0 };
        self.core_of[session] = core;
        self.next_id += 1;
        let id = self.next_id;
        let notifier = Box::new(WakeRecorder {
            id,
            woken: self.woken.clone(),
        });
        let mut attempt = Attempt::begin(
            self.cores[core].clone(),
            &self.keys[session],
            prompt_len,
            now,
            None,
            notifier,
        )
        .expect("the simulated gate is never closed");
        if let Some(sketch) = sketch {
            attempt.set_prompt_sketch(sketch.clone());
        }
        let step = attempt.start(now).expect("a new attempt starts");
        self.attempts.insert(
            id,
            Driven {
                attempt,
                session,
                awaiting: Awaiting::Probe(ProbeKind::Usage),
            },
        );
        self.handle(id, step)
    }

    /// Feeds a probe answer that arrived at `now`; `None` for an attempt
    /// abandoned meanwhile ([`GateDriver::abandon`]).
    pub fn on_probe(
        &mut self,
        id: u64,
        kind: ProbeKind,
        value: Option<f64>,
        capacity: Option<EngineCapacity>,
        now: u64,
    ) -> Option<Action> {
        let d = self.attempts.get_mut(&id)?;
        assert_eq!(
            d.awaiting,
            Awaiting::Probe(kind),
            "answer to the probe asked"
        );
        let step = match kind {
            ProbeKind::Usage => d
                .attempt
                .on_cache_state(value, capacity, now)
                .expect("answered in order"),
            ProbeKind::Prefix => d.attempt.on_prefix(value, now).expect("answered in order"),
        };
        Some(self.handle(id, step))
    }

    /// Drops `session`'s attempt in progress, if any (its replica was
    /// lost: the turn starts over at another replica's gate). The core
    /// counts it cancelled; its probe answers and timers find nothing.
    pub fn abandon(&mut self, session: usize) {
        self.attempts.retain(|_, d| d.session != session);
    }

    /// A sleep timer fired; stale timers (the attempt woke meanwhile) do nothing.
    pub fn on_timer(&mut self, id: u64, generation: u64, now: u64) -> Option<Action> {
        let d = self.attempts.get_mut(&id)?;
        if d.awaiting != (Awaiting::Wake { generation }) {
            return None;
        }
        let step = d.attempt.on_wake(now).expect("woken after a sleep");
        Some(self.handle(id, step))
    }

    /// Runs every attempt the core woke (and those their progress wakes) at `now`.
    pub fn drain_woken(&mut self, now: u64, out: &mut Vec<Action>) {
        loop {
            let ids = std::mem::take(&mut *self.woken.lock().expect("not poisoned"));
            if ids.is_empty() {
                return;
            }
            for id in ids {
                let Some(d) = self.attempts.get_mut(&id) else {
                    continue; // ended already
                };
                // An attempt awaiting a probe answer learns its fate from it.
                if matches!(d.awaiting, Awaiting::Wake { .. }) {
                    let step = d.attempt.on_wake(now).expect("woken after a sleep");
                    out.push(self.handle(id, step));
                }
            }
        }
    }

    /// Releases a lease when the turn's request ended, with what the
    /// engine reported of the turn.
    pub fn release(&self, token: LeaseToken, report: TurnReport, now: u64) {
        let core = &self.cores[self.core_of[session_of(&token)]];
        core.release_with(token, report, now);
    }

    /// Ends a session's ownership window after its last turn.
    pub fn finish_session(&self, session: usize, now: u64) {
        self.cores[self.core_of[session]].finish_session(&self.keys[session], now);
    }

    /// The gate's figures at `now`, summed over its cores.
    pub fn stats(&self, now: u64) -> GateStats {
        let mut all = self.cores.iter().map(|c| c.stats(now));
        let mut total = all.next().expect("at least one core");
        // The figures the simulator reports, added up (working-set gauges
        // are per engine and stay the first core's).
        for s in all {
            for (t, a) in total
                .admissions_by_reason
                .iter_mut()
                .zip(s.admissions_by_reason)
            {
                *t += a;
            }
            total.waits += s.waits;
            total.wait_time += s.wait_time;
            total.preempted += s.preempted;
            total.usage_probe_calls += s.usage_probe_calls;
            total.prefix_probe_calls += s.prefix_probe_calls;
        }
        total
    }

    /// The free room `replica`'s gate reports, tokens: its working set's
    /// capacity less its load, floored at 0 (the figure the library's
    /// hosts export as `kvgate_working_set_free_tokens`). `None` where it
    /// cannot tell: no working set (reference admission), or a capacity
    /// not known yet (no engine answer so far). Working-set admission runs
    /// one core per replica; the reference table's one core has none.
    pub fn free_tokens(&self, replica: usize) -> Option<u64> {
        let ws = self.cores.get(replica)?.working_set_stats()?;
        (ws.capacity_tokens > 0).then(|| ws.capacity_tokens.saturating_sub(ws.load_tokens))
    }

    /// The Retry-After a replica in refusal mode answers (the vLLM plugin's
    /// `retry_after_sec`): its gate's refill window rounded up to whole
    /// seconds, at least 1 s.
    pub fn retry_after_ns(&self, replica: usize) -> u64 {
        const SEC: u64 = 1_000_000_000;
        let window = self
            .cores
            .get(replica)
            .and_then(|c| c.working_set_stats())
            .map_or(0, |ws| ws.window_ns);
        window.div_ceil(SEC).max(1) * SEC
    }

    /// Sessions waiting to join `replica`'s working set; `None` without one.
    pub fn joining(&self, replica: usize) -> Option<usize> {
        Some(self.cores.get(replica)?.working_set_stats()?.waiting)
    }

    /// Whether `session`'s waiting turn finds its cache gone at its gate
    /// ([`kvgate::core::Core::waiting_cache_gone`]): `Some(true)` new, parked or
    /// a ghost; `Some(false)` a member; `None` neither, or no working set.
    pub fn waiting_cache_gone(&self, session: usize) -> Option<bool> {
        self.cores[self.core_of[session]].waiting_cache_gone(&self.keys[session])
    }

    /// Attempts in progress.
    pub fn live_attempts(&self) -> usize {
        self.attempts.len()
    }

    fn handle(&mut self, id: u64, step: Step) -> Action {
        match step {
            Step::ProbeUsage | Step::ProbePrefix => {
                let kind = if matches!(step, Step::ProbeUsage) {
                    ProbeKind::Usage
                } else {
                    ProbeKind::Prefix
                };
                let d = self.attempts.get_mut(&id).expect("live");
                d.awaiting = Awaiting::Probe(kind);
                Action::Probe {
                    id,
                    session: d.session,
                    kind,
                }
            }
            Step::Sleep { until_ns } => {
                self.next_generation += 1;
                let generation = self.next_generation;
                self.attempts.get_mut(&id).expect("live").awaiting = Awaiting::Wake { generation };
                // The core's next deadline (a grace window's end) is folded
                // into every sleeper's timer: in simulated time a herd of
                // timers costs nothing, and one that fires does what is due.
                let session = self.attempts[&id].session;
                let core = &self.cores[self.core_of[session]];
                let at = core.next_deadline().map_or(until_ns, |d| d.min(until_ns));
                Action::Timer {
                    id,
                    session,
                    generation,
                    at,
                }
            }
            Step::Admitted(token) => {
                let d = self.attempts.remove(&id).expect("live");
                Action::Admitted {
                    session: d.session,
                    token,
                }
            }
            Step::Failed(AcquireError::Preempted) => {
                self.attempts.remove(&id);
                Action::Preempted
            }
            Step::Failed(other) => {
                unreachable!("no deadline, cancel or close in the simulation: {other}")
            }
        }
    }
}

/// The session index a lease's id bytes name (`session-{s}`).
fn session_of(token: &LeaseToken) -> usize {
    std::str::from_utf8(token.session_id())
        .ok()
        .and_then(|id| id.strip_prefix("session-"))
        .and_then(|n| n.parse().ok())
        .expect("the driver names sessions session-{s}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;

    fn driver() -> GateDriver {
        let config = kvgate::Config {
            wait_poll: Duration::from_millis(100),
            idle_grace: Duration::from_millis(500),
            ..kvgate::Config::reference()
        };
        GateDriver::new(config, 4, 1).unwrap()
    }

    fn probe(a: Action) -> (u64, ProbeKind) {
        match a {
            Action::Probe { id, kind, .. } => (id, kind),
            other => panic!("expected a probe, got {other:?}"),
        }
    }

    #[test]
    fn open_admission_below_the_watermark() {
        let mut g = driver();
        let (id, kind) = probe(g.begin(0, 0, 1000, None, 0));
        assert_eq!(kind, ProbeKind::Usage);
        let Action::Admitted { session, token } =
            g.on_probe(id, kind, Some(0.2), None, MS).unwrap()
        else {
            panic!()
        };
        assert_eq!(session, 0);
        assert_eq!(token.admission().reason, kvgate::Reason::Open);
        g.release(token, TurnReport::default(), 2 * MS);
        assert_eq!(g.live_attempts(), 0);
    }

    #[test]
    fn a_cold_session_sleeps_and_a_release_wakes_it_through_the_list() {
        let mut g = driver();
        // Session 0 holds a lease.
        let (id, k) = probe(g.begin(0, 0, 10, None, 0));
        let Action::Admitted { token, .. } = g.on_probe(id, k, Some(0.1), None, 0).unwrap() else {
            panic!()
        };
        // Session 1 is cold under pressure: sleeps.
        let (id1, k) = probe(g.begin(1, 0, 10, None, MS));
        assert_eq!(k, ProbeKind::Usage);
        let (_, k) = probe(g.on_probe(id1, k, Some(0.95), None, 2 * MS).unwrap());
        assert_eq!(k, ProbeKind::Prefix);
        let Action::Timer { generation, at, .. } =
            g.on_probe(id1, k, Some(0.1), None, 3 * MS).unwrap()
        else {
            panic!()
        };
        assert_eq!(at, 103 * MS, "poll deadline");
        // The release records a wake; draining runs on_wake at the same instant.
        g.release(token, TurnReport::default(), 50 * MS);
        let mut out = Vec::new();
        g.drain_woken(50 * MS, &mut out);
        assert!(matches!(
            out.as_slice(),
            [Action::Probe {
                kind: ProbeKind::Usage,
                ..
            }]
        ));
        // The old timer is now stale.
        assert!(g.on_timer(id1, generation, 103 * MS).is_none());
    }

    #[test]
    fn a_retry_preempts_the_waiting_attempt() {
        let mut g = driver();
        let (id, k) = probe(g.begin(2, 0, 10, None, 0));
        let (_, k) = probe(g.on_probe(id, k, Some(0.9), None, MS).unwrap());
        let Action::Timer { .. } = g.on_probe(id, k, Some(0.0), None, 2 * MS).unwrap() else {
            panic!()
        };
        let newer = g.begin(2, 0, 10, None, 10 * MS);
        assert!(matches!(newer, Action::Probe { .. }));
        let mut out = Vec::new();
        g.drain_woken(10 * MS, &mut out);
        assert!(matches!(out.as_slice(), [Action::Preempted]));
        assert_eq!(g.stats(10 * MS).preempted, 1);
        assert_eq!(g.live_attempts(), 1);
    }
}
