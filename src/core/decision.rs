//! The seed's admission table (`reference` mode), and the reasons of both
//! modes; the working-set mode's rules are in `working_set`. Every driver (blocking gate,
//! simulator, event-loop hosts) reaches an admission decision through
//! [`decide`]; a later, footprint-aware pressure signal changes this file.
//!
//! ```text
//! usage unavailable or < high_watermark ─────────────▶ admit "open"
//! usage ≥ high_watermark
//!   ├─ session owns a reservation ───────────────────▶ admit "reserved_session"
//!   ├─ prefix probe unavailable ─────────────────────▶ admit "prefix_probe_unavailable"
//!   ├─ hit_ratio ≥ hit_threshold ────────────────────▶ admit "resident_prefix"
//!   └─ otherwise ─────────────────────────────────────▶ wait, then start over
//! ```

use std::fmt;

use crate::probe::ProbeAnswer;

/// Why an attempt was admitted: the four outcomes of the seed's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum Reason {
    /// KV usage was below the high watermark, or the usage probe was unavailable.
    Open = 0,
    /// Under pressure, the session already owned a reservation.
    ReservedSession = 1,
    /// Under pressure, the prefix probe was unavailable.
    PrefixProbeUnavailable = 2,
    /// Under pressure, the prompt's resident prefix reached the hit threshold.
    ResidentPrefix = 3,
    /// Working set: the session's footprint fit beside the working set's.
    FitsWorkingSet = 4,
    /// Working set: nobody else was in it (liveness).
    EmptyWorkingSet = 5,
    /// Working set: the session waited past the wait bound, and members
    /// between turns were parked to make room for it.
    WaitBound = 6,
    /// Working set: holding sessions out would serve fewer turns than
    /// letting everyone run with a cold cache (tool calls long next to
    /// turns, prefill to spare), so nobody is held out.
    RunningColdPays = 7,
    /// Working set: no turn was in flight, and the engine had idled with
    /// sessions waiting at least as long as it had spent re-prefilling
    /// evicted prefixes (both measured), so the queue head went in, members
    /// between turns parked for it.
    EngineIdle = 8,
}

impl Reason {
    /// All reasons, in their numeric order.
    pub const ALL: [Reason; 9] = [
        Reason::Open,
        Reason::ReservedSession,
        Reason::PrefixProbeUnavailable,
        Reason::ResidentPrefix,
        Reason::FitsWorkingSet,
        Reason::EmptyWorkingSet,
        Reason::WaitBound,
        Reason::RunningColdPays,
        Reason::EngineIdle,
    ];

    /// The seed's name for the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Open => "open",
            Reason::ReservedSession => "reserved_session",
            Reason::PrefixProbeUnavailable => "prefix_probe_unavailable",
            Reason::ResidentPrefix => "resident_prefix",
            Reason::FitsWorkingSet => "fits_working_set",
            Reason::EmptyWorkingSet => "empty_working_set",
            Reason::WaitBound => "wait_bound",
            Reason::RunningColdPays => "running_cold_pays",
            Reason::EngineIdle => "engine_idle",
        }
    }

    /// Whether an admission for this reason holds (or renews) the session's
    /// reservation: only admissions made *because of* the session's standing
    /// under pressure do. `open` and `prefix_probe_unavailable` never create one.
    pub fn retains_session(self) -> bool {
        matches!(self, Reason::ReservedSession | Reason::ResidentPrefix)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The two thresholds the table compares against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Thresholds {
    pub(crate) high_watermark: f64,
    pub(crate) hit_threshold: f64,
}

/// What one pass of an attempt knows so far. `None` means "not asked yet".
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Facts {
    pub(crate) usage: Option<ProbeAnswer>,
    pub(crate) reserved: bool,
    pub(crate) prefix: Option<ProbeAnswer>,
}

/// What the table says to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    AskUsage,
    AskPrefix,
    Admit(Reason),
    Wait,
}

/// The admission table. Pure: no clock, no probe, no lock.
pub(crate) fn decide(t: Thresholds, facts: Facts) -> Decision {
    let usage = match facts.usage {
        None => return Decision::AskUsage,
        Some(answer) => answer.value(),
    };
    // `>=`: usage equal to the watermark is pressure, as in the reference.
    let under_pressure = matches!(usage, Some(u) if u >= t.high_watermark);
    if !under_pressure {
        return Decision::Admit(Reason::Open);
    }
    if facts.reserved {
        return Decision::Admit(Reason::ReservedSession);
    }
    match facts.prefix {
        None => Decision::AskPrefix,
        Some(answer) => match answer.value() {
            None => Decision::Admit(Reason::PrefixProbeUnavailable),
            Some(hit) if hit >= t.hit_threshold => Decision::Admit(Reason::ResidentPrefix),
            Some(_) => Decision::Wait,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProbeAnswer::{Invalid, Unavailable, Value};

    const T: Thresholds = Thresholds {
        high_watermark: 0.85,
        hit_threshold: 0.80,
    };

    fn facts(usage: Option<ProbeAnswer>, reserved: bool, prefix: Option<ProbeAnswer>) -> Facts {
        Facts {
            usage,
            reserved,
            prefix,
        }
    }

    #[test]
    fn every_row_of_the_table() {
        // Nothing known yet: ask usage first.
        assert_eq!(decide(T, facts(None, true, None)), Decision::AskUsage);
        // Usage unavailable or invalid: open, whatever else is known.
        assert_eq!(
            decide(T, facts(Some(Unavailable), true, None)),
            Decision::Admit(Reason::Open)
        );
        assert_eq!(
            decide(T, facts(Some(Invalid), false, None)),
            Decision::Admit(Reason::Open)
        );
        // Below the watermark: open, even for a reserved session.
        assert_eq!(
            decide(T, facts(Some(Value(0.5)), true, None)),
            Decision::Admit(Reason::Open)
        );
        // Pressure (equality included) with a reservation: reserved, no prefix probe.
        assert_eq!(
            decide(T, facts(Some(Value(0.85)), true, None)),
            Decision::Admit(Reason::ReservedSession)
        );
        // Pressure without a reservation: ask the prefix.
        assert_eq!(
            decide(T, facts(Some(Value(0.85)), false, None)),
            Decision::AskPrefix
        );
        assert_eq!(
            decide(T, facts(Some(Value(1.0)), false, Some(Unavailable))),
            Decision::Admit(Reason::PrefixProbeUnavailable)
        );
        assert_eq!(
            decide(T, facts(Some(Value(1.0)), false, Some(Invalid))),
            Decision::Admit(Reason::PrefixProbeUnavailable)
        );
        // Hit ratio equal to the threshold is resident.
        assert_eq!(
            decide(T, facts(Some(Value(0.9)), false, Some(Value(0.80)))),
            Decision::Admit(Reason::ResidentPrefix)
        );
        assert_eq!(
            decide(T, facts(Some(Value(0.9)), false, Some(Value(0.79)))),
            Decision::Wait
        );
    }

    #[test]
    fn only_pressure_admissions_of_standing_retain() {
        let retaining: Vec<_> = Reason::ALL
            .into_iter()
            .filter(|r| r.retains_session())
            .collect();
        assert_eq!(
            retaining,
            vec![Reason::ReservedSession, Reason::ResidentPrefix]
        );
    }
}
