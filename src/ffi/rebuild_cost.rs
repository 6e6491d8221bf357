//! The engine's prefill cost, told by the host (a new export: the probe
//! callbacks' signatures never change).

use super::error::Failure;
use super::handles::{self, kvgate_gate};
use super::panic::ffi_status;
use super::status::kvgate_status;
use crate::RebuildCost;

/// Tells the gate what the engine's prefill costs: `secs_per_token` seconds
/// per prefilled token (the linear layers, and a step's fixed cost spread
/// over a full chunk) and `secs_per_pair` seconds per query-key pair
/// attended (plus any cost per context token read, divided by the chunk
/// size). The gate prices a re-prefill of an `L`-token history after a
/// cached prefix of `p` tokens as
/// `secs_per_token·L + secs_per_pair·(L·p + L·(L+1)/2)`: what the wait
/// bound's parks may spend and what running every session cold would serve
/// are priced with it. Its linear part is taken at the prefill rate the
/// capacity answer measures, when it gives one (a rebuild runs in the
/// engine's batches like any prefill). A host that fits its engine's step costs
/// calls this again whenever it refits; a host that never calls it gets a
/// per-pair term learned from its turn reports.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (and `kvgate_last_error` names the
/// term) if `secs_per_token` is not finite and > 0 or `secs_per_pair` is
/// negative or not finite; the gate then keeps the cost it had. Ignored
/// (`KVGATE_OK`) in reference mode, which prices nothing. Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_set_rebuild_cost(
    gate: *mut kvgate_gate,
    secs_per_token: f64,
    secs_per_pair: f64,
) -> kvgate_status {
    ffi_status("kvgate_set_rebuild_cost", || {
        // SAFETY: pointer contract forwarded (caller).
        let handle = unsafe { handles::gate_ref(gate, "gate")? };
        let cost = RebuildCost::new(secs_per_token, secs_per_pair)
            .map_err(|e| Failure::invalid(e.to_string()))?;
        handle.gate.set_rebuild_cost(cost);
        Ok(())
    })
}
