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
}

impl AcquireError {
    /// A stable lower-case name, as used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preempted => "preempted",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Closed => "closed",
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
        })
    }
}

impl std::error::Error for AcquireError {}
