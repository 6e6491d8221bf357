//! The two C enums, their names, and how Rust outcomes map onto them.
//!
//! Values are explicit and never reused: a value whose meaning is retired
//! stays reserved (noted here) so a host compiled against an older header
//! never misreads a newer library.

use crate::{AcquireError, Reason};

/// The result of every fallible kvgate function.
///
/// `KVGATE_OK` is 0; every other value is a failure, and
/// `kvgate_last_error()` then describes it for the calling thread. Values
/// are stable across releases and never reused; new values may be added, so
/// treat an unknown value as a failure.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum kvgate_status {
    /// Success: out-parameters were written.
    KVGATE_OK = 0,
    /// `kvgate_acquire`: a newer attempt of the same session began while this
    /// one was waiting (the host retried). Counted in the session's
    /// `num_preempted`.
    KVGATE_PREEMPTED = 1,
    /// `kvgate_acquire`: the timeout passed before admission.
    KVGATE_TIMED_OUT = 2,
    /// `kvgate_acquire`: the host cancelled the attempt with
    /// `kvgate_cancel_session`.
    KVGATE_CANCELLED = 3,
    /// `kvgate_acquire`: the gate was closed (`kvgate_close`) or freed
    /// (`kvgate_free`) before admission.
    KVGATE_CLOSED = 4,
    /// An argument was refused (NULL pointer, NULL array with a non-zero
    /// length, misaligned array, out-of-range configuration value); nothing
    /// was changed.
    KVGATE_INVALID_ARGUMENT = 5,
    /// `kvgate_release`: the lease handle is not outstanding (already
    /// released, never issued by this gate, or released by `kvgate_free`).
    KVGATE_UNKNOWN_LEASE = 6,
    /// The session is not tracked (`kvgate_finish_session`,
    /// `kvgate_get_session_stats`), or has no attempt waiting
    /// (`kvgate_cancel_session`).
    KVGATE_NOT_FOUND = 7,
    /// kvgate panicked (a bug in kvgate): the call had no effect that can be
    /// relied on, the gate stays usable.
    KVGATE_PANIC = 8,
    /// `kvgate_metrics_text`: the buffer is too small; `*needed` holds the
    /// size to allocate and the buffer was not touched.
    KVGATE_BUFFER_TOO_SMALL = 9,
    /// An event-loop attempt was given a call it did not ask for: an answer
    /// to a probe it is not waiting for, a wake while it is probing, or any
    /// step after it ended (admitted, failed, cancelled). Nothing changed.
    KVGATE_OUT_OF_ORDER = 10,
    /// The operating system refused a resource kvgate needs (the wake
    /// descriptor of `kvgate_waker_new`: too many open files, say); the
    /// message carries its error.
    KVGATE_OS_ERROR = 11,
    /// `kvgate_acquire` (and an event-loop attempt): the host released the
    /// waiting turn to another replica with `kvgate_release_elsewhere`, the
    /// gate counting its cache gone here. Not a refusal: send it elsewhere.
    KVGATE_RELEASED = 12,
    /// `kvgate_release_elsewhere`: the gate holds the session's cache hot
    /// (a member of the working set, or parked in the host tier); the turn
    /// keeps its place in the queue. Nothing changed.
    KVGATE_CACHE_HOT = 13,
}

impl kvgate_status {
    /// Every status, in value order.
    pub(crate) const ALL: [kvgate_status; 14] = [
        Self::KVGATE_OK,
        Self::KVGATE_PREEMPTED,
        Self::KVGATE_TIMED_OUT,
        Self::KVGATE_CANCELLED,
        Self::KVGATE_CLOSED,
        Self::KVGATE_INVALID_ARGUMENT,
        Self::KVGATE_UNKNOWN_LEASE,
        Self::KVGATE_NOT_FOUND,
        Self::KVGATE_PANIC,
        Self::KVGATE_BUFFER_TOO_SMALL,
        Self::KVGATE_OUT_OF_ORDER,
        Self::KVGATE_OS_ERROR,
        Self::KVGATE_RELEASED,
        Self::KVGATE_CACHE_HOT,
    ];

