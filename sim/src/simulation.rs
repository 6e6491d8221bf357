//! The discrete-event loop: sessions, policies and replicas in simulated time.
//!
//! A turn's life: its tool returns (or the rollout starts) → the policy
//! admits it (at once, after a cap slot frees, or through the kvgate core's
//! probes and sleeps) → it joins its replica's waiting queue → the engine
//! schedules, prefills and decodes it step by step → its last token ends the
//! request, the lease is released, and the next tool call starts (or the
//! session finishes). Probes travel half the probe round trip each way and
//! are served between engine steps, as UTILITY calls are.

use std::collections::VecDeque;
use std::time::Instant;

use crate::bound;
use crate::cluster::Cluster;
use crate::engine::pins::PinTicket;
use crate::engine::{EngineConfig, EngineStats, Finished, NewRequest, Replica, ReqId};
use crate::events::EventQueue;
use crate::metrics::{RunResult, TurnRecord};
use crate::policy::gate::{Action, GateDriver, ProbeKind};
use crate::policy::prime_rl::PrimeRl;
use crate::policy::prime_rl_cg::{Episode, PrimeRlCg};
use crate::policy::program::{EngineView, ProgramScheduler};
use crate::policy::progress_ttl::ProgressTtl;
use crate::policy::router::{self, Router};
use crate::policy::thunderagent::ThunderAgent;
use crate::policy::{Policy, PolicyKind, ProbeTarget};
use crate::prefill_rate::StepRates;
use crate::workload::{Start, Workload};
use kvgate::core::LeaseToken;
use kvgate::{EngineCapacity, KvTier, RebuildCost, TurnReport};

/// Where the engines run and how far the probes travel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deployment {
    /// Shape and cost of each replica.
    pub engine: EngineConfig,
    /// Number of replicas.
    pub replicas: usize,
    /// Probe round trip (client → engine → client), ns; served between steps.
    pub probe_rtt_ns: u64,
    /// A run still going at this simulated time is stopped and reported unfinished.
    pub time_limit_ns: u64,
    /// What the engine tells the gate's capacity probe.
    pub capacity_probe: CapacityProbe,
    /// What the host tells the gate of each prompt.
    pub host_prompt: HostPrompt,
    /// Whether the host tells the gate when a session ends.
    pub host_finish: HostFinish,
    /// What the host tells the gate of each turn's outcome.
    pub host_report: HostReport,
    /// How the router in front places sessions on replicas.
    pub routing: Routing,
    /// Whether replica 0 differs from the others.
    pub cluster: Cluster,
}

impl Deployment {
    /// Replica `replica`'s engine: `engine`, unless the cluster makes it the odd one.
    pub fn engine_of(&self, replica: usize) -> EngineConfig {
        self.cluster.engine(&self.engine, replica)
    }
}

/// How the router in front of the replicas places a session's turns
/// (`policy::router`). Every replica has its own gate in working-set
/// admission: a turn's gate is its replica's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// At its first turn, the replica with the fewest sessions; it stays.
    #[default]
    Sticky,
    /// A hash of the session id (session affinity: a consistent hash of
    /// `X-Session-ID`); it stays, whatever the load.
    Hash,
    /// Every turn to the replica with the fewest sessions: no affinity, a
    /// session migrates whenever another replica has fewer.
    LeastLoaded,
    /// At its first turn, the replica whose gate reports the most free
    /// working-set tokens (`kvgate_working_set_free_tokens`); it stays.
    /// A replica whose gate tells no room (no working set, capacity not
    /// known yet) counts as full; where none tells it (every policy but
    /// working-set kvgate), least-loaded, as `sticky`.
    Room,
    /// As `room`, with the refusal mode of a host (KVGATE_VLLM_REFUSE_NEW)
    /// and a proxy that places a refused session anew: at its first turn a
    /// replica whose gate tells no room yet and holds no session counts as
    /// empty (the most room); a later turn its gate would make wait (an
    /// attempt not admitted at once) moves to the other replica whose gate
    /// tells the most room for its whole prompt, with nobody waiting to
    /// join there, as a new session there (its history prefilled again);
    /// where none has the room it waits where it is.
    RoomReplace,
    /// At its first turn, the fewest sessions among the replicas whose gate
    /// tells room for it (or that hold nothing yet), all of them where none
    /// does; later turns as `room-replace`: a turn its gate would make wait
    /// moves where a gate tells room for it.
    StickyReplace,
    /// At its first turn as `sticky-replace`; a turn its gate would make
    /// wait and whose cache the gate counts gone (a new session, one parked
    /// or out since its window ended: never a member) moves to the fewest
    /// sessions among the other replicas whose gate tells room for its
    /// whole prompt, with nobody waiting to join there (the rule for new
    /// sessions), and stays there; where none has the room it waits where
    /// it is. A session whose prefix is still cached is never moved.
    StickyResume,
    /// The host in front of replicas in refusal mode (`kvgate.Placement`
    /// and the vLLM plugin's `KVGATE_VLLM_REFUSE_NEW=1`): placed as
    /// `sticky-resume`, but asked once per attempt, after its first pass
    /// (`release_if_cache_gone`), and a released turn that no other replica
    /// takes now leaves the queue all the same (the 429) and comes back to
    /// its replica after the gate's Retry-After (its refill window rounded
    /// up to whole seconds, at least 1 s), at the back of the queue.
    StickyRefuse,
}

impl Routing {
    /// Whether a turn its gate would make wait is placed anew
    /// (`room-replace`, `sticky-replace`, `sticky-resume`, `sticky-refuse`).
    pub fn replaces(self) -> bool {
        matches!(
            self,
            Self::RoomReplace | Self::StickyReplace | Self::StickyResume | Self::StickyRefuse
        )
    }

    /// Whether a waiting turn moves only when its gate counts its cache
    /// gone, by the rule for new sessions (`sticky-resume`, `sticky-refuse`).
    fn resumes(self) -> bool {
        matches!(self, Self::StickyResume | Self::StickyRefuse)
    }

