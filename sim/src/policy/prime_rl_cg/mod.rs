//! prime-rl's cost-model concurrency controller (PrimeIntellect-ai/prime-rl,
//! `src/prime_rl/orchestrator/concurrency.py` and `dispatcher.py` at commit
//! 014aa9d, 2026-08-17), re-implemented from its rules and constants: a
//! cap on in-flight *episodes* (sessions, from their first turn to their
//! last) sized as `κ · C / G`, the engines' KV capacity over what an
//! episode is expected to cost at its *final* size ([`controller`]).
//!
//! That commit is the design on the branch `exp/adaptive-concurrency-timeout-zero`,
//! not on prime-rl's main: the next day it was reduced to the measured AIMD
//! controller that was merged (PRs 3285, 3307; our `prime-rl` row,
//! [`super::prime_rl`]). It is kept as a peer because it is the one that
//! sizes admissions by what episodes grow to, learned from those that ended.
//!
//! The dispatcher around the law, as prime-rl's `RolloutDispatcher` does:
//!
//! - one permit per episode; a held episode starts, in arrival order, when
//!   a permit is free and the **admission burst** allows: at most
//!   `max(group size, n_max / 10)` admissions per 5 s window, so that a
//!   raised or drained cap does not land all its prefills at once;
//! - `/metrics` every 5 s: each engine's waiting queue and preemptions
//!   since the last poll feed [`Controller::observe`];
//! - each completed episode reports its final context (its last request's
//!   prompt and output: a linear trace's `num_total_tokens`) and its time
//!   since admission;
//! - a **step** ships when `batch` rollouts of completed groups are
//!   buffered (prime-rl's rollout batching: a group enters the buffer when
//!   its last sample completes), and calls [`Controller::on_step`] with
//!   the episodes then in flight. `batch` is the scenario's wave, where it
//!   has RL waves (a wave is one step's rollouts); otherwise prime-rl's
//!   default `batch_size`, 128 (a scenario of at most 128 sessions is then
//!   all warm-up: the cap follows `C / G` at every poll).
//!
//! Mapped onto the simulator: an environment is a session class, sampled
//! at its share of the sessions; the floor is the largest GRPO group
//! (`group_size`, 1 without groups); `seq_len`, the bootstrap cost, is a
//! long-context run's (prime-rl's SWE config sets it to `max_model_len`,
//! 131,072), at most one engine's KV.
//!
//! Not modelled: evaluation epochs (their census re-weighs `G`), the
//! off-policy drop of groups, forked traces (prime-rl's final tokens sum
//! over a trace's branches: a compacting agent's would be larger), and the
//! dispatcher's 0.5 s wake-up (a window's next admission is at its expiry,
//! not up to 0.5 s later).

pub mod controller;

use std::collections::VecDeque;

use controller::{Controller, LoadSample};

use super::program::{EngineView, ProgramScheduler, ProgramStats};

/// The dispatcher's admission window, ns.
const ADMISSION_WINDOW_NS: u64 = 5_000_000_000;
/// prime-rl's default rollouts per step (`batch_size`).
pub const DEFAULT_BATCH: usize = 128;

/// prime-rl's defaults, and the step size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrimeRlCgConfig {
    /// Period of the `/metrics` poll, ns (5 s).
    pub poll_ns: u64,
    /// The bootstrap cost, tokens (`seq_len`; at most one engine's KV).
    pub seq_len: usize,
    /// Rollouts per step; `None`: the scenario's wave, else 128.
    pub batch: Option<usize>,
    /// `concurrency.max_inflight`, the ceiling (`None`: none).
    pub max_inflight: Option<usize>,
}

impl Default for PrimeRlCgConfig {
    fn default() -> Self {
        Self {
            poll_ns: 5_000_000_000,
            seq_len: 131_072,
            batch: None,
            max_inflight: None,
        }
    }
}

