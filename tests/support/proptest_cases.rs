//! How many cases a proptest file runs: its own default, or
//! `PROPTEST_CASES` when set (for longer runs by hand). The files build
//! their own configs, which do not read the variable, so they read it
//! here, in one place.

/// `PROPTEST_CASES` if it is set to a number, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
