//! The control law of prime-rl's cost-model controller (`ConcurrencyController`
//! in `src/prime_rl/orchestrator/concurrency.py` at commit 014aa9d), as a
//! pure state machine: it reads no clock and admits nothing; the
//! dispatcher ([`super::PrimeRlCg`]) feeds it and applies its cap.
//!
//! `n_max = clamp(κ · C / G, floor, max_inflight)`:
//!
//! - `C`: the decode engines' KV capacity, tokens (`num_gpu_blocks ×
//!   block_size`, GPU only), known from the first metrics poll on.
//! - `G`: per environment, an EWMA (α = 0.1) of completed episodes' final
//!   context tokens and of their durations; mixed over the environments with
//!   weights `ratio × duration` (a long-episode environment is
//!   over-represented in flight). An environment with no completion yet
//!   costs the bootstrap (`seq_len`) and weighs as if its episodes took 1 s.
//! - `κ`: unset through the warm-up step (the cap follows `C / G` at every
//!   poll while it is); at the first step `max(1, n_max · G / C)`; then
//!   ×1.02 per step (at most 16) when every poll since the last step was
//!   clear and the cap binds (`inflight ≥ 0.9 · n_max`).
//! - A poll is HARD when any engine's preemption counter rose, SOFT when an
//!   engine had waiting requests at this poll and the last, CLEAR otherwise.
//!   HARD cuts at once, whatever the step: `n_max ← clamp(b ·
//!   max(inflight, floor))` with `b` = 0.75, and `κ` re-derived from it (at
//!   least 0.25); no further cut until the episodes in flight are back
//!   under the cap; `b` becomes 0.5 until a step whose polls were all clear.
//! - `clamp` floors at the group size and truncates to an integer.

/// EWMA smoothing of the per-environment estimates.
const ESTIMATE_ALPHA: f64 = 0.1;
/// The first cut keeps this fraction of the episodes in flight...
const BACKOFF_FACTOR: f64 = 0.75;
/// ...and later cuts, until a step whose polls were all clear, this one.
const ESCALATED_BACKOFF_FACTOR: f64 = 0.5;
/// κ's growth per step while clear and binding.
const GROWTH_FACTOR: f64 = 1.02;
/// The cap binds when the episodes in flight reach this fraction of it.
const BINDING_FRACTION: f64 = 0.9;
/// Bounds of κ.
const KAPPA_MIN: f64 = 0.25;
const KAPPA_MAX: f64 = 16.0;

/// What one engine's `/metrics` poll tells the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadSample {
    /// `num_requests_waiting`.
    pub waiting: usize,
    /// Preemptions since the last poll (0 at the first: no baseline).
    pub preemptions_delta: u64,
}

/// The worst engine's state at one poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Nothing waits twice in a row, nothing was preempted.
    Clear,
    /// Requests waited at two polls in a row: saturated, hold.
    Soft,
    /// An engine preempted: thrash now.
    Hard,
}

/// One environment's EWMAs over its completed episodes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Estimate {
    tokens: Option<f64>,
    duration_s: Option<f64>,
}

impl Estimate {
    fn update(&mut self, tokens: f64, duration_s: f64) {
        let ewma = |old: Option<f64>, x: f64| match old {
            None => x,
            Some(v) => (1.0 - ESTIMATE_ALPHA) * v + ESTIMATE_ALPHA * x,
        };
        self.tokens = Some(ewma(self.tokens, tokens));
        self.duration_s = Some(ewma(self.duration_s, duration_s));
    }
}

/// The controller's state.
#[derive(Debug, Clone)]
pub struct Controller {
    floor: usize,
    ceiling: Option<usize>,
    bootstrap_cost: f64,
    user_start: bool,
    /// Each environment's sampling ratio.
    ratios: Vec<f64>,
    estimates: Vec<Estimate>,
    /// Total KV tokens of the engines; `None` before the first poll.
    capacity: Option<f64>,
    max_inflight: usize,
    kappa: Option<f64>,
    /// Through the warm-up step: no growth, the cap follows `C / G`.
    frozen: bool,
    all_clear_since_step: bool,
    prev_waiting: Vec<usize>,
    draining: bool,
    backoff: f64,
    signal: Signal,
    cuts: u64,
}

