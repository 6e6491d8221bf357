//! The crate's API for a host that drives attempts itself, beyond the
//! blocking acquire (the C ABI's event loop, `src/ffi/event_loop.rs`):
//! attempts that outlive one call ([`GateCore`], [`Gate::begin_attempt`]),
//! the gate's clock and timer, bare lease tokens for a holder that keeps
//! the gate alive itself, and the count of a report it refused itself. The
//! blocking driver (`src/gate.rs`) knows none of it.

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use crate::config::duration_ns;
use crate::core::{Attempt, Core, LeaseToken, Notify, PromptSketch};
use crate::shared::Shared;
use crate::sync::Arc;
use crate::{AcquireError, Gate, TurnReport};

/// What an event-loop host says of a turn's prompt.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TurnPrompt<'a> {
    /// Its length only.
    Length(usize),
    /// Its token ids.
    Tokens(&'a [u32]),
}

impl TurnPrompt<'_> {
    fn len(self) -> usize {
        match self {
            Self::Length(n) => n,
            Self::Tokens(ids) => ids.len(),
        }
    }
}

/// A gate's core as an attempt that outlives one call holds it (the C
/// ABI's event-loop attempts): the attempt keeps the gate's memory alive.
#[derive(Clone)]
pub(crate) struct GateCore(Arc<Shared>);

impl Deref for GateCore {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.0.core
    }
}

impl fmt::Debug for GateCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GateCore(..)")
    }
}

impl Gate {
    /// Counts a turn report its host's figures made inconsistent, refused
    /// before its lease is released ([`Core::count_refused_report`]).
    pub(crate) fn count_refused_report(&self) {
        self.shared.core.count_refused_report();
    }

    /// Releases a token from [`Gate::acquire_token`].
    pub(crate) fn release_token(&self, token: LeaseToken, report: TurnReport) {
        self.shared.release(token, report);
    }

    /// Begins an attempt that the caller drives step by step (an event
    /// loop: it answers the probes itself and sleeps by `notifier`), on
    /// this gate's clock; see [`Attempt`]. The gate's probes are not asked.
    /// The prompt is its length, or its token ids: working-set admission
    /// then sketches them ([`PromptSketch`]).
    pub(crate) fn begin_attempt(
        &self,
        session: &[u8],
        prompt: TurnPrompt<'_>,
        timeout: Option<Duration>,
        notifier: Box<dyn Notify>,
    ) -> Result<(Attempt<GateCore>, u64), AcquireError> {
        let now = self.now_ns();
        let deadline = timeout.map(|t| now.saturating_add(duration_ns(t)));
        let core = GateCore(self.shared.clone());
        let mut attempt = Attempt::begin(core, session, prompt.len(), now, deadline, notifier)?;
        if let TurnPrompt::Tokens(ids) = prompt {
            if self.shared.core.wants_prompt_sketch() {
                attempt.set_prompt_sketch(PromptSketch::of(ids));
            }
        }
        Ok((attempt, now))
    }

    /// The gate's clock, in nanoseconds: the time base of every step's
    /// deadline.
    pub(crate) fn now_ns(&self) -> u64 {
        self.shared.clock.now_ns()
    }

    /// Fires what is due now and answers the core's next deadline: what an
    /// event loop's timer calls.
    pub(crate) fn tick(&self) -> Option<u64> {
        let core = &self.shared.core;
        core.purge(self.now_ns());
        core.next_deadline()
    }
}
