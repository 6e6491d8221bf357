//! The configuration builder: fields are set one by one, so new knobs can be
//! added without changing a struct a host compiled against.
//!
//! Validation is the Rust `Config`'s own (`Config::validate`,
//! `Config::duration_from_secs`): a setter applies the value to a copy,
//! validates the copy, and keeps it only if it is valid.

use super::callbacks::{
    kvgate_capacity_fn, kvgate_prefix_fn, kvgate_tier_fn, kvgate_usage_fn, ProbeFns,
};
use super::error::Failure;
use super::handles::{self, kvgate_config, Castable};
use super::panic::{ffi_boundary, ffi_status};
use super::status::kvgate_status;
use crate::{AdmissionMode, Config};

/// What a `kvgate_config *` holds: the knobs and the host's probes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Builder {
    pub(crate) config: Config,
    pub(crate) probes: ProbeFns,
}

impl Castable for kvgate_config {
    type Rust = Builder;
}

/// A new configuration builder holding the defaults: working-set admission
/// (`KVGATE_ADMISSION_MODE_WORKING_SET`), and the reference's
/// high_watermark 0.85, hit_threshold 0.80, wait_poll_sec 5,
/// idle_grace_sec 60, session_retention_sec 600 (the first two and the
/// grace apply to `KVGATE_ADMISSION_MODE_REFERENCE`).
///
/// The caller owns the builder and frees it with `kvgate_config_free` (it
/// may be freed right after `kvgate_new`, which copies it). Returns NULL
/// only if kvgate panicked.
#[unsafe(no_mangle)]
pub extern "C" fn kvgate_config_new() -> *mut kvgate_config {
    ffi_boundary("kvgate_config_new", || {
        handles::config_into_raw(Builder::default())
    })
}

/// Frees a builder made by `kvgate_config_new`. NULL is a no-op.
///
/// # Safety
/// `config` is NULL or a builder not freed yet; it is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_free(config: *mut kvgate_config) {
    ffi_boundary("kvgate_config_free", || {
        // SAFETY: NULL or a live builder handed back once (caller).
        unsafe { handles::config_free(config) }
    })
}

/// Applies `change` to a copy of the builder's config and keeps the copy if
/// it is valid; otherwise the builder is unchanged.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
unsafe fn set(
    function: &'static str,
    config: *mut kvgate_config,
    change: impl FnOnce(&mut Config) -> Result<(), crate::ConfigError>,
) -> kvgate_status {
    ffi_status(function, || {
        // SAFETY: forwarded (caller).
        let config = &mut unsafe { handles::config_mut(config, "config") }?.config;
        let mut candidate = config.clone();
        change(&mut candidate).map_err(Failure::from)?;
        candidate.validate().map_err(Failure::from)?;
        *config = candidate;
        Ok(())
    })
}

/// Sets the KV-cache usage (0 to 1 inclusive) at or above which the gate is
/// under pressure. Default 0.85.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (builder unchanged) for NULL `config`,
/// NaN, infinities and values outside [0, 1].
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_high_watermark(
    config: *mut kvgate_config,
    value: f64,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        set("kvgate_config_set_high_watermark", config, |c| {
            c.high_watermark = value;
            Ok(())
        })
    }
}

/// Sets the prefix hit ratio (0 to 1 inclusive) at or above which a prompt
/// counts as resident under pressure. Default 0.80.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (builder unchanged) for NULL `config`,
/// NaN, infinities and values outside [0, 1].
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_hit_threshold(
    config: *mut kvgate_config,
    value: f64,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        set("kvgate_config_set_hit_threshold", config, |c| {
            c.hit_threshold = value;
            Ok(())
        })
    }
}

/// Sets the longest a waiting attempt sleeps before probing again when
/// nobody wakes it, in seconds. Default 5. Values below 5 are honoured, not
/// clamped.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (builder unchanged) for NULL `config`,
/// zero, negatives, NaN, infinities and more than 100 years.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_wait_poll_sec(
    config: *mut kvgate_config,
    seconds: f64,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        set("kvgate_config_set_wait_poll_sec", config, |c| {
            c.wait_poll = Config::duration_from_secs("wait_poll", seconds)?;
            Ok(())
        })
    }
}

/// Sets how long a session keeps its reservation after its last retaining
/// lease is released (the ownership window), in seconds. Default 60; 0
/// means no window.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (builder unchanged) for NULL `config`,
/// negatives, NaN, infinities and more than 100 years.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_idle_grace_sec(
    config: *mut kvgate_config,
    seconds: f64,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        set("kvgate_config_set_idle_grace_sec", config, |c| {
            c.idle_grace = Config::duration_from_secs("idle_grace", seconds)?;
            Ok(())
        })
    }
}

