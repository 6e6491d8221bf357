//! # kvgate
//!
//! A session-level admission gate that protects an LLM engine's prefix
//! cache from thrashing under agentic workloads.
//!
//! Agent sessions re-send a growing prompt every turn. Once the engine's KV
//! cache is full, concurrent sessions evict each other's prefix blocks and
//! every turn re-prefills tens of thousands of tokens. Before a session's
//! turn reaches the engine, the host calls [`Gate::acquire`]:
//!
//! - below the high watermark of KV usage every turn is admitted (`open`);
//! - above it, a session that owns a reservation (`reserved_session`), or
//!   whose prompt is mostly resident (`resident_prefix`), goes in, as does one
//!   whose prefix probe is unavailable (`prefix_probe_unavailable`); cold
//!   sessions wait until capacity frees up.
//!
//! Every admission is a [`Lease`]; a lease taken under pressure keeps the
//! session's reservation while the request runs and turns into an idle grace
//! window when released, so the session's next turn (after its tool call)
//! goes straight in. A newer attempt of a session preempts an older one that
//! is still waiting.
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
//! assert_eq!(lease.reason(), Reason::Open);
//! // ... run the turn on the engine ...
//! lease.release();
//! ```
//!
//! Layers: [`core`] is the sans-IO decision machine (no clock, no probe, no
//! thread); [`Gate`] drives it with the calling thread and a real clock.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations)]

mod clock;
mod config;
pub mod core;
mod error;
pub mod ffi;
mod gate;
mod lease;
mod parker;
mod probe;
mod sync;
mod watch;

pub use crate::clock::{Clock, ManualClock, MonotonicClock};
pub use crate::config::{AdmissionMode, Config, ConfigError};
pub use crate::core::working_set::{EngineCapacity, TurnReport};
pub use crate::core::{GateStats, Reason, ReservationState, SessionStats};
pub use crate::error::AcquireError;
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