    /// The stable lower-case name (`"ok"`, `"preempted"`, ...), NUL-terminated.
    pub(crate) fn name(self) -> &'static [u8] {
        match self {
            Self::KVGATE_OK => b"ok\0",
            Self::KVGATE_PREEMPTED => b"preempted\0",
            Self::KVGATE_TIMED_OUT => b"timed_out\0",
            Self::KVGATE_CANCELLED => b"cancelled\0",
            Self::KVGATE_CLOSED => b"closed\0",
            Self::KVGATE_INVALID_ARGUMENT => b"invalid_argument\0",
            Self::KVGATE_UNKNOWN_LEASE => b"unknown_lease\0",
            Self::KVGATE_NOT_FOUND => b"not_found\0",
            Self::KVGATE_PANIC => b"panic\0",
            Self::KVGATE_BUFFER_TOO_SMALL => b"buffer_too_small\0",
            Self::KVGATE_OUT_OF_ORDER => b"out_of_order\0",
            Self::KVGATE_OS_ERROR => b"os_error\0",
            Self::KVGATE_RELEASED => b"released\0",
            Self::KVGATE_CACHE_HOT => b"cache_hot\0",
        }
    }
}

impl From<AcquireError> for kvgate_status {
    fn from(err: AcquireError) -> Self {
        match err {
            AcquireError::Preempted => Self::KVGATE_PREEMPTED,
            AcquireError::TimedOut => Self::KVGATE_TIMED_OUT,
            AcquireError::Cancelled => Self::KVGATE_CANCELLED,
            AcquireError::Closed => Self::KVGATE_CLOSED,
            AcquireError::Released => Self::KVGATE_RELEASED,
        }
    }
}

/// Why `kvgate_acquire` admitted a turn: the rows of the decision table.
///
/// Values are stable and never reused (8 is reserved: a rule that no
/// longer exists answered it); new values may be added (a host should log
/// an unknown value rather than reject it).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum kvgate_reason {
    /// KV usage was below the high watermark, or the usage probe was
    /// unavailable.
    KVGATE_REASON_OPEN = 0,
    /// Under pressure, the session already owned a reservation (its
    /// ownership window). Retains the session.
    KVGATE_REASON_RESERVED_SESSION = 1,
    /// Under pressure, the prefix probe was unavailable.
    KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE = 2,
    /// Under pressure, the prompt's resident prefix reached the hit
    /// threshold. Retains the session.
    KVGATE_REASON_RESIDENT_PREFIX = 3,
    /// Working-set admission: the session's prefix-cache footprint fit
    /// beside the working set's. The session holds its working-set place.
    KVGATE_REASON_FITS_WORKING_SET = 4,
    /// Working-set admission: nobody else was in the working set
    /// (liveness).
    KVGATE_REASON_EMPTY_WORKING_SET = 5,
    /// Working-set admission: the session waited past the wait bound and
    /// members between turns were parked to make room for it.
    KVGATE_REASON_WAIT_BOUND = 6,
    /// Working-set admission: holding sessions out would serve fewer turns
    /// than letting everyone run with a cold cache (tool calls long next to
    /// turns, prefill to spare), so nobody is held out.
    KVGATE_REASON_RUNNING_COLD_PAYS = 7,
}

impl kvgate_reason {
    /// Every reason, in value order.
    pub(crate) const ALL: [kvgate_reason; 8] = [
        Self::KVGATE_REASON_OPEN,
        Self::KVGATE_REASON_RESERVED_SESSION,
        Self::KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE,
        Self::KVGATE_REASON_RESIDENT_PREFIX,
        Self::KVGATE_REASON_FITS_WORKING_SET,
        Self::KVGATE_REASON_EMPTY_WORKING_SET,
        Self::KVGATE_REASON_WAIT_BOUND,
        Self::KVGATE_REASON_RUNNING_COLD_PAYS,
    ];

