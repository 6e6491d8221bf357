//! The engine's rebuild cost through the C ABI (`kvgate_set_rebuild_cost`):
//! what the header promises of it, one test per promise. The cost in force
//! shows in the metrics text (`kvgate_working_set_rebuild_seconds_per_*`).

use std::ptr;

use kvgate::ffi::kvgate_status::*;
use kvgate::ffi::*;

#[path = "support/ffi_support.rs"]
mod ffi_support;
use ffi_support::{gate_with, last_error, metrics};

/// The value of the metric family `name` in the gate's metrics text.
fn gauge(gate: *mut kvgate_gate, name: &str) -> f64 {
    let text = metrics(gate);
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line[name.len()..].trim().parse().unwrap()
}

const PER_TOKEN: &str = "kvgate_working_set_rebuild_seconds_per_token";
const PER_PAIR: &str = "kvgate_working_set_rebuild_seconds_per_pair";

fn set(gate: *mut kvgate_gate, per_token: f64, per_pair: f64) -> kvgate_status {
    // SAFETY: `gate` is a live gate or NULL (which the call refuses).
    unsafe { kvgate_set_rebuild_cost(gate, per_token, per_pair) }
}

#[test]
fn a_cost_told_is_the_cost_in_force() {
    let gate = gate_with(false, |_| {});
    assert_eq!(gauge(gate, PER_TOKEN), 0.0, "nothing known yet");
    assert_eq!(set(gate, 2.5e-5, 1.5e-9), KVGATE_OK);
    assert_eq!(gauge(gate, PER_TOKEN), 2.5e-5);
    assert_eq!(gauge(gate, PER_PAIR), 1.5e-9);
    // A refit replaces it.
    assert_eq!(set(gate, 3e-5, 0.0), KVGATE_OK);
    assert_eq!(gauge(gate, PER_TOKEN), 3e-5);
    assert_eq!(gauge(gate, PER_PAIR), 0.0);
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(gate) };
}

#[test]
fn a_term_out_of_range_is_refused_by_name_and_the_cost_it_had_is_kept() {
    let gate = gate_with(false, |_| {});
    assert_eq!(set(gate, 2.5e-5, 1.5e-9), KVGATE_OK);
    for (per_token, per_pair, named) in [
        (0.0, 1e-9, "per prefilled token"),
        (-1e-5, 1e-9, "per prefilled token"),
        (f64::NAN, 1e-9, "per prefilled token"),
        (f64::INFINITY, 1e-9, "per prefilled token"),
        (1e-5, -1e-9, "per attended pair"),
        (1e-5, f64::NAN, "per attended pair"),
        (1e-5, f64::INFINITY, "per attended pair"),
    ] {
        assert_eq!(
            set(gate, per_token, per_pair),
            KVGATE_INVALID_ARGUMENT,
            "{per_token} {per_pair}"
        );
        let error = last_error();
        assert!(error.contains(named), "{error}");
        assert!(error.contains("kvgate_set_rebuild_cost"), "{error}");
        assert_eq!(gauge(gate, PER_TOKEN), 2.5e-5, "kept");
        assert_eq!(gauge(gate, PER_PAIR), 1.5e-9, "kept");
    }
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(gate) };
}

#[test]
fn a_null_gate_is_refused() {
    assert_eq!(set(ptr::null_mut(), 2.5e-5, 0.0), KVGATE_INVALID_ARGUMENT);
    assert!(last_error().contains("gate"), "{}", last_error());
}

#[test]
fn reference_mode_ignores_it() {
    let gate = gate_with(true, |_| {});
    assert_eq!(set(gate, 2.5e-5, 1.5e-9), KVGATE_OK);
    // It still refuses what it could never use.
    assert_eq!(set(gate, -1.0, 0.0), KVGATE_INVALID_ARGUMENT);
    // SAFETY: a live gate, freed once.
    unsafe { kvgate_free(gate) };
}
