//! What the C ABI tests share (`tests/ffi_*.rs`): a gate built through the
//! configuration builder, a waker, the last error and a gate's figures
//! (its stats and its metrics text).

#![allow(dead_code)] // each test file uses a different subset

use std::ffi::CStr;
use std::mem::{size_of, MaybeUninit};
use std::ptr;

use kvgate::ffi::kvgate_status::{KVGATE_BUFFER_TOO_SMALL, KVGATE_OK};
use kvgate::ffi::*;

/// A gate in working-set (`reference == false`) or reference mode, with
/// whatever else `set` configures on the builder.
pub fn gate_with(reference: bool, set: impl FnOnce(*mut kvgate_config)) -> *mut kvgate_gate {
    // SAFETY: a fresh builder, used and freed here; a writable out.
    unsafe {
        let config = kvgate_config_new();
        assert!(!config.is_null());
        let mode = if reference {
            kvgate_admission_mode::KVGATE_ADMISSION_MODE_REFERENCE
        } else {
            kvgate_admission_mode::KVGATE_ADMISSION_MODE_WORKING_SET
        };
        assert_eq!(
            kvgate_config_set_admission_mode(config, mode as u32),
            KVGATE_OK
        );
        set(config);
        let mut gate = ptr::null_mut();
        assert_eq!(kvgate_new(config, &mut gate), KVGATE_OK);
        kvgate_config_free(config);
        gate
    }
}

/// A new waker.
pub fn waker() -> *mut kvgate_waker {
    let mut w = ptr::null_mut();
    // SAFETY: a writable out.
    assert_eq!(unsafe { kvgate_waker_new(&mut w) }, KVGATE_OK);
    w
}

/// The calling thread's last error message.
pub fn last_error() -> String {
    // SAFETY: the library's NUL-terminated, never-NULL string.
    unsafe { CStr::from_ptr(kvgate_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The gate's figures, whole.
pub fn stats(gate: *mut kvgate_gate) -> kvgate_stats {
    let mut out = MaybeUninit::<kvgate_stats>::uninit();
    // SAFETY: a live gate and a writable out of the stated size.
    assert_eq!(
        unsafe { kvgate_get_stats(gate, out.as_mut_ptr(), size_of::<kvgate_stats>()) },
        KVGATE_OK
    );
    // SAFETY: written on KVGATE_OK.
    unsafe { out.assume_init() }
}

/// The gate's metrics text, whole.
pub fn metrics(gate: *mut kvgate_gate) -> String {
    let mut needed = 0usize;
    // SAFETY: a live gate; a NULL buffer with cap 0 asks the size.
    let status = unsafe { kvgate_metrics_text(gate, ptr::null_mut(), 0, &mut needed) };
    assert_eq!(status, KVGATE_BUFFER_TOO_SMALL);
    let mut buf = vec![0u8; needed + 64];
    // SAFETY: a live gate and `buf.len()` writable bytes.
    let status =
        unsafe { kvgate_metrics_text(gate, buf.as_mut_ptr().cast(), buf.len(), &mut needed) };
    assert_eq!(status, KVGATE_OK);
    CStr::from_bytes_until_nul(&buf)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}