    /// The seed's name (`"open"`, ...), NUL-terminated.
    pub(crate) fn name(self) -> &'static [u8] {
        match self {
            Self::KVGATE_REASON_OPEN => b"open\0",
            Self::KVGATE_REASON_RESERVED_SESSION => b"reserved_session\0",
            Self::KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE => b"prefix_probe_unavailable\0",
            Self::KVGATE_REASON_RESIDENT_PREFIX => b"resident_prefix\0",
            Self::KVGATE_REASON_FITS_WORKING_SET => b"fits_working_set\0",
            Self::KVGATE_REASON_EMPTY_WORKING_SET => b"empty_working_set\0",
            Self::KVGATE_REASON_WAIT_BOUND => b"wait_bound\0",
            Self::KVGATE_REASON_RUNNING_COLD_PAYS => b"running_cold_pays\0",
        }
    }
}

impl From<Reason> for kvgate_reason {
    fn from(reason: Reason) -> Self {
        // Spelled out rather than cast, so the core may renumber freely.
        match reason {
            Reason::Open => Self::KVGATE_REASON_OPEN,
            Reason::ReservedSession => Self::KVGATE_REASON_RESERVED_SESSION,
            Reason::PrefixProbeUnavailable => Self::KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE,
            Reason::ResidentPrefix => Self::KVGATE_REASON_RESIDENT_PREFIX,
            Reason::FitsWorkingSet => Self::KVGATE_REASON_FITS_WORKING_SET,
            Reason::EmptyWorkingSet => Self::KVGATE_REASON_EMPTY_WORKING_SET,
            Reason::WaitBound => Self::KVGATE_REASON_WAIT_BOUND,
            Reason::RunningColdPays => Self::KVGATE_REASON_RUNNING_COLD_PAYS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::names::{kvgate_reason_str, kvgate_status_str};
    use super::*;
    use std::ffi::{c_char, CStr};

    fn text(ptr: *const c_char) -> &'static str {
        // SAFETY: both functions return pointers to static NUL-terminated strings.
        unsafe { CStr::from_ptr(ptr) }.to_str().unwrap()
    }

    #[test]
    fn status_values_are_the_contract() {
        let values: Vec<u32> = kvgate_status::ALL.iter().map(|s| *s as u32).collect();
        assert_eq!(values, (0..14).collect::<Vec<u32>>());
        assert_eq!(text(kvgate_status_str(0)), "ok");
        assert_eq!(text(kvgate_status_str(6)), "unknown_lease");
        assert_eq!(text(kvgate_status_str(9)), "buffer_too_small");
        assert_eq!(text(kvgate_status_str(10)), "out_of_order");
        assert_eq!(text(kvgate_status_str(11)), "os_error");
        assert_eq!(text(kvgate_status_str(12)), "released");
        assert_eq!(text(kvgate_status_str(13)), "cache_hot");
        assert_eq!(text(kvgate_status_str(14)), "unknown");
        assert_eq!(text(kvgate_status_str(u32::MAX)), "unknown");
    }

    #[test]
    fn acquire_errors_keep_their_names() {
        for err in [
            AcquireError::Preempted,
            AcquireError::TimedOut,
            AcquireError::Cancelled,
            AcquireError::Closed,
            AcquireError::Released,
        ] {
            let status = kvgate_status::from(err);
            assert_eq!(text(kvgate_status_str(status as u32)), err.as_str());
        }
    }

    #[test]
    fn reasons_match_the_core_names_and_values() {
        for reason in Reason::ALL {
            let c = kvgate_reason::from(reason);
            assert_eq!(c as u32, reason as u32);
            assert_eq!(text(kvgate_reason_str(c as u32)), reason.as_str());
        }
        assert_eq!(
            text(kvgate_reason_str(kvgate_reason::ALL.len() as u32)),
            "unknown"
        );
    }
}
