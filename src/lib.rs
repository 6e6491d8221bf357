//! # kvgate
//!
//! A session-level admission gate that protects an LLM engine's prefix
//! cache from thrashing under agentic workloads.
//!
//! Agent sessions re-send a growing prompt every turn. Once their histories
//! outgrow the engine's KV cache, concurrent sessions evict each other's
//! prefix blocks and every turn re-prefills tens of thousands of tokens.
//! Before a session's turn reaches the engine, the host calls
//! [`Gate::acquire`]; every admission is a [`Lease`], released when the
//! engine returns (with [`Lease::release_with`] and a [`TurnReport`] of what
//! the engine measured, or by dropping it).
//!
//! ## Working-set admission (the default)
//!
//! [`Config::default`] admits a working set of sessions
//! ([`AdmissionMode::WorkingSet`]):
//!
//! - sessions join, first come first served, while their footprints (their
//!   newest prompt and output, the prefix they share counted once) fit the
//!   engine's KV capacity ([`Probe::kv_cache_capacity`]) beside the
//!   members' and the room the members' next turns will take
//!   ([`Reason::FitsWorkingSet`]; the first one into an empty working set,
//!   [`Reason::EmptyWorkingSet`]);
//! - a member keeps its place between turns for a window the engine's
//!   prefill rate sets (the time it takes to refill the cache), so its next
//!   turn goes straight in ([`Reason::ReservedSession`]);
//! - when the members outgrow the cache, the member between turns released
//!   longest ago (the one the engine would evict next) is parked and queues
//!   again;
//! - every wait is bounded ([`Reason::WaitBound`]), and nobody is held out
//!   when running everyone with a cold cache serves clearly more turns
//!   ([`Reason::RunningColdPays`]).
//!
//! The rules, each derived from the engine's costs, are in
//! `core::working_set` (its module documentation derives them).
//!
//! Every figure it uses (capacity, footprints, the prefill rate, how long
//! sessions run) is measured from the probes and the turn reports, not
//! configured. A newer attempt of a session preempts an older one that is
//! still waiting.
//!
//! ```
//! use kvgate::{Config, EngineCapacity, Gate, Probe, Reason, TurnReport};
//!
//! struct Engine;
//! impl Probe for Engine {
//!     fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> { Some(0.30) }
//!     fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> { None }
//!     fn kv_cache_capacity(&self, _session: &[u8]) -> Option<EngineCapacity> {
//!         Some(EngineCapacity::new(400 * 32, 32, 10_000.0)) // tokens, block, prefill/s
//!     }
//! }
//!
//! let gate = Gate::new(Config::default(), Engine).unwrap();
//! let lease = gate.acquire(b"agent-7", &[1, 2, 3]).unwrap();
//! assert_eq!(lease.reason(), Reason::EmptyWorkingSet);
//! // ... run the turn on the engine ...
//! lease.release_with(TurnReport::new(Some(0), Some(40))); // cached, output tokens
//! ```
//!
//! ## The seed's decision table (`reference` mode)
//!
//! [`Config::reference`] selects the reference scheduler's table
//! ([`AdmissionMode::Reference`]): below a high watermark of KV usage every
//! turn is admitted (`open`); above it, a session that owns a reservation
//! (`reserved_session`), or whose prompt is mostly resident
//! (`resident_prefix`), goes in, as does one whose prefix probe is
//! unavailable (`prefix_probe_unavailable`); cold sessions wait. A lease
//! taken under pressure keeps the session's reservation while it runs and
//! turns into an idle grace window when released. On vLLM this table barely
//! engages: vLLM's usage counts only running requests, not the cached
//! prefixes of sessions in tool calls.
//!
//! ```
//! use kvgate::{Config, Gate, Probe, Reason};
//!
//! struct Engine;
//! impl Probe for Engine {
//!     fn kv_cache_usage(&self, _session: &[u8]) -> Option<f64> { Some(0.30) }
//!     fn prefix_hit_ratio(&self, _session: &[u8], _prompt: &[u32]) -> Option<f64> { None }
//! }
//!
//! let gate = Gate::new(Config::reference(), Engine).unwrap();
//! let lease = gate.acquire(b"agent-7", &[1, 2, 3]).unwrap();
//! assert_eq!(lease.reason(), Reason::Open); // usage below the 0.85 watermark
//! lease.release();
//! ```
//!
//! ## Layers
//!
//! [`core`] is the sans-IO decision machine (no clock, no probe, no
//! thread); [`Gate`] drives it with the calling thread and a real clock;
//! [`ffi`] is the C ABI (`include/kvgate.h`), with attempts an event loop
//! drives step by step. The repository's `docs/` folder explains each.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations)]

mod clock;
mod config;
pub mod core;
mod driver;
mod error;
pub mod ffi;
mod gate;
mod lease;
mod probe;
mod shared;
mod sleeper;
mod sync;
mod watch;

pub use crate::clock::{Clock, ManualClock, MonotonicClock};
pub use crate::config::{AdmissionMode, Config, ConfigError};
pub use crate::core::summary::SummaryError;
pub use crate::core::working_set::{
    Budget, CostError, EngineCapacity, HintError, KvTier, RebuildCost, TierError, TurnReport,
};
pub use crate::core::{GateStats, Reason, ReservationState, SessionStats};
pub use crate::error::{AcquireError, ReleaseError};
pub use crate::gate::Gate;
pub use crate::lease::Lease;
pub use crate::probe::{Probe, ProbeAnswer};

#[cfg(test)]
mod tests {
    /// Hosts share the gate across threads and move leases between them.
    #[test]
    fn handles_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<crate::Gate>();
        send_sync::<crate::Lease>();
        send_sync::<crate::core::Core>();
        send_sync::<crate::core::Attempt<&crate::core::Core>>();
        send_sync::<crate::core::Attempt<std::sync::Arc<crate::core::Core>>>();
        send_sync::<crate::core::LeaseToken>();
    }
}
