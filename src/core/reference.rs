//! The seed's admission table (`reference` mode). A driver reaches a
//! reference decision through [`decide`] alone; the working set's rules are
//! in `working_set`.
//!
//! ```text
//! usage unavailable or < high_watermark ─────────────▶ admit "open"
//! usage ≥ high_watermark
//!   ├─ session owns a reservation ───────────────────▶ admit "reserved_session"
//!   ├─ prefix probe unavailable ─────────────────────▶ admit "prefix_probe_unavailable"
//!   ├─ hit_ratio ≥ hit_threshold ────────────────────▶ admit "resident_prefix"
//!   └─ otherwise ─────────────────────────────────────▶ wait, then start over
//! ```

use super::reason::Reason;
use crate::probe::ProbeAnswer;

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
