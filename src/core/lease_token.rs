//! What an admission grants: the lease as plain data that the core takes
//! back on release, and the record of the admission the core keeps.

use std::fmt;
use std::time::Duration;

use super::ledger::Turn;
use super::policy::Holds;
use super::reason::Reason;
use super::sessions::SessionKey;

/// What an admission looked like.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Admission {
    /// Gate-unique id of the lease.
    pub lease_id: u64,
    /// Which row of the table admitted the attempt.
    pub reason: Reason,
    /// Time from the start of the attempt to its admission.
    pub wait: Duration,
    /// Whether the attempt slept at least once.
    pub waited: bool,
    /// Usage answer of the deciding pass (`None` if unavailable).
    pub usage: Option<f64>,
    /// Prefix hit ratio of the deciding pass (`None` if not asked or unavailable).
    /// Unlike the reference, never carried over from an earlier pass.
    pub hit_ratio: Option<f64>,
    /// Whether the lease holds the session's place: in reference mode its
    /// reservation (as
    /// [`SessionStats::reservation`](crate::SessionStats::reservation)
    /// counts), in working-set mode always, its place in the working set
    /// (no reservation: the session's `reservation` stays
    /// [`ReservationState::None`](crate::ReservationState)).
    pub retain_session: bool,
}

/// A granted lease as plain data: hand it back to [`Core::release`](super::Core::release) exactly
/// once. The blocking gate wraps it in [`Lease`](crate::Lease), which does
/// that on drop.
#[must_use = "a lease that is never released keeps its session's reservation and starves waiters"]
///
/// Internal to Rust: the C ABI hands out a `u64` lease handle and keeps the
/// token in its registry, so the token's layout is no part of the ABI. It
/// is moved several times per turn (into the step, the result, the lease,
/// back to the core): `tests::lease_token_stays_small` keeps it at 128 bytes.
pub struct LeaseToken {
    key: SessionKey,
    admission: Admission,
    holds: Holds,
    turn: Turn,
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseToken")
            .field("session", &String::from_utf8_lossy(&self.key.bytes))
            .field("admission", &self.admission)
            .finish()
    }
}

impl LeaseToken {
    /// What the admission looked like.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The session the lease belongs to.
    pub fn session_id(&self) -> &[u8] {
        &self.key.bytes
    }

    pub(crate) fn new(key: SessionKey, admission: Admission, holds: Holds, turn: Turn) -> Self {
        Self {
            key,
            admission,
            holds,
            turn,
        }
    }

    pub(crate) fn into_parts(self) -> (SessionKey, Admission, Holds, Turn) {
        (self.key, self.admission, self.holds, self.turn)
    }
}

/// What an admission records (see `Core::grant`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) reason: Reason,
    pub(crate) prompt_len: usize,
    /// The attempt's time from start to admission, if it slept.
    pub(crate) waited: Option<u64>,
    /// What the policy's decision holds (`Policy::decide`).
    pub(crate) holds: Holds,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_token_stays_small() {
        let size = std::mem::size_of::<LeaseToken>();
        assert!(size <= 128, "LeaseToken grew to {size} bytes");
    }
}