impl Controller {
    /// A controller for environments sampled at `ratios`, groups of at
    /// most `floor` episodes, a bootstrap cost of `bootstrap_cost` tokens,
    /// an optional ceiling and an optional user-set start.
    pub fn new(
        ratios: Vec<f64>,
        floor: usize,
        bootstrap_cost: usize,
        ceiling: Option<usize>,
        initial: Option<usize>,
    ) -> Self {
        let floor = floor.max(1);
        Self {
            floor,
            ceiling,
            bootstrap_cost: bootstrap_cost as f64,
            user_start: initial.is_some(),
            estimates: vec![Estimate::default(); ratios.len()],
            ratios,
            capacity: None,
            max_inflight: initial.unwrap_or(floor),
            kappa: None,
            frozen: true,
            all_clear_since_step: true,
            prev_waiting: Vec::new(),
            draining: false,
            backoff: BACKOFF_FACTOR,
            signal: Signal::Clear,
            cuts: 0,
        }
    }

    /// The cap now.
    pub fn max_inflight(&self) -> usize {
        self.max_inflight
    }

    /// κ, once set.
    pub fn kappa(&self) -> Option<f64> {
        self.kappa
    }

    /// The last poll's signal.
    pub fn signal(&self) -> Signal {
        self.signal
    }

    /// Overload cuts so far.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// A completed episode of environment `env`: its final context tokens
    /// and its duration from admission. Episodes without either carry no
    /// cost information.
    pub fn record_episode(&mut self, env: usize, tokens: usize, duration_s: f64) {
        if tokens == 0 || duration_s <= 0.0 {
            return;
        }
        self.estimates[env].update(tokens as f64, duration_s);
    }

    /// One metrics poll of every engine (`capacity`: their KV tokens),
    /// with `inflight` episodes holding permits. May cut at once.
    pub fn observe(&mut self, samples: &[LoadSample], capacity: usize, inflight: usize) {
        if samples.is_empty() {
            return;
        }
        if capacity > 0 {
            self.capacity = Some(capacity as f64);
        }
        let mut worst = Signal::Clear;
        for (e, s) in samples.iter().enumerate() {
            if s.preemptions_delta > 0 {
                worst = Signal::Hard;
                break;
            }
            if s.waiting > 0 && self.prev_waiting.get(e).copied().unwrap_or(0) > 0 {
                worst = Signal::Soft;
            }
        }
        self.prev_waiting = samples.iter().map(|s| s.waiting).collect();
        self.signal = worst;
        if worst != Signal::Clear {
            self.all_clear_since_step = false;
        }
        if self.draining && inflight <= self.max_inflight {
            self.draining = false;
        }
        if worst == Signal::Hard && !self.draining {
            self.cut(inflight);
            return;
        }
        // Through the warm-up step the cap follows C / G: the bootstrap
        // cost until an episode completes, the estimates after.
        if self.frozen && self.kappa.is_none() && !self.user_start {
            if let Some(c) = self.capacity {
                self.max_inflight = self.clamp(c / self.cost_estimate());
            }
        }
    }

    /// A training step shipped with `inflight` episodes in flight: the
    /// warm-up ends (κ set) or κ grows at most once; the cap is re-priced.
    pub fn on_step(&mut self, inflight: usize) {
        let Some(capacity) = self.capacity else {
            self.all_clear_since_step = true;
            return;
        };
        let cost = self.cost_estimate();
        if self.frozen {
            self.frozen = false;
            if self.kappa.is_none() {
                // A start that over-commits is kept; otherwise κ = 1: the
                // cost estimates of everything in flight fit C.
                self.kappa = Some((self.max_inflight as f64 * cost / capacity).max(1.0));
            }
        } else if let Some(k) = self.kappa {
            if self.all_clear_since_step {
                self.backoff = BACKOFF_FACTOR;
                if inflight as f64 >= BINDING_FRACTION * self.max_inflight as f64 {
                    self.kappa = Some((k * GROWTH_FACTOR).min(KAPPA_MAX));
                }
            }
        }
        let kappa = self.kappa.expect("set above");
        self.max_inflight = self.clamp(kappa * capacity / cost);
        self.all_clear_since_step = true;
    }

    /// A multiplicative cut relative to what runs; cuts wait for the drain.
    fn cut(&mut self, inflight: usize) {
        let target = self.clamp(self.backoff * inflight.max(self.floor) as f64);
        if let Some(c) = self.capacity {
            self.kappa = Some((target as f64 * self.cost_estimate() / c).max(KAPPA_MIN));
        }
        self.draining = true;
        self.backoff = ESCALATED_BACKOFF_FACTOR;
        self.max_inflight = target;
        self.cuts += 1;
    }

