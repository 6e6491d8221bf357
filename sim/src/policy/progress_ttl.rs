//! vllm-router's program scheduling with Progress-TTL (vllm-project/router,
//! RFC 285 / PR 286, `src/program_scheduling/`), re-implemented from its
//! published rules and defaults:
//!
//! - A logical token ledger per data-parallel rank (here: per replica) of
//!   capacity = the engine's KV tokens. An *active* program holds a
//!   reservation of its private tokens (context − the shared prefix) + 100
//!   (`decode_buffer_tokens`); the shared prefix is booked once per rank.
//! - A request of an active program goes at once. Any other is held until
//!   its rank has logical room for it (low watermark 1.0) and vLLM's waiting
//!   queue on that rank is empty. Held programs are let go in resume order:
//!   those held past the timeout first, then the most recently served, new
//!   programs last (each candidate that fits goes; no head-of-line block).
//! - **Progress-TTL:** when a turn ends, the program keeps its reservation
//!   for a TTL d maximising `C·P(T < d) − E[T; T < d] − d·P(T ≥ d)` under a
//!   log-normal fit of the rank's last 100 request gaps T (previous response
//!   → next request of the same program), where C is the cost of re-prefilling
//!   the program's context by the router's cold-prefill model (quadratic in
//!   uncached kilotokens). d ≤ min(10 s, C); d = 0 until 100 gaps are seen.
//!   At d the reservation goes and the program must queue again.
//! - A held request times out after 600 s; the router then fails it, which
//!   a rollout cannot afford, so here it is sent anyway (counted as forced).
//!
//! Not modelled: the learned growth reserve and batch-gain bypass (both off
//! until 100 request samples, and then second-order), fairness rounds
//! (`max_segment_rounds`), privileged resumes, the global queue across ranks.

use std::collections::VecDeque;

use super::program::{EngineView, ProgramScheduler, ProgramStats};

/// vllm-router's published Progress-TTL defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgressTtlConfig {
    /// Tokens reserved per program for decode (100).
    pub decode_buffer_tokens: usize,
    /// Longest TTL, ns (10 s).
    pub max_acting_ttl_ns: u64,
    /// Gap samples needed before any TTL (100).
    pub stats_window: usize,
    /// A held request's timeout, ns (600 s).
    pub queue_timeout_ns: u64,
    /// Cold-prefill cost: seconds fixed, per kilotoken, per kilotoken²,
    /// and the decode throughput kept while prefilling (their offline fit).
    pub prefill_cost: [f64; 4],
}

impl Default for ProgressTtlConfig {
    fn default() -> Self {
        Self {
            decode_buffer_tokens: 100,
            max_acting_ttl_ns: 10_000_000_000,
            stats_window: 100,
            queue_timeout_ns: 600_000_000_000,
            prefill_cost: [0.066, 0.0570, 0.00441, 0.15],
        }
    }
}

impl ProgressTtlConfig {
    /// Seconds lost if `uncached` tokens must be prefilled again.
    pub fn miss_impact_s(&self, uncached: usize) -> f64 {
        if uncached == 0 {
            return 0.0;
        }
        let [fixed, per_k, per_k2, alpha] = self.prefill_cost;
        let x = uncached as f64 / 1000.0;
        (fixed + per_k * x + per_k2 * x * x) * (2.0 - alpha)
    }

