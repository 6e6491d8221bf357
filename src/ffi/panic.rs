//! The one boundary every export runs in: no panic unwinds into C.
//!
//! Since Rust 1.81 a panic leaving an `extern "C"` function aborts the
//! process; catching it here turns it into `KVGATE_PANIC` (or the documented
//! default of a function without a status) and a last-error message instead.

use std::any::Any;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::error::{set_last_error, Failure};
use super::status::kvgate_status;

/// What an export returns when its body panicked.
pub(crate) trait PanicDefault {
    fn panic_default() -> Self;
}

impl PanicDefault for kvgate_status {
    fn panic_default() -> Self {
        kvgate_status::KVGATE_PANIC
    }
}

impl PanicDefault for () {
    fn panic_default() -> Self {}
}

impl<T> PanicDefault for *mut T {
    fn panic_default() -> Self {
        std::ptr::null_mut()
    }
}

/// String getters promise never to return NULL.
impl PanicDefault for *const c_char {
    fn panic_default() -> Self {
        c"".as_ptr()
    }
}

/// Runs an export's body, turning a panic into `R`'s default.
///
/// `AssertUnwindSafe` is sound here: the gate's shared state is guarded by
/// parking_lot locks (which do not poison) and keeps its invariants across
/// an unwinding driver (`Gate::acquire` abandons its attempt on unwind).
pub(crate) fn ffi_boundary<R: PanicDefault>(function: &'static str, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            set_last_error(
                function,
                &format!("kvgate panicked (a bug in kvgate): {}", message(&*payload)),
            );
            // A payload whose destructor panics must not escape either.
            if let Err(nested) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(nested);
            }
            R::panic_default()
        }
    }
}

/// [`ffi_boundary`] for the many exports that return a status: `Err` sets
/// the thread's last error and returns its status.
pub(crate) fn ffi_status(
    function: &'static str,
    body: impl FnOnce() -> Result<(), Failure>,
) -> kvgate_status {
    ffi_boundary(function, || match body() {
        Ok(()) => kvgate_status::KVGATE_OK,
        Err(failure) => {
            set_last_error(function, &failure.message);
            failure.status
        }
    })
}

fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a non-string panic payload"
    }
}

#[cfg(test)]
mod tests {
    use super::super::error::last_error_string;
    use super::*;

    #[test]
    fn a_panic_becomes_the_status_and_a_message() {
        let status = ffi_status("kvgate_test", || -> Result<(), Failure> {
            panic!("boom {}", 42)
        });
        assert_eq!(status, kvgate_status::KVGATE_PANIC);
        let msg = last_error_string().unwrap();
        assert!(msg.starts_with("kvgate_test: kvgate panicked"), "{msg}");
        assert!(msg.contains("boom 42"), "{msg}");
    }

    #[test]
    fn pointer_and_unit_exports_get_their_defaults() {
        let p: *mut u8 = ffi_boundary("kvgate_test", || panic!("no pointer"));
        assert!(p.is_null());
        ffi_boundary::<()>("kvgate_test", || panic!("nothing to return"));
        let s: *const c_char = ffi_boundary("kvgate_test", || std::panic::panic_any(7u8));
        assert!(!s.is_null());
        assert!(last_error_string()
            .unwrap()
            .contains("a non-string panic payload"));
    }

    #[test]
    fn failures_set_the_last_error_and_success_leaves_it() {
        let status = ffi_status("kvgate_test", || Err(Failure::invalid("x is NULL")));
        assert_eq!(status, kvgate_status::KVGATE_INVALID_ARGUMENT);
        assert_eq!(
            ffi_status("kvgate_test", || Ok(())),
            kvgate_status::KVGATE_OK
        );
        assert_eq!(last_error_string().unwrap(), "kvgate_test: x is NULL");
    }
}
