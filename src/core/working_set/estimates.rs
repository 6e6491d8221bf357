//! What the working set expects of a turn before it runs: its output, how
//! much its prompt grows, and how long a session's cycle (a turn and a
//! tool call) lasts. Each is a running mean of what turns reported.

use super::lifecycle::History;
use super::tuning::{RUNNING_MEAN_WEIGHT, SESSION_GROWTH_WEIGHT, SHORTEST_GAP_NS};

/// A running mean over every session, seeded by its first sample.
pub(super) fn running_mean(mean: f64, sample: f64) -> f64 {
    if mean == 0.0 {
        sample
    } else {
        (1.0 - RUNNING_MEAN_WEIGHT) * mean + RUNNING_MEAN_WEIGHT * sample
    }
}

/// The working set's means, for sessions that have not shown their own.
#[derive(Debug, Default)]
pub(super) struct Means {
    pub(super) output: f64,
    /// Growth per turn beyond the last output (the tool results), tokens.
    pub(super) growth: f64,
    /// A turn's time, admission to release, ns.
    turn_ns: f64,
    /// The log of a tool gap's time (release to the next request): tool
    /// times are heavy-tailed, and an arithmetic mean is led by the few
    /// sessions in long calls, which are not among those competing for
    /// room.
    ln_gap: f64,
}

impl Means {
    pub(super) fn turn_took(&mut self, ns: u64) {
        self.turn_ns = running_mean(self.turn_ns, ns as f64);
    }

    pub(super) fn gap_took(&mut self, ns: u64) {
        self.ln_gap = running_mean(self.ln_gap, (ns.max(SHORTEST_GAP_NS) as f64).ln());
    }

    pub(super) fn output_was(&mut self, tokens: u64) {
        self.output = running_mean(self.output, tokens as f64);
    }

    /// A hot turn's mean time, ns (0 while none has ended).
    pub(super) fn turn_ns(&self) -> f64 {
        self.turn_ns
    }

    /// A hot session's cycle, ns: its turn and its tool gap (0 while no
    /// turn has ended).
    pub(super) fn cycle_ns(&self) -> f64 {
        let gap = if self.ln_gap == 0.0 {
            0.0
        } else {
            self.ln_gap.exp()
        };
        self.turn_ns + gap
    }

    /// How many turns a session runs in `window_ns`: at least 1, and 1
    /// while the cycle is unknown.
    pub(super) fn turns_in(&self, window_ns: u64) -> u32 {
        let cycle = self.cycle_ns();
        if cycle <= 0.0 {
            return 1;
        }
        (window_ns as f64 / cycle).clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// Learns how much a turn's prompt grew beyond the last turn's prompt
    /// and output, on the turn's first request (a retry asks with the
    /// prompt already seen).
    pub(super) fn learn_growth(&mut self, h: &mut History, prompt: u64) {
        if h.turns == 0 || prompt <= h.last_prompt {
            return;
        }
        let grown = prompt.saturating_sub(h.last_prompt + h.last_output) as f64;
        h.growth = if h.growth == 0.0 {
            grown
        } else {
            (1.0 - SESSION_GROWTH_WEIGHT) * h.growth + SESSION_GROWTH_WEIGHT * grown
        };
        self.growth = running_mean(self.growth, grown);
    }

    /// What a session's turn is expected to generate: its last turn's
    /// output, else the mean.
    pub(super) fn output_of(&self, h: &History) -> u64 {
        if h.turns > 0 {
            h.last_output
        } else {
            self.output as u64
        }
    }

    /// What a session's next turn adds to what it keeps cached: its tool
    /// result (its own mean growth, else everyone's) and its output. Kept
    /// free for each member before anyone joins: a newcomer that fits
    /// only until the members' next turns would park one of them at once.
    pub(super) fn next_turn_growth(&self, h: &History) -> u64 {
        let growth = if h.growth > 0.0 {
            h.growth
        } else {
            self.growth
        };
        growth as u64 + self.output_of(h)
    }
}

/// A saved summary's view of the means (module `learned`): taken and
/// given back whole, without touching how they are learned.
impl Means {
    /// The means as figures: output, growth, turn time (ns), log gap.
    pub(super) fn figures(&self) -> [f64; 4] {
        [self.output, self.growth, self.turn_ns, self.ln_gap]
    }

    /// Means from [`Means::figures`] (checked finite by the summary's parser).
    pub(super) fn from_figures([output, growth, turn_ns, ln_gap]: [f64; 4]) -> Self {
        Self {
            output,
            growth,
            turn_ns,
            ln_gap,
        }
    }
}