    /// The TTL for a program whose miss would cost `impact_s`, from the
    /// rank's gap samples (seconds); 0 until the window is full.
    pub fn fitted_ttl_s(&self, gaps: &VecDeque<f64>, impact_s: f64) -> f64 {
        if gaps.len() < self.stats_window || impact_s <= 0.0 {
            return 0.0;
        }
        let logs: Vec<f64> = gaps.iter().filter(|g| **g > 0.0).map(|g| g.ln()).collect();
        if logs.is_empty() {
            return 0.0;
        }
        let mu = logs.iter().sum::<f64>() / logs.len() as f64;
        let var = logs.iter().map(|l| (l - mu).powi(2)).sum::<f64>() / logs.len() as f64;
        let sigma = var.sqrt().max(1e-6);
        let max = (self.max_acting_ttl_ns as f64 / 1e9).min(impact_s);
        let min = 0.05f64.min(max);
        let mean = (mu + sigma * sigma / 2.0).exp();
        let utility = |d: f64| {
            if d <= 0.0 {
                return 0.0;
            }
            let hit = normal_cdf((d.ln() - mu) / sigma);
            let partial_mean = mean * normal_cdf((d.ln() - mu - sigma * sigma) / sigma);
            impact_s * hit - partial_mean - d * (1.0 - hit)
        };
        let mut candidates = vec![0.0, min, max];
        candidates
            .extend((0..32).map(|i| (min.ln() + (max.ln() - min.ln()) * i as f64 / 31.0).exp()));
        let (best, value) = candidates.into_iter().map(|d| (d, utility(d))).fold(
            (0.0, f64::NEG_INFINITY),
            |acc, x| if x.1 >= acc.1 { x } else { acc },
        );
        if value < 0.0 {
            0.0
        } else {
            best
        }
    }
}

/// Φ(z) through erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    let signed = if z < 0.0 { -erf } else { erf };
    (0.5 * (1.0 + signed)).clamp(0.0, 1.0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No reservation (new, paused after its TTL, or between turns with TTL 0).
    Idle,
    /// Holds its reservation: a request in flight, or within its TTL until the deadline.
    Active {
        ttl_deadline: Option<u64>,
    },
    Done,
}

#[derive(Debug, Clone, Copy)]
struct Program {
    state: State,
    replica: usize,
    context: usize,
    /// A request is held since this time.
    held_since: Option<u64>,
    /// Arrival order of the held request (FIFO among equals).
    held_seq: u64,
    last_finish: Option<u64>,
}

/// The Progress-TTL scheduler over `replicas` ranks of `capacity` tokens.
#[derive(Debug)]
pub struct ProgressTtl {
    cfg: ProgressTtlConfig,
    capacity: usize,
    shared_prefix: usize,
    programs: Vec<Program>,
    gaps: Vec<VecDeque<f64>>,
    held: usize,
    seq: u64,
    stats: ProgramStats,
}

impl ProgressTtl {
    /// A scheduler for `sessions` programs sharing a `shared_prefix`-token prompt.
    pub fn new(
        cfg: ProgressTtlConfig,
        capacity: usize,
        replicas: usize,
        sessions: usize,
        shared_prefix: usize,
    ) -> Self {
        Self {
            cfg,
            capacity,
            shared_prefix,
            programs: vec![
                Program {
                    state: State::Idle,
                    replica: 0,
                    context: 0,
                    held_since: None,
                    held_seq: 0,
                    last_finish: None,
                };
                sessions
            ],
            gaps: vec![VecDeque::new(); replicas],
            held: 0,
            seq: 0,
            stats: ProgramStats::default(),
        }
    }

    fn reservation(&self, p: &Program) -> usize {
        p.context.saturating_sub(self.shared_prefix) + self.cfg.decode_buffer_tokens
    }

    fn expire_ttls(&mut self, now: u64) {
        for p in &mut self.programs {
            if let State::Active {
                ttl_deadline: Some(t),
            } = p.state
            {
                if t <= now {
                    p.state = State::Idle;
                    self.stats.pauses += 1;
                }
            }
        }
    }
}

