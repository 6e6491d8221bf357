//! Why a call failed: the failure every export body returns, and the
//! thread-local message `kvgate_last_error` hands to C.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt;

use super::status::kvgate_status;

/// A failed call: the status C sees and the message `kvgate_last_error`
/// gives (which argument, which value, why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) status: kvgate_status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: kvgate_status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(kvgate_status::KVGATE_INVALID_ARGUMENT, message)
    }

    pub(crate) fn not_tracked(session: &[u8]) -> Self {
        Self::new(
            kvgate_status::KVGATE_NOT_FOUND,
            format!(
                "session {} is not tracked (never seen, finished, or retired)",
                SessionName(session)
            ),
        )
    }
}

impl From<crate::ConfigError> for Failure {
    fn from(err: crate::ConfigError) -> Self {
        Self::invalid(err.to_string())
    }
}

/// Renders a session id for a message: text if it is printable UTF-8,
/// hex otherwise; long ids are cut (the message names the session, it does
/// not reproduce it).
pub(crate) struct SessionName<'a>(pub(crate) &'a [u8]);

impl fmt::Display for SessionName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 64;
        let shown = &self.0[..self.0.len().min(SHOWN)];
        let more = if self.0.len() > SHOWN { "..." } else { "" };
        match std::str::from_utf8(shown) {
            Ok(s) if !s.chars().any(char::is_control) => write!(f, "\"{s}{more}\""),
            _ => {
                f.write_str("0x")?;
                for b in shown {
                    write!(f, "{b:02x}")?;
                }
                f.write_str(more)
            }
        }
    }
}

// Per model thread under loom (see the facade).
crate::sync::thread_local_cell! {
    static LAST_ERROR: RefCell<Option<CString>> = RefCell::new(None);
}

/// Records `message` as this thread's last error, prefixed with the
/// function that failed.
pub(crate) fn set_last_error(function: &str, message: &str) {
    let text = format!("{function}: {message}");
    // An interior NUL (from a session id shown as text) would cut the C string short.
    let text = CString::new(text.replace('\0', "\\0")).expect("NULs were replaced");
    // Fails only during thread teardown, when nobody can read it any more.
    let _ = LAST_ERROR.try_with(|cell| *cell.borrow_mut() = Some(text));
}

/// This thread's last error as an owned string (tests and the Rust side).
#[cfg(test)]
pub(crate) fn last_error_string() -> Option<String> {
    LAST_ERROR.with(|cell| {
        cell.borrow()
            .as_ref()
            .map(|s| s.to_string_lossy().into_owned())
    })
}

/// This thread's last error as a C string, or "" (never NULL): what
/// `kvgate_last_error` returns.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|cell| cell.borrow().as_ref().map(|s| s.as_ptr()))
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::super::names::kvgate_last_error;
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn last_error_is_per_thread_and_names_the_function() {
        set_last_error("kvgate_release", "lease 7 is not outstanding");
        // SAFETY: the pointer is to this thread's message, read before any other call.
        let here = unsafe { CStr::from_ptr(kvgate_last_error()) };
        assert_eq!(
            here.to_str().unwrap(),
            "kvgate_release: lease 7 is not outstanding"
        );
        let other = std::thread::spawn(|| {
            // SAFETY: as above, on the other thread.
            let s = unsafe { CStr::from_ptr(kvgate_last_error()) };
            s.to_str().unwrap().to_owned()
        })
        .join()
        .unwrap();
        assert_eq!(other, "", "a fresh thread has no last error");
    }

    #[test]
    fn session_names_are_readable_and_bounded() {
        assert_eq!(SessionName(b"agent-7").to_string(), "\"agent-7\"");
        assert_eq!(SessionName(&[0xff, 0x00, 0x41]).to_string(), "0xff0041");
        let long = vec![b'a'; 100];
        assert_eq!(
            SessionName(&long).to_string(),
            format!("\"{}...\"", "a".repeat(64))
        );
        set_last_error("f", "nul \0 inside");
        assert_eq!(last_error_string().unwrap(), "f: nul \\0 inside");
    }
}
