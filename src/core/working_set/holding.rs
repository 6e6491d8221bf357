//! Whether holding sessions out pays at all: the engine's spare compute
//! weighed against its cache.
//!
//! Holding keeps the cache hot for the `K` sessions that fit, which then
//! serve about `K / T` turns a second (`T`: the measured cycle, a turn and
//! a tool gap). Running every one of the `N` active sessions with a cold
//! cache serves at most `N / T`, at most `1 / T(f)` (each turn rebuilds its
//! history `f`, which takes the engine `T(f)`, module `rebuild`), and at
//! most `K / turn` (a turn in
//! flight needs its history in the cache). When that bound is clearly
//! ahead ([`Tuning::cold_margin`](super::Tuning::cold_margin)), as when tool
//! calls are long next to turns and the engine has prefill to spare,
//! holding sessions out only idles them, and nobody is held out while it
//! stays so. Decided again for each queue head; unknown figures (no rate,
//! no capacity, no cycle yet) keep holding.

use std::hash::Hash;

use super::WorkingSet;

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// Whether holding sessions out pays, as last decided for a queue head.
    pub fn holding_pays(&self) -> bool {
        self.holding
    }

    /// Decides again whether holding pays. An infinite margin always
    /// holds: no finite lead reaches it.
    pub(super) fn update_holding(&mut self) {
        let margin = self.tuning.cold_margin;
        self.holding = self.cold_over_hot().is_none_or(|ratio| ratio < margin);
    }

    /// The cold bound over the hot figure, or `None` while a figure is
    /// unknown.
    fn cold_over_hot(&self) -> Option<f64> {
        let cycle = self.means.cycle_ns() / 1e9;
        let turn = self.means.turn_ns() / 1e9;
        let capacity = self.capacity.tokens();
        if turn <= 0.0 || self.member_count == 0 || !capacity.is_finite() {
            return None;
        }
        let prefixes: u64 = self.members().map(|(s, _)| self.prefix_of(s)).sum();
        let footprint = ((self.own_sum + prefixes) as f64 / self.member_count as f64).max(1.0);
        // A cold turn rebuilds the whole footprint, its attention included.
        let rebuild = self.capacity.rebuild_secs(0, footprint as u64)?;
        if rebuild <= 0.0 {
            return None;
        }
        let active = (self.member_count + self.queue.len()) as f64;
        let fit = (capacity / footprint).max(1.0).min(active);
        let hot = fit / cycle;
        let cold = (active / cycle).min(1.0 / rebuild).min(fit / turn);
        Some(cold / hot)
    }
}