/// What the dispatcher knows of one episode before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Episode {
    /// Its environment (the session's class).
    pub env: usize,
    /// Its GRPO group.
    pub group: usize,
}

/// The dispatcher and its controller.
#[derive(Debug)]
pub struct PrimeRlCg {
    cfg: PrimeRlCgConfig,
    controller: Controller,
    /// KV tokens over every engine (`num_gpu_blocks × block_size`).
    capacity: usize,
    batch: usize,
    episodes: Vec<Episode>,
    admitted: Vec<bool>,
    started_ns: Vec<u64>,
    /// Per group: its size, and its samples not yet completed.
    group_size: Vec<usize>,
    group_left: Vec<usize>,
    inflight: usize,
    held: VecDeque<(usize, usize)>,
    min_burst: usize,
    window_start: u64,
    admitted_in_window: usize,
    next_poll: u64,
    prev_preemptions: Option<Vec<u64>>,
    /// Rollouts of completed groups not yet shipped in a step.
    buffered: usize,
    steps: u64,
    stats: ProgramStats,
}

impl PrimeRlCg {
    /// A dispatcher over `episodes` on engines of `capacities` KV tokens
    /// each; `wave` is the scenario's RL wave, if it has several.
    pub fn new(
        cfg: PrimeRlCgConfig,
        capacities: &[usize],
        episodes: Vec<Episode>,
        wave: Option<usize>,
    ) -> Self {
        let groups = episodes.iter().map(|e| e.group + 1).max().unwrap_or(0);
        let mut group_size = vec![0; groups];
        for e in &episodes {
            group_size[e.group] += 1;
        }
        let floor = group_size.iter().copied().max().unwrap_or(1).max(1);
        let envs = episodes.iter().map(|e| e.env + 1).max().unwrap_or(1);
        let mut ratios = vec![0.0; envs];
        for e in &episodes {
            ratios[e.env] += 1.0 / episodes.len() as f64;
        }
        let one_engine = capacities.iter().copied().min().unwrap_or(0).max(1);
        let controller = Controller::new(
            ratios,
            floor,
            cfg.seq_len.min(one_engine),
            cfg.max_inflight,
            None,
        );
        let n = episodes.len();
        Self {
            cfg,
            controller,
            capacity: capacities.iter().sum(),
            batch: cfg.batch.or(wave).unwrap_or(DEFAULT_BATCH).max(1),
            episodes,
            admitted: vec![false; n],
            started_ns: vec![0; n],
            group_left: group_size.clone(),
            group_size,
            inflight: 0,
            held: VecDeque::new(),
            min_burst: floor,
            window_start: 0,
            admitted_in_window: 0,
            next_poll: 0,
            prev_preemptions: None,
            buffered: 0,
            steps: 0,
            stats: ProgramStats::default(),
        }
    }

    /// The cap now.
    pub fn limit(&self) -> usize {
        self.controller.max_inflight()
    }

    /// Steps shipped so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The control law's state.
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    fn burst_cap(&self) -> usize {
        self.min_burst.max(self.limit() / 10)
    }

    /// Whether one more episode may start now (a permit and the burst);
    /// opens a new admission window when the last one is over.
    fn may_admit(&mut self, now: u64) -> bool {
        if self.inflight >= self.limit() {
            return false;
        }
        if now - self.window_start >= ADMISSION_WINDOW_NS {
            self.window_start = now;
            self.admitted_in_window = 0;
        }
        self.admitted_in_window < self.burst_cap()
    }

    fn admit(&mut self, session: usize, now: u64) {
        self.admitted[session] = true;
        self.started_ns[session] = now;
        self.inflight += 1;
        self.admitted_in_window += 1;
    }