    /// Parses `sticky`, `hash`, `least-loaded`, `room`, `room-replace`,
    /// `sticky-replace`, `sticky-resume` or `sticky-refuse`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "sticky" => Ok(Self::Sticky),
            "hash" => Ok(Self::Hash),
            "least-loaded" => Ok(Self::LeastLoaded),
            "room" => Ok(Self::Room),
            "room-replace" => Ok(Self::RoomReplace),
            "sticky-replace" => Ok(Self::StickyReplace),
            "sticky-resume" => Ok(Self::StickyResume),
            "sticky-refuse" => Ok(Self::StickyRefuse),
            other => Err(format!(
                "routing `{other}`: expected sticky, hash, least-loaded, room, room-replace, \
                 sticky-replace, sticky-resume or sticky-refuse"
            )),
        }
    }
}

/// What a host tells the gate when a turn ends: an engine-side host (the
/// vLLM plugin, the real-engine benchmark) has each request's cached
/// prompt tokens; a proxy in front of `vllm serve` has them only if the
/// server was started with `--enable-prompt-tokens-details`, and may pass
/// the output length alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostReport {
    /// Cached prompt tokens and output tokens.
    #[default]
    Cached,
    /// Output tokens only.
    OutputOnly,
}

impl HostReport {
    /// Parses `cached` or `output-only`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "cached" => Ok(Self::Cached),
            "output-only" => Ok(Self::OutputOnly),
            other => Err(format!(
                "host report `{other}`: expected cached or output-only"
            )),
        }
    }
}

/// Whether a host tells the gate that a session ended: an agent framework
/// that drives its sessions knows (and the real-engine benchmark says so),
/// an OpenAI-compatible proxy sees only requests (`vllm serve` with the
/// gate, without the final-turn header): the gate then forgets a session
/// once it has been idle for the core's `session_retention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostFinish {
    /// `finish_session` after each session's last turn.
    #[default]
    Told,
    /// Never: sessions are forgotten after the idle retention.
    Untold,
}

impl HostFinish {
    /// Parses `told` or `untold`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "told" => Ok(Self::Told),
            "untold" => Ok(Self::Untold),
            other => Err(format!("host finish `{other}`: expected told or untold")),
        }
    }
}

/// What a host tells the gate of a turn's prompt: the blocking C API,
/// Python and Rust hosts pass its token ids (the gate sketches them); an
/// event-loop host may pass only its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostPrompt {
    /// The token ids: the gate sees how far each prompt begins like the last.
    #[default]
    Tokens,
    /// The length only.
    Length,
}

impl HostPrompt {
    /// Parses `tokens` or `length`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "tokens" => Ok(Self::Tokens),
            "length" => Ok(Self::Length),
            other => Err(format!("host prompt `{other}`: expected tokens or length")),
        }
    }
}

/// What an engine's host can tell the gate about its KV cache: hosts differ
/// (vLLM's API server knows its blocks but not its prefill rate; a proxy in
/// front of an engine it does not own may know neither), and the gate must
/// work for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityProbe {
    /// KV tokens, block size, the prefill rate measured (the median of
    /// recent mostly-prefill steps) and the engine's rebuild cost (its
    /// step-cost terms, as the vLLM plugin fits them to its steps).
    #[default]
    Full,
    /// As `Full`, without the rebuild cost: the gate learns attention's
    /// share from the turns.
    NoCost,
    /// KV tokens and block size, no prefill rate (a host that cannot time its steps).
    NoRate,
    /// Nothing: the gate has only the usage gauge and what turns report.
    UsageOnly,
    /// As `Full`, but of an engine's host tier nothing (a host that does
    /// not read the offloading configuration).
    NoTier,
}

impl CapacityProbe {
    /// Parses `full`, `no-cost`, `no-rate`, `usage-only` or `no-tier`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Self::Full),
            "no-cost" => Ok(Self::NoCost),
            "no-rate" => Ok(Self::NoRate),
            "usage-only" => Ok(Self::UsageOnly),
            "no-tier" => Ok(Self::NoTier),
            other => Err(format!(
                "capacity probe `{other}`: expected full, no-cost, no-rate, usage-only or no-tier"
            )),
        }
    }
}

/// What re-prefilling costs an engine of this shape, as its host tells
/// it: a prefilled token costs the linear term, half a context read (a
/// chunk reads its own tokens too) and a full chunk's share of a step's
/// fixed cost; an attended pair costs the attention term and a context read
/// per chunk it spans (a chunk reads its whole context once).
/// `None` for a profile whose prefill is free (no term charges it).
fn rebuild_cost(e: &EngineConfig) -> Option<RebuildCost> {
    let c = e.cost;
    let chunk = e.max_num_batched_tokens as f64;
    let per_token = (c.beta1_us + c.beta3_us / 2.0) * 1e-6 + c.beta0_ms * 1e-3 / chunk;
    let per_pair = (c.beta4_us + c.beta3_us / chunk) * 1e-6;
    RebuildCost::new(per_token, per_pair).ok()
}

/// `answer` with the engine's rebuild cost, if it has one.
fn with_rebuild_cost(answer: EngineCapacity, e: &EngineConfig) -> EngineCapacity {
    match rebuild_cost(e) {
        Some(cost) => answer.with_rebuild_cost(cost),
        None => answer,
    }
}

