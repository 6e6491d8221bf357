//! The C ABI: what `include/kvgate.h` declares (cbindgen generates the header
//! from this module; `tests/ffi_header.rs` fails when the two drift apart).
//!
//! Rust hosts use [`Gate`](crate::Gate) directly; these functions exist for C,
//! C++ and Python (ctypes) hosts. The conventions, written once here and
//! repeated where they matter in the header:
//!
//! - Every fallible function returns a [`kvgate_status`]; out-parameters come
//!   last and are written only on `KVGATE_OK`. On any other status,
//!   [`kvgate_last_error`] tells this thread which argument or value was
//!   wrong and why.
//! - Every pointer is checked: a NULL handle, a NULL out-pointer, or a NULL
//!   (or misaligned) array with a non-zero length is refused with
//!   `KVGATE_INVALID_ARGUMENT`; nothing is dereferenced first.
//! - Nothing unwinds into C: a Rust panic becomes `KVGATE_PANIC` (or the
//!   documented default of a function without a status).
//! - Leases are `uint64_t` handles kept in a registry, so a double or stale
//!   release is answered with `KVGATE_UNKNOWN_LEASE`, never with memory
//!   corruption.
//!
//! Plumbing, one job per module: `status` (the enums), `error` (last
//! error, the failure type), `panic` (the one boundary every export runs
//! in), `handles` (every raw-pointer conversion), `gate_handle` (what a
//! `kvgate_gate *` owns and how `kvgate_free` waits), `callbacks` (the C
//! probes, the tier probe included, as the gate's one probe), `leases` (the
//! lease registry). Exports by C "class": `version`, `names` (of statuses
//! and reasons, and the last error), `config`, `gate`, `stats`, `waker`
//! (the wake channel of event-loop attempts, and the `Waker` behind it,
//! whose bell is `crate::sync`'s `Doorbell`), `event_loop` (attempts driven
//! step by step, the gate's timer, over the crate's driver API in
//! `src/driver.rs`).

// The C names are the contract (`kvgate_status`, `KVGATE_OK`, ...): spelling
// them verbatim in Rust keeps cbindgen's output free of renaming rules.
#![allow(non_camel_case_types)]

// Exports, in the order cbindgen lays them out in the header (one module
// per group; the blank lines stop rustfmt from sorting them).
mod version;

mod status;

mod error;

mod names;

mod config;

mod callbacks;

mod gate;

mod stats;

mod waker;

mod event_loop;

mod hints;
mod rebuild_cost;

// Plumbing.
mod gate_handle;
mod handles;
mod leases;
mod panic;

pub use callbacks::{kvgate_capacity_fn, kvgate_prefix_fn, kvgate_tier_fn, kvgate_usage_fn};
pub use config::{
    kvgate_admission_mode, kvgate_config_free, kvgate_config_new, kvgate_config_set_admission_mode,
    kvgate_config_set_capacity_probe, kvgate_config_set_high_watermark,
    kvgate_config_set_hit_threshold, kvgate_config_set_idle_grace_sec, kvgate_config_set_probes,
    kvgate_config_set_session_retention_sec, kvgate_config_set_tier_probe,
    kvgate_config_set_wait_poll_sec,
};
#[cfg(loom)]
#[doc(hidden)]
pub use event_loop::waker_is_rung_for_models;
pub use event_loop::{
    kvgate_attempt_answer_prefix, kvgate_attempt_answer_usage, kvgate_attempt_answer_usage_tiered,
    kvgate_attempt_begin, kvgate_attempt_begin_with_prompt, kvgate_attempt_cancel,
    kvgate_attempt_end, kvgate_attempt_free, kvgate_attempt_wake, kvgate_now_ns, kvgate_step,
    kvgate_step_kind, kvgate_tick,
};
pub use gate::kvgate_release_elsewhere;
pub use gate::{
    kvgate_acquire, kvgate_admission, kvgate_cancel_session, kvgate_close, kvgate_finish_session,
    kvgate_free, kvgate_new, kvgate_release, kvgate_release_with_report,
    kvgate_release_with_tier_report, KVGATE_NO_LEASE,
};
pub use handles::{kvgate_attempt, kvgate_config, kvgate_gate, kvgate_waker};
pub use hints::{
    kvgate_session_set_budget, kvgate_set_max_model_len, kvgate_summary_load, kvgate_summary_save,
};
pub use names::{kvgate_last_error, kvgate_reason_str, kvgate_status_str};
pub use rebuild_cost::kvgate_set_rebuild_cost;
pub use stats::{
    kvgate_get_session_stats, kvgate_get_stats, kvgate_metrics_text, kvgate_session_stats,
    kvgate_stats,
};
pub use status::{kvgate_reason, kvgate_status};
pub use version::{
    kvgate_version, KVGATE_VERSION_MAJOR, KVGATE_VERSION_MINOR, KVGATE_VERSION_PATCH,
};
pub use waker::{
    kvgate_wake_fn, kvgate_waker_drain, kvgate_waker_fd, kvgate_waker_free, kvgate_waker_new,
    kvgate_waker_new_callback,
};