    /// One `/metrics` poll: waiting queues and preemptions since the last.
    fn observe(&mut self, engines: &[EngineView]) {
        let counters: Vec<u64> = engines.iter().map(|e| e.preemptions).collect();
        let samples: Vec<LoadSample> = engines
            .iter()
            .enumerate()
            .map(|(i, e)| LoadSample {
                waiting: e.waiting,
                // The first poll has no baseline: a counter already up is no news.
                preemptions_delta: self
                    .prev_preemptions
                    .as_ref()
                    .map_or(0, |prev| e.preemptions.saturating_sub(prev[i])),
            })
            .collect();
        self.prev_preemptions = Some(counters);
        self.controller
            .observe(&samples, self.capacity, self.inflight);
    }
}

impl ProgramScheduler for PrimeRlCg {
    fn arrive(
        &mut self,
        session: usize,
        _prompt_len: usize,
        routed: usize,
        now: u64,
        _engines: &[EngineView],
    ) -> Option<usize> {
        if self.admitted[session] {
            return Some(routed);
        }
        if self.held.is_empty() && self.may_admit(now) {
            self.admit(session, now);
            return Some(routed);
        }
        self.stats.held += 1;
        self.held.push_back((session, routed));
        None
    }

    fn turn_done(&mut self, session: usize, total_tokens: usize, now: u64, last: bool) {
        if !last || !self.admitted[session] {
            return;
        }
        self.admitted[session] = false;
        self.inflight -= 1;
        let Episode { env, group } = self.episodes[session];
        let duration_s = (now - self.started_ns[session]) as f64 / 1e9;
        self.controller
            .record_episode(env, total_tokens, duration_s);
        self.group_left[group] -= 1;
        if self.group_left[group] == 0 {
            self.buffered += self.group_size[group];
        }
        while self.buffered >= self.batch {
            self.buffered -= self.batch;
            self.steps += 1;
            self.controller.on_step(self.inflight);
        }
    }