/// Sets how long an idle session's record (its statistics) is kept when the
/// host never calls `kvgate_finish_session`, in seconds. Default 600.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (builder unchanged) for NULL `config`,
/// negatives, NaN, infinities and more than 100 years.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_session_retention_sec(
    config: *mut kvgate_config,
    seconds: f64,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        set("kvgate_config_set_session_retention_sec", config, |c| {
            c.session_retention = Config::duration_from_secs("session_retention", seconds)?;
            Ok(())
        })
    }
}

/// Sets the host's probes, which `kvgate_new` copies into the gate. By
/// default both are NULL, and so is the capacity probe
/// (`kvgate_config_set_capacity_probe`): always unavailable. Then every
/// turn is admitted at once, by mode: reference mode admits each
/// `KVGATE_REASON_OPEN`; working-set mode admits each by the working set,
/// `KVGATE_REASON_EMPTY_WORKING_SET` when no other session is in it and
/// `KVGATE_REASON_FITS_WORKING_SET` otherwise (with neither usage nor
/// capacity answers the capacity stays unknown, so nobody is held out).
///
/// A NULL function pointer means that probe is always unavailable.
/// `user_data` is passed, unchanged, as the first argument of every probe
/// call; the library never reads, frees or copies what it points to. It
/// must stay valid, and be safe to use from several threads at once, until
/// `kvgate_free` on the gate has returned: after that no probe is called
/// again, not even by a `kvgate_acquire` whose own probe called
/// `kvgate_free` (it returns `KVGATE_CLOSED` without asking another).
///
/// How probes grow: each is set on this builder, never through a struct, so
/// a later probe (the engine's KV capacity, say) comes with its own setter
/// and no layout a host compiled against changes; a host that never calls a
/// new setter gets that probe's "unavailable".
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `config`.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile;
/// the probes obey the contracts of `kvgate_usage_fn` and `kvgate_prefix_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_probes(
    config: *mut kvgate_config,
    usage: kvgate_usage_fn,
    prefix: kvgate_prefix_fn,
    user_data: *mut std::ffi::c_void,
) -> kvgate_status {
    ffi_status("kvgate_config_set_probes", || {
        // SAFETY: forwarded (caller).
        let builder = unsafe { handles::config_mut(config, "config") }?;
        builder.probes = ProbeFns {
            usage,
            prefix,
            user_data,
            ..builder.probes
        };
        Ok(())
    })
}

/// Sets the capacity probe (`kvgate_capacity_fn`), called with the
/// `user_data` of `kvgate_config_set_probes`. NULL (the default) means the
/// engine's capacity is unknown: working-set admission then estimates it
/// from usage answers. `kvgate_new` copies it with the other probes.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `config`.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile;
/// the probe obeys the contract of `kvgate_capacity_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_capacity_probe(
    config: *mut kvgate_config,
    capacity: kvgate_capacity_fn,
) -> kvgate_status {
    ffi_status("kvgate_config_set_capacity_probe", || {
        // SAFETY: forwarded (caller).
        let builder = unsafe { handles::config_mut(config, "config") }?;
        builder.probes.capacity = capacity;
        Ok(())
    })
}

/// Sets the tier probe (`kvgate_tier_fn`), called with the `user_data` of
/// `kvgate_config_set_probes`, right after the capacity probe. NULL (the
/// default) means the engine has no host tier, as for a probe that always
/// returns false. `kvgate_new` copies it with the other probes. Hosts that
/// drive attempts themselves tell the tier with
/// `kvgate_attempt_answer_usage_tiered` instead.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `config`.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile;
/// the probe obeys the contract of `kvgate_tier_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_tier_probe(
    config: *mut kvgate_config,
    tier: kvgate_tier_fn,
) -> kvgate_status {
    ffi_status("kvgate_config_set_tier_probe", || {
        // SAFETY: forwarded (caller).
        let builder = unsafe { handles::config_mut(config, "config") }?;
        builder.probes.tier = tier;
        Ok(())
    })
}

/// How the gate decides (`kvgate_config_set_admission_mode`). Values are stable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kvgate_admission_mode {
    /// Working-set admission (the default): sessions are admitted while
    /// their prefix-cache footprints fit the engine's KV capacity, in FIFO
    /// order, and keep their place between turns for a window measured
    /// from the engine.
    KVGATE_ADMISSION_MODE_WORKING_SET = 0,
    /// The seed's decision table: usage watermark, reservation, prefix probe.
    KVGATE_ADMISSION_MODE_REFERENCE = 1,
}

