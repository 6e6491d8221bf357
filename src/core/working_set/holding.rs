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
//! ahead ([`Tuning::cold_margin`]), as when tool
//! calls are long next to turns and the engine has prefill to spare,
//! holding sessions out only idles them, and nobody is held out while it
//! stays so. Decided again for each queue head; unknown figures (no rate,
//! no capacity, no cycle yet) keep holding.

use super::capacity::Capacity;
use super::estimates::Means;
use super::tuning::Tuning;

/// Whether holding pays, with `members` members and `waiting` sessions
/// queued, `footprints` the members' own tokens and prefixes summed: the
/// cold bound over the hot figure below the margin. Unknown figures hold;
/// an infinite margin always holds (no finite lead reaches it).
pub(super) fn pays(
    tuning: &Tuning,
    capacity: &Capacity,
    means: &Means,
    (members, waiting): (usize, usize),
    footprints: impl FnOnce() -> u64,
) -> bool {
    let cycle = means.cycle_ns() / 1e9;
    let turn = means.turn_ns() / 1e9;
    let tokens = capacity.tokens();
    if turn <= 0.0 || members == 0 || !tokens.is_finite() {
        return true;
    }
    let footprint = (footprints() as f64 / members as f64).max(1.0);
    // A cold turn rebuilds the whole footprint, its attention included.
    let Some(rebuild) = capacity.rebuild_secs(0, footprint as u64) else {
        return true;
    };
    if rebuild <= 0.0 {
        return true;
    }
    let active = (members + waiting) as f64;
    let fit = (tokens / footprint).max(1.0).min(active);
    let hot = fit / cycle;
    let cold = (active / cycle).min(1.0 / rebuild).min(fit / turn);
    cold / hot < tuning.cold_margin
}
