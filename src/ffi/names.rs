//! What a host prints: the names of statuses and reasons, and this
//! thread's last error. Exports over the plumbing of `status` and `error`,
//! each inside the panic boundary.

use std::ffi::c_char;

use super::error::last_error_ptr;
use super::panic::ffi_boundary;
use super::status::{kvgate_reason, kvgate_status};

/// Unknown values get this name.
const UNKNOWN: &[u8] = b"unknown\0";

fn c_str(name: &'static [u8]) -> *const c_char {
    debug_assert_eq!(name.last(), Some(&0));
    name.as_ptr().cast()
}

/// The stable lower-case name of a status: `"ok"`, `"preempted"`,
/// `"timed_out"`, `"cancelled"`, `"closed"`, `"invalid_argument"`,
/// `"unknown_lease"`, `"not_found"`, `"panic"`, `"buffer_too_small"`,
/// `"out_of_order"`, `"os_error"`, or `"unknown"` for a value this library
/// does not know.
///
/// Takes a plain `uint32_t` so that any value, even one a newer header
/// defines, is safe to pass. The string is static: never free it. Never
/// returns NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn kvgate_status_str(status: u32) -> *const c_char {
    ffi_boundary("kvgate_status_str", || {
        let known = kvgate_status::ALL.iter().find(|s| **s as u32 == status);
        c_str(known.map_or(UNKNOWN, |s| s.name()))
    })
}

/// The name of a reason: `"open"`, `"reserved_session"`,
/// `"prefix_probe_unavailable"`, `"resident_prefix"`, `"fits_working_set"`,
/// `"empty_working_set"`, `"wait_bound"`, `"running_cold_pays"`, or
/// `"unknown"`.
///
/// Takes a plain `uint32_t` so that any value is safe to pass. The string is
/// static: never free it. Never returns NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn kvgate_reason_str(reason: u32) -> *const c_char {
    ffi_boundary("kvgate_reason_str", || {
        let known = kvgate_reason::ALL.iter().find(|r| **r as u32 == reason);
        c_str(known.map_or(UNKNOWN, |r| r.name()))
    })
}

/// A human-readable description of the last failed kvgate call on the
/// calling thread: the function, which argument or value was refused, and
/// why (e.g. `"kvgate_acquire: session_id is NULL but session_id_len is 5"`).
///
/// Only failures set it; a successful call leaves it unchanged. Returns ""
/// (never NULL) if no call has failed on this thread yet. The string belongs
/// to the library and stays valid until the next failing kvgate call on the
/// same thread or until the thread exits; copy it to keep it. Never free it.
#[unsafe(no_mangle)]
pub extern "C" fn kvgate_last_error() -> *const c_char {
    ffi_boundary("kvgate_last_error", last_error_ptr)
}