    fn poll(&mut self, now: u64, engines: &[EngineView], out: &mut Vec<(usize, usize)>) {
        if now >= self.next_poll {
            self.observe(engines);
            self.next_poll = now + self.cfg.poll_ns;
        }
        while !self.held.is_empty() && self.may_admit(now) {
            let (s, r) = self.held.pop_front().expect("not empty");
            self.admit(s, now);
            out.push((s, r));
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        if self.inflight == 0 && self.held.is_empty() {
            return None;
        }
        // A permit free but the burst spent: the next window opens it.
        let window = (!self.held.is_empty()
            && self.inflight < self.limit()
            && self.admitted_in_window >= self.burst_cap())
        .then_some(self.window_start + ADMISSION_WINDOW_NS);
        Some(window.map_or(self.next_poll, |w| w.min(self.next_poll)))
    }

    fn stats(&self) -> ProgramStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn view(waiting: usize, preemptions: u64) -> [EngineView; 1] {
        [EngineView {
            waiting,
            running: 0,
            usage: 0.0,
            preemptions,
        }]
    }

    fn solo(n: usize) -> Vec<Episode> {
        (0..n).map(|i| Episode { env: 0, group: i }).collect()
    }

    #[test]
    fn the_burst_window_paces_admissions_under_the_cap() {
        // 400k tokens over a 10k bootstrap: a cap of 40, a burst of 4 per 5 s.
        let cfg = PrimeRlCgConfig {
            seq_len: 10_000,
            ..PrimeRlCgConfig::default()
        };
        let mut p = PrimeRlCg::new(cfg, &[400_000], solo(64), None);
        let idle = view(0, 0);
        let mut out = Vec::new();
        // Before the first poll the cap is the floor, 1.
        assert_eq!(p.arrive(0, 10, 0, 0, &idle), Some(0));
        for s in 1..64 {
            assert_eq!(p.arrive(s, 10, 0, 0, &idle), None);
        }
        p.poll(0, &idle, &mut out);
        assert_eq!(p.limit(), 40);
        assert_eq!(out, [(1, 0), (2, 0), (3, 0)], "4 in the first window");
        assert_eq!(p.next_deadline(), Some(5 * S));
        out.clear();
        p.poll(4 * S, &idle, &mut out);
        assert!(out.is_empty());
        p.poll(5 * S, &idle, &mut out);
        assert_eq!(out, [(4, 0), (5, 0), (6, 0), (7, 0)]);
    }

    #[test]
    fn a_wave_is_a_step_and_its_finals_size_the_next() {
        // Two waves of 4 solo episodes on 400k tokens, bootstrap 200k: the
        // warm-up cap is 2 until episodes end; their finals re-price it.
        let cfg = PrimeRlCgConfig {
            seq_len: 200_000,
            ..PrimeRlCgConfig::default()
        };
        let mut p = PrimeRlCg::new(cfg, &[400_000], solo(8), Some(4));
        let idle = view(0, 0);
        let mut out = Vec::new();
        for s in 0..4 {
            p.arrive(s, 10, 0, 0, &idle);
        }
        p.poll(0, &idle, &mut out);
        assert_eq!(p.limit(), 2);
        // One admission per 5 s window (the floor, 1, over 2 / 10).
        assert!(out.is_empty());
        p.poll(5 * S, &idle, &mut out);
        assert_eq!(out, [(1, 0)]);
        // Both end at 50k tokens: G = 50k, the next poll makes the cap 8.
        p.turn_done(0, 50_000, 100 * S, true);
        p.turn_done(1, 50_000, 100 * S, true);
        out.clear();
        p.poll(100 * S, &idle, &mut out);
        assert_eq!(p.limit(), 8);
        assert_eq!(out, [(2, 0)]);
        p.poll(105 * S, &idle, &mut out);
        assert_eq!(out, [(2, 0), (3, 0)]);
        assert_eq!(p.steps(), 0);
        // The wave's last two end: the step ships, κ = max(1, 8·50k/400k) = 1.
        p.turn_done(2, 50_000, 200 * S, true);
        p.turn_done(3, 50_000, 200 * S, true);
        assert_eq!(p.steps(), 1);
        assert_eq!(p.controller().kappa(), Some(1.0));
        assert_eq!(p.limit(), 8);
    }

    #[test]
    fn a_group_enters_the_batch_when_its_last_sample_ends() {
        let episodes: Vec<Episode> = (0..8)
            .map(|i| Episode {
                env: 0,
                group: i / 4,
            })
            .collect();
        let mut p = PrimeRlCg::new(
            PrimeRlCgConfig {
                batch: Some(4),
                ..PrimeRlCgConfig::default()
            },
            &[400_000],
            episodes,
            None,
        );
        let idle = view(0, 0);
        let mut out = Vec::new();
        // The floor is the group: 4 start before the first poll.
        for s in 0..8 {
            p.arrive(s, 10, 0, 0, &idle);
        }
        p.poll(0, &idle, &mut out);
        assert_eq!(p.limit(), 4, "400k / 131,072 = 3, floored at the group");
        for s in 0..3 {
            p.turn_done(s, 1_000, S, true);
        }
        assert_eq!(p.steps(), 0, "three samples of a group of four");
        p.turn_done(3, 1_000, S, true);
        assert_eq!(p.steps(), 1);
    }

    #[test]
    fn new_preemptions_cut_the_cap_at_the_next_poll() {
        let cfg = PrimeRlCgConfig {
            seq_len: 10_000,
            ..PrimeRlCgConfig::default()
        };
        let mut p = PrimeRlCg::new(cfg, &[400_000], solo(64), None);
        let mut out = Vec::new();
        // The counter is already at 5 at the first poll: no news.
        for s in 0..64 {
            p.arrive(s, 10, 0, 0, &view(0, 5));
        }
        for t in 0..10 {
            p.poll(t * 5 * S, &view(0, 5), &mut out);
        }
        assert_eq!((p.limit(), p.inflight), (40, 40));
        // It rises: 0.75 x 40 in flight.
        p.poll(50 * S, &view(0, 7), &mut out);
        assert_eq!(p.limit(), 30);
        assert_eq!(p.controller().cuts(), 1);
    }
}
