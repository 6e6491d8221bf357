//! `kvgate_release_elsewhere` (issue 54) through the C ABI: a session whose
//! cache the gate holds hot is refused with `KVGATE_CACHE_HOT` and keeps
//! its lease; nothing waiting is `KVGATE_NOT_FOUND`; a gate that cannot
//! tell (reference mode) and a NULL gate are `KVGATE_INVALID_ARGUMENT`.
//! The release of a waiting turn itself is in `tests/release_elsewhere.rs`.

use std::mem::MaybeUninit;
use std::ptr;

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::*;

#[path = "support/ffi_support.rs"]
mod ffi_support;
use ffi_support::{gate_with, last_error};

fn release_elsewhere(gate: *mut kvgate_gate, session: &str) -> kvgate_status {
    // SAFETY: a live (or NULL) gate and an id of its stated length.
    unsafe { kvgate_release_elsewhere(gate, session.as_ptr(), session.len()) }
}

#[test]
fn a_member_is_refused_as_cache_hot_and_keeps_its_lease() {
    // NULL probes: every turn is admitted, the first as the empty working set.
    let gate = gate_with(false, |_| {});
    let s = "hot";
    let mut out = MaybeUninit::<kvgate_admission>::uninit();
    // SAFETY: a live gate, id and out; no prompt ids.
    let status = unsafe {
        kvgate_acquire(
            gate,
            s.as_ptr(),
            s.len(),
            ptr::null(),
            0,
            -1,
            out.as_mut_ptr(),
        )
    };
    assert_eq!(status, KVGATE_OK);
    // SAFETY: written on KVGATE_OK.
    let lease = unsafe { out.assume_init() }.lease;
    assert_eq!(release_elsewhere(gate, s), KVGATE_CACHE_HOT);
    assert!(last_error().contains("hot"), "{}", last_error());
    assert_eq!(release_elsewhere(gate, "nobody"), KVGATE_NOT_FOUND);
    // The lease was kept: it releases once.
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_release(gate, lease) }, KVGATE_OK);
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(gate) };
}

#[test]
fn a_gate_that_cannot_tell_and_a_null_gate_are_refused() {
    let gate = gate_with(true, |_| {});
    assert_eq!(release_elsewhere(gate, "s"), KVGATE_INVALID_ARGUMENT);
    assert!(
        last_error().contains("working-set admission"),
        "{}",
        last_error()
    );
    assert_eq!(
        release_elsewhere(ptr::null_mut(), "s"),
        KVGATE_INVALID_ARGUMENT
    );
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(gate) };
}
