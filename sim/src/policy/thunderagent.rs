//! ThunderAgent (Kang et al., arXiv 2602.13692; ThunderAgent-org/ThunderAgent,
//! `scheduler/router.py`), re-implemented from its published rules:
//!
//! - A ledger of every program's tokens per engine: after a response, the
//!   response's `usage.total_tokens`; when a request is sent, the request's
//!   estimated size (here: its prompt). Each program also books a buffer of
//!   100 tokens. Capacity C = `block_size × num_gpu_blocks` (from vLLM's
//!   `cache_config_info`). Shared prefixes are not credited.
//! - A program is *reasoning* while a request is in flight or held, *acting*
//!   while its tool runs; *active* (on the ledger) or *paused*.
//! - A new program goes at once only if nothing waits in the global paused
//!   pool and an engine has room for it (the one with the fewest active
//!   tokens); otherwise it joins the pool.
//! - Every 5 s: first resume from the pool — held reasoning programs, then
//!   new ones, then acting ones, each group smallest first, as many as fit
//!   the engines' total room, placed largest first on the engine with the
//!   most room (best-fit decreasing; a program may change engine); then, on
//!   every engine over capacity, pause acting programs smallest first, and
//!   when none is left mark reasoning ones smallest first, to be paused when
//!   their turn completes (decode is never interrupted).
//! - A request held 1800 s is resumed regardless of capacity.
//!
//! Not modelled: the character-to-token estimate (the simulator knows the
//! prompt length exactly), metrics staleness, weight-sync pauses.

use super::program::{EngineView, ProgramScheduler, ProgramStats};

/// ThunderAgent's published defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThunderAgentConfig {
    /// Scheduler period, ns (5 s).
    pub interval_ns: u64,
    /// Tokens booked per program on top of its own (100).
    pub buffer_tokens: usize,
    /// A held request is resumed regardless of capacity after this, ns (1800 s).
    pub force_resume_ns: u64,
}

