//! Why an attempt ended without a lease.

use std::fmt;

/// Why `acquire` returned without admitting the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcquireError {
    /// A newer attempt of the same session began while this one was still
    /// waiting for admission. Counted in the session's `num_preempted`.
    Preempted,
    /// The attempt's timeout passed before it was admitted.
    TimedOut,
    /// The host cancelled the session's waiting attempt
    /// ([`Gate::cancel_session`](crate::Gate::cancel_session)).
    Cancelled,
    /// The gate was closed; it admits nothing any more.
    Closed,
    /// The host released the waiting turn to another replica
    /// ([`Gate::release_elsewhere`](crate::Gate::release_elsewhere)): the
    /// gate counted its cache gone here, so it costs a full prefill
    /// wherever it runs. Not a refusal: send the turn elsewhere.
    Released,
}

impl AcquireError {
    /// A stable lower-case name, as used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preempted => "preempted",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Closed => "closed",
            Self::Released => "released",
        }
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Preempted => "admission preempted by a newer attempt of the same session",
            Self::TimedOut => "admission timed out",
            Self::Cancelled => "admission cancelled",
            Self::Closed => "the gate is closed",
            Self::Released => "released to another replica: its cache is gone here",
        })
    }
}

impl std::error::Error for AcquireError {}

/// Why [`Gate::release_elsewhere`](crate::Gate::release_elsewhere) kept a
/// turn: nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseError {
    /// The gate holds the session's cache hot (a member of the working
    /// set, or parked in the host tier): the turn keeps its place.
    CacheHot,
    /// The session has no turn waiting here.
    NotWaiting,
    /// The gate does not run working-set admission: it cannot tell.
    NoWorkingSet,
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CacheHot => {
                "the gate holds the session's cache hot here: its turn keeps its place"
            }
            Self::NotWaiting => "the session has no turn waiting here",
            Self::NoWorkingSet => "only working-set admission can tell a session's cache is gone",
        })
    }
}

impl std::error::Error for ReleaseError {}
