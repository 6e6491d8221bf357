//! Why an attempt was admitted: one reason per rule that admits, in either
//! admission policy. The numbers are part of the C ABI (`kvgate_reason`)
//! and are never reused.

use std::fmt;

/// Why an attempt was admitted.
///
/// The working set's reasons are `reserved_session` (a member's turn),
/// `fits_working_set`, `empty_working_set`, `wait_bound` and
/// `running_cold_pays`; the seed's table (reference mode) answers `open`,
/// `reserved_session`, `prefix_probe_unavailable` and `resident_prefix`.
/// Number 8 is reserved (a rule that no longer exists answered it) and is
/// never reused.
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
}

impl Reason {
    /// All reasons, in their numeric order.
    pub const ALL: [Reason; 8] = [
        Reason::Open,
        Reason::ReservedSession,
        Reason::PrefixProbeUnavailable,
        Reason::ResidentPrefix,
        Reason::FitsWorkingSet,
        Reason::EmptyWorkingSet,
        Reason::WaitBound,
        Reason::RunningColdPays,
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