impl Default for ThunderAgentConfig {
    fn default() -> Self {
        Self {
            interval_ns: 5_000_000_000,
            buffer_tokens: 100,
            force_resume_ns: 1_800_000_000_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Never seen a request.
    Fresh,
    /// On an engine's ledger.
    Active(usize),
    /// In the global pool; `None` for a new program never placed.
    Paused(Option<usize>),
    /// Released.
    Done,
}

#[derive(Debug, Clone, Copy)]
struct Program {
    place: Place,
    /// A request is in flight or held (reasoning), else acting.
    reasoning: bool,
    /// A request waits for the program to be resumed; the force deadline.
    held_until: Option<u64>,
    tokens: usize,
    steps: usize,
    marked: bool,
}

impl Program {
    /// A program not yet placed: how every one starts, and how one on a
    /// lost engine starts again.
    const FRESH: Self = Self {
        place: Place::Fresh,
        reasoning: false,
        held_until: None,
        tokens: 0,
        steps: 0,
        marked: false,
    };
}

/// The ThunderAgent scheduler over engines of `capacities[r]` tokens each.
#[derive(Debug)]
pub struct ThunderAgent {
    cfg: ThunderAgentConfig,
    capacities: Vec<usize>,
    replicas: usize,
    programs: Vec<Program>,
    /// The global paused pool, in pause order.
    pool: Vec<usize>,
    next_tick: u64,
    released: Vec<(usize, usize)>,
    stats: ProgramStats,
}

impl ThunderAgent {
    /// A scheduler for `sessions` programs.
    pub fn new(cfg: ThunderAgentConfig, capacities: Vec<usize>, sessions: usize) -> Self {
        assert!(!capacities.is_empty(), "at least one engine");
        Self {
            cfg,
            replicas: capacities.len(),
            capacities,
            programs: vec![Program::FRESH; sessions],
            pool: Vec::new(),
            next_tick: cfg.interval_ns,
            released: Vec::new(),
            stats: ProgramStats::default(),
        }
    }

    fn booked(&self, p: &Program) -> i64 {
        (p.tokens + self.cfg.buffer_tokens) as i64
    }

    /// Room left on engine `r`, counting marked programs as already gone.
    fn remaining(&self, r: usize) -> i64 {
        let mut used = 0i64;
        for p in &self.programs {
            if p.place == Place::Active(r) && !p.marked {
                used += self.booked(p);
            }
        }
        self.capacities[r] as i64 - used
    }

    fn active_tokens(&self, r: usize) -> i64 {
        self.programs
            .iter()
            .filter(|p| p.place == Place::Active(r))
            .map(|p| p.tokens as i64)
            .sum()
    }

    fn pause(&mut self, s: usize) {
        let Place::Active(r) = self.programs[s].place else {
            return;
        };
        let p = &mut self.programs[s];
        p.place = Place::Paused(Some(r));
        p.marked = false;
        self.pool.push(s);
        self.stats.pauses += 1;
    }

    /// Puts a paused program back on engine `r`; its held request goes.
    fn resume(&mut self, s: usize, r: usize) {
        self.pool.retain(|&q| q != s);
        let p = &mut self.programs[s];
        p.place = Place::Active(r);
        if p.held_until.take().is_some() {
            self.released.push((s, r));
        }
    }

    fn least_loaded(&self) -> usize {
        (0..self.replicas)
            .filter(|&r| self.capacities[r] > 0)
            .min_by_key(|&r| (self.active_tokens(r), r))
            .expect("at least one replica")
    }

    /// The 5-second check: resume what fits, then pause what overflows.
    fn tick(&mut self) {
        self.greedy_resume();
        for r in 0..self.replicas {
            self.pause_until_safe(r);
        }
    }

    fn greedy_resume(&mut self) {
        let buffer = self.cfg.buffer_tokens as i64;
        let mut room: Vec<(usize, i64)> = (0..self.replicas)
            .map(|r| (r, self.remaining(r)))
            .filter(|&(_, left)| left > buffer)
            .collect();
        let total: i64 = room.iter().map(|&(_, left)| left).sum();
        if room.is_empty() || self.pool.is_empty() {
            return;
        }
        // Priority groups, each smallest first.
        let group = |p: &Program| match (p.steps, p.reasoning) {
            (1, _) => 1,
            (_, true) => 0,
            _ => 2,
        };
        let mut order = self.pool.clone();
        order.sort_by_key(|&s| (group(&self.programs[s]), self.programs[s].tokens));
        let mut chosen = Vec::new();
        let mut cumulative = 0i64;
        for s in order {
            let need = self.booked(&self.programs[s]);
            if cumulative + need <= total {
                chosen.push(s);
                cumulative += need;
            }
        }
        // Best-fit decreasing: the largest on the engine with the most room.
        chosen.sort_by_key(|&s| std::cmp::Reverse(self.programs[s].tokens));
        for s in chosen {
            room.sort_by_key(|&(r, left)| (std::cmp::Reverse(left), r));
            let Some(&(r, left)) = room.first() else {
                break;
            };
            let need = self.booked(&self.programs[s]);
            if need > left {
                continue;
            }
            self.resume(s, r);
            room[0].1 -= need;
            if room[0].1 <= buffer {
                room.remove(0);
            }
        }
    }

    fn pause_until_safe(&mut self, r: usize) {
        while self.remaining(r) < 0 {
            let on_r = |p: &Program| p.place == Place::Active(r) && !p.marked;
            let smallest = |reasoning: bool| {
                (0..self.programs.len())
                    .filter(|&s| on_r(&self.programs[s]) && self.programs[s].reasoning == reasoning)
                    .min_by_key(|&s| (self.programs[s].tokens, s))
            };
            if let Some(s) = smallest(false) {
                self.pause(s);
            } else if let Some(s) = smallest(true) {
                self.programs[s].marked = true;
            } else {
                break;
            }
        }
    }
}

impl ProgramScheduler for ThunderAgent {
    fn arrive(
        &mut self,
        s: usize,
        prompt_len: usize,
        _routed: usize,
        now: u64,
        _engines: &[EngineView],
    ) -> Option<usize> {
        let p = &mut self.programs[s];
        p.steps += 1;
        p.tokens = prompt_len;
        p.reasoning = true;
        match p.place {
            Place::Active(r) => Some(r),
            Place::Paused(_) => {
                p.held_until = Some(now + self.cfg.force_resume_ns);
                self.stats.held += 1;
                None
            }
            Place::Fresh => {
                let need = prompt_len as i64 + self.cfg.buffer_tokens as i64;
                let target = if self.pool.is_empty() {
                    (0..self.replicas)
                        .filter(|&r| self.remaining(r) >= need)
                        .min_by_key(|&r| (self.active_tokens(r), r))
                } else {
                    None
                };
                let p = &mut self.programs[s];
                match target {
                    Some(r) => {
                        p.place = Place::Active(r);
                        Some(r)
                    }
                    None => {
                        p.place = Place::Paused(None);
                        p.held_until = Some(now + self.cfg.force_resume_ns);
                        self.pool.push(s);
                        self.stats.held += 1;
                        None
                    }
                }
            }
            Place::Done => unreachable!("a finished program sends nothing"),
        }
    }

    fn turn_done(&mut self, s: usize, total_tokens: usize, _now: u64, last: bool) {
        let p = &mut self.programs[s];
        p.reasoning = false;
        p.tokens = total_tokens;
        if last {
            p.place = Place::Done;
            p.marked = false;
            self.pool.retain(|&q| q != s);
        } else if p.marked {
            self.pause(s);
        }
    }

    fn poll(&mut self, now: u64, _engines: &[EngineView], out: &mut Vec<(usize, usize)>) {
        // Requests held past the bound are resumed regardless of capacity.
        let overdue: Vec<usize> = self
            .pool
            .iter()
            .copied()
            .filter(|&s| self.programs[s].held_until.is_some_and(|t| t <= now))
            .collect();
        for s in overdue {
            let r = match self.programs[s].place {
                Place::Paused(Some(r)) => r,
                _ => self.least_loaded(),
            };
            self.stats.forced += 1;
            self.resume(s, r);
        }
        while now >= self.next_tick {
            self.next_tick += self.cfg.interval_ns;
            self.tick();
        }
        out.append(&mut self.released);
    }

    fn next_deadline(&self) -> Option<u64> {
        let live = self.programs.iter().any(|p| p.place != Place::Done);
        let forced = self
            .pool
            .iter()
            .filter_map(|&s| self.programs[s].held_until)
            .min();
        live.then_some(self.next_tick)
            .into_iter()
            .chain(forced)
            .min()
    }

    fn stats(&self) -> ProgramStats {
        self.stats
    }

    /// The engine leaves the ledger (no room: nothing is placed there) and
    /// its active programs start over as new ones: their next request is
    /// placed, or pooled, as a first one is. Paused programs stay in the
    /// pool and resume wherever there is room.
    fn lose_replica(&mut self, replica: usize) -> Result<(), String> {
        self.capacities[replica] = 0;
        for p in &mut self.programs {
            if p.place == Place::Active(replica) {
                *p = Program::FRESH;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn engines() -> [EngineView; 1] {
        [EngineView::default()]
    }

    #[test]
    fn new_programs_go_while_they_fit_then_wait_for_the_tick() {
        let mut t = ThunderAgent::new(ThunderAgentConfig::default(), vec![1000], 3);
        assert_eq!(t.arrive(0, 400, 0, 0, &engines()), Some(0));
        assert_eq!(t.arrive(1, 450, 0, 0, &engines()), None, "500 + 550 > 1000");
        // Once one waits, even a small new program queues behind it.
        assert_eq!(t.arrive(2, 10, 0, 0, &engines()), None);
        t.turn_done(0, 450, S, true);
        let mut out = Vec::new();
        t.poll(S, &engines(), &mut out);
        assert!(out.is_empty(), "resumes happen at the 5 s tick");
        t.poll(5 * S, &engines(), &mut out);
        // Both fit (550 + 110), placed largest first.
        assert_eq!(out, vec![(1, 0), (2, 0)]);
    }

    #[test]
    fn over_capacity_pauses_acting_smallest_first_and_marks_reasoning() {
        let mut t = ThunderAgent::new(ThunderAgentConfig::default(), vec![1000], 3);
        for s in 0..3 {
            assert!(t.arrive(s, 100, 0, 0, &engines()).is_some());
        }
        // Responses grow the ledger past capacity: 300 + 200 + 400 + 3 x 100.
        t.turn_done(0, 300, S, false);
        t.turn_done(1, 200, S, false);
        t.programs[2].tokens = 400; // still reasoning, with a longer context
        let mut out = Vec::new();
        t.poll(5 * S, &engines(), &mut out);
        // 1200 > 1000: the smallest acting program (1) is paused: 900 fits.
        assert_eq!(t.programs[1].place, Place::Paused(Some(0)));
        assert_eq!(t.programs[0].place, Place::Active(0));
        assert!(!t.programs[2].marked);
        // Its next turn is held until resumed.
        assert_eq!(t.arrive(1, 250, 0, 6 * S, &engines()), None);
        assert_eq!(t.stats().pauses, 1);
    }

    #[test]
    fn a_held_request_is_forced_after_1800_s() {
        let mut t = ThunderAgent::new(ThunderAgentConfig::default(), vec![1000], 2);
        assert!(t.arrive(0, 850, 0, 0, &engines()).is_some());
        assert_eq!(t.arrive(1, 850, 0, 0, &engines()), None);
        let mut out = Vec::new();
        t.poll(1799 * S, &engines(), &mut out);
        assert!(out.is_empty());
        assert_eq!(t.next_deadline(), Some(1800 * S));
        t.poll(1800 * S, &engines(), &mut out);
        assert_eq!(out, vec![(1, 0)]);
        assert_eq!(t.stats().forced, 1);
    }
}
