//! prime-rl's adaptive concurrency (PrimeIntellect-ai/prime-rl,
//! `src/prime_rl/orchestrator/concurrency.py`, the `ConcurrencyController`
//! merged in August 2026, PRs 3285 and 3307), re-implemented from its
//! rules and constants: a cap on in-flight *episodes* (sessions, from their
//! first turn to their last), fed by the engines' `/metrics` every 5 s.
//!
//! - **Start**: at the first poll, the cap is the pessimistic bound
//!   `KV capacity / max_model_len` (capacity summed over the engines),
//!   clamped to `[min_inflight, max_inflight]` = `[1, 1024]`; before it, 1.
//! - **Signal** per poll: *hard* when an engine's preemption counter rose
//!   since the last poll, or when waiting requests have exceeded half the
//!   running ones for 6 polls in a row; *soft* when an engine had waiting
//!   requests at this poll and the last, or when the highest KV usage is
//!   above 0.6; *clear* otherwise. Growth is allowed for 15 s after a poll
//!   whose signal is clear with nothing waiting and no drain under way.
//! - **Grow** per pipeline turnover: each finished episode advances the
//!   turnover by `1/inflight` (itself counted) and, while growth is
//!   allowed and the cap binds (inflight at least 0.9 of it), multiplies
//!   the cap by `1.25^(1/inflight)`.
//! - **Cut** on a hard signal: the cap drops to 0.8 of the episodes in
//!   flight (0.5 when an overload recurs within 6 polls of the last drain)
//!   and further cuts wait until the episodes in flight are back under it.
//! - **Trim** when the highest KV usage passes 0.8: the cap drops to
//!   `inflight × 0.7 / usage`, at most once per 6 polls.
//! - The cap applied is the integer part of the float it keeps; a lower cap
//!   blocks admissions until enough episodes finish. Held episodes start
//!   in arrival order.
//!
//! Not modelled: cancelling in-flight episodes on a cut or above 0.9 usage
//! (prime-rl drops the youngest groups and loses their work; an agent
//! session here always runs to its end, so the cap only blocks admissions,
//! as prime-rl's own `set_limit` does), the dispatcher's admission burst
//! window, prefill/decode roles. vLLM's `kv_cache_usage_perc` counts only
//! running requests' blocks, as the simulated engine's usage does.
//! `max_model_len` is not a figure the scenarios carry: it defaults to
//! Llama-3.1-8B's 131,072 tokens, or the KV capacity of one engine where
//! that is smaller (vLLM refuses a `max_model_len` its cache cannot hold).

use std::collections::VecDeque;

use super::program::{EngineView, ProgramScheduler, ProgramStats};

/// Cap growth per pipeline turnover while the engines are clear and the cap binds.
const TURNOVER_GROWTH: f64 = 1.25;
/// The cap binds when the episodes in flight reach this fraction of it.
const BINDING_FRACTION: f64 = 0.9;
/// Grow only while every engine's KV usage is below this.
const KV_USAGE_GROW: f64 = 0.6;
/// Above this usage, trim the cap.
const KV_USAGE_SOFT_CAP: f64 = 0.8;
/// A trim resizes to `inflight × KV_USAGE_TARGET / usage`.
const KV_USAGE_TARGET: f64 = 0.7;
/// Polls between two trims.
const KV_TRIM_COOLDOWN_POLLS: u32 = 6;
/// A queue overload: waiting above this fraction of running...
const QUEUE_RATIO: f64 = 0.5;
/// ...for this many polls in a row.
const QUEUE_PERSISTENCE_POLLS: u32 = 6;
/// A queue-overload cut keeps this fraction of the episodes in flight.
const QUEUE_CUT_FRACTION: f64 = 0.9;
/// A preemption cut keeps this fraction.
const PREEMPTION_CUT_FRACTION: f64 = 0.8;
/// A cut when an overload recurs within the grace after a drain.
const ESCALATED_CUT_FRACTION: f64 = 0.5;
/// Polls after a drain during which a repeat overload cuts harder.
const ESCALATION_GRACE_POLLS: u32 = 6;
/// Growth is allowed this long after the poll that allowed it, ns.
const GROWTH_GATE_TTL_NS: u64 = 15_000_000_000;

/// prime-rl's defaults, and the engines' `max_model_len`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrimeRlConfig {
    /// Period of the `/metrics` poll, ns (5 s).
    pub poll_ns: u64,
    /// Fewest episodes in flight (1).
    pub min_inflight: usize,
    /// Most episodes in flight (1024).
    pub max_inflight: usize,
    /// The engines' `max_model_len`, tokens (at most one engine's KV capacity).
    pub max_model_len: usize,
}