#[derive(Debug)]
enum Event {
    /// Start a step on an idle replica if it has work.
    Kick(usize),
    StepDone(usize),
    /// A session's next turn is ready (its tool returned, or the rollout began).
    TurnReady(usize),
    ProbeAtEngine {
        replica: usize,
        id: u64,
        kind: ProbeKind,
        session: usize,
    },
    ProbeAnswer {
        id: u64,
        kind: ProbeKind,
        value: f64,
        capacity: Option<EngineCapacity>,
    },
    GateTimer {
        id: u64,
        generation: u64,
    },
    RetryCheck {
        session: usize,
        turn: usize,
        issue: u32,
    },
    PinExpiry {
        replica: usize,
        session: usize,
        ticket: PinTicket,
    },
    /// A program scheduler's deadline (its tick, a TTL, a timeout).
    ProgramTimer,
    /// The replica stops (`Cluster::ReplicaLost`).
    LoseReplica(usize),
    /// A turn released with no other replica taking it comes back to its
    /// replica (`sticky-refuse`), unless the session was sent anew since
    /// (`sends` is then stale).
    Resend {
        session: usize,
        sends: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    NotStarted,
    Tool,
    AtPolicy,
    InEngine(ReqId),
    Done,
}

#[derive(Debug)]
struct SessionState {
    replica: Option<usize>,
    /// The replica the sticky router counted it on, released when it finishes.
    router_slot: Option<usize>,
    /// Placed by room and not admitted yet: the replica and the first
    /// prompt the router counts against its room meanwhile.
    unseen: Option<(usize, u64)>,
    turn: usize,
    phase: Phase,
    issue: u32,
    /// Attempts handed to the policy so far (a stale `Event::Resend` finds
    /// a newer one), and whether the live one was asked after its first
    /// pass (`sticky-refuse` asks once).
    sends: u32,
    asked: bool,
    lease: Option<LeaseToken>,
    issued_ns: u64,
    /// When the client sent the current turn (before any wait at the policy).
    arrived_ns: u64,
    /// When the current turn last went to the engine.
    submitted_ns: u64,
    /// When the engine first scheduled the live turn, its hits and tier hits.
    first_scheduled: Option<(u64, usize, usize)>,
}

struct Sim<'a> {
    now: u64,
    events: EventQueue<Event>,
    deployment: Deployment,
    workload: &'a Workload,
    policy: &'a Policy,
    replicas: Vec<Replica>,
    /// Per replica, the prefill rates its steps showed.
    prefill_rates: Vec<StepRates>,
    kick_pending: Vec<bool>,
    queued_probes: Vec<Vec<(u64, ProbeKind, usize)>>,
    router: Router,
    sessions: Vec<SessionState>,
    gate: Option<GateDriver>,
    program: Option<Box<dyn ProgramScheduler>>,
    program_timer: Option<u64>,
    engine_views: Vec<EngineView>,
    released: Vec<(usize, usize)>,
    cap_queue: VecDeque<usize>,
    next_request: ReqId,
    turns: Vec<TurnRecord>,
    sessions_done: usize,
    last_finish_ns: u64,
    slot_waits: u64,
    slot_wait_ns: u64,
    reissues: u64,
    /// Output tokens of the turns finished so far, and their count: what a
    /// placing host learns of a turn's expected output.
    outputs_seen: (u64, u64),
    actions: Vec<Action>,
    /// Per wave: sessions finished so far.
    wave_finished: Vec<usize>,
    /// Per wave: the sessions that start once `count` of its sessions finished.
    wave_waiters: Vec<Vec<(usize, usize)>>,
    /// The replica to lose and after how many ended turns.
    loss: Option<(usize, usize)>,
}

/// Whether the longest request of `workload` fits one replica's KV cache
/// (vLLM rejects a request that cannot; [`run`] requires it).
pub fn longest_request_fits(deployment: &Deployment, workload: &Workload) -> Result<(), String> {
    let max = workload.max_request_tokens();
    let engine = &deployment.engine;
    let blocks = deployment.cluster.min_blocks(engine, deployment.replicas);
    if max.div_ceil(engine.block_size) < blocks {
        Ok(())
    } else {
        Err(format!(
            "the longest request ({max} tokens) cannot fit one replica's KV cache ({blocks} blocks of {})",
            engine.block_size
        ))
    }
}

