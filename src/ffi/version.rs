//! Which kvgate a host runs against: the header's version macros (compile
//! time) and `kvgate_version()` (run time), both tied to Cargo.toml.

use std::ffi::c_char;

use super::panic::ffi_boundary;

/// Major version of the header. The ABI policy (README "C ABI"): while
/// the major version is 0, a minor release may break the ABI; a patch
/// release never does.
pub const KVGATE_VERSION_MAJOR: u32 = 0;
/// Minor version of the header.
pub const KVGATE_VERSION_MINOR: u32 = 2;
/// Patch version of the header.
pub const KVGATE_VERSION_PATCH: u32 = 0;

/// The library's version, `"MAJOR.MINOR.PATCH"` (Cargo's package version).
///
/// Compare it with the header's `KVGATE_VERSION_*` macros to detect a host
/// built against another version than the one loaded. The string is static:
/// never free it. Never returns NULL. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn kvgate_version() -> *const c_char {
    ffi_boundary("kvgate_version", || {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    /// cbindgen needs literals; this keeps them equal to Cargo.toml's version.
    #[test]
    fn header_constants_follow_cargo_toml() {
        let parse = |s: &str| s.parse::<u32>().unwrap();
        assert_eq!(KVGATE_VERSION_MAJOR, parse(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(KVGATE_VERSION_MINOR, parse(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(KVGATE_VERSION_PATCH, parse(env!("CARGO_PKG_VERSION_PATCH")));
        // SAFETY: a static NUL-terminated string.
        let runtime = unsafe { CStr::from_ptr(kvgate_version()) };
        assert_eq!(
            runtime.to_str().unwrap(),
            format!("{KVGATE_VERSION_MAJOR}.{KVGATE_VERSION_MINOR}.{KVGATE_VERSION_PATCH}")
        );
    }
}
