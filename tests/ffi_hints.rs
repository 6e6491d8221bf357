//! What the host may tell through the C ABI (issue 51): the engine's
//! `max_model_len`, a session's budget, a saved summary. One test per
//! promise the header makes of them.

use std::ptr;

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::*;

#[path = "support/ffi_support.rs"]
mod ffi_support;
use ffi_support::{gate_with, last_error};

fn budget(gate: *mut kvgate_gate, session: &[u8], turns: i64, tokens: i64) -> kvgate_status {
    // SAFETY: a live gate and a session slice valid for the call.
    unsafe { kvgate_session_set_budget(gate, session.as_ptr(), session.len(), turns, tokens) }
}

fn save(gate: *mut kvgate_gate) -> Vec<u8> {
    let mut len = 0usize;
    // SAFETY: a live gate; a NULL buffer with cap 0 asks the size.
    let status = unsafe { kvgate_summary_save(gate, ptr::null_mut(), 0, &mut len) };
    assert_eq!(status, KVGATE_BUFFER_TOO_SMALL);
    let mut buf = vec![0u8; len];
    let mut written = 0usize;
    // SAFETY: a live gate and `buf.len()` writable bytes.
    let status = unsafe { kvgate_summary_save(gate, buf.as_mut_ptr(), buf.len(), &mut written) };
    assert_eq!(status, KVGATE_OK);
    assert_eq!(written, len, "*len is the summary's size on KVGATE_OK too");
    buf
}

fn load(gate: *mut kvgate_gate, bytes: &[u8]) -> kvgate_status {
    // SAFETY: a live gate and `bytes.len()` readable bytes.
    unsafe { kvgate_summary_load(gate, bytes.as_ptr(), bytes.len()) }
}

fn free(gate: *mut kvgate_gate) {
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(gate) };
}

#[test]
fn a_max_model_len_of_zero_is_refused_by_name() {
    let gate = gate_with(false, |_| {});
    // SAFETY: a live gate.
    assert_eq!(unsafe { kvgate_set_max_model_len(gate, 4096) }, KVGATE_OK);
    // SAFETY: a live gate.
    assert_eq!(
        unsafe { kvgate_set_max_model_len(gate, 0) },
        KVGATE_INVALID_ARGUMENT
    );
    assert!(last_error().contains("max_model_len"), "{}", last_error());
    // The previous figure is kept: a budget past it is still refused.
    assert_eq!(budget(gate, b"s", 0, 4097), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("tokens"));
    // SAFETY: NULL is refused, never dereferenced.
    assert_eq!(
        unsafe { kvgate_set_max_model_len(ptr::null_mut(), 1) },
        KVGATE_INVALID_ARGUMENT
    );
    free(gate);
}

#[test]
fn a_negative_budget_is_refused_by_name_and_zero_means_not_known() {
    let gate = gate_with(false, |_| {});
    assert_eq!(budget(gate, b"s", 10, 5000), KVGATE_OK);
    assert_eq!(budget(gate, b"s", 0, 0), KVGATE_OK, "0: not known");
    assert_eq!(budget(gate, b"s", -1, 0), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("turns"), "{}", last_error());
    assert_eq!(budget(gate, b"s", 0, -5), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("tokens"), "{}", last_error());
    assert_eq!(
        budget(gate, b"s", i64::from(u32::MAX) + 1, 0),
        KVGATE_INVALID_ARGUMENT
    );
    assert!(last_error().contains("turns"));
    // SAFETY: a NULL session with a length is refused, never read.
    let status = unsafe { kvgate_session_set_budget(gate, ptr::null(), 3, 1, 1) };
    assert_eq!(status, KVGATE_INVALID_ARGUMENT);
    free(gate);
}

#[test]
fn a_summary_saved_loads_into_a_fresh_gate() {
    let gate = gate_with(false, |_| {});
    let bytes = save(gate);
    free(gate);
    let fresh = gate_with(false, |_| {});
    assert_eq!(load(fresh, &bytes), KVGATE_OK);
    assert_eq!(save(fresh), bytes);
    free(fresh);
}

#[test]
fn a_summary_too_large_for_the_buffer_leaves_it_untouched() {
    let gate = gate_with(false, |_| {});
    let mut buf = [0xAAu8; 8];
    let mut len = 0usize;
    // SAFETY: a live gate and 8 writable bytes.
    let status = unsafe { kvgate_summary_save(gate, buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(status, KVGATE_BUFFER_TOO_SMALL);
    assert!(len > buf.len());
    assert_eq!(buf, [0xAA; 8]);
    // SAFETY: a NULL `len` is refused, never written.
    let status = unsafe { kvgate_summary_save(gate, buf.as_mut_ptr(), 8, ptr::null_mut()) };
    assert_eq!(status, KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("len"));
    free(gate);
}

#[test]
fn a_truncated_corrupted_or_other_version_summary_is_refused_and_the_gate_goes_on() {
    let gate = gate_with(false, |_| {});
    let bytes = save(gate);
    assert_eq!(
        load(gate, &bytes[..bytes.len() - 1]),
        KVGATE_INVALID_ARGUMENT
    );
    assert!(last_error().contains("truncated"), "{}", last_error());
    let mut other = bytes.clone();
    other[4] = 9;
    assert_eq!(load(gate, &other), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("version"), "{}", last_error());
    let mut flipped = bytes.clone();
    let last = flipped.len() - 5;
    flipped[last] ^= 1;
    assert_eq!(load(gate, &flipped), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("checksum"), "{}", last_error());
    // SAFETY: a NULL buffer with a length is refused, never read.
    assert_eq!(
        unsafe { kvgate_summary_load(gate, ptr::null(), 4) },
        KVGATE_INVALID_ARGUMENT
    );
    assert_eq!(save(gate), bytes, "nothing was half-loaded");
    free(gate);
}