/// Runs one policy over `workload` on `deployment`. Deterministic.
pub fn run(deployment: &Deployment, workload: &Workload, policy: &Policy) -> RunResult {
    let started = Instant::now();
    let n = workload.sessions.len();
    if let Err(e) = longest_request_fits(deployment, workload) {
        panic!("{e}");
    }
    let pinning = matches!(policy.kind, PolicyKind::TtlPin { .. });
    let gate = match &policy.kind {
        PolicyKind::Kvgate { config, .. } => {
            Some(GateDriver::new(config.clone(), n, deployment.replicas).expect("validated config"))
        }
        _ => None,
    };
    // ThunderAgent budgets GPU plus host memory where the engine offloads,
    // each engine's own (it reads `cache_config_info` per engine).
    let capacities = (0..deployment.replicas)
        .map(|r| {
            let e = deployment.engine_of(r);
            e.num_gpu_blocks * e.block_size + e.tier_tokens()
        })
        .collect();
    let program: Option<Box<dyn ProgramScheduler>> = match &policy.kind {
        PolicyKind::ThunderAgent(c) => Some(Box::new(ThunderAgent::new(*c, capacities, n))),
        PolicyKind::PrimeRl(c) => Some(Box::new(PrimeRl::new(
            *c,
            deployment.engine.capacity_tokens(),
            deployment.replicas,
            n,
        ))),
        PolicyKind::PrimeRlCg(c) => Some(Box::new(PrimeRlCg::new(
            *c,
            // C is GPU KV only, as prime-rl reads `cache_config_info`.
            &(0..deployment.replicas)
                .map(|r| {
                    let e = deployment.engine_of(r);
                    e.num_gpu_blocks * e.block_size
                })
                .collect::<Vec<_>>(),
            workload
                .sessions
                .iter()
                .map(|s| Episode {
                    env: s.class,
                    group: s.group,
                })
                .collect(),
            workload.wave_sessions(),
        ))),
        PolicyKind::ProgressTtl(c) => Some(Box::new(ProgressTtl::new(
            *c,
            deployment.engine.capacity_tokens(),
            deployment.replicas,
            n,
            workload.shared_prefix_tokens,
        ))),
        _ => None,
    };
    let mut sim = Sim {
        now: 0,
        events: EventQueue::default(),
        deployment: *deployment,
        workload,
        policy,
        prefill_rates: vec![StepRates::default(); deployment.replicas],
        replicas: (0..deployment.replicas)
            .map(|i| {
                let mut r = Replica::new(deployment.engine_of(i), pinning);
                r.set_noise_key(crate::engine::noise::key(workload.seed, i));
                r
            })
            .collect(),
        kick_pending: vec![false; deployment.replicas],
        queued_probes: vec![Vec::new(); deployment.replicas],
        router: Router::new(deployment.replicas),
        sessions: (0..n)
            .map(|_| SessionState {
                replica: None,
                router_slot: None,
                unseen: None,
                turn: 0,
                phase: Phase::NotStarted,
                issue: 0,
                sends: 0,
                asked: false,
                lease: None,
                issued_ns: 0,
                arrived_ns: 0,
                submitted_ns: 0,
                first_scheduled: None,
            })
            .collect(),
        gate,
        program,
        program_timer: None,
        engine_views: vec![EngineView::default(); deployment.replicas],
        released: Vec::new(),
        cap_queue: VecDeque::new(),
        next_request: 0,
        turns: Vec::with_capacity(workload.num_turns()),
        sessions_done: 0,
        last_finish_ns: 0,
        slot_waits: 0,
        slot_wait_ns: 0,
        reissues: 0,
        outputs_seen: (0, 0),
        actions: Vec::new(),
        wave_finished: Vec::new(),
        wave_waiters: Vec::new(),
        loss: deployment.cluster.loss(workload.num_turns()),
    };
    for (s, session) in workload.sessions.iter().enumerate() {
        match session.start {
            Start::At(t) => sim.events.push(t, Event::TurnReady(s)),
            Start::AfterFinishes { wave, count } => {
                if sim.wave_waiters.len() <= wave {
                    sim.wave_waiters.resize(wave + 1, Vec::new());
                }
                sim.wave_waiters[wave].push((s, count));
            }
        }
    }
    let mut finished = true;
    while let Some((at, event)) = sim.events.pop() {
        if at > deployment.time_limit_ns {
            finished = false;
            sim.now = deployment.time_limit_ns;
            break;
        }
        debug_assert!(at >= sim.now, "time runs forward");
        sim.now = at;
        sim.dispatch(event);
        sim.drain_gate();
        sim.drive_program();
        if sim.sessions_done == n {
            break;
        }
    }
    finished &= sim.sessions_done == n;
    let mut engine = EngineStats::default();
    for r in &sim.replicas {
        engine.add(&r.stats());
    }
    RunResult {
        policy: policy.clone(),
        makespan_ns: if finished {
            sim.last_finish_ns
        } else {
            sim.now
        },
        finished,
        engine,
        gate: sim.gate.as_ref().map(|g| g.stats(sim.now)),
        program: sim.program.as_ref().map(|p| p.stats()),
        slot_waits: sim.slot_waits,
        slot_wait_ns: sim.slot_wait_ns,
        reissues: sim.reissues,
        turns: sim.turns,
        bound: bound::lower_bound(&deployment.engine, deployment.replicas, workload),
        wall_ms: started.elapsed().as_secs_f64() * 1e3,
    }
}