impl ProgramScheduler for ProgressTtl {
    fn arrive(
        &mut self,
        s: usize,
        prompt_len: usize,
        routed: usize,
        now: u64,
        _engines: &[EngineView],
    ) -> Option<usize> {
        self.expire_ttls(now);
        let window = self.cfg.stats_window;
        let p = &mut self.programs[s];
        p.replica = routed;
        p.context = prompt_len;
        if let Some(done) = p.last_finish {
            let gaps = &mut self.gaps[routed];
            if gaps.len() == window {
                gaps.pop_front();
            }
            gaps.push_back((now - done) as f64 / 1e9);
        }
        match p.state {
            State::Active { .. } => {
                p.state = State::Active { ttl_deadline: None };
                Some(routed)
            }
            State::Idle => {
                self.seq += 1;
                p.held_since = Some(now);
                p.held_seq = self.seq;
                self.held += 1;
                None
            }
            State::Done => unreachable!("a finished program sends nothing"),
        }
    }

    fn turn_done(&mut self, s: usize, total_tokens: usize, now: u64, last: bool) {
        let p = &mut self.programs[s];
        p.last_finish = Some(now);
        p.context = total_tokens;
        if last {
            p.state = State::Done;
            return;
        }
        let impact = self
            .cfg
            .miss_impact_s(total_tokens.saturating_sub(self.shared_prefix));
        let ttl_s = self.cfg.fitted_ttl_s(&self.gaps[p.replica], impact);
        let p = &mut self.programs[s];
        if ttl_s > 0.0 {
            p.state = State::Active {
                ttl_deadline: Some(now + (ttl_s * 1e9).round() as u64),
            };
        } else {
            p.state = State::Idle;
            self.stats.pauses += 1;
        }
    }