impl Default for PrimeRlConfig {
    fn default() -> Self {
        Self {
            poll_ns: 5_000_000_000,
            min_inflight: 1,
            max_inflight: 1024,
            max_model_len: 131_072,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Clear,
    Soft,
    Hard,
}

/// The controller and the dispatcher's permits.
#[derive(Debug)]
pub struct PrimeRl {
    cfg: PrimeRlConfig,
    /// KV tokens over every engine.
    capacity: usize,
    /// `max_model_len`, capped by one engine's KV.
    max_len: usize,
    /// The float cap; the dispatcher's limit is its integer part.
    cap: f64,
    limit: usize,
    bootstrapped: bool,
    /// Whether each session holds a permit.
    admitted: Vec<bool>,
    inflight: usize,
    /// Episodes waiting for a permit, with their replica, in arrival order.
    held: VecDeque<(usize, usize)>,
    next_poll: u64,
    turnover: f64,
    can_grow_until: Option<u64>,
    prev_waiting: Vec<usize>,
    prev_preemptions: Option<Vec<u64>>,
    queue_overload_polls: u32,
    trim_cooldown: u32,
    escalation_grace: u32,
    draining: bool,
    escalated: bool,
    stats: ProgramStats,
}

impl PrimeRl {
    /// A controller for `sessions` sessions on `replicas` engines of
    /// `engine_capacity` KV tokens each.
    pub fn new(
        cfg: PrimeRlConfig,
        engine_capacity: usize,
        replicas: usize,
        sessions: usize,
    ) -> Self {
        let cap = cfg.min_inflight as f64;
        Self {
            cfg,
            capacity: engine_capacity * replicas,
            max_len: cfg.max_model_len.min(engine_capacity).max(1),
            cap,
            limit: cap as usize,
            bootstrapped: false,
            admitted: vec![false; sessions],
            inflight: 0,
            held: VecDeque::new(),
            next_poll: 0,
            turnover: 0.0,
            can_grow_until: None,
            prev_waiting: vec![0; replicas],
            prev_preemptions: None,
            queue_overload_polls: 0,
            trim_cooldown: 0,
            escalation_grace: 0,
            draining: false,
            escalated: false,
            stats: ProgramStats::default(),
        }
    }

    /// The dispatcher's limit now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Pipeline turnovers so far.
    pub fn turnover(&self) -> f64 {
        self.turnover
    }

    fn clamp(&self, n: f64) -> f64 {
        n.max(self.cfg.min_inflight as f64)
            .min(self.cfg.max_inflight as f64)
    }

    /// Lowers the cap (never raises it).
    fn resize_down(&mut self, target: usize) {
        let target = target.min(self.limit);
        self.cap = target as f64;
        self.limit = target;
    }

    /// One `/metrics` poll of every engine.
    fn observe(&mut self, now: u64, engines: &[EngineView]) {
        let preemptions: Vec<u64> = engines.iter().map(|e| e.preemptions).collect();
        // The first poll has no baseline: a counter already up is no news.
        let preempted = self
            .prev_preemptions
            .as_ref()
            .is_some_and(|prev| preemptions.iter().zip(prev).any(|(now, was)| now > was));
        self.prev_preemptions = Some(preemptions);
        let mut worst = if preempted {
            Signal::Hard
        } else {
            Signal::Clear
        };
        let mut max_usage: f64 = 0.0;
        let (mut running, mut queued) = (0, 0);
        for (e, prev) in engines.iter().zip(&mut self.prev_waiting) {
            if e.waiting > 0 && *prev > 0 && worst == Signal::Clear {
                worst = Signal::Soft;
            }
            *prev = e.waiting;
            max_usage = max_usage.max(e.usage);
            running += e.running;
            queued += e.waiting;
        }
        if running > 0 && queued as f64 > QUEUE_RATIO * running as f64 {
            self.queue_overload_polls += 1;
        } else {
            self.queue_overload_polls = 0;
        }
        let queue_overload = self.queue_overload_polls >= QUEUE_PERSISTENCE_POLLS;
        if queue_overload {
            worst = Signal::Hard;
        } else if max_usage > KV_USAGE_GROW && worst == Signal::Clear {
            worst = Signal::Soft;
        }

        if self.draining && self.inflight <= self.limit && !preempted && !queue_overload {
            self.draining = false;
            self.escalation_grace = ESCALATION_GRACE_POLLS;
        }
        if !self.draining && self.escalated {
            self.escalation_grace = self.escalation_grace.saturating_sub(1);
            if self.escalation_grace == 0 {
                self.escalated = false;
            }
        }
        self.trim_cooldown = self.trim_cooldown.saturating_sub(1);
        let can_grow = worst == Signal::Clear && queued == 0 && !self.draining;
        self.can_grow_until = can_grow.then_some(now + GROWTH_GATE_TTL_NS);

        if !self.bootstrapped {
            self.bootstrapped = true;
            self.cap = self.clamp(self.capacity as f64 / self.max_len as f64);
            self.limit = self.cap as usize;
        }
        if self.draining {
            return;
        }
        let inflight = self.inflight as f64;
        if preempted || queue_overload {
            let fraction = if self.escalated {
                ESCALATED_CUT_FRACTION
            } else if queue_overload {
                QUEUE_CUT_FRACTION
            } else {
                PREEMPTION_CUT_FRACTION
            };
            if queue_overload {
                self.queue_overload_polls = 0;
            }
            self.resize_down(self.clamp(inflight * fraction) as usize);
            self.draining = true;
            self.escalated = true;
            return;
        }
        if max_usage > KV_USAGE_SOFT_CAP && self.inflight > 0 && self.trim_cooldown == 0 {
            self.resize_down(self.clamp(inflight * KV_USAGE_TARGET / max_usage) as usize);
            self.trim_cooldown = KV_TRIM_COOLDOWN_POLLS;
        }
    }

    /// Starts held episodes while permits are free.
    fn release(&mut self, out: &mut Vec<(usize, usize)>) {
        while self.inflight < self.limit {
            let Some((s, r)) = self.held.pop_front() else {
                break;
            };
            self.admitted[s] = true;
            self.inflight += 1;
            out.push((s, r));
        }
    }
}

impl ProgramScheduler for PrimeRl {
    fn arrive(
        &mut self,
        session: usize,
        _prompt_len: usize,
        routed: usize,
        _now: u64,
        _engines: &[EngineView],
    ) -> Option<usize> {
        if self.admitted[session] {
            return Some(routed);
        }
        if self.held.is_empty() && self.inflight < self.limit {
            self.admitted[session] = true;
            self.inflight += 1;
            return Some(routed);
        }
        self.stats.held += 1;
        self.held.push_back((session, routed));
        None
    }

    fn turn_done(&mut self, session: usize, _total_tokens: usize, now: u64, last: bool) {
        if !last || !self.admitted[session] {
            return;
        }
        self.admitted[session] = false;
        self.inflight -= 1;
        // The finished episode counts itself, as the dispatcher's hook does.
        let inflight = (self.inflight + 1) as f64;
        let fraction = 1.0 / inflight;
        self.turnover += fraction;
        let may_grow = self.can_grow_until.is_some_and(|until| now < until);
        if may_grow && inflight >= BINDING_FRACTION * self.limit as f64 {
            self.cap = self.clamp(self.cap * TURNOVER_GROWTH.powf(fraction));
            self.limit = self.cap as usize;
        }
    }

    fn poll(&mut self, now: u64, engines: &[EngineView], out: &mut Vec<(usize, usize)>) {
        if now >= self.next_poll {
            self.observe(now, engines);
            self.next_poll = now + self.cfg.poll_ns;
        }
        self.release(out);
    }

    fn next_deadline(&self) -> Option<u64> {
        (self.inflight > 0 || !self.held.is_empty()).then_some(self.next_poll)
    }

    fn stats(&self) -> ProgramStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn view(usage: f64, running: usize, waiting: usize, preemptions: u64) -> [EngineView; 1] {
        [EngineView {
            waiting,
            running,
            usage,
            preemptions,
        }]
    }

    #[test]
    fn starts_at_capacity_over_max_model_len_and_admits_in_order() {
        // An H100's ~467k tokens over Llama-3.1's 131,072: 3 episodes.
        let mut p = PrimeRl::new(PrimeRlConfig::default(), 467_280, 1, 6);
        let idle = view(0.0, 0, 0, 0);
        let mut out = Vec::new();
        // Before the first poll the cap is the floor, 1.
        assert_eq!(p.arrive(0, 10, 0, 0, &idle), Some(0));
        assert_eq!(p.arrive(1, 10, 0, 0, &idle), None);
        assert_eq!(p.arrive(2, 10, 0, 0, &idle), None);
        assert_eq!(p.arrive(3, 10, 0, 0, &idle), None);
        p.poll(0, &idle, &mut out);
        assert_eq!(p.limit(), 3);
        assert_eq!(out, [(1, 0), (2, 0)]);
        // A later turn of an admitted episode passes.
        assert_eq!(p.arrive(1, 20, 0, S, &idle), Some(0));
        // An episode ends: its permit goes to the next held one.
        p.turn_done(0, 30, S, true);
        out.clear();
        p.poll(S, &idle, &mut out);
        assert_eq!(out, [(3, 0)]);
        // max_model_len never exceeds one engine's KV.
        let small = PrimeRl::new(PrimeRlConfig::default(), 12_768, 1, 1);
        assert_eq!(small.max_len, 12_768);
    }

    #[test]
    fn grows_per_turnover_only_while_clear_and_binding() {
        let cfg = PrimeRlConfig {
            max_model_len: 100,
            ..PrimeRlConfig::default()
        };
        let mut p = PrimeRl::new(cfg, 400, 1, 64);
        let mut out = Vec::new();
        let idle = view(0.1, 4, 0, 0);
        for s in 0..64 {
            p.arrive(s, 10, 0, 0, &idle);
        }
        p.poll(0, &idle, &mut out);
        assert_eq!(p.limit(), 4);
        assert_eq!(out, [(1, 0), (2, 0), (3, 0)]);
        // Four episodes end: each advances the turnover by 1/inflight...
        for s in 0..4 {
            p.turn_done(s, 10, S + s as u64, true);
        }
        assert!((p.turnover() - (1.0 / 4.0 + 1.0 / 3.0 + 1.0 / 2.0 + 1.0)).abs() < 1e-12);
        // ...and grows the cap only while inflight >= 0.9 x the cap: the first.
        assert!((p.cap - 4.0 * 1.25f64.powf(0.25)).abs() < 1e-12);
        // No growth once the gate is older than 15 s or the engines are busy.
        let mut q = PrimeRl::new(cfg, 400, 1, 64);
        for s in 0..64 {
            q.arrive(s, 10, 0, 0, &idle);
        }
        q.poll(0, &view(0.7, 4, 0, 0), &mut out);
        q.turn_done(0, 10, S, true);
        assert_eq!(q.cap, 4.0, "usage above 0.6 is soft");
        let mut r = PrimeRl::new(cfg, 400, 1, 64);
        for s in 0..64 {
            r.arrive(s, 10, 0, 0, &idle);
        }
        r.poll(0, &idle, &mut out);
        r.turn_done(0, 10, 16 * S, true);
        assert_eq!(r.cap, 4.0, "the growth gate expired");
    }

    #[test]
    fn preemptions_cut_and_high_usage_trims() {
        let cfg = PrimeRlConfig {
            max_model_len: 10,
            ..PrimeRlConfig::default()
        };
        let mut p = PrimeRl::new(cfg, 400, 1, 64);
        let mut out = Vec::new();
        let idle = view(0.1, 0, 0, 5);
        for s in 0..64 {
            p.arrive(s, 10, 0, 0, &idle);
        }
        p.poll(0, &idle, &mut out);
        assert_eq!((p.limit(), p.inflight), (40, 40));
        // The counter rose: cut to 0.8 of 40, then no cut while draining.
        p.poll(5 * S, &view(0.5, 40, 0, 6), &mut out);
        assert_eq!(p.limit(), 32);
        p.poll(10 * S, &view(0.5, 40, 0, 9), &mut out);
        assert_eq!(p.limit(), 32);
        // Drained under the cap: a repeat overload within the grace halves.
        for s in 0..8 {
            p.turn_done(s, 10, 11 * S, true);
        }
        p.poll(15 * S, &view(0.5, 32, 0, 9), &mut out);
        assert!(!p.draining);
        p.poll(20 * S, &view(0.5, 32, 0, 10), &mut out);
        assert_eq!(p.limit(), 16);
        // Usage above 0.8 trims to inflight x 0.7 / usage.
        let mut q = PrimeRl::new(cfg, 400, 1, 64);
        for s in 0..64 {
            q.arrive(s, 10, 0, 0, &idle);
        }
        q.poll(0, &idle, &mut out);
        q.poll(5 * S, &view(0.875, 40, 0, 0), &mut out);
        assert_eq!(q.limit(), 32);
        // Cooldown: no second trim at the next poll.
        q.poll(10 * S, &view(0.95, 40, 0, 0), &mut out);
        assert_eq!(q.limit(), 32);
    }
}