/// Sets how the gate decides: a `kvgate_admission_mode` value. Default
/// `KVGATE_ADMISSION_MODE_WORKING_SET`.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (builder unchanged) for a NULL
/// `config` or a value that is not a `kvgate_admission_mode`.
///
/// # Safety
/// `config` is NULL or a live builder not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_config_set_admission_mode(
    config: *mut kvgate_config,
    admission: u32,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        set("kvgate_config_set_admission_mode", config, |c| {
            const WORKING_SET: u32 =
                kvgate_admission_mode::KVGATE_ADMISSION_MODE_WORKING_SET as u32;
            const REFERENCE: u32 = kvgate_admission_mode::KVGATE_ADMISSION_MODE_REFERENCE as u32;
            c.admission = match admission {
                WORKING_SET => AdmissionMode::WorkingSet,
                REFERENCE => AdmissionMode::Reference,
                other => {
                    return Err(crate::ConfigError {
                        field: "admission",
                        value: other.to_string(),
                        expected: "KVGATE_ADMISSION_MODE_WORKING_SET (0) or KVGATE_ADMISSION_MODE_REFERENCE (1)",
                    })
                }
            };
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::error::last_error_string;
    use super::*;
    use std::time::Duration;

    fn with_builder(f: impl FnOnce(*mut kvgate_config, &dyn Fn() -> Config)) {
        let raw = kvgate_config_new();
        assert!(!raw.is_null());
        // SAFETY: `raw` is live until freed below, used by this thread only.
        let read = || {
            unsafe { handles::config_ref(raw, "config") }
                .unwrap()
                .config
                .clone()
        };
        f(raw, &read);
        // SAFETY: freed once.
        unsafe { kvgate_config_free(raw) };
    }

    #[test]
    fn starts_from_the_reference_defaults_and_accepts_good_values() {
        with_builder(|raw, read| {
            assert_eq!(read(), Config::default());
            // SAFETY: a live builder.
            unsafe {
                assert_eq!(
                    kvgate_config_set_high_watermark(raw, 0.5),
                    kvgate_status::KVGATE_OK
                );
                assert_eq!(
                    kvgate_config_set_hit_threshold(raw, 1.0),
                    kvgate_status::KVGATE_OK
                );
                assert_eq!(
                    kvgate_config_set_wait_poll_sec(raw, 0.25),
                    kvgate_status::KVGATE_OK
                );
                assert_eq!(
                    kvgate_config_set_idle_grace_sec(raw, 0.0),
                    kvgate_status::KVGATE_OK
                );
                assert_eq!(
                    kvgate_config_set_session_retention_sec(raw, 30.0),
                    kvgate_status::KVGATE_OK
                );
            }
            let c = read();
            assert_eq!(c.high_watermark, 0.5);
            assert_eq!(c.hit_threshold, 1.0);
            assert_eq!(c.wait_poll, Duration::from_millis(250));
            assert_eq!(c.idle_grace, Duration::ZERO);
            assert_eq!(c.session_retention, Duration::from_secs(30));
        });
    }

    #[test]
    fn bad_values_are_refused_with_the_config_error_and_change_nothing() {
        with_builder(|raw, read| {
            // SAFETY: a live builder.
            unsafe {
                let s = kvgate_config_set_high_watermark(raw, f64::NAN);
                assert_eq!(s, kvgate_status::KVGATE_INVALID_ARGUMENT);
                assert_eq!(
                    last_error_string().unwrap(),
                    "kvgate_config_set_high_watermark: invalid high_watermark: NaN \
                     (expected a finite number between 0 and 1 inclusive)"
                );
                let s = kvgate_config_set_hit_threshold(raw, 1.5);
                assert_eq!(s, kvgate_status::KVGATE_INVALID_ARGUMENT);
                let s = kvgate_config_set_wait_poll_sec(raw, 0.0);
                assert_eq!(s, kvgate_status::KVGATE_INVALID_ARGUMENT);
                assert!(last_error_string().unwrap().contains("invalid wait_poll"));
                let s = kvgate_config_set_idle_grace_sec(raw, -1.0);
                assert_eq!(s, kvgate_status::KVGATE_INVALID_ARGUMENT);
                assert!(last_error_string()
                    .unwrap()
                    .contains("invalid idle_grace: -1"));
                let s = kvgate_config_set_session_retention_sec(raw, f64::INFINITY);
                assert_eq!(s, kvgate_status::KVGATE_INVALID_ARGUMENT);
                let s = kvgate_config_set_high_watermark(std::ptr::null_mut(), 0.5);
                assert_eq!(s, kvgate_status::KVGATE_INVALID_ARGUMENT);
                assert_eq!(
                    last_error_string().unwrap(),
                    "kvgate_config_set_high_watermark: config is NULL"
                );
            }
            assert_eq!(read(), Config::default());
        });
    }
}