    fn poll(&mut self, now: u64, engines: &[EngineView], out: &mut Vec<(usize, usize)>) {
        self.expire_ttls(now);
        if self.held == 0 {
            return;
        }
        let mut order: Vec<usize> = (0..self.programs.len())
            .filter(|&s| self.programs[s].held_since.is_some())
            .collect();
        let timeout = self.cfg.queue_timeout_ns;
        let key = |s: &usize| {
            let p = &self.programs[*s];
            let forced = p.held_since.is_some_and(|t| now >= t + timeout);
            // Forced first, then the most recently served, new programs last.
            (
                !forced,
                std::cmp::Reverse(p.last_finish.map_or(0, |t| t + 1)),
                p.held_seq,
            )
        };
        order.sort_by_key(key);
        // What each rank's active programs book, kept up to date as programs
        // are let in below (recounting it per held program made a poll
        // quadratic in the programs). A rank books the shared prefix once,
        // with its first active program, so a candidate needs its own
        // reservation beside the active ones' and the prefix either way.
        let mut booked = vec![0usize; engines.len()];
        for p in &self.programs {
            if matches!(p.state, State::Active { .. }) {
                booked[p.replica] += self.reservation(p);
            }
        }
        for s in order {
            let p = self.programs[s];
            let forced = p.held_since.is_some_and(|t| now >= t + timeout);
            let r = p.replica;
            let fits = booked[r] + self.shared_prefix + self.reservation(&p) <= self.capacity;
            let may_go = fits && engines[r].waiting == 0;
            if !(forced || may_go) {
                continue;
            }
            if forced {
                self.stats.forced += 1;
            }
            booked[r] += self.reservation(&p);
            let p = &mut self.programs[s];
            p.held_since = None;
            p.state = State::Active { ttl_deadline: None };
            self.held -= 1;
            self.stats.held += 1;
            out.push((s, r));
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        let timeouts = self
            .programs
            .iter()
            .filter_map(|p| p.held_since.map(|t| t + self.cfg.queue_timeout_ns));
        let ttls = self.programs.iter().filter_map(|p| match p.state {
            State::Active { ttl_deadline } => ttl_deadline,
            _ => None,
        });
        timeouts.chain(ttls).min()
    }

    fn stats(&self) -> ProgramStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn the_cold_prefill_model_and_the_ttl_fit() {
        let c = ProgressTtlConfig::default();
        // 10k uncached tokens: (0.066 + 0.57 + 0.441) x 1.85 s.
        assert!((c.miss_impact_s(10_000) - 1.077 * 1.85).abs() < 1e-9);
        let mut gaps: VecDeque<f64> = (0..99).map(|_| 0.5).collect();
        assert_eq!(c.fitted_ttl_s(&gaps, 5.0), 0.0, "cold until 100 samples");
        gaps.push_back(0.5);
        // Every gap is 0.5 s: any TTL above it catches every return, and
        // ties go to the longest candidate, min(10 s, the miss cost).
        let d = c.fitted_ttl_s(&gaps, 5.0);
        assert!((d - 5.0).abs() < 1e-9, "{d}");
        // Spread-out gaps: a TTL short of the cap.
        let spread: VecDeque<f64> = (0..100).map(|i| 0.1 * 1.05f64.powi(i)).collect();
        let d = c.fitted_ttl_s(&spread, 5.0);
        assert!(d > 0.1 && d < 5.0, "{d}");
        // A miss that costs less than waiting is not worth holding for.
        let long: VecDeque<f64> = (0..100).map(|_| 30.0).collect();
        assert_eq!(c.fitted_ttl_s(&long, 2.0), 0.0);
    }

    #[test]
    fn held_until_the_rank_has_room_and_an_empty_waiting_queue() {
        let cfg = ProgressTtlConfig::default();
        let mut p = ProgressTtl::new(cfg, 1000, 1, 3, 100);
        let idle = [EngineView {
            waiting: 0,
            ..EngineView::default()
        }];
        let busy = [EngineView {
            waiting: 2,
            ..EngineView::default()
        }];
        let mut out = Vec::new();
        assert_eq!(p.arrive(0, 500, 0, 0, &idle), None);
        p.poll(0, &busy, &mut out);
        assert!(out.is_empty(), "vLLM's waiting queue is not empty");
        p.poll(0, &idle, &mut out);
        assert_eq!(out, vec![(0, 0)]);
        // Booked: 100 shared + 400 + 100 = 600. A 500-token program needs
        // 500 more (no room); a 300-token one 300 (room): no head-of-line block.
        assert_eq!(p.arrive(1, 500, 0, 0, &idle), None);
        assert_eq!(p.arrive(2, 300, 0, 0, &idle), None);
        out.clear();
        p.poll(0, &idle, &mut out);
        assert_eq!(out, vec![(2, 0)]);
        // After 600 s the held request goes anyway.
        out.clear();
        p.poll(600 * S, &idle, &mut out);
        assert_eq!(out, vec![(1, 0)]);
        assert_eq!(p.stats().forced, 1);
    }

    #[test]
    fn a_program_keeps_its_reservation_for_its_ttl() {
        let cfg = ProgressTtlConfig::default();
        let mut p = ProgressTtl::new(cfg, 100_000, 1, 2, 0);
        p.gaps[0] = (0..100).map(|_| 0.5).collect();
        let idle = [EngineView::default()];
        let mut out = Vec::new();
        assert_eq!(p.arrive(0, 10_000, 0, 0, &idle), None);
        p.poll(0, &idle, &mut out);
        p.turn_done(0, 10_050, S, false);
        let Some(deadline) = p.next_deadline() else {
            panic!("a TTL is armed")
        };
        // TTL = min(10 s, the cost of re-prefilling 10,050 tokens ≈ 2.0 s).
        let impact = cfg.miss_impact_s(10_050);
        assert_eq!(deadline, S + (impact * 1e9).round() as u64);
        // Back within the TTL: straight through.
        assert_eq!(p.arrive(0, 10_300, 0, S + S / 2, &idle), Some(0));
        p.turn_done(0, 10_350, 2 * S, false);
        // Back after it: held again.
        p.poll(5 * S, &idle, &mut out);
        assert_eq!(p.arrive(0, 10_600, 0, 5 * S, &idle), None);
        assert_eq!(p.stats().pauses, 1);
    }
}