    fn clamp(&self, n: f64) -> usize {
        let ceiling = self.ceiling.map_or(f64::INFINITY, |c| c as f64);
        // Python's int(): truncation, after the floor.
        n.max(self.floor as f64).min(ceiling) as usize
    }

    /// `G`, tokens: the duration-weighted cost mix over the environments.
    pub fn cost_estimate(&self) -> f64 {
        let (mut cost, mut weight) = (0.0, 0.0);
        for (ratio, e) in self.ratios.iter().zip(&self.estimates) {
            let tokens = e.tokens.unwrap_or(self.bootstrap_cost);
            let duration = e.duration_s.unwrap_or(1.0);
            cost += ratio * duration * tokens;
            weight += ratio * duration;
        }
        if weight > 0.0 {
            cost / weight
        } else {
            self.bootstrap_cost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clear(engines: usize) -> Vec<LoadSample> {
        vec![LoadSample::default(); engines]
    }

    fn preempted() -> [LoadSample; 1] {
        [LoadSample {
            waiting: 0,
            preemptions_delta: 3,
        }]
    }

    #[test]
    fn before_any_completion_the_cap_is_capacity_over_the_bootstrap() {
        // An H100's 467,280 tokens over a 131,072-token seq_len: 3.56, so
        // 3; a group of 8 floors it.
        let mut c = Controller::new(vec![1.0], 1, 131_072, None, None);
        assert_eq!(c.max_inflight(), 1, "the floor before the first poll");
        c.observe(&clear(1), 467_280, 0);
        assert_eq!(c.max_inflight(), 3);
        let mut g = Controller::new(vec![1.0], 8, 131_072, None, None);
        g.observe(&clear(1), 467_280, 0);
        assert_eq!(g.max_inflight(), 8);
        // A user-set start is held through the warm-up.
        let mut u = Controller::new(vec![1.0], 1, 131_072, None, Some(40));
        u.observe(&clear(1), 467_280, 0);
        assert_eq!(u.max_inflight(), 40);
    }

    #[test]
    fn the_warm_up_follows_c_over_g_and_its_step_sets_kappa_to_one() {
        let mut c = Controller::new(vec![1.0], 1, 131_072, None, None);
        c.observe(&clear(1), 400_000, 0);
        // Finals of 40k then 60k tokens: EWMA 40k, then 0.9·40k + 0.1·60k = 42k.
        c.record_episode(0, 40_000, 100.0);
        assert_eq!(c.cost_estimate(), 40_000.0);
        c.record_episode(0, 60_000, 100.0);
        assert!((c.cost_estimate() - 42_000.0).abs() < 1e-9);
        // Errored episodes (no tokens or no time) teach nothing.
        c.record_episode(0, 0, 100.0);
        c.record_episode(0, 90_000, 0.0);
        assert!((c.cost_estimate() - 42_000.0).abs() < 1e-9);
        // The next poll re-prices the warm-up cap: 400k / 42k = 9.52 -> 9.
        c.observe(&clear(1), 400_000, 3);
        assert_eq!(c.max_inflight(), 9);
        assert_eq!(c.kappa(), None);
        // The warm-up step: κ = max(1, 9 · 42k / 400k = 0.945) = 1.
        c.on_step(9);
        assert_eq!(c.kappa(), Some(1.0));
        assert_eq!(c.max_inflight(), 9);
        // Polls no longer move the cap; steps do, with the new estimate.
        for _ in 0..10 {
            c.record_episode(0, 20_000, 100.0);
        }
        c.observe(&clear(1), 400_000, 9);
        assert_eq!(c.max_inflight(), 9);
        let g = c.cost_estimate();
        c.on_step(9);
        // Clear and binding (9 >= 0.9 x 9): κ 1.02.
        assert_eq!(c.kappa(), Some(1.02));
        assert_eq!(c.max_inflight(), (1.02 * 400_000.0 / g) as usize);
    }

    #[test]
    fn an_over_committing_start_is_kept_at_the_warm_up_step() {
        let mut c = Controller::new(vec![1.0], 1, 131_072, None, Some(30));
        c.observe(&clear(1), 400_000, 30);
        c.record_episode(0, 20_000, 10.0);
        c.on_step(30);
        // 30 · 20k / 400k = 1.5 > 1: κ keeps the user's over-commit.
        assert_eq!(c.kappa(), Some(1.5));
        assert_eq!(c.max_inflight(), 30);
    }

    #[test]
    fn kappa_grows_only_after_an_all_clear_step_with_a_binding_cap() {
        let mut c = Controller::new(vec![1.0], 1, 10_000, None, None);
        c.observe(&clear(1), 100_000, 0);
        c.on_step(0);
        assert_eq!((c.kappa(), c.max_inflight()), (Some(1.0), 10));
        // Not binding: 8 < 0.9 x 10.
        c.on_step(8);
        assert_eq!(c.kappa(), Some(1.0));
        // Waiting at two polls in a row: SOFT, no growth at the next step.
        let waiting = [LoadSample {
            waiting: 2,
            preemptions_delta: 0,
        }];
        c.observe(&waiting, 100_000, 10);
        assert_eq!(c.signal(), Signal::Clear, "one poll of waiting is clear");
        c.observe(&waiting, 100_000, 10);
        assert_eq!(c.signal(), Signal::Soft);
        c.on_step(10);
        assert_eq!(c.kappa(), Some(1.0));
        // A clear step with the cap binding grows κ by 2%.
        c.observe(&clear(1), 100_000, 10);
        c.on_step(9);
        assert_eq!(c.kappa(), Some(1.02));
        assert_eq!(c.max_inflight(), 10, "10.2 truncates to 10");
    }

    #[test]
    fn preemptions_cut_to_three_quarters_then_half_until_a_clear_step() {
        let mut c = Controller::new(vec![1.0], 4, 10_000, None, None);
        c.observe(&clear(1), 400_000, 0);
        c.on_step(0);
        assert_eq!(c.max_inflight(), 40);
        // Preempted with 40 in flight: 0.75 x 40 = 30, κ = 30 x 10k / 400k.
        c.observe(&preempted(), 400_000, 40);
        assert_eq!(c.max_inflight(), 30);
        assert_eq!(c.kappa(), Some(0.75));
        assert_eq!(c.cuts(), 1);
        // Still draining (40 > 30): a stale preemption cuts nothing.
        c.observe(&preempted(), 400_000, 40);
        assert_eq!((c.max_inflight(), c.cuts()), (30, 1));
        // Drained, and preempted again before a clear step: x 0.5.
        c.observe(&preempted(), 400_000, 30);
        assert_eq!(c.max_inflight(), 15);
        assert_eq!(c.kappa(), Some(0.375));
        // The step after the cut was not all clear: no reset, no growth;
        // the cap is re-priced from κ.
        c.on_step(15);
        assert_eq!((c.kappa(), c.max_inflight()), (Some(0.375), 15));
        // A clear step resets the backoff to 0.75.
        c.observe(&clear(1), 400_000, 10);
        c.on_step(10);
        c.observe(&preempted(), 400_000, 15);
        assert_eq!(c.max_inflight(), 11, "0.75 x 15 = 11.25");
        // The floor bounds a cut, and κ never goes under 0.25.
        let mut f = Controller::new(vec![1.0], 16, 10_000, None, None);
        f.observe(&clear(1), 400_000, 0);
        f.observe(&preempted(), 400_000, 2);
        assert_eq!(f.max_inflight(), 16);
        assert_eq!(f.kappa(), Some(0.4));
        let mut k = Controller::new(vec![1.0], 1, 1_000, None, None);
        k.observe(&clear(1), 400_000, 0);
        k.observe(&preempted(), 400_000, 4);
        assert_eq!((k.max_inflight(), k.kappa()), (3, Some(0.25)));
    }

    #[test]
    fn the_cost_mix_weighs_each_environment_by_ratio_and_duration() {
        let mut c = Controller::new(vec![0.5, 0.5], 1, 100_000, None, None);
        // Neither completed: the bootstrap.
        assert_eq!(c.cost_estimate(), 100_000.0);
        // One did, in 9 s; the other still weighs as 1 s of the bootstrap.
        c.record_episode(0, 10_000, 9.0);
        assert!((c.cost_estimate() - (9.0 * 10_000.0 + 100_000.0) / 10.0).abs() < 1e-9);
        // Both: 30 s episodes of 60k, 10 s episodes of 10k: long ones weigh 3x.
        let mut d = Controller::new(vec![0.5, 0.5], 1, 100_000, None, None);
        d.record_episode(0, 10_000, 10.0);
        d.record_episode(1, 60_000, 30.0);
        assert!((d.cost_estimate() - (10.0 * 10_000.0 + 30.0 * 60_000.0) / 40.0).abs() < 1e-9);
        // A ceiling bounds the cap.
        let mut m = Controller::new(vec![1.0], 1, 1_000, Some(64), None);
        m.observe(&clear(1), 400_000, 0);
        assert_eq!(m.max_inflight(), 64);
    }
}