impl Sim<'_> {
    fn dispatch(&mut self, event: Event) {
        match event {
            // A lost replica's steps, probes and pins end with it.
            Event::Kick(r) | Event::StepDone(r) if self.router.is_lost(r) => {}
            Event::ProbeAtEngine { replica, .. } | Event::PinExpiry { replica, .. }
                if self.router.is_lost(replica) => {}
            Event::Kick(r) => self.kick_now(r),
            Event::StepDone(r) => self.step_done(r),
            Event::TurnReady(s) => self.turn_ready(s),
            Event::ProbeAtEngine {
                replica,
                id,
                kind,
                session,
            } => {
                if self.replicas[replica].is_busy() {
                    self.queued_probes[replica].push((id, kind, session));
                } else {
                    self.answer_probe(replica, id, kind, session);
                }
            }
            Event::ProbeAnswer {
                id,
                kind,
                value,
                capacity,
            } => {
                let gate = self.gate.as_mut().expect("gate policy");
                if let Some(action) = gate.on_probe(id, kind, Some(value), capacity, self.now) {
                    self.carry_out(action);
                }
            }
            Event::GateTimer { id, generation } => {
                let gate = self.gate.as_mut().expect("gate policy");
                if let Some(action) = gate.on_timer(id, generation, self.now) {
                    self.carry_out(action);
                }
            }
            Event::RetryCheck {
                session,
                turn,
                issue,
            } => self.retry_check(session, turn, issue),
            Event::PinExpiry {
                replica,
                session,
                ticket,
            } => {
                if self.replicas[replica].expire_pin(session, ticket) {
                    self.kick(replica);
                }
            }
            Event::ProgramTimer => self.program_timer = None,
            Event::LoseReplica(r) => self.lose_replica(r),
            Event::Resend { session, sends } => {
                if self.sessions[session].sends == sends {
                    self.issue_turn(session);
                }
            }
        }
    }

    /// What each engine's metrics say now.
    fn refresh_engine_views(&mut self) {
        for (view, r) in self.engine_views.iter_mut().zip(&self.replicas) {
            *view = EngineView {
                waiting: r.num_waiting(),
                running: r.num_running(),
                usage: r.usage(),
                preemptions: r.stats().preemptions,
            };
        }
    }

    /// Lets a program scheduler release what it may after the last event,
    /// and keeps one timer armed for its next deadline.
    fn drive_program(&mut self) {
        if self.program.is_none() {
            return;
        }
        self.refresh_engine_views();
        let program = self.program.as_mut().expect("checked");
        let mut released = std::mem::take(&mut self.released);
        program.poll(self.now, &self.engine_views, &mut released);
        let next = program.next_deadline();
        for (s, r) in released.drain(..) {
            debug_assert_eq!(self.sessions[s].phase, Phase::AtPolicy);
            self.sessions[s].replica = Some(r);
            self.submit(s);
        }
        self.released = released;
        if let Some(at) = next {
            let at = at.max(self.now + 1);
            if self.program_timer.is_none_or(|armed| at < armed) {
                self.program_timer = Some(at);
                self.events.push(at, Event::ProgramTimer);
            }
        }
    }

    /// Runs whatever the core woke during the last event, at the same instant.
    fn drain_gate(&mut self) {
        let Some(gate) = self.gate.as_mut() else {
            return;
        };
        let mut actions = std::mem::take(&mut self.actions);
        gate.drain_woken(self.now, &mut actions);
        for action in actions.drain(..) {
            self.carry_out(action);
        }
        self.actions = actions;
    }

    fn carry_out(&mut self, action: Action) {
        match action {
            Action::Probe { id, session, kind } => {
                let replica = match self.policy.kind {
                    PolicyKind::Kvgate {
                        probe: ProbeTarget::FirstReplica,
                        ..
                    } => 0,
                    _ => self.sessions[session]
                        .replica
                        .expect("routed before probing"),
                };
                self.events.push(
                    self.now + self.deployment.probe_rtt_ns / 2,
                    Event::ProbeAtEngine {
                        replica,
                        id,
                        kind,
                        session,
                    },
                );
            }
            Action::Timer {
                id,
                session,
                generation,
                at,
            } => {
                if self.deployment.routing.replaces() && self.replace(session) {
                    return; // the attempt was withdrawn
                }
                self.events
                    .push(at.max(self.now), Event::GateTimer { id, generation });
            }
            Action::Admitted { session, token } => {
                debug_assert_eq!(self.sessions[session].phase, Phase::AtPolicy);
                if let Some((r, prompt)) = self.sessions[session].unseen.take() {
                    self.router.seen(r, prompt);
                }
                self.sessions[session].lease = Some(token);
                self.submit(session);
            }
            Action::Preempted => {}
        }
    }

    /// `room-replace`, `sticky-replace`: the gate of session `s`'s replica
    /// would make its turn wait (the attempt was not admitted at once, the
    /// step a host in refusal mode, an acquire with timeout 0, answers HTTP
    /// 429). A later turn moves to the replica whose gate tells the most
    /// room for its whole prompt, if one does and nobody waits to join
    /// there: its attempt is withdrawn, the old gate forgets the session,
    /// and the new one sees a new session. Asked again at each wait (each
    /// wake or poll that sleeps again), as a proxy that retries after a
    /// 429 would. Returns whether it moved.
    ///
    /// `sticky-resume`: any turn, the first included, but only one whose
    /// gate counts its cache gone ([`GateDriver::waiting_cache_gone`]),
    /// moved by the rule for new sessions ([`Router::resume`]).
    ///
    /// `sticky-refuse`: as `sticky-resume`, asked once per attempt; a turn
    /// whose cache is gone and that no other replica takes now is released
    /// all the same and sent again to its replica after Retry-After.
    fn replace(&mut self, s: usize) -> bool {
        let routing = self.deployment.routing;
        let st = &self.sessions[s];
        if st.turn == 0 && !routing.resumes() {
            return false; // a first turn waits where it was placed
        }
        if routing == Routing::StickyRefuse {
            if st.asked {
                return false; // asked after its first pass: it waits in order
            }
            self.sessions[s].asked = true;
        }
        let st = &self.sessions[s];
        let from = st.replica.expect("routed");
        let prompt = self.workload.sessions[s].turns[st.turn].prompt_len as u64;
        let room = self.room_to_join();
        let moved = if routing.resumes() {
            let gate = self.gate.as_ref().expect("a gate made it wait");
            if gate.waiting_cache_gone(s) != Some(true) {
                return false; // its prefix is still cached here: it stays
            }
            self.router.resume(from, &room, prompt)
        } else {
            self.router.replace(from, &room, prompt)
        };
        let Some(to) = moved else {
            if routing == Routing::StickyRefuse {
                // Released (the 429); nobody takes it now: the host waits
                // the gate's Retry-After and sends it home again.
                let gate = self.gate.as_mut().expect("checked");
                let wait = gate.retry_after_ns(from);
                gate.abandon(s);
                let sends = self.sessions[s].sends;
                self.events
                    .push(self.now + wait, Event::Resend { session: s, sends });
                return true;
            }
            return false;
        };
        let gate = self.gate.as_mut().expect("checked");
        gate.abandon(s);
        gate.finish_session(s, self.now);
        let st = &mut self.sessions[s];
        if let Some((r, p)) = st.unseen.take() {
            self.router.seen(r, p);
        }
        st.replica = Some(to);
        st.router_slot = Some(to);
        st.unseen = Some((to, prompt));
        self.issue_turn(s);
        true
    }

    fn answer_probe(&mut self, replica: usize, id: u64, kind: ProbeKind, session: usize) {
        let r = &self.replicas[replica];
        // The capacity probe is answered with usage, as the engine knows it:
        // its KV tokens, block size, and the prefill rate it measured.
        let capacity = (kind == ProbeKind::Usage).then(|| {
            let e = self.deployment.engine_of(replica);
            let (tokens, block, rate) = (
                e.capacity_tokens() as u64,
                e.block_size as u32,
                self.prefill_rates[replica].median(),
            );
            // 0 is what the probe answers for a figure it cannot tell.
            let answer = match self.deployment.capacity_probe {
                CapacityProbe::Full => {
                    with_rebuild_cost(EngineCapacity::new(tokens, block, rate), &e)
                }
                CapacityProbe::NoCost => EngineCapacity::new(tokens, block, rate),
                CapacityProbe::NoRate => EngineCapacity::new(tokens, block, 0.0),
                CapacityProbe::UsageOnly => return EngineCapacity::new(0, 0, 0.0),
                CapacityProbe::NoTier => {
                    return with_rebuild_cost(EngineCapacity::new(tokens, block, rate), &e)
                }
            };
            // An engine that offloads tells its tier (the vLLM plugin reads
            // it from the offloading configuration).
            match e.tier {
                Some(t) => answer
                    .with_tier(
                        KvTier::new(e.tier_tokens() as u64, t.reload_tokens_per_sec)
                            .expect("a validated tier"),
                    )
                    .expect("a validated tier is no smaller than the cache"),
                None => answer,
            }
        });
        let value = match kind {
            ProbeKind::Usage => r.usage(),
            ProbeKind::Prefix => {
                let s = &self.workload.sessions[session];
                let turn = self.sessions[session].turn;
                r.prefix_hit_ratio(s.hashes(turn), s.turns[turn].prompt_len)
            }
        };
        let back = self.deployment.probe_rtt_ns - self.deployment.probe_rtt_ns / 2;
        self.events.push(
            self.now + back,
            Event::ProbeAnswer {
                id,
                kind,
                value,
                capacity,
            },
        );
    }

    fn turn_ready(&mut self, s: usize) {
        let st = &mut self.sessions[s];
        debug_assert!(matches!(st.phase, Phase::NotStarted | Phase::Tool));
        st.issued_ns = self.now;
        st.arrived_ns = self.now;
        st.issue = 0;
        st.first_scheduled = None;
        let turn = st.turn;
        if self.workload.sessions[s].turns[turn].impatient && self.workload.max_retries > 0 {
            self.events.push(
                self.now + self.workload.retry_after_ns,
                Event::RetryCheck {
                    session: s,
                    turn,
                    issue: 0,
                },
            );
        }
        self.issue_turn(s);
    }

    /// Hands the session's current turn to the policy.
    fn issue_turn(&mut self, s: usize) {
        let st = &mut self.sessions[s];
        st.phase = Phase::AtPolicy;
        st.sends += 1;
        st.asked = false;
        match &self.policy.kind {
            PolicyKind::None | PolicyKind::TtlPin { .. } => {
                self.route(s);
                self.submit(s);
            }
            PolicyKind::Cap(k) => {
                let k = *k;
                if self.sessions[s].replica.is_some() {
                    self.submit(s);
                } else if let Some(r) = self.router.assign_below(k) {
                    self.sessions[s].replica = Some(r);
                    self.sessions[s].router_slot = Some(r);
                    self.submit(s);
                } else {
                    self.cap_queue.push_back(s);
                }
            }
            PolicyKind::ThunderAgent(_)
            | PolicyKind::ProgressTtl(_)
            | PolicyKind::PrimeRl(_)
            | PolicyKind::PrimeRlCg(_) => {
                self.route(s);
                let prompt_len = self.workload.sessions[s].turns[self.sessions[s].turn].prompt_len;
                let routed = self.sessions[s].replica.expect("routed");
                self.refresh_engine_views();
                let program = self.program.as_mut().expect("program scheduler");
                if let Some(r) = program.arrive(s, prompt_len, routed, self.now, &self.engine_views)
                {
                    self.sessions[s].replica = Some(r);
                    self.submit(s);
                }
            }
            PolicyKind::Kvgate { .. } => {
                self.route(s);
                let turn = self.sessions[s].turn;
                let session = &self.workload.sessions[s];
                let prompt_len = session.turns[turn].prompt_len;
                let sketch = match self.deployment.host_prompt {
                    HostPrompt::Tokens => Some(&session.sketches[turn]),
                    HostPrompt::Length => None,
                };
                let replica = self.sessions[s].replica.expect("routed");
                let action = self
                    .gate
                    .as_mut()
                    .expect("gate")
                    .begin(s, replica, prompt_len, sketch, self.now);
                self.carry_out(action);
            }
        }
    }

    fn route(&mut self, s: usize) {
        let st = &mut self.sessions[s];
        let r = match self.deployment.routing {
            Routing::Sticky
            | Routing::Hash
            | Routing::Room
            | Routing::RoomReplace
            | Routing::StickyReplace
            | Routing::StickyResume
            | Routing::StickyRefuse
                if st.replica.is_some() =>
            {
                return
            }
            Routing::Sticky => self.router.assign(),
            Routing::StickyReplace | Routing::StickyResume | Routing::StickyRefuse => {
                let turn = st.turn;
                let room = self.room_to_join();
                let prompt = self.workload.sessions[s].turns[turn].prompt_len as u64;
                let r = self.router.assign_by_count_where_room(&room, prompt);
                let st = &mut self.sessions[s];
                st.unseen = Some((r, prompt));
                st.replica = Some(r);
                st.router_slot = Some(r);
                return;
            }
            Routing::Room | Routing::RoomReplace => {
                let gate = self.gate.as_ref();
                let room: Vec<Option<u64>> = (0..self.deployment.replicas)
                    .map(|r| gate.and_then(|g| g.free_tokens(r)))
                    .collect();
                let prompt = self.workload.sessions[s].turns[st.turn].prompt_len as u64;
                let r = if self.deployment.routing == Routing::Room {
                    self.router.assign_by_room(&room, prompt)
                } else {
                    self.router.assign_by_room_or_empty(&room, prompt)
                };
                st.unseen = Some((r, prompt));
                r
            }
            Routing::Hash => {
                let hashed = router::hash_replica(s, self.deployment.replicas);
                self.router.assign_to(self.router.alive_from(hashed))
            }
            Routing::LeastLoaded => {
                // Placed anew every turn: off its old replica's count first.
                if let Some(old) = st.router_slot.take() {
                    self.router.release(old);
                }
                self.router.assign()
            }
        };
        st.replica = Some(r);
        st.router_slot = Some(r);
    }

    /// The room each replica takes a session into now ([`room_to_join`]).
    /// Under `sticky-resume` and `sticky-refuse`, less what the turns sent there and not
    /// finished will still write, as the host placing them counts it
    /// (`kvgate.Placement`): those turns times the mean output of the turns
    /// finished so far (nothing before the first one ends). A gate counts a
    /// running turn's prompt but its output only once the turn ends, so
    /// without this a replica looks emptier than it is while turns run.
    fn room_to_join(&self) -> Vec<Option<u64>> {
        let mut room = room_to_join(self.gate.as_ref(), self.deployment.replicas);
        let (sum, n) = self.outputs_seen;
        if !self.deployment.routing.resumes() || n == 0 {
            return room;
        }
        let mean = sum / n;
        let mut sent = vec![0u64; room.len()];
        for st in &self.sessions {
            if let (Phase::AtPolicy | Phase::InEngine(_), Some(r)) = (st.phase, st.replica) {
                sent[r] += 1;
            }
        }
        for (free, turns) in room.iter_mut().zip(sent) {
            if let Some(f) = free {
                *f = f.saturating_sub(turns * mean);
            }
        }
        room
    }

    /// Sends the session's current turn to its replica's waiting queue.
    fn submit(&mut self, s: usize) {
        let session = &self.workload.sessions[s];
        let st = &mut self.sessions[s];
        let turn = session.turns[st.turn];
        let replica = st.replica.expect("routed");
        self.next_request += 1;
        let id = self.next_request;
        st.phase = Phase::InEngine(id);
        st.submitted_ns = self.now;
        let last = st.turn + 1 == session.turns.len();
        self.replicas[replica].add(NewRequest {
            id,
            session: s,
            turn: st.turn,
            hashes: session.hashes(st.turn).clone(),
            prompt_len: turn.prompt_len,
            max_output: turn.output_len,
            pin_after: !last,
            reused: turn.reused,
        });
        self.kick(replica);
    }

    /// Asks for a step at the current instant, after the events already due
    /// now (so requests arriving together are scheduled together).
    fn kick(&mut self, r: usize) {
        if !self.kick_pending[r] && !self.replicas[r].is_busy() {
            self.kick_pending[r] = true;
            self.events.push(self.now, Event::Kick(r));
        }
    }

    fn kick_now(&mut self, r: usize) {
        self.kick_pending[r] = false;
        let replica = &mut self.replicas[r];
        if replica.is_busy() || !replica.has_work() {
            return;
        }
        let Some(plan) = replica.begin_step_at(self.now) else {
            return; // nothing fits; a free, an expiry or an arrival kicks again
        };
        for f in &plan.first_scheduled {
            self.sessions[f.session].first_scheduled =
                Some((self.now, f.hit_tokens, f.tier_hit_tokens));
        }
        // What an engine can measure of its own prefill rate: the median
        // throughput of its recent steps that were mostly prefill (a quarter
        // of the token budget or more), as the vLLM plugin does from step
        // timings (`crate::prefill_rate`).
        if plan.prefill_tokens * 4 >= self.deployment.engine.max_num_batched_tokens {
            let rate = plan.prefill_tokens as f64 / (plan.duration_ns.max(1) as f64 / 1e9);
            self.prefill_rates[r].record(rate);
        }
        self.events
            .push(self.now + plan.duration_ns, Event::StepDone(r));
    }

    fn step_done(&mut self, r: usize) {
        let finished = self.replicas[r].end_step(self.now);
        // Probes that arrived during the step are served between steps.
        for (id, kind, session) in std::mem::take(&mut self.queued_probes[r]) {
            self.answer_probe(r, id, kind, session);
        }
        for f in finished {
            self.turn_complete(r, f);
        }
        self.kick(r);
    }

    fn turn_complete(&mut self, r: usize, f: Finished) {
        let s = f.session;
        let session = &self.workload.sessions[s];
        let st = &mut self.sessions[s];
        assert_eq!(
            st.phase,
            Phase::InEngine(f.id),
            "the session's live request"
        );
        let turn = session.turns[st.turn];
        let last = st.turn + 1 == session.turns.len();
        self.outputs_seen.0 += turn.output_len as u64;
        self.outputs_seen.1 += 1;
        let (first_ns, hit, tier_hit) = st.first_scheduled.expect("scheduled before finishing");
        self.turns.push(TurnRecord {
            session: s,
            turn: st.turn,
            replica: r,
            last,
            issued_ns: st.issued_ns,
            arrived_ns: st.arrived_ns,
            submitted_ns: st.submitted_ns,
            first_scheduled_ns: first_ns,
            completed_ns: self.now,
            prompt_len: turn.prompt_len,
            hit_tokens: hit,
            tier_hit_tokens: tier_hit,
            prefilled: f.prefilled,
            re_prefilled: f.re_prefilled,
            output_len: turn.output_len,
            reissues: st.issue,
            engine_preemptions: f.preemptions,
        });
        if let Some((lost, after)) = self.loss {
            if self.turns.len() == after.max(1) {
                // After this step's other turns, at the same instant.
                self.events.push(self.now, Event::LoseReplica(lost));
            }
        }
        let lease = st.lease.take();
        if let (Some(ticket), PolicyKind::TtlPin { ttl_ns }) = (f.pinned, &self.policy.kind) {
            self.events.push(
                self.now + ttl_ns,
                Event::PinExpiry {
                    replica: r,
                    session: s,
                    ticket,
                },
            );
        }
        if let (Some(gate), Some(token)) = (self.gate.as_ref(), lease) {
            // What the host gets back from the engine: cached prompt tokens and output.
            let cached = match self.deployment.host_report {
                HostReport::Cached => Some(hit as u64),
                HostReport::OutputOnly => None,
            };
            let mut report = TurnReport::new(cached, Some(turn.output_len as u64));
            if cached.is_some() && self.deployment.engine.tier.is_some() {
                report = report
                    .with_tier_cached(tier_hit as u64)
                    .expect("tier hits are part of the hits");
            }
            gate.release(token, report, self.now);
        }
        if let Some(program) = self.program.as_mut() {
            program.turn_done(s, turn.prompt_len + turn.output_len, self.now, last);
        }
        if last {
            self.finish_session(s);
        } else {
            let st = &mut self.sessions[s];
            st.phase = Phase::Tool;
            st.turn += 1;
            self.events
                .push(self.now + turn.tool_ns, Event::TurnReady(s));
        }
    }

    fn finish_session(&mut self, s: usize) {
        self.sessions[s].phase = Phase::Done;
        self.sessions_done += 1;
        self.last_finish_ns = self.now;
        self.start_next_wave(self.workload.sessions[s].wave);
        if let (Some(gate), HostFinish::Told) = (self.gate.as_ref(), self.deployment.host_finish) {
            gate.finish_session(s, self.now);
        }
        if let Some(slot) = self.sessions[s].router_slot {
            self.router.release(slot);
        }
        if let PolicyKind::Cap(k) = self.policy.kind {
            while let Some(&q) = self.cap_queue.front() {
                let Some(replica) = self.router.assign_below(k) else {
                    break;
                };
                self.cap_queue.pop_front();
                let st = &mut self.sessions[q];
                st.replica = Some(replica);
                st.router_slot = Some(replica);
                // The session starts now: its first turn's latency counts from here.
                self.slot_waits += 1;
                self.slot_wait_ns += self.now - st.issued_ns;
                st.issued_ns = self.now;
                self.submit(q);
            }
        }
    }

    /// Starts the sessions waiting for one more of `wave`'s sessions to finish.
    fn start_next_wave(&mut self, wave: usize) {
        if self.wave_finished.len() <= wave {
            self.wave_finished.resize(wave + 1, 0);
        }
        self.wave_finished[wave] += 1;
        let done = self.wave_finished[wave];
        if let Some(waiters) = self.wave_waiters.get_mut(wave) {
            for &(s, _) in waiters.iter().filter(|&&(_, count)| count == done) {
                self.events.push(self.now, Event::TurnReady(s));
            }
        }
    }

    /// Replica `lost` stops: what ran or was cached there is gone. Its
    /// sessions are placed anew by the router at their next turn, as new
    /// sessions (their whole history is prefilled again where they land);
    /// a turn that was in its engine or at its gate is re-sent now.
    fn lose_replica(&mut self, lost: usize) {
        if self.router.is_lost(lost) {
            return;
        }
        self.router.lose(lost);
        self.queued_probes[lost].clear();
        if let Some(program) = self.program.as_mut() {
            if let Err(e) = program.lose_replica(lost) {
                panic!("{}: {e}", self.policy.name);
            }
        }
        let kvgate = matches!(self.policy.kind, PolicyKind::Kvgate { .. });
        let mut resend = Vec::new();
        for (s, st) in self.sessions.iter_mut().enumerate() {
            if st.replica != Some(lost) || st.phase == Phase::Done {
                continue;
            }
            if let Some(slot) = st.router_slot.take() {
                self.router.release(slot);
            }
            if let Some((r, prompt)) = st.unseen.take() {
                self.router.seen(r, prompt);
            }
            st.replica = None;
            match st.phase {
                Phase::InEngine(_) => resend.push(s),
                // A turn held by a program scheduler stays with it; one at
                // a lost gate starts over at another.
                Phase::AtPolicy if kvgate => resend.push(s),
                _ => {}
            }
        }
        for s in resend {
            let st = &mut self.sessions[s];
            st.first_scheduled = None;
            let lease = st.lease.take();
            if let Some(gate) = self.gate.as_mut() {
                gate.abandon(s);
                if let Some(token) = lease {
                    gate.release(token, TurnReport::default(), self.now);
                }
            }
            self.issue_turn(s);
        }
    }

    /// An impatient client re-issues its turn if it has not started running.
    fn retry_check(&mut self, s: usize, turn: usize, issue: u32) {
        let st = &self.sessions[s];
        if st.turn != turn || st.issue != issue {
            return;
        }
        let waiting = match st.phase {
            // A session waiting for a cap slot has sent nothing yet.
            // A session waiting for a cap slot or held by a program
            // scheduler's proxy has sent nothing an engine could start.
            Phase::AtPolicy => matches!(self.policy.kind, PolicyKind::Kvgate { .. }),
            Phase::InEngine(id) => {
                let replica = st.replica.expect("routed");
                self.replicas[replica].is_unscheduled(id)
            }
            Phase::NotStarted | Phase::Tool | Phase::Done => false,
        };
        if !waiting {
            return;
        }
        self.reissues += 1;
        let st = &mut self.sessions[s];
        st.issue += 1;
        let next_issue = st.issue;
        if let Phase::InEngine(id) = st.phase {
            let replica = st.replica.expect("routed");
            assert!(self.replicas[replica].abort_unscheduled(id));
            if let (Some(gate), Some(token)) = (self.gate.as_ref(), st.lease.take()) {
                gate.release(token, TurnReport::default(), self.now);
            }
        }
        // Under kvgate a waiting attempt is preempted by this newer one.
        self.issue_turn(s);
        if next_issue < self.workload.max_retries {
            self.events.push(
                self.now + self.workload.retry_after_ns,
                Event::RetryCheck {
                    session: s,
                    turn,
                    issue: next_issue,
                },
            );
        }
    }
}

/// Each replica's free working-set tokens where a session could join now:
/// `None` where its gate cannot tell them or a session already waits to
/// join there (`sticky-replace`'s first turns, and moves).
fn room_to_join(gate: Option<&GateDriver>, replicas: usize) -> Vec<Option<u64>> {
    (0..replicas)
        .map(|r| {
            let nobody_joining = gate.and_then(|g| g.joining(r)) == Some(0);
            gate.and_then(|g| g.free_tokens(r))
                .filter(|_| nobody_joining)
        })
        .collect()
}
